"""`trl-nca experience` on bad input (issue 35): each probe is one case of the table, with the one line it must
print, and no model is loaded before it. `--output` is checked before the rounds, not when the text is written, and a
second run writing the same output meanwhile is refused, never mixed."""

from pathlib import Path

import pytest

import trl_nca.eval.loading
from trl_nca.cli import main as cli_main
from trl_nca.inputs import output_file_lock
from trl_nca.testing import one_error_line


def one_line(argv, capsys) -> str:
    return one_error_line(cli_main, argv, capsys)


# (case, --output, the expected line's text, its fix)
CASES = [
    ("output is a folder", "FOLDER", "--output '{out}' is a folder", "give the path of a file to write"),
    (
        "output folder cannot be created",
        "/sys/trl-nca-test/lessons.txt",
        "cannot be written: ",
        "in a folder you can write to",
    ),
    (
        "output folder is read-only",
        "/sys/kernel/trl-nca-lessons.txt",
        "cannot be written: ",
        "in a folder you can write to",
    ),
    (
        "output written by another run",
        "LOCKED",
        "{out} is being written by another trl-nca run (pid",
        "Wait for it to end, or give another --output.",
    ),
    (
        "output is the JSON history's name",
        "lessons.json",
        "ends in .json, the name of the JSON history written next to the text",
        "Give the text file another suffix",
    ),
]


@pytest.mark.parametrize("case, output, expected, fix", CASES, ids=[c[0] for c in CASES])
def test_bad_experience_output_is_one_line_before_the_rounds(
    tiny_dir, tmp_path, capsys, no_model_loads, case, output, expected, fix
):
    out = (
        Path(output)
        if output.startswith("/")
        else tmp_path / {"FOLDER": "lessons", "LOCKED": "lessons.txt"}.get(output, output)
    )
    if output == "FOLDER":
        out.mkdir()
    argv = ["experience", "--model", tiny_dir, "--game", "frozenlake", "--output", str(out)]
    if output == "LOCKED":
        with output_file_lock(out, "trl-nca experience --seed 1", "--output"):
            line = one_line(argv, capsys)
        assert "trl-nca experience --seed 1" in line, line
    else:
        line = one_line(argv, capsys)
    assert line.startswith("trl-nca experience: error: ") and expected.format(out=out) in line and fix in line, line
    if not output.startswith("/") and output != "FOLDER":
        assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, no lock left behind


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--episodes", "0"], "--episodes must be at least 1, got 0"),
        (["--game-option", "size=abc"], "size must be an integer, got the str 'abc'"),
        (["--game-option", "sise=3"], "unexpected keyword argument 'sise'"),
        (["--game-option", "size=3", "--game-option", "size=4"], "--game-option size is given twice"),
    ],
)
def test_experience_cli_checks_settings_before_loading_the_model(tiny_dir, tmp_path, capsys, monkeypatch, extra, match):

    def no_model_work(*a, **k):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(trl_nca.eval.loading, "load_model", no_model_work)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(
            ["experience", "--model", tiny_dir, "--game", "frozenlake", "--output", str(tmp_path / "x.txt"), *extra]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "trl-nca experience: error:" in err and match in err


def test_experience_cli_missing_model_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["experience", "--model", "./no/model", "--game", "frozenlake", "--output", str(tmp_path / "x.txt")])
    assert exit_info.value.code == 2
    assert "trl-nca experience: error: Model path './no/model' does not exist" in capsys.readouterr().err


def test_experience_bad_input_is_one_line(tmp_path, capsys):
    err = one_error_line(
        cli_main,
        [
            "experience",
            "--model",
            "./no/model",
            "--game",
            "frozenlake",
            "--episodes",
            "0",
            "--output",
            str(tmp_path / "x.txt"),
        ],
        capsys,
        command="experience",
    )
    assert "--episodes must be at least 1, got 0" in err
