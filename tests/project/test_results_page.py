"""docs/results.md is built from the committed run summaries: its tables must equal what build.py renders from them,
and every experiment it reports has the config that reruns it."""

import json
import re
from pathlib import Path

import pytest

from trl_nca.testing import load_script


ROOT = Path(__file__).resolve().parents[2]


def _build_module():
    return load_script(ROOT / "docs" / "results" / "build.py")


def test_results_page_matches_its_data(capsys):
    assert _build_module().main(["--check"]) == 0, capsys.readouterr().out


def test_check_notices_a_changed_summary(tmp_path, monkeypatch):
    build = _build_module()
    data = tmp_path / "data"
    data.mkdir()
    for path in (ROOT / "docs" / "results" / "data").glob("*.json"):
        summary = json.loads(path.read_text())
        if path.stem == "org-100":
            summary["aggregated"]["opd"]["harm"]["mean"] += 0.1  # one number off
        (data / path.name).write_text(json.dumps(summary))
    monkeypatch.setattr(build, "DATA", data)
    assert build.main(["--check"]) == 1


def test_every_reported_experiment_can_be_rerun():
    page = (ROOT / "docs" / "results.md").read_text()
    names = set(re.findall(r"<!-- table:([\w.-]+) -->", page))
    assert names, "results.md has no generated tables"
    configs = {p.stem for p in (ROOT / "examples" / "configs" / "results").glob("*.yaml")}
    assert names <= configs, f"no config in examples/configs/results/ for {sorted(names - configs)}"
    script = (ROOT / "benchmarks" / "reproduce_results.sh").read_text()
    missing = [name for name in configs if name not in script]
    assert not missing, f"benchmarks/reproduce_results.sh does not run {missing}"


def test_the_summary_reads_each_study_from_its_data_and_shows_a_missing_one_as_pending(tmp_path, monkeypatch):
    """The summary at the top of results.md: section 12's row is pending until its data exist, then reads 12.1's
    rules from them; a changed outcome in a study's data changes its row."""
    build = _build_module()
    data = tmp_path / "data"
    data.mkdir()
    for path in (ROOT / "docs" / "results" / "data").glob("*.json"):
        if path.name != "fr-30-default.json":  # section 12's own data: absent first, then made up below
            (data / path.name).write_text(path.read_text())
    monkeypatch.setattr(build, "DATA", data)
    page = (ROOT / "docs" / "results.md").read_text()
    row = next(line for line in build.summary_table(page).splitlines() if line.startswith("| [12]"))
    assert "**pending**: data/fr-30-default.json not committed yet" in row
    # fr-30-default's data: fr-30-fast's, with a gated method 6 points lower in Acc_x than OPD on seeds 0 and 1
    summary = json.loads((data / "fr-30-fast.json").read_text())
    summary["methods"]["gated"] = summary["methods"]["nca"]
    summary["per_seed"]["gated"] = [dict(r) for r in summary["per_seed"]["opd"]]
    for r in summary["per_seed"]["gated"][:2]:
        r["acc_x"] -= 0.06
    (data / "fr-30-default.json").write_text(json.dumps(summary))
    row = next(line for line in build.summary_table(page).splitlines() if line.startswith("| [12]"))
    assert "pending" not in row and "| opd, nca, gated |" in row
    assert "Acc_x 5 points below OPD's in 2, harm 5 points above in 0: the default costs Acc_x" in row
    # section 9's row follows its data: one more organism where OPD degrades on organism_shift
    units = json.loads((data / "units-shift.json").read_text())
    for r in units["per_seed"]["opd"]:
        if r["organism"] == 5:
            r["regime"] = "A"
    (data / "units-shift.json").write_text(json.dumps(units))
    row = next(line for line in build.summary_table(page).splitlines() if line.startswith("| [9]"))
    assert "`organism_shift`: OPD degraded on 4 of 8 organisms" in row and "finding 1 holds" in row


