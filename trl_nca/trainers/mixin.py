"""`NCATrainerMixin`: what `NCATrainer` (on GKD) and `NCADistillationTrainer` (on TRL's `DistillationTrainer`) share,
written once: the config check (`_checked_args`), the datasets tokenised into both views (`_prepare_datasets`, also
for `evaluate`), the base trainer's `__init__` (`_init_base`), the NCA setup after it (`_setup_nca`), the loss of a
micro-batch with its views in sequence and their `no_sync`/backward protocol (`_nca_loss`), the gradient cosine, the
anchor weight, resuming, the logged terms of each micro-batch and the evaluation loop's token means.

A trainer lists the mixin before its base trainer (`class NCATrainer(NCATrainerMixin, GKDTrainer)`), sets
`config_class`, `default_output_dir` and `logs_completion_stats`, defines how one split is tokenised
(`_prepare_split`), calls `self._init_base(...)` and then `self._setup_nca(...)` in its `__init__`, and builds an
`NCABatch` at its boundary for `compute_loss`, which calls `_nca_loss`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from torch import nn
from trl.models.utils import prepare_deepspeed

from ..core.gradients import compare_gradients, loss_gradients
from ..core.prefix import active_dropout
from ..core.stall import StallMonitor
from .activation_checkpointing import quiet_old_checkpointing_names, settle_checkpointing
from .anchor import AnchorStep, load_anchor_state
from .batch import NCABatch
from .checkpoints import resolve_resume
from .console import explain_training
from .data import check_examples
from .objective import NCAObjective, NCASettings, anchor_schedule, trains_most_weights
from .setup import named_datasets, refuse_prompt_learning
from .stats import StepStats, batch_stats
from .teacher import as_teacher, replacement_teacher


logger = logging.getLogger(__name__)


class NCATrainerMixin:
    """The NCA parts both trainers share; see the module docstring."""

    # Whether the step statistics log the completion lengths (False where the base trainer logs them itself).
    logs_completion_stats: bool = True
    config_class: type  # the config the trainer takes
    default_output_dir: str  # the output folder of the default config (TRL's trainers name one each)

    @classmethod
    def _checked_args(cls, args):
        """The config: the default one (in `default_output_dir`) when none is given, else one of `config_class`."""
        if args is None:
            return cls.config_class(output_dir=cls.default_output_dir)
        if not isinstance(args, cls.config_class):
            raise TypeError(f"{cls.__name__} needs an {cls.config_class.__name__}, got {type(args).__name__}.")
        return args

    # ----------------------------------------------------------------------------------------------------------------
    # Datasets: both views tokenised, before the base trainer's `__init__` and for `evaluate`

    def _prepare_split(self, args, tokenizer, dataset, split: str):
        """One split with the token columns of both views (`trl_nca.trainers.data.prepare_dataset`)."""
        raise NotImplementedError

    def _check_prepared(self, args, train_dataset, eval_dataset) -> None:
        """Checks of the prepared datasets (the train dataset is None for `evaluate` or a rollout)."""

    def _prepare_datasets(self, args, tokenizer, train_dataset, eval_dataset, training: bool = True):
        """The train dataset (when `training`) and the eval dataset, or each of a dict of them, tokenised into both
        views (`_prepare_split`), then checked (`_check_prepared`)."""
        if training and train_dataset is not None:
            train_dataset = self._prepare_split(args, tokenizer, train_dataset, "train")
        if isinstance(eval_dataset, dict):
            eval_dataset = {
                name: self._prepare_split(args, tokenizer, ds, f"eval {name}") for name, ds in eval_dataset.items()
            }
        elif eval_dataset is not None:
            eval_dataset = self._prepare_split(args, tokenizer, eval_dataset, "eval")
        self._check_prepared(args, train_dataset if training else None, eval_dataset)
        return train_dataset, eval_dataset

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """The base trainer's `evaluate`; a dataset given here (or a dict of them) is checked and tokenised into both
        views as the datasets given at init are (a name selects one of those)."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            for split, dataset in named_datasets(None, eval_dataset):
                check_examples(dataset, self.context_spec, split)
            _, eval_dataset = self._prepare_datasets(self.args, self.processing_class, None, eval_dataset, False)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    # ----------------------------------------------------------------------------------------------------------------
    # Setup

    def _init_base(
        self, model, teacher, args, train, evaluation, tokenizer, callbacks, optimizers, peft_config, **extra
    ):
        """The base trainer's `__init__` with the arguments both take (the teacher, the train and eval datasets, the
        tokenizer, ...), and `extra` ones of its own. PEFT's `PeftModel`, which it may build, reads an old checkpointing
        name (`activation_checkpointing`)."""
        with quiet_old_checkpointing_names():
            super().__init__(
                model,
                teacher_model=teacher,
                args=args,
                train_dataset=train,
                eval_dataset=evaluation,
                processing_class=tokenizer,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
                **extra,
            )

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
        (`trl_nca.trainers.console.explain_training`). First, prompt-learning adapters are refused and gradient
        checkpointing is settled reentrant or not (`trl_nca.trainers.activation_checkpointing`; `requested_reentrant`
        is the user's own `use_reentrant`), since the objective's view plan depends on it.
        """
        refuse_prompt_learning(self.model)
        settle_checkpointing(self, requested_reentrant)
        replacement = replacement_teacher(teacher, self.model)
        if replacement is not None or not placed:
            teacher = replacement if replacement is not None else teacher
            if not as_teacher(teacher).owns_weights:
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
        settings = NCASettings.from_config(args)
        # a DeepSpeed engine around a separate teacher: its forwards go through it (`ModelTeacher`)
        teacher = as_teacher(self.accelerator.unwrap_model(self.teacher_model), wrapper=self.teacher_model)
        self.nca = NCAObjective(
            settings,
            teacher,
            anchor_schedule(args, settings.spec, teacher),
            self.processing_class.pad_token_id,
            deepspeed=self.is_deepspeed_enabled,
            full_fine_tuning=trains_most_weights(self.model),
        )
        self._grad_cosine_step: int | None = None  # the optimizer step whose gradient cosine was logged last
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
        # the checkpoint folder named by True or checked (`resolve_resume`), and the anchor's state restored from it
        resume_from_checkpoint = resolve_resume(resume_from_checkpoint, self.args.output_dir)
        if isinstance(resume_from_checkpoint, str):
            load_anchor_state(resume_from_checkpoint, self.nca.schedule, self._anchor_step.stall)
        self._resuming_from(resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _resuming_from(self, checkpoint: str | None) -> None:
        """Called by `train` with the checkpoint folder it resumes from (None: a fresh start)."""

    def _teacher(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.teacher_model)

    # ----------------------------------------------------------------------------------------------------------------
    # Loss: both trainers' `compute_loss` build an `NCABatch` and call `_nca_loss`

    def _prepare_inputs(self, inputs):
        # an NCABatch was built on the device by the trainer; any other batch is the base trainer's to prepare
        return inputs if isinstance(inputs, NCABatch) else super()._prepare_inputs(inputs)

    def floating_point_ops(self, inputs) -> int:
        # Trainer's count of a batch without the model's main input (`input_ids`), as for the batches it had before
        return super().floating_point_ops({} if isinstance(inputs, NCABatch) else inputs)

    def _track_num_input_tokens(self, inputs):
        super()._track_num_input_tokens({} if isinstance(inputs, NCABatch) else inputs)

    def _nca_loss(
        self,
        model: nn.Module,
        batch: NCABatch,
        scaled: Callable[[torch.Tensor], torch.Tensor],
        measure_gradients: bool = False,
        entropy: bool = False,
    ) -> torch.Tensor:
        """The micro-batch's loss, `scaled` (the summed terms divided by the trainer's token count), after its terms
        were recorded (`_record_batch`). Both student views and the teacher run inside one redirected forward of the
        wrapped model, so DDP and DeepSpeed see a single ordinary forward; or, in a training step where
        `nca_sequential_views` resolved on, the views run in sequence (`_views_in_sequence`). `measure_gradients`:
        log the gradient cosine of this micro-batch; `entropy`: log the no-context view's entropy (`_log_entropy`)."""
        unwrapped = self.accelerator.unwrap_model(model)
        if self.nca.in_sequence(batch):
            loss, terms = self._views_in_sequence(model, unwrapped, batch, scaled, measure_gradients, entropy)
        else:
            need_context = self.nca.need_context(measure_gradients)
            result = self._forward_redirection(
                model, unwrapped, self.nca.loss, unwrapped, batch, need_context, measure_gradients, entropy
            )
            if measure_gradients:
                self._log_grad_cosine(unwrapped, result.terms)
            if entropy:
                self._log_entropy(result.terms["entropy"], batch.completion_mask.sum())
            loss, terms = scaled(result.total), result.terms
        self._record_batch(terms, batch)
        return loss

    def _views_in_sequence(self, model, unwrapped, batch: NCABatch, scaled, measure_gradients: bool, entropy: bool):
        """The micro-batch's loss with the no-context view (and teacher) backpropagated before the context view runs
        (`nca_sequential_views`), and its terms. The no-context half (the no-context view, the teacher and OPD) runs
        with its backward first, without the gradient all-reduce (`no_sync`); then the context half (the context view
        and NCA), whose backward Trainer runs as usual and which synchronises the summed gradient once. Each half runs
        inside its own redirected forward of the wrapped model, so DDP sees two ordinary forward/backward pairs. Only
        one view's activations are alive at a time. With `measure_gradients` each half's term gradient is taken before
        its backward, for `log_grad_cosine_steps`. The loss is differentiable through the context half only (its value
        is the whole loss)."""
        tokens = int(batch.completion_mask.sum())
        params = [p for p in unwrapped.parameters() if p.requires_grad] if measure_gradients else []
        with self.accelerator.no_sync(model):
            first = self._forward_redirection(model, unwrapped, self.nca.no_context_half, unwrapped, batch, entropy)
            if measure_gradients:
                opd_gradient = loss_gradients(first.total / max(tokens, 1), params)
            if entropy:
                self._log_entropy(first.terms["entropy"], batch.completion_mask.sum())
            first_loss = scaled(first.total)
            self.accelerator.backward(first_loss)
        second = self._forward_redirection(model, unwrapped, self.nca.context_half, unwrapped, batch, first.carry)
        if measure_gradients:
            nca_gradient = loss_gradients(second.terms["nca"].sum() / max(tokens, 1), params)
            self._record_grad_cosine(opd_gradient, nca_gradient)
        return scaled(second.total) + first_loss.detach(), {**first.terms, **second.terms}

    def _record_batch(self, terms: dict[str, torch.Tensor], batch: NCABatch) -> None:
        """Add a micro-batch's terms to the step's (or the evaluation's) sums (`trl_nca.trainers.stats`), with its
        completion lengths and, where the trainer logs completion statistics, the completions cut at
        `max_new_tokens` without an end-of-sequence token."""
        lengths = batch.completion_mask.sum(1)
        if self.logs_completion_stats:
            clipped = (lengths >= self.args.max_new_tokens) & ~self._ends_with_eos(
                batch.completion_ids, batch.completion_mask
            )
        else:
            clipped = torch.zeros_like(lengths)
        stats = batch_stats(terms, self.nca.total(terms).detach(), lengths, clipped, batch.on_policy)
        self.step_stats.add(stats, training=self.model.training)

    def _ends_with_eos(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per row of right-padded completions (`ids`, `mask`), whether it holds an end-of-sequence token."""
        eos = self.generation_config.eos_token_id
        mask = mask.bool()
        if eos is None or ids.shape[1] == 0:
            return torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        eos = torch.as_tensor(eos, device=ids.device).reshape(-1)
        return (torch.isin(ids, eos) & mask).any(1)

    def _log_entropy(self, entropy: torch.Tensor, num_valid: torch.Tensor) -> None:
        """DistillationTrainer's `entropy`: the mean per-token entropy of the student's no-context view (in nats)
        over all processes, gathered after the redirected forward has returned."""
        mode = "train" if self.model.training else "eval"
        num_valid = self.accelerator.gather_for_metrics(num_valid).sum()
        entropy_sum = self.accelerator.gather_for_metrics(entropy.detach().sum()).sum()
        self._metrics[mode]["entropy"].append((entropy_sum / num_valid).item() if num_valid > 0 else 0.0)

    # Gradient cosine (`log_grad_cosine_steps`)

    def _grad_cosine_due(self) -> bool:
        """Whether this micro-batch is the first of an optimizer step at which `log_grad_cosine_steps` measures."""
        every = self.args.log_grad_cosine_steps
        if not every or not self.model.training or not torch.is_grad_enabled():
            return False
        step = self.state.global_step
        return step % every == 0 and self._grad_cosine_step != step

    def _log_grad_cosine(self, student: nn.Module, terms: dict[str, torch.Tensor]) -> None:
        """Log the cosine between the gradients of the OPD and NCA token means of this micro-batch, over the trainable
        parameters. `torch.autograd.grad` keeps the graph and leaves `.grad` alone: the step's update is unchanged."""
        params = [p for p in student.parameters() if p.requires_grad]
        tokens = max(terms["opd"].numel(), 1)
        opd = loss_gradients(terms["opd"].sum() / tokens, params)
        self._record_grad_cosine(opd, loss_gradients(terms["nca"].sum() / tokens, params))

    def _record_grad_cosine(self, opd_gradient, nca_gradient) -> None:
        """Log `grad_cosine`, `grad_norm_opd` and `grad_norm_nca` of this micro-batch's two term gradients."""
        self._grad_cosine_step = self.state.global_step
        result = compare_gradients(opd_gradient, nca_gradient)
        values = [result.cosine, result.norm_a, result.norm_b]
        if self.accelerator.num_processes > 1:  # each process measured its own micro-batch: log their mean
            values = self.accelerator.gather(torch.tensor([values], device=self.args.device)).mean(0).tolist()
        for name, value in zip(("grad_cosine", "grad_norm_opd", "grad_norm_nca"), values):
            self._metrics["train"][name].append(value)

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
