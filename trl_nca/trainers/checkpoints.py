"""Checkpoints of both trainers: the anchor schedule's state (and the stall signal's) saved beside Trainer's, and
resuming from them."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..core.schedule import STATE_FILE as SCHEDULE_STATE_FILE
from ..core.schedule import BetaSchedule
from ..core.stall import STATE_FILE as STALL_STATE_FILE
from ..core.stall import StallMonitor
from ..inputs import write_text_atomic
from .script_options import resolve_resume  # the one resume resolver, re-exported here (`resume`)


logger = logging.getLogger(__name__)


class AnchorStep(TrainerCallback):
    """The anchor schedule driven by Trainer's optimizer steps, in one place: at each step's start the step
    statistics open (`StepStats.open_step`); at its end (`state.global_step` steps done) they log the step's token
    means, from which the stall signal is recorded (`trl_nca.core.stall`, when there is one: a recording that changes
    nothing in training) and the schedule sets the weight of the next step (`BetaSchedule.update`); every checkpoint
    folder gets the schedule's state and the stall signal's (read back by `load_schedule` and `resume`). Logging
    settings (`logging_steps`) only decide when the logged means are flushed, never the weights. At the end of
    training, a run whose stall signal is on gets one warning (`StallMonitor.message`)."""

    def __init__(self, schedule: BetaSchedule, step_stats, stall: StallMonitor | None = None):
        self.schedule = schedule
        self.step_stats = step_stats  # a `trl_nca.trainers.stats.StepStats`
        self.stall = stall

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_stats.open_step()

    def on_step_end(self, args, state, control, **kwargs):
        means = self.step_stats.close_step(self.schedule.value)
        if means is not None and self.stall is not None:
            for name, value in self.stall.update(means["opd_loss"], means["view_kl"]).items():
                self.step_stats.metrics["train"][name].append(value)
        self.schedule.update(means, steps_done=state.global_step)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            if folder.is_dir():
                write_text_atomic(folder / SCHEDULE_STATE_FILE, json.dumps(self.schedule.state_dict()) + "\n")
                if self.stall is not None:
                    write_text_atomic(folder / STALL_STATE_FILE, json.dumps(self.stall.state_dict()) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if self.stall is not None and self.stall.stalled and state.is_world_process_zero:
            logger.warning(self.stall.message())


def load_schedule(schedule: BetaSchedule, checkpoint: str) -> None:
    """Restore the anchor schedule saved in a checkpoint; a checkpoint without one must come from a constant one."""
    path = Path(checkpoint) / SCHEDULE_STATE_FILE
    if path.is_file():
        schedule.load_state_dict(json.loads(path.read_text()))
    elif schedule.kind != "constant":
        raise ValueError(
            f"{checkpoint} holds no {SCHEDULE_STATE_FILE}, so the {schedule.kind!r} anchor schedule cannot be resumed "
            "exactly (the checkpoint was written by a run with nca_beta_schedule='constant' or an older trl-nca)."
        )


def resume(resume_from_checkpoint, output_dir: str, schedule: BetaSchedule, stall: StallMonitor | None = None):
    """What a trainer's `train` passes on to `Trainer.train` (`resolve_resume`; a folder the command line resolved is
    only checked again), with the anchor schedule restored from the checkpoint folder it names, and the stall signal
    where the checkpoint holds its state (a checkpoint of an older trl-nca does not: the signal then measures from
    the resumed step)."""
    resume_from_checkpoint = resolve_resume(resume_from_checkpoint, output_dir)
    if isinstance(resume_from_checkpoint, str):
        load_schedule(schedule, resume_from_checkpoint)
        path = Path(resume_from_checkpoint) / STALL_STATE_FILE
        if stall is not None and path.is_file():
            stall.load_state_dict(json.loads(path.read_text()))
    return resume_from_checkpoint


class StopOnInterrupt(TrainerCallback):
    """Ctrl-C (SIGINT) during training ends it cleanly: the step under way finishes, a checkpoint is saved and
    training stops, so the run resumes with `--resume_from_checkpoint true`; a second Ctrl-C stops at once (the last
    complete checkpoint stays the one to resume). `interrupted` says whether it happened; used inside `installed()`.
    Single-process runs only: the processes of a distributed run would stop at different steps."""

    def __init__(self):
        self.interrupted = False

    def _handle(self, signum, frame) -> None:
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True
        print(
            "Interrupted: finishing this step and saving a checkpoint (Ctrl-C again stops at once).",
            file=sys.stderr,
            flush=True,
        )

    def installed(self):
        """A context manager that installs the SIGINT handler (main thread only) and puts the previous one back."""
        import contextlib

        @contextlib.contextmanager
        def manager():
            if threading.current_thread() is not threading.main_thread():
                yield self
                return
            previous = signal.signal(signal.SIGINT, self._handle)
            try:
                yield self
            finally:
                signal.signal(signal.SIGINT, previous)

        return manager()

    def on_step_end(self, args, state, control, **kwargs):
        if self.interrupted:
            control.should_save = True
            control.should_training_stop = True
