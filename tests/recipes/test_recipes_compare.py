"""`trl-nca compare`: method parsing, aggregation over seeds, and an end-to-end run on a tiny model that resumes."""

import dataclasses
import json
import math
import re
import shlex
from pathlib import Path

import pytest

from trl_nca.recipes.compare import aggregate, conclusion, parse_method, render_table


# Tolerances: pytest.approx with its default tolerance compares float64 arithmetic on counts and rewards with exact
# fractions (error near 1e-16); trl_nca.testing names the tolerances of float computations.


def test_parse_method_reads_yaml_values():
    method = parse_method("nca:nca_beta=0.5,top_k=64,divergence_support=top_k")
    assert method.name == "nca"
    assert method.overrides == {"nca_beta": 0.5, "top_k": 64, "divergence_support": "top_k"}
    assert parse_method("opd:nca_beta=0").overrides == {"nca_beta": 0}
    assert parse_method("base-like:").overrides == {}


@pytest.mark.parametrize("spec", ["nca", ":nca_beta=0.5", "nca:nca_beta"])
def test_parse_method_errors_name_the_format(spec):
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_method(spec)


def test_aggregate_mean_spread_and_regimes():
    per_seed = {
        "opd": [
            {"acc_x": 0.5, "acc_xc": 0.25, "regime": "A", "seed": 0},
            {"acc_x": 0.7, "acc_xc": 0.45, "regime": "C", "seed": 1},
            {"acc_x": 0.6, "acc_xc": None, "regime": None, "seed": 2},
        ]
    }
    stats = aggregate(per_seed, keys=("acc_x", "acc_xc", "harm"))["opd"]
    assert stats["n_seeds"] == 3 and stats["regimes"] == ["A", "C", None]
    assert math.isclose(stats["acc_x"]["mean"], 0.6) and math.isclose(stats["acc_x"]["std"], 0.1)
    assert stats["acc_x"]["min"] == 0.5 and stats["acc_x"]["max"] == 0.7
    assert stats["acc_xc"]["n"] == 2 and math.isclose(stats["acc_xc"]["mean"], 0.35)  # undefined values are left out
    assert stats["harm"] is None
    table = render_table(aggregate(per_seed, keys=("acc_x",)), per_seed, keys=("acc_x",))
    assert "| opd | 3 | 60.0 ± 10.0 | A, C, n/a |" in table and "| opd | 0 | 50.0 | A |" in table


def test_table_gives_counts_and_marks_the_few():
    """Harm and help per seed with the count behind them (the items are 240 held-out queries), `few` below FEW_ITEMS;
    a mean over seeds says how many seeds it holds, and `few` when one of them was few; the legend defines the
    regimes and the diagnostic columns."""
    from trl_nca.recipes.compare import table_legend

    per_seed = {
        "opd": [
            {"acc_x": 237 / 240, "harm": 37 / 237, "help": 1 / 3, "regime": "A", "seed": 0},
            {"acc_x": 1.0, "harm": 4 / 240, "help": None, "regime": "C", "seed": 1},
        ]
    }
    keys = ("acc_x", "harm", "help", "twice_x", "twice_xc")
    table = render_table(aggregate(per_seed, keys=keys), per_seed, keys=keys, n_items=240)
    assert "| 15.6 (37/237) | 33.3 (1/3, few) |" in table and "| 1.7 (4/240) | n/a |" in table
    assert "| 8.6 ± 9.9 | 33.3 (1 of 2 runs, few) |" in table
    legend = table_legend(keys)
    assert "A = adding the context significantly lowers accuracy" in legend and "docs/evaluation.md#regimes" in legend
    assert "twice_x / twice_xc: share of the answers" in legend and "n below 10" in legend


def test_conclusion_states_the_numbers():
    aggregated = aggregate(
        {
            "base": [{"acc_x": 0.0, "acc_xc": 0.9, "harm": None, "length_change": 0.0, "regime": "B"}],
            "nca": [{"acc_x": 0.8, "acc_xc": 0.85, "harm": 0.05, "length_change": 0.01, "regime": "C"}],
        },
        keys=("acc_x", "acc_xc", "harm", "length_change"),
    )
    sentence = conclusion("toy", aggregated)
    assert sentence.startswith("On toy, the base model answers 0% without and 90% with the context")
    assert "nca reaches 80% without and 85% with it (harm 5%" in sentence and sentence.endswith(".")


