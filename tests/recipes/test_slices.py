"""A comparison run as slices (`trl-nca compare --slice UNIT`, `--from_slices`) gives the whole run's numbers, and a
slice that cannot join its table is refused naming the file and the difference."""

import json
import shutil

import pytest


CONFIG = """
model_name_or_path: {model}
task: reply_in_french
seeds: [0, 1]
methods: ["opd:nca_beta=0", "nca:nca_beta=0.5"]
num_train: 4
eval_items: 3
eval_samples_per_view: 2
output_dir: {out}
max_new_tokens: 4
max_steps: 2
per_device_train_batch_size: 2
learning_rate: 1.0e-3
use_peft: true
lora_r: 2
lora_alpha: 4
lora_target_modules: [q_proj, v_proj]
logging_steps: 1
report_to: none
disable_tqdm: true
"""

UNITS = ["base", "opd-seed0", "opd-seed1", "nca-seed0", "nca-seed1"]


@pytest.fixture(scope="module")
def sliced(tmp_path_factory, tiny_dir):
    """The same comparison run whole and as five slices (each in a fresh output folder, as separate sittings)."""
    from trl_nca.cli import compare

    root = tmp_path_factory.mktemp("slices")
    config = root / "compare.yaml"
    config.write_text(CONFIG.format(model=tiny_dir, out=root / "whole"))
    whole = compare(["--config", str(config)])
    for i, unit in enumerate(UNITS):
        written = compare(
            [
                "--config",
                str(config),
                "--output_dir",
                str(root / f"sitting{i}"),
                "--slice",
                unit,
                "--slices_dir",
                str(root / "slices"),
            ]
        )
        assert written["unit"] == unit
    built = compare(
        [
            "--config",
            str(config),
            "--output_dir",
            str(root / "built"),
            "--from_slices",
            "true",
            "--slices_dir",
            str(root / "slices"),
        ]
    )
    return root, config, whole, built


def test_slices_give_the_whole_runs_table_and_statistics(sliced):
    root, _, whole, built = sliced
    assert sorted(p.stem for p in (root / "slices").glob("*.json")) == sorted(UNITS)
    assert built["per_seed"] == whole["per_seed"]
    assert built["aggregated"] == whole["aggregated"]
    assert built["statistics"] == json.loads(json.dumps(whole["statistics"]))
    assert built["table"] == whole["table"] and built["statistics_table"] == whole["statistics_table"]
    assert built["conclusion"] == whole["conclusion"]
    assert built["curves"] == whole["curves"]  # the students' training curves travel with their slices
    one = json.loads((root / "slices" / "nca-seed1.json").read_text())
    assert len(one["items"]) == 3 and len(one["items"][0]["x"]) == 2  # 2 samples per view, no text
    outcomes = [value for item in one["items"] for view in ("x", "xc") for sample in item[view] for value in sample]
    assert all(type(value) is int for value in outcomes) and one["machine"]["cpu_capability"]  # counts, no text
    assert "(from the slices in" in (root / "built" / "comparison.md").read_text()
    from trl_nca.recipes.slices import Slice, describe_slice, slice_metrics

    one = Slice.load(root / "slices" / "nca-seed1.json")
    line = describe_slice(one)  # what `--slice` prints: the unit's own paired metrics
    nca1 = next(row for row in whole["per_seed"]["nca"] if row["seed"] == 1)
    assert slice_metrics(one)["acc_xc"] == nca1["acc_xc"] and f"Acc_xc {100 * nca1['acc_xc']:.1f}%" in line
    assert line.startswith("nca-seed1: Acc_x ") and "95% bootstrap interval over 3 items" in line


def _from_slices(capsys, config, output, slices, *extra):
    """`trl-nca compare --from_slices` into `output`: (exit code, captured output)."""
    from trl_nca.cli import main

    capsys.readouterr()
    argv = ["compare", "--config", str(config), "--output_dir", str(output), "--from_slices", "true"]
    code = main([*argv, "--slices_dir", str(slices), *extra])
    return code, capsys.readouterr()


def _refused(capsys, root, config, slices, *extra):
    code, captured = _from_slices(capsys, config, root / "refused", slices, *extra)
    err = captured.err
    assert code == 2 and "Traceback" not in err, err
    assert not (root / "refused" / "comparison.json").exists()
    return err


