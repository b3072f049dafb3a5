"""`NCABatch`: one micro-batch as the NCA objective reads it, built once, in each trainer's `compute_loss`.

Both views of the batch (the left-padded prompts without and with the context, with their attention masks) and the
shared right-padded completion block are fields, and so is whether the completions were sampled from the student
(`on_policy`). Up to `compute_loss` a batch is the mapping TRL passes around (Trainer moves it to the device;
`NCATrainer` adds the completions it chose, sampled, the dataset's or a rollout's, and `on_policy`;
`NCADistillationTrainer` gets TRL's generation batch, to which it adds the context prompts); `compute_loss` builds the
`NCABatch` of that mapping (`from_mapping`, with the trainer's names of the view keys), and from there on both trainers
compute the same thing with the same code and nothing reads the batch by string keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch


# The fields both views are built from, in order: the names `NCATrainer`'s collator gives them.
VIEW_KEYS = (
    "prompts",
    "prompt_attention_mask",
    "context_prompts",
    "context_prompt_attention_mask",
    "completion_ids",
    "completion_mask",
)


@dataclass(frozen=True)
class NCABatch:
    """One micro-batch of both views on the same completions (see the module docstring).

    `step_tokens`: the completion tokens of the whole gradient-accumulation window over all processes, where the base
    trainer counted them with the batch (DistillationTrainer's `num_items_in_batch`); None otherwise."""

    prompts: torch.Tensor
    prompt_attention_mask: torch.Tensor
    context_prompts: torch.Tensor
    context_prompt_attention_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    on_policy: bool = True
    step_tokens: torch.Tensor | None = None

    @classmethod
    def from_mapping(
        cls, batch: Mapping[str, Any], keys: Sequence[str] = VIEW_KEYS, trainer: str = "NCATrainer", **fields: Any
    ) -> NCABatch:
        """The batch of a mapping holding both views under `keys` (a trainer's names of `VIEW_KEYS`, in their order),
        with the other fields given (`on_policy`, `step_tokens`); a mapping without them is refused
        (`check_batch_views`)."""
        check_batch_views(batch, keys, trainer)
        return cls(*(batch[key] for key in keys), **fields)


def check_batch_views(batch: Mapping[str, Any], keys: Sequence[str], trainer: str) -> None:
    """A batch handed to the loss must hold both views (`keys`, the trainer's names of `VIEW_KEYS`). A batch built
    for the base trainer (GKDTrainer's or DistillationTrainer's, with only the no-context prompt) is refused with what
    is missing: the context view cannot be rebuilt from prompt ids, whose row's context is not known."""
    missing = [key for key in keys if key not in batch]
    if not missing:
        return
    context = [key for key in missing if key.startswith("context_")]
    why = (
        "the loss scores every completion with and without the context, and the context view cannot be rebuilt from "
        "the prompt ids (the row's context is not in the batch)"
        if context
        else "the loss needs both views' prompts and the completions"
    )
    raise ValueError(
        f"{trainer}.compute_loss got a batch without {missing} (it has {sorted(batch)}): {why}. Pass batches the "
        f"trainer built (its data collator and sampling add both views), or add the missing keys ({list(keys)}: "
        "left-padded prompts of both views with their masks, right-padded completions with their mask)."
    )
