"""The README's main job, in its quick variant: every phase runs end to end and writes what the README promises."""

import json
from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[2]


def test_quick_variant_is_the_main_job_made_small():
    """Apart from size, the quick variant trains and evaluates exactly as the main job."""
    main = yaml.safe_load((ROOT / "examples" / "configs" / "main.yaml").read_text())
    quick = yaml.safe_load((ROOT / "examples" / "configs" / "main_quick.yaml").read_text())
    size = {"organism_seeds", "seeds", "max_steps", "eval_items", "track_every", "track_items", "workers", "output_dir"}
    assert {k: v for k, v in main.items() if k not in size} == {k: v for k, v in quick.items() if k not in size}
    assert main["methods"] == ["opd:nca_beta=0", "nca:nca_beta=0.5"]
    readme = (ROOT / "README.md").read_text()
    assert "trl-nca compare --config examples/configs/main.yaml" in readme.split("\n\n")[2], (
        "the README's first command must be the main job"
    )


@pytest.mark.slow
def test_main_job_quick_variant(tmp_path, capsys):
    from trl_nca.cli import compare

    config = ROOT / "examples" / "configs" / "main_quick.yaml"
    quick = yaml.safe_load(config.read_text())
    summary = compare(["--config", str(config), "--output_dir", str(tmp_path)])
    out = capsys.readouterr().out
    # it reads its organism against the outcome documented for exactly its settings (docs/results.md 10.6)
    (organism,), (seed,) = quick["organism_seeds"], quick["seeds"]
    assert "; documented: opd degraded, nca prevented it." in out and "section 10.6 (main-quick, the same" in out
    assert f"organism {organism}: opd " in out
    for model in ("base", "opd", "nca"):
        assert f"| {model} |" in out
    assert summary["conclusion"] in out and "trl-nca compare: done in " in out
    for path in summary["figures"].values():
        assert Path(path).is_file() and Path(path).stat().st_size > 0
    saved = json.loads((tmp_path / "comparison.json").read_text())
    assert set(saved["per_seed"]) == {"base", "opd", "nca"}
    assert saved["num_test"] == 96
    for method in ("opd", "nca"):  # the curves the results page draws, for OPD too (monitor_opd)
        history = saved["curves"][f"{method}/org{organism}/seed{seed}"]
        assert {"opd_loss", "nca_loss", "view_kl"} <= set(history)
        assert len(history["view_kl"]) == len(history["step"]) > 0
