"""TRL's own `SDFTTrainer` as a method of `trl-nca compare` (`sdft:trainer=sdft[,SDFTConfig_FIELD=VALUE...]`).

TRL 1.16 ships `trl.experimental.sdft.SDFTTrainer`, the trainer a TRL user picks to internalise a privileged context:
on-policy self-distillation from the initial student conditioned on `privileged_context`, without a no-context
anchor. This module lets the comparison train it beside the library's OPD and NCA students, on the same task, base
weights, LoRA adapter, seeds and training budget, and saves it as a PEFT adapter in the run's folder so the paired
evaluation loads it exactly as it loads the others.

What the comparison shares with the other methods (`sdft_config`): every `TrainingArguments` field of the shared
`NCAConfig` (learning rate and schedule, `max_steps`, batch size, gradient accumulation, optimizer, precision,
gradient checkpointing, logging), `max_new_tokens` as `max_completion_length`, `temperature` (for sampling and, as in
NCA, dividing the logits of both views), sampling without top-k/top-p filtering (as `GKDTrainer` samples) and
`disable_dropout`. What is SDFT's own (`SDFT_SETTINGS`, its defaults, written out so that the record shows them): the
teacher is the initial student (`teacher_model_kind="base"`: the adapter disabled, as the library's self-teacher), the
loss a generalized JSD with `distillation_alpha=0.5` over the student's top-100 tokens (`topk_logits`, renormalised,
no tail bucket), importance-sampling clip 2.0. Two settings follow the comparison rather than SDFT's defaults:

- `num_generations=1`: SDFT samples `per_device_train_batch_size * gradient_accumulation_steps` completions per
  optimizer step whatever `num_generations` is; `num_generations` only repeats each prompt that many times among
  them (its default 8 would put 2 distinct prompts into a 16-completion step). With 1, a step holds as many distinct
  prompts and completions as an OPD or NCA step (one completion per prompt), so the methods differ in the loss and
  nothing else. SDFT's loss has no group baseline, so nothing in it needs more than one completion per prompt.
- `teacher_prompt_template` follows the task's context placement: the teacher's user turn is rendered through the
  task's own `ContextSpec.template` (`{context}` becoming `{privileged_context}`), so the teacher sees token for token
  the context view the other methods and the evaluation use. SDFT's default `"{prompt}\\n\\n{privileged_context}"`
  puts the context after the query; the model organism has never seen a rule line after the query.

The top-k support is clipped to the model's vocabulary: the organism has 23 tokens, fewer than 100 (torch.topk would
fail), so there the top-k divergence is the full-vocabulary one. With one optimizer step per generation batch (the
default), SDFT computes no rollout log-probabilities, so the importance-sampling clip never acts (the ratio would be 1).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import string
import warnings
from collections.abc import Sequence
from typing import Any

from transformers import TrainingArguments

from ..core.views import ContextSpec, split_example
from ..inputs import InputError
from ..trainers.activation_checkpointing import quiet_old_checkpointing_names


logger = logging.getLogger(__name__)

TRAINER_KEY = "trainer"  # the reserved override key of a method: which trainer trains it
TRAINERS = ("nca", "sdft")
# SDFT's own loss and teacher settings (its defaults in TRL 1.16, written out so that each run's record shows them)
SDFT_SETTINGS = {
    "teacher_model_kind": "base",
    "distillation_mode": "topk_logits",
    "distillation_topk": 100,
    "distillation_alpha": 0.5,
    "distillation_is_clip": 2.0,
    "distillation_add_tail": False,
}
# SDFTConfig fields the comparison sets for every run itself: the run's folder and seed, the context's place, the
# samples per step and sampling settings shared with the other methods (see the module docstring)
SDFT_RECIPE_FIELDS = (
    "output_dir",
    "seed",
    "save_strategy",
    "teacher_prompt_template",
    "num_generations",
    "max_completion_length",
    "temperature",
    "model_init_kwargs",
)
# TrainingArguments fields SDFT needs at its own value
SDFT_OWN_FIELDS = ("remove_unused_columns",)


class SDFTInputError(InputError):
    """Bad input for an SDFT method (the comparison reports it as its own `CompareInputError`)."""


def config_class():
    """`trl.experimental.sdft.SDFTConfig` (imported quietly: the trainer is experimental in TRL on purpose)."""
    from trl.import_utils import TRLExperimentalWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TRLExperimentalWarning)
        from trl.experimental.sdft import SDFTConfig
    return SDFTConfig


def trainer_of(method_name: str, overrides: dict[str, Any]) -> str:
    """The trainer a method's overrides select (`trainer=...`, default `nca`)."""
    trainer = overrides.get(TRAINER_KEY, "nca")
    if trainer not in TRAINERS:
        raise SDFTInputError(
            f"Method {method_name!r}: {TRAINER_KEY}={trainer!r} is not one of {list(TRAINERS)}; write e.g. "
            f"'{method_name}:{TRAINER_KEY}=sdft' for TRL's SDFTTrainer, or leave it out for NCATrainer."
        )
    return trainer