def test_the_gate_the_per_seed_differences_and_the_machines_are_built_from_the_data(tmp_path, monkeypatch):
    """Sections 12.2-12.3's tables and the summary's machine column are generated: a cell edited by hand is rewritten
    from the data (so `--check` fails on it), the differences come from unrounded values, and a slice's vector unit
    reaches the summary."""
    build = _build_module()
    page = (ROOT / "docs" / "results.md").read_text()
    edits = [
        ("| 2 | 17 | 14 | 0.073 |", "| 2 | 17 | 14 | 0.070 |"),  # 12.2: the gate of seed 2
        ("| 0 | +2.1 | -4.0 | +2.3 | -2.6 |", "| 0 | +2.1 | -4.1 | +2.3 | -2.7 |"),  # 12.3: the rounded differences
        ("2-core AMD EPYC, AVX-512, 1 torch thread; 5.25.0 |", "2-core AMD EPYC, AVX2, 1 torch thread; 5.25.0 |"),
    ]
    edited = page
    for old, new in edits:
        assert edited.count(old) == 1, old
        edited = edited.replace(old, new)
    assert build.render(edited) == page
    data = tmp_path / "data"
    data.mkdir()
    for path in (ROOT / "docs" / "results" / "data").glob("*.json"):
        summary = json.loads(path.read_text())
        if path.stem == "fr-30-default":
            summary["slices"]["machines"]["gated-seed2"]["cpu_capability"] = "AVX2"
        (data / path.name).write_text(json.dumps(summary))
    monkeypatch.setattr(build, "DATA", data)
    row = next(line for line in build.summary_table(page).splitlines() if line.startswith("| [12]"))
    assert (
        "2-core AMD EPYC: AVX-512, 1 torch thread (base, opd-seed0" in row
        and "AVX2, 1 torch thread (gated-seed2)" in row
    )


def test_section_13s_readings_follow_its_pre_registration():
    """docs/results.md 13.1's readings on made-up per-seed rows: a student degraded in regime A or with an excess harm
    of at least 5 points whose interval lies above 0; OPD degraded in 2 of 3 seeds; an anchor prevented it when none
    of its seeds degraded and its excess is below OPD's in every degraded seed; the verdict."""
    readers = _build_module().readers

    def row(seed, excess, low=-0.01, regime="C", acc_x=0.9):
        return {
            "seed": seed,
            "acc_x": acc_x,
            "harm_excess": excess,
            "ci": {"harm_excess": [low, excess + 0.02]},
            "regime": regime,
        }

    flat = [row(s, 0.0) for s in range(3)]
    per_seed = {"base": [{"seed": None, "acc_x": 0.0}]}
    for budget in (10, 40):
        per_seed[f"opd-{budget}"] = [row(0, 0.08, 0.02), row(1, 0.06, 0.01), row(2, 0.09, -0.01)]  # 0, 1 degraded
        per_seed[f"nca-{budget}"] = list(flat)
        per_seed[f"gated-{budget}"] = [row(0, 0.0), row(1, 0.0, regime="A"), row(2, 0.0)]  # seed 1 in regime A
    r = readers.twice_readings({"per_seed": per_seed})
    assert r["degraded"]["opd-10"] == [0, 1] and r["opd_degraded"] == {10: True, 40: True}
    assert r["prevented"] == {"nca-10": True, "gated-10": False, "nca-40": True, "gated-40": False}
    assert r["verdict"] == "the first real-model degradation" and not r["dose_grows"]
    for budget in (10, 40):  # a 5-point excess whose interval reaches 0 is no degradation
        per_seed[f"opd-{budget}"] = [row(0, 0.08, 0.0), row(1, 0.04, 0.01), row(2, 0.09, -0.01)]
    r = readers.twice_readings({"per_seed": per_seed})
    assert r["opd_degraded"] == {10: False, 40: False} and r["verdict"] == "a null on a task built to show one"
    per_seed["opd-40"][2]["acc_x"] = 0.2  # one OPD student did not internalise
    assert readers.twice_readings({"per_seed": per_seed})["verdict"] == "no internalisation"


def test_a_study_run_as_slices_is_reported_as_it_comes(tmp_path, monkeypatch):
    """Section 13.6 (`<!-- units:twice -->`) is built from the committed slices of `twice.yaml`: a cell edited by hand
    is rewritten, a unit whose slice is taken away is named as missing, and a slice made with other settings stops
    the build naming the block and the difference."""
    import shutil

    build = _build_module()
    page = (ROOT / "docs" / "results.md").read_text()
    block = re.search(r"<!-- units:twice -->\n.*?<!-- /units -->", page, re.DOTALL).group(0)
    cell = re.search(r"\| opd-10 \| 0 \| ([0-9.]+) \|", block)
    edited = page.replace(cell.group(0), cell.group(0).replace(cell.group(1), "99.9"))
    assert edited != page and build.render(edited) == page
    slices = tmp_path / "docs" / "results" / "slices" / "twice"
    shutil.copytree(ROOT / "docs" / "results" / "slices" / "twice", slices)
    monkeypatch.setattr(build, "SLICES_ROOT", tmp_path)
    (slices / "opd-10-seed0.json").unlink()
    text = build.units("twice")
    assert re.search(r"; not yet run: (.*, )?opd-10-seed0[,.]", text) and "| opd-10 | 0 |" not in text
    data = json.loads((slices / "nca-10-seed0.json").read_text())
    data["settings"]["training"]["learning_rate"] = 0.5
    (slices / "nca-10-seed0.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="block units:twice: .*`settings.training.learning_rate` was 0.5"):
        build.units("twice")
