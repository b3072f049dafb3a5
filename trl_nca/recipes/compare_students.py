"""The students of a comparison: each trained from its base weights (or loaded, when its folder holds a finished one)
and evaluated, one after another or in forked worker processes (`workers`).

The workers end with their run. Each dies with its parent (a parent-death signal on Linux, and a watch on its parent
everywhere) and holds no copy of the output folder's lock, so a parent killed by any signal leaves no worker behind
and no lock held. Ctrl-C stops the run: the parent passes it on to every worker, a worker in training stops at its
next step boundary, one in evaluation stops at once (its records so far are kept; a stop that lands in a finaliser,
such as a dataset's `__del__`, is raised again just after it), queued units are not started, and the command says how
to resume; a second Ctrl-C ends the workers at once. A worker killed on its own (the out-of-memory killer's SIGKILL)
ends the run in one line naming the signal, its student and the resume (`WorkerKilled`). A student stopped before its
end leaves no `done.json`, so a rerun trains it again from its base weights with the same seed: the same result.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch
from peft import PeftModel
from transformers import TrainerCallback

from ..console import JobEstimate, in_detail, say, speaking_for
from ..eval import ModelRun, PairedEvalCallback
from ..inputs import RunStopped, close_inherited_locks, read_json_output, write_text_atomic
from ..tasks import BuiltinTask
from ..trainers.activation_checkpointing import quiet_old_checkpointing_names
from ..trainers.console import explain_training
from . import sdft
from .compare_eval import Evaluated, evaluate_base, load_base
from .compare_plan import Plan, Run, done_fix


logger = logging.getLogger(__name__)


def _dataset(rows: Sequence[dict[str, Any]]):
    from datasets import Dataset

    return Dataset.from_list(list(rows))


def train_run(
    task: BuiltinTask,
    config,
    model_path: str,
    model_init_kwargs,
    tokenizer,
    peft_config,
    train_rows,
    tracker=None,
    phase: str | None = None,
):
    """Train one student; returns the trainer (its model holds the trained adapter). `phase` names its progress bar
    and training estimate (`trl_nca.trainers.console`)."""
    from ..trainers.nca_trainer import NCATrainer

    model = load_base(model_path, model_init_kwargs)
    trainer_class = NCATrainer
    if sdft.is_sdft_config(config):
        trainer_class = sdft.sdft_trainer  # TRL's SDFTTrainer on the task's rows as prompt + privileged_context
        train_rows = sdft.sdft_rows(task, train_rows)
    callbacks = [tracker] if tracker is not None else []
    if _WORKER.parent is not None:  # in a worker: Ctrl-C stops its training at the next step boundary
        callbacks.append(StopAtStepBoundary())
    trainer = trainer_class(
        model=model,
        args=config,
        train_dataset=_dataset(train_rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks or None,
    )
    if tracker is not None:
        tracker.bind(trainer)
    explain_training(trainer, phase)  # also TRL's SDFTTrainer
    if trainer_class is NCATrainer:
        trainer.train()
    else:  # TRL's SDFTTrainer toggles checkpointing by its deprecated names around sampling (trainers.activation_checkpointing)
        with quiet_old_checkpointing_names():
            trainer.train()
    return trainer


CURVE_KEYS = ("loss", "opd_loss", "nca_loss", "view_kl", "nca_beta")


def compact_history(log_history: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """The per-step training logs as one list per logged term (`step` plus `CURVE_KEYS`), for figures and JSON."""
    rows = [entry for entry in log_history if "loss" in entry and "step" in entry]
    curves = {"step": [entry["step"] for entry in rows]}
    for key in CURVE_KEYS:
        if any(key in entry for entry in rows):
            curves[key] = [None if entry.get(key) is None else float(f"{entry[key]:.6g}") for entry in rows]
    return curves


class UnitStopped(Exception):
    """A worker's unit stopped by Ctrl-C (its training at a step boundary, its evaluation at once)."""


class WorkerKilled(RunStopped):
    """A worker process ended by a signal it did not ask for (the out-of-memory killer's SIGKILL): the message names the
    signal, the unit it ran, those stopped with it, and the resume."""


