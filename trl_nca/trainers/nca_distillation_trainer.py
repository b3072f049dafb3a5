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

from datasets import Dataset
from torch import nn
from transformers import PreTrainedTokenizerBase
from trl import DistillationTrainer

from ..core.sampling import policy_mode
from ..core.views import left_pad, split_example
from .activation_checkpointing import quiet_old_checkpointing_names
from .batch import NCABatch
from .data import prepare_dataset
from .mixin import NCATrainerMixin
from .nca_distillation_config import NCADistillationConfig
from .served_teacher import ServedTeacher, served_teacher, stop_with_checkpoint
from .setup import NCA_PAPER, named_datasets, resolve_models
from .vllm_sync import reload_colocated_weights, reloads_weights


logger = logging.getLogger(__name__)


class NCADistillationTrainer(NCATrainerMixin, DistillationTrainer):
    """On-policy context distillation with No-Context Anchoring on TRL's `DistillationTrainer`.

    The loss is `NCATrainer`'s (same code): OPD + `nca_beta` * NCA per completion token of a sample drawn from the
    student without the context (the formulas: `trl_nca.core.losses`), averaged over every completion token of the
    optimizer step. What differs is the machinery
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
    config_class = NCADistillationConfig
    default_output_dir = "nca-distillation-output"
    logs_completion_stats = False  # DistillationTrainer logs the completion lengths itself

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
        args = self._checked_args(args)
        _refuse_tools(tools)
        teacher_model = served_teacher(args, teacher_model)  # a teacher behind a vLLM server, reached before any work
        init_kwargs = dict(args.teacher_model_init_kwargs or {})
        if args.teacher_model_revision is not None:
            init_kwargs.setdefault("revision", args.teacher_model_revision)
        models = resolve_models(
            "NCADistillationTrainer",
            args,
            model,
            teacher_model,
            processing_class=processing_class,
            teacher_processing_class=teacher_processing_class,
            peft_config=peft_config,
            get_student=lambda: self.model,
            datasets=named_datasets(train_dataset, eval_dataset),
            max_new_tokens=args.max_completion_length,
            teacher_init_kwargs=init_kwargs,
            text_only=True,
        )
        model, processing_class, teacher = models.student, models.tokenizer, models.teacher
        if isinstance(teacher, ServedTeacher):
            teacher.check_tokenizer(processing_class)
        _check_vllm_can_sample(models.common_rows, args.use_vllm)
        self.limits = models.limits
        self.context_spec = args.context_spec

        train_dataset, eval_dataset = self._prepare_datasets(args, processing_class, train_dataset, eval_dataset)

        # The teacher is prepared here, not by DistillationTrainer: a self-teacher has no parameters of its own, and
        # teachers whose output layer is padded to another size than the student's are supported (the divergences
        # use the common rows), which DistillationTrainer's vocab_size check would refuse.
        self._init_base(
            model, None, args, train_dataset, eval_dataset, processing_class, callbacks, optimizers, peft_config
        )
        self._setup_nca(teacher, models.common_rows, placed=False, requested_reentrant=models.requested_reentrant)

    def _prepare_split(self, args, tokenizer, dataset, split: str):
        """Both views tokenised (`prepare_dataset`), and every row's `prompt` as chat messages."""
        return _with_chat_prompt(prepare_dataset(dataset, tokenizer, self.context_spec, self.limits, split))

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        # The token columns of both views survive `remove_unused_columns=True`.
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, "prompt_ids", "context_prompt_ids"]))

    # ----------------------------------------------------------------------------------------------------------------
    # Sampling: TRL's, from the no-context prompt; then the context prompts of the same rows.

    def train(self, *args, **kwargs):
        with stop_with_checkpoint(self):  # a lost teacher server: a checkpoint at the last step boundary
            return super().train(*args, **kwargs)

    def _generate_single_turn(self, *args, **kwargs):
        # On vLLM's CPU build the colocated engine takes the weights through vLLM's reload (`vllm_sync`), before
        # TRL's own push, which would fail there; TRL then finds the step already synced.
        generation = getattr(self, "vllm_generation", None) if self.use_vllm else None
        if self.state.global_step != getattr(self, "_last_loaded_step", None) and reloads_weights(generation):
            reload_colocated_weights(generation)
            self._last_loaded_step = self.state.global_step
        # DistillationTrainer samples in training mode, so with `disable_dropout=False` (its default) and LoRA's
        # `lora_dropout` the samples would come from a thinned student. The policy samples here; the training
        # forwards keep their dropout. (vLLM has no dropout: unchanged.)
        with policy_mode(self.model):
            return super()._generate_single_turn(*args, **kwargs)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        with quiet_old_checkpointing_names():  # TRL samples through unwrap_model_for_generation (old names)
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
    # Loss: the shared NCA objective inside the student's redirected forward, as DistillationTrainer runs its own.

    def _prepare_inputs(self, generation_batch):
        """TRL's micro-batch (the buffered window slice in training) as an `NCABatch`. In training this is called by
        Trainer.training_step only, which runs the batch's backward: its loss may run its views in sequence
        (`NCABatch.training_step`)."""
        if isinstance(generation_batch, NCABatch):
            return generation_batch
        inputs = super()._prepare_inputs(generation_batch)
        return _nca_batch(inputs, training_step=self.model.training)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The NCA objective in place of DistillationTrainer's loss, with its token count and entropy logging: the
        loss is divided by the completion tokens of the gradient-accumulation window over all processes (divided by
        the process count: DDP averages the processes' gradients) in training, by the micro-batch's in evaluation."""
        batch = inputs if isinstance(inputs, NCABatch) else _nca_batch(inputs)
        if self.model.training and batch.step_tokens is not None:
            num_items_in_batch = batch.step_tokens.clamp(min=1.0) / self.accelerator.num_processes
        num_valid = batch.completion_mask.sum()
        divisor = num_valid.clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        loss = self._nca_loss(model, batch, lambda total: total / divisor, entropy=True)
        return (loss, None) if return_outputs else loss


def _refuse_tools(tools) -> None:
    if tools:
        raise ValueError(
            "NCADistillationTrainer does not take `tools`: the context view is rendered from the text prompt and "
            "scored on the sampled completion, which tool calls would interleave with tool results. Train tool "
            "use with DistillationTrainer, or drop `tools`."
        )


def _check_vllm_can_sample(common_rows: tuple[int, int], use_vllm: bool) -> None:
    common, widest = common_rows
    if widest > common and use_vllm:
        raise ValueError(
            f"The student's output layer has more rows ({widest}) than the teacher's ({common}), and vLLM cannot "
            "be told to never sample the ids the teacher cannot score. Sample with `use_vllm=False`, or use a "
            "teacher whose output layer is at least as wide as the student's."
        )


# DistillationTrainer's names of NCA's view keys (`trl_nca.trainers.batch.VIEW_KEYS`), in their order.
DISTILLATION_VIEW_KEYS = (
    "prompt_ids",
    "prompt_mask",
    "context_prompts",
    "context_prompt_attention_mask",
    "completion_ids",
    "completion_mask",
)


def _nca_batch(inputs: dict[str, Any], training_step: bool = False) -> NCABatch:
    """DistillationTrainer's micro-batch as an `NCABatch`: every completion sampled from the student, the window's
    token count (`num_items_in_batch`) kept where TRL counted it."""
    return NCABatch.from_mapping(
        inputs,
        DISTILLATION_VIEW_KEYS,
        "NCADistillationTrainer",
        on_policy=True,
        training_step=training_step,
        step_tokens=inputs.get("num_items_in_batch"),
    )


def _with_chat_prompt(dataset):
    """Every row's `prompt` as chat messages (a `messages` row without its reference answer, a string as one user
    turn), which is what DistillationTrainer renders with the chat template and samples from."""
    column_names = getattr(dataset, "column_names", None)
    remove = [c for c in ("prompt", "messages") if column_names is not None and c in column_names]

    def to_chat(example, index):
        prompt, _ = split_example(example, where=f"row {index}")
        return {"prompt": prompt}

    return dataset.map(to_chat, with_indices=True, remove_columns=remove)
