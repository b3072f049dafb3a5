"""The NCA objective on one batch, shared by both trainers (`NCATrainer` on GKD, `NCADistillationTrainer` on TRL's
`DistillationTrainer`): the student's two views and the teacher on the same completion ids, the per-token terms, the
step's total and the anchor weight, and the views' forward and backward run in sequence where that is exact.

A batch is an `NCABatch` (`trl_nca.trainers.batch`): the left-padded prompts of both views with their attention masks,
the shared right-padded completion block and the step's flags. Each trainer fills it its own way (GKD: the collator and
`model.generate`; Distillation: TRL's generation, vLLM or `generate`, plus the context prompts rendered there); from
the batch on, both compute exactly the same thing with the same code.

The objective is built from its own settings (`NCASettings`, taken from a trainer's config by
`NCASettings.from_config`), its teacher (a `trl_nca.trainers.teacher.Teacher`) and its anchor schedule
(`anchor_schedule`), so it is built and tested without a Trainer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import torch
from torch import nn

from ..core.losses import DivergenceSpec, LMHead, token_divergences
from ..core.prefix import PrefixSharing
from ..core.schedule import BetaSchedule, schedule_from_config, schedule_left_at_default
from ..core.views import View, build_view, position_ids_from_mask
from .batch import NCABatch
from .teacher import Teacher, TopKTeacher


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchViews:
    """The student's two views of a batch, built once (`batch_views`): the no-context view `x` (the prompt as the
    dataset gives it) and the context view `c`, each `[left-padded prompt | shared completion]`, and the completion
    mask both share. The teacher reads `c`."""

    x: View
    c: View
    completion_mask: torch.Tensor

    def joint(self, pad_token_id: int) -> tuple[View, torch.Tensor]:
        """Both views as one: [no-context rows; context rows], each view left-padded (`pad_token_id`, masked out) to
        the wider prompt, and the completion mask of those rows."""
        width = max(self.x.prompt_width, self.c.prompt_width)
        ids, masks = [], []
        for view in (self.x, self.c):
            extra = width - view.prompt_width
            ids.append(torch.nn.functional.pad(view.input_ids, (extra, 0), value=pad_token_id))
            masks.append(torch.nn.functional.pad(view.attention_mask, (extra, 0), value=0))
        mask = torch.cat(masks)
        view = View(torch.cat(ids), mask, position_ids_from_mask(mask), width)
        return view, self.completion_mask.repeat(2, 1)


def batch_views(batch: NCABatch) -> BatchViews:
    """The two views of a batch, on its completion ids."""
    completion_ids, completion_mask = batch.completion_ids, batch.completion_mask
    return BatchViews(
        x=build_view(batch.prompts, batch.prompt_attention_mask, completion_ids, completion_mask),
        c=build_view(batch.context_prompts, batch.context_prompt_attention_mask, completion_ids, completion_mask),
        completion_mask=completion_mask,
    )


# Which half of a micro-batch run in sequence (`nca_sequential_views`) a plan is for; None: the whole micro-batch.
Half = Literal["no_context", "context", None]


@dataclass(frozen=True)
class ViewPlan:
    """What one call of the objective runs on a batch, decided once (`plan_views`) before any forward.

    `no_context`, `context`: the student's views that run. `joint`: both as one forward (`nca_joint_forward`).
    `context_grad`: the context view runs with gradient (else under `torch.no_grad`: monitoring only). `side_stream`:
    it runs on a side random stream (`side_rng`), where it runs only to measure a gradient, so the step's own random
    draws stay those of a run without the measurement. `teacher`: the teacher scores the context view.
    `teacher_reuses_context`: a live self-teacher may take the student's context states instead of a forward of its
    own. `terms`: the per-token terms computed (`core.losses.token_divergences`)."""

    no_context: bool
    context: bool
    joint: bool
    context_grad: bool
    side_stream: bool
    teacher: bool
    teacher_reuses_context: bool
    terms: tuple[str, ...]


def plan_views(
    nca_active: bool,
    nca_monitor: bool,
    joint_forward: bool,
    need_context: bool,
    measure_gradients: bool = False,
    entropy: bool = False,
    half: Half = None,
) -> ViewPlan:
    """The `ViewPlan` of a batch.

    A whole micro-batch runs the no-context view and the teacher, and the context view with `need_context` (the NCA
    term, `nca_monitor` or a gradient measurement: `NCAObjective.need_context`). The views run jointly only for the
    NCA term with `nca_joint_forward`. The context view carries gradient for the NCA term or a measurement; run only
    to measure (NCA and monitoring off), it draws from the side random stream and a live self-teacher scores with a
    forward of its own, as in a run without the measurement. The halves of a micro-batch in sequence: the no-context
    half runs the no-context view and the teacher ("opd"), the context half the context view with gradient ("nca",
    "view_kl", against the first half's states). `entropy` adds the no-context view's "entropy" where it runs.
    """
    extra = ("entropy",) if entropy else ()
    if half == "no_context":
        return ViewPlan(
            no_context=True,
            context=False,
            joint=False,
            context_grad=False,
            side_stream=False,
            teacher=True,
            teacher_reuses_context=False,
            terms=("opd", *extra),
        )
    if half == "context":
        return ViewPlan(
            no_context=False,
            context=True,
            joint=False,
            context_grad=True,
            side_stream=False,
            teacher=False,
            teacher_reuses_context=False,
            terms=("nca", "view_kl"),
        )
    if half is not None:
        raise ValueError(f"half must be 'no_context', 'context' or None, got {half!r}.")
    only_measured = measure_gradients and not (nca_active or nca_monitor)
    return ViewPlan(
        no_context=True,
        context=need_context,
        joint=need_context and nca_active and joint_forward,
        context_grad=need_context and (nca_active or measure_gradients),
        side_stream=need_context and only_measured,
        teacher=True,
        teacher_reuses_context=need_context and not only_measured,
        terms=(("opd", "nca", "view_kl") if need_context else ("opd",)) + extra,
    )


class NoContextHalf:
    """What the context view's half of a micro-batch run in sequence needs from the no-context half: the student's
    no-context states (detached: NCA's anchor is sg[q_x]), the teacher's states where the anchor is the teacher
    (DualOPD; else None) and the teacher's head (it sets the rows both distributions live on).

    A plain class, not a dataclass or tuple: it leaves the no-context half's redirected forward inside a `BatchLoss`,
    and DDP looks for the forward's outputs in tensors, sequences, mappings and dataclasses; the carried states are not
    outputs of that forward."""

    __slots__ = ("h_x", "h_t", "teacher_head")

    def __init__(self, h_x: torch.Tensor, h_t: torch.Tensor | None, teacher_head: LMHead):
        self.h_x, self.h_t, self.teacher_head = h_x, h_t, teacher_head


class BatchLoss(NamedTuple):
    """What the objective computes on a micro-batch (or on one half of it, run in sequence), returned through the
    trainer's redirected forward of the student: the per-token `terms` (`core.losses.token_divergences`), their
    differentiable sum `total` (sum OPD + nca_beta * sum NCA for a whole micro-batch; sum OPD for the no-context
    half; nca_beta * sum NCA for the context half), and for the no-context half what the context half needs
    (`carry`). The trainer divides `total` by its token count.

    A named tuple: the wrappers the forward runs in find the output's tensors in tuples and mappings (DDP, for the
    parameters a backward reaches; DeepSpeed ZeRO-3, which hooks them to gather the parameters again for the
    backward), and DeepSpeed rebuilds the tuple it was given."""

    terms: dict[str, torch.Tensor]
    total: torch.Tensor
    carry: NoContextHalf | None = None

    @property
    def tokens(self) -> int:
        """The completion tokens the terms are over."""
        return next(iter(self.terms.values())).numel()


@dataclass(frozen=True)
class NCASettings:
    """What the objective reads besides its teacher and schedule; the defaults are `NCAConfig`'s.

    `spec`: the divergences (`core.losses.DivergenceSpec`). `nca_monitor`: the context view runs without the NCA term,
    to log its terms. `joint_forward`: both student views as one forward (`NCAConfig.joint_forward`, resolved).
    `sequential_views`: `nca_sequential_views` as asked (`resolve_sequential_views`). `share_prefix`,
    `share_prefix_min_tokens`: shared-prefix reuse (`core.prefix.PrefixSharing`). `vocab_chunk_size`,
    `token_chunk_size`: the loss's tiles. `updates_in_backward`: the optimizer updates the weights inside each backward
    (LOMO), so the views cannot run in sequence."""

    spec: DivergenceSpec = field(default_factory=DivergenceSpec)
    nca_monitor: bool = False
    joint_forward: bool = False
    sequential_views: bool | None = None
    share_prefix: bool = True
    share_prefix_min_tokens: int = 32
    vocab_chunk_size: int = 8192
    token_chunk_size: int = 2048
    updates_in_backward: bool = False

    @classmethod
    def from_config(cls, args) -> NCASettings:
        """The settings of a config with the NCA fields (`trl_nca.trainers.nca_config.NCAFields`: `NCAConfig` or
        `NCADistillationConfig`), as they stand once the trainer has settled gradient checkpointing."""
        return cls(
            spec=args.divergence_spec,
            nca_monitor=args.nca_monitor,
            joint_forward=args.joint_forward,
            sequential_views=args.nca_sequential_views,
            share_prefix=args.share_prefix,
            share_prefix_min_tokens=args.share_prefix_min_tokens,
            vocab_chunk_size=args.loss_vocab_chunk_size,
            token_chunk_size=args.loss_token_chunk_size,
            updates_in_backward=args.optim in ("lomo", "adalomo"),
        )


def anchor_schedule(args, spec: DivergenceSpec, teacher: Teacher) -> BetaSchedule:
    """The anchor schedule a config describes (`core.schedule.schedule_from_config`) for this teacher. Where its gate
    can never open (a live self-teacher with reverse-KL OPD: view_kl equals opd_loss at every step), the default
    schedule becomes the paper's constant anchor with one warning, and a schedule the user set is an error."""
    schedule = schedule_from_config(args)
    never_on = schedule.never_on(views_equal_teacher=teacher.live and spec.beta == 1.0)
    if never_on is not None and schedule_left_at_default(args):
        logger.warning(
            "The default anchor is gated (nca_beta_schedule='gated'), and here its gate can "
            "never open (self_teacher='live' with reverse-KL OPD: view_kl equals opd_loss at every step), so this "
            "run uses the paper's constant anchor (nca_beta=%s throughout). Set nca_beta_schedule='constant' to "
            "say so and silence this warning.",
            args.nca_beta,
        )
        return schedule_from_config(args, kind="constant")
    if never_on is not None:
        raise ValueError(never_on)
    return schedule


class NCAObjective:
    """OPD + nca_beta * NCA on a batch of both views, from hidden states (no (batch x sequence x vocabulary) logits).

    Args:
        settings: what the objective reads (`NCASettings`).
        teacher: the teacher (`trl_nca.trainers.teacher.Teacher`: a `ModelTeacher`, or a `SelfTeacher`).
        schedule: the anchor weight's schedule (`anchor_schedule`); its value is the weight of the step in progress.
        pad_token_id: pads the joint forward.
        deepspeed: whether DeepSpeed's engine runs the backward; with the settings it decides `nca_sequential_views`.
        full_fine_tuning: whether most of the student's weights are trained (`trains_most_weights`); with the
            settings it decides `nca_sequential_views` too.
    """

    def __init__(
        self,
        settings: NCASettings,
        teacher: Teacher,
        schedule: BetaSchedule,
        pad_token_id: int,
        *,
        deepspeed: bool = False,
        full_fine_tuning: bool = False,
    ):
        self.settings = settings
        self.teacher = teacher
        self.schedule = schedule
        self.pad_token_id = pad_token_id
        self.spec = settings.spec
        # Whether the NCA term can be on at all (the context view then carries gradient).
        self.active = self.schedule.active
        # Every forward of a view runs the token prefix its rows share once, where that is exact (`share_prefix`).
        self.prefix_sharing = PrefixSharing(settings.share_prefix, settings.share_prefix_min_tokens)
        # Training micro-batches run the two views' forward and backward one after the other, where that is exact.
        self.sequential = resolve_sequential_views(
            settings, self.active, live_teacher=teacher.live, deepspeed=deepspeed, full_fine_tuning=full_fine_tuning
        )

    @property
    def beta(self) -> float:
        """The anchor weight of the optimizer step in progress."""
        return self.schedule.value

    def need_context(self, measure_gradients: bool = False) -> bool:
        """Whether the context view runs: for the NCA term, for monitoring (`nca_monitor`) or for a measurement."""
        return self.active or self.settings.nca_monitor or measure_gradients

    def total(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The summed loss of the batch's tokens: sum OPD + nca_beta * sum NCA (when the term is on)."""
        total = terms["opd"].sum()
        if self.active:
            total = total + self.beta * terms["nca"].sum()
        return total

    def in_sequence(self, backward_follows: bool) -> bool:
        """Whether a micro-batch runs its views in sequence: one whose backward the trainer runs itself
        (`backward_follows`: inside its `training_step`, `trl_nca.trainers.step_loss.StepLoss.trainer_backward`), with
        gradients, when `nca_sequential_views` resolved on."""
        return self.sequential and backward_follows and torch.is_grad_enabled()

    def plan(
        self, need_context: bool, measure_gradients: bool = False, entropy: bool = False, half: Half = None
    ) -> ViewPlan:
        """What a batch runs (`plan_views`) under this objective's NCA term, `nca_monitor` and `nca_joint_forward`."""
        settings = self.settings
        return plan_views(
            self.active, settings.nca_monitor, settings.joint_forward, need_context, measure_gradients, entropy, half
        )

    def loss(self, student, batch: NCABatch, need_context: bool, measure_gradients=False, entropy=False) -> BatchLoss:
        """A whole micro-batch: its terms (`token_divergences`, which takes the same arguments) and their total
        (`total`)."""
        terms = self.token_divergences(student, batch, need_context, measure_gradients, entropy)
        return BatchLoss(terms, self.total(terms))

    def no_context_half(self, student: nn.Module, batch: NCABatch, entropy: bool = False) -> BatchLoss:
        """The no-context half of a micro-batch run in sequence: per-token "opd" (and "entropy") from the student's
        no-context view and the teacher, their sum OPD, and what the context half needs (`NoContextHalf`)."""
        plan = self.plan(need_context=False, entropy=entropy, half="no_context")
        views = batch_views(batch)
        h_x, _ = self.student_states(student, views, plan)
        student_head = LMHead.from_model(student)
        h_t, teacher_head = self.teacher_states(views.c, views.completion_mask, None, student_head)
        terms = self.divergences(plan, h_x, h_t, student_head, teacher_head)
        anchor_states = h_t if self.spec.nca_target == "teacher" else None
        return BatchLoss(terms, terms["opd"].sum(), NoContextHalf(h_x.detach(), anchor_states, teacher_head))

    def context_half(self, student: nn.Module, batch: NCABatch, half: NoContextHalf) -> BatchLoss:
        """The context half of a micro-batch run in sequence: per-token "nca" and "view_kl" from the student's context
        view against the no-context half's (detached) states, and nca_beta * sum NCA."""
        plan = self.plan(need_context=True, half="context")
        _, h_c = self.student_states(student, batch_views(batch), plan)
        terms = self.divergences(plan, half.h_x, half.h_t, LMHead.from_model(student), half.teacher_head, h_c)
        return BatchLoss(terms, self.beta * terms["nca"].sum())

    def token_divergences(
        self,
        student: nn.Module,
        batch: NCABatch,
        need_context: bool,
        measure_gradients: bool = False,
        entropy: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Per-token "opd" (and "nca", "view_kl" with `need_context`) of the batch's valid completion tokens.

        `student` is the unwrapped student; the teacher is the objective's. With
        `measure_gradients` and the NCA term off, the context view runs only to measure a gradient, on a side random
        stream. `entropy` adds the per-token entropy of the no-context view ("entropy", no gradient). Which views run,
        and how, is the batch's `ViewPlan` (`plan_views`).
        """
        plan = self.plan(need_context, measure_gradients, entropy)
        views = batch_views(batch)
        h_x, h_c = self.student_states(student, views, plan)
        student_head = LMHead.from_model(student)
        reused = h_c if plan.teacher_reuses_context else None
        h_t, teacher_head = self.teacher_states(views.c, views.completion_mask, reused, student_head)
        return self.divergences(plan, h_x, h_t, student_head, teacher_head, h_c)

    def student_states(
        self, student: nn.Module, views: BatchViews, plan: ViewPlan
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The student's states (h_x, h_c) of the views `plan` runs (None for one it does not), in its order: both in
        one forward (`plan.joint`), or the no-context view, then the context view with or without gradient
        (`plan.context_grad`) and on the side random stream or not (`plan.side_stream`)."""
        if plan.joint:
            return self.joint_hidden(student, views)
        mask = views.completion_mask
        h_x = self.states(student, views.x, mask, "student's no-context view") if plan.no_context else None
        h_c = None
        if plan.context:
            with nullcontext() if plan.context_grad else torch.no_grad():
                with side_rng(h_x) if plan.side_stream else nullcontext():
                    h_c = self.states(student, views.c, mask, "student's context view")
        return h_x, h_c

    def divergences(
        self, plan: ViewPlan, h_x, h_t, student_head: LMHead, teacher_head: LMHead, h_c=None
    ) -> dict[str, torch.Tensor]:
        """`core.losses.token_divergences` of the plan's terms, in this objective's tiles."""
        return token_divergences(
            h_x,
            h_t,
            student_head,
            teacher_head,
            self.spec,
            h_c=h_c,
            terms=plan.terms,
            vocab_chunk=self.settings.vocab_chunk_size,
            token_chunk=self.settings.token_chunk_size,
        )

    def joint_hidden(self, student: nn.Module, views: BatchViews) -> tuple[torch.Tensor, torch.Tensor]:
        """Both student views in one forward: [no-context rows; context rows], prompts left-padded to one width."""
        view, completion_mask = views.joint(self.pad_token_id)
        hidden = self.states(student, view, completion_mask, "student's joint views")
        num_tokens = hidden.shape[0] // 2  # rows are ordered: all no-context tokens, then all context tokens
        return hidden[:num_tokens], hidden[num_tokens:]

    def states(self, model: nn.Module, view: View, completion_mask, what: str, persist=None) -> torch.Tensor:
        """Hidden states predicting the completion tokens of `view`, its shared prefix run once where that is exact
        (`share_prefix`); `persist` is a key under which the prefix's keys and values may be kept across calls."""
        return self.prefix_sharing.completion_states(model, view, completion_mask, what, persist=persist)

    @torch.no_grad()
    def teacher_states(self, view: View, completion_mask, h_c, student_head: LMHead):
        """The teacher's hidden states of the completion tokens of the context view, and its LM head. A live
        self-teacher reuses the student's context view (`h_c`, detached) when it was computed; any other teacher
        scores inside its own block (`Teacher.active`), as its forward (`Teacher.call`), its shared prefix kept across
        steps while its weights stay the same (`Teacher.weights_key`)."""
        teacher = self.teacher
        if teacher.live and h_c is not None:
            return h_c.detach(), student_head
        if isinstance(teacher, TopKTeacher):  # a served teacher: its top-k of the view, no local states or head
            return teacher.top_k_log_probs(view, completion_mask), None
        with teacher.active() as model:
            key = teacher.weights_key(model)
            states = teacher.call(self.states, model, view, completion_mask, "teacher", key)
            return states, LMHead.from_model(model)


def side_rng(tensor: torch.Tensor):
    """A block whose random draws (CPU, and the accelerator holding `tensor`) leave the main random streams as they
    were."""
    device = tensor.device
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device], device_type=device.type)


def trains_most_weights(model: nn.Module) -> bool:
    """Whether more than a tenth of the model's weights are trained (full fine-tuning, not an adapter). Counts a ZeRO-3
    partitioned parameter by its full size."""
    sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in model.parameters()]
    return sum(n for n, trained in sizes if trained) > 0.1 * max(sum(n for n, _ in sizes), 1)