class _WorkerState:
    parent: int | None = None  # the parent's pid, in a worker
    running: Any = None  # in a worker: the pool's shared array of each unit's worker pid (0: not started)
    in_unit = False  # running a unit (not waiting for the next one in the pool's loop)
    training = False
    stopping = False


_WORKER = _WorkerState()
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent: int) -> None:
    """Have the kernel send SIGTERM to this worker when its parent ends (Linux), and watch the parent's pid from a
    thread where that is not available (or in case the parent ended before the signal was asked for)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="trl-nca-parent-watch", daemon=True).start()


def _worker_sigint(signum, frame) -> None:
    """Ctrl-C in a worker (from the terminal, or passed on by the parent): a student in training stops at its next
    step boundary (`StopAtStepBoundary`), anything else at once; a second one changes nothing."""
    if _WORKER.stopping:
        return
    _WORKER.stopping = True
    if _WORKER.in_unit and not _WORKER.training:  # between units, the next one sees `stopping` and does not start
        raise UnitStopped


def _stop_again(signum, frame) -> None:
    """The stop of `_worker_sigint`, raised again once a finaliser it landed in has returned (`_stop_in_finaliser`)."""
    if _WORKER.in_unit and not _WORKER.training:
        raise UnitStopped


def _stop_in_finaliser(default):
    """`sys.unraisablehook` of a worker: a `UnitStopped` raised inside a finaliser (a `__del__` run by the garbage
    collector, whose exceptions Python prints as "Exception ignored" and drops) is raised again 10 ms later, outside
    it; anything else goes to `default`."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, UnitStopped):
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            return
        default(unraisable)

    return hook


def _worker_init(parent: int, running=None) -> None:
    """Each worker, once, as it starts: it ends with its parent, leaves the output folder's lock to the parent alone,
    takes Ctrl-C as a request to stop (`_worker_sigint`), and records in `running` the units it starts."""
    _WORKER.parent, _WORKER.running = parent, running
    _die_with_parent(parent)
    close_inherited_locks()
    signal.signal(signal.SIGINT, _worker_sigint)
    signal.signal(signal.SIGALRM, _stop_again)
    sys.unraisablehook = _stop_in_finaliser(sys.unraisablehook)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class StopAtStepBoundary(TrainerCallback):
    """In a worker: the training of a student stops at the step boundary after a Ctrl-C (`UnitStopped`; no
    `done.json` is written, so a rerun trains it again)."""

    def on_train_begin(self, args, state, control, **kwargs):
        _WORKER.training = True
        if _WORKER.stopping:
            raise UnitStopped

    def on_step_end(self, args, state, control, **kwargs):
        if _WORKER.stopping:
            raise UnitStopped

    def on_train_end(self, args, state, control, **kwargs):
        _WORKER.training = False


def _unit_in_worker(
    plan: Plan, tokenizers: dict[int | None, Any], unit: tuple[str, Any], index: int | None = None
) -> tuple[str, float] | None:
    """One unit in a worker, with one CPU thread: ("base", organism) evaluates that base, ("student", index) trains
    and evaluates that student. Each writes its records (and a student its folder) as a sequential run would. Returns
    the unit's name and its own seconds, or None when a Ctrl-C stopped it (or came before it started). `index`: the
    unit's place in the pool's `running` array, where the worker's pid is recorded as it starts."""
    torch.set_num_threads(1)
    kind, key = unit
    start = time.perf_counter()
    try:
        _WORKER.in_unit = True
        if _WORKER.stopping:
            return None
        if _WORKER.running is not None and index is not None:
            _WORKER.running[index] = os.getpid()
        if kind == "base":
            evaluate_base(plan, key, tokenizers[key], Evaluated())
            return plan.base_name(key), time.perf_counter() - start
        run = plan.runs[key]
        evaluate_student(plan, run, tokenizers[run.organism], Evaluated())
        return run.name, time.perf_counter() - start
    except UnitStopped:
        return None
    finally:
        _WORKER.in_unit = _WORKER.training = False


