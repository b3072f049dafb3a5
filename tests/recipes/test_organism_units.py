"""The organism as the unit (docs/results.md section 9): per-organism outcomes, the two-level bootstrap, the
exclusion rule, and students trained in worker processes equal to a sequential run."""

import json
import logging

import numpy as np
import pytest


def rows(values, organism, regimes=None, key="harm"):
    return [
        {"organism": organism, "seed": s, key: v, "regime": (regimes or "C" * len(values))[s]}
        for s, v in enumerate(values)
    ]


def test_fewest_pairs_is_where_the_sign_test_can_reach_five_percent():
    from trl_nca.eval.metrics import mcnemar_exact
    from trl_nca.recipes.statistics import MIN_PAIRS, fewest_pairs

    assert MIN_PAIRS == fewest_pairs(0.05) == 6
    assert mcnemar_exact(MIN_PAIRS, 0) < 0.05 <= mcnemar_exact(MIN_PAIRS - 1, 0)


def test_two_level_bootstrap_equals_a_plain_loop_over_organisms_then_seeds():
    from trl_nca.recipes.statistics import two_level_bootstrap_interval

    groups = [[0.5, 0.7], [0.0, 0.1, 0.3], [0.9, 0.2]]
    low, high = two_level_bootstrap_interval(groups, n_resamples=4000, seed=3)
    rng = np.random.default_rng(11)  # an independent plain implementation: the two intervals agree within noise
    means = []
    for _ in range(4000):
        chosen = [groups[i] for i in rng.integers(0, len(groups), len(groups))]
        means.append(np.mean([np.mean(rng.choice(g, len(g))) for g in chosen]))
    ref_low, ref_high = np.percentile(means, [2.5, 97.5])
    assert low == pytest.approx(ref_low, abs=0.03) and high == pytest.approx(ref_high, abs=0.03)
    # one value per organism reduces it to the plain bootstrap over organisms: spread from organisms only
    assert two_level_bootstrap_interval([[0.2], [0.2], [0.2]]) == pytest.approx([0.2, 0.2])
    # seeds vary within organisms: the interval is wider than from the organism means alone
    wide = two_level_bootstrap_interval([[0.0, 1.0]] * 6, n_resamples=2000)
    assert wide[0] < 0.4 and wide[1] > 0.6


def test_organism_outcomes_degraded_prevented_and_counts():
    from trl_nca.recipes.statistics import MIN_PAIRS, organism_outcomes, render_organisms

    opd, nca = [], []
    # organisms 0-5: OPD in regime A in both seeds (degraded); NCA's harm a tenth of it on 0-4, equal on 5
    for o in range(6):
        opd += rows([0.4, 0.6], o, "AA")
        nca += rows([0.05, 0.05] if o < 5 else [0.5, 0.5], o, "CC" if o < 5 else "AA")
    opd += rows([0.3, 0.0], 6, "AC")  # regime A in one seed of two: not a majority, not degraded
    nca += rows([0.0, 0.0], 6)
    out = organism_outcomes(opd, nca, keys=("harm",), n_resamples=2000)
    assert out["n"] == 7 and out["degraded"] == 6 and out["degraded_in_any_seed"] == 7 and out["prevented"] == 5
    by = {e["organism"]: e for e in out["organisms"]}
    assert by[0]["baseline"]["harm"] == pytest.approx(0.5) and by[0]["prevented"] is True
    assert by[5]["prevented"] is False and by[6]["degraded"] is False and by[6]["prevented"] is None
    harm = out["over_organisms"]["harm"]
    assert harm["n"] == 7 and harm["below"] == 6 and harm["above"] == 0 and harm["sign_test_p"] == pytest.approx(1 / 32)
    assert harm["ci"][0] > 0 and out["note"] is None
    text = render_organisms({"nca": out}, "opd")
    assert "opd degraded (regime A in most of its seeds) on 6 of 7 organisms" in text
    assert "nca prevented it (harm at most 50% of opd's) on 5 of those 6" in text
    assert "| 6 | 2 | 15.0 | 1 | 0.0 | 0 | no | - |" in text
    # fewer organisms than MIN_PAIRS: no interval, no test, and the note says why
    few = organism_outcomes(opd[:6], nca[:6], keys=("harm",))
    assert few["n"] == 3 < MIN_PAIRS and few["over_organisms"]["harm"]["ci"] is None
    assert few["over_organisms"]["harm"]["sign_test_p"] is None and "at least 6 organisms" in few["note"]


