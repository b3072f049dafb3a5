"""Committed slices that cannot join their table (issue 50): each row is one slice file changed as a user or a
mistake would change it, with the one line `trl-nca compare --from_slices` must print (naming the file, the field and
"run its slice again"); no table is written. A slice proves what made it: its run's own settings (its method's
overrides included), its unit, method, organism and seed against its file's name and the plan, and a checksum over
what it measured (`trl_nca.recipes.slices`)."""

import json
import shutil
from pathlib import Path

import pytest

from trl_nca.cli import main as cli_main
from trl_nca.testing import load_script, one_error_line


CONFIG = """
model_name_or_path: {model}
task: reply_in_french
seeds: [0]
methods: {methods}
num_train: 2
eval_items: 2
eval_samples_per_view: 2
max_new_tokens: 3
max_steps: 1
per_device_train_batch_size: 2
learning_rate: 1.0e-3
use_peft: true
lora_r: 2
lora_alpha: 4
lora_target_modules: [q_proj, v_proj]
report_to: none
disable_tqdm: true
"""
METHODS = '["opd:nca_beta=0", "nca:nca_beta=0.5"]'
OTHER_METHODS = '["opd:nca_beta=0.3,learning_rate=0.5", "nca:nca_beta=0.5"]'  # the probe: another opd


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_dir):
    """The slices of a small comparison (base, opd-seed0, nca-seed0), and an opd-seed0 slice trained with other
    method settings (another config of the same comparison)."""
    from trl_nca.cli import compare

    root = tmp_path_factory.mktemp("made")
    config, other = root / "compare.yaml", root / "other.yaml"
    config.write_text(CONFIG.format(model=tiny_dir, methods=METHODS))
    other.write_text(CONFIG.format(model=tiny_dir, methods=OTHER_METHODS))
    for unit in ("base", "opd-seed0", "nca-seed0"):
        compare(
            [
                "--config",
                str(config),
                "--output_dir",
                str(root / unit),
                "--slice",
                unit,
                "--slices_dir",
                str(root / "slices"),
            ]
        )
    compare(
        [
            "--config",
            str(other),
            "--output_dir",
            str(root / "other"),
            "--slice",
            "opd-seed0",
            "--slices_dir",
            str(root / "other-slices"),
        ]
    )
    return root, config


def _resealed(data):
    """`data` with its checksum recomputed: the edit reaches the typed checks behind the checksum."""
    from trl_nca.recipes.slices import results_sha256

    return {**data, "results_sha256": results_sha256(data)}


def _edit(field_edit, reseal=True):
    def edit(data, slices, root):
        field_edit(data)
        return _resealed(data) if reseal else data

    return edit


