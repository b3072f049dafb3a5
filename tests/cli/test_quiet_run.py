"""A newcomer's run prints progress and results, not warnings caused by how this library calls its dependencies."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a fresh interpreter
@pytest.mark.skipif(torch.accelerator.is_available(), reason="DeepSpeed detects the accelerator itself")
def test_cli_names_the_cpu_for_deepspeed():
    pytest.importorskip("deepspeed")
    code = (  # a command that runs (and stops at its missing --output-dir), then DeepSpeed's accelerator detection
        "from trl_nca.cli import main\ntry:\n    main(['eval'])\nexcept SystemExit:\n    pass\n"
        "import deepspeed.accelerator as a; a.get_accelerator()"
    )
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Setting accelerator to CPU" not in result.stdout + result.stderr


def test_cli_keeps_a_chosen_deepspeed_accelerator(monkeypatch):
    from trl_nca.cli import _name_cpu_for_deepspeed

    monkeypatch.setenv("DS_ACCELERATOR", "xpu")
    _name_cpu_for_deepspeed()
    assert os.environ["DS_ACCELERATOR"] == "xpu"
