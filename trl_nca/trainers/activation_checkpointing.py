"""Gradient (activation) checkpointing as both trainers run it: reentrant or not, decided once at setup.

Why it matters. NCA runs two student forwards (the no-context and the context view) before one backward. With
*reentrant* checkpointing every checkpointed layer call runs a nested backward of its own, so a weight used by both
views reaches its gradient hook twice in one backward. DDP's reducer and DeepSpeed ZeRO-2/3's reduce buckets expect
one call per weight and step: DDP and ZeRO-3 fail (ZeRO-3 asserts in `__reduce_and_partition_ipg_grads`, ZeRO-2
reports a parameter "already reduced"), or, when the bucket is flushed between the two calls, the second reduction
overwrites the first and the step trains on a wrong gradient without an error. *Non-reentrant* checkpointing records
one graph, and each weight's hook fires once.

What the trainers do (`settle_checkpointing`, after the base trainer's `__init__`):

    the user set `use_reentrant` (gradient_checkpointing_kwargs / activation_checkpointing_kwargs)   kept
    unset, PEFT + ZeRO-3 with deepspeed < 0.19.3                                                     reentrant
    unset, anywhere else                                                                             non-reentrant

TRL 1.16 forces `use_reentrant=True` for PEFT + ZeRO-3 + checkpointing, a workaround for a DeepSpeed error with
frozen weights that DeepSpeed fixed in 0.19.3; where the installed DeepSpeed has the fix and the user did not ask for
reentrant checkpointing, the trainers keep it non-reentrant and say so once. An unset `use_reentrant` also means
reentrant in transformers < 5.23 and non-reentrant after; it is written down explicitly here, so every version runs
the same way, and the same kwargs are handed to TRL's `unwrap_model_for_generation`, which re-enables checkpointing
after each sampling call.

Where checkpointing ends up reentrant under DDP (several processes) or DeepSpeed (any process count), the two views
run as one forward (`NCAConfig.joint_forward`); `nca_joint_forward=False` there is refused before training.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from importlib import metadata
from typing import Any

from packaging.version import Version
from peft import PeftModel


logger = logging.getLogger(__name__)

# The DeepSpeed release that fixed the frozen-weight error behind TRL's forced `use_reentrant=True`.
DEEPSPEED_NON_REENTRANT_FIX = Version("0.19.3")


def checkpointing_kwargs(args) -> dict[str, Any]:
    """The checkpointing kwargs in force: transformers >= 5.23 reads `activation_checkpointing_kwargs`, older ones
    `gradient_checkpointing_kwargs`; TRL writes only the old name."""
    new = getattr(args, "activation_checkpointing_kwargs", None)
    old = getattr(args, "gradient_checkpointing_kwargs", None)
    return dict(old if old is not None else (new or {}))


def requested_reentrant(args) -> bool | None:
    """The user's own `use_reentrant` (None when unset), read before the base trainer's `__init__` changes it."""
    return checkpointing_kwargs(args).get("use_reentrant")


def reentrant_for(requested: bool | None, peft_zero3: bool, deepspeed_version: Version | None) -> bool:
    """The table of the module docstring."""
    if requested is not None:
        return bool(requested)
    return peft_zero3 and deepspeed_version is not None and deepspeed_version < DEEPSPEED_NON_REENTRANT_FIX


def _deepspeed_version() -> Version | None:
    try:
        return Version(metadata.version("deepspeed"))
    except metadata.PackageNotFoundError:
        return None


def settle_checkpointing(trainer, requested: bool | None) -> None:
    """Decide reentrant or not (module docstring), write it into the training arguments under both names, re-enable
    the student's checkpointing with it where the base trainer already turned it on, and refuse a setting that could
    not be exact together with it."""
    args = trainer.args
    if not args.gradient_checkpointing:
        return
    zero3 = args.deepspeed_plugin is not None and args.deepspeed_plugin.zero_stage == 3
    student = trainer.accelerator.unwrap_model(trainer.model)
    peft = isinstance(student, PeftModel)
    reentrant = reentrant_for(requested, peft and zero3, _deepspeed_version())
    forced_by_trl = checkpointing_kwargs(args).get("use_reentrant")
    if requested is None and forced_by_trl and not reentrant:
        logger.warning(
            "Gradient checkpointing stays non-reentrant: TRL sets use_reentrant=True for PEFT + DeepSpeed ZeRO-3 as a "
            "workaround for a DeepSpeed error fixed in 0.19.3 (installed: %s), and reentrant checkpointing would make "
            "NCA's two views one forward. Set gradient_checkpointing_kwargs={'use_reentrant': True} to use it anyway.",
            _deepspeed_version(),
        )
    kwargs = {**checkpointing_kwargs(args), "use_reentrant": reentrant}
    args.gradient_checkpointing_kwargs = kwargs
    if hasattr(args, "activation_checkpointing_kwargs"):
        args.activation_checkpointing_kwargs = dict(kwargs)
    if _checkpointing_on(student):
        _enable(student, kwargs)
    check_joint_forward(args, reentrant)


def _checkpointing_on(model) -> bool:
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def _enable(model, kwargs: dict[str, Any]) -> None:
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.23
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def needs_joint_forward(args, reentrant: bool) -> bool:
    """Whether the views must run as one forward to be exact: reentrant checkpointing under DDP or DeepSpeed."""
    distributed = args.world_size > 1 or args.deepspeed_plugin is not None
    return bool(args.gradient_checkpointing and reentrant and distributed)


def check_joint_forward(args, reentrant: bool) -> None:
    """`nca_joint_forward=False` where the views must be one forward to be exact: one line, before training."""
    if args.nca_joint_forward is False and args.nca_beta > 0 and needs_joint_forward(args, reentrant):
        launcher = "DeepSpeed" if args.deepspeed_plugin is not None else "DDP"
        raise ValueError(
            f"nca_joint_forward=False cannot be exact with reentrant gradient checkpointing under {launcher}: each "
            "weight would reach its gradient hook once per view, which the gradient reduction counts twice or drops. "
            "Set nca_joint_forward=None (both views as one forward), or gradient_checkpointing_kwargs="
            "{'use_reentrant': False}."
        )


# transformers >= 5.23 deprecates `gradient_checkpointing_enable/disable` and `is_gradient_checkpointing` for the
# `activation_checkpointing_*` names (FutureWarning, removal in v6). Two callers outside this package still use the old
# names on every run: PEFT's `PeftModel.__init__` (reached through TRL's `get_peft_model` in the base trainers'
# `__init__`, once per student) and TRL 1.16's `unwrap_model_for_generation` (around every sampling call). The user can
# do nothing about either, so exactly these warnings are ignored around exactly those calls.
_OLD_CHECKPOINTING_NAMES = r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated"


@contextmanager
def quiet_old_checkpointing_names():
    """Ignore transformers' FutureWarning for the old checkpointing names (see above) inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _OLD_CHECKPOINTING_NAMES, FutureWarning)
        yield
