"""`trl-nca eval` on bad input (issue 35): each probe is one case of the table, with the one line it must print, and
no model is loaded (no work is done) before that line. A second run into a folder in use is refused, never mixed."""

import json
from pathlib import Path

import pytest
import torch

import trl_nca.eval.loading
from trl_nca.cli import main as cli_main
from trl_nca.cli.eval import main as eval_main
from trl_nca.core.views import ContextSpec
from trl_nca.eval import GenerationSettings, PairedEvaluator
from trl_nca.eval.errors import EvalInputError
from trl_nca.inputs import output_folder_lock
from trl_nca.testing import make_tiny_model, one_error_line, save_tiny_model


READ_ONLY = Path("/sys/trl-nca-test")  # a place nobody can create a folder in, root included


def one_line(argv, capsys) -> str:
    return one_error_line(cli_main, argv, capsys)


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """The tiny model with 64 positions (its config's max_position_embeddings)."""
    path = Path(save_tiny_model(tmp_path_factory.mktemp("short") / "model"))
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def items(tmp_path, prompt="Which answer? (A) yes (B) no"):
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"prompt": prompt, "answer": "A"}) + "\n")
    return str(path)


LONG = " ".join(["rule"] * 120)  # well over 64 tokens
# (case, extra options, the expected line's text); every case also gets --model, --dataset and --output-dir
CASES = [
    ("alpha above 1", ["--alpha", "2"], "--alpha must be a significance level within (0, 1)"),
    ("alpha nan", ["--alpha", "nan"], "--alpha must be a significance level within (0, 1), e.g. 0.05; got nan"),
    ("negative bootstrap", ["--bootstrap", "-5"], "--bootstrap must be 0 (no intervals) or a number"),
    (
        "greedy with a temperature",
        ["--greedy", "--temperature", "0.7"],
        "--greedy decodes without sampling, so --temperature would be ignored",
    ),
    (
        "template with system placement",
        ["--template", "{context}"],
        "--template joins the context and the prompt in the user turn, so it applies only with --placement user",
    ),
    (
        "separator with user placement",
        ["--placement", "user", "--separator", "/"],
        "--separator joins the context and a system message",
    ),
    ("split of a local file", ["--split", "validation"], "is a single file, so it has no split 'validation'"),
    ("prompt past the position limit", ["--prompt", LONG], "its prompt without the context has"),
    ("context past the position limit", ["--context-text", LONG], "its prompt with the context has"),
    (
        "an unreachable max-new-tokens",
        ["--max-new-tokens", "1000000000"],
        "--max-new-tokens 1000000000 leaves no room for a prompt in the",
    ),
    (
        "a huge prompt, refused untokenised",
        ["--prompt", "word " * 40_000],
        "its prompt without the context holds 200,000 bytes of text, so at least",
    ),
    ("output-dir is a file", ["--output-dir", "FILE"], "is a file, not a folder"),
    ("output-dir cannot be created", ["--output-dir", str(READ_ONLY / "out")], "Cannot create the output folder"),
    pytest.param(
        "device cuda without CUDA",
        ["--device", "cuda"],
        "--device cuda asks for a CUDA GPU, and torch sees none",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
    ),
]


@pytest.mark.parametrize(
    "case, extra, expected", CASES, ids=[c.values[0] if hasattr(c, "marks") else c[0] for c in CASES]
)
def test_bad_eval_input_is_one_line_before_any_model_loads(
    short_model, tmp_path, capsys, no_model_loads, case, extra, expected
):
    extra = list(extra)
    prompt = extra[extra.index("--prompt") + 1] if "--prompt" in extra else "Which answer? (A) yes (B) no"
    if "--prompt" in extra:
        del extra[extra.index("--prompt") : extra.index("--prompt") + 2]
    out = tmp_path / "out"
    if "FILE" in extra:
        out.write_text("not a folder\n")
        extra[extra.index("FILE")] = str(out)
    argv = [
        "eval",
        "--model",
        short_model,
        "--dataset",
        items(tmp_path, prompt),
        "--max-new-tokens",
        "8",
        "--no-progress",
        "--no-plots",
    ]
    if "--context-text" not in extra:
        argv += ["--context-text", "Answer with the letter."]
    if "--output-dir" not in extra:
        argv += ["--output-dir", str(out)]
    line = one_line([*argv, *extra], capsys)
    assert line.startswith("trl-nca eval: error: ") and expected in line, line
    if "position limit" in case:
        assert "exceeds the 64 positions of the model" in line and "Lower --max-new-tokens" in line
    assert not (out / "model").exists() and (not out.is_dir() or not any(out.iterdir()))  # nothing written


