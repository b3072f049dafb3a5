"""FSDP through accelerate cannot run on a machine without GPUs: accelerate then sets up no distributed training at
all, and the trainer refuses to start instead of letting each process train its own copy (see docs/distributed.md)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).parent / "scripts" / "ds_train.py"


@pytest.mark.slow
def test_fsdp2_config_on_cpu_is_refused(tmp_path):
    from trl_nca.testing import save_tiny_model

    save_tiny_model(tmp_path / "models" / "student", seed=0)
    save_tiny_model(tmp_path / "models" / "teacher", seed=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    args = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "examples/accelerate/fsdp2.yaml"),
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(port),
        str(SCRIPT), str(tmp_path / "out"), "--tuning", "full", "--teacher", "separate",
        "--models", str(tmp_path / "models"), "--per-device", "2",
    ]  # fmt: skip
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    assert "2 processes were launched, but accelerate set up no distributed training" in result.stderr
    assert not (tmp_path / "out" / "weights.pt").exists()