def test_an_organism_whose_mean_difference_is_zero_up_to_rounding_is_a_tie():
    """docs/results.md 10.3: organism 4's Acc_x differences of +21.67 and -21.67 points averaged to -5.55e-17 in
    floats, and that residue was counted as a difference, in the counts and in the sign test."""
    from fractions import Fraction

    from trl_nca.eval.metrics import mcnemar_exact
    from trl_nca.recipes.statistics import organism_outcomes, render_over_organisms

    key = "acc_x"
    # organism 0: the baseline's 70% and 30% against the method's 50% twice; exactly 0 as decimals, not in floats
    opd, nca = rows(["0.7", "0.3"], 0, key=key), rows(["0.5", "0.5"], 0, key=key)
    exact = sum(Fraction(a[key]) - Fraction(b[key]) for a, b in zip(opd, nca))
    for row in opd + nca:
        row[key] = float(row[key])
    assert exact == 0 and np.mean([a[key] - b[key] for a, b in zip(opd, nca)]) != 0  # the residue this test is about
    for o in range(1, 5):  # the method lower on 4 organisms
        opd += rows([0.9, 0.9], o, key=key)
        nca += rows([0.5, 0.5], o, key=key)
    for o in (5, 6):  # and higher on 2, one of them by the smallest difference 240 items x 4 samples can show
        opd += rows([0.5, 0.5], o, key=key)
        nca += rows([0.9 if o == 5 else 0.5 + 1 / 960, 0.9], o, key=key)
    out = organism_outcomes(opd, nca, keys=(key,), n_resamples=200)["over_organisms"][key]
    assert (out["n"], out["below"], out["above"]) == (7, 4, 2)  # the tie on neither side
    assert out["sign_test_p"] == pytest.approx(mcnemar_exact(4, 2)) == pytest.approx(0.6875)  # and out of the test
    assert out["ties"] == 1
    text = render_over_organisms({"note": None, "confidence": 0.95, "over_organisms": {key: out}}, "opd", "nca")
    assert "| 4 of 7, 1 equal |" in text


def test_the_rounding_tolerance_lies_between_rounding_and_the_smallest_real_difference():
    """`rounding_tolerance` against float64 arithmetic: above the residues that means of differences which are exactly
    zero as decimals leave (over many random draws), and far below the smallest real difference of two rates."""
    from fractions import Fraction

    from trl_nca.recipes.statistics import rounding_tolerance

    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(2000):
        seeds = int(rng.integers(2, 11))
        a = [int(v) / 960 for v in rng.integers(0, 961, seeds)]
        b = list(a)
        rng.shuffle(b)  # the same rates paired in another order: the exact mean difference is 0
        diffs = [x - y for x, y in zip(a, b)]
        assert sum(Fraction(x) - Fraction(y) for x, y in zip(a, b)) == 0
        residue = abs(float(np.mean(diffs)))
        worst = max(worst, residue / rounding_tolerance(diffs))
    assert 0 < worst <= 1  # some residues are not zero, and every one lies within the tolerance
    assert rounding_tolerance([1 / 960] * 10) < 1e-9 * (1 / 960)


@pytest.fixture
def tiny_organism(tmp_path, monkeypatch):
    from trl_nca.models import organism

    monkeypatch.setenv("TRL_NCA_CACHE", str(tmp_path / "cache"))
    tiny = organism.OrganismSpec(steps=3, hidden_size=32, num_layers=1, num_heads=2, batch_size=4)
    monkeypatch.setattr(organism, "spec_for_alias", lambda alias: tiny)
    return tiny


def _config(tmp_path, out, extra=""):
    config = tmp_path / f"{out}.yaml"
    config.write_text(
        f"""
model_name_or_path: organism-quick
task: organism_shift
organism_seeds: [0, 1]
seeds: [0, 1]
num_train: 4
eval_items: 3
eval_samples_per_view: 2
output_dir: {tmp_path / out}
max_new_tokens: 4
max_steps: 2
logging_steps: 1
per_device_train_batch_size: 2
use_peft: true
lora_r: 2
lora_alpha: 4
lora_target_modules: [q_proj, v_proj]
report_to: none
disable_tqdm: true
{extra}
"""
    )
    return str(config)