def _set(path, value):
    def change(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _other_method_settings(data, slices, root):
    return json.loads((root / "other-slices" / "opd-seed0.json").read_text())


def _copied_from(unit, rename=False):
    def edit(data, slices, root):
        copied = json.loads((slices / f"{unit}.json").read_text())
        if rename:
            copied["unit"] = "nca-seed0"
        return copied

    return edit


def _drop(key):
    def change(data):
        del data[key]

    return change


def _duplicate_id(data):
    data["items"][1]["id"] = data["items"][0]["id"]


def _foreign_id(data):
    data["items"][1]["id"] = "test-9999"


def _flip(data):
    data["items"][0]["x"][0][0] = 1 - data["items"][0]["x"][0][0]


# (case, the file changed, how, the expected line's text)
CASES = [
    (
        "made with other method settings",
        "opd-seed0",
        _other_method_settings,
        "was made with other settings, data "
        "or weights than this table: `run_settings.training.learning_rate` was 0.5, now 0.001; "
        "`run_settings.training.nca_beta` was 0.3, now 0.0; `run_settings.training.nca_monitor` was False, now True. Run "
        "that slice again with these",
    ),
    (
        "another unit's file under this name",
        "nca-seed0",
        _copied_from("opd-seed0"),
        "holds the unit 'opd-seed0', but "
        "its file is named for 'nca-seed0': a slice copied or renamed would stand for another run.",
    ),
    (
        "another unit's file, its unit renamed",
        "nca-seed0",
        _copied_from("opd-seed0", rename=True),
        "holds method "
        "'opd', organism None, seed 0, but the unit 'nca-seed0' of this comparison is method 'nca', organism None, seed "
        "0. Run its slice again.",
    ),
    (
        "a flipped outcome",
        "opd-seed0",
        _edit(_flip, reseal=False),
        "its outcomes, curves or diagnostics (`scorer, "
        "items, diagnostics, train_seconds, curves, tracking`) do not match its `results_sha256`: the file was edited "
        "after its run. Run its slice again.",
    ),
    (
        "the string '0' as an outcome",
        "opd-seed0",
        _edit(_set(["items", 0, "x", 0, 0], "0")),
        "`items[0].x[0]` must be [correct, format_failure, truncated, num_tokens] as whole numbers, not ['0', ",
    ),
    (
        "true as an outcome",
        "opd-seed0",
        _edit(_set(["items", 0, "x", 0, 0], True)),
        "`items[0].x[0]` must be [correct, format_failure, truncated, num_tokens] as whole numbers, not [True, ",
    ),
    (
        "an outcome of 2",
        "opd-seed0",
        _edit(_set(["items", 0, "xc", 1, 0], 2)),
        "`items[0].xc[1]` must hold the flags correct, format_failure and truncated as 0 or 1, not [2, ",
    ),
    (
        "num_tokens -100",
        "opd-seed0",
        _edit(_set(["items", 0, "x", 0, 3], -100)),
        "`items[0].x[0]` holds -100 response tokens, outside 0 to max_new_tokens=3; run its slice again.",
    ),
    (
        "a duplicate item id",
        "base",
        _edit(_duplicate_id),
        "`items[1].id` repeats the item 'test-0'; run its slice again.",
    ),
    (
        "a foreign item id",
        "base",
        _edit(_foreign_id),
        "`items` holds ids that are no held-out item of this table (test-9999); run its slice again.",
    ),
    (
        "a list",
        "base",
        lambda data, slices, root: [],
        "holds a list, not a slice's object of fields; run its slice again.",
    ),
    (
        "null",
        "base",
        lambda data, slices, root: None,
        "holds null, not a slice's object of fields; run its slice again.",
    ),
    ("no items", "base", _edit(_drop("items")), "`items` is missing; run its slice again."),
    ("no method", "opd-seed0", _edit(_drop("method")), "`method` is missing; run its slice again."),
    ("no curves", "opd-seed0", _edit(_drop("curves")), "`curves` is missing; run its slice again."),
    (
        "curves of a base",
        "base",
        _edit(_set(["curves"], {"step": [1]})),
        "`curves` must be null for a base; run its slice again.",
    ),
    (
        "a student without run settings",
        "opd-seed0",
        _edit(_set(["run_settings"], None)),
        "`run_settings` must be set for a student; run its slice again.",
    ),
    (
        "a seed as text",
        "opd-seed0",
        _edit(_set(["seed"], "0")),
        "`seed` must be a whole number >= 0 or null, not '0'; run its slice again.",
    ),
    ("an unknown field", "base", _edit(_set(["note"], "x")), "`note` is not a field of a slice; run its slice again."),
    (
        "an upgrade note that is no sentence",
        "base",
        _edit(_set(["upgraded"], True)),
        "`upgraded` must be a sentence naming the script and config, or absent, not True; run its slice again.",
    ),
    (
        "a format-1 slice",
        "base",
        _edit(_set(["format"], 1)),
        "is of format 1, this trl-nca reads format 2; upgrade "
        "committed slices with `python scripts/upgrade_slices.py DIR --config CONFIG`, or run its slice again.",
    ),
]


@pytest.mark.parametrize("case, unit, edit, expected", CASES, ids=[c[0] for c in CASES])
def test_a_slice_that_cannot_prove_what_made_it_is_one_line(made, tmp_path, capsys, case, unit, edit, expected):
    root, config = made
    slices = tmp_path / "slices"
    shutil.copytree(root / "slices", slices)
    target = slices / f"{unit}.json"
    target.write_text(json.dumps(edit(json.loads(target.read_text()), slices, root)))
    line = one_error_line(
        cli_main,
        [
            "compare",
            "--config",
            str(config),
            "--output_dir",
            str(tmp_path / "out"),
            "--from_slices",
            "true",
            "--slices_dir",
            str(slices),
        ],
        capsys,
        command="compare",
    )
    assert str(target) in line and expected in line, line
    assert not (tmp_path / "out" / "comparison.json").exists() and not (tmp_path / "out" / "comparison.md").exists()


def test_the_untouched_slices_build_their_table(made, tmp_path):
    """The rows' baseline: the same slices, unchanged, build the table."""
    from trl_nca.cli import compare

    root, config = made
    summary = compare(
        [
            "--config",
            str(config),
            "--output_dir",
            str(tmp_path / "out"),
            "--from_slices",
            "true",
            "--slices_dir",
            str(root / "slices"),
        ]
    )
    assert (tmp_path / "out" / "comparison.json").is_file() and set(summary["per_seed"]) == {"base", "opd", "nca"}


# --- scripts/upgrade_slices.py: format-1 slices upgraded in place, or nothing written --------------------------------


def _upgrade_script():
    return load_script(Path(__file__).resolve().parents[2] / "scripts" / "upgrade_slices.py")


def _git(repo, *args):
    import subprocess

    command = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def _format_1(data):
    """What a format-1 run wrote: no run settings, no checksum."""
    data = {key: value for key, value in data.items() if key not in ("run_settings", "results_sha256")}
    return {**data, "format": 1}


def _methods_edited(repo):
    config = repo / "compare.yaml"
    config.write_text(config.read_text().replace('"opd:nca_beta=0"', '"opd:nca_beta=0.3,learning_rate=0.5"'))


def _other_names_this_folder(repo):
    (repo / "other.yaml").write_text((repo / "other.yaml").read_text() + "slices_dir: results/slices\n")


def _flip_outcome(repo):
    path = repo / "results" / "slices" / "opd-seed0.json"
    data = json.loads(path.read_text())
    data["items"][0]["x"][0][0] = 1 - data["items"][0]["x"][0][0]
    path.write_text(json.dumps(data, indent=1) + "\n")


def _flip_outcome_committed(repo):
    _flip_outcome(repo)
    _git(repo, "commit", "-qam", "an edit")


def _half_written(repo):
    path = repo / "results" / "slices" / "nca-seed0.json"
    path.write_text(path.read_text()[:200])


def _a_list(repo):
    (repo / "results" / "slices" / "base.json").write_text("[]\n")


# (case, what is done before the commit of the slices and configs, what is done after it, the config given, the one
# line printed, or None where the slices are upgraded): a format-1 slice holds neither its run's settings nor a
# checksum, so the script proves from the repository which config made it and that its outcomes are as committed
UPGRADE_CASES = [
    ("the config the slices were made with", None, None, "compare.yaml", None),
    (
        "another config (other method overrides) naming no slices folder",
        None,
        None,
        "other.yaml",
        "names no slices_dir, not '{slices}': it is not the config these slices were made with",
    ),
    (
        "another config naming the same slices folder",
        _other_names_this_folder,
        None,
        "other.yaml",
        "the configs naming its folder as their slices_dir are {repo}/compare.yaml, {repo}/other.yaml: the slice's "
        "config is not the one --config",
    ),
    (
        "the config's methods edited after the slices were committed",
        None,
        _methods_edited,
        "compare.yaml",
        "is not, as it is now, in the commit that added {slices}/base.json",
    ),
    (
        "an outcome edited by hand",
        None,
        _flip_outcome,
        "compare.yaml",
        "{slices}/opd-seed0.json: its outcomes, curves or diagnostics differ from those of the commit that added it",
    ),
    (
        "an outcome edited by hand and committed",
        None,
        _flip_outcome_committed,
        "compare.yaml",
        "{slices}/opd-seed0.json: its outcomes, curves or diagnostics differ from those of the commit that added it",
    ),
    ("a half-written slice", None, _half_written, "compare.yaml", "{slices}/nca-seed0.json is cut or garbled"),
    ("a list", None, _a_list, "compare.yaml", "{slices}/base.json holds a JSON list, not a slice"),
    ("a missing config", None, None, "none.yaml", "--config '{repo}/none.yaml' is no file"),
    ("no config given", None, None, None, "the following arguments are required: --config"),
    ("a slice made immutable", None, "IMMUTABLE", "compare.yaml", "{slices}/opd-seed0.json cannot be written"),
]


@pytest.mark.slow  # starts git (and chattr)
@pytest.mark.parametrize("case, before, after, config, expected", UPGRADE_CASES, ids=[c[0] for c in UPGRADE_CASES])
def test_upgrade_slices_proves_what_made_a_format_1_slice_or_writes_nothing(
    made, tiny_dir, tmp_path, capsys, case, before, after, config, expected
):
    import subprocess

    root, made_with = made
    repo, script = tmp_path / "repo", _upgrade_script()
    slices = repo / "results" / "slices"
    slices.mkdir(parents=True)
    originals = {path.name: json.loads(path.read_text()) for path in (root / "slices").glob("*.json")}
    for name, data in originals.items():
        (slices / name).write_text(json.dumps(_format_1(data), indent=1) + "\n")
    (repo / "compare.yaml").write_text(made_with.read_text() + "slices_dir: results/slices\n")
    (repo / "other.yaml").write_text(CONFIG.format(model=tiny_dir, methods=OTHER_METHODS))
    _git(repo, "init", "-q")
    if before is not None:
        before(repo)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "slices of format 1")
    immutable = slices / "opd-seed0.json"
    if after == "IMMUTABLE":
        if subprocess.run(["chattr", "+i", str(immutable)], capture_output=True).returncode != 0:
            pytest.skip("cannot make a file immutable here (chattr +i needs root and CAP_LINUX_IMMUTABLE)")
    elif after is not None:
        after(repo)
    before_bytes = {path.name: path.read_bytes() for path in slices.iterdir()}
    try:
        capsys.readouterr()
        code = script.main([str(slices), *(["--config", str(repo / config)] if config else [])])
    finally:
        subprocess.run(["chattr", "-i", str(immutable)], capture_output=True)
    err = capsys.readouterr().err
    if expected is None:
        assert code == 0, err
        for name, data in originals.items():  # the very file the run wrote, and a note that says what was derived
            upgraded = json.loads((slices / name).read_text())
            assert upgraded.pop("upgraded") == script.upgrade_note(str(repo / config)) and upgraded == data, name
        assert script.main([str(slices), "--config", str(repo / config), "--check"]) == 0  # idempotent
        return
    assert code == 1 and len(err.strip().splitlines()) == 1 and err.startswith("upgrade_slices: "), err
    assert expected.format(repo=repo, slices=slices) in err, err
    assert err.strip().endswith("Nothing was written.")
    assert {path.name: path.read_bytes() for path in slices.iterdir()} == before_bytes
