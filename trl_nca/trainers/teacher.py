"""Teacher resolution: a separate model, the student's frozen initial weights, or the live student.

With a LoRA student whose adapter starts as an exact no-op (standard init: B = 0), the initial model is the student
with its adapter disabled, so self-distillation needs no second copy of the weights. When disabling the adapter does
not give the initial model (an adapter that was already trained, PiSSA/OLoRA-style inits that move weights into the
adapter, random B), the teacher is a frozen merged copy of the student as it was at the start.

Resolution has two phases, both here: `resolve_teacher` runs before `GKDTrainer.__init__` (which needs the teacher),
and `replacement_teacher` after it, because TRL applies a `peft_config` to the student inside that `__init__`: only then
can the adapter be inspected.

How the objective and the trainers use a teacher is the `Teacher` protocol, which each kind answers for itself
instead of being asked what it is: a separate model (`ModelTeacher`: a teacher given by the user, or the frozen copy),
the student with its adapter disabled (`SelfTeacher(mode="initial")`) and the live student
(`SelfTeacher(mode="live")`). `as_teacher` gives the protocol of whatever the trainer holds as its teacher model.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol, runtime_checkable

import torch
from peft import PeftModel
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.models.utils import _ForwardRedirection

from ..core.prefix import tensor_versions


logger = logging.getLogger(__name__)


@runtime_checkable
class Teacher(Protocol):
    """What the objective and the trainers ask of a teacher; each kind answers for itself.

    `owns_weights`: the teacher has weights of its own, which the trainer places (an engine under DeepSpeed), checks
    (output rows, vocabulary size) and samples from through its own wrapper; False for a self-teacher, which calls the
    student. `live`: the teacher is the current student, so it reads the student's own context view (detached) when
    that view has run. `active()`: a block in which the model that scores is ready, yielded (the student with its
    adapter disabled, or the teacher model in evaluation mode). `weights_key(model)`: a key that changes whenever the
    weights the teacher's forward uses may have changed, so its shared-prefix cache is kept across steps only while
    they stay the same (None: never kept). `call(fn, *args)`: `fn(*args)` run as the teacher's forward (through the
    engine a separate teacher was prepared in, so the engine's hooks run)."""

    owns_weights: bool
    live: bool

    def active(self) -> AbstractContextManager[nn.Module]: ...

    def weights_key(self, model: nn.Module) -> Hashable | None: ...

    def call(self, fn: Callable[..., Any], *args: Any) -> Any: ...


@runtime_checkable
class TopKTeacher(Protocol):
    """A teacher known only by its top-k tokens (a teacher behind a server, `trl_nca.trainers.served_teacher`): the
    objective asks it for `top_k_log_probs(view, completion_mask)`, a `trl_nca.core.losses.TeacherTopK` of the valid
    completion tokens of the context view, instead of running its forward."""

    def top_k_log_probs(self, view, completion_mask: torch.Tensor): ...


class SelfTeacher(nn.Module):
    """The student used as its own teacher, with no parameters of its own (a `Teacher`).

    `mode="initial"`: the student with its adapter disabled (its initial weights). `mode="live"`: the current student
    (the teacher then reads the context view with the current weights, detached).
    """

    owns_weights = False

    def __init__(self, get_student: Callable[[], nn.Module], config, mode: str = "initial"):
        super().__init__()
        self._get_student = (
            get_student  # a callable, not a submodule: the student's parameters are not registered twice
        )
        self.config = config
        self.mode = mode
        self.live = mode == "live"

    @contextmanager
    def active(self) -> Iterator[nn.Module]:
        """Yield the model that acts as teacher for the duration of the block."""
        student = self._get_student()
        with nullcontext() if self.live else student.disable_adapter():
            yield student

    def weights_key(self, model: nn.Module) -> Hashable | None:
        """None for the live student (its weights change every step). The initial self-teacher is the student with its
        LoRA adapter disabled: every parameter but the adapter's own (and PEFT's trainable copies of
        `modules_to_save`, unused while it is disabled) counts, trained biases included."""
        if self.live:
            return None
        used = [p for n, p in model.named_parameters() if "lora_" not in n and ".modules_to_save." not in n]
        return (id(model), model.training, tensor_versions(used), tensor_versions(model.buffers()))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)  # the student is already wrapped by the trainer's engine

    def forward(self, *args, **kwargs):
        with torch.no_grad(), self.active() as model:
            return model(*args, **kwargs)


class ModelTeacher:
    """A teacher with weights of its own (a `Teacher`): a separate model, or the frozen copy of the student.
    `wrapper` is the engine (or other module) it was prepared in, when it holds the model as `.module`: its forwards
    then run through it (TRL's forward redirection), so DeepSpeed's hooks on the teacher's top-level module run
    (ZeRO-3 resets its parameter trace and prefetches there)."""

    owns_weights = True
    live = False

    def __init__(self, model: nn.Module, wrapper: nn.Module | None = None):
        self.model = model
        self.wrapper = wrapper if wrapper is not model and getattr(wrapper, "module", None) is model else None

    @contextmanager
    def active(self) -> Iterator[nn.Module]:
        self.model.eval()
        yield self.model

    def weights_key(self, model: nn.Module) -> Hashable | None:
        return (id(model), model.training, tensor_versions(model.parameters()), tensor_versions(model.buffers()))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.wrapper is None:
            return fn(*args)
        # the wrapper's forward runs, and inside it `fn` in place of the teacher's own forward, so the engine sees one
        # ordinary forward of its module (as TRL's DistillationTrainer does)
        return _ForwardRedirection()(self.wrapper, self.model, fn, *args)


def as_teacher(teacher: nn.Module, wrapper: nn.Module | None = None) -> Teacher:
    """The `Teacher` of a trainer's teacher model: a self-teacher is one already; any other model is a `ModelTeacher`
    (scored through `wrapper`, the engine it was prepared in, when there is one)."""
    return teacher if isinstance(teacher, Teacher) else ModelTeacher(teacher, wrapper)


