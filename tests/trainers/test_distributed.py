"""DDP on CPU (gloo, 2 processes): the update and the logged terms equal one process training on the whole batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trl_nca.testing import FLOAT32, KL32, STORED32, free_port


pytestmark = pytest.mark.slow  # two processes (torch.distributed.run)

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_train.py"


def _run(cmd, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1")
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.parametrize("mode", [pytest.param("accumulation", marks=pytest.mark.numerics), "reentrant"])
def test_two_process_ddp_matches_single_process(tmp_path, mode):
    """2 processes x (1 row x 2 accumulation steps, the views in sequence), or 2 x 2 rows under reentrant
    checkpointing (where the two views must share one forward, or DDP's reducer fails), against 1 process x 4 rows:
    same update, same logged token means, and every gradient bucket all-reduced once in the step."""
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    extra = ["1", "2"] if mode == "accumulation" else ["2", "1", "reentrant"]
    _run([sys.executable, str(SCRIPT), str(single), "4", *extra[2:]], tmp_path)
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            str(SCRIPT),
            str(ddp),
            *extra,
        ],
        tmp_path,
    )
    a, b = torch.load(single / "weights.pt"), torch.load(ddp / "weights.pt")
    for name in a:
        FLOAT32.close(a[name], b[name])  # float32 gradients summed in another order (rows split over processes)
    initial = torch.load(ddp / "initial.pt")
    still = [name for name in b if torch.equal(b[name], initial[name])]
    assert not still, f"parameters the step did not update: {still}"
    assert sum((b[n] - initial[n]).norm() ** 2 for n in b) ** 0.5 > 1e-2  # SGD, lr 1: the update is the gradient
    reductions = json.loads((ddp / "allreduce.json").read_text())
    assert reductions["sequential"] == (mode == "accumulation")  # reentrant checkpointing: one joint forward
    assert reductions["counts"] and set(reductions["counts"].values()) == {1}  # one all-reduce per bucket per step
    (log_single,) = json.loads((single / "logs.json").read_text())
    (log_ddp,) = json.loads((ddp / "logs.json").read_text())
    for key in ("loss", "opd_loss", "nca_loss", "view_kl"):
        assert log_ddp[key] == KL32.approx(log_single[key]), key  # float32 KLs, rows split over processes
    assert log_ddp["completions/mean_length"] == log_single["completions/mean_length"]  # a ratio of token counts
    for log in (log_single, log_ddp):
        assert log["loss"] == STORED32.approx(log["opd_loss"] + 0.5 * log["nca_loss"])  # Trainer's loss: float32
