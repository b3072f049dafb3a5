"""`NCATrainerMixin`: what `NCATrainer` (on GKD) and `NCADistillationTrainer` (on TRL's `DistillationTrainer`) share
after their base trainer's `__init__`, written once: the NCA setup (`_setup_nca`), the anchor weight, resuming, the
teacher as the objective sees it, the logged terms of each micro-batch and the evaluation loop's token means.

A trainer lists the mixin before its base trainer (`class NCATrainer(NCATrainerMixin, GKDTrainer)`), calls
`self._setup_nca(...)` at the end of its `__init__` and sets `logs_completion_stats`.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn
from trl.models.utils import prepare_deepspeed

from ..core.deprecation import warn_renamed
from ..core.prefix import active_dropout
from ..core.stall import StallMonitor
from .checkpointing import settle_checkpointing
from .checkpoints import AnchorStep, resume
from .console import explain_training
from .objective import NCAObjective
from .setup import refuse_prompt_learning
from .stats import StepStats, batch_stats
from .teacher import SelfTeacher, replacement_teacher


logger = logging.getLogger(__name__)


class NCATrainerMixin:
    """The NCA parts both trainers share; see the module docstring."""

    # Whether the step statistics log the completion lengths (False where the base trainer logs them itself).
    logs_completion_stats: bool = True

    def _setup_nca(
        self, teacher: nn.Module, common_rows: tuple[int, int], placed: bool, requested_reentrant: bool | None = None
    ) -> None:
        """Everything after the base trainer's `__init__`, which has wrapped the student (PEFT, accelerate).

        The teacher: a frozen merged copy replaces the adapter-disabled self-teacher where disabling the adapter
        would not give the initial weights (`replacement_teacher`); a teacher not yet `placed` by the base class is
        placed as TRL places teachers (a `SelfTeacher` as it is: it calls the student, which the accelerator already
        wraps; under DeepSpeed an engine, sharded under ZeRO-3; else prepared for evaluation). With output layers of
        different sizes, sampling never emits an id past the common rows (the other model could not score it). Then
        `self.nca` (the objective), `self.step_stats` and the callback that drives the anchor schedule by Trainer's
        steps (`AnchorStep`), with the stall signal of an anchored run (`trl_nca.core.stall`), and what the run prints
        (`trl_nca.trainers.console.explain_training`). First, prompt-learning
        adapters are refused and gradient checkpointing is settled reentrant or not (`trl_nca.trainers.checkpointing`;
        `requested_reentrant` is the user's own `use_reentrant`), since the objective's view plan depends on it.
        """
        refuse_prompt_learning(self.model)
        settle_checkpointing(self, requested_reentrant)
        replacement = replacement_teacher(teacher, self.model)
        if replacement is not None or not placed:
            teacher = replacement if replacement is not None else teacher
            if isinstance(teacher, SelfTeacher):
                self.teacher_model = teacher
            elif self.is_deepspeed_enabled:
                self.teacher_model = prepare_deepspeed(teacher, self.accelerator)
            else:
                self.teacher_model = self.accelerator.prepare_model(teacher, evaluation_mode=True)
        common, widest = common_rows
        if widest > common:
            self.generation_kwargs["suppress_tokens"] = list(range(common, widest))
            self.generation_config.suppress_tokens = list(range(common, widest))
        args = self.args
        self.nca = NCAObjective(
            args,
            self.processing_class.pad_token_id,
            self.model,
            self.accelerator.unwrap_model(self.teacher_model),
            deepspeed=self.is_deepspeed_enabled,
        )
        self.nca.teacher_wrapper = self.teacher_model  # a DeepSpeed engine: the teacher's forwards go through it
        self._warn_dropout_turns_sharing_off()
        self.step_stats = StepStats(
            self.accelerator,
            self._metrics,
            show_nca=self.nca.active or args.nca_monitor,
            completions=self.logs_completion_stats,
        )
        stall = StallMonitor() if self.nca.active else None
        self._anchor_step = AnchorStep(self.nca.schedule, self.step_stats, stall)
        self.add_callback(self._anchor_step)
        explain_training(self)  # what the run prints (trl_nca.trainers.console): compact logs, named bar, estimate

    def _warn_dropout_turns_sharing_off(self) -> None:
        """One warning at setup when dropout the student draws in training (LoRA's `lora_dropout`, kept by
        `disable_dropout=False`, `NCADistillationConfig`'s default) will turn `share_prefix` off for the student's
        views (the rows would share the prefix's dropout draws), naming the settings that keep it on."""
        if not self.args.share_prefix:
            return
        student = self.accelerator.unwrap_model(self.model)
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
            getattr(self.args, "disable_dropout", None),
        )

    @property
    def nca_beta(self) -> float:
        """The anchor weight of the optimizer step in progress (`nca_beta_schedule`)."""
        return self.nca.schedule.value

    @property
    def nca_schedule(self):
        """Deprecated: `trainer.nca.schedule`."""
        warn_renamed(f"{type(self).__name__}.nca_schedule", "trainer.nca.schedule")
        return self.nca.schedule

    @property
    def divergence_spec(self):
        """Deprecated: `trainer.nca.spec`."""
        warn_renamed(f"{type(self).__name__}.divergence_spec", "trainer.nca.spec")
        return self.nca.spec

    def create_model_card(self, *args, **kwargs):
        """TRL's model card, with one line on the anchor the run used (the default anchor is beyond the paper the
        card cites) after the line naming the method."""
        super().create_model_card(*args, **kwargs)
        card = os.path.join(self.args.output_dir, "README.md")
        if not self.is_world_process_zero() or not os.path.isfile(card):
            return
        with open(card, encoding="utf-8") as handle:
            text = handle.read()
        line, start = self.nca.schedule.describe(), text.find("This model was trained with ")
        end = len(text) if start < 0 else text.find("\n", start) % (len(text) + 1)
        with open(card, "w", encoding="utf-8") as handle:
            handle.write(f"{text[:end]}\n\n{line}\n{text[end:]}")

    def train(self, resume_from_checkpoint=None, **kwargs):
        resume_from_checkpoint = resume(
            resume_from_checkpoint, self.args.output_dir, self.nca.schedule, self._anchor_step.stall
        )
        self._resuming_from(resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _resuming_from(self, checkpoint: str | None) -> None:
        """Called by `train` with the checkpoint folder it resumes from (None: a fresh start)."""

    def _teacher(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.teacher_model)

    def _record_terms(self, terms, total: torch.Tensor, lengths: torch.Tensor, clipped: torch.Tensor, on_policy):
        """Add a micro-batch's terms to the step's (or the evaluation's) sums (`trl_nca.trainers.stats`)."""
        stats = batch_stats(terms, total, lengths, clipped, on_policy)
        self.step_stats.add(stats, training=self.model.training)

    def _describe_evaluation(self, description: str) -> None:
        """Called as an evaluation loop starts."""

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        """Trainer's loop; then `eval_loss` and the logged terms become token means over the whole evaluation set
        (Trainer would average per-batch means)."""
        self.step_stats.open_eval()
        self._describe_evaluation(description)
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        return self.step_stats.close_eval(output, self.args.device, metric_key_prefix)
