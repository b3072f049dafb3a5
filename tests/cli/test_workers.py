"""`trl-nca compare` with `workers: 2` ends with its run (issue 50), tried with real processes and signals on the tiny
model: each row is what happens to the parent while its workers train, the line it must print (or none, when the
parent is killed), and what must hold after it: no worker left, no lock held, no queued student started, no worker
traceback, and a rerun that resumes to the results of an uninterrupted run (`recipes/compare_students.py`)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


CONFIG = """
model_name_or_path: {model}
task: reply_in_french
seeds: [0, 1]
methods: ["opd:nca_beta=0", "nca:nca_beta=0.5"]
num_train: 4
eval_items: 2
workers: 2
max_new_tokens: 3
max_steps: 12
per_device_train_batch_size: 2
learning_rate: 1.0e-3
use_peft: true
lora_r: 2
lora_alpha: 4
lora_target_modules: [q_proj, v_proj]
logging_steps: 1
report_to: none
disable_tqdm: true
"""
RESUME = "trl-nca compare: interrupted; run the same command again to resume what was finished."
MARKER = "Training opd/seed1"  # both workers are training (the students of opd), the two of nca are queued


def _command(config: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "trl_nca.cli", "compare", "--config", str(config), "--output_dir", str(out)]


def _env() -> dict:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a shell's `cmd &` would start it ignoring SIGINT


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def setup(tiny_dir, tmp_path_factory):
    """The config and an uninterrupted run's summary, the reference of every rerun."""
    root = tmp_path_factory.mktemp("workers")
    config = root / "compare.yaml"
    config.write_text(CONFIG.format(model=tiny_dir))
    done = subprocess.run(_command(config, root / "whole"), env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    return config, json.loads((root / "whole" / "comparison.json").read_text())


def _interrupt_group(proc):
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group


def _interrupt_twice(proc):
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)


def _interrupt_parent(proc):
    os.kill(proc.pid, signal.SIGINT)  # `kill -INT`: the parent alone, which passes it on


def _kill_parent(proc):
    os.kill(proc.pid, signal.SIGKILL)


def _terminate_parent(proc):
    os.kill(proc.pid, signal.SIGTERM)


def _kill_a_worker(proc):
    """The out-of-memory killer ends one worker with SIGKILL."""
    worker = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()[0]
    os.kill(int(worker), signal.SIGKILL)


WORKER_KILLED = re.compile(
    r"trl-nca compare: error: A worker process was killed by signal 9 \(SIGKILL, as the out-of-memory killer and "
    r"kill -9 do\) while it ran opd/seed[01]; opd/seed[01], in progress in another worker, stopped with it\. The "
    r"students and bases finished before are kept: run the same command again to resume .*"
)


# (case, what is done to the run while its two workers train, its exit status, the line it must end with, whether the
# rerun runs to the end here: the others check that the folder is free for it)
CASES = [
    ("one Ctrl-C", _interrupt_group, 130, RESUME, True),
    # the second Ctrl-C may land in the parent's last seconds (its teardown), which then end by SIGINT
    ("two Ctrl-C", _interrupt_twice, (130, -signal.SIGINT), RESUME, False),
    ("kill -INT of the parent", _interrupt_parent, 130, RESUME, False),
    ("kill -9 of the parent", _kill_parent, -signal.SIGKILL, None, True),
    ("kill -TERM of the parent", _terminate_parent, -signal.SIGTERM, None, False),
    ("kill -9 of a worker (the out-of-memory killer)", _kill_a_worker, 1, WORKER_KILLED, True),
]


@pytest.mark.slow  # starts the command and signals it
@pytest.mark.parametrize("case, action, code, last_line, rerun", CASES, ids=[c[0] for c in CASES])
def test_workers_end_with_their_run_and_a_rerun_resumes(setup, tmp_path, case, action, code, last_line, rerun):
    config, whole = setup
    out = tmp_path / "out"
    proc = subprocess.Popen(
        _command(config, out),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if MARKER in line:
            break
    workers = [
        int(pid)
        for pid in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    ]
    assert len(workers) == 2, "".join(seen)
    started = time.monotonic()
    action(proc)
    try:  # the output ends when the parent and every worker have ended
        rest, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the run's output stayed open for 120 s after it was signalled: a worker outlived its parent")
    assert proc.returncode in (code if isinstance(code, tuple) else (code,)), rest
    assert time.monotonic() - started < 60  # the students in training stopped at a step, not at their end
    deadline = time.monotonic() + 10
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(_alive, workers)), "a worker outlived its run"
    assert "Traceback" not in rest, rest
    if isinstance(last_line, re.Pattern):
        assert last_line.fullmatch(rest.strip().splitlines()[-1]), rest
    elif last_line is not None:
        assert rest.strip().splitlines()[-1] == last_line, rest
    assert not list(out.rglob("done.json")) or case.startswith("kill -"), "a student finished after the Ctrl-C"
    assert not (out / "nca").exists()  # the queued students were not started
    if not rerun:
        from trl_nca.inputs import output_folder_lock

        with output_folder_lock(out, "test"):  # no worker holds the folder
            return
    rerun = subprocess.run(_command(config, out), env=_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0 and "in use by another" not in rerun.stdout, rerun.stdout[-3000:]
    summary = json.loads((out / "comparison.json").read_text())
    for key in ("per_seed", "aggregated", "statistics", "curves"):
        assert summary[key] == json.loads(json.dumps(whole[key]).replace(str(setup[0].parent / "whole"), str(out)))


# A worker's Ctrl-C that lands while the garbage collector runs a finaliser (a dataset's `__del__`, between two
# students): Python drops an exception raised there with an "Exception ignored" traceback, and the unit ran on.
STOP_IN_A_FINALISER = """
import os, signal, sys, time
from trl_nca.recipes import compare_students

compare_students._worker_init(os.getppid())


class Finalised:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)


compare_students._WORKER.in_unit = True
try:
    Finalised()  # collected at once: its finaliser takes the Ctrl-C
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.01)
    print("not stopped")
except compare_students.UnitStopped:
    print("stopped")
"""


@pytest.mark.slow  # the worker is a process of its own
def test_a_stop_that_lands_in_a_finaliser_stops_the_unit_after_it_without_a_traceback():
    done = subprocess.run(
        [sys.executable, "-c", STOP_IN_A_FINALISER], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "stopped" and "Exception ignored" not in done.stderr, done.stdout + done.stderr
