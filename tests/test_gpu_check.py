"""benchmarks/gpu_check.sh: the GPU benchmark's code path runs here at tiny shapes (`--smoke`), and its inline
architectures are those of the published models."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_smoke_writes_the_table_and_json(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    result = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--smoke", "--sharing", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    report = json.loads(out.read_text())
    meta, runs = report["meta"], report["runs"]
    assert meta["smoke"] and meta["batch"] == 2 and meta["completion_tokens"] == 8
    assert meta["versions"]["trl"] and meta["versions"]["datasets"]
    assert [(r["model"], r["variant"], r["nca_beta"]) for r in runs] == [
        (model, variant, beta)
        for model in ("qwen3-1.7b", "llama3.1-8b")
        for variant, beta in (("opd", 0.0), ("nca", 0.5), ("nca-unshared", 0.5))
    ]
    for run in runs:
        assert run["teacher"] == "SelfTeacher"  # LoRA: the student with its adapter disabled, no second copy
        assert len(run["step_s_all"]) == meta["steps"] and run["step_s"] > 0
        if run["variant"] == "opd":  # sampling forced to exactly completion_tokens new tokens per row
            assert run["sampled_tokens"] == meta["batch"] * meta["completion_tokens"] and run["sampling_s"] > 0
    checks = {(c["model"], c["check"]) for c in report["targets"]}
    assert ("llama3.1-8b", "NCA step peak (reserved) GiB") in checks
    assert ("qwen3-1.7b", "NCA step time, shared prefix / unshared") in checks
    assert ("qwen3-1.7b", "step time NCA / OPD") in checks and ("qwen3-1.7b", "peak memory NCA / OPD") in checks
    assert all(c["pass"] is None for c in report["targets"])  # a smoke run judges nothing
    assert report["table"] in result.stdout
    assert "| llama3.1-8b | nca (nca_beta=0.5) |" in report["table"]


def test_inline_architectures_have_the_published_parameter_counts():
    """Built on the meta device (no memory): Llama-3.1-8B has 8,030,261,248 parameters; Qwen3-1.7B 1.72 billion with
    its tied embeddings (1.41 billion besides the 151936 x 2048 embedding)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from transformers import AutoModelForCausalLM

    counts = {}
    for name, shape in gpu_check.SHAPES.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(gpu_check.build_config(shape))
        counts[name] = sum(p.numel() for p in model.parameters())
    assert counts["llama3.1-8b"] == 8_030_261_248
    assert counts["qwen3-1.7b"] == 1_720_574_976
