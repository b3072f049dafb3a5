"""DDP on CPU (gloo, 2 processes): the update and the logged terms equal one process training on the whole batch."""

import json
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


@pytest.mark.parametrize("mode", ["accumulation", "reentrant"])
def test_two_process_ddp_matches_single_process(tmp_path, mode):
    """2 processes x (1 row x 2 accumulation steps), or 2 x 2 rows under reentrant checkpointing (where the two views
    must share one forward, or DDP's reducer fails), against 1 process x 4 rows: same update, same logged token means.
    """
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    extra = ["1", "2"] if mode == "accumulation" else ["2", "1", "reentrant"]
    port = "29517" if mode == "accumulation" else "29518"
    _run([sys.executable, str(SCRIPT), str(single), "4", *extra[2:]], tmp_path)
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
          str(SCRIPT), str(ddp), *extra], tmp_path)  # fmt: skip
    a, b = torch.load(single / "weights.pt"), torch.load(ddp / "weights.pt")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-4)
    initial = torch.load(ddp / "initial.pt")
    still = [name for name in b if torch.equal(b[name], initial[name])]
    assert not still, f"parameters the step did not update: {still}"
    assert sum((b[n] - initial[n]).norm() ** 2 for n in b) ** 0.5 > 1e-2  # SGD, lr 1: the update is the gradient
    (log_single,) = json.loads((single / "logs.json").read_text())
    (log_ddp,) = json.loads((ddp / "logs.json").read_text())
    for key in ("loss", "opd_loss", "nca_loss", "view_kl", "completions/mean_length"):
        assert log_ddp[key] == pytest.approx(log_single[key], rel=1e-5, abs=1e-7), key  # float32 noise of padding
    for log in (log_single, log_ddp):
        assert log["loss"] == pytest.approx(log["opd_loss"] + 0.5 * log["nca_loss"], rel=1e-6)
