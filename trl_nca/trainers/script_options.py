"""Options of the training scripts (`trl-nca train` and `examples/*.py`) turned into what the trainer takes: the
student's `from_pretrained` kwargs and the checkpoint to resume from."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any


def student_init_kwargs(args, model_args) -> dict[str, Any]:
    """`from_pretrained` kwargs of the student: `args.model_init_kwargs` (of an `NCAConfig`), completed by
    `trl.ModelConfig`'s `dtype`, `model_revision` and `attn_implementation`. A key set in both places to different
    values is an error, unless the ModelConfig field still has its default (then the explicit `model_init_kwargs`
    entry wins): nothing the user wrote is silently overridden."""
    kwargs = dict(args.model_init_kwargs or {})
    defaults = {f.name: f.default for f in fields(type(model_args))}
    given = {
        "dtype": ("dtype", model_args.dtype or "auto"),
        "revision": ("model_revision", model_args.model_revision),
        "attn_implementation": ("attn_implementation", model_args.attn_implementation),
    }
    for key, (option, value) in given.items():
        if key not in kwargs:
            kwargs[key] = value
        elif kwargs[key] != value and getattr(model_args, option) != defaults[option]:
            raise ValueError(
                f"`{option}: {getattr(model_args, option)}` and `model_init_kwargs: {{{key}: {kwargs[key]}}}` "
                "disagree; set it in one place only."
            )
    return kwargs


def resume_checkpoint(value: str | bool | None, output_dir: str) -> str | bool | None:
    """`--resume_from_checkpoint` as `Trainer.train` takes it: None, True (the last checkpoint in `output_dir`), or a
    checkpoint folder. 'true'/'last' mean True and 'false'/'none'/'' mean None; a folder that does not exist, or
    'true' when `output_dir` has no checkpoint, is an error (never a silent restart from step 0)."""
    from transformers.trainer_utils import get_last_checkpoint

    if value is None or value is False:
        return None
    if value is True or str(value).strip().lower() in ("true", "last", "yes", "1"):
        if not Path(output_dir).is_dir() or get_last_checkpoint(output_dir) is None:
            raise ValueError(
                f"--resume_from_checkpoint true, but output_dir {output_dir!r} holds no checkpoint-N folder to resume "
                "from. Give the checkpoint folder itself, or leave the option out to start afresh."
            )
        return True
    if str(value).strip().lower() in ("false", "none", "no", "0", ""):
        return None
    if not Path(value).is_dir():
        raise ValueError(
            f"--resume_from_checkpoint {value!r} is not a folder. Give a checkpoint-N folder written by an earlier run "
            "(e.g. <output_dir>/checkpoint-100), or 'true' for the last one in output_dir."
        )
    return str(value)
