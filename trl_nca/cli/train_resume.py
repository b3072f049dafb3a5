"""A resumed `trl-nca train`: checked before any model loads against the settings of the run its checkpoint belongs to
(`check_resumed_run`), and started on the learning rate of its own schedule (`RunStart`), which also names an anchor
warm-up that an epoch-set run is too short for."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from transformers import TrainerCallback

from ..core.schedule import schedule_from_config
from ..inputs import InputError, read_json_output
from ..recipes.compare import refuse_changed_settings
from .train_outputs import TRAIN_SETTINGS


logger = logging.getLogger(__name__)

RESUMABLE_CHANGES = ("max_steps", "num_train_epochs")
"""The settings a resume may change (the run's length, as Trainer allows); every other one is refused."""


def settings_of_checkpoint(checkpoint: str, output_dir: str) -> Path:
    """The `train_settings.json` of the run `checkpoint` belongs to: the one in the checkpoint's own run folder (a
    checkpoint of another run given by its path), else the one of `output_dir`."""
    own = Path(checkpoint).parent / TRAIN_SETTINGS
    return own if own.is_file() else Path(output_dir) / TRAIN_SETTINGS


def check_resumed_run(output_dir: str, checkpoint: str, settings: dict, max_steps: int) -> None:
    """Before any model loads, a resume must continue the run of its checkpoint: the settings that shape the result
    as that run recorded them (`settings_of_checkpoint`; a changed dataset, context, model, nca_beta, learning rate
    or schedule would silently train a mixture), and a `max_steps` not below the checkpoint's step."""
    saved = settings_of_checkpoint(checkpoint, output_dir)
    if not saved.is_file():
        logger.warning(
            "Neither %s nor %s has a %s (an older trl-nca did not write one), so the resumed run's settings cannot be "
            "checked against those it started with.",
            Path(checkpoint).parent,
            output_dir,
            TRAIN_SETTINGS,
        )
    else:
        old = read_json_output(saved, "Delete it to resume without the check, or use a new output_dir.")
        new = json.loads(json.dumps(settings))
        lengths = {}  # the run's length may change on resume, as in Trainer: not a setting that mixes two runs
        if isinstance(old, dict) and isinstance(old.get("training"), dict):
            for key in RESUMABLE_CHANGES:
                if key in old["training"] and old["training"][key] != new["training"].get(key):
                    lengths[key] = (old["training"][key], new["training"].get(key))
            old = {**old, "training": {**old["training"], **{k: new["training"].get(k) for k in lengths}}}
        refuse_changed_settings(
            "a training run",
            saved,
            old,
            new,
            why="Resuming would continue it as another run (new data, context or settings, the old optimizer state).",
        )
        if lengths:
            _say_new_length(lengths, new["training"].get("lr_scheduler_type"))
    _check_step(checkpoint, max_steps)


def _say_new_length(lengths: dict, schedule: str | None) -> None:
    changed = ", ".join(f"{key} {was} -> {now}" for key, (was, now) in lengths.items())
    logger.warning(
        "Resuming with a new length (%s): the %r learning-rate schedule is laid out again over the new length, and "
        "the resumed steps follow it from the checkpoint's step on (the rate the checkpoint's optimizer held, where "
        "the old schedule ended, is not used).",
        changed,
        schedule,
    )


def _check_step(checkpoint: str, max_steps: int) -> None:
    """`max_steps` below the checkpoint's step would train nothing and report the checkpoint as the run's end."""
    state = read_json_output(
        Path(checkpoint) / "trainer_state.json", "Give another checkpoint, or delete this one (its save was cut)."
    )
    step = state.get("global_step") if isinstance(state, dict) else None
    if isinstance(step, int) and 0 < max_steps < step:
        raise InputError(
            f"max_steps={max_steps} is below the step of the checkpoint to resume ({Path(checkpoint).name}, step "
            f"{step}): the run would train nothing. Give max_steps above {step} to train it further, or use that "
            "checkpoint's model as it is."
        )


class RunStart(TrainerCallback):
    """A callback for the start of `trl-nca train`'s training (`on_train_begin`, after a checkpoint's optimizer and
    scheduler are loaded). A resumed run's learning rate is set to its schedule's value at the checkpoint's step (the
    optimizer holds the old schedule's last rate: with a new length under a decaying schedule, 0 at the old end), and
    its logging, evaluation and save steps are the command's (Trainer keeps the checkpoint's). An anchor warm-up not
    shorter than an epoch-set run is named (its length is known only now)."""

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if args.max_steps <= 0:  # the lines the config could not give without the run's length
            schedule = schedule_from_config(args)
            length = f"{state.max_steps} optimizer steps: num_train_epochs={args.num_train_epochs:g}"
            unknown = schedule.cannot_act(-1)
            for line in schedule.cannot_act(state.max_steps, length):
                if line not in unknown:
                    logger.warning(line)
        if state.global_step > 0:
            state.compute_steps(args, state.max_steps)
        lambdas = getattr(lr_scheduler, "lr_lambdas", None)  # LambdaLR: every schedule of transformers' but one
        if state.global_step > 0 and optimizer is not None and lambdas is not None:
            step = lr_scheduler.last_epoch
            for group, base, rate in zip(optimizer.param_groups, lr_scheduler.base_lrs, lambdas, strict=True):
                group["lr"] = base * rate(step)
