"""Teacher resolution: a separate model, the student's frozen initial weights, or the live student.

With a LoRA student whose adapter starts as an exact no-op (standard init: B = 0), the initial model is the student
with its adapter disabled, so self-distillation needs no second copy of the weights. When disabling the adapter does
not give the initial model (an adapter that was already trained, PiSSA/OLoRA-style inits that move weights into the
adapter, random B), the teacher is a frozen merged copy of the student as it was at the start.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn


class SelfTeacher(nn.Module):
    """The student used as its own teacher, with no parameters of its own.

    `mode="initial"`: the student with its adapter disabled (its initial weights). `mode="live"`: the current student
    (the teacher then reads the context view with the current weights, detached).
    """

    def __init__(self, get_student: Callable[[], nn.Module], config, mode: str = "initial"):
        super().__init__()
        self._get_student = (
            get_student  # a callable, not a submodule: the student's parameters are not registered twice
        )
        self.config = config
        self.mode = mode

    @contextmanager
    def active(self) -> Iterator[nn.Module]:
        """Yield the model that acts as teacher for the duration of the block."""
        student = self._get_student()
        with student.disable_adapter() if self.mode == "initial" else nullcontext():
            yield student

    def forward(self, *args, **kwargs):
        with torch.no_grad(), self.active() as model:
            return model(*args, **kwargs)


def is_peft_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def adapter_is_identity(model: nn.Module) -> bool:
    """True when every LoRA update of `model` is exactly zero, so disabling the adapter changes nothing."""
    found, tensors = False, []
    for module in model.modules():
        for name in ("lora_B", "lora_embedding_B"):
            params = getattr(module, name, None)
            if params is None or len(params) == 0:
                continue
            found = True
            for p in params.values() if isinstance(params, (nn.ModuleDict, nn.ParameterDict)) else [params]:
                tensors.append(p.weight if hasattr(p, "weight") else p)
    with gathered(tensors):  # partitioned by ZeRO-3, a local shard could be all zeros while the matrix is not
        return found and not any(torch.count_nonzero(t.detach()) > 0 for t in tensors)


def check_peft_self_teacher(peft_config) -> None:
    """Only LoRA adapters can give the initial model back (disabled, or merged into a frozen copy)."""
    peft_type = str(getattr(peft_config, "peft_type", "")).split(".")[-1].upper()
    if peft_type != "LORA":
        raise ValueError(
            f"Self-distillation (teacher_model=None) with a {peft_type or type(peft_config).__name__} adapter cannot "
            "recover the student's initial model: disabling it is not a no-op and it cannot be merged. Use a LoRA "
            "config, or pass the initial model explicitly as `teacher_model`."
        )


def gathered(params: Iterable[torch.Tensor]):
    """A context in which every parameter that DeepSpeed ZeRO-3 partitioned holds its full value (read-only);
    nothing to do for other parameters."""
    partitioned = [p for p in params if hasattr(p, "ds_id")]
    if not partitioned:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen, eval-mode copy of `model` as it is now; a PEFT model is merged into a plain model.

    Parameters partitioned by DeepSpeed ZeRO-3 (a model loaded or trained under ZeRO-3) are gathered and the copy gets
    plain parameters holding their full values (a whole model in memory until DeepSpeed partitions the copy in turn).
    """
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_id")]
    with gathered(partitioned):
        # deepcopy takes these from its memo instead of copying the DeepSpeed parameter (and its empty local data)
        memo = {id(p): nn.Parameter(p.detach().clone(), requires_grad=False) for p in partitioned}
        teacher = copy.deepcopy(model, memo)
    if is_peft_model(teacher):
        teacher = teacher.merge_and_unload()
    for module in teacher.modules():
        # A forward patched onto the instance (e.g. TRL's fused LM head) closes over the ORIGINAL module's forward,
        # which deepcopy does not rebind: left in place, calling the copy would run the student. Use the class forward.
        patched = module.__dict__.get("forward")
        if patched is not None and getattr(patched, "__func__", patched) is not type(module).forward:
            del module.forward
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher
