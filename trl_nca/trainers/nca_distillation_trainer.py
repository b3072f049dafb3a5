"""`NCADistillationTrainer`: NCA on TRL's stable `DistillationTrainer`, whose sampling (vLLM or `generate`) it keeps.

TRL samples every completion from the student's no-context prompt, once per gradient-accumulation window, and counts
the window's completion tokens; this trainer adds the context prompts of the same rows, and replaces the loss method by
the NCA objective shared with `NCATrainer` (`trl_nca.trainers.objective.NCAObjective`): the student's two views and
the teacher are scored locally on the same completion ids, so vLLM never sees the context.

Read top to bottom, a run is: `__init__` (the models resolved, the datasets tokenised into both views,
DistillationTrainer's `__init__` without a teacher, which it documents for subclasses that supply their own, then the
NCA pieces: `trl_nca.trainers.setup.setup_nca`); an optimizer step, in which TRL's `_prepare_inputs` samples the
window (`_generate_and_score_completions` adds the context prompts) and `compute_loss` builds the `NCABatch`, runs the
step loss on it and adds its terms to the step statistics; the anchor step at the step's end.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedTokenizerBase
from trl import DistillationTrainer

from ..core.sampling import policy_mode
from ..core.views import left_pad, split_example
from .activation_checkpointing import quiet_old_checkpointing_names
from .anchor import add_anchor_sentence, resume_anchor
from .batch import NCABatch
from .console import explain_training
from .data import named_datasets, prepare_dataset, prepare_splits, prepared_eval_dataset
from .nca_distillation_config import NCADistillationConfig
from .served_teacher import ServedTeacher, served_teacher, stop_with_checkpoint
from .setup import NCA_PAPER, checked_config, resolve_models, setup_nca
from .stats import batch_stats
from .vllm_sync import reload_colocated_weights, reloads_weights


logger = logging.getLogger(__name__)


class NCADistillationTrainer(DistillationTrainer):
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
        args = checked_config(args, NCADistillationConfig, "nca-distillation-output", "NCADistillationTrainer")
        _refuse_tools(tools)
        teacher_model = served_teacher(args, teacher_model)  # a teacher behind a vLLM server, reached before any work
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
            teacher_init_kwargs=_teacher_init_kwargs(args),
            text_only=True,
        )
        _check_teacher_and_sampling(models, args.use_vllm)
        self.limits, self.context_spec = models.limits, args.context_spec
        prepare = self._tokenise(models.tokenizer)
        train_dataset, eval_dataset = prepare_splits(prepare, train_dataset, eval_dataset)
        # DistillationTrainer without a teacher (its documented case for subclasses that supply one): the teacher is
        # NCA's (`setup_nca`), since a self-teacher has no parameters of its own and teachers whose output layer is
        # padded to another size than the student's are supported (the divergences use the common rows), which
        # DistillationTrainer's vocab_size check would refuse.
        with quiet_old_checkpointing_names():  # PEFT's PeftModel, which the base trainer may build, reads an old name
            super().__init__(
                models.student,
                teacher_model=None,
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=models.tokenizer,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
            )
        self.teacher_model, self.nca, self.step_loss, self.step_stats, self.anchor_step = setup_nca(
            self,
            models,
            completions=False,  # DistillationTrainer logs the completion lengths itself
        )
        self.add_callback(self.anchor_step)
        self._last_loaded_step = None  # the step whose weights the colocated vLLM engine last took (`vllm_sync`)
        explain_training(self)  # what the run prints (trl_nca.trainers.console): compact logs, named bar, estimate

    def _tokenise(self, tokenizer):
        """`prepare(dataset, split)`: one split with both views tokenised (`prepare_dataset`), and every row's
        `prompt` as chat messages."""

        def prepare(dataset, split: str):
            return _with_chat_prompt(prepare_dataset(dataset, tokenizer, self.context_spec, self.limits, split))

        return prepare

    @property
    def nca_beta(self) -> float:
        """The anchor weight of the optimizer step in progress (`nca_beta_schedule`)."""
        return self.nca.schedule.value

    def train(self, resume_from_checkpoint=None, **kwargs):
        """DistillationTrainer's `train`; a checkpoint to resume from is resolved and checked first, and the anchor's
        state restored from it (`resume_anchor`)."""
        checkpoint = resume_anchor(resume_from_checkpoint, self.args.output_dir, self.anchor_step)
        with stop_with_checkpoint(self):  # a lost teacher server: a checkpoint at the last step boundary
            return super().train(resume_from_checkpoint=checkpoint, **kwargs)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        # The token columns of both views survive `remove_unused_columns=True`.
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, "prompt_ids", "context_prompt_ids"]))

    # ----------------------------------------------------------------------------------------------------------------
    # Sampling: TRL's, from the no-context prompt; then the context prompts of the same rows.

    def _generate_single_turn(self, *args, **kwargs):
        # On vLLM's CPU build the colocated engine takes the weights through vLLM's reload (`vllm_sync`), before
        # TRL's own push, which would fail there; TRL then finds the step already synced.
        generation = self.vllm_generation if self.use_vllm else None
        if self.state.global_step != self._last_loaded_step and reloads_weights(generation):
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

    def training_step(self, model, inputs, num_items_in_batch):
        """DistillationTrainer's step (its `_prepare_inputs` samples the window). Trainer runs the backward of the
        loss, so the loss may run the views in sequence (`StepLoss.trainer_backward`)."""
        with self.step_loss.trainer_backward():
            return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The NCA objective in place of DistillationTrainer's loss, on the `NCABatch` of TRL's micro-batch
        (`nca_batch`), with its token count and entropy logging: the loss is divided by the
        completion tokens of the gradient-accumulation window over all processes (divided by the process count: DDP
        averages the processes' gradients) in training, by the micro-batch's in evaluation."""
        batch = self.nca_batch(inputs)
        if self.model.training and batch.step_tokens is not None:
            num_items_in_batch = batch.step_tokens.clamp(min=1.0) / self.accelerator.num_processes
        num_valid = batch.completion_mask.sum()
        divisor = num_valid.clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        result = self.step_loss(model, batch, lambda total: total / divisor, entropy=True)
        self._log_entropy(result.terms["entropy"], num_valid)
        lengths = batch.completion_mask.sum(1)
        total = self.nca.total(result.terms).detach()
        stats = batch_stats(result.terms, total, lengths, torch.zeros_like(lengths), batch.on_policy)
        self.step_stats.add(stats, training=self.model.training)
        return (result.loss, None) if return_outputs else result.loss

    def nca_batch(self, inputs) -> NCABatch:
        """The `NCABatch` of TRL's micro-batch (every completion sampled from the student, the window's token count
        `num_items_in_batch` kept where TRL counted it): the one place this trainer builds it."""
        return NCABatch.from_mapping(
            inputs,
            DISTILLATION_VIEW_KEYS,
            "NCADistillationTrainer",
            on_policy=True,
            step_tokens=inputs.get("num_items_in_batch"),
        )

    def _log_entropy(self, entropy: torch.Tensor, num_valid: torch.Tensor) -> None:
        """DistillationTrainer's `entropy`: the mean per-token entropy of the student's no-context view (in nats)
        over all processes, gathered after the redirected forward has returned."""
        mode = "train" if self.model.training else "eval"
        num_valid = self.accelerator.gather_for_metrics(num_valid).sum()
        entropy_sum = self.accelerator.gather_for_metrics(entropy.detach().sum()).sum()
        self._metrics[mode]["entropy"].append((entropy_sum / num_valid).item() if num_valid > 0 else 0.0)

    # ----------------------------------------------------------------------------------------------------------------
    # Evaluation

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """DistillationTrainer's `evaluate`; a dataset given here (or a dict of them) is checked and tokenised into
        both views as the datasets given at init are (a name selects one of those)."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            eval_dataset = prepared_eval_dataset(self._tokenise(self.processing_class), eval_dataset, self.context_spec)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        """Trainer's loop; then `eval_loss` and the logged terms become token means over the whole evaluation set
        (Trainer would average per-batch means)."""
        self.step_stats.open_eval()
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        return self.step_stats.close_eval(output, self.args.device, metric_key_prefix)

    def create_model_card(self, *args, **kwargs):
        """TRL's model card, with the sentence on the anchor the run used (`add_anchor_sentence`)."""
        super().create_model_card(*args, **kwargs)
        if self.is_world_process_zero():
            add_anchor_sentence(Path(self.args.output_dir) / "README.md", self.nca.schedule.describe())


