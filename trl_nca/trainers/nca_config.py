"""`NCAConfig` (on GKD's `GKDConfig`), and `NCAFields`: the NCA fields, declared once for it and for
`NCADistillationConfig` (on TRL's `DistillationConfig`, `trl_nca.trainers.nca_distillation_config`).

Each field is documented once, in its `metadata["help"]`; `trl_nca.trainers.field_docs.document_fields` writes the same
text into the class docstrings (see that module for how a new field is added)."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal, get_args, get_origin, get_type_hints

import torch
from trl.import_utils import TRLExperimentalWarning

from ..core.checks import check_integer, check_number
from ..core.losses import NCA_DIVERGENCES, DivergenceSpec, divergence_names
from ..core.schedule import (
    ADAPTIVE_INIT,
    ADAPTIVE_MIN,
    ADAPTIVE_TARGET,
    DEFAULT_SCHEDULE,
    SCHEDULES,
    schedule_from_config,
    schedule_names,
)
from ..core.views import ContextSpec
from .activation_checkpointing import checkpointing_kwargs, needs_joint_forward
from .field_docs import document_fields


with warnings.catch_warnings():  # NCATrainer builds on trl.experimental.gkd on purpose (see docs/design.md)
    warnings.simplefilter("ignore", TRLExperimentalWarning)
    from trl.experimental.gkd import GKDConfig


logger = logging.getLogger(__name__)

# The divergences and schedules the package ships, as the config's types (`TrlParser`'s choices): read when this
# module is imported, so after the core modules and everything they register; a name registered later from outside
# is accepted by the config's check, which reads the registries (docs/extending.md).
DivergenceName = Literal[divergence_names()]
ScheduleName = Literal[schedule_names()]


def context_fields(spec: ContextSpec) -> dict[str, str | None]:
    """The config fields that hold `spec`, which `NCAFields.context_spec` builds back (`ContextSpec.from_options`):
    a task's context given to a config (`trl-nca compare`). A fixed text keeps the default column."""
    return {
        "context_text": spec.text,
        "context_column": spec.column or "context",
        "context_placement": spec.placement,
        "context_template": spec.template,
        "context_separator": spec.separator,
    }


def support_size_field():
    """The size of the top-k support. `NCAConfig` calls it `top_k`; `NCADistillationConfig` calls it
    `divergence_top_k`, because `DistillationConfig.top_k` is already the sampling top-k."""
    return field(
        default=256,
        metadata={
            "help": "Size of the top-k support: how many of the student's most likely no-context tokens the "
            "divergences sum over when `divergence_support='top_k'` (of the teacher's tokens with 'teacher_top_k')."
        },
    )


