"""`trl-nca eval --tasks` (lm-evaluation-harness tasks) on bad input (issues 49 and 57): each probe is one case of the
table, with the one line it must print before any model loads (and the output folder left as it was); and the run
itself, through the command line, on the tiny model: one summary entry per model and task, records per document, the
table on the console and no lm-eval notice or progress bar in the default log, documents with an empty context left
out on request."""

import json
import logging
import shutil
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
    """The tiny model with 64 positions, a copy of it in another folder (another model to a resume), and the same with
    a chat template that refuses a system message."""
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
    other = root / "other" / "short"  # named `short` in the report as well
    shutil.copytree(short, other)
    return {"short": str(short), "no_system": str(no_system), "other": str(other)}


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
    mc = (folder / "c_mc.yaml").read_text()
    (folder / "c_mc2.yaml").write_text(mc.replace("task: c_mc", "task: c_mc2"))
    empty = folder / "empty.jsonl"  # the second document's context field is empty
    empty.write_text("".join(json.dumps({**d, "hint": "" if i == 1 else d["hint"]}) + "\n" for i, d in enumerate(DOCS)))
    (folder / "c_empty.yaml").write_text(mc.replace("task: c_mc", "task: c_empty").replace(str(data), str(empty)))
    (folder / "c_broken.yaml").write_text("task: c_broken\ndoc_to_text: [unclosed\n")  # lm-eval's index skips it
    (folder / "c_include.yaml").write_text("include: missing_base.yaml\ntask: c_include\n")
    return str(folder)


@pytest.fixture(scope="module")
def earlier_run(models, tasks, tmp_path_factory):
    """The output folders of finished runs of `c_mc` on the model `short`: with the context "Answer yes." (`EARLIER`),
    and with each document's `hint` (`EARLIER_COLUMN`)."""
    runs = {}
    for marker, context in (
        ("EARLIER", ["--context-text", "Answer yes."]),
        ("EARLIER_COLUMN", ["--context-column", "hint"]),
    ):
        out = tmp_path_factory.mktemp("earlier") / "out"
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
        ]
        assert cli_main([*argv, *context, "--no-progress", "--no-plots", "--bootstrap", "0"]) == 0
        runs[marker] = out
    return runs


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
    (
        "a local task file that does not parse",
        "short",
        ["--tasks", "c_broken"],
        "Harness task 'c_broken' is declared in a task file lm-eval could not read",
    ),
    (
        "a local task file whose include is missing",
        "short",
        ["--tasks", "c_include"],
        "c_include.yaml: its include: missing_base.yaml names no file",
    ),
    (
        "another task into a folder of a task's records",
        "short",
        ["--tasks", "c_mc2", "--context-text", "Answer yes.", "EARLIER"],
        "holds the records of runs this one leaves out: short/c_mc",
    ),
    (
        "records of another context",
        "short",
        ["--tasks", "c_mc", "--context-text", "Answer no.", "EARLIER"],
        "short/c_mc/records.jsonl holds the records of another run, made with other settings (context.sha256",
    ),
    (
        "records of another --limit with a per-document context",
        "short",
        ["--tasks", "c_mc", "--context-column", "hint", "--limit", "2", "EARLIER_COLUMN"],
        "made with other settings (context.sha256: ",
    ),
    (
        "records of another model",
        "other",
        ["--tasks", "c_mc", "--context-text", "Answer yes.", "EARLIER"],
        "short/c_mc/records.jsonl holds the records of another run, of another model",
    ),
    (
        "a document whose context field is empty",
        "short",
        ["--tasks", "c_empty", "--context-column", "hint"],
        "the context field 'hint' of 1 document is empty (doc_ids [1]), so its prompts with and without the context "
        "would be the same and it could show neither harm nor help. Give --skip-empty-context",
    ),
    (
        "--skip-empty-context without --tasks",
        "short",
        ["--dataset", "items.jsonl", "--skip-empty-context"],
        "--skip-empty-context applies to harness tasks (--tasks)",
    ),
]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case, model, extra, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_harness_input_is_one_line_before_any_model_loads(
    models, tasks, earlier_run, tmp_path, capsys, monkeypatch, no_model_loads, case, model, extra, expected
):
    """`EARLIER`, `EARLIER_COLUMN`: the output folder starts as a copy of that `earlier_run`'s, and must end as it
    began."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    before = None
    for marker in ("EARLIER", "EARLIER_COLUMN"):
        if marker in extra:
            shutil.copytree(earlier_run[marker], out)
            extra, before = [value for value in extra if value != marker], _snapshot(out)
    extra = [str(tmp_path / "missing") if value == "MISSING" else value for value in extra]
    name = "short=" if model == "other" else ""  # the copy, under the name of the model of the earlier run
    argv = ["eval", "--model", name + models[model], "--no-progress", "--no-plots"]
    if "--include-path" not in extra and "--dataset" not in extra:
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
    if case == "records of another --limit with a per-document context":
        assert "or another --limit" in line
    if case == "a local task file that does not parse":
        assert "c_broken.yaml" in line and "Mend the file" in line
    if before is not None:
        assert _snapshot(out) == before  # the earlier run's records and report as they were
    else:
        assert not out.exists()  # nothing written


def test_no_system_role_runs_with_placement_user(models, tasks, tmp_path, capsys, caplog):
    """The refused model runs with the context in the user turn, and both views differ there. The run ends with the
    table on the console; lm-eval's notices and progress bars are not in the default log. The task is scored by
    log-likelihood, so the report has no length table or figure and no sampling settings, and says why."""
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
            "--bootstrap",
            "20",
        ]
    )
    assert code == 0
    printed = capsys.readouterr()
    assert "| Model | n | Acc_x | Acc_xc |" in printed.out and "| no_system/c_mc | 3 |" in printed.out
    assert "%|" not in printed.err and "it/s]" not in printed.err, printed.err  # no progress bar
    notices = [r.getMessage() for r in caplog.records if r.name.startswith("lm_eval") and r.levelno < logging.ERROR]
    assert notices == []
    report = (out / "report.md").read_text()
    assert "Every answer here was chosen by log-likelihood" in report and "| Model | View | Mean |" not in report
    assert "answers chosen by log-likelihood (no sampling)" in report and "max_new_tokens" not in report
    assert (out / "accuracy.png").exists() and not (out / "lengths.png").exists()
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


def test_documents_with_an_empty_context_are_left_out_on_request(models, tasks, tmp_path, capsys):
    """--skip-empty-context: the document whose context field is empty is left out, and counted in the opening line,
    the provenance and the report; the others are evaluated and keep their doc_ids."""
    out = tmp_path / "out"
    argv = ["eval", "--model", models["short"], "--tasks", "c_empty", "--include-path", tasks, "--output-dir", str(out)]
    code = cli_main([*argv, "--context-column", "hint", "--skip-empty-context", "--no-progress", "--no-plots"])
    assert code == 0
    assert "(left out for an empty context: c_empty: 1)" in capsys.readouterr().out
    (entry,) = json.loads((out / "summary.json").read_text())["models"]
    assert entry["metrics"]["n"] == 2
    assert entry["provenance"]["context"]["skipped_empty"] == {"count": 1, "doc_ids": [1]}
    records = [json.loads(line) for line in (out / "short" / "c_empty" / "records.jsonl").read_text().splitlines()]
    assert [r["item_id"] for r in records] == ["0", "2"]
    assert "1 document with an empty context left out" in (out / "report.md").read_text()
