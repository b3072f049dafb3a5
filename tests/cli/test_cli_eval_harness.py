"""`trl-nca eval --tasks` (lm-evaluation-harness tasks) on bad input (issue 49): each probe is one case of the table,
with the one line it must print before any model loads; and the run itself, through the command line, on the tiny
model: one summary entry per model and task, records per document, a rerun with another context refused."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trl_nca.cli import main as cli_main
from trl_nca.testing import one_error_line, save_tiny_model


pytest.importorskip("lm_eval")

READ_ONLY = Path("/sys/trl-nca-test")  # a place nobody can create a folder in, root included
LONG = " ".join(["rule"] * 120)  # well over 64 tokens
DOCS = [
    {"question": f"Question {i}?", "choices": ["yes", "no"], "label": i % 2, "hint": f"Say {'yes no'[i % 2]}."}
    for i in range(3)
]
NO_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny model with 64 positions, and the same with a chat template that refuses a system message."""
    root = tmp_path_factory.mktemp("models")
    short = Path(save_tiny_model(root / "short"))
    config = json.loads((short / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (short / "config.json").write_text(json.dumps(config))
    no_system = Path(save_tiny_model(root / "no_system"))
    for name in ("chat_template.jinja", "chat_template.json"):
        (no_system / name).unlink(missing_ok=True)
    settings = json.loads((no_system / "tokenizer_config.json").read_text())
    settings["chat_template"] = NO_SYSTEM_TEMPLATE
    (no_system / "tokenizer_config.json").write_text(json.dumps(settings))
    return {"short": str(short), "no_system": str(no_system)}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """Local tasks: `c_mc` (multiple choice), `c_bleu` (a metric that is not 0/1 per document), `c_hub` (documents
    on the Hub)."""
    folder = tmp_path_factory.mktemp("tasks")
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    local = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
    body = 'test_split: test\ndoc_to_text: "{{question}}\\nAnswer:"\n'
    (folder / "c_mc.yaml").write_text(
        "task: c_mc\n" + local + body + "output_type: multiple_choice\ndoc_to_choice: choices\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n"
    )
    (folder / "c_bleu.yaml").write_text(
        "task: c_bleu\n" + local + body + "output_type: generate_until\ndoc_to_target: hint\n"
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 4\nmetric_list:\n  - metric: bleu\n'
    )
    (folder / "c_hub.yaml").write_text(
        "task: c_hub\ndataset_path: trl-nca-nobody/absent-dataset\n"
        + body
        + "output_type: multiple_choice\ndoc_to_choice: choices\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n"
    )
    return str(folder)


# (case, the model, extra options, the expected line's text); every case gets --include-path and --output-dir
CASES = [
    (
        "an unknown task",
        "short",
        ["--tasks", "c_mcc"],
        "Unknown harness task 'c_mcc': lm-eval has no task, group or tag of that name",
    ),
    (
        "a context field the documents lack",
        "short",
        ["--tasks", "c_mc", "--context-column", "nope"],
        "--context-column 'nope': the documents of harness task 'c_mc' have no field 'nope'",
    ),
    (
        "a context past the positions",
        "short",
        ["--tasks", "c_mc", "--context-text", LONG],
        "more than the 64 positions of",
    ),
    (
        "--tasks with --dataset",
        "short",
        ["--tasks", "c_mc", "--dataset", "items.jsonl"],
        "--tasks and --dataset both choose what to evaluate",
    ),
    ("--tasks with --game", "short", ["--tasks", "c_mc", "--game", "sokoban"], "--tasks and --game both choose"),
    (
        "a metric the task does not compute",
        "short",
        ["--tasks", "c_mc", "--metric", "f1"],
        "Harness task 'c_mc' does not compute the metric 'f1'; it computes ['acc']",
    ),
    (
        "a metric that is not 0/1",
        "short",
        ["--tasks", "c_bleu"],
        "The metric 'bleu' of harness task 'c_bleu' is aggregated by bleu, not averaged over documents",
    ),
    (
        "documents on an unreachable Hub",
        "short",
        ["--tasks", "c_hub"],
        "Harness task 'c_hub' reads its documents from the Hugging Face Hub, which cannot be reached here",
    ),
    (
        "no system role with --placement system",
        "no_system",
        ["--tasks", "c_mc"],
        "has no system role: lm-eval would drop the system message",
    ),
    ("a dataset option", "short", ["--tasks", "c_mc", "--scorer", "yesno"], "--scorer do(es) not apply to --tasks"),
    (
        "samples of a deterministic task",
        "short",
        ["--tasks", "c_mc", "--samples-per-view", "2"],
        "the tasks ['c_mc'] do not sample",
    ),
    (
        "a missing include path",
        "short",
        ["--tasks", "c_mc", "--include-path", "MISSING"],
        "is not a folder of task YAML files",
    ),
    (
        "output-dir cannot be created",
        "short",
        ["--tasks", "c_mc", "--output-dir", str(READ_ONLY / "out")],
        "Cannot create the output folder",
    ),
]


@pytest.mark.parametrize("case, model, extra, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_harness_input_is_one_line_before_any_model_loads(
    models, tasks, tmp_path, capsys, monkeypatch, no_model_loads, case, model, extra, expected
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    extra = [str(tmp_path / "missing") if value == "MISSING" else value for value in extra]
    argv = ["eval", "--model", models[model], "--no-progress", "--no-plots"]
    if "--include-path" not in extra:
        argv += ["--include-path", tasks]
    if "--context-text" not in extra and "--context-column" not in extra:
        argv += ["--context-text", "Answer yes or no."]
    if "--output-dir" not in extra:
        argv += ["--output-dir", str(out)]
    line = one_error_line(cli_main, [*argv, *extra], capsys, "eval")
    assert expected in line, line
    if case == "an unknown task":
        assert "Closest lm-eval names: c_mc" in line
    if case == "no system role with --placement system":
        assert "Give --placement user" in line
    assert not out.exists()  # nothing written


def test_no_system_role_runs_with_placement_user(models, tasks, tmp_path):
    """The refused model runs with the context in the user turn, and both views differ there."""
    out = tmp_path / "out"
    code = cli_main(
        [
            "eval",
            "--model",
            models["no_system"],
            "--tasks",
            "c_mc",
            "--include-path",
            tasks,
            "--context-column",
            "hint",
            "--placement",
            "user",
            "--output-dir",
            str(out),
            "--no-progress",
            "--no-plots",
            "--bootstrap",
            "20",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    (entry,) = summary["models"]
    assert entry["name"] == "no_system/c_mc"
    assert {
        "n",
        "n_correct_x",
        "n_correct_xc",
        "harm_count",
        "help_count",
        "acc_x",
        "acc_xc",
        "harm",
        "help",
        "regime",
        "both_correct",
    } <= set(entry["metrics"])
    assert entry["metrics"]["n"] == len(DOCS)
    records = [json.loads(line) for line in (out / "no_system" / "c_mc" / "records.jsonl").read_text().splitlines()]
    assert [r["x"]["extra"]["doc_id"] for r in records] == [0, 1, 2]
    for doc, record in zip(DOCS, records, strict=True):
        assert doc["hint"] in record["xc"]["extra"]["prompt"] and doc["hint"] not in record["x"]["extra"]["prompt"]
        assert record["x"]["completion"] in doc["choices"] and record["x"]["extra"]["value"] in (0.0, 1.0)


def test_a_rerun_with_another_context_is_refused(models, tasks, tmp_path, capsys):
    """records.jsonl of another run (here: another context) in the output folder is refused, never mixed."""
    out = tmp_path / "out"
    argv = [
        "eval",
        "--model",
        models["short"],
        "--tasks",
        "c_mc",
        "--include-path",
        tasks,
        "--output-dir",
        str(out),
        "--no-progress",
        "--no-plots",
        "--bootstrap",
        "0",
    ]
    assert cli_main([*argv, "--context-text", "Answer yes."]) == 0
    before = (out / "short" / "c_mc" / "records.jsonl").read_text()
    line = one_error_line(cli_main, [*argv, "--context-text", "Answer no."], capsys, "eval")
    assert "records.jsonl" in line, line
    assert (out / "short" / "c_mc" / "records.jsonl").read_text() == before


@pytest.mark.slow
def test_without_lm_eval_tasks_name_the_extra(models, tasks, tmp_path):
    """With lm-eval not importable (a sys.modules block, as when it is not installed), --tasks prints one line naming
    the extra, and the dataset path still imports and parses."""
    script = (
        "import sys; sys.modules['lm_eval'] = None\n"
        "from trl_nca.cli import main\n"
        f"sys.exit(main(['eval', '--model', {models['short']!r}, '--tasks', 'c_mc', '--include-path', {tasks!r}, "
        f"'--context-text', 'c', '--output-dir', {str(tmp_path / 'out')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert 'pip install "trl-nca[harness]"' in lines[0], lines[0]