def resolve_sequential_views(
    settings: NCASettings, nca_active: bool, live_teacher: bool, deepspeed: bool, full_fine_tuning: bool
) -> bool:
    """`nca_sequential_views` resolved: None turns it on wherever it is exact, supported and saves memory, True
    requires it (an error naming the reason where it cannot apply), False keeps both views' graphs alive until one
    backward.

    The two terms are separable: OPD reads the no-context view only (the teacher is a constant), NCA the context view
    only (its anchor sg[q_x] is detached), so the no-context view's backward can run before the context view's
    forward, and the summed gradient is the same. Not where a term reads both views with gradient (NCA without its
    stop-gradient), where the teacher is the student's own context view (`self_teacher="live"`), where both views are
    one forward (`nca_joint_forward`), where DeepSpeed's engine owns the backward (one per micro-batch), nor with LOMO
    optimizers, which update the weights inside each backward. With the NCA term off there is one view to train.

    None leaves full fine-tuning with both views at once: the first backward allocates every weight's gradient, which
    the context view's forward and backward then run beside, while with one backward the gradients appear as the
    activations are freed. With an adapter the gradients are small and the views in sequence save the no-context
    view's activations (`benchmarks/README.md` has both measured)."""
    requested = settings.sequential_views
    if requested is False or not nca_active:
        return False
    reasons = []
    if not settings.spec.nca_stop_gradient:
        reasons.append("nca_stop_gradient=False sends the NCA gradient through the no-context view as well")
    if live_teacher:
        reasons.append("self_teacher='live' scores with the student's own context view, so the teacher needs it")
    if settings.joint_forward:
        reasons.append("nca_joint_forward runs both views as one forward")
    if deepspeed:
        reasons.append("under DeepSpeed the engine runs one backward per micro-batch")
    if settings.updates_in_backward:
        reasons.append("LOMO optimizers update the weights inside each backward")
    if requested and reasons:
        raise ValueError(
            f"nca_sequential_views=True cannot apply: {'; '.join(reasons)}. Set nca_sequential_views=None (on where it "
            "applies) or False; with both views' graphs at once the step's peak memory is their sum."
        )
    return not reasons and (bool(requested) or not full_fine_tuning)
