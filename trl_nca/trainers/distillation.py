"""`NCADistillationTrainer`: NCA on TRL's stable `DistillationTrainer`, whose sampling (vLLM or `generate`) it keeps.

TRL samples every completion from the student's no-context prompt, once per gradient-accumulation window, and counts
the window's completion tokens; this trainer adds the context prompts of the same rows, and replaces the loss method
(which TRL runs inside its forward redirection) by the NCA objective shared with `NCATrainer`
(`trl_nca.trainers.objective.NCAObjective`): the student's two views and the teacher are scored locally on the same
completion ids, so vLLM never sees the context.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from trl import DistillationTrainer
from trl.models import prepare_deepspeed
from trl.trainer.utils import create_model_from_path

from ..core.launch import placed_init_kwargs
from ..core.views import left_pad, split_example
from ..models.names import resolve_model_name_or_path
from .config import NCADistillationConfig
from .data import Limits, check_examples, check_tokenizer, prepare_dataset
from .objective import (
    NCA_PAPER,
    NCAObjective,
    ScheduleCheckpoint,
    batch_stats,
    checked_launch,
    load_schedule,
    named_datasets,
    position_limit,
    record_means,
    resolve_resume,
    token_mean_eval_loss,
)
from .teacher import SelfTeacher, check_output_rows, resolve_teacher, settle_teacher


logger = logging.getLogger(__name__)


class NCADistillationTrainer(DistillationTrainer):
    """On-policy context distillation with No-Context Anchoring on TRL's `DistillationTrainer`.

    The loss is `NCATrainer`'s (same code): per completion token of a sample drawn from the student without the
    context, `OPD(student | prompt, teacher | prompt + context) + nca_beta * KL(sg[student | prompt] || student |
    prompt + context)`, averaged over every completion token of the optimizer step. What differs is the machinery
    around it, which is `DistillationTrainer`'s: sampling with vLLM (`use_vllm=True`, colocated or a server) or
    `generate`, once per gradient-accumulation window; its sampling fields (`temperature`, `top_p`, `top_k`, `min_p`,
    `max_completion_length`); its logging of completion lengths and entropy. Every step is on-policy.

    `callbacks`, `optimizers` and `peft_config` are those of `DistillationTrainer`. `tools` and vision-language
    processors are not supported (the context view is rendered from the text prompt).

    Args:
        model: the student (a model, or a name/path loaded with `args.model_init_kwargs`).
        teacher_model: a separate teacher (model or name/path) sharing the student's tokenizer, or `None` for
            self-distillation from the student's initial weights (`args.self_teacher`): with a LoRA adapter the
            teacher is the student with its adapter disabled (no second copy), otherwise a frozen copy.
        args: an [`NCADistillationConfig`].
        train_dataset: `prompt` (a string or a list of messages) or `messages` rows, with the context in
            `args.context_column` unless `args.context_text` is set (as for `NCATrainer`).
        eval_dataset: the same format as `train_dataset` (or a dict of such datasets).
        processing_class: the student's tokenizer, with a chat template and a pad token (text only).
        teacher_processing_class: the teacher's tokenizer, to check that it maps every token to the same id.
    """

    _tag_names = ["trl", "distillation", "trl-nca", "nca", "context-distillation"]
    _name = "NCA (DistillationTrainer)"
    _paper = NCA_PAPER

    def __init__(
        self,
        model: nn.Module | str | None = None,
        teacher_model: nn.Module | str | None = None,
        args: NCADistillationConfig | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        teacher_processing_class: PreTrainedTokenizerBase | None = None,
        tools=None,
    ):
        if args is None:
            args = NCADistillationConfig(output_dir="nca-distillation-output")
        elif not isinstance(args, NCADistillationConfig):
            raise TypeError(f"NCADistillationTrainer needs an NCADistillationConfig, got {type(args).__name__}.")
        if tools:
            raise ValueError(
                "NCADistillationTrainer does not take `tools`: the context view is rendered from the text prompt and "
                "scored on the sampled completion, which tool calls would interleave with tool results. Train tool "
                "use with DistillationTrainer, or drop `tools`."
            )
        model = resolve_model_name_or_path(model, "Student model")
        state = checked_launch(args, "NCADistillationTrainer")
        for split, dataset in named_datasets(train_dataset, eval_dataset):  # before any model is loaded
            check_examples(dataset, args.context_spec, split)
        model_id = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
        if isinstance(model, str):
            model = create_model_from_path(
                model, **placed_init_kwargs(args.model_init_kwargs, "the student", state, args.device)
            )
            args.model_init_kwargs = None  # used here; DistillationTrainer would warn that the model is already built
        if processing_class is None:
            if not model_id:
                raise ValueError("Pass the tokenizer as `processing_class`; the model does not say where it came from.")
            processing_class = AutoTokenizer.from_pretrained(model_id)
        if not isinstance(processing_class, PreTrainedTokenizerBase):
            raise TypeError(
                f"NCADistillationTrainer is text-only: `processing_class` must be a tokenizer, got a "
                f"{type(processing_class).__name__}. Pass the processor's `.tokenizer` for a text-only student."
            )
        check_tokenizer(processing_class)

        if teacher_model is None and args.teacher_model_name_or_path is not None:
            teacher_model = args.teacher_model_name_or_path
        teacher_model = resolve_model_name_or_path(teacher_model, "Teacher model")
        init_kwargs = dict(args.teacher_model_init_kwargs or {})
        if args.teacher_model_revision is not None:
            init_kwargs.setdefault("revision", args.teacher_model_revision)
        teacher = resolve_teacher(
            teacher_model, model, student_tokenizer=processing_class, teacher_tokenizer=teacher_processing_class,
            self_teacher=args.self_teacher, peft_config=peft_config, get_student=lambda: self.model,
            init_kwargs=placed_init_kwargs(init_kwargs, "the teacher", state, args.device),
            trust_remote_code=args.trust_remote_code,
        )  # fmt: skip
        common, widest = self._common_rows = check_output_rows(model, teacher, processing_class)
        if widest > common and args.use_vllm:
            raise ValueError(
                f"The student's output layer has more rows ({widest}) than the teacher's ({common}), and vLLM cannot "
                "be told to never sample the ids the teacher cannot score. Sample with `use_vllm=False`, or use a "
                "teacher whose output layer is at least as wide as the student's."
            )

        self.limits = Limits(
            max_new_tokens=args.max_completion_length,
            max_context_length=args.max_context_length or position_limit(model, teacher),
            truncate_context=args.truncate_context,
        )
        self.context_spec = args.context_spec

        def prepare(dataset, split):
            if dataset is None:
                return None
            dataset = prepare_dataset(dataset, processing_class, self.context_spec, self.limits, split)
            return _with_chat_prompt(dataset)

        train_dataset = prepare(train_dataset, "train")
        if isinstance(eval_dataset, dict):
            eval_dataset = {name: prepare(ds, f"eval {name}") for name, ds in eval_dataset.items()}
        else:
            eval_dataset = prepare(eval_dataset, "eval")

        # The teacher is prepared here, not by DistillationTrainer: a self-teacher has no parameters of its own, and
        # teachers whose output layer is padded to another size than the student's are supported (the divergences
        # use the common rows), which DistillationTrainer's vocab_size check would refuse.
        super().__init__(
            model,
            teacher_model=None,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
        )
        teacher = settle_teacher(teacher, self.model) or teacher  # the student is PEFT-wrapped only now
        if isinstance(teacher, SelfTeacher):
            self.teacher_model = teacher  # calls the student, which the accelerator already wraps
        elif self.is_deepspeed_enabled:
            self.teacher_model = prepare_deepspeed(teacher, self.accelerator)
        else:
            self.teacher_model = self.accelerator.prepare_model(teacher, evaluation_mode=True)
        if widest > common:  # sampling never emits an id past the common rows, which the teacher could not score
            self.generation_kwargs["suppress_tokens"] = list(range(common, widest))
            self.generation_config.suppress_tokens = list(range(common, widest))

        self.nca = NCAObjective(
            args, processing_class.pad_token_id, self.model, self._teacher(), deepspeed=self.is_deepspeed_enabled
        )
        self.nca_schedule = self.nca.schedule
        self.add_callback(ScheduleCheckpoint(self.nca_schedule))
        self._step_sums = None
        self._eval_sums = None
        self._last_terms = None
        self._sequence = None  # the no-context half's results while a micro-batch runs its views in sequence

    @property
    def nca_beta(self) -> float:
        """The anchor weight of the optimizer step in progress (`nca_beta_schedule`)."""
        return self.nca_schedule.value

    def train(self, resume_from_checkpoint=None, **kwargs):
        resume_from_checkpoint = resolve_resume(resume_from_checkpoint, self.args.output_dir)
        if isinstance(resume_from_checkpoint, str):
            load_schedule(self.nca_schedule, resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        # The token columns of both views survive `remove_unused_columns=True`.
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, "prompt_ids", "context_prompt_ids"]))

    def _teacher(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.teacher_model)

    # ----------------------------------------------------------------------------------------------------------------
    # Sampling: TRL's, from the no-context prompt; then the context prompts of the same rows.

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        prompts, prompt_mask = output["prompt_ids"], output["prompt_mask"].bool()
        for index, row in enumerate(inputs):
            sampled_from = prompts[index][prompt_mask[index]].tolist()
            if sampled_from != list(row["prompt_ids"]):
                raise ValueError(
                    f"DistillationTrainer rendered a prompt into {len(sampled_from)} tokens, trl-nca into "
                    f"{len(row['prompt_ids'])} tokens (with the same chat template), so the context view would not "
                    "extend the prompt the completion was sampled from. This happens with `chat_template_kwargs` "
                    "(not supported by NCADistillationTrainer yet) or a tokenizer whose chat template tokenises "
                    "differently in one call than as text: drop `chat_template_kwargs`, or use NCATrainer."
                )
        ids, mask = left_pad([row["context_prompt_ids"] for row in inputs], self.processing_class.pad_token_id)
        output["context_prompts"] = ids.to(prompts.device)
        output["context_prompt_attention_mask"] = mask.to(prompts.device)
        return output

    # ----------------------------------------------------------------------------------------------------------------
    # Loss: the shared NCA objective inside DistillationTrainer's forward redirection; logged outside it.

    def _compute_loss(self, unwrapped_student, inputs, num_items_in_batch):
        """Replaces DistillationTrainer's loss method (same contract: loss, entropy sum, valid-token count). With the
        views in sequence (`_views_in_sequence`) it computes the no-context half only."""
        batch = _nca_batch(inputs)
        num_valid = inputs["completion_mask"].sum()
        # evaluation: the micro-batch's token mean; training: the window's tokens over all processes, divided by the
        # process count (DistillationTrainer)
        divisor = num_valid.clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        if self._sequence is not None:
            terms, self._sequence["carry"] = self.nca.no_context_terms(unwrapped_student, self._teacher(), batch, True)
            self._sequence.update(terms=terms, divisor=divisor)
            return terms["opd"].sum() / divisor, terms["entropy"].detach().sum(), num_valid
        need_context = self.nca.need_context()
        terms = self.nca.token_divergences(unwrapped_student, self._teacher(), batch, need_context, entropy=True)
        total = self.nca.total(terms)
        self._last_terms = (terms, total.detach(), inputs["completion_mask"])
        return total / divisor, terms["entropy"].detach().sum(), num_valid

    def _views_in_sequence(self, model, inputs, num_items_in_batch):
        """The micro-batch's loss with the no-context view (and teacher) backpropagated before the context view runs
        (`nca_sequential_views`; `NCAObjective.backward_in_sequence`): DistillationTrainer's own loss call computes
        the no-context half, then the context half runs in a redirected forward of its own."""
        self._sequence = {}
        unwrapped = self.accelerator.unwrap_model(model)
        batch = _nca_batch(inputs)

        def no_context_loss():
            return super(NCADistillationTrainer, self).compute_loss(
                model, inputs, num_items_in_batch=num_items_in_batch
            )

        def context_loss():
            half = self._sequence
            context = self._forward_redirection(
                model, unwrapped, self.nca.context_terms, unwrapped, batch, half["carry"]
            )
            half["terms"].update(context)
            return self.nca.beta * context["nca"].sum() / half["divisor"]

        try:
            loss = self.nca.backward_in_sequence(self.accelerator, model, no_context_loss, context_loss)
            terms = self._sequence["terms"]
        finally:
            self._sequence = None
        self._last_terms = (terms, self.nca.total(terms).detach(), inputs["completion_mask"])
        return loss

    def training_step(self, model, inputs, num_items_in_batch):
        with self.nca.training_step():
            return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.nca.in_sequence():
            loss = self._views_in_sequence(model, inputs, num_items_in_batch)
            out = (loss, None) if return_outputs else loss
        else:
            out = super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        terms, total, completion_mask = self._last_terms
        self._last_terms = None
        lengths = completion_mask.sum(1)
        stats = batch_stats(terms, total, lengths, torch.zeros_like(lengths), on_policy=True)
        if not self.model.training:
            self._eval_sums = stats if self._eval_sums is None else self._eval_sums + stats
            return out
        # DistillationTrainer counts micro-batches in `_step`; a window of gradient_accumulation_steps of them is one
        # optimizer step, whose terms are logged as token means over all its micro-batches.
        position = self._step % self.args.gradient_accumulation_steps
        self._step_sums = stats if position == 0 or self._step_sums is None else self._step_sums + stats
        if position == self.args.gradient_accumulation_steps - 1:
            means = self._record_means(self._step_sums, "train")
            self._metrics["train"]["nca_beta"].append(self.nca_beta)
            self.nca_schedule.update(means)
            self._step_sums = None
        return out

    def _token_divergences(self, student: nn.Module, inputs: dict[str, Any], need_context: bool):
        """Per-token terms of a batch in NCA's view keys
        (`trl_nca.trainers.objective.NCAObjective.token_divergences`)."""
        return self.nca.token_divergences(student, self._teacher(), inputs, need_context)

    def _record_means(self, stats: torch.Tensor, mode: str) -> dict[str, float]:
        show_nca = self.nca.active or self.args.nca_monitor
        return record_means(stats, self.accelerator, self._metrics[mode], show_nca, completions=False)

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        """Trainer's loop; then `eval_loss` and the logged terms become token means over the whole evaluation set
        (Trainer would average per-batch means)."""
        self._eval_sums = None
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        sums, self._eval_sums = self._eval_sums, None
        return token_mean_eval_loss(output, sums, self._record_means, self.args.device, metric_key_prefix)


def _nca_batch(inputs: dict[str, Any]) -> dict[str, Any]:
    """DistillationTrainer's micro-batch in NCA's view keys (`trl_nca.trainers.data.VIEW_KEYS`)."""
    return {
        "prompts": inputs["prompt_ids"],
        "prompt_attention_mask": inputs["prompt_mask"],
        "context_prompts": inputs["context_prompts"],
        "context_prompt_attention_mask": inputs["context_prompt_attention_mask"],
        "completion_ids": inputs["completion_ids"],
        "completion_mask": inputs["completion_mask"],
    }


def _with_chat_prompt(dataset):
    """Every row's `prompt` as chat messages (a `messages` row without its reference answer, a string as one user
    turn), which is what DistillationTrainer renders with the chat template and samples from."""
    column_names = getattr(dataset, "column_names", None)
    remove = [c for c in ("prompt", "messages") if column_names is not None and c in column_names]

    def to_chat(example, index):
        prompt, _ = split_example(example, where=f"row {index}")
        return {"prompt": prompt}

    return dataset.map(to_chat, with_indices=True, remove_columns=remove)
