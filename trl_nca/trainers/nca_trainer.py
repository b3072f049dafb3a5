"""`NCATrainer`: GKDTrainer whose teacher reads the privileged context and whose student is anchored across views."""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers import PreTrainedTokenizerBase
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
from trl.import_utils import TRLExperimentalWarning
from trl.models.utils import _ForwardRedirection, unwrap_model_for_generation
from trl.trainer.sft_trainer import SFTTrainer

from ..core.launch import agreed_max, agreed_min, rank0_choice
from ..core.sampling import (
    Generated,
    mask_through_eos,
    policy_mode,
    sharable_prefix_tokens,
    shared_prefill,
)
from ..core.views import ContextSpec, left_pad
from .activation_checkpointing import quiet_old_checkpointing_names
from .batch import NCABatch
from .data import NCACollator, check_collator, prepare_dataset, tokenize_example
from .mixin import NCATrainerMixin
from .nca_config import NCAConfig
from .rollouts import Rollout
from .setup import NCA_PAPER, named_datasets, resolve_models
from .teacher import as_teacher


with warnings.catch_warnings():  # NCATrainer builds on trl.experimental.gkd on purpose (see docs/design.md)
    warnings.simplefilter("ignore", TRLExperimentalWarning)
    from trl.experimental.gkd import GKDTrainer


logger = logging.getLogger(__name__)