def units_in_workers(
    plan: Plan, tokenizers: dict[int | None, Any], bases: Sequence[int | None] = (), job: JobEstimate | None = None
) -> None:
    """Evaluate the bases in `bases` and train and evaluate the unfinished students in `workers` forked processes,
    the bases first; the caller then loads each unit back from the files it wrote. The plan and the tokenizers go to
    each worker with its unit. As each student finishes, `job` prints the whole job's estimate. Ctrl-C stops the units
    (see the module's docstring) and raises KeyboardInterrupt once the workers have stopped; a worker killed on its
    own raises `WorkerKilled`."""
    units = [("base", organism) for organism in bases]
    units += [("student", i) for i, run in enumerate(plan.runs) if not (run.folder / "done.json").exists()]
    if not units:
        return
    context = multiprocessing.get_context("fork")
    running = context.Array("i", len(units), lock=False)  # each unit's worker pid, set by the worker as it starts
    with ProcessPoolExecutor(
        min(plan.args.workers, len(units)),
        mp_context=context,
        initializer=_worker_init,
        initargs=(os.getpid(), running),
    ) as pool:
        with _interrupts_passed_on(pool) as interrupted:
            work = functools.partial(_unit_in_worker, plan, tokenizers)
            futures = {pool.submit(work, unit, index): index for index, unit in enumerate(units)}
            processes = dict(getattr(pool, "_processes", None) or {})  # a fork pool starts every worker at once
            for future in as_completed(futures):
                if isinstance(future.exception(), BrokenProcessPool):
                    done = {index for f, index in futures.items() if f.done() and f.exception() is None}
                    raise _killed_worker(processes, plan, units, running, done) from future.exception()
                finished = future.result()
                if finished is None:  # stopped by a Ctrl-C, or not started after one
                    continue
                name, seconds = finished
                logger.info("%s finished in a worker.", name)
                if job is not None and units[futures[future]][0] == "student":
                    say(job.finished(name, seconds), level="units")
    if interrupted:
        raise KeyboardInterrupt


def _unit_name(plan: Plan, unit: tuple[str, Any]) -> str:
    kind, key = unit
    return plan.base_name(key) if kind == "base" else plan.runs[key].name


def _killed_worker(processes, plan: Plan, units, running, finished: set[int]) -> WorkerKilled:
    """What a pool broken by a worker's death says: the signal that ended it and its unit (from the pool's processes,
    `processes` by pid, and the `running` array), the units stopped with it (the pool ends every other worker), and
    the resume."""
    # The pool's manager thread reaps the workers as it ends them; a status read while it does reads None (its
    # waitpid took it), so the statuses are read once it has set them (a few ms; 5 s at most)
    deadline = time.monotonic() + 5
    while any(process.exitcode is None for process in processes.values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    codes = {pid: process.exitcode for pid, process in processes.items()}
    started = {i: pid for i, pid in enumerate(running) if pid and i not in finished}
    ended = {i: codes.get(pid) for i, pid in started.items()}
    killed = [i for i, code in ended.items() if code is not None and code != -signal.SIGTERM] or list(started)
    others = [_unit_name(plan, units[i]) for i in started if i not in killed]
    code = ended.get(killed[0]) if killed else None
    how = "ended abruptly"
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        how = f"was killed by signal {-code} ({name}{', as the out-of-memory killer and kill -9 do' if code == -9 else ''})"
    what = " or ".join(_unit_name(plan, units[i]) for i in killed) or "between units"
    with_it = f"; {', '.join(others)}, in progress in another worker, stopped with it" if others else ""
    return WorkerKilled(
        f"A worker process {how} while it ran {what}{with_it}. The students and bases finished before are kept: run "
        "the same command again to resume (each worker holds a model of its own: where memory is short, set "
        "workers: 1)."
    )


class _Interrupted:
    def __init__(self):
        self.count = 0

    def __bool__(self) -> bool:
        return self.count > 0


def _interrupts_passed_on(pool):
    """While the workers run (main thread only): the first Ctrl-C is passed on to every worker, which stop (their
    queued units are not started); a second one ends them at once (SIGTERM) and raises KeyboardInterrupt."""
    interrupted = _Interrupted()

    def workers() -> list[int]:
        return [process.pid for process in multiprocessing.active_children() if process.pid is not None]

    def handle(signum, frame) -> None:
        interrupted.count += 1
        if interrupted.count == 1:
            print(
                "Interrupted: the students in training stop at their next step, queued ones are not started (Ctrl-C "
                "again stops at once).",
                file=sys.stderr,
                flush=True,
            )
            for pid in workers():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGINT)
            return
        for pid in workers():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def manager():
        if threading.current_thread() is not threading.main_thread():
            yield interrupted
            return
        previous = signal.signal(signal.SIGINT, handle)
        try:
            yield interrupted
        finally:
            signal.signal(signal.SIGINT, previous)

    return manager()