def test_compare_end_to_end_on_a_tiny_model_and_resume(tmp_path, tiny_dir, capsys):
    from trl_nca.cli import compare

    config = tmp_path / "compare.yaml"
    config.write_text(
        f"""
model_name_or_path: {tiny_dir}
task: reply_in_french
seeds: [0, 1]
methods: ["opd:nca_beta=0", "nca:nca_beta=0.5"]
num_train: 4
eval_items: 3
track_every: 1
track_items: 2
output_dir: {tmp_path / "out"}
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
    )
    capsys.readouterr()
    summary = compare(["--config", str(config)])
    printed = capsys.readouterr().out.strip().splitlines()  # what it will do first, its time and outputs last
    assert printed[0].startswith(
        "trl-nca compare: train 4 students (opd, nca x 1 model x 2 seeds, 2 steps each) on reply_in_french, then "
        "evaluate 5 models (1 base and the students) paired on 3 items x 2 views x 1 sample; output "
    ), printed[0]
    assert "time: no training estimate (2 steps or fewer" in printed[0]  # a 2-step training prints none
    assert re.fullmatch(
        r"trl-nca compare: done in (\d+ min )?[\d.]+ s; table: .*comparison.md; summary: .*; report: .*\.", printed[-1]
    )
    # the step lines of several students name their student
    steps = [line for line in printed if re.match(r"\[(opd|nca)/seed[01]\] step \d/2  loss ", line)]
    assert len(steps) == 8 and not any("{'" in line for line in printed), printed
    out = tmp_path / "out"
    assert list(summary["per_seed"]) == ["base", "opd", "nca"]
    assert [row["seed"] for row in summary["per_seed"]["nca"]] == [0, 1]
    assert summary["aggregated"]["opd"]["n_seeds"] == 2
    for name in ("comparison.json", "comparison.md", "comparison.png", "curves.png", "tracking.png", "task.json"):
        assert (out / name).exists(), name
    done = json.loads((out / "opd" / "seed0" / "done.json").read_text())
    logged = [h for h in done["log_history"] if "opd_loss" in h and "loss" in h]
    assert len(logged) == 2 and all("view_kl" in h for h in logged)  # nca_beta=0 runs are monitored
    assert [row["step"] for row in done["tracking"]] == [0, 1, 2]
    assert (out / "nca" / "seed1" / "adapter_model.safetensors").exists()
    saved = json.loads((out / "comparison.json").read_text())
    assert saved["curves"]["opd/seed0"]["step"] == [1, 2] and len(saved["curves"]["nca/seed1"]["nca_beta"]) == 2
    assert [row["step"] for row in saved["tracking"]["nca/seed0"]] == [0, 1, 2]
    from trl_nca.recipes.plots import write_figures

    (tmp_path / "redrawn").mkdir()
    redrawn = write_figures(saved, tmp_path / "redrawn")  # figures come from the saved summary alone
    assert all(Path(path).stat().st_size > 0 for path in redrawn.values()) and len(redrawn) == 4
    # the settings that shaped the students are recorded, in comparison.json and with each student
    assert saved["settings"]["training"]["learning_rate"] == 1e-3 and saved["settings"]["student"]["train_rows"] == 4
    assert done["settings"]["training"]["nca_beta"] == 0 and done["settings"]["training"]["seed"] == 0
    assert saved["statistics"]["baseline"] == "opd" and set(saved["statistics"]["paired"]) == {"nca"}
    assert "## Statistics over runs" in (out / "comparison.md").read_text() and (out / "harm.png").exists()
    # outputs a person opens: what to open first, each reading its own paragraph, this library's model cards
    assert (out / "README.md").read_text().splitlines()[2].startswith("Open `comparison.md` first")
    readings = (out / "comparison.md").read_text().split("## Readings\n\n")[1].split("\n\n## ")[0]
    assert (
        readings.startswith("On reply_in_french,") and "\n\n" in readings and "\n" not in readings.replace("\n\n", "")
    )
    card = (out / "nca" / "seed1" / "README.md").read_text()
    assert card.startswith("# nca/seed1: a student of `trl-nca compare`") and "More Information Needed" not in card
    assert "- method: `nca` (overrides: nca_beta=0.5)" in card and "- training seed: 1" in card
    assert "NCA, weight up to `nca_beta=0.5`" in card and "| Acc_x | Acc_xc | Harm | Help | Regime |" in card
    assert "none (`nca_beta=0`" in (out / "opd" / "seed0" / "README.md").read_text()
    assert "`../../comparison.md`" in card
    # the card names the base by its name and gives a `trl-nca eval` command that runs: it gives the card's numbers
    command = card.split("```bash\n")[1].split("\n```")[0]
    assert f"--model nca-seed1={tiny_dir}:{out / 'nca' / 'seed1'} --dataset {out / 'test_items.jsonl'}" in command
    from trl_nca.cli import main as cli_main

    assert cli_main([*shlex.split(command)[1:], "--no-plots", "--no-progress", "--bootstrap", "0"]) == 0
    evaluated = json.loads((out / "eval" / "nca-seed1" / "summary.json").read_text())["models"][0]["metrics"]
    nca1 = next(row for row in summary["per_seed"]["nca"] if row["seed"] == 1)
    assert (evaluated["acc_x"], evaluated["acc_xc"], evaluated["harm"]) == (nca1["acc_x"], nca1["acc_xc"], nca1["harm"])
    records = (out / "nca" / "seed1" / "eval" / "records.jsonl").read_text().splitlines()
    assert len(records) == 3
    first = json.loads(records[0])
    assert first["meta"]["adapter"] == str(out / "nca" / "seed1")

    # A rerun trains nothing and generates nothing: every run is done and every record is on disk.
    stamp = (out / "nca" / "seed1" / "done.json").stat().st_mtime_ns
    again = compare(["--config", str(config)])
    assert (out / "nca" / "seed1" / "done.json").stat().st_mtime_ns == stamp
    assert again["per_seed"] == summary["per_seed"]
    assert (out / "nca" / "seed1" / "eval" / "records.jsonl").read_text().splitlines() == records
    # the first sitting's time is kept (issue 57: a resume replaced 884.8 s with 9.1 s): the job's is both sittings'
    first, resumed = again["sittings"]
    assert first["wall_seconds"] == summary["wall_seconds"] and again["wall_seconds"] == round(
        first["wall_seconds"] + resumed["wall_seconds"], 1
    )
    # --quiet: the opening line, the table and the closing line
    from trl_nca.cli import main

    capsys.readouterr()
    assert main(["compare", "--config", str(config), "--quiet"]) == 0
    quiet = capsys.readouterr().out.strip().splitlines()
    # a resume with every student trained promises no training estimate (issue 57)
    assert quiet[0].startswith("trl-nca compare: nothing to train: its 4 students") and "training step" not in quiet[0]
    assert quiet[-1].startswith("trl-nca compare: done")
    assert quiet[2].startswith("| Model | runs |") and not any(
        line.startswith(("Paired evaluation", "Figures:", "Per method", "[")) for line in quiet
    ), quiet

    # A rerun with a setting that shaped the students is refused before anything is written, naming both values.
    def snapshot():
        return {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    import shutil

    shutil.copytree(tiny_dir, Path(tiny_dir).parent / "copy", dirs_exist_ok=True)  # the same model in another folder
    before = snapshot()
    text = config.read_text()
    capsys.readouterr()
    for old, new, message in [
        ("learning_rate: 1.0e-3", "learning_rate: 2.0e-3", "`training.learning_rate` was 0.001, now 0.002"),
        ("max_steps: 2", "max_steps: 1", "`training.max_steps` was 2, now 1"),
        ("task: reply_in_french", "task: island_facts", "`student.task` was 'reply_in_french', now 'island_facts'"),
        ("lora_r: 2", "lora_r: 4", "`student.peft.r` was 2, now 4"),
        (
            f"model_name_or_path: {tiny_dir}",
            f"model_name_or_path: {Path(tiny_dir).parent / 'copy'}",
            "`student.model` was",
        ),
        (
            '"nca:nca_beta=0.5"',
            '"nca:nca_beta=0.25"',
            "student nca/seed0 made with other settings: `training.nca_beta` was 0.5, now 0.25",
        ),
    ]:
        assert old in text
        config.write_text(text.replace(old, new))
        assert main(["compare", "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Use a new output_dir" in err and "Traceback" not in err, err
        assert snapshot() == before
    config.write_text(text)


def test_compare_refuses_unknown_fields_and_full_fine_tuning(tmp_path, tiny_dir):
    from trl import ModelConfig

    from trl_nca import NCAConfig
    from trl_nca.recipes import CompareArguments, run_comparison

    config = NCAConfig(output_dir=str(tmp_path), report_to="none")
    with pytest.raises(ValueError, match="not NCAConfig fields"):
        run_comparison(
            CompareArguments(methods=["nca:nca_betta=0.5"]), config, ModelConfig(model_name_or_path=tiny_dir)
        )
    with pytest.raises(ValueError, match="use_peft: true"):
        run_comparison(CompareArguments(), config, ModelConfig(model_name_or_path=tiny_dir))


BASE_CONFIG = """
model_name_or_path: /nonexistent/model
task: reply_in_french
seeds: [0, 1]
methods: ["opd:nca_beta=0", "nca:nca_beta=0.5"]
num_train: 4
eval_items: 3
max_steps: 2
use_peft: true
report_to: none
"""


@pytest.mark.parametrize(
    "change, message",
    [
        ({"methods": '["opd:nca_beta=0", "base:nca_beta=0.5"]'}, "'base' is the untrained model's row"),
        ({"methods": '["opd:nca_beta=0", "a/b:nca_beta=0.5"]'}, "Method name 'a/b' names a folder"),
        ({"methods": '["opd:nca_beta=0", "nca:seed=7"]'}, "sets ['seed'], which the comparison sets for every run"),
        ({"methods": '["opd:nca_beta=0", "nca:output_dir=x"]'}, "sets ['output_dir']"),
        ({"methods": '["opd:nca_beta=0", "opd:nca_beta=0.5"]'}, "Method names must be unique; ['opd']"),
        ({"methods": "[]"}, "Give at least one method"),
        ({"methods": '["nca:learning_rate=abc"]'}, "Method 'nca': learning_rate='abc' is not a valid float"),
        ({"methods": '["nca:max_steps=2.5"]'}, "Method 'nca': max_steps=2.5 is not a valid int"),
        ({"methods": '["nca:nca_beta_schedule=sometimes"]'}, "nca_beta_schedule='sometimes' is not"),
        ({"methods": '["nca:nca_beta=-1"]'}, "nca_beta"),
        ({"seeds": "[0, 0]"}, "`seeds` repeats [0]"),
        ({"seeds": "[]"}, "Give at least one seed in `seeds`"),
        ({"num_train": "0"}, "`num_train` must be an integer >= 1 (or null for all), got 0"),
        ({"num_train": "-2"}, "`num_train` must be an integer >= 1"),
        ({"num_train": "100000"}, "`num_train: 100000` asks for more rows than task 'reply_in_french' has"),
        ({"eval_items": "-1"}, "`eval_items` must be an integer >= 1"),
        ({"track_every": "-5"}, "`track_every` must be an integer >= 0, got -5"),
        ({"track_items": "0"}, "`track_items` must be an integer >= 1"),
        ({"eval_samples_per_view": "0"}, "`eval_samples_per_view` must be an integer >= 1"),
        ({"organism_seeds": "[]"}, "Give at least one seed in `organism_seeds`"),
        ({"organism_seeds": "[1, 1]"}, "`organism_seeds` repeats [1]"),
        ({"organism_seeds": "[0, 1]"}, "`organism_seeds` pretrains one organism per seed, so it needs"),
        ({"baseline": "nope"}, "`baseline: nope` is not one of the methods ['opd', 'nca']"),
        ({"track_every": "1", "track_items": "4"}, "`track_items: 4` is more than the 3 held-out rows evaluated"),
    ],
)
def test_compare_bad_config_is_one_line_before_any_model_or_file(tmp_path, capsys, change, message):
    """Every check runs before the model is even looked for (the model path here does not exist) and before anything
    is written; the error is one line, as `trl-nca train` prints it."""
    from trl_nca.cli import main

    lines = [line for line in BASE_CONFIG.strip().splitlines() if line.split(":")[0] not in change]
    lines += [f"{key}: {value}" for key, value in change.items()] + [f"output_dir: {tmp_path / 'out'}"]
    config = tmp_path / "compare.yaml"
    config.write_text("\n".join(lines) + "\n")
    assert main(["compare", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trl-nca compare: error: ") and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_method_values_are_converted_like_top_level_options():
    from trl_nca import NCAConfig
    from trl_nca.recipes.compare import check_methods

    (method,) = check_methods([parse_method("nca:learning_rate=1e-3,nca_monitor=true,max_steps=3")], NCAConfig())
    assert method.overrides == {"learning_rate": 1e-3, "nca_monitor": True, "max_steps": 3}
    assert isinstance(method.overrides["learning_rate"], float)


def test_curves_figure_of_a_job_shorter_than_logging_steps(tmp_path):
    from trl_nca.recipes.plots import plot_curves

    path = plot_curves({"opd/seed0": {"step": []}, "nca/seed0": {"step": []}}, tmp_path / "curves.png")
    assert Path(path).stat().st_size > 0


# ----------------------------------------------------------------------------------------------------------------------
# Statistics over runs, on synthetic per-seed numbers with answers worked out by hand


def rows(harms, organism=None, **other):
    return [
        {"seed": s, "organism": organism, "harm": h, **{k: v[s] for k, v in other.items()}} for s, h in enumerate(harms)
    ]


def test_distribution_median_quartiles_and_range():
    from trl_nca.recipes.statistics import distributions

    stats = distributions({"opd": rows([0.5, 0.4, 0.3, 0.2, 0.6]) + rows([None])}, keys=("harm",))["opd"]
    assert stats["runs"] == 6 and stats["undefined"] == {"harm": 1}
    d = stats["harm"]
    assert (d["n"], d["median"], d["min"], d["max"]) == (5, 0.4, 0.2, 0.6)
    assert d["q1"] == pytest.approx(0.3) and d["q3"] == pytest.approx(0.5) and d["iqr"] == pytest.approx(0.2)


def test_paired_difference_sign_test_permutation_test_and_count():
    from trl_nca.recipes.statistics import paired_difference, render_statistics

    opd = rows([0.5, 0.4, 0.3, 0.2, 0.6, 0.45])
    nca = rows([0.1, 0.0, 0.35, 0.05, 0.1, 0.45])
    d = paired_difference(opd, nca, "harm", n_resamples=2000)
    # differences 0.4, 0.4, -0.05, 0.15, 0.5, 0: NCA lower in 4 of 6, one tie
    assert [p["difference"] for p in d["pairs"]] == pytest.approx([0.4, 0.4, -0.05, 0.15, 0.5, 0.0])
    assert (d["n"], d["below"], d["above"], d["ties"]) == (6, 4, 1, 1)
    assert d["mean"] == pytest.approx(1.4 / 6) and d["median"] == pytest.approx(0.275)
    # sign test, the tie left out: 2 P(X <= 1), X ~ Binomial(5, 1/2) = 2 (1 + 5) / 32
    assert d["sign_test_p"] == pytest.approx(12 / 32)
    # permutation: flipping a subset S gives sum 1.4 - 2 sum(S); |.| >= 1.4 only for S = {}, {-0.05}, all, all but
    # -0.05, each with or without the tie
    assert d["permutation_p"] == pytest.approx(8 / 64)
    low, high = d["ci"]
    assert -0.05 <= low < d["mean"] < high <= 0.5
    same = paired_difference(rows([0.3] * 6), rows([0.2] * 6), "harm")
    assert same["ci"] == pytest.approx([0.1, 0.1]) and same["sign_test_p"] == pytest.approx(1 / 32)
    statistics = {"keys": ["harm"], "baseline": "opd", "distributions": {}, "paired": {"nca": {"harm": d}}}
    assert "nca's harm is below opd's in 4 of 6 paired runs (1 equal)." in render_statistics(statistics)


def test_pairs_are_organism_and_seed_and_undefined_values_are_left_out():
    from trl_nca.recipes.statistics import paired_difference, render_statistics

    opd = rows([0.5, 0.4], organism=0) + rows([0.3, None], organism=1)
    nca = rows([0.3, 0.4], organism=1) + rows([0.2, 0.2], organism=0)
    d = paired_difference(opd, nca, "harm")
    assert [(p["organism"], p["seed"]) for p in d["pairs"]] == [(0, 0), (0, 1), (1, 0)]
    assert [p["difference"] for p in d["pairs"]] == pytest.approx([0.3, 0.2, 0.0]) and d["undefined"] == [[1, 1]]
    assert (d["below"], d["above"], d["ties"]) == (2, 0, 1) and d["sign_test_p"] is None  # 3 pairs: no test
    statistics = {"keys": ["harm"], "baseline": "opd", "distributions": {}, "paired": {"nca": {"harm": d}}}
    assert "below opd's in 2 of 3 paired runs (1 equal); 1 pair(s) have an undefined harm" in render_statistics(
        statistics
    )


def test_fewer_than_two_pairs_give_no_interval_and_say_why():
    from trl_nca.recipes.statistics import compare_to_baseline, distributions, render_statistics

    per_seed = {"base": [{"seed": None, "organism": None, "harm": None}], "opd": rows([0.5]), "nca": rows([0.1])}
    paired = compare_to_baseline(per_seed, "opd", keys=("harm",))
    d = paired["nca"]["harm"]
    assert d["n"] == 1 and d["ci"] is None and d["sign_test_p"] is None and d["permutation_p"] is None
    text = render_statistics(
        {"keys": ["harm"], "baseline": "opd", "paired": paired, "distributions": distributions(per_seed, ("harm",))}
    )
    assert "| opd - nca | harm | 1 | 40.0 | n/a |" in text
    assert (
        "Note: No interval or test: they need at least 6 paired runs (same organism and training seed), and there is 1."
        in text
    )


def test_compare_over_organisms_and_seeds(tmp_path, monkeypatch):
    """Two organisms (each pretrained once, here a 3-step one so the test is quick) x two training seeds: one base row
    per organism, students paired by (organism, seed), and a job shorter than logging_steps still draws its curves."""
    from trl_nca.cli import compare
    from trl_nca.models import organism

    monkeypatch.setenv("TRL_NCA_CACHE", str(tmp_path / "cache"))
    tiny = organism.OrganismSpec(steps=3, hidden_size=32, num_layers=1, num_heads=2, batch_size=4)
    monkeypatch.setattr(organism, "spec_for_alias", lambda alias: tiny)
    config = tmp_path / "compare.yaml"
    config.write_text(
        f"""
model_name_or_path: organism-quick
task: organism_shift
organism_seeds: [0, 1]
seeds: [0, 1]
methods: ["opd:nca_beta=0", "nca:nca_beta=0.5"]
num_train: 4
eval_items: 3
eval_samples_per_view: 2
output_dir: {tmp_path / "out"}
max_new_tokens: 4
max_steps: 1
logging_steps: 5
per_device_train_batch_size: 2
use_peft: true
lora_r: 2
lora_alpha: 4
lora_target_modules: [q_proj, v_proj]
report_to: none
disable_tqdm: true
"""
    )
    summary = compare(["--config", str(config)])
    out = tmp_path / "out"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
        f"organism-{dataclasses.replace(tiny, seed=s).key()}" for s in (0, 1)
    )
    assert [(r["organism"], r["seed"]) for r in summary["per_seed"]["base"]] == [(0, None), (1, None)]
    assert [(r["organism"], r["seed"]) for r in summary["per_seed"]["nca"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for name in ("org0/base/records.jsonl", "org1/nca/seed1/done.json", "org1/opd/seed0/eval/records.jsonl"):
        assert (out / name).exists(), name
    record = json.loads((out / "org1" / "nca" / "seed1" / "eval" / "records.jsonl").read_text().splitlines()[0])
    assert record["meta"]["samples_per_view"] == 2 and len(record["x"]["extra"]["samples"]) == 1
    acc = summary["statistics"]["paired"]["nca"]["acc_x"]
    # four pairs: too few for an interval or a test (an exact sign test over 4 pairs cannot fall below 0.125)
    assert (
        acc["n"] == 4 and acc["ci"] is None and acc["sign_test_p"] is None and "at least 6 paired runs" in acc["note"]
    )
    organisms = summary["statistics"]["organisms"]["nca"]
    assert [e["organism"] for e in organisms["organisms"]] == [0, 1] and "at least 6 organisms" in organisms["note"]
    assert summary["curves"]["opd/org0/seed0"]["step"] == [] and Path(summary["figures"]["curves"]).stat().st_size > 0
    assert "paired runs" in (out / "comparison.md").read_text() and summary["evaluation"]["samples_per_view"] == 2
    assert "| base | 1 | - |" in summary["table"] and "| nca | 1 | 0 |" in summary["table"]  # organism, seed


def test_diagnostic_rates_count_every_sample_of_a_view():
    from trl_nca.eval.records import PairedRecord, ViewOutcome
    from trl_nca.recipes.compare import diagnostic_rates
    from trl_nca.tasks import get_task

    task = get_task("organism_shift", num_train=1, num_test=2)
    first, second = task.test

    def view(*texts):
        outcomes = [ViewOutcome(t, None, False, 1, False, False) for t in texts]
        outcomes[0].extra = {"samples": [vars(o) for o in outcomes[1:]]}
        return outcomes[0]

    records = [
        PairedRecord(first["id"], view(first["twice"], first["twice"]), view("x", first["twice"])),
        PairedRecord(second["id"], view("x", second["twice"]), view("x", "x")),
    ]
    assert diagnostic_rates(task, records) == {"twice_x": 3 / 4, "twice_xc": 1 / 4}


# ----------------------------------------------------------------------------------------------------------------------
# The reading of a comparison against the ranges docs/results.md documents


def _summary(harms_by_method, methods=None, lr=2e-3):
    settings = {
        "student": {
            "task": "organism_shift",
            "model": "organism",
            "peft": {"r": 8},
            "monitor_opd": True,
            "track_every": 10,
        },
        "training": {"learning_rate": lr, "max_steps": 100},
        "evaluation": {"temperature": 1.0},
    }
    per_seed = {"base": [{"seed": None, "harm": None, "acc_x": 0.0, "acc_xc": 1.0}]}
    for method, harms in harms_by_method.items():
        per_seed[method] = [
            {"seed": s, "harm": h, "acc_x": 1.0, "acc_xc": 1.0 - (h or 0.0)} for s, h in enumerate(harms)
        ]
    from trl_nca.recipes.statistics import STAT_KEYS, distributions

    statistics = {"distributions": distributions(per_seed, STAT_KEYS)}
    return {
        "methods": methods or {m: {} for m in harms_by_method},
        "settings": settings,
        "per_seed": per_seed,
        "statistics": statistics,
    }


def test_a_run_is_read_against_the_range_documented_for_its_settings():
    from trl_nca.recipes.ranges import ranges_of, read_against_ranges

    documented = _summary({"opd": [0.02, 0.5, 0.1], "nca": [0.0, 0.03, None]})
    entry = ranges_of("org10-shift", documented, "section 8")
    assert entry["methods"]["opd"] == {"runs": 3, "harm": [0.02, 0.5], "acc_x": [1.0, 1.0], "acc_xc": [0.5, 0.98]}
    assert entry["methods"]["nca"]["harm"] == [0.0, 0.03]  # an undefined harm is no bound
    within = _summary({"opd": [0.3, 0.02], "nca": [0.01]})
    within["settings"]["student"]["track_every"] = 0  # tracking shapes no student
    assert read_against_ranges(within, [entry]) == (
        "Every run is within the range documented in docs/results.md section 8 (org10-shift: opd 3, nca 3 runs)."
    )
    outside = read_against_ranges(_summary({"opd": [0.3], "nca": [0.2]}), [entry])
    assert outside.startswith("Outside the range documented") and "nca seed 0: Harm 20.0% against 0.0%-3.0%" in outside
    assert "opd seed" not in outside
    for other in (_summary({"opd": [0.3]}, lr=1e-3), _summary({"opd": [0.3]}, methods={"opd": {"nca_beta": 0.1}})):
        assert read_against_ranges(other, [entry]).startswith("No range is documented for these settings")


def test_the_shipped_ranges_are_those_of_the_committed_results():
    from trl_nca.recipes.ranges import documented_ranges

    experiments = documented_ranges()
    assert {e["name"] for e in experiments} >= {"org10-shift"}
    data = Path(__file__).resolve().parents[2] / "docs" / "results" / "data"
    for entry in experiments:
        summary = json.loads((data / f"{entry['name']}.json").read_text())
        harms = [r["harm"] for r in summary["per_seed"]["opd"] if r["harm"] is not None]
        assert entry["methods"]["opd"]["harm"] == [min(harms), max(harms)]


def test_lora_target_modules_are_recorded_in_one_order():
    """A set's order changes with the process's hash seed: the settings a resume compares write it sorted, and
    summaries that wrote it as a set's string (trl-nca 0.1.0) still compare equal."""
    from peft import LoraConfig

    from trl_nca.recipes.compare import peft_settings, setting_differences
    from trl_nca.recipes.ranges import canonical

    modules = ["v_proj", "q_proj", "down_proj", "k_proj"]
    assert peft_settings(LoraConfig(target_modules=modules))["target_modules"] == sorted(modules)
    old = {"peft": {"target_modules": "{'v_proj', 'q_proj'}", "r": 8}}
    assert setting_differences(old, {"peft": {"target_modules": ["q_proj", "v_proj"], "r": 8}}) == []
    assert setting_differences(
        old, {"peft": {"target_modules": ["k_proj", "q_proj"], "r": 8}}
    )  # other modules still differ
    assert canonical({"a": "{'not a set'"}) == {"a": "{'not a set'"}


def test_the_range_reading_compares_like_with_like():
    """Every setting that changes what a number means is part of the match (the evaluated items too): a run on 10
    items is not read against ranges measured on 240, and the reading says what differs. Runs over several organisms
    are named by organism and seed."""
    from trl_nca.recipes.ranges import ranges_of, read_against_ranges

    documented = {**_summary({"opd": [0.02, 0.5], "nca": [0.0, 0.03]}), "num_test": 240}
    entry = ranges_of("org10-shift", documented, "section 8")
    assert entry["match"]["evaluation"]["items"] == 240
    assert read_against_ranges({**_summary({"opd": [0.3], "nca": [0.01]}), "num_test": 240}, [entry]).startswith(
        "Every run is within"
    )
    fewer = read_against_ranges({**_summary({"opd": [0.3], "nca": [0.01]}), "num_test": 10}, [entry])
    assert fewer.startswith("No range is documented for these settings"), fewer
    assert "org10-shift differs in `evaluation.items` 240 documented, 10 here." in fewer
    for key, value in (("temperature", 0.7), ("samples_per_view", 4), ("max_new_tokens", 4)):
        other = {**_summary({"opd": [0.3]}), "num_test": 240}
        other["settings"]["evaluation"][key] = value
        assert read_against_ranges(other, [entry]).startswith("No range is documented"), key
    organisms = {**_summary({"opd": [0.3], "nca": [0.2]}), "num_test": 240}
    organisms["per_seed"]["nca"][0]["organism"] = 3
    assert "nca org3 seed 0: Harm 20.0% against 0.0%-3.0%" in read_against_ranges(organisms, [entry])


def test_the_main_job_with_fewer_eval_items_matches_no_documented_range():
    from trl_nca.recipes.ranges import documented_ranges, read_against_ranges

    data = Path(__file__).resolve().parents[2] / "docs" / "results" / "data"
    for entry in documented_ranges():
        summary = json.loads((data / f"{entry['name']}.json").read_text())
        assert not read_against_ranges(summary, [entry]).startswith("No range")  # the documented runs themselves
        assert read_against_ranges({**summary, "num_test": 10}, [entry]).startswith("No range is documented")
