"""`trl-nca experience` on bad input (issue 35): each probe is one case of the table, with the one line it must
print, and no model is loaded before it. `--output` is checked before the rounds, not when the text is written."""

from pathlib import Path

import pytest

import trl_nca.eval.loading
from trl_nca.cli import main as cli_main
from trl_nca.testing import one_error_line


def one_line(argv, capsys) -> str:
    return one_error_line(cli_main, argv, capsys)


@pytest.fixture
def no_model_loads(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was reported")

    monkeypatch.setattr(trl_nca.eval.loading, "load_model", refused)


# (case, --output, the expected line's text)
CASES = [
    ("output is a folder", "FOLDER", "--output '{out}' is a folder; give the path of a file to write"),
    ("output folder cannot be created", "/sys/trl-nca-test/lessons.txt", "cannot be written: "),
    ("output folder is read-only", "/sys/kernel/trl-nca-lessons.txt", "cannot be written: "),
]


@pytest.mark.parametrize("case, output, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_experience_output_is_one_line_before_the_rounds(
    tiny_dir, tmp_path, capsys, no_model_loads, case, output, expected
):
    out = tmp_path / "lessons" if output == "FOLDER" else Path(output)
    if output == "FOLDER":
        out.mkdir()
    line = one_line(["experience", "--model", tiny_dir, "--game", "frozenlake", "--output", str(out)], capsys)
    assert line.startswith("trl-nca experience: error: ") and expected.format(out=out) in line, line
    assert "in a folder you can write to" in line or "give the path of a file" in line