def evaluate_student(plan: Plan, run: Run, tokenizer, evaluated: Evaluated) -> None:
    """Train the student of `run` (or load it, when its folder holds a finished one), then evaluate it."""
    with speaking_for(run.name):  # its progress lines name it: several students may run at once
        _evaluate_named_student(plan, run, tokenizer, evaluated)


def _evaluate_named_student(plan: Plan, run: Run, tokenizer, evaluated: Evaluated) -> None:
    model_path = plan.model_paths[run.organism]
    records_path = run.folder / "eval" / "records.jsonl"
    done_path = run.folder / "done.json"
    if done_path.exists():
        done = read_json_output(done_path, done_fix(run))

        with (
            quiet_old_checkpointing_names()
        ):  # PEFT reads transformers' deprecated name (trainers.activation_checkpointing)
            student = PeftModel.from_pretrained(load_base(model_path, plan.model_init_kwargs), str(run.folder))
    else:
        done, student = _train_student(plan, run, model_path, tokenizer)
        write_text_atomic(done_path, json.dumps(done, indent=2, default=str) + "\n")
    evaluated.train_seconds[run.name] = done["train_seconds"]
    evaluated.histories[run.name] = compact_history(done["log_history"])
    evaluated.tracking[run.name] = [
        {k: row[k] for k in ("step", "acc_x", "acc_xc", "harm_count", "help_count") if k in row}
        for row in done.get("tracking", [])
    ]
    prov = plan.evaluator.provenance(student, model_path, adapter=str(run.folder))
    with in_detail():  # its estimate line is a step's: the student's end and the whole job's estimate follow it
        records = plan.evaluator.run(
            student, tokenizer, output_path=records_path, provenance=prov, desc=f"paired eval {run.name}"
        )
    evaluated.runs.append(ModelRun(run.name, records, provenance=prov, records_path=str(records_path)))
    evaluated.identity[run.name] = (run.method.name, run.organism, run.seed)
    del student


def _train_student(plan: Plan, run: Run, model_path: str, tokenizer):
    """Train and save the student of `run`; returns its `done.json` record and the trained model."""
    args, task = plan.args, plan.task
    tracker = None
    if args.track_every > 0:
        tracker = PairedEvalCallback(
            plan.test_rows,
            context=task.context,
            scorer=task.scorer,
            id_column="id",
            eval_steps=args.track_every,
            num_items=args.track_items,
            generation=plan.evaluator.generation,
            eval_on_start=True,
            final_report=False,
            n_bootstrap=0,
        )
    t0 = time.perf_counter()
    trainer = train_run(
        task,
        run.config,
        model_path,
        plan.model_init_kwargs,
        tokenizer,
        copy.deepcopy(plan.peft_config),
        plan.train_rows,
        tracker,
        phase=f"training {run.name} (student {plan.runs.index(run) + 1} of {len(plan.runs)})",
    )
    trainer.save_model(str(run.folder))
    done = {
        "method": run.method.name,
        "overrides": run.method.overrides,
        "organism_seed": run.organism,
        "seed": run.seed,
        "settings": run.settings,
        "train_seconds": round(time.perf_counter() - t0, 1),
        "log_history": trainer.state.log_history,
        "tracking": [] if tracker is None else tracker.summary_rows(),
    }
    return done, trainer.accelerator.unwrap_model(trainer.model)
