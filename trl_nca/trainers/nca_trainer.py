"""`NCATrainer`: on-policy context distillation with No-Context Anchoring, with GKDTrainer's arguments and behaviour.

The base is TRL's `SFTTrainer`, the parent of `GKDTrainer`, whose `__init__` runs exactly as GKDTrainer runs it (with
its collator's columns kept and SFT's dataset preparation skipped); what GKDTrainer's `__init__` does after it (its
dropout setting, its attributes, its generation config) is written out below, with NCA's teacher in place of GKD's
(docs/design.md, "Why NCATrainer builds on SFTTrainer").

Read top to bottom, a run is:

1. `__init__`: the models resolved (`trl_nca.trainers.setup.resolve_models`), the datasets tokenised into both views,
   SFTTrainer's `__init__`, GKD's settings, then the NCA pieces (`trl_nca.trainers.setup.setup_nca`): the placed
   teacher, the objective (`self.nca`), the step loss (`self.step_loss`), the step statistics (`self.step_stats`) and
   the anchor step (`self.anchor_step`, a callback).
2. An optimizer step: `get_batch_samples` fetches its micro-batches and chooses their completions (sampled by the
   student, the teacher's or the dataset's: `_with_completions`; or played episodes: `_play_episodes`), so the step's
   completion tokens are counted before any backward; `training_step` runs Trainer's step, whose `compute_loss` builds
   the `NCABatch`, runs the step loss on it and adds its terms to the step statistics; at the step's end the anchor
   step logs the step's means and sets the next anchor weight.
3. Evaluation (`prediction_step`) scores sampled or reference completions with the same loss.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
from trl.import_utils import TRLExperimentalWarning
from trl.models.utils import unwrap_model_for_generation
from trl.trainer.sft_trainer import SFTTrainer
from trl.trainer.utils import disable_dropout_in_model

from ..core.gradients import compare_gradients
from ..core.launch import agreed_max, agreed_min, rank0_choice
from ..core.sampling import (
    Generated,
    ends_with_eos,
    mask_through_eos,
    policy_mode,
    sharable_prefix_tokens,
    shared_prefill,
)
from ..core.views import ContextSpec, left_pad
from .activation_checkpointing import quiet_old_checkpointing_names
from .anchor import add_anchor_sentence, resume_anchor
from .batch import NCABatch
from .console import explain_training
from .data import (
    NCACollator,
    check_collator,
    named_datasets,
    prepare_dataset,
    prepare_splits,
    prepared_eval_dataset,
    tokenize_example,
)
from .nca_config import NCAConfig
from .rollouts import Rollout
from .setup import NCA_PAPER, checked_config, resolve_models, setup_nca
from .stats import batch_stats


with warnings.catch_warnings():  # GKD's static loss, kept as NCATrainer's (see docs/design.md)
    warnings.simplefilter("ignore", TRLExperimentalWarning)
    from trl.experimental.gkd import GKDTrainer


logger = logging.getLogger(__name__)

# The key under which a batch says whether the student sampled its completions (`NCABatch.on_policy`).
ON_POLICY = "on_policy"


class NCATrainer(SFTTrainer):
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
    # compute_loss divides by the token count of the whole optimizer step, so Trainer must not divide again.
    loss_is_scaled_for_ga = True
    _grad_cosine_step: int | None = None  # the optimizer step whose gradient cosine was logged last
    _rng_checkpoint: str | None = None  # a resumed run's checkpoint whose random state is still to be restored
    # GKD's static methods, unchanged
    generalized_jsd_loss = staticmethod(GKDTrainer.generalized_jsd_loss)
    generate_on_policy_outputs = staticmethod(GKDTrainer.generate_on_policy_outputs)

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
        args = checked_config(args, NCAConfig, "nca-output", "NCATrainer")
        _refuse_metric_functions(compute_metrics, preprocess_logits_for_metrics)
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
        self.limits, self.rollout = models.limits, rollout
        train_dataset, eval_dataset, data_collator = self._setup_data(
            args, models.tokenizer, train_dataset, eval_dataset, data_collator
        )
        self._init_as_gkd(
            args,
            models,
            data_collator,
            train_dataset,
            eval_dataset,
            callbacks,
            optimizers,
            peft_config,
            formatting_func,
        )
        # The NCA pieces, named where the step calls them
        self.teacher_model, self.nca, self.step_loss, self.step_stats, self.anchor_step = setup_nca(
            self, models, completions=True
        )
        self.add_callback(self.anchor_step)
        explain_training(self)  # what the run prints (trl_nca.trainers.console): compact logs, named bar, estimate
        self._lockstep_generation = self.accelerator.num_processes > 1 and is_deepspeed_zero3_enabled()
        self._sampling_logged: set[str] = set()  # kinds of reason the sampling prefix ran unshared, logged once
        if args.log_grad_cosine_steps:
            _check_grad_cosine_setting(self)

    def _init_as_gkd(
        self,
        args,
        models,
        data_collator,
        train_dataset,
        eval_dataset,
        callbacks,
        optimizers,
        peft_config,
        formatting_func,
    ) -> None:
        """SFTTrainer's `__init__` as GKDTrainer runs it (the collator's columns kept, SFT's dataset preparation
        skipped), then what GKDTrainer's `__init__` does after it: dropout off (`disable_dropout`), its attributes
        and its generation config (`gkd_generation`). GKD's teacher handling is NCA's (`resolve_models`,
        `setup_nca`)."""
        args.remove_unused_columns = False
        args.dataset_kwargs = {**(args.dataset_kwargs or {}), "skip_prepare_dataset": True}
        with quiet_old_checkpointing_names():  # PEFT's PeftModel, which SFTTrainer may build, reads an old name
            super().__init__(
                models.student,
                args=args,
                data_collator=data_collator,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=models.tokenizer,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
                formatting_func=formatting_func,
            )
        if args.disable_dropout:
            disable_dropout_in_model(self.model)
        self.lmbda, self.beta, self.temperature, self.seq_kd = args.lmbda, args.beta, args.temperature, args.seq_kd
        self.generation_config, self.generation_kwargs = gkd_generation(args, self.model, self.processing_class)

    def _setup_data(self, args, tokenizer, train_dataset, eval_dataset, data_collator):
        """The given datasets with the token columns of both views (or the rollout's seeds and its context placement),
        checked, and the collator; sets `context_spec`."""
        self.context_spec = args.context_spec
        prepare = self._tokenise(tokenizer, args)
        if self.rollout is not None:
            seeds, self.context_spec = _rollout_schedule(self.rollout, args, train_dataset)
            _, eval_dataset = prepare_splits(prepare, None, eval_dataset)
            _check_prepared(args, None, eval_dataset)
            return seeds, eval_dataset, data_collator or SeedCollator(tokenizer.pad_token_id)
        train_dataset, eval_dataset = prepare_splits(prepare, train_dataset, eval_dataset)
        _check_prepared(args, train_dataset, eval_dataset)
        if data_collator is None:
            return train_dataset, eval_dataset, NCACollator(pad_token_id=tokenizer.pad_token_id)
        _probe_collator(data_collator, train_dataset, eval_dataset)
        return train_dataset, eval_dataset, data_collator

    def _tokenise(self, tokenizer, args):
        """`prepare(dataset, split)`: one split with the token columns of both views (`prepare_dataset`)."""

        def prepare(dataset, split: str):
            return prepare_dataset(dataset, tokenizer, self.context_spec, self.limits, split, args.dataset_num_proc)

        return prepare

    @property
    def nca_beta(self) -> float:
        """The anchor weight of the optimizer step in progress (`nca_beta_schedule`)."""
        return self.nca.schedule.value

    def train(self, resume_from_checkpoint=None, **kwargs):
        """Trainer's `train`; a checkpoint to resume from is resolved and checked first, and the anchor's state
        restored from it (`resume_anchor`), as is its random state before the first samples (`_load_rng_state`)."""
        checkpoint = resume_anchor(resume_from_checkpoint, self.args.output_dir, self.anchor_step)
        self._rng_checkpoint = checkpoint if isinstance(checkpoint, str) else None
        return super().train(resume_from_checkpoint=checkpoint, **kwargs)

    def _load_rng_state(self, checkpoint):
        """The resumed checkpoint's random state, restored once: at Trainer's own call (at the start of a resumed
        epoch), or in `get_batch_samples` when that comes first (mid-epoch, Trainer restores only after fetching the
        first batches, which this trainer samples), so a resumed run samples what the uninterrupted run did."""
        if self._rng_checkpoint is not None:
            self._rng_checkpoint = None
            super()._load_rng_state(checkpoint)

    # ----------------------------------------------------------------------------------------------------------------
    # An optimizer step: the completions of its micro-batches, then Trainer's step on each

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """Fetch the micro-batches of one optimizer step, choose their completions, and count their tokens.

        Sampling happens here, before any backward pass, so the loss of every micro-batch can be divided by the number
        of completion tokens of the whole optimizer step (all micro-batches, all processes): gradient accumulation
        then gives the same update as one large batch.
        """
        batches, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self._rng_checkpoint is not None:
            self._load_rng_state(self._rng_checkpoint)
        if self.rollout is not None:
            batches = [self._play_episodes(batch) for batch in batches]
        else:
            batches = [self._with_completions(self._prepare_inputs(batch)) for batch in batches]
        if not batches:
            return batches, None
        tokens = torch.stack([batch["completion_mask"].sum() for batch in batches]).sum()
        if self.accelerator.num_processes > 1:
            tokens = self.accelerator.gather(tokens).sum()
        return batches, tokens

    def training_step(self, model, inputs, num_items_in_batch=None):
        """Trainer's step on a micro-batch whose completions `get_batch_samples` chose (SFTTrainer's, not
        GKDTrainer's, which would sample again). Trainer runs the backward of its loss, so the loss may run the
        views in sequence (`StepLoss.trainer_backward`)."""
        with self.step_loss.trainer_backward():
            return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The micro-batch's `NCABatch` (`nca_batch`), its loss divided by the step's completion tokens (`_loss_scale`), run by the
        step loss (with the gradient cosine when `log_grad_cosine_steps` is due), its terms added to the step
        statistics."""
        batch = self.nca_batch(inputs)
        scale = self._loss_scale(num_items_in_batch, int(batch.completion_mask.sum()))
        result = self.step_loss(model, batch, lambda total: total * scale, self._grad_cosine_due())
        if result.gradients is not None:
            self._record_grad_cosine(*result.gradients)
        lengths = batch.completion_mask.sum(1)
        eos = ends_with_eos(batch.completion_ids, batch.completion_mask, self.generation_config.eos_token_id)
        clipped = (lengths >= self.args.max_new_tokens) & ~eos
        stats = batch_stats(result.terms, self.nca.total(result.terms).detach(), lengths, clipped, batch.on_policy)
        self.step_stats.add(stats, training=self.model.training)
        return (result.loss, None) if return_outputs else result.loss

    def nca_batch(self, inputs) -> NCABatch:
        """The `NCABatch` of a micro-batch (a mapping of both views, as the collator and `_with_completions` give it;
        `on_policy` True where it does not say): the one place this trainer builds it."""
        return NCABatch.from_mapping(inputs, on_policy=bool(inputs.get(ON_POLICY, True)))

    def _loss_scale(self, num_items_in_batch, tokens: int) -> torch.Tensor | float:
        """What a micro-batch's summed terms are multiplied by: one over the completion tokens of the whole optimizer
        step (all micro-batches and processes; times the process count, since DDP averages the processes'
        gradients), or of the micro-batch alone where the step's count is not known."""
        if num_items_in_batch is not None:
            return self.accelerator.num_processes / num_items_in_batch.clamp_min(1)
        return 1.0 / max(tokens, 1)

    def _grad_cosine_due(self) -> bool:
        """Whether this micro-batch is the first of an optimizer step at which `log_grad_cosine_steps` measures."""
        every = self.args.log_grad_cosine_steps
        if not every or not self.model.training or not torch.is_grad_enabled():
            return False
        step = self.state.global_step
        return step % every == 0 and self._grad_cosine_step != step

    def _record_grad_cosine(self, opd_gradient, nca_gradient) -> None:
        """Log `grad_cosine`, `grad_norm_opd` and `grad_norm_nca` of this micro-batch's two term gradients (with
        several processes, their mean: each measured its own micro-batch)."""
        self._grad_cosine_step = self.state.global_step
        result = compare_gradients(opd_gradient, nca_gradient)
        values = [result.cosine, result.norm_a, result.norm_b]
        if self.accelerator.num_processes > 1:
            values = self.accelerator.gather(torch.tensor([values], device=self.args.device)).mean(0).tolist()
        for name, value in zip(("grad_cosine", "grad_norm_opd", "grad_norm_nca"), values):
            self._metrics["train"][name].append(value)

    # ----------------------------------------------------------------------------------------------------------------
    # The completions of a micro-batch

    def _with_completions(self, inputs: dict[str, Any], on_policy: bool | None = None) -> dict[str, Any]:
        """A collated batch with its completions (`completion_ids`, `completion_mask`) replaced by student samples
        (probability `lmbda`), teacher samples (`seq_kd`), or the dataset's reference completions, as GKD does, and
        whether the student sampled them (`on_policy`)."""
        if on_policy is None:  # every process draws; all follow rank 0, so all run the same forwards (ZeRO-3)
            on_policy = rank0_choice(random.random() <= self.lmbda, self.args.device)
        if on_policy:
            ids, mask = self._generate(self.model_wrapped, inputs["prompts"], inputs["prompt_attention_mask"])
        elif self.seq_kd:
            ids, mask = self._generate_teacher(inputs["context_prompts"], inputs["context_prompt_attention_mask"])
        else:
            return self._dataset_completions(inputs, "An off-policy step")
        return {**inputs, "completion_ids": ids, "completion_mask": mask, ON_POLICY: on_policy}

    def _dataset_completions(self, inputs: dict[str, Any], what: str) -> dict[str, Any]:
        """A collated batch with the dataset's reference completions (already in `completion_ids`)."""
        if not bool(inputs["has_reference"].all()):
            raise ValueError(f"{what} needs reference completions, and this batch has rows without one.")
        return {**inputs, ON_POLICY: False}

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
        eos = ends_with_eos(completion, completion_mask, self.generation_config.eos_token_id)
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
        return {**self._prepare_inputs(self.data_collator.pad(rows)), ON_POLICY: True}

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
    # Evaluation

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Trainer's `evaluate`; a dataset given here (or a dict of them) is checked and tokenised into both views as
        the datasets given at init are (a name selects one of those)."""
        if eval_dataset is not None and not isinstance(eval_dataset, str):
            eval_dataset = prepared_eval_dataset(
                self._tokenise(self.processing_class, self.args), eval_dataset, self.context_spec
            )
            _check_prepared(self.args, None, eval_dataset)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        """Trainer's loop; then `eval_loss` and the logged terms become token means over the whole evaluation set
        (Trainer would average per-batch means)."""
        self.step_stats.open_eval()
        if self.args.eval_completions == "dataset":
            logger.info("%s scores the dataset's reference completions (eval_completions='dataset').", description)
        else:
            logger.info(
                "%s scores completions sampled from the student without the context (eval_completions='on_policy').",
                description,
            )
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        return self.step_stats.close_eval(output, self.args.device, metric_key_prefix)

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

    def create_model_card(self, *args, **kwargs):
        """TRL's model card, with the sentence on the anchor the run used (`add_anchor_sentence`)."""
        super().create_model_card(*args, **kwargs)
        if self.is_world_process_zero():
            add_anchor_sentence(Path(self.args.output_dir) / "README.md", self.nca.schedule.describe())


def _refuse_metric_functions(compute_metrics, preprocess_logits_for_metrics) -> None:
    functions = {"compute_metrics": compute_metrics, "preprocess_logits_for_metrics": preprocess_logits_for_metrics}
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


def gkd_generation(args: NCAConfig, model: nn.Module, tokenizer) -> tuple[GenerationConfig, dict[str, Any]]:
    """GKDTrainer's sampling settings (its generation config and the kwargs that override the model's) with one
    change: the KV cache stays on under gradient checkpointing (GKD turns it off, which makes sampling quadratic;
    `unwrap_model_for_generation` lifts checkpointing while sampling, so the cache is safe to keep). The model's own
    end-of-sequence ids stop sampling, as in GKD."""
    kwargs = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "do_sample": True,
        "top_k": 0,
        "top_p": 1.0,
        "use_cache": True,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = GenerationConfig(**kwargs)
    if model.generation_config.eos_token_id is not None:
        config.eos_token_id = model.generation_config.eos_token_id
    return config, kwargs


def _check_prepared(args: NCAConfig, train_dataset, eval_dataset) -> None:
    """Off-policy steps (lmbda < 1 without seq_kd) train on the dataset's reference completions, and
    `eval_completions='dataset'` evaluates them: every such row needs one (`_check_references`). The train dataset is
    None for `evaluate` or a rollout."""
    if train_dataset is not None and args.lmbda < 1.0 and not args.seq_kd:
        _check_references(train_dataset, "train")
    if args.eval_completions == "dataset":
        for name, dataset in (eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}).items():
            if dataset is not None:
                _check_references(dataset, f"eval {name}".strip())


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