def test_a_second_eval_into_a_folder_in_use_is_refused(short_model, tmp_path, capsys, no_model_loads):
    """Two runs into one folder at once would interleave their records (two run keys in one records.jsonl)."""
    out = tmp_path / "out"
    argv = [
        "eval",
        "--model",
        short_model,
        "--dataset",
        items(tmp_path),
        "--context-text",
        "c",
        "--max-new-tokens",
        "4",
        "--output-dir",
        str(out),
    ]
    with output_folder_lock(out, "trl-nca eval --seed 1"):
        line = one_line(argv, capsys)
    assert "is in use by another trl-nca run (pid" in line and "trl-nca eval --seed 1" in line, line
    assert not out.exists()  # the holder's folder, created by it, is gone with it; nothing of ours was written


def test_a_scorer_with_the_wrong_signature_is_refused(short_model, tmp_path, capsys, no_model_loads, monkeypatch):
    """A `--scorer module:fn` that cannot be called as fn(text, label) would score every answer wrong and exit 0."""
    (tmp_path / "my_scorers.py").write_text("def score(text):\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = one_line(
        [
            "eval",
            "--model",
            short_model,
            "--dataset",
            items(tmp_path),
            "--context-text",
            "c",
            "--scorer",
            "my_scorers:score",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capsys,
    )
    assert (
        "The scorer function 'my_scorers:score' has the signature (text), but a scorer is called as fn(text, "
        "label)" in line
    ), line
    assert not (tmp_path / "out").exists()


def _break_model(model: Path, case: str) -> None:
    """The model folder with the fault of `case`."""
    if case == "a tokenizer without a chat template":
        for name in ("chat_template.jinja", "chat_template.json"):
            (model / name).unlink(missing_ok=True)
        settings = json.loads((model / "tokenizer_config.json").read_text())
        settings.pop("chat_template", None)
        (model / "tokenizer_config.json").write_text(json.dumps(settings))
    elif case == "a tokenizer larger than the embeddings":
        config = json.loads((model / "config.json").read_text())
        config["vocab_size"] = 64  # fewer embedding rows than the tokenizer's ids
        (model / "config.json").write_text(json.dumps(config))
    elif case == "a truncated model.safetensors":
        weights = model / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100_000])  # an interrupted download
    elif case == "a shard index naming a missing shard":
        shards = {"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
        (model / "model.safetensors.index.json").write_text(json.dumps(shards))


# (case, the expected line's text): a model folder that cannot be evaluated, reported before any model loads
MODEL_CASES = [
    (
        "a tokenizer without a chat template",
        "has no chat template, so the prompts with and without the context cannot be rendered",
    ),
    (
        "a tokenizer larger than the embeddings",
        "has 64 embedding rows (vocab_size): the tokenizer (320 tokens) is not the model's",
    ),
    (
        "a truncated model.safetensors",
        "Model 'model': the weights file {model}/model.safetensors is cut short: it "
        "holds 100,000 bytes, but its header describes",
    ),
    (
        "a shard index naming a missing shard",
        "names 1 shard(s) that are not in {model} (model-00002-of-00002.safetensors). Download or copy the model again",
    ),
]


@pytest.mark.parametrize("case, expected", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_a_model_folder_that_cannot_be_evaluated_is_refused(tmp_path, capsys, no_model_loads, case, expected):
    model = Path(save_tiny_model(tmp_path / "model"))
    _break_model(model, case)
    line = one_line(
        [
            "eval",
            "--model",
            str(model),
            "--dataset",
            items(tmp_path),
            "--context-text",
            "c",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capsys,
    )
    assert expected.format(model=model) in line, line
    assert not (tmp_path / "out").exists()


def qa_rows(n=3):
    return [{"id": f"q{i}", "prompt": f"Question {i}? (A) yes (B) no", "answer": "AB"[i % 2]} for i in range(n)]


def qa_evaluator(data, **kwargs):
    return PairedEvaluator(
        data,
        context=ContextSpec(text="Be careful."),
        id_column="id",
        generation=GenerationSettings(max_new_tokens=4, batch_size=2),
        **kwargs,
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r[1].update(prompt="Another question? (A) yes (B) no"),
        lambda r: r[1].update(answer="A"),
        lambda r: r[1].update(
            prompt=[{"role": "system", "content": "Short."}, {"role": "user", "content": r[1]["prompt"]}]
        ),
    ],
    ids=["prompt", "label", "messages"],
)
def test_eval_refuses_to_resume_records_of_changed_items(tok, tmp_path, change):
    model = make_tiny_model(tok)
    path = tmp_path / "records.jsonl"
    first = qa_evaluator(qa_rows()).run(model, tok, output_path=path, progress=False)
    changed = qa_rows()
    change(changed)
    with pytest.raises(
        EvalInputError,
        match=r"records of 1 item\(s\) whose prompt, label or tokenization differ .*"
        r"\['q1'\].*Use a new output folder, or delete the file",
    ):
        qa_evaluator(changed).run(model, tok, output_path=path, progress=False)
    # unchanged items resume (nothing regenerated), and new ones are added
    more = qa_evaluator(qa_rows(4)).run(model, tok, output_path=path, progress=False)
    assert [r.to_dict() for r in more[:3]] == [r.to_dict() for r in first]
    assert len(path.read_text().splitlines()) == 4


def test_eval_cli_refuses_a_changed_dataset_in_an_existing_output_folder(tiny_dir, tmp_path, capsys):
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in qa_rows(2)))
    argv = [
        "--model",
        tiny_dir,
        "--dataset",
        str(data),
        "--id-column",
        "id",
        "--context-text",
        "Be careful.",
        "--max-new-tokens",
        "3",
        "--bootstrap",
        "0",
        "--no-plots",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "o"),
    ]
    assert eval_main(argv) == 0
    rows = qa_rows(2)
    rows[0]["answer"] = "B"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit) as exit_info:
        eval_main(argv)
    assert exit_info.value.code == 2
    assert "item(s) whose prompt, label or tokenization differ" in capsys.readouterr().err


