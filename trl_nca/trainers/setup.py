"""What both trainers do around their base trainer's `__init__`, written once and called by name from each trainer's
own `__init__`: before it, the config checked (`checked_config`) and the student, its tokenizer, the teacher and the
token budgets resolved (`resolve_models`), with the checks both run; after it, once the base trainer has wrapped the
student (PEFT, accelerate), the NCA pieces (`setup_nca`): the teacher placed, the objective, the step loss, the step
statistics and the anchor step.
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType
from peft import PeftModel, PromptLearningConfig
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase
from trl.models.utils import prepare_deepspeed
from trl.trainer.utils import create_model_from_path

from ..core.launch import placed_init_kwargs, refuse_data_parallel, refuse_fsdp
from ..core.prefix import active_dropout
from ..core.stall import StallMonitor
from ..models.names import resolve_model_name_or_path
from .activation_checkpointing import requested_reentrant, settle_checkpointing
from .anchor import AnchorStep
from .data import Limits, check_examples, check_tokenizer
from .objective import NCAObjective, NCASettings, anchor_schedule, trains_most_weights
from .stats import StepStats
from .step_loss import StepLoss
from .teacher import as_teacher, check_output_rows, replacement_teacher, resolve_teacher


logger = logging.getLogger(__name__)

# The paper both trainers cite in their model cards (TRL reads a trainer's `_paper`).
NCA_PAPER = {
    "title": "When Context Returns: Toward Robust Internalization in On-Policy Distillation",
    "id": "2606.11627",
    # docstyle-ignore
    "citation": textwrap.dedent("""\
        @article{wang2026when,
            title        = {{When Context Returns: Toward Robust Internalization in On-Policy Distillation}},
            author       = {Xun Wang and Ruishuo Chen and Zhuoran Li and Yu Chen and Longbo Huang},
            year         = 2026,
            journal      = {arXiv preprint arXiv:2606.11627},
        }"""),
}


@dataclass
class TrainerModels:
    """The models and budgets a trainer hands to its base class: the built `student`, its `tokenizer`, the `teacher`
    (phase 1 of `resolve_teacher`), the output rows both models share and the wider one's (`common_rows`), and the
    token budgets (`limits`)."""

    student: nn.Module
    tokenizer: PreTrainedTokenizerBase
    teacher: nn.Module
    common_rows: tuple[int, int]
    limits: Limits
    requested_reentrant: bool | None = None  # the user's `use_reentrant`, before the base trainer changes it


def resolve_models(
    trainer: str,
    args,
    model: nn.Module | str | None,
    teacher_model: nn.Module | str | None,
    *,
    processing_class,
    teacher_processing_class,
    peft_config,
    get_student: Callable[[], nn.Module],
    datasets: Iterable[tuple[str, Any]],
    max_new_tokens: int,
    max_length: int | None = None,
    teacher_init_kwargs: dict[str, Any] | None = None,
    text_only: bool = False,
) -> TrainerModels:
    """Everything before the base trainer's `__init__`, in the order that fails cheapest first.

    The launch is checked (`checked_launch`) and the `datasets` ((split, dataset) pairs) are checked before any model
    loads; then the student (a name is loaded with `args.model_init_kwargs`, placed on this process's device), its
    tokenizer (loaded from where the student came from when not given; with `text_only` it must be a tokenizer, not a
    processor), the teacher (`teacher_model`, else `args.teacher_model_name_or_path`, loaded with
    `teacher_init_kwargs`; None: a self-teacher, see `resolve_teacher`; `get_student` returns the trainer's student
    once it is wrapped), their common output rows and the token budgets. One process that sees several GPUs is refused
    once the student is built (`refuse_data_parallel`): Trainer would wrap it in `nn.DataParallel`.
    """
    model = resolve_model_name_or_path(model, "Student model")
    reentrant = requested_reentrant(args)
    state = checked_launch(args, trainer)
    for split, dataset in datasets:  # empty or malformed datasets fail here, before any model is loaded
        check_examples(dataset, args.context_spec, split)
    if teacher_model is None and args.teacher_model_name_or_path is not None:
        teacher_model = args.teacher_model_name_or_path
    refuse_unused_teacher_init_kwargs(trainer, args, teacher_model)
    model, model_id = _setup_student(trainer, args, model, state)
    processing_class = _setup_tokenizer(trainer, args, processing_class, model, model_id, text_only)

    teacher_model = resolve_model_name_or_path(teacher_model, "Teacher model")
    teacher = resolve_teacher(
        teacher_model,
        model,
        student_tokenizer=processing_class,
        teacher_tokenizer=teacher_processing_class,
        self_teacher=args.self_teacher,
        peft_config=peft_config,
        get_student=get_student,
        init_kwargs=placed_init_kwargs(teacher_init_kwargs, "the teacher", state, args.device),
        trust_remote_code=args.trust_remote_code,
    )
    common_rows = check_output_rows(model, teacher, processing_class)
    limits = Limits(
        max_new_tokens=max_new_tokens,
        max_length=max_length,
        max_context_length=args.max_context_length or position_limit(model, teacher),
        truncate_context=args.truncate_context,
    )
    return TrainerModels(model, processing_class, teacher, common_rows, limits, reentrant)


def _setup_student(trainer: str, args, model, state) -> tuple[nn.Module, str | None]:
    """The student of `resolve_models`, loaded when given by name, and where it came from (None when it does not
    say); one process that sees several GPUs is refused here, before the teacher loads."""
    model_id = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
    if isinstance(model, str):
        # TRL's trainers pass `trust_remote_code` on to every model and tokenizer they load by name
        init_kwargs = {"trust_remote_code": args.trust_remote_code, **(args.model_init_kwargs or {})}
        model = create_model_from_path(model, **placed_init_kwargs(init_kwargs, "the student", state, args.device))
        clear_used_model_init_kwargs(args)
    refuse_data_parallel(args, trainer, model)  # before the teacher loads
    return model, model_id


def clear_used_model_init_kwargs(args) -> None:
    """`model_init_kwargs` have loaded the student here; the base trainer gets the built model, and TRL's trainers
    warn that such kwargs "will be ignored" when the model is already built. They are cleared from the training
    arguments, with one line saying so."""
    if args.model_init_kwargs is not None:
        logger.info(
            "The student was loaded with model_init_kwargs=%r; the training arguments' model_init_kwargs is now None "
            "(the base trainer gets the loaded model).",
            args.model_init_kwargs,
        )
        args.model_init_kwargs = None


def _setup_tokenizer(trainer: str, args, processing_class, model, model_id: str | None, text_only: bool):
    """The student's tokenizer of `resolve_models`: the one given, else loaded from where the student came from;
    with `text_only` a tokenizer, not a processor; its pad token set and its chat template checked."""
    if processing_class is None:
        if not model_id:
            raise ValueError("Pass the tokenizer as `processing_class`; the model does not say where it came from.")
        processing_class = AutoTokenizer.from_pretrained(model_id, trust_remote_code=args.trust_remote_code)
    if text_only and not isinstance(processing_class, PreTrainedTokenizerBase):
        raise TypeError(
            f"{trainer} is text-only: `processing_class` must be a tokenizer, got a "
            f"{type(processing_class).__name__}. Pass the processor's `.tokenizer` for a text-only student."
        )
    set_pad_token(processing_class, model, getattr(args, "pad_token", None))
    check_tokenizer(processing_class)
    return processing_class


def refuse_unused_teacher_init_kwargs(trainer: str, args, teacher_model) -> None:
    """`teacher_model_init_kwargs` load a teacher given by name; with a teacher that is already a model (or none: a
    self-teacher is the student's own weights) they would be ignored, so they are refused, as TRL's trainers do."""
    if args.teacher_model_init_kwargs is None or isinstance(teacher_model, str):
        return
    teacher = (
        "no teacher (the self-teacher is built from the student)"
        if teacher_model is None
        else (f"a teacher that is already a model ({type(teacher_model).__name__})")
    )
    raise ValueError(
        f"{trainer} got `teacher_model_init_kwargs` {args.teacher_model_init_kwargs!r} with {teacher}; they apply "
        "only to a teacher loaded by name. Pass the teacher's name or path as `teacher_model` (or "
        "`teacher_model_name_or_path`), or drop `teacher_model_init_kwargs`."
    )


def set_pad_token(tokenizer, model: nn.Module, pad_token: str | None) -> None:
    """The pad token as TRL's trainers choose it: `pad_token` when given (SFTConfig's field, which GKDConfig has),
    else the tokenizer's, else its end-of-sequence token; when it is set here, the model's config and generation
    config follow it (Trainer would otherwise realign them at train time and report a change the user did not make).
    Padding is tracked by masks, never by token id, so a pad token equal to the end-of-sequence token is safe."""
    chosen = pad_token or (None if tokenizer.pad_token is not None else tokenizer.eos_token)
    if chosen is None or chosen == tokenizer.pad_token:
        return
    if chosen not in tokenizer.get_vocab():
        raise ValueError(
            f"pad_token={chosen!r} is not a token of the tokenizer ({type(tokenizer).__name__}, {len(tokenizer)} "
            "tokens). Name a token of its vocabulary (e.g. its end-of-sequence token), or leave `pad_token` unset."
        )
    tokenizer.pad_token = chosen
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def refuse_prompt_learning(model: nn.Module) -> None:
    """Prompt-learning adapters (prompt tuning, prefix tuning, P-tuning) add virtual tokens in `PeftModel.forward`,
    which the loss bypasses (it runs the backbone and reads hidden states): refused, as DistillationTrainer does."""
    model = getattr(model, "module", model)
    if isinstance(model, PeftModel) and any(isinstance(c, PromptLearningConfig) for c in model.peft_config.values()):
        raise ValueError(
            "Prompt-learning PEFT methods (prompt tuning, prefix tuning, P-tuning) are not supported: their virtual "
            "tokens are added in `PeftModel.forward`, which the loss bypasses (it runs the backbone on both views), so "
            "the adapter would never be trained. Use a weight adapter such as LoRA."
        )


def position_limit(model: nn.Module, teacher: nn.Module | str) -> int | None:
    """The smaller of the student's and teacher's `max_position_embeddings`, if they declare one."""
    configs = [model.config]
    if isinstance(teacher, str):
        configs.append(AutoConfig.from_pretrained(teacher))
    elif hasattr(teacher, "config"):
        configs.append(teacher.config)
    limits = []
    for config in configs:
        config = config.get_text_config()
        if getattr(config, "max_position_embeddings", None):
            limits.append(int(config.max_position_embeddings))
    return min(limits) if limits else None


def checked_launch(args, trainer: str):
    """The launch's `accelerate.PartialState`, checked before any model loads: FSDP is refused
    (`trl_nca.core.launch.refuse_fsdp`) and every launched process must take part (`check_process_count`). Reading
    `args.device` sets up the process group, as `Trainer` would a moment later."""
    _ = args.device
    state = args.distributed_state or PartialState()
    refuse_fsdp(args, trainer)
    check_process_count(state)
    return state


def check_process_count(accelerator) -> None:
    """Every process must take part in one distributed run. Two silent failures of accelerate on a machine without
    GPUs are refused: DeepSpeed joined the processes but accelerate counts one (every process then trains on the same
    rows), or accelerate counts them but sets up no distributed training (each process trains its own copy, FSDP on a
    CPU)."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return
    world = torch.distributed.get_world_size()
    if world != accelerator.num_processes:
        raise RuntimeError(
            f"{world} processes were launched, but accelerate counts {accelerator.num_processes}: each would train on "
            "the same rows. This happens under DeepSpeed on a machine without GPUs, where accelerate is given no "
            "process-group backend. Launch with `accelerate launch --config_file examples/accelerate/zero2.yaml` (or "
            "zero3.yaml) and set `ddp_backend='gloo'` in the config; a `deepspeed=` config in the training arguments "
            "cannot name the backend there."
        )
    if world > 1 and accelerator.distributed_type == DistributedType.NO:
        raise RuntimeError(
            f"{world} processes were launched, but accelerate set up no distributed training: each would train its "
            "own copy of the model without synchronising gradients. On a machine without GPUs accelerate applies "
            "neither FSDP nor DDP to a non-CPU launch: use `examples/accelerate/ddp.yaml` with `--use_cpu true` (DDP "
            "over gloo), or DeepSpeed "
            "(examples/accelerate/zero2.yaml, zero3.yaml) with `ddp_backend='gloo'`."
        )


def checked_config(args, config_class: type, default_output_dir: str, trainer: str):
    """A trainer's config: the default one (writing to `default_output_dir`, as TRL's trainers name one each) when
    none is given, else one of `config_class`."""
    if args is None:
        return config_class(output_dir=default_output_dir)
    if not isinstance(args, config_class):
        raise TypeError(f"{trainer} needs an {config_class.__name__}, got {type(args).__name__}.")
    return args


class NCAParts(NamedTuple):
    """The NCA pieces a trainer holds after its base `__init__` (`setup_nca`): the placed `teacher_model`, the
    `objective`, the `step_loss` that runs it on a micro-batch, the `step_stats` that sum the logged terms, and the
    `anchor_step` callback that closes each optimizer step and sets the anchor weight of the next."""

    teacher_model: nn.Module
    objective: NCAObjective
    step_loss: StepLoss
    step_stats: StepStats
    anchor_step: AnchorStep


def setup_nca(trainer, models: TrainerModels, completions: bool) -> NCAParts:
    """The NCA pieces of `trainer`, once its base `__init__` has wrapped the student (PEFT, accelerate).

    First, prompt-learning adapters are refused and gradient checkpointing is settled reentrant or not
    (`trl_nca.trainers.activation_checkpointing`), since the objective's view plan depends on it. The teacher is
    placed (`place_teacher`); with output layers of different sizes, sampling never emits an id past the common rows
    (the other model could not score it). Then the objective (`nca_objective`), its step loss, the step statistics
    (`completions`: they log the completion lengths, False where the base trainer logs them itself) and the anchor
    step, with the stall signal of an anchored run (`trl_nca.core.stall`). The trainer adds the anchor step to its
    callbacks."""
    args = trainer.args
    refuse_prompt_learning(trainer.model)
    settle_checkpointing(trainer, models.requested_reentrant)
    teacher_model = place_teacher(models.teacher, trainer.model, trainer.accelerator, trainer.is_deepspeed_enabled)
    common, widest = models.common_rows
    if widest > common:
        trainer.generation_kwargs["suppress_tokens"] = list(range(common, widest))
        trainer.generation_config.suppress_tokens = list(range(common, widest))
    objective = nca_objective(args, teacher_model, trainer)
    warn_dropout_turns_sharing_off(args, trainer.accelerator.unwrap_model(trainer.model))
    step_stats = StepStats(
        trainer.accelerator, trainer._metrics, show_nca=objective.active or args.nca_monitor, completions=completions
    )
    anchor_step = AnchorStep(objective.schedule, step_stats, StallMonitor() if objective.active else None)
    return NCAParts(teacher_model, objective, StepLoss(objective, trainer.accelerator), step_stats, anchor_step)


def place_teacher(teacher: nn.Module, student: nn.Module, accelerator, deepspeed: bool) -> nn.Module:
    """The teacher model a trainer holds, placed as TRL's trainers place theirs: a frozen merged copy replaces the
    adapter-disabled self-teacher where disabling the adapter would not give the initial weights
    (`replacement_teacher`; under ZeRO-3 it gathers the partitioned student first); a `SelfTeacher` stays as it is
    (it calls the student, which the accelerator already wraps, and has no parameters for DeepSpeed to shard); any
    other teacher becomes a DeepSpeed engine under DeepSpeed (sharded under ZeRO-3), else is prepared for evaluation."""
    replacement = replacement_teacher(teacher, student)
    teacher = replacement if replacement is not None else teacher
    if not as_teacher(teacher).owns_weights:
        return teacher
    if deepspeed:
        return prepare_deepspeed(teacher, accelerator)
    return accelerator.prepare_model(teacher, evaluation_mode=True)


def nca_objective(args, teacher_model: nn.Module, trainer) -> NCAObjective:
    """The objective of a trainer's config, for its placed teacher (scored through the engine it was prepared in,
    when there is one: `ModelTeacher`), its student and its launch."""
    settings = NCASettings.from_config(args)
    teacher = as_teacher(trainer.accelerator.unwrap_model(teacher_model), wrapper=teacher_model)
    return NCAObjective(
        settings,
        teacher,
        anchor_schedule(args, settings.spec, teacher),
        trainer.processing_class.pad_token_id,
        deepspeed=trainer.is_deepspeed_enabled,
        full_fine_tuning=trains_most_weights(trainer.model),
    )


def warn_dropout_turns_sharing_off(args, student: nn.Module) -> None:
    """One warning at setup when dropout the student draws in training (LoRA's `lora_dropout`, kept by
    `disable_dropout=False`, `NCADistillationConfig`'s default) will turn `share_prefix` off for the student's
    views (the rows would share the prefix's dropout draws), naming the settings that keep it on."""
    if not args.share_prefix:
        return
    dropout = active_dropout(student, training=True)
    if dropout is None:
        return
    logger.warning(
        "Shared-prefix reuse (share_prefix=True) will be off for the student's views while training: dropout is "
        "active (%s, disable_dropout=%s), and rows sharing one prefix pass would share its dropout draws. Set "
        "`lora_dropout=0` in the LoRA config (`--lora_dropout 0`) or `disable_dropout=True` to share the prefix; "
        "a teacher without dropout (the LoRA self-teacher runs with its adapter, and its dropout, disabled) still "
        "shares.",
        dropout,
        args.disable_dropout,
    )