def is_peft_model(model) -> bool:
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
    import deepspeed  # an optional dependency: only reached with ZeRO-3 partitioned parameters

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A frozen, eval-mode copy of `model` as it is now; a PEFT model is merged into a plain model.

    Parameters partitioned by DeepSpeed ZeRO-3 (a model loaded or trained under ZeRO-3) are gathered one module at a
    time (its own parameters, not its children's), so at most one module's full weights are gathered at once (an
    embedding or the output layer) besides the copy being built; the copy gets plain parameters holding their full
    values (the whole model in memory until DeepSpeed partitions the copy in turn). Tied parameters stay tied.
    """
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_id")]
    # deepcopy takes these empty placeholders from its memo instead of copying the DeepSpeed parameter (and its empty
    # local data); each placeholder is filled below while its module's parameters are gathered. A parameter shared by
    # two modules (tied embeddings) has one placeholder, so the copy keeps the tie.
    memo = {
        id(p): nn.Parameter(torch.empty(0, dtype=p.dtype, device=p.device), requires_grad=False) for p in partitioned
    }
    teacher = copy.deepcopy(model, memo)
    filled: set[int] = set()
    for module in model.modules():
        own = [p for p in module._parameters.values() if p is not None and id(p) in memo and id(p) not in filled]
        if not own:
            continue
        with gathered(own):
            for p in own:
                memo[id(p)].data = p.detach().clone()
                filled.add(id(p))
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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_teacher_tokenizer(teacher) -> object | None:
    """The teacher's tokenizer when it can be found without guessing, else None.

    A path (or Hub id) is loaded from there; a model instance from the folder it was loaded from, when that folder holds
    tokenizer files, or from the local Hub cache. A self-teacher shares the student's tokenizer (None). A teacher path
    without a tokenizer gives a warning, since its vocabulary then cannot be compared with the student's.
    """
    if teacher is None or (isinstance(teacher, nn.Module) and not as_teacher(teacher).owns_weights):
        return None
    if isinstance(teacher, (str, os.PathLike)):
        try:
            return AutoTokenizer.from_pretrained(teacher)
        except (OSError, ValueError, TypeError) as error:
            logger.warning(
                "Could not load a tokenizer from the teacher %s (%s), so its vocabulary was not compared with the "
                "student's. Pass it as `teacher_processing_class` to check it.",
                teacher,
                str(error).splitlines()[0] if str(error) else type(error).__name__,
            )
            return None
    source = getattr(getattr(teacher, "config", None), "_name_or_path", None)
    if not source:
        return None
    if os.path.isdir(source):
        if not any(os.path.isfile(os.path.join(source, name)) for name in TOKENIZER_FILES):
            return None
        kwargs = {}
    else:
        kwargs = {"local_files_only": True}  # a Hub id: only what is cached, never a download
    try:
        return AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError, TypeError):
        return None


def check_same_vocabulary(
    student_tokenizer, teacher_tokenizer, names: tuple[str, str] = ("student", "teacher")
) -> None:
    """The teacher must give every student token the same id: the losses compare distributions id by id.

    Tokens the teacher has beyond the student's vocabulary are allowed (the student never produces them). `names`
    are the two models' roles in the message (`trl-nca analyze` compares a model with its reference, not a teacher).
    """
    student, teacher = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if student == teacher:
        return
    differing = [(token, i, teacher.get(token)) for token, i in sorted(student.items(), key=lambda kv: kv[1])]
    differing = [d for d in differing if d[1] != d[2]]
    if not differing:
        return
    first, second = names
    examples = ", ".join(
        f"{token!r} is {i} for the {first} and {'absent' if j is None else j} for the {second}"
        for token, i, j in differing[:3]
    )
    if names != ("student", "teacher"):
        raise ValueError(
            f"The tokenizer of the {second} maps {len(differing)} of the {first}'s {len(student)} tokens to other ids "
            f"({first} vocabulary {len(student)} tokens, {second} {len(teacher)}): {examples}. The measures compare "
            "the two models' next-token distributions id by id, so both must use one tokenizer (same model family)."
        )
    raise ValueError(
        f"The teacher's tokenizer maps {len(differing)} of the student's {len(student)} tokens to other ids "
        f"(student vocabulary {len(student)} tokens, teacher {len(teacher)}): {examples}. The losses compare the two "
        "models' next-token distributions id by id, so the teacher must use the student's tokenizer (same model "
        "family). Use such a teacher, or pass its real tokenizer as `teacher_processing_class` if the one found "
        f"({getattr(teacher_tokenizer, 'name_or_path', '?')!r}) is not it."
    )


def load_teacher(name: str, init_kwargs: dict[str, Any] | None, trust_remote_code: bool) -> nn.Module:
    """A teacher given by name, loaded with `teacher_model_init_kwargs` as GKDTrainer would load it."""
    kwargs = dict(init_kwargs or {})
    if isinstance(kwargs.get("dtype"), str) and kwargs["dtype"] != "auto":
        kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    kwargs.setdefault("trust_remote_code", trust_remote_code)
    return AutoModelForCausalLM.from_pretrained(name, **kwargs)


def resolve_teacher(
    teacher_model: nn.Module | str | None,
    student: nn.Module,
    *,
    student_tokenizer,
    teacher_tokenizer=None,
    self_teacher: str,
    peft_config=None,
    get_student: Callable[[], nn.Module],
    init_kwargs: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
) -> nn.Module:
    """The teacher before the trainer's init (phase 1; `teacher_model` already resolved by name).

    A teacher given by name is loaded here (so its output layer can be checked before GKD's own check), after its
    tokenizer (`teacher_tokenizer`, else the one found next to it) was compared with the student's. Without a
    teacher: a `SelfTeacher` (`self_teacher="live"`, or a PEFT student: its adapter disabled), else a frozen copy.
    `get_student` returns the trainer's current student (the PEFT-wrapped one once the trainer exists).
    """
    found = teacher_tokenizer or load_teacher_tokenizer(teacher_model)
    if found is not None:
        check_same_vocabulary(student_tokenizer, found)
    elif isinstance(teacher_model, nn.Module) and as_teacher(teacher_model).owns_weights:
        logger.warning(
            "The teacher model's tokenizer could not be found (its config names %r), so the vocabulary check was "
            "skipped: the losses assume the teacher gives every token the student's id. Pass the teacher's tokenizer "
            "as `teacher_processing_class` to check it.",
            getattr(getattr(teacher_model, "config", None), "_name_or_path", None) or "no folder",
        )
    if isinstance(teacher_model, str):
        return load_teacher(teacher_model, init_kwargs, trust_remote_code)
    if teacher_model is not None:
        return teacher_model
    if self_teacher == "live" or peft_config is not None or is_peft_model(student):
        if self_teacher == "initial":
            check_peft_self_teacher(peft_config or student.peft_config[student.active_adapter])
        return SelfTeacher(get_student, student.config, mode=self_teacher)
    return frozen_copy(student)


def replacement_teacher(teacher: nn.Module, student: nn.Module) -> nn.Module | None:
    """Phase 2, after the trainer's init has wrapped the student: a frozen merged copy of the student as it is now
    when the teacher is its initial weights but disabling its adapter would not give them (a trained adapter, a
    PiSSA-style init, random B); None when the teacher stays as it is."""
    if isinstance(teacher, SelfTeacher) and not teacher.live and not adapter_is_identity(student):
        return frozen_copy(student)
    return None


def output_rows(model: nn.Module) -> int:
    """Rows of a model's output layer (under ZeRO-3, of the full weight)."""
    weight = model.get_output_embeddings().weight
    return getattr(weight, "ds_shape", weight.shape)[0]


def check_output_rows(student: nn.Module, teacher: nn.Module, tokenizer) -> tuple[int, int]:
    """(common, widest) output rows of student and teacher; the common rows must cover every token of the tokenizer.

    Models sharing a tokenizer may pad their output layers differently (Qwen2.5-7B: 152064 rows, Qwen2.5-3B: 151936,
    for 151665 tokens); the divergences then use the first `common` rows (see `trl_nca.core.losses`).
    """
    student_rows = output_rows(student)
    teacher_rows = output_rows(teacher) if as_teacher(teacher).owns_weights else student_rows
    common, widest = min(student_rows, teacher_rows), max(student_rows, teacher_rows)
    if common < len(tokenizer):
        raise ValueError(
            f"The student's output layer has {student_rows} rows and the teacher's {teacher_rows}; the divergences "
            f"use their first {common} rows, which do not cover the tokenizer's {len(tokenizer)} tokens (ids "
            f"{common}..{len(tokenizer) - 1} would have no probability). Student and teacher must share the "
            "student's tokenizer: use a teacher of the same model family, or resize the embeddings of the smaller "
            "model to len(tokenizer)."
        )
    return common, widest