@pytest.mark.parametrize(
    "rows,match",
    [
        (
            [{"id": "a", "prompt": "q", "answer": "A"}, {"id": "b", "prompt": "q"}],
            r"Row 1 \(item 'b'\) has no label in column 'answer' \(missing or null\)\. Fill it in, or drop the row",
        ),
        (
            [{"id": "a", "prompt": "q", "answer": "A"}, {"id": "b", "prompt": "q", "answer": None}],
            r"Row 1 \(item 'b'\) has no label",
        ),
        (
            [{"id": "a", "prompt": "q", "answer": "A"}, {"prompt": "q", "answer": "B"}],
            r"Row 1 has no id in column 'id'",
        ),
        (
            [{"id": "a", "prompt": "q", "answer": "A"}, {"id": "b", "prompt": 7, "answer": "B"}],
            r"row 1 \(item 'b'\), `prompt` must be a string or a list of chat messages",
        ),
        (
            [{"id": "a", "messages": [{"content": "q"}], "answer": "A"}],
            r"row 0 \(item 'a'\), message 0 of `messages` has no string 'role'",
        ),
        (
            [{"id": "a", "messages": [{"role": "system", "content": "q"}], "answer": "A"}],
            r"row 0 \(item 'a'\), the prompt has no user turn",
        ),
    ],
)
def test_eval_rows_are_checked_before_any_model_work(rows, match):
    with pytest.raises(EvalInputError, match=match):
        qa_evaluator(rows)


