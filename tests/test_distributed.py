"""DDP on CPU (gloo, 2 processes): the update equals one process training on the whole batch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"


def _run(cmd, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.parametrize("mode", ["plain", "reentrant"])
def test_two_process_ddp_matches_single_process(tmp_path, mode):
    """Under reentrant checkpointing the two views must share one forward, or DDP's reducer fails."""
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    extra = ["reentrant"] if mode == "reentrant" else []
    port = "29517" if mode == "plain" else "29518"
    _run([sys.executable, str(SCRIPT), str(single), "4", *extra], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
          str(SCRIPT), str(ddp), "2", *extra], tmp_path)  # fmt: skip
    a, b = torch.load(single / "weights.pt"), torch.load(ddp / "weights.pt")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-4)
