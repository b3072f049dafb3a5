"""`trl-nca compare`: method parsing, aggregation over seeds, and an end-to-end run on a tiny model that resumes."""

import json
import math
from pathlib import Path

import pytest

from trl_nca.recipes.compare import aggregate, conclusion, parse_method, render_table


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


def test_compare_end_to_end_on_a_tiny_model_and_resume(tmp_path, tiny_dir):
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
gradient_checkpointing: false
logging_steps: 1
report_to: none
disable_tqdm: true
"""
    )
    summary = compare(["--config", str(config)])
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
    assert all(Path(path).stat().st_size > 0 for path in redrawn.values()) and len(redrawn) == 3
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
