"""FSDP is refused at init, before any model loads, with an error that names ZeRO-3: under FSDP the teacher and the
frozen copies of the student would be neither sharded nor placed (`trl_nca.core.launch.refuse_fsdp`). Launched as a user
would launch an FSDP2 config, on 2 CPU processes (where accelerate would otherwise set up no distributed training)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parents[1] / "scripts" / "ds_train.py"

FSDP2 = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_state_dict_type: FULL_STATE_DICT
num_machines: 1
num_processes: 2
mixed_precision: 'no'
use_cpu: false
"""


@pytest.mark.slow
def test_fsdp2_launch_is_refused_before_any_model_loads(tmp_path):
    from trl_nca.testing import save_tiny_model

    save_tiny_model(tmp_path / "models" / "student", seed=0)
    save_tiny_model(tmp_path / "models" / "teacher", seed=1)
    config = tmp_path / "fsdp2.yaml"
    config.write_text(FSDP2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    args = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(config),
        "--num_processes",
        "2",
        "--main_process_port",
        str(port),
        str(SCRIPT),
        str(tmp_path / "out"),
        "--tuning",
        "full",
        "--teacher",
        "separate",
        "--models",
        str(tmp_path / "models"),
        "--per-device",
        "2",
    ]
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    assert "NCATrainer does not support FSDP" in result.stderr
    assert "examples/accelerate/zero3.yaml" in result.stderr
    assert not (tmp_path / "out" / "weights.pt").exists()
