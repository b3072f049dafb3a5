"""The one adapter at the lm-eval boundary (`trl_nca.eval.lm_eval_adapter`, issue 60 item 5): the only module that
imports lm-eval, with no private name of it; the range of the `harness` extra is the versions tested (each one runs
the harness tests in `.ci/run`), and the installed one is among them; Hub failures are told by their exception class;
a task file lm-eval's index skips is named with its error; lm-eval's progress bars are left out of the output."""

import io
import re
import tomllib
from pathlib import Path

import pytest


lm_eval = pytest.importorskip("lm_eval")
from trl_nca.eval import lm_eval_adapter  # noqa: E402  (after the skip)


ROOT = Path(__file__).resolve().parents[2]


def test_only_the_adapter_imports_lm_eval_and_it_uses_no_private_name():
    importing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "trl_nca").rglob("*.py"))
        if re.search(r"^\s*(import lm_eval|from lm_eval)", path.read_text(encoding="utf-8"), re.M)
    ]
    assert importing == ["trl_nca/eval/lm_eval_adapter.py"]
    source = (ROOT / "trl_nca" / "eval" / "lm_eval_adapter.py").read_text(encoding="utf-8")
    assert re.findall(r"\.\_[A-Za-z]\w*", source) == []  # no `._name` attribute of anything
    assert re.findall(r"lm_eval(?:\.\w+)*\._\w+", source) == []  # no private lm-eval module


def test_the_extras_range_is_the_tested_versions_and_the_installed_one_is_among_them():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    tested = lm_eval_adapter.TESTED_VERSIONS
    wanted = f"lm-eval>={tested[0]},<={tested[-1]}"
    assert project["harness"] == [wanted]
    assert wanted in project["dev"]
    available = ("0.4.11", "0.4.12", "0.4.13")  # the releases on the registry up to the newest (2026-12-07)
    assert [v for v in available if tested[0] <= v <= tested[-1]] == list(tested)  # no release in the range untested
    assert "TESTED_VERSIONS" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")  # CI runs each
    assert lm_eval_adapter.lm_eval_version() in tested, (
        f"lm-eval {lm_eval_adapter.lm_eval_version()} is not a tested version {tested}: run the harness tests on it, "
        "then add it to TESTED_VERSIONS and the range of the `harness` extra"
    )


def _raised(error, cause=None):
    """`error` raised from `cause`, as `datasets` wraps the Hub's errors."""
    try:
        try:
            if cause is not None:
                raise cause
            raise error
        except BaseException as inner:
            if inner is error:
                raise
            raise error from inner
    except BaseException as caught:
        return caught


def _hub_cases():
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    return [
        (
            "datasets' own 'Couldn't reach'",
            ConnectionError("Couldn't reach 'x' on the Hub (OfflineModeIsEnabled)"),
            None,
            "unreachable",
        ),
        ("offline mode", OfflineModeIsEnabled("offline"), None, "unreachable"),
        ("not cached, wrapped", RuntimeError("load failed"), LocalEntryNotFoundError("not cached"), "unreachable"),
        ("a timeout", TimeoutError("timed out"), None, "unreachable"),
        ("no such dataset", DatasetNotFoundError("no dataset"), None, "absent"),
        (
            "a message that names the Hub, of another class",
            ValueError("ConnectionError: offline Couldn't reach"),
            None,
            None,
        ),
        ("a key error", KeyError("label"), None, None),
    ]


@pytest.mark.parametrize("case", range(7), ids=[c[0] for c in _hub_cases()])
def test_hub_failures_are_told_by_their_class(case):
    _, error, cause, expected = _hub_cases()[case]
    assert lm_eval_adapter.hub_failure(_raised(error, cause)) == expected


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"a.yaml": "task: a\ndoc_to_text: q\n"}, []),
        ({"a.yaml": "task: a\ncustom_dataset: !function utils.load_docs\n"}, []),  # lm-eval's own tag
        ({"a.yaml": "task: a\ndoc_to_text: [unclosed\n"}, ["a.yaml: while parsing"]),
        ({"a.yaml": "- task\n- a\n"}, ["a.yaml: a task file holds a mapping"]),
        ({"a.yaml": "include: base.yaml\ntask: a\n"}, ["a.yaml: its include: base.yaml names no file"]),
        ({"a.yaml": "include: base.yaml\ntask: a\n", "base.yaml": "output_type: multiple_choice\n"}, []),
        (
            {"sub/a.yaml": "include: ../base.yaml\ntask: a\n", "base.yaml": "key: [\n"},
            ["base.yaml: while parsing", "sub/a.yaml: its include: ../base.yaml: "],
        ),
    ],
    ids=["plain", "a !function tag", "a parse error", "not a mapping", "missing include", "include", "broken include"],
)
def test_task_files_lm_evals_index_skips_are_named_with_their_error(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    problems = lm_eval_adapter.unreadable_task_files([tmp_path])
    found = [p.removeprefix(str(tmp_path) + "/") for p in problems]
    assert len(found) == len(expected) and all(f.startswith(e) for f, e in zip(found, expected)), found


def test_the_unreadable_file_that_declares_a_task_is_found(tmp_path):
    (tmp_path / "a.yaml").write_text("task: a\ndoc_to_text: [unclosed\n")
    (tmp_path / "b.yaml").write_text("task: 'b2'\nkey: [\n")
    problems = lm_eval_adapter.unreadable_task_files([tmp_path])
    assert len(problems) == 2
    assert lm_eval_adapter.defining_files(problems, "a") == problems[:1]
    assert lm_eval_adapter.defining_files(problems, "b2") == problems[1:]
    assert lm_eval_adapter.defining_files(problems, "b") == []


def test_progress_bars_are_left_out_and_other_lines_pass():
    """What a tqdm bar writes (redrawn with `\\r`) is dropped; a warning line, written whole or in pieces, passes."""
    from tqdm import tqdm

    target = io.StringIO()
    stream = lm_eval_adapter.WithoutBars(target)
    for _ in tqdm(range(5), file=stream, mininterval=0):
        pass
    stream.write("a notice that ")
    stream.write("ends here\nand a second line\n")
    stream.write("an unfinished line")
    stream.finish()
    assert target.getvalue() == "a notice that ends here\nand a second line\nan unfinished line"