def teacher_prompt_template(spec: ContextSpec | None, task_name: str) -> str:
    """SDFT's `teacher_prompt_template` that renders the user turn as the task's context view does."""
    if spec is None:
        raise SDFTInputError(no_context_message(task_name))
    if spec.placement != "user":
        raise SDFTInputError(
            f"Task {task_name!r} puts its context into the system message; SDFT puts the privileged context into the "
            "user turn (teacher_prompt_template), so its teacher would not see the context view of the other methods. "
            "Use a task whose context goes into the user turn (context placement 'user')."
        )
    parts = []
    for literal, name, spec_text, conversion in string.Formatter().parse(spec.template):
        parts.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is not None:
            field = {"prompt": "prompt", "context": "privileged_context"}[name]
            parts.append(
                "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec_text}" if spec_text else "") + "}"
            )
    return "".join(parts)


def no_context_message(task_name: str, detail: str = "") -> str:
    return (
        f"A method with trainer=sdft distils from a privileged context, and task {task_name!r} has none{detail}. "
        "Use a task with a context (every built-in task has one), or drop the sdft method."
    )


def check_task(task, rows: Sequence[dict[str, Any]]) -> None:
    """The task must give every training row a context SDFT can place: raises `SDFTInputError` naming the fix."""
    teacher_prompt_template(task.context, task.name)
    sdft_rows(task, rows)


def sdft_rows(task, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """SDFT's dataset: the prompt as chat messages (rendered by the chat template, as the other methods' prompts are)
    and the row's context as `privileged_context`."""
    spec = task.context
    if spec is None:
        raise SDFTInputError(no_context_message(task.name))
    out = []
    for index, row in enumerate(rows):
        if spec.text is None and row.get(spec.column) is None:
            detail = f" (its row {index} has no {spec.column!r} column; its columns are {sorted(row)})"
            raise SDFTInputError(no_context_message(task.name, detail))
        try:
            context = spec.context_of(row, index)
            messages, _ = split_example(row, where=f"row {index}")
        except (KeyError, TypeError, ValueError) as error:
            raise SDFTInputError(f"Task {task.name!r}, for trainer=sdft: {error}") from None
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if users != [len(messages) - 1]:
            raise SDFTInputError(
                f"Task {task.name!r}, row {index}: SDFT puts the context into the last user turn and the other "
                "methods into the first, so for trainer=sdft a prompt must hold one user turn, at its end."
            )
        out.append({"prompt": messages, "privileged_context": context})
    return out


def sdft_config(shared, task, overrides: dict[str, Any], seed: int, output_dir: str):
    """The `SDFTConfig` of one run: the comparison's shared training settings, SDFT's own loss and teacher settings,
    the method's overrides (SDFTConfig fields, `trainer` left out), the run's seed and folder."""
    SDFTConfig = config_class()
    skip = {*SDFT_OWN_FIELDS, "output_dir", "seed", "save_strategy"}
    values = {
        f.name: getattr(shared, f.name)
        for f in dataclasses.fields(TrainingArguments)
        if f.init and f.name not in skip and hasattr(shared, f.name)
    }
    values.update(
        output_dir=str(output_dir),
        seed=seed,
        save_strategy="no",
        max_completion_length=shared.max_new_tokens,
        temperature=shared.temperature,
        top_p=1.0,  # GKDTrainer samples with temperature only
        top_k=0,
        disable_dropout=getattr(shared, "disable_dropout", True),
        num_generations=1,
        teacher_prompt_template=teacher_prompt_template(task.context, task.name),
        model_init_kwargs=None,  # the comparison loads the base model itself
        **SDFT_SETTINGS,
    )
    values.update({k: v for k, v in overrides.items() if k != TRAINER_KEY})
    return SDFTConfig(**values)


def is_sdft_config(config) -> bool:
    return isinstance(config, config_class())


def sdft_trainer(model, args, train_dataset, processing_class, peft_config, callbacks=None):
    """TRL's `SDFTTrainer` for one run, built as `NCATrainer` is (its `train()` not yet called), on a dataset of
    `sdft_rows`; the top-k support is clipped to the model's vocabulary (logged)."""
    from trl.import_utils import TRLExperimentalWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TRLExperimentalWarning)
        from trl.experimental.sdft import SDFTTrainer

    vocab = model.get_output_embeddings().weight.shape[0]
    if args.distillation_mode == "topk_logits" and (args.distillation_topk or 0) > vocab:
        logger.warning(
            "SDFT: distillation_topk=%d is more than the model's %d output rows; using all %d (the full-vocabulary "
            "divergence).",
            args.distillation_topk,
            vocab,
            vocab,
        )
        args = copy.copy(args)  # not dataclasses.replace: SDFTConfig refuses its own derived batch fields
        args.distillation_topk = vocab

    with (
        quiet_old_checkpointing_names()
    ):  # PEFT's get_peft_model reads a deprecated name (trainers.activation_checkpointing)
        return SDFTTrainer(
            model=model,
            args=args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=callbacks,
        )