@pytest.mark.parametrize(
    "change, message",
    [
        ("missing", "lacks the slices ['opd-seed1']"),
        ("stray", "holds slices ['sdft-seed0'] that are not units"),
        ("data", "`data_sha256` was '00000"),
        ("weights", "`weights_sha256.None` was '00000"),
        ("settings", "`settings.training.learning_rate` was 0.5, now 0.001"),
        ("lora rank", "`settings.student.peft.r` was 16, now 2"),
        ("new field set", "`settings.student.peft.brand_new_config` was {'rank': 4}, now '<not set>'"),
        ("cut", "is not a readable slice"),
    ],
)
def test_a_slice_that_cannot_join_the_table_is_refused_naming_it(sliced, tmp_path, capsys, change, message):
    root, config, _, _ = sliced
    slices = tmp_path / "slices"
    shutil.copytree(root / "slices", slices)
    target = slices / "opd-seed1.json"
    data = json.loads(target.read_text())
    if change == "missing":
        target.unlink()
    elif change == "stray":
        shutil.copy(target, slices / "sdft-seed0.json")
    elif change == "cut":
        target.write_text(target.read_text()[:100])
    else:
        if change == "data":
            data["data_sha256"] = "0" * 64
        elif change == "weights":
            data["weights_sha256"] = {"None": "0" * 64}
        elif change == "lora rank":
            data["settings"]["student"]["peft"]["r"] = 16
        elif change == "new field set":  # a field this PEFT does not know, set: it would shape the numbers
            data["settings"]["student"]["peft"]["brand_new_config"] = {"rank": 4}
        else:
            data["settings"]["training"]["learning_rate"] = 0.5
        target.write_text(json.dumps(data))
    err = _refused(capsys, root, config, slices)
    assert message in err, err
    if change not in ("missing", "stray"):
        assert str(target) in err


@pytest.mark.parametrize(
    "change, warning",
    [
        ("versions", "made with transformers 0.0, running transformers "),
        ("peft version", "made with peft 0.0.1, running peft "),
        ("renamed version", "made with library 0.0.1, running library none"),
        ("new default peft field", ""),
        ("new default training field", ""),
    ],
)
def test_a_slice_of_other_versions_or_new_default_fields_joins_the_table(sliced, tmp_path, capsys, change, warning):
    """Versions are provenance (a warning naming them), and a field a newer library serialises at its default (or
    unset) is no difference: the table is built, equal to the unchanged slices'."""

    root, config, _, built = sliced
    slices = tmp_path / "slices"
    shutil.copytree(root / "slices", slices)
    target = slices / "opd-seed1.json"
    data = json.loads(target.read_text())
    peft = data["settings"]["student"]["peft"]
    if change == "versions":
        data["versions"]["transformers"] = "0.0"
    elif change == "peft version":
        peft["peft_version"] = "0.0.1"
    elif change == "renamed version":  # a library that renames its version field: still provenance
        peft["library_version"] = "0.0.1"
    elif change == "new default peft field":
        peft["astra_config"] = None
    else:
        data["settings"]["training"]["a_new_trl_option"] = False
        data["run_settings"]["training"]["a_new_trl_option"] = False
    target.write_text(json.dumps(data))
    code, captured = _from_slices(capsys, config, tmp_path / "out", slices)
    assert code == 0, captured.err
    saved = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert saved["per_seed"] == built["per_seed"]
    if warning:
        assert warning in captured.err and str(target) in captured.err, captured.err
    else:
        assert "versions are provenance" not in captured.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--slice", "opd-seed7", "--slices_dir", "S"], "`slice: opd-seed7` is not a unit of this comparison"),
        (["--slice", "base"], "give their folder as `slices_dir`"),
        (["--slice", "base", "--from_slices", "true", "--slices_dir", "S"], "give one of them"),
    ],
)
def test_bad_slice_options_are_one_line_before_any_work(sliced, tmp_path, capsys, argv, message):
    from trl_nca.cli import main

    _, config, _, _ = sliced
    capsys.readouterr()
    code = main(["compare", "--config", str(config), "--output_dir", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_study_is_reported_as_its_slices_come(sliced, tmp_path):
    """`slices.progress`: the units present so far, each checked as the whole table checks it, with the per-run rows
    the whole table holds and the units still missing named; with every unit present, its table is the whole one's."""
    from trl_nca.recipes import plan_from_config, slices

    root, config, whole, built = sliced
    plan = plan_from_config(config, tmp_path / "out")
    folder = tmp_path / "slices"
    shutil.copytree(root / "slices", folder)
    assert slices.progress(plan, folder)["table"] == built["table"].split("\n\nColumns")[0]
    for unit in ("opd-seed1", "nca-seed0"):
        (folder / f"{unit}.json").unlink()
    done = slices.progress(plan, folder)
    assert done["present"] == ["base", "opd-seed0", "nca-seed1"] and done["missing"] == ["opd-seed1", "nca-seed0"]
    rows = {
        m: [r for r in whole["per_seed"][m] if f"{m}-seed{r['seed']}" in done["present"] or m == "base"]
        for m in whole["per_seed"]
    }
    assert json.loads(json.dumps(done["per_seed"])) == json.loads(json.dumps(rows))
    assert sorted(done["curves"]) == ["nca/seed1", "opd/seed0"]
    data = json.loads((folder / "nca-seed1.json").read_text())
    data["settings"]["training"]["learning_rate"] = 0.5  # a slice that cannot join the table cannot join this either
    (folder / "nca-seed1.json").write_text(json.dumps(data))
    with pytest.raises(slices.SliceError, match="`settings.training.learning_rate` was 0.5"):
        slices.progress(plan, folder)
    for path in folder.glob("*.json"):
        path.unlink()
    with pytest.raises(slices.SliceError, match="holds no slice of this comparison yet"):
        slices.progress(plan, folder)