def _records(path):
    """The records of a file without the adapter's folder (it differs between the runs) and the run key made from it."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        assert record["meta"].pop("run_key") and record["meta"].pop("adapter")
    return records


@pytest.mark.slow
def test_units_in_workers_equal_a_sequential_run(tmp_path, tiny_organism, caplog):
    from trl_nca.cli import compare

    sequential = compare(["--config", _config(tmp_path, "seq")])
    with caplog.at_level(logging.INFO, logger="trl_nca.recipes.compare_students"):
        parallel = compare(["--config", _config(tmp_path, "par", "workers: 2")])
    in_workers = {r.getMessage().removesuffix(" finished in a worker.") for r in caplog.records}
    assert {"base/org0", "base/org1", "opd/org0/seed0"} <= in_workers
    for run in ("org0/opd/seed0", "org0/nca/seed1", "org1/nca/seed0", "org1/opd/seed1"):
        a, b = (_records(tmp_path / d / run / "eval" / "records.jsonl") for d in ("seq", "par"))
        assert a == b and len(a) == 3, run
        logs = [json.loads((tmp_path / d / run / "done.json").read_text())["log_history"] for d in ("seq", "par")]
        drop = ("train_runtime", "train_samples_per_second", "train_steps_per_second")
        assert [{k: v for k, v in r.items() if k not in drop} for r in logs[0]] == [
            {k: v for k, v in r.items() if k not in drop} for r in logs[1]
        ]
    for base in ("org0/base", "org1/base"):  # evaluated in the workers too: no exclusion rule waits on them
        a, b = (
            [json.loads(x) for x in (tmp_path / d / base / "records.jsonl").read_text().splitlines()]
            for d in ("seq", "par")
        )
        assert a == b and len(a) == 3, base
    assert sequential["table"] == parallel["table"]


def test_exclusion_rule_is_checked_before_any_work(tmp_path):
    from trl_nca.recipes.compare import CompareArguments, CompareInputError, check_arguments
    from trl_nca.tasks import get_task

    task = get_task("organism_shift", num_train=4, num_test=4)
    for value in (1.5, 0, -0.1, True):
        with pytest.raises(CompareInputError, match="would exclude every organism or none"):
            check_arguments(CompareArguments(organism_seeds=[0, 1], organism_min_base_acc_xc=value), task)
    with pytest.raises(CompareInputError, match="list them in `organism_seeds`"):
        check_arguments(CompareArguments(organism_min_base_acc_xc=0.9), task)
    with pytest.raises(CompareInputError, match="`workers` must be an integer >= 1"):
        check_arguments(CompareArguments(workers=0), task)


@pytest.mark.slow
def test_exclusion_rule_and_limit_after_the_bases(tmp_path, tiny_organism):
    """A 3-step organism knows nothing: a rule of 0.9 excludes both organisms, with one line naming each; the limit
    runs the first organism listed and reports the other as not run."""
    from trl_nca.cli import compare
    from trl_nca.recipes.compare import CompareInputError

    with pytest.raises(CompareInputError, match="excluded every organism .*organism 0: excluded: base Acc_xc"):
        compare(["--config", _config(tmp_path, "strict", "organism_min_base_acc_xc: 0.9")])
    summary = compare(["--config", _config(tmp_path, "limited", "organism_limit: 1")])
    assert summary["exclusion"]["0"]["verdict"] == "included"
    assert summary["exclusion"]["1"]["verdict"] == "not run: the first 1 organisms that pass are run"
    assert {r["organism"] for rows in summary["per_seed"].values() for r in rows} == {0}
    assert not (tmp_path / "limited" / "org1" / "opd").exists()


def _summary(harms, methods=None, samples_per_view=4):
    """A comparison summary over organisms 0-2 x seeds 0-1 with these OPD and NCA harms per organism."""
    from trl_nca.recipes.statistics import compare_organisms

    per_seed = {"base": [], "opd": [], "nca": []}
    for organism, (opd, nca) in enumerate(harms):
        for seed in (0, 1):
            per_seed["opd"].append(
                {"organism": organism, "seed": seed, "harm": opd, "regime": "A" if opd > 0.05 else "C"}
            )
            per_seed["nca"].append({"organism": organism, "seed": seed, "harm": nca, "regime": "C"})
    settings = {
        "student": {"task": "organism_shift", "model": "organism", "peft": {"r": 8}, "monitor_opd": True},
        "training": {"learning_rate": 0.002, "max_steps": 100},
        "evaluation": {"temperature": 1.0, "samples_per_view": samples_per_view},
    }
    return {
        "methods": methods or {"opd": {"nca_beta": 0.0}, "nca": {"nca_beta": 0.5}},
        "settings": settings,
        "per_seed": per_seed,
        "statistics": {"baseline": "opd", "organisms": compare_organisms(per_seed, "opd", keys=("harm",))},
    }


def test_a_run_is_read_per_organism_against_the_documented_outcomes():
    from trl_nca.recipes.outcomes import outcomes_of, read_per_organism

    documented = _summary([(0.4, 0.01), (0.0, 0.0), (0.3, 0.25)])
    documented["methods"]["sdft"] = {"trainer": "sdft"}  # the study ran a third method; the job reads two of them
    experiments = [outcomes_of("units-shift", documented, "section 9")]
    run = _summary([(0.5, 0.0), (0.2, 0.0), (0.0, 0.0)])
    text = read_per_organism(run, experiments)
    assert (
        "organism 0: opd degraded, nca prevented it (regime A in 2 of 2 opd seeds; harm 50.0% vs 0.0%); "
        "documented: opd degraded, nca prevented it." in text
    )
    assert (
        "organism 2: opd did not degrade (regime A in 0 of 2 opd seeds; harm 0.0% vs 0.0%); documented: opd "
        "degraded, nca did not prevent it." in text
    )
    assert "opd degraded on 2 of 3 organisms, nca prevented it on 1 of those 2." in text
    # other evaluation settings, or a method of the same name with other settings: not read against the study
    other = read_per_organism(_summary([(0.5, 0.0)] * 3, samples_per_view=1), experiments)
    assert "No per-organism outcome is documented for these settings" in other and "documented:" not in other
    renamed = _summary([(0.5, 0.0)] * 3, methods={"opd": {"nca_beta": 0.0}, "nca": {"nca_beta": 1.0}})
    assert "documented:" not in read_per_organism(renamed, experiments)
    # without organisms (one base model) there is nothing to read per organism
    single = _summary([(0.5, 0.0)])
    for rows in single["per_seed"].values():
        for row in rows:
            row["organism"] = None
    from trl_nca.recipes.statistics import compare_organisms

    single["statistics"]["organisms"] = compare_organisms(single["per_seed"], "opd", keys=("harm",))
    assert read_per_organism(single, experiments) == ""


def test_where_nca_did_not_prevent_it_the_reading_says_when_its_anchor_began_to_act():
    """The quick job's old reading (issue 53): "opd degraded, nca did not prevent it", with the gate opening at step 35
    of 40; the printed reading now says so, and says nothing of the anchor where NCA prevented it."""
    from trl_nca.recipes.outcomes import read_per_organism

    run = _summary([(0.8, 0.6), (0.5, 0.0)])
    run["settings"]["training"]["max_steps"] = 40
    steps = [5, 10, 15, 20, 25, 30, 35, 40]
    run["curves"] = {
        f"nca/org{o}/seed{s}": {"step": steps, "nca_beta": [0.0] * 6 + [0.02, 0.086]} for o in (0, 1) for s in (0, 1)
    }
    run["curves"]["nca/org0/seed1"]["nca_beta"] = [0.0] * 8
    lines = read_per_organism(run, []).splitlines()
    assert lines[0].startswith("organism 0: opd degraded, nca did not prevent it")
    assert lines[0].endswith(
        " nca's anchor weight (nca_beta) stayed 0 until step 35 of 40 in seed 0 and through all "
        "40 steps in seed 1: it opened too late to act."
    )
    assert lines[1].startswith("organism 1: opd degraded, nca prevented it") and "anchor weight" not in lines[1]


def test_stalled_runs_are_counted_against_the_reference_run_of_the_same_organism_and_seed():
    from trl_nca.recipes.stalls import render_stalls, stalled_runs

    per_seed = {
        "base": [{"organism": 0, "seed": None, "acc_x": 0.0}],
        "opd": [{"organism": o, "seed": s, "acc_x": a} for o, s, a in ((0, 0, 1.0), (0, 1, 0.2), (1, 0, 0.5))],
        "constant": [{"organism": o, "seed": s, "acc_x": a} for o, s, a in ((0, 0, 0.89), (0, 1, 0.19), (1, 0, 0.45))],
        "adaptive": [{"organism": 0, "seed": 0, "acc_x": 0.9}, {"organism": 2, "seed": 0, "acc_x": 0.0}],
    }
    stalls = stalled_runs(per_seed, "opd")
    # 0.89 < 0.9 x 1.0 stalls; 0.19 >= 0.9 x 0.2 and 0.45 >= 0.9 x 0.5 do not; 0.9 is not below 0.9; organism 2 has
    # no OPD run to read it against
    assert stalls == {
        "constant": {"runs": 3, "stalled": [{"organism": 0, "seed": 0, "acc_x": 0.89, "reference_acc_x": 1.0}]},
        "adaptive": {"runs": 1, "stalled": []},
    }
    text = render_stalls(stalls, "opd")
    assert "| constant | 3 | 1 | 0/0 (89.0 vs 100.0) |" in text and "| adaptive | 1 | 0 | - |" in text
