"""`trl-nca analyze` on bad input (issue 35): each probe is one case of the table, with the one line it must print,
and no model is loaded before it. The output folder is checked before the analysis, not when its result is written."""

from pathlib import Path

import pytest

from trl_nca.cli import main as cli_main
from trl_nca.inputs import output_folder_lock
from trl_nca.testing import one_error_line


READ_ONLY = Path("/sys/trl-nca-test")  # a place nobody can create a folder in, root included


def one_line(argv, capsys) -> str:
    return one_error_line(cli_main, argv, capsys)


# (case, --output-dir, the expected line's text)
CASES = [
    ("output-dir is a file", "FILE", "--output-dir '{out}' is a file, not a folder"),
    ("output-dir cannot be created", str(READ_ONLY / "out"), "Cannot create the output folder"),
    ("output-dir in use", "LOCKED", "is in use by another trl-nca run (pid"),
]


@pytest.mark.parametrize("case, output_dir, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_analyze_output_is_one_line_before_the_analysis(
    tiny_dir, tmp_path, capsys, no_model_loads, case, output_dir, expected
):
    out = tmp_path / "out"
    if output_dir == "FILE":
        out.write_text("not a folder\n")
    argv = [
        "analyze",
        "--model",
        f"base={tiny_dir}",
        "--task",
        "reply_in_french",
        "--limit",
        "2",
        "--no-progress",
        "--output-dir",
        str(out) if output_dir in ("FILE", "LOCKED") else output_dir,
    ]
    if output_dir == "LOCKED":
        with output_folder_lock(out, "trl-nca analyze (another run)"):
            line = one_line(argv, capsys)
    else:
        line = one_line(argv, capsys)
    assert line.startswith("trl-nca analyze: error: ") and expected.format(out=out) in line, line
    if output_dir == "FILE":
        assert out.read_text() == "not a folder\n"


# (case, the context options, the expected line's text): a context option the placement would ignore
CONTEXT_CASES = [
    (
        "template with the default system placement",
        ["--template", "{context} / {prompt}"],
        "--template joins the context and the prompt in the user turn, so it applies only with --placement user",
    ),
    (
        "template with system placement",
        ["--placement", "system", "--template", "{context} / {prompt}"],
        "with --placement system (the default) it would be ignored. Add --placement user, or drop --template.",
    ),
    (
        "separator with user placement",
        ["--placement", "user", "--separator", "/"],
        "--separator joins the context and a system message, so it applies only with --placement system",
    ),
]


@pytest.mark.parametrize("case, options, expected", CONTEXT_CASES, ids=[c[0] for c in CONTEXT_CASES])
def test_a_context_option_the_placement_ignores_is_refused(
    tiny_dir, tmp_path, capsys, no_model_loads, case, options, expected
):
    (tmp_path / "items.jsonl").write_text('{"prompt": "Which answer?", "answer": "A"}\n')
    out = tmp_path / "out"
    line = one_line(
        [
            "analyze",
            "--model",
            f"base={tiny_dir}",
            "--dataset",
            str(tmp_path / "items.jsonl"),
            "--context-text",
            "c",
            *options,
            "--output-dir",
            str(out),
        ],
        capsys,
    )
    assert line.startswith("trl-nca analyze: error: ") and expected in line, line
    assert not out.exists()
