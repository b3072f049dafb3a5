"""The anchor schedule driven by Trainer's optimizer steps (`AnchorStep`), beside its state: saved into every
checkpoint folder with the stall signal's, read back when a run resumes (`resume_anchor`), and described in the model
card (`add_anchor_sentence`). The schedule itself (its kinds, its update, its state) is `trl_nca.core.schedule`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..core.schedule import STATE_FILE as SCHEDULE_STATE_FILE
from ..core.schedule import BetaSchedule
from ..core.stall import STATE_FILE as STALL_STATE_FILE
from ..core.stall import StallMonitor
from ..inputs import write_text_atomic
from .checkpoints import resolve_resume


logger = logging.getLogger(__name__)


class AnchorStep(TrainerCallback):
    """The anchor schedule driven by Trainer's optimizer steps, in one place: at each step's start the step
    statistics open (`StepStats.open_step`); at its end (`state.global_step` steps done) they log the step's token
    means, from which the stall signal is recorded (`trl_nca.core.stall`, when there is one: a recording that changes
    nothing in training) and the schedule sets the weight of the next step (`BetaSchedule.update`); every checkpoint
    folder gets the schedule's state and the stall signal's (read back by `load_anchor_state`). Logging
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


def load_anchor_state(checkpoint: str, schedule: BetaSchedule, stall: StallMonitor | None = None) -> None:
    """Restore the anchor schedule from the checkpoint folder a run resumes from (`load_schedule`), and the stall
    signal where the checkpoint holds its state (a checkpoint of an older trl-nca does not: the signal then measures
    from the resumed step)."""
    load_schedule(schedule, checkpoint)
    path = Path(checkpoint) / STALL_STATE_FILE
    if stall is not None and path.is_file():
        stall.load_state_dict(json.loads(path.read_text()))


def resume_anchor(resume_from_checkpoint, output_dir: str, anchor_step: AnchorStep):
    """A trainer's `train(resume_from_checkpoint=...)`: the checkpoint folder it names or finds (`resolve_resume`,
    checked before training starts), with the anchor's state (and the stall signal's) restored from it."""
    checkpoint = resolve_resume(resume_from_checkpoint, output_dir)
    if isinstance(checkpoint, str):
        load_anchor_state(checkpoint, anchor_step.schedule, anchor_step.stall)
    return checkpoint


def add_anchor_sentence(card: Path, sentence: str) -> None:
    """Add to TRL's model card (`card`, its README.md, when written) the sentence on the anchor the run used (the
    default anchor is beyond the paper the card cites), after the line naming the method."""
    if not card.is_file():
        return
    text = card.read_text(encoding="utf-8")
    start = text.find("This model was trained with ")
    end = len(text) if start < 0 else text.find("\n", start) % (len(text) + 1)
    card.write_text(f"{text[:end]}\n\n{sentence}\n{text[end:]}", encoding="utf-8")
