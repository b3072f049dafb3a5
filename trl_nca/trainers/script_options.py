"""Options of the training scripts (`trl-nca train` and `examples/*.py`) turned into what the trainer takes: the
student's `from_pretrained` kwargs and the checkpoint to resume from (`resume_checkpoint`, the command line's spelling
of `trl_nca.trainers.checkpoints.resolve_resume`)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import fields
from typing import Any

import torch

from .checkpoints import resolve_resume


logger = logging.getLogger(__name__)

SCRIPT_USAGE = "%(prog)s [--config FILE.yaml] [--OPTION VALUE ...]"
"""The usage line of the training scripts' `--help`: argparse's own would list their ~400 inherited options."""


class ScriptHelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` of the training scripts (`TrlParser(..., formatter_class=ScriptHelpFormatter)`): the description
    (the script's docstring) as written, its paragraphs and command lines kept, and every option with its default."""


DTYPES = ("auto", "bfloat16", "float16", "float32")  # the `dtype` strings TRL's create_model_from_path takes


def check_dtype(kwargs: dict[str, Any], where: str = "dtype") -> None:
    """The `dtype` of a model's init kwargs must be one TRL's loader takes (or a torch dtype), checked before any model
    loads: TRL would refuse it only when it loads the model."""
    dtype = kwargs.get("dtype")
    if dtype is None or isinstance(dtype, torch.dtype) or dtype in DTYPES:
        return
    raise ValueError(f"{where} {dtype!r} is not a dtype the models load in; give one of {', '.join(DTYPES)}.")


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
    check_dtype(kwargs)
    return kwargs


def resume_checkpoint(value: str | bool | None, output_dir: str) -> str | None:
    """`--resume_from_checkpoint` as `Trainer.train` takes it (`resolve_resume` with the command line's texts): None,
    or the complete checkpoint folder to resume from, checked before any model loads."""
    return resolve_resume(value, output_dir, option="--resume_from_checkpoint")
