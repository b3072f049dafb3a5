"""How episodes played by the student plug into `NCATrainer`: the `Rollout` protocol.

The trainer knows no game. Given `NCATrainer(..., rollout=r)` with no dataset, it asks `r.seeds(step)` for the items of
every optimizer step (`r.episodes_per_step` of them: per_device_train_batch_size x gradient_accumulation_steps x
processes) and, for each micro-batch of seeds, calls

    batch = r.rollout(seeds, generate, tokenizer)

with its own `generate` (a `trl_nca.core.sampling.GenerateFn`: the student samples with GKD's generation settings,
without the context) and the student's tokenizer. The rollout plays its episodes and returns a `RolloutBatch`: one
`RolloutSample` per model call (the chat prompt without the context, the privileged context, the completion token ids
exactly as generated) and scalar metrics. The trainer renders each sample's two views (`r.spec` says where the context
goes), appends the same completion ids to both, scores them like dataset samples and logs the metrics as
`rollout/<name>`. This is the spirit of TRL's `rollout_func`: the caller owns the episode logic, the trainer owns the
policy, the sampling and the loss.

`trl_nca.envs.GameRollout` implements it for Sokoban and FrozenLake; anything with these four members works.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..core.sampling import GenerateFn
from ..core.views import ContextSpec, Message


@dataclass
class RolloutSample:
    """One model call of an episode, as a training sample."""

    prompt: list[Message]  # the chat prompt the student answered, without the context
    context: str  # the privileged context the context view adds (placed by `Rollout.spec`)
    completion_ids: list[int]  # the student's completion, token ids exactly as generated


@dataclass
class RolloutBatch:
    """What a rollout returns for one micro-batch of seeds: its samples and the metrics to log (`rollout/<name>`)."""

    samples: list[RolloutSample]
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Rollout(Protocol):
    """Episodes played by the student at every optimizer step; see the module docstring."""

    spec: ContextSpec  # where the context goes in the context view (its `column` and `text` are not used)
    episodes_per_step: int  # seeds per optimizer step, across micro-batches and processes

    def seeds(self, step: int) -> list[int]:
        """The seeds of the episodes played at optimizer step `step` (0, 1, ...), in order."""
        ...

    def rollout(self, seeds: Sequence[int], generate: GenerateFn, tokenizer) -> RolloutBatch:
        """Play the episodes of `seeds` with `generate` (the student, without the context) and return the samples."""
        ...
