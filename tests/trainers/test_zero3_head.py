"""Under DeepSpeed ZeRO-3 (CPU, gloo, 2 processes, the shipped `examples/accelerate/zero3.yaml`), the chunked loss
gathers the partitioned output layers once for its forward and once for its backward, however many tiles it walks,
and the update still equals one process training on the whole batch with a single tile."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trl_nca.testing import FLOAT32, free_port


if importlib.util.find_spec("deepspeed") is None:
    if os.environ.get("CI"):  # CI installs the dev extras, which include deepspeed: missing there is an error
        raise ImportError("deepspeed is not installed; `pip install -e '.[dev]'` installs it.")
    pytest.skip("deepspeed is not installed (`pip install -e '.[dev]'`)", allow_module_level=True)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parents[1] / "scripts"


def _run(args: list[str], cwd: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


def test_zero3_gathers_the_heads_once_per_loss_pass(tmp_path):
    from trl_nca.testing import save_tiny_model

    models = tmp_path / "models"
    save_tiny_model(models / "student", seed=0)
    save_tiny_model(models / "teacher", seed=1)
    common = ["--tuning", "full", "--teacher", "separate", "--models", str(models)]
    single, zero = tmp_path / "single", tmp_path / "zero"
    # The reference: one process, the whole batch, the default tiles (one per micro-batch), no DeepSpeed.
    _run([sys.executable, str(SCRIPTS / "ds_train.py"), str(single), *common], tmp_path)
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "examples/accelerate/zero3.yaml"),
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(free_port()),
    ]
    _run([*launch, str(SCRIPTS / "ds_head_gathers.py"), str(zero), *common, "--per-device", "2"], tmp_path)

    info = json.loads((zero / "info.json").read_text())
    assert info["processes"] == 2 and info["zero_stage"] == 3 and info["student_partitioned"]
    assert info["teacher_partitioned"]
    for rank in range(2):
        counts = json.loads((zero / f"gathers_rank{rank}.json").read_text())
        # one loss call per process (1 micro-batch) over 5 vocabulary slices x at least 2 token chunks of 2 tokens
        assert counts["loss_calls"] == 1 and counts["tokens"] > 2, counts
        assert counts["forward"] == 1 and counts["backward"] == 1, counts
    a, b = torch.load(single / "weights.pt"), torch.load(zero / "weights.pt")
    initial = torch.load(zero / "initial.pt")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(torch.load(single / "initial.pt")[name], initial[name], rtol=0, atol=0)
        FLOAT32.close(a[name], b[name], msg=lambda m, n=name: f"{n}: {m}")  # float32 sums in another order
    assert not torch.equal(b["lm_head.weight"], initial["lm_head.weight"])  # the head was trained
