"""Checkpoint folders, in one place: which folder a run resumes from (`resolve_resume`, the one resume resolver of the
trainers' `train` and of the command line), whether a folder is a complete checkpoint (`checkpoint_problem`), and
the Ctrl-C that ends training with a checkpoint (`StopOnInterrupt`). What the anchor schedule adds to each checkpoint
is `trl_nca.trainers.anchor`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from transformers import TrainerCallback


logger = logging.getLogger(__name__)

TRAINER_STATE = (
    "trainer_state.json"  # the last file Trainer writes into a checkpoint (transformers' TRAINER_STATE_NAME)
)


def checkpoint_problem(folder: str | Path) -> str | None:
    """Why `folder` is not a checkpoint a run can resume from (None when it is one). Trainer writes a checkpoint's
    `trainer_state.json` after the weights, optimizer and random states, so a folder without a readable one is a save
    that was cut off (an interrupt, a full disk), or a model folder that was never a checkpoint."""
    state = Path(folder) / TRAINER_STATE
    if not state.is_file():
        if (Path(folder) / "config.json").is_file() or (Path(folder) / "adapter_config.json").is_file():
            if not Path(folder).name.startswith("checkpoint-"):
                return (
                    f"it is a model folder, not a checkpoint: it holds weights but no {TRAINER_STATE} (no optimizer, "
                    "step or random state to resume). Give a checkpoint-N folder of the run, or start a new run from "
                    "these weights with --model_name_or_path"
                )
        return f"it holds no {TRAINER_STATE}: its save was cut off (an interrupted run or a full disk)"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"its {TRAINER_STATE} is cut: its save was cut off (an interrupted run or a full disk)"
    missing = missing_checkpoint_files(Path(folder))
    if missing:
        return (
            f"it has a {TRAINER_STATE} but lacks {' and '.join(missing)}, so resuming would not continue the run "
            "(fresh weights, optimizer, learning-rate schedule or random state); it was saved with "
            "save_only_model=True, or some of its files were removed"
        )
    return None


# The files a checkpoint is judged by, besides trainer_state.json: one of each group (Trainer's names; a DeepSpeed
# checkpoint keeps the optimizer and schedule states in its global_step* folder).
CHECKPOINT_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def missing_checkpoint_files(folder: Path) -> list[str]:
    """What `folder` lacks to resume a run: the weights, the optimizer (`optimizer.pt`) and scheduler
    (`scheduler.pt`) states (unless DeepSpeed holds them in a `global_step*` folder), a random state per process
    (`rng_state*.pth`)."""
    missing = []
    if not any((folder / name).is_file() for name in CHECKPOINT_WEIGHTS):
        missing.append("the weights (model.safetensors or adapter_model.safetensors)")
    if not any(path.is_dir() for path in folder.glob("global_step*")):
        missing += [name for name in ("optimizer.pt", "scheduler.pt") if not (folder / name).is_file()]
    if not any(folder.glob("rng_state*.pth")):
        missing.append("rng_state.pth")
    return missing


def checkpoints_of(output_dir: str | Path) -> list[Path]:
    """The checkpoint-N folders of `output_dir`, by step."""
    found = [p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and p.name[len("checkpoint-") :].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len("checkpoint-") :]))


def last_complete_checkpoint(output_dir: str | Path) -> tuple[Path | None, list[Path]]:
    """The last checkpoint of `output_dir` a run can resume from (or None), and the incomplete ones after it."""
    skipped = []
    for folder in reversed(checkpoints_of(output_dir) if Path(output_dir).is_dir() else []):
        if checkpoint_problem(folder) is None:
            return folder, skipped
        skipped.append(folder)
    return None, skipped


TRUE_WORDS = ("true", "last", "yes", "1")  # the command line's texts for "the last complete checkpoint"
FALSE_WORDS = ("false", "none", "no", "0", "")  # and for "start afresh"


def resolve_resume(resume_from_checkpoint, output_dir: str, option: str = "resume_from_checkpoint"):
    """The one resume resolver, of the trainers' `train` and of the command line: None, or the checkpoint folder to
    resume from. True is the last complete checkpoint-N folder of `output_dir` (incomplete ones after it, cut saves,
    are skipped with a warning naming them); a folder must be a complete checkpoint. No complete checkpoint, or a
    folder that is no complete checkpoint (a cut save, a model folder), is an error naming it, never a silent fresh
    start. Any other value is returned unchanged (`Trainer.train` takes it).

    With `option` the command line's (`--resume_from_checkpoint`), the value is the option's text: 'true'/'last'/
    'yes'/'1' mean True and 'false'/'none'/'no'/'0'/'' None, a text that is no folder is an error, and the errors
    name the option as written there."""
    command_line = option.startswith("--")
    value = resume_from_checkpoint
    if command_line and (value is None or value is False or str(value).strip().lower() in FALSE_WORDS):
        return None
    if value is True or (command_line and str(value).strip().lower() in TRUE_WORDS):
        last, skipped = last_complete_checkpoint(output_dir)
        if last is None:
            cut = (
                f" ({', '.join(map(str, skipped))} {'is' if len(skipped) == 1 else 'are'} incomplete)"
                if skipped
                else ""
            )
            given, leave = (
                (f"{option} true", "leave the option out") if command_line else (f"{option}=True", f"drop {option}")
            )
            raise ValueError(
                f"{given}, but output_dir {output_dir!r} holds no checkpoint-N folder to resume from that is complete"
                f"{cut}. Give the checkpoint folder itself, or {leave} to start afresh."
            )
        for folder in skipped:
            logger.warning(
                "Skipping %s: %s. Resuming from %s; delete the incomplete folder.",
                folder,
                checkpoint_problem(folder),
                last,
            )
        return str(last)
    if command_line and not Path(value).is_dir():
        raise ValueError(
            f"{option} {value!r} is not a folder. Give a checkpoint-N folder written by an earlier run "
            "(e.g. <output_dir>/checkpoint-100), or 'true' for the last one in output_dir."
        )
    if isinstance(value, (str, os.PathLike)) and os.path.isdir(value):
        problem = checkpoint_problem(value)
        if problem is not None:
            last = "'true'" if command_line else "True"
            raise ValueError(
                f"{option} {str(value)!r} cannot be resumed: {problem}. Give a complete checkpoint-N folder, or {last} "
                "for the last complete one in output_dir."
            )
        return str(value)
    return value


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