class NCATrainer(NCATrainerMixin, GKDTrainer):
    """On-policy context distillation with No-Context Anchoring; a drop-in replacement for `GKDTrainer`.

    Each example has a prompt and a privileged context. On an on-policy step the student samples a completion from the
    prompt alone; the teacher scores it with the context; the student is trained on OPD (towards the teacher, from
    the prompt alone) + `nca_beta` * NCA (the student with the context anchored to the student without it), per token
    as `trl_nca.core.losses` writes them, averaged over every completion token of the optimizer step (across gradient
    accumulation and processes).

    The arguments not listed below are those of `GKDTrainer`.

    Args:
        model: the student (a model, or a name/path loaded with `args.model_init_kwargs`).
        teacher_model: a separate teacher (model or name/path) sharing the student's tokenizer, or `None` for
            self-distillation from the student's initial weights (see `NCAConfig.self_teacher`): with a LoRA adapter
            the teacher is the student with its adapter disabled, otherwise a frozen copy.
        args: an [`NCAConfig`].
        train_dataset: a dataset in GKD's `messages` format or prompt-only (`prompt` as a string or a list of
            messages), with the context in `args.context_column` unless `args.context_text` is set.
        eval_dataset: the same format as `train_dataset` (or a dict of such datasets).
        rollout: episodes played by the student instead of a dataset: any `trl_nca.trainers.rollouts.Rollout`, e.g.
            `trl_nca.envs.GameRollout` for the text games. Every optimizer step plays the `rollout.episodes_per_step`
            seeds of `rollout.seeds(step)` (per_device_train_batch_size x gradient_accumulation_steps x processes)
            with the student, without the context; every sample it returns (one per model call) is scored with the
            context in the context view.
        teacher_processing_class: the teacher's tokenizer, to check that it maps every token to the same id as the
            student's. By default it is loaded from the teacher's path (or the folder a teacher model was loaded
            from), when there is one.
    """

    _tag_names = ["trl", "gkd", "trl-nca", "nca", "context-distillation"]
    _name = "NCA"
    _paper = NCA_PAPER
    config_class = NCAConfig
    default_output_dir = "nca-output"
    logs_completion_stats = True  # completions/mean_length, clipped_ratio, on_policy: GKD logs none of them
    # compute_loss divides by the token count of the whole optimizer step, so Trainer must not divide again.
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: nn.Module | str | None = None,
        teacher_model: nn.Module | str | None = None,
        args: NCAConfig | None = None,
        data_collator=None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        preprocess_logits_for_metrics=None,
        peft_config=None,
        formatting_func=None,
        rollout: Rollout | None = None,
        teacher_processing_class: PreTrainedTokenizerBase | None = None,
    ):
        args = self._checked_args(args)
        _refuse_metric_functions(
            compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess_logits_for_metrics
        )
        models = resolve_models(
            "NCATrainer",
            args,
            model,
            teacher_model,
            processing_class=processing_class,
            teacher_processing_class=teacher_processing_class,
            peft_config=peft_config,
            get_student=lambda: self.model,
            datasets=named_datasets(train_dataset, eval_dataset) if rollout is None else (),
            max_new_tokens=args.max_new_tokens,
            max_length=args.max_length,
            teacher_init_kwargs=args.teacher_model_init_kwargs,
        )
        model, processing_class, teacher_model = models.student, models.tokenizer, models.teacher
        self.limits = models.limits
        # Set by `train` when it resumes from a checkpoint folder; `get_batch_samples` restores that checkpoint's
        # random state before sampling, and `_load_rng_state` then skips Trainer's second restore.
        self._resume_rng_from: str | None = None
        self._rng_restored_early = False

        train_dataset, eval_dataset, data_collator = self._setup_data(
            args, processing_class, rollout, train_dataset, eval_dataset, data_collator
        )

        with _gkd_init_adjusted(args, model, teacher_model, models.teacher_loaded_here):
            self._init_base(
                model,
                teacher_model,
                args,
                train_dataset,
                eval_dataset,
                processing_class,
                callbacks,
                optimizers,
                peft_config,
                data_collator=data_collator,
                formatting_func=formatting_func,
            )
        self._setup_after_base(args, models)

    def _setup_data(self, args, processing_class, rollout, train_dataset, eval_dataset, data_collator):
        """The rollout's seed dataset or the given datasets with the token columns of both views, and the collator;
        sets `rollout` and `context_spec`."""
        self.rollout = rollout
        context_spec = args.context_spec
        if rollout is not None:
            train_dataset, context_spec = _rollout_schedule(rollout, args, train_dataset)
            data_collator = data_collator or SeedCollator(processing_class.pad_token_id)
        self.context_spec = context_spec

        train_dataset, eval_dataset = self._prepare_datasets(
            args, processing_class, train_dataset, eval_dataset, training=rollout is None
        )
        if data_collator is None:
            data_collator = NCACollator(pad_token_id=processing_class.pad_token_id)
        elif rollout is None:
            _probe_collator(data_collator, train_dataset, eval_dataset)
        return train_dataset, eval_dataset, data_collator

    def _setup_after_base(self, args, models) -> None:
        """What follows GKD's `__init__`: the NCA objective (`_setup_nca`), sampling with the KV cache, the forward
        redirection and the gradient cosine's check."""
        # Under ZeRO-3 the student may already be partitioned: frozen_copy (inside replacement_teacher) gathers it
        # first. GKD has placed the teacher; only a frozen copy that replaces the self-teacher is placed again.
        self._setup_nca(
            self._teacher(), models.common_rows, placed=True, requested_reentrant=models.requested_reentrant
        )
        # GKD turns the KV cache off for sampling when gradient checkpointing is on, which makes sampling quadratic;
        # unwrap_model_for_generation already lifts checkpointing while sampling, so the cache is safe to keep.
        self.generation_kwargs["use_cache"] = True
        self.generation_config.use_cache = True
        self._forward_redirection = _ForwardRedirection()  # as DistillationTrainer names its own
        self._lockstep_generation = self.accelerator.num_processes > 1 and is_deepspeed_zero3_enabled()
        self._sampling_logged: set[str] = set()  # kinds of reason the sampling prefix ran unshared, logged once
        if args.log_grad_cosine_steps:
            _check_grad_cosine_setting(self)

    def _prepare_split(self, args, tokenizer, dataset, split: str):
        return prepare_dataset(dataset, tokenizer, self.context_spec, self.limits, split, args.dataset_num_proc)

    def _check_prepared(self, args, train_dataset, eval_dataset) -> None:
        """Off-policy steps (lmbda < 1 without seq_kd) train on the dataset's reference completions, and
        `eval_completions='dataset'` evaluates them: every such row needs one (`_check_references`)."""
        if train_dataset is not None and args.lmbda < 1.0 and not args.seq_kd:
            _check_references(train_dataset, "train")
        if args.eval_completions == "dataset":
            for name, dataset in (eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}).items():
                if dataset is not None:
                    _check_references(dataset, f"eval {name}".strip())

    # ----------------------------------------------------------------------------------------------------------------
    # Sampling

    def _resuming_from(self, checkpoint: str | None) -> None:
        self._resume_rng_from = checkpoint

    def _load_rng_state(self, checkpoint):
        # On a mid-epoch resume Trainer restores the RNG only after fetching the first batches; we sample there, so
        # the state was already restored in get_batch_samples and must not be rewound a second time.
        self._resume_rng_from = None
        if self._rng_restored_early:
            self._rng_restored_early = False
            return
        super()._load_rng_state(checkpoint)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """Fetch the micro-batches of one optimizer step, sample their completions, and count their tokens.

        Sampling happens here, before any backward pass, so the loss of every micro-batch can be divided by the number
        of completion tokens of the whole optimizer step (all micro-batches, all processes): gradient accumulation
        then gives the same update as one large batch.
        """
        batches, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self._resume_rng_from is not None:
            self._load_rng_state(self._resume_rng_from)  # resumed runs sample exactly what the uninterrupted run did
            self._rng_restored_early = True
        if self.rollout is not None:
            batches = [self._play_episodes(batch) for batch in batches]
        else:
            batches = [self._with_completions(self._prepare_inputs(batch)) for batch in batches]
        if not batches:
            return batches, None
        tokens = torch.stack([b.completion_mask.sum() for b in batches]).sum()
        if self.accelerator.num_processes > 1:
            tokens = self.accelerator.gather(tokens).sum()
        return batches, tokens

    def _with_completions(self, inputs: dict[str, Any], on_policy: bool | None = None) -> NCABatch:
        """The `NCABatch` of a collated batch, its completions replaced by student samples (probability `lmbda`),
        teacher samples (`seq_kd`), or the dataset's reference completions, as GKD does."""
        if on_policy is None:  # every process draws; all follow rank 0, so all run the same forwards (ZeRO-3)
            on_policy = rank0_choice(random.random() <= self.lmbda, self.args.device)
        if on_policy:
            ids, mask = self._generate(self.model_wrapped, inputs["prompts"], inputs["prompt_attention_mask"])
        elif self.seq_kd:
            ids, mask = self._generate_teacher(inputs["context_prompts"], inputs["context_prompt_attention_mask"])
        else:
            return self._dataset_completions(inputs, "An off-policy step")
        return NCABatch.from_mapping({**inputs, "completion_ids": ids, "completion_mask": mask}, on_policy=on_policy)

    def _dataset_completions(self, inputs: dict[str, Any], what: str) -> NCABatch:
        """The `NCABatch` of a collated batch with the dataset's reference completions (in `completion_ids`)."""
        if not bool(inputs["has_reference"].all()):
            raise ValueError(f"{what} needs reference completions, and this batch has rows without one.")
        return NCABatch.from_mapping(inputs, on_policy=False)

    def _generate(self, model, prompts: torch.Tensor, prompt_mask: torch.Tensor, teacher=None):
        """Sample completions with GKD's generation settings; returns right-padded (ids, mask) without the prompt:
        the mask keeps every token up to and including the first end-of-sequence token, as GKD's
        `generate_on_policy_outputs` does (which is not called: it passes `return_dict_in_generate` next to a
        generation config, which transformers deprecates with a warning at every run)."""
        with quiet_old_checkpointing_names():  # TRL's unwrapping uses the old names
            with (
                unwrap_model_for_generation(
                    model,
                    self.accelerator,
                    gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                    generation_kwargs=self.generation_kwargs,
                    gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
                ) as unwrapped,
                teacher.active() if teacher is not None else nullcontext(),  # a self-teacher samples
                policy_mode(unwrapped),  # the policy samples: no dropout (disable_dropout=False keeps it in training)
            ):
                inputs = self._sampling_inputs(unwrapped, prompts, prompt_mask)
                output = unwrapped.generate(**inputs, generation_config=self.generation_config)
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        completion = sequences[:, inputs["input_ids"].shape[1] :]
        return completion, mask_through_eos(completion, self.generation_config.eos_token_id)

    def _sampling_inputs(self, model, prompts: torch.Tensor, prompt_mask: torch.Tensor) -> dict[str, Any]:
        """`generate`'s inputs for a left-padded batch of prompts: with `share_prefix`, the tokens every prompt starts
        with (a system message, a context shared by the batch) run once in a prefill of their own
        (`trl_nca.core.sampling.shared_prefill`), the samples being those of the plain batch up to float rounding.
        Under ZeRO-3 with several processes, where each forward may be a collective, the processes agree on the
        prefix length first (all share one, or none does)."""
        plain = {"input_ids": prompts, "attention_mask": prompt_mask}
        if not self.args.share_prefix:
            return plain
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(prompts, prompt_mask)]
        tokens = sharable_prefix_tokens(model, rows, self._sampling_logged)
        if self._lockstep_generation:
            tokens = agreed_min([tokens], prompts.device)[0]
        prefill = shared_prefill(model, rows, self.processing_class.pad_token_id, tokens) if tokens else None
        if prefill is None:
            return plain
        return {"input_ids": prefill.input_ids, "attention_mask": prefill.attention_mask, **prefill.cache_inputs}

    def _generate_for_rollout(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int]) -> list[Generated]:
        """The trainer's `trl_nca.core.sampling.GenerateFn`: one completion per prompt, sampled by the student with
        GKD's generation settings. The seeds are not used: sampling draws from the process random state, which
        checkpoints restore, so a resumed run samples what an uninterrupted run did."""
        self._generate_calls_agreed(generating=True)
        ids, mask = left_pad(prompts, self.processing_class.pad_token_id)
        completion, completion_mask = self._generate(
            self.model_wrapped, ids.to(self.args.device), mask.to(self.args.device)
        )
        eos = self._ends_with_eos(completion, completion_mask)
        out = []
        for row, n, ended in zip(completion, completion_mask.sum(1).tolist(), eos.tolist()):
            tokens = row[: int(n)].tolist()
            text = self.processing_class.decode(tokens, skip_special_tokens=True)
            out.append(Generated(tokens, text, truncated=not ended and len(tokens) >= self.args.max_new_tokens))
        return out

    def _generate_calls_agreed(self, generating: bool) -> bool:
        """Keep the processes' `generate` calls in step under ZeRO-3, where each call gathers the student's weights
        with collectives: before each call of a rollout every process says whether it still generates; a process whose
        episodes have all ended answers False in a loop, and samples one throw-away row while another process still
        generates. Returns whether any process generates. Without ZeRO-3 nothing is exchanged."""
        if self._lockstep_generation:
            return bool(agreed_max([int(generating)], self.args.device)[0])
        return generating

    def _play_episodes(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Play the episodes of a micro-batch of rollout seeds; every sample the rollout returns becomes one row."""
        seeds = [int(seed) for seed in batch["seed"]]
        played = self.rollout.rollout(seeds, self._generate_for_rollout, self.processing_class)
        while self._generate_calls_agreed(generating=False):  # episodes of other processes are still running
            pad = self.processing_class.pad_token_id
            self._generate(self.model_wrapped, *(t.to(self.args.device) for t in left_pad([[pad]], pad)))
        rows = []
        for sample in played.samples:
            example = {"prompt": sample.prompt, "context": sample.context}
            row = tokenize_example(example, None, self.processing_class, self.context_spec, self.limits)
            row["completion_ids"] = list(sample.completion_ids)  # exactly as generated, never re-tokenised
            rows.append(row)
        for key, value in played.metrics.items():
            self._metrics["train"][f"rollout/{key}"].append(float(value))
        return NCABatch.from_mapping(self._prepare_inputs(self.data_collator.pad(rows)), on_policy=True)

    def _get_train_sampler(self, *args, **kwargs):
        if self.rollout is not None:  # play the training seeds in schedule order
            return torch.utils.data.SequentialSampler(self.train_dataset)
        return super()._get_train_sampler(*args, **kwargs)

    def _generate_teacher(self, prompts: torch.Tensor, prompt_mask: torch.Tensor):
        """`seq_kd`: the teacher samples, through its own wrapper, or, a self-teacher, as the student inside its
        block (`Teacher.active`)."""
        teacher = self.nca.teacher
        if teacher.owns_weights:
            return self._generate(self.teacher_model, prompts, prompt_mask)
        return self._generate(self.model_wrapped, prompts, prompt_mask, teacher=teacher)

    # ----------------------------------------------------------------------------------------------------------------
    # Loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not isinstance(inputs, NCABatch):  # a batch that did not come through get_batch_samples
            inputs = self._with_completions(self._prepare_inputs(inputs))
            num_items_in_batch = inputs.completion_mask.sum() * self.current_gradient_accumulation_steps
        # GKDTrainer.training_step would sample again; the samples were drawn in get_batch_samples. Trainer runs this
        # batch's backward, so its loss may run its views in sequence (`NCABatch.training_step`).
        return SFTTrainer.training_step(self, model, inputs.replace(training_step=True), num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        batch = inputs if isinstance(inputs, NCABatch) else NCABatch.from_mapping(inputs)
        scale = self._loss_scale(num_items_in_batch, int(batch.completion_mask.sum()))
        loss = self._nca_loss(model, batch, lambda total: total * scale, self._grad_cosine_due())
        return (loss, None) if return_outputs else loss

    def _loss_scale(self, num_items_in_batch, tokens: int) -> torch.Tensor | float:
        """What a micro-batch's summed terms are multiplied by: one over the completion tokens of the whole optimizer
        step (all micro-batches and processes; times the process count, since DDP averages the processes'
        gradients), or of the micro-batch alone where the step's count is not known."""
        if num_items_in_batch is not None:
            return self.accelerator.num_processes / num_items_in_batch.clamp_min(1)
        return 1.0 / max(tokens, 1)

    def _describe_evaluation(self, description: str) -> None:
        if self.args.eval_completions == "dataset":
            logger.info("%s scores the dataset's reference completions (eval_completions='dataset').", description)
        else:
            logger.info(
                "%s scores completions sampled from the student without the context (eval_completions='on_policy').",
                description,
            )

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Evaluation: the loss (no logits) on sampled or on the dataset's completions (`eval_completions`)."""
        inputs = self._prepare_inputs(inputs)
        if self.args.eval_completions == "dataset":
            inputs = self._dataset_completions(inputs, "eval_completions='dataset'")
        else:
            inputs = self._with_completions(inputs, on_policy=True)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None


def _refuse_metric_functions(**functions) -> None:
    for name, value in functions.items():
        if value is not None:
            raise ValueError(
                f"NCATrainer does not take `{name}`: its loss works on hidden states and never materialises "
                "logits, so evaluation has no predictions to pass to it. Evaluation logs eval_loss, "
                "eval_opd_loss, eval_nca_loss, eval_view_kl and completion statistics; for task metrics with and "
                "without the context during training, add `trl_nca.eval.PairedEvalCallback` to `callbacks`."
            )


def _probe_collator(data_collator, train_dataset, eval_dataset) -> None:
    """A custom collator must produce NCA's batch keys: tried on the first prepared row (`check_collator`)."""
    probe = train_dataset if train_dataset is not None else eval_dataset
    split = "train" if train_dataset is not None else "eval"
    if isinstance(probe, dict):
        split, probe = next(iter(probe.items()))
    first = next(iter(probe), None) if probe is not None else None
    if first is not None:
        check_collator(data_collator, first, split)


@contextmanager
def _gkd_init_adjusted(args: NCAConfig, student: nn.Module, teacher: nn.Module, teacher_loaded_here: bool):
    """The span of `GKDTrainer.__init__`: its hint to use DistillationTrainer dropped (it has no context views), the
    teacher's init kwargs hidden when the teacher was loaded here from a name (GKD refuses them with a built
    teacher), its vocabulary check shown the student's size (`_gkd_vocab_check_passes`) and a `SelfTeacher` kept
    out of DeepSpeed (`_self_teacher_kept_out_of_deepspeed`)."""
    gkd_logger = logging.getLogger("trl.experimental.gkd.gkd_trainer")
    gkd_logger.addFilter(_drop_migration_hint)
    teacher_init_kwargs = args.teacher_model_init_kwargs
    if teacher_loaded_here:
        args.teacher_model_init_kwargs = None  # used by resolve_teacher
    try:
        with _gkd_vocab_check_passes(student, teacher), _self_teacher_kept_out_of_deepspeed():
            yield
    finally:
        gkd_logger.removeFilter(_drop_migration_hint)
        args.teacher_model_init_kwargs = teacher_init_kwargs


@contextmanager
def _gkd_vocab_check_passes(student: nn.Module, teacher: nn.Module):
    """GKDTrainer refuses a teacher whose `config.vocab_size` differs from the student's; NCATrainer supports output
    layers padded to different sizes (checked by `trl_nca.trainers.teacher.check_output_rows`). Show GKD's check the
    student's value, only for the duration of its `__init__`."""
    config = getattr(teacher, "config", None)
    if not as_teacher(teacher).owns_weights or config is None:
        yield
        return
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    student_config = student.config.get_text_config() if hasattr(student.config, "get_text_config") else student.config
    original = text.vocab_size
    text.vocab_size = student_config.vocab_size
    try:
        yield
    finally:
        text.vocab_size = original


@contextmanager
def _self_teacher_kept_out_of_deepspeed():
    """Under DeepSpeed, GKDTrainer hands its teacher to `prepare_deepspeed`, which builds an engine around it. A
    `SelfTeacher` has no parameters (DeepSpeed fails on it: ZeRO-3 with an IndexError) and only calls the student,
    which the training engine already wraps, so it must stay as it is; any other teacher is prepared as GKD does."""
    from trl.experimental.gkd import gkd_trainer

    original = gkd_trainer.prepare_deepspeed

    def prepare(model, accelerator):
        return original(model, accelerator) if as_teacher(model).owns_weights else model

    gkd_trainer.prepare_deepspeed = prepare
    try:
        yield
    finally:
        gkd_trainer.prepare_deepspeed = original


def _check_grad_cosine_setting(trainer: NCATrainer) -> None:
    """`log_grad_cosine_steps` differentiates the step's graph twice more with `torch.autograd.grad`, which neither
    sharded parameters (DeepSpeed, FSDP) nor reentrant gradient checkpointing support."""
    args = trainer.args
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        raise ValueError(
            "log_grad_cosine_steps is not available under DeepSpeed or FSDP (the parameters are sharded). Set it to 0, "
            "and measure saved checkpoints with `trl-nca analyze` instead."
        )
    if args.gradient_checkpointing and (args.gradient_checkpointing_kwargs or {}).get("use_reentrant", False):
        raise ValueError(
            "log_grad_cosine_steps needs torch.autograd.grad, which reentrant gradient checkpointing does not support. "
            "Set gradient_checkpointing_kwargs={'use_reentrant': False}, or log_grad_cosine_steps=0."
        )


def _drop_migration_hint(record: logging.LogRecord) -> bool:
    return "DistillationTrainer" not in record.getMessage()


class SeedCollator(NCACollator):
    """Batches of rollout seeds; `pad` turns the samples the rollout returns into a training batch."""

    def __init__(self, pad_token_id: int | None = None):
        super().__init__(pad_token_id=pad_token_id if pad_token_id is not None else 0)

    def __call__(self, examples):
        return {"seed": torch.tensor([e["seed"] for e in examples], dtype=torch.long)}


def _rollout_schedule(rollout, args: NCAConfig, train_dataset):
    """The rollout's seeds of every optimizer step as a dataset (played in order), and its context placement."""
    if not isinstance(rollout, Rollout):
        raise TypeError(
            "rollout must implement trl_nca.trainers.rollouts.Rollout (spec, episodes_per_step, seeds(step), "
            f"rollout(seeds, generate, tokenizer)), e.g. trl_nca.envs.GameRollout; got a {type(rollout).__name__}."
        )
    if train_dataset is not None:
        raise ValueError("Give either a train_dataset or a rollout, not both.")
    if args.max_steps is None or args.max_steps <= 0:
        raise ValueError("Rollout training needs `max_steps` (each step plays fresh episodes).")
    if args.lmbda < 1.0 or args.seq_kd:
        raise ValueError("Rollout training is on-policy: set lmbda=1.0 and seq_kd=False.")
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    if rollout.episodes_per_step != per_step:
        raise ValueError(
            f"The rollout plays {rollout.episodes_per_step} episodes per step, but per_device_train_batch_size x "
            f"gradient_accumulation_steps x processes = {per_step}. Make them equal (the batch size counts episodes)."
        )
    seeds = []
    for step in range(args.max_steps):
        step_seeds = [int(seed) for seed in rollout.seeds(step)]
        if len(step_seeds) != per_step:
            raise ValueError(f"rollout.seeds({step}) gave {len(step_seeds)} seeds; episodes_per_step is {per_step}.")
        seeds += step_seeds
    spec = ContextSpec.from_options(
        column="context",
        placement=rollout.spec.placement,
        template=rollout.spec.template,
        separator=rollout.spec.separator,
    )
    return Dataset.from_dict({"seed": seeds}), spec


def _check_references(dataset, split: str) -> None:
    """Off-policy steps (lmbda < 1 without seq_kd) train on the dataset's completions, and eval_completions='dataset'
    evaluates them, so every row needs one."""
    if dataset.column_names is None:
        return
    missing = [i for i, ids in enumerate(dataset["completion_ids"]) if len(ids) == 0]
    if not missing:
        return
    where = f"in the {split} dataset {len(missing)} rows (first: {missing[:5]}) have none"
    if split == "train":
        raise ValueError(
            f"lmbda < 1 makes some steps off-policy, which train on reference completions, but {where}. Use "
            "`messages` ending with an assistant turn, set lmbda=1.0, or set seq_kd=True to let the teacher write them."
        )
    raise ValueError(
        f"eval_completions='dataset' evaluates the dataset's reference completions, but {where}. Use `messages` "
        "ending with an assistant turn (or a `completion` column), or set eval_completions='on_policy'."
    )
