"""`trl-nca eval` end to end on a tiny saved model and a tiny local dataset, and its error messages."""

import json

import pytest

from trl_nca.cli.eval import build_parser, main, parse_model_specs
from trl_nca.eval.errors import EvalInputError
from trl_nca.testing import CONTEXT


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "items.jsonl"
    rows = [
        {"uid": f"m{i}", "question": f"Which answer? {i} (A) yes (B) no", "gold": "AB"[i % 2], "context": CONTEXT}
        for i in range(4)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def base_args(tmp_path, dataset, model_dir, *extra):
    return [
        "--dataset",
        str(dataset),
        "--prompt-column",
        "question",
        "--label-column",
        "gold",
        "--id-column",
        "uid",
        "--max-new-tokens",
        "6",
        "--batch-size",
        "2",
        "--bootstrap",
        "50",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "out"),
        "--model",
        f"base={model_dir}",
        *extra,
    ]


def run_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_cli_end_to_end_and_resume(tmp_path, dataset, tiny_dir, tiny_teacher_dir):
    argv = base_args(tmp_path, dataset, tiny_dir, "--model", f"teacher={tiny_teacher_dir}", "--title", "tiny eval")
    assert main(argv) == 0
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["base", "teacher"]
    assert summary["title"] == "tiny eval" and summary["command"]["max_new_tokens"] == 6
    model = summary["models"][0]
    assert model["metrics"]["n"] == 4 and model["metrics"]["regime"] in ("A", "B", "C")
    assert model["provenance"]["model"]["resolved_path"] == str(tiny_dir)
    assert model["provenance"]["context"]["source"] == "column:context"
    assert model["provenance"]["generation"]["max_new_tokens"] == 6
    assert set(model["metrics_by_scorer"]) == {"mcq_strict", "mcq_lenient"}
    for name in ("report.md", "accuracy.png", "harm_help.png"):
        assert (out / name).exists()
    # lengths.png, unless every model's lengths are the same: then a line of the report stands for it
    assert (out / "lengths.png").exists() != ("`lengths.png` is not drawn" in (out / "report.md").read_text())
    records = (out / "base" / "records.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["item_id"] for line in records) == ["m0", "m1", "m2", "m3"]
    first = (out / "teacher" / "records.jsonl").read_text()

    # rerun: everything is resumed, nothing appended, same numbers
    assert main(argv) == 0
    assert (out / "teacher" / "records.jsonl").read_text() == first
    again = json.loads((out / "summary.json").read_text())
    assert again["models"][1]["metrics"] == summary["models"][1]["metrics"]


def test_cli_fixed_context_file_and_yesno(tmp_path, tiny_dir):
    data = tmp_path / "safety.json"
    data.write_text(
        json.dumps([{"prompt": "Is this hateful? text", "answer": "no"}, {"prompt": "Is it?", "answer": "yes"}])
    )
    context = tmp_path / "system.txt"
    context.write_text("You are a careful analyst.")
    argv = [
        "--model",
        tiny_dir,
        "--dataset",
        str(data),
        "--context-file",
        str(context),
        "--scorer",
        "yesno",
        "--placement",
        "user",
        "--greedy",
        "--max-new-tokens",
        "4",
        "--bootstrap",
        "0",
        "--no-plots",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    prov = summary["models"][0]["provenance"]
    assert prov["context"]["source"] == f"file:{context}" and prov["context"]["placement"] == "user"
    assert prov["scorer"] == "yesno" and prov["generation"]["do_sample"] is False
    assert not (tmp_path / "out" / "accuracy.png").exists()


def test_error_unknown_column(tmp_path, dataset, tiny_dir, capsys):
    argv = base_args(tmp_path, dataset, tiny_dir)
    argv[argv.index("gold")] = "label"
    err = run_error(argv, capsys)
    assert "no label column 'label'" in err and "'gold'" in err and "'question'" in err


def test_error_unparsable_file(tmp_path, tiny_dir, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok", "answer": "A", "context": "c"}\n{"prompt": "broken"\n')
    err = run_error(base_args(tmp_path, bad, tiny_dir), capsys)
    assert "Line 2" in err and "not valid JSON" in err
    other = tmp_path / "data.txt"
    other.write_text("hello")
    assert "unsupported file type .txt" in run_error(base_args(tmp_path, other, tiny_dir), capsys)
    assert "does not exist" in run_error(base_args(tmp_path, tmp_path / "missing.jsonl", tiny_dir), capsys)


def test_error_scorer_dataset_mismatch(tmp_path, dataset, tiny_dir, capsys):
    err = run_error(base_args(tmp_path, dataset, tiny_dir, "--scorer", "yesno"), capsys)
    assert "Scorer/dataset mismatch at item 'm0'" in err and "'yes' or 'no'" in err
    assert "Unknown scorer 'nope'" in run_error(base_args(tmp_path, dataset, tiny_dir, "--scorer", "nope"), capsys)


def test_error_model_not_found(tmp_path, dataset, capsys):
    err = run_error(base_args(tmp_path, dataset, str(tmp_path / "no-such-model")), capsys)
    assert "Model 'base': path" in err and "does not exist" in err and "Traceback" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no config.json" in run_error(base_args(tmp_path, dataset, str(empty)), capsys)


def test_help_documents_every_option(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "trl-nca eval --model" in text
    for action in parser._actions:
        assert action.help, action.option_strings
        for option in action.option_strings:
            assert option in text


def test_model_specs():
    specs = parse_model_specs(["base=Qwen/Q", "runs/nca/", "x=a=b", "Qwen/Q"], ["none", "runs/nca/ad", "-", "opd/"])
    assert [(s.name, s.path, s.adapter) for s in specs] == [
        ("base", "Qwen/Q", None),
        ("ad", "runs/nca/", "runs/nca/ad"),  # an unnamed model is named after its adapter
        ("x", "a=b", None),
        ("opd", "Qwen/Q", "opd/"),
    ]
    named = parse_model_specs(["a=m", "b=m"], ["b=ad"])
    assert [s.adapter for s in named] == [None, "ad"]
    with pytest.raises(EvalInputError, match=r"unique, got \['m'\] more than once; name the models"):
        parse_model_specs(["m", "m"], [])
    with pytest.raises(EvalInputError, match="names no model"):
        parse_model_specs(["a=m"], ["c=ad"])
    with pytest.raises(EvalInputError, match="one per model"):
        parse_model_specs(["a=m", "b=m"], ["ad"])
    with pytest.raises(EvalInputError, match="at least one --model"):
        parse_model_specs([], [])


def test_game_runs_default_to_opcd_game_sampling():
    from trl_nca.cli.eval import _generation_settings, build_parser

    game = _generation_settings(build_parser().parse_args(["--model", "m", "--game", "sokoban"]))
    assert (game.temperature, game.top_p, game.top_k, game.max_new_tokens) == (0.7, 0.8, 20, 1024)
    qa = _generation_settings(
        build_parser().parse_args(["--model", "m", "--dataset", "d.jsonl", "--temperature", "0.3"])
    )
    assert (qa.temperature, qa.top_p, qa.max_new_tokens) == (0.3, 0.95, 512)