def run_eval_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        eval_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_eval_cli_label_missing_in_one_row(tiny_dir, tmp_path, capsys):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n{"prompt": "q2"}\n')
    err = run_eval_error(
        ["--model", tiny_dir, "--dataset", str(data), "--context-text", "c", "--output-dir", str(tmp_path / "o")],
        capsys,
    )
    assert "Row 1 (item '1') has no label in column 'answer'" in err


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_non_utf8_file_names_file_and_line(tiny_dir, tmp_path, capsys, suffix):
    data = tmp_path / f"items{suffix}"
    if suffix == ".jsonl":
        data.write_bytes(b'{"prompt": "q1", "answer": "A"}\n{"prompt": "q\xff2", "answer": "B"}\n')
    else:
        data.write_bytes(b'[{"prompt": "q1", "answer": "A"},\n {"prompt": "q\xff2", "answer": "B"}]\n')
    err = run_eval_error(
        ["--model", tiny_dir, "--dataset", str(data), "--context-text", "c", "--output-dir", str(tmp_path / "o")],
        capsys,
    )
    assert f"Line 2 of {data} is not UTF-8 text: byte 0xff" in err
    # the training command reads local files the same way
    assert (
        cli_main(
            [
                "train",
                "--model_name_or_path",
                tiny_dir,
                "--dataset_name",
                str(data),
                "--output_dir",
                str(tmp_path / "t"),
                "--use_cpu",
                "true",
                "--bf16",
                "false",
            ]
        )
        == 2
    )
    assert f"Line 2 of {data} is not UTF-8 text: byte 0xff" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name,match",
    [
        ("./no/such/model", r"path './no/such/model' does not exist"),
        ("no/such/model", r"path 'no/such/model' does not exist"),
        ("nobody/no-such-model", r"'nobody/no-such-model' is not a local folder .*the Hugging Face Hub is offline"),
        ("not a model", r"'not a model' is neither an existing local folder nor a valid Hub id"),
    ],
)
def test_missing_models_get_our_message_in_every_command(tiny_dir, tmp_path, capsys, name, match):
    import re

    assert (
        cli_main(
            [
                "train",
                "--model_name_or_path",
                name,
                "--output_dir",
                str(tmp_path / "t"),
                "--use_cpu",
                "true",
                "--bf16",
                "false",
            ]
        )
        == 2
    )
    assert re.search("trl-nca train: error: Student model " + match, capsys.readouterr().err)
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    err = run_eval_error(
        ["--model", name, "--dataset", str(data), "--context-text", "c", "--output-dir", str(tmp_path / "o")], capsys
    )
    assert re.search(match, err)
    teacher = cli_main(
        [
            "train",
            "--model_name_or_path",
            tiny_dir,
            "--teacher_model_name_or_path",
            name,
            "--output_dir",
            str(tmp_path / "t"),
            "--use_cpu",
            "true",
            "--bf16",
            "false",
        ]
    )
    assert teacher == 2 and re.search("Teacher model " + match, capsys.readouterr().err)


def test_eval_cli_accepts_embedded_like_train(tiny_dir, tmp_path, monkeypatch):
    """One resolver for every command: `trl-nca eval --model embedded` loads the embedded model's folder."""
    import trl_nca.models.names

    monkeypatch.setattr(
        trl_nca.models.names, "embedded_model_path", lambda: tiny_dir
    )  # stands in for the converted cache
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    argv = [
        "--model",
        "embedded",
        "--dataset",
        str(data),
        "--context-text",
        "c",
        "--max-new-tokens",
        "3",
        "--bootstrap",
        "0",
        "--no-plots",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "o"),
    ]
    assert eval_main(argv) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["models"][0]["name"] == "embedded"
    assert summary["models"][0]["provenance"]["model"]["resolved_path"] == str(tiny_dir)


def test_custom_scorer_help_says_it_runs_code(capsys):
    from trl_nca.cli.eval import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert "runs its code" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "options,match",
    [
        (["num_seeds=0"], r"--game-option num_seeds must be a positive integer .*got the int 0"),
        (["num_seeds=abc"], r"--game-option num_seeds must be a positive integer .*got the str 'abc'"),
        (["num_seeds=2.5"], r"num_seeds must be a positive integer .*got the float 2.5"),
        (
            ["seeds=5"],
            r"--game-option seeds must be a non-empty JSON list of non-negative integers, e.g\. seeds=\[3,7,11\].*"
            r"got the int 5",
        ),
        (["seeds=[]"], r"seeds must be a non-empty JSON list .*got the list \[\]"),
        (["seeds=[1,1,2]"], r"seeds lists \[1\] more than once"),
        (["seeds=[1]", "num_seeds=2"], r"either --game-option num_seeds=N or seeds=\[...\], not both"),
        (["num_seeds=2", "num_seeds=3"], r"--game-option num_seeds is given twice"),
        (["max_calls=0"], r"max_calls must be a positive integer .*got the int 0"),
        (["seed=3"], r"'seed' is not a game setting"),
        (["chat_template_kwargs=x"], r"chat_template_kwargs must be a JSON object"),
        (["experience_file=/no/such/file.txt"], r"Cannot read the experience file '/no/such/file.txt'"),
        (["num_seeds"], r"--game-option 'num_seeds' is not KEY=VALUE"),
        (["sise=3"], r"Unknown --game-option sise for frozenlake: its settings are \[.size., .num_holes.\]"),
        (["size=abc"], r"Bad --game-option for frozenlake: size must be an integer, got the str .abc."),
    ],
)
def test_game_options_are_checked_before_any_model_is_loaded(tiny_dir, tmp_path, capsys, monkeypatch, options, match):
    import re

    def no_model_work(*a, **k):
        raise AssertionError("a model was loaded before the game options were checked")

    monkeypatch.setattr(trl_nca.eval.loading, "load_model", no_model_work)
    argv = ["--model", tiny_dir, "--game", "frozenlake", "--output-dir", str(tmp_path / "o")]
    for option in options:
        argv += ["--game-option", option]
    assert re.search(match, run_eval_error(argv, capsys))