def _refuse_tools(tools) -> None:
    if tools:
        raise ValueError(
            "NCADistillationTrainer does not take `tools`: the context view is rendered from the text prompt and "
            "scored on the sampled completion, which tool calls would interleave with tool results. Train tool "
            "use with DistillationTrainer, or drop `tools`."
        )


def _teacher_init_kwargs(args: NCADistillationConfig) -> dict:
    """`teacher_model_init_kwargs`, with `teacher_model_revision` as its revision unless it names one."""
    init_kwargs = dict(args.teacher_model_init_kwargs or {})
    if args.teacher_model_revision is not None:
        init_kwargs.setdefault("revision", args.teacher_model_revision)
    return init_kwargs


def _check_teacher_and_sampling(models, use_vllm: bool) -> None:
    """A served teacher's tokenizer is the student's (`ServedTeacher.check_tokenizer`), and vLLM can sample only from
    rows the teacher scores (`_check_vllm_can_sample`)."""
    if isinstance(models.teacher, ServedTeacher):
        models.teacher.check_tokenizer(models.tokenizer)
    _check_vllm_can_sample(models.common_rows, use_vllm)


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


def _with_chat_prompt(dataset):
    """Every row's `prompt` as chat messages (a `messages` row without its reference answer, a string as one user
    turn), which is what DistillationTrainer renders with the chat template and samples from."""
    column_names = getattr(dataset, "column_names", None)
    remove = [c for c in ("prompt", "messages") if column_names is not None and c in column_names]

    def to_chat(example, index):
        prompt, _ = split_example(example, where=f"row {index}")
        return {"prompt": prompt}

    return dataset.map(to_chat, with_indices=True, remove_columns=remove)