@document_fields()
@dataclass
class NCAFields:
    """The fields of the context, the NCA term and the divergence support, declared once for both trainer configs:
    [`NCAConfig`] (on `GKDConfig`, for `NCATrainer`) and [`NCADistillationConfig`] (on `DistillationConfig`, for
    `NCADistillationTrainer`). A subclass names its support-size field in `_support_size_name` and declares it."""

    _support_size_name: ClassVar[str] = "top_k"
    # The docstring's sections (trl_nca.trainers.field_docs): each opens at the field named here and runs to the next
    # one, so a new field belongs to the section it is declared in.
    _doc_sections: ClassVar[dict[str, str]] = {
        "nca_beta": "Parameters that control the NCA term",
        "context_column": "Parameters that control the context",
        "divergence_support": "Parameters that control the divergence",
        "eval_completions": "Parameters that control evaluation",
    }

    nca_beta: float = field(
        default=0.5,
        metadata={
            "help": "Weight of the No-Context Anchoring term KL(sg[q_x] || q_c). `0.0` is plain on-policy context "
            "distillation (OPD): the context view of the student is then not computed at all (unless "
            "`nca_monitor=True`)."
        },
    )
    nca_anchor: Literal["student", "teacher"] = field(
        default="student",
        metadata={
            "help": "What the context view q_c is pulled towards: `'student'` (sg[q_x], the no-context view: NCA) or "
            "`'teacher'` (the teacher's distribution, the paper's DualOPD ablation)."
        },
    )
    nca_divergence: DivergenceName = field(
        default="forward_kl",
        metadata={"help": " ".join(f"`{d.name!r}`: {d.help}" for d in NCA_DIVERGENCES.values())},
    )
    nca_stop_gradient: bool = field(
        default=True,
        metadata={
            "help": "Stop the gradient of the NCA term into the no-context view (the paper's method). `False` is an "
            "ablation: the anchor then moves towards the context view too."
        },
    )
    nca_monitor: bool = field(
        default=False,
        metadata={
            "help": "With `nca_beta=0`, still run the context view (without gradient) to log `nca_loss` and `view_kl`, "
            "so the context-induced drift of plain OPD can be watched. Costs one extra forward per step."
        },
    )
    nca_beta_schedule: ScheduleName = field(
        default=DEFAULT_SCHEDULE,
        metadata={
            "help": "How the anchor weight evolves over optimizer steps (logged every step as `nca_beta`). The default "
            "is the gated anchor (beyond the paper, chosen by the study of docs/results.md section 10, where it stalled "
            "internalisation in fewer runs than the constant one). "
            + " ".join(schedule.summary for schedule in SCHEDULES.values())
            + " With `nca_beta=0` (plain OPD) there is no anchor to schedule and this setting is not read. Where the "
            "gate can never open (`self_teacher='live'` with reverse-KL OPD) and the schedule settings are left at "
            "their defaults, the constant anchor is used, with one warning. Saved in checkpoints, restored on resume."
        },
    )
    nca_warmup_steps: int = field(
        default=0, metadata={"help": "Optimizer steps of the linear warm-up of the `'warmup'` schedule."}
    )
    nca_adaptive_init: float = field(
        default=ADAPTIVE_INIT,
        metadata={
            "help": "Anchor weight of the first step under the `'adaptive'` schedule. `0` keeps the anchor off until "
            "the first step whose `view_kl` exceeds `nca_adaptive_target * opd_loss`, then starts it at "
            "`nca_adaptive_min`: the gated anchor, `nca_beta_schedule='gated'` (the default, which does not read this "
            "field); section 5's ungated adaptive anchor starts at `0.01` (with `nca_adaptive_min=0.001`, "
            "`nca_adaptive_target=1.0`)."
        },
    )
    nca_adaptive_min: float = field(
        default=ADAPTIVE_MIN,
        metadata={"help": "Lower bound of the adaptive anchor weight (`nca_beta` is the upper bound)."},
    )
    nca_adaptive_target: float = field(
        default=ADAPTIVE_TARGET,
        metadata={
            "help": "Tolerated ratio of the views' gap (`view_kl`) to the no-context view's gap to the teacher "
            "(`opd_loss`) before the adaptive anchor grows (and before the gated anchor opens)."
        },
    )
    nca_adaptive_horizon: float = field(
        default=1.0,
        metadata={
            "help": "Divides every adaptive update: each step changes the weight by at most "
            "`0.2 / nca_adaptive_horizon`."
        },
    )
    context_column: str | None = field(
        default="context",
        metadata={"help": "Dataset column holding each example's privileged context (a non-empty string)."},
    )
    context_text: str | None = field(
        default=None,
        metadata={
            "help": "One fixed context for every example (e.g. the system prompt being distilled). Takes precedence "
            "over `context_column`."
        },
    )
    context_placement: Literal["system", "user"] = field(
        default="system",
        metadata={
            "help": "`'system'`: the context becomes the system message; if the prompt already has one, the context is "
            "put before it, the two joined by `context_separator`. `'user'`: the first user message is rewritten "
            "through `context_template` (text games put their experience there)."
        },
    )
    context_template: str = field(
        default="{context}\n\n{prompt}",
        metadata={
            "help": "The user message with the context (placement `'user'`): must contain `{prompt}` and `{context}` "
            "and no other placeholder; write literal braces as `{{` and `}}`."
        },
    )
    context_separator: str = field(
        default="\n\n",
        metadata={
            "help": "Joins the context and an existing system message (placement `'system'`): context + separator + "
            "existing message."
        },
    )
    max_context_length: int | None = field(
        default=None,
        metadata={
            "help": "Longest context-view sequence (prompt with context + completion) allowed, in tokens. `None` uses "
            "the smaller of the student's and teacher's `max_position_embeddings`. The context view is never cut to "
            "`max_length`: a longer one is an error, unless `truncate_context=True`."
        },
    )
    truncate_context: bool = field(
        default=False,
        metadata={
            "help": "Opt in to shortening the context itself (never the prompt or the completion) when the context "
            "view would exceed `max_context_length`, with a warning naming the example."
        },
    )
    divergence_support: Literal["full", "top_k", "teacher_top_k"] = field(
        default="full",
        metadata={
            "help": "`'full'`: exact divergences over the whole vocabulary. `'top_k'`: sums restricted to the most "
            "likely tokens of the student's no-context distribution (chosen without gradient; how many: `top_k` in "
            "`NCAConfig`, `divergence_top_k` in `NCADistillationConfig`), as in the OPCD reference code. "
            "`'teacher_top_k'`: sums restricted to the teacher's most likely tokens, the support a served teacher "
            "(`teacher_model_server_url`) gives."
        },
    )
    top_k_renormalize: bool = field(
        default=False,
        metadata={
            "help": "Renormalise every distribution over the top-k support instead of using full-vocabulary "
            "log-probabilities."
        },
    )
    self_teacher: Literal["initial", "live"] = field(
        default="initial",
        metadata={
            "help": "Teacher when no `teacher_model` is given: `'initial'` (the student's frozen initial weights, with "
            "the context) or `'live'` (the current student with the context, detached)."
        },
    )
    nca_joint_forward: bool | None = field(
        default=None,
        metadata={
            "help": "Run the student's two views as one forward of 2 x batch rows (the no-context prompts left-padded "
            "to the context prompts' width) instead of two forwards. Needed where gradient checkpointing is "
            "reentrant under DDP or DeepSpeed (any process count): a weight used by two forwards would reach its "
            "gradient hook twice in one backward (`trl_nca.trainers.activation_checkpointing`). `None` turns it on "
            "exactly then; the trainers keep checkpointing non-reentrant unless `use_reentrant=True` is asked for "
            "(or DeepSpeed is older than 0.19.3 under PEFT + ZeRO-3), so `None` rarely needs it. `False` where it is "
            "needed is an error. Otherwise two forwards are cheaper, since the no-context view is not padded."
        },
    )
    nca_sequential_views: bool | None = field(
        default=None,
        metadata={
            "help": "Run a training micro-batch's no-context view, teacher and OPD term with their backward first "
            "(without the gradient all-reduce), then the context view and the NCA term with theirs, so only one "
            "view's activations are alive at a time. The terms are separable (OPD reads only the no-context view, NCA "
            "only the context view against a detached anchor), so the gradient and every logged term are the same (to "
            "float rounding). It cannot apply with `nca_stop_gradient=False`, the live self-teacher, "
            "`nca_joint_forward`, DeepSpeed (its engine runs one backward per micro-batch) or LOMO optimizers. `None` "
            "turns it on wherever it applies and the student trains an adapter (at most a tenth of its weights): the "
            "gradients are then small and the step's peak falls to the larger view's. With full fine-tuning the first "
            "backward allocates every weight's gradient, which the context view then runs beside, so `None` keeps "
            "both views at once there; `True` runs them in sequence anyway (worth it when activations outweigh the "
            "gradients: long sequences, large batches). `True` is an error at init where it cannot apply; `False` "
            "keeps both views' graphs until one backward."
        },
    )
    share_prefix: bool = field(
        default=True,
        metadata={
            "help": "Run the tokens that every row of a micro-batch starts with (the chat template's opening, a "
            "system message, a context shared by the batch) once per forward, at batch size 1, for the teacher and "
            "both student views; the rows' remaining tokens attend to its keys and values with the positions and "
            "attention mask of the unshared batch, and the student's prefix receives the rows' summed gradient, so "
            "values and gradients are those of the unshared forward (to float rounding). A teacher whose weights do "
            "not change (a separate teacher, the LoRA self-teacher with its adapter disabled) keeps the prefix's keys "
            "and values across steps while the prefix stays the same. Where it would not be exact the forward runs "
            "unshared and the reason is logged once: sliding-window or chunked attention layers, attention "
            "implementations other than `'eager'` and `'sdpa'`, active dropout, reentrant gradient checkpointing, a "
            "model whose forward takes no cache. See `trl_nca.core.prefix`. `NCATrainer` also runs it once in "
            "the prefill of its on-policy sampling (and of `seq_kd`'s teacher sampling) when the rows share at least "
            "`trl_nca.core.sampling.MIN_PREFIX_TOKENS` prompt tokens, whatever `share_prefix_min_tokens` "
            "(`trl_nca.core.sampling.shared_prefill`: the samples are those of the plain batch up to float rounding); "
            "`NCADistillationTrainer` samples through TRL's generation, unchanged."
        },
    )
    share_prefix_min_tokens: int = field(
        default=32,
        metadata={
            "help": "Shortest shared prefix worth its own pass: a view whose rows share fewer prompt tokens runs "
            "unshared (logged once, at info level)."
        },
    )
    loss_vocab_chunk_size: int = field(
        default=8192,
        metadata={
            "help": "Vocabulary columns per tile in the chunked loss; lower it to save memory on huge vocabularies."
        },
    )
    loss_token_chunk_size: int = field(
        default=2048, metadata={"help": "Completion tokens per tile in the chunked loss."}
    )
    log_grad_cosine_steps: int = field(
        default=0,
        metadata={
            "help": "Every this many optimizer steps (at steps 0, N, 2N, ...), log `grad_cosine`, the cosine between "
            "the gradients of the OPD and the NCA terms (token means of the step's first micro-batch, flattened over "
            "the trainable parameters), and their norms `grad_norm_opd` and `grad_norm_nca`. `0` turns it off. The "
            "gradients come from `torch.autograd.grad` on the step's own graph, so the update is bit-identical with "
            "it on or off; it costs two extra backward passes on those steps (with `nca_beta=0`, also a context-view "
            "forward, run on a side random stream). With several processes each measures its own micro-batch "
            "(nothing is synchronised) and the mean is logged. Not available under DeepSpeed, FSDP or reentrant "
            "gradient checkpointing. `trl-nca analyze` measures the same on saved checkpoints."
        },
    )
    eval_completions: Literal["on_policy", "dataset"] = field(
        default="on_policy",
        metadata={
            "help": "Which completions evaluation scores. `'on_policy'`: completions sampled from the student without "
            "the context (the distribution NCA trains on; `eval_loss` is then itself a sample). `'dataset'`: the "
            "eval dataset's reference completions, as `GKDTrainer` evaluates (every eval row needs one: `messages` "
            "ending with an assistant turn, or a `completion` column). `eval_completions/on_policy` logs the "
            "fraction of evaluated completions that the student sampled (1.0 or 0.0)."
        },
    )

    @property
    def support_size(self) -> int:
        """The size of the top-k support (`top_k` in `NCAConfig`, `divergence_top_k` in `NCADistillationConfig`)."""
        return getattr(self, self._support_size_name)

    def _nca_defaults(self) -> None:
        """Fields derived before the base config's `__post_init__`: `bf16=None` means bfloat16 only on a CUDA device
        that has it (the same config then runs on a CPU); no pinned memory without CUDA (it only serves CUDA copies,
        and torch warns on every loader); TRL's `gradient_checkpointing*` values under transformers' new
        `activation_checkpointing*` names, when this transformers has them and they are unset, so TrainingArguments
        does not warn about names the user never wrote. Nothing outside the config changes."""
        if self.bf16 is None and not self.fp16:
            self.bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        if self.dataloader_pin_memory and not torch.cuda.is_available():
            self.dataloader_pin_memory = False
        for old, new in CHECKPOINTING_NAMES:
            if new in self.__dataclass_fields__ and getattr(self, new) is None and getattr(self, old) is not None:
                setattr(self, new, getattr(self, old))
                setattr(self, old, None)

    def _check_nca_numbers(self, integers: tuple[str, ...] = ()) -> None:
        """Type and range of the numbers, before the base config's own checks (which let NaN through and fail on
        strings with a bare TypeError). `integers` adds fields of the base config that must be integers >= 1."""
        check_number("nca_beta", self.nca_beta, low=0.0, hint="0 is plain OPD, 0.5 the paper's best")
        check_number("temperature", self.temperature, low=0.0, low_open=True, hint="it divides every view's logits")
        check_number("beta", self.beta, low=0.0, high=1.0, hint="0 forward KL, 1 reverse KL")
        check_number("learning_rate", self.learning_rate, low=0.0, hint="the optimizer's step size")
        for name in ("weight_decay", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon"):
            check_number(name, getattr(self, name))
        if isinstance(self.max_steps, int) and self.max_steps <= 0:  # the run's length is then num_train_epochs
            check_number(
                "num_train_epochs",
                self.num_train_epochs,
                low=0.0,
                low_open=True,
                hint=f"with max_steps={self.max_steps} the epochs set the run's length; <= 0 would train 0 steps",
            )
        for name in (
            self._support_size_name,
            "loss_vocab_chunk_size",
            "loss_token_chunk_size",
            *integers,
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
        ):
            check_integer(name, getattr(self, name), low=1)
        for name in ("nca_adaptive_min", "nca_adaptive_target", "nca_adaptive_horizon"):
            check_number(name, getattr(self, name), low=0.0, low_open=True)
        check_number("nca_adaptive_init", self.nca_adaptive_init, low=0.0)
        check_integer("nca_warmup_steps", self.nca_warmup_steps, low=0)
        check_integer("log_grad_cosine_steps", self.log_grad_cosine_steps, low=0, hint="0 turns it off")
        check_integer("share_prefix_min_tokens", self.share_prefix_min_tokens, low=1)
        check_integer("seed", self.seed, low=0, hint="a random seed, below 2**32")
        if self.seed >= 2**32:  # numpy's seeds end there
            raise ValueError(f"seed must be an integer >= 0 and below 2**32 (a random seed), got {self.seed}.")
        if self.max_context_length is not None:
            check_integer("max_context_length", self.max_context_length, low=2, hint="None or a token count")

    def _check_nca_choices(self) -> None:
        """The choices among strings (a field's `Literal` type, or its registry), the unused-option warning, and the
        specs built (so validated) now."""
        choices = {
            **LITERAL_CHOICES,  # the fields' Literal types, read once
            "nca_divergence": divergence_names(),  # the registries, read now: a name registered after import counts
            "nca_beta_schedule": schedule_names(),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}.")
        defaults = {f.name: f.default for f in fields(self)}
        unused = {"user": "context_separator", "system": "context_template"}[self.context_placement]
        if getattr(self, unused) != defaults[unused]:
            logger.warning(
                "%s is set but context_placement=%r does not use it (context_template is for 'user', "
                "context_separator for 'system'); set context_placement to use it.",
                unused,
                self.context_placement,
            )
        # Builds (and so validates) the context placement, the divergence choice and the anchor schedule now.
        _ = (self.context_spec, self.divergence_spec)
        for line in schedule_from_config(self).cannot_act(self.max_steps):  # a warmup longer than the run
            logger.warning(line)

    @property
    def joint_forward(self) -> bool:
        """Whether the two student views share one forward (see `nca_joint_forward`)."""
        if self.nca_joint_forward is not None:
            return self.nca_joint_forward
        return needs_joint_forward(self, bool(checkpointing_kwargs(self).get("use_reentrant", False)))

    @property
    def context_spec(self) -> ContextSpec:
        return ContextSpec.from_options(
            column=self.context_column,
            text=self.context_text,
            placement=self.context_placement,
            template=self.context_template,
            separator=self.context_separator,
        )

    @property
    def divergence_spec(self) -> DivergenceSpec:
        return DivergenceSpec(
            beta=self.beta,
            temperature=self.temperature,
            top_k=self.support_size if self.divergence_support != "full" else None,
            top_k_of="teacher" if self.divergence_support == "teacher_top_k" else "student",
            renormalize=self.top_k_renormalize,
            nca_target=self.nca_anchor,
            nca_divergence=self.nca_divergence,
            nca_stop_gradient=self.nca_stop_gradient,
        )


# TRL's `gradient_checkpointing*` names and transformers' newer `activation_checkpointing*` ones (`_nca_defaults`)
CHECKPOINTING_NAMES = (
    ("gradient_checkpointing", "activation_checkpointing"),
    ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
)

# The allowed values of every NCA field whose type is a `Literal` of strings, read from the annotations (the registry
# fields `nca_divergence` and `nca_beta_schedule` are read from their registries when a config is checked).
LITERAL_CHOICES = {
    name: get_args(hint)
    for name, hint in get_type_hints(NCAFields).items()
    if get_origin(hint) is Literal and name not in ("nca_divergence", "nca_beta_schedule")
}


@document_fields(after={"top_k": "divergence_support"})
@dataclass
class NCAConfig(NCAFields, GKDConfig):
    r"""
    Configuration class for [`NCATrainer`]: on-policy context distillation with No-Context Anchoring.

    The loss per completion token of a sample drawn from the student without the context is OPD + `nca_beta` * NCA
    (the formulas: `trl_nca.core.losses`). All fields of
    [`~trl.experimental.gkd.GKDConfig`] keep their meaning; the fields below are specific to NCA (declared once, in
    [`NCAFields`], and shared with [`NCADistillationConfig`]), or are GKD's with another default. `bf16=None` resolves
    to `True` only when a CUDA device with bfloat16 support is present, so the same config runs on a CPU-only machine.

    Shared fields whose effect differs from `GKDTrainer` (a config that trains under `GKDTrainer` also trains under
    `NCATrainer`; where the effect differs, the trainer says so):
        - `max_length`: in GKD it is only used by the data collator, which drops the oldest tokens of a dataset
          conversation (prompt plus reference completion) longer than `max_length`; it never limits sampling.
          NCATrainer never truncates: both views need the same whole prompt and the same whole completion, and
          cutting the no-context prompt alone would make the views differ by more than the context. So `max_length`
          does not limit sampling here either (`max_new_tokens` does), rows longer than `max_length` are kept whole,
          and the trainer warns once, at init, how many there are. Every sequence is bounded by
          `max_context_length` (an error naming the row).
        - Evaluation: GKD scores the dataset's completions; NCATrainer scores completions it samples from the
          student without the context, unless `eval_completions="dataset"` (see below).
        - `compute_metrics` and `preprocess_logits_for_metrics` are refused: the loss never materialises logits, so
          evaluation has no predictions to give them. Use the logged `eval_*` terms, or
          `trl_nca.eval.PairedEvalCallback` for task accuracy with and without the context.
        - A custom `data_collator` must produce NCA's batch keys (`trl_nca.trainers.data.BATCH_KEYS`); the trainer
        probes it
          on one example at init. GKD's chat collator does not.
    """

    top_k: int = support_size_field()

    lmbda: float = field(
        default=1.0,
        metadata={
            "help": "Fraction of optimizer steps whose completions the student samples: 1.0 is fully on-policy, as in "
            "on-policy context distillation."
        },
    )
    beta: float = field(
        default=1.0,
        metadata={
            "help": "The OPD divergence, TRL's generalized JSD: 1 is the reverse KL(q_x || f) (the OPCD default), 0 "
            "the forward KL(f || q_x), values in between the JSD."
        },
    )
    temperature: float = field(
        default=1.0,
        metadata={
            "help": "Both the sampling temperature and the temperature applied to the logits of every view (student "
            "without context, student with context, teacher) before the divergences."
        },
    )

    ds3_gather_for_generation: bool = field(
        default=True,
        metadata={
            "help": "Under DeepSpeed ZeRO-3, whether sampling gathers the whole student on every process (fast; each "
            "process then holds all the weights while it samples) or runs with the weights sharded (one gather per "
            "layer and generated token: slower, for students too large to hold whole on one device), as "
            "`DistillationConfig.ds3_gather_for_generation`. No effect without ZeRO-3."
        },
    )

    def __post_init__(self):
        self._check_nca_numbers(integers=("max_new_tokens",))
        check_number("lmbda", self.lmbda, low=0.0, high=1.0, hint="the fraction of on-policy steps")
        self._nca_defaults()
        super().__post_init__()
        self._check_nca_choices()
