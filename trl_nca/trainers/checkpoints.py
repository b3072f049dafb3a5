"""Checkpoints of both trainers: the anchor schedule's state saved beside Trainer's, and resuming from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ..core.schedule import STATE_FILE as SCHEDULE_STATE_FILE
from ..core.schedule import BetaSchedule


class ScheduleCheckpoint(TrainerCallback):
    """Writes the anchor schedule's state into every checkpoint folder (read back by `load_schedule` on resume)."""

    def __init__(self, schedule: BetaSchedule):
        self.schedule = schedule

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            if folder.is_dir():
                (folder / SCHEDULE_STATE_FILE).write_text(json.dumps(self.schedule.state_dict()) + "\n")


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


def resolve_resume(resume_from_checkpoint, output_dir: str):
    """`resume_from_checkpoint=True` as the last checkpoint-N folder of `output_dir` (an error naming the folder when
    there is none, never a silent fresh start); anything else unchanged."""
    if resume_from_checkpoint is True:
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last is None:
            raise ValueError(
                f"resume_from_checkpoint=True, but output_dir {output_dir!r} holds no checkpoint-N "
                "folder. Give the checkpoint folder explicitly, or drop resume_from_checkpoint to start afresh."
            )
        return last
    return resume_from_checkpoint


def resume(resume_from_checkpoint, output_dir: str, schedule: BetaSchedule):
    """What a trainer's `train` passes on to `Trainer.train` (`resolve_resume`), with the anchor schedule restored
    from the checkpoint folder it names."""
    resume_from_checkpoint = resolve_resume(resume_from_checkpoint, output_dir)
    if isinstance(resume_from_checkpoint, str):
        load_schedule(schedule, resume_from_checkpoint)
    return resume_from_checkpoint