def test_game_records_of_another_model_are_refused(tok, tmp_path):
    from trl_nca.eval.games import run_game_eval

    settings = GenerationSettings(max_new_tokens=3, temperature=0.7, top_p=0.8, top_k=20, batch_size=4)
    path = tmp_path / "records.jsonl"
    common = dict(tokenizer=tok, game="frozenlake", generation=settings, context=None, options={"num_seeds": 1})
    run_game_eval(model=make_tiny_model(tok, 0), output_path=path, **common)
    with pytest.raises(EvalInputError, match="holds records of another run"):
        run_game_eval(model=make_tiny_model(tok, 1), output_path=path, **common)
    with pytest.raises(EvalInputError, match="holds records of another run"):  # other prompts: chat template options
        run_game_eval(
            model=make_tiny_model(tok, 0),
            output_path=path,
            **{**common, "options": {"num_seeds": 1, "chat_template_kwargs": {"enable_thinking": False}}},
        )


@pytest.mark.parametrize("option,value", [("--temperature", "nan"), ("--temperature", "inf"), ("--top-p", "nan")])
def test_eval_refuses_non_finite_sampling(tiny_dir, tmp_path, capsys, option, value):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    err = run_eval_error(
        [
            "--model",
            tiny_dir,
            "--dataset",
            str(data),
            "--context-text",
            "c",
            option,
            value,
            "--output-dir",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    assert f"{option[2:].replace('-', '_')} must be a finite number, got the float {value}" in err


def test_eval_limit_zero_says_so(tiny_dir, tmp_path, capsys):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    err = run_eval_error(
        [
            "--model",
            tiny_dir,
            "--dataset",
            str(data),
            "--context-text",
            "c",
            "--limit",
            "0",
            "--output-dir",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    assert "The evaluation dataset is empty after limit=0" in err


def test_eval_accepts_the_builtin_contexts_of_train(tiny_dir, tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    argv = [
        "--model",
        tiny_dir,
        "--dataset",
        str(data),
        "--context-file",
        "medical",
        "--max-new-tokens",
        "2",
        "--bootstrap",
        "0",
        "--no-plots",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "o"),
    ]
    assert eval_main(argv) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["models"][0]["provenance"]["context"]["source"] == "builtin:medical"


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--game", "frozenlake", "--dataset", "d.jsonl"], r"--dataset do\(es\) not apply to --game"),
        (["--game", "frozenlake", "--limit", "3"], r"--limit do\(es\) not apply to --game.*num_seeds=N"),
        (["--game", "frozenlake", "--scorer", "yesno"], r"--scorer do\(es\) not apply to --game"),
        (["--dataset", "d.jsonl", "--game-option", "num_seeds=2"], r"--game-option only applies with --game"),
    ],
)
def test_eval_options_that_would_be_ignored_are_errors(tiny_dir, tmp_path, capsys, extra, match):
    import re

    argv = ["--model", tiny_dir, "--output-dir", str(tmp_path / "o"), *extra]
    assert re.search(match, run_eval_error(argv, capsys))


def test_eval_records_without_item_fingerprints_are_refused(tok, tmp_path):
    path = tmp_path / "records.jsonl"
    qa_evaluator(qa_rows(2)).run(make_tiny_model(tok), tok, output_path=path, progress=False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        del line["meta"]["item_sha256"]  # as written before records carried fingerprints
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(EvalInputError, match="records without item fingerprints .* Use a new output folder"):
        qa_evaluator(qa_rows(2)).run(make_tiny_model(tok), tok, output_path=path, progress=False)


def test_eval_and_analyze_bad_inputs_are_one_line(tiny_dir, tmp_path, capsys):
    data = tmp_path / "items.jsonl"
    data.write_text('{"prompt": "q1", "answer": "A"}\n')
    err = run_eval_error(
        [
            "--model",
            tiny_dir,
            "--dataset",
            str(data),
            "--context-text",
            "c",
            "--samples-per-view",
            "1000000000000",
            "--output-dir",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    assert "samples_per_view 1000000000000 is more than 256" in err
    with pytest.raises(SystemExit) as exit_info:
        cli_main(
            ["analyze", "--model", f"base={tiny_dir}", "--task", "no_such_task", "--output-dir", str(tmp_path / "a")]
        )
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and "no_such_task" in err, err
