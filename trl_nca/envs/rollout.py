"""Batched game rollouts: play many episodes at once and turn every model call into a training sample.

At each step all episodes still running are prompted together, in ONE call of a `trl_nca.core.sampling.GenerateFn`; the
caller's generate function samples the completions (so the trainer keeps control of the policy, sampling settings and
devices). Every call becomes a sample holding the prompt without context, the experience string for the context view,
and the completion token ids exactly as generated, which the trainer scores under both views without re-tokenising
them. The prompts are rendered here, once, with the tokenizer's chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.sampling import GenerateFn, GenerationSettings, check_generated, item_seed
from ..core.views import ContextSpec, add_context, render_prompt_ids
from ..trainers.rollouts import RolloutBatch, RolloutSample
from .base import GameEnv
from .prompts import build_step_messages, parse_action
from .registry import game_class, load_experience, make_env
from .seeds import training_seed


# The OPCD game evaluation's sampling: T=0.7, top-p 0.8, top-k 20, up to 1024 tokens per call.
GAME_TEMPERATURE = 0.7
GAME_TOP_P = 0.8
GAME_TOP_K = 20
GAME_MAX_NEW_TOKENS = 1024


def game_generation_settings(**overrides: Any) -> GenerationSettings:
    """`GenerationSettings` with the OPCD game defaults; keyword arguments override them."""
    values = {
        "temperature": GAME_TEMPERATURE,
        "top_p": GAME_TOP_P,
        "top_k": GAME_TOP_K,
        "max_new_tokens": GAME_MAX_NEW_TOKENS,
    }
    values.update(overrides)
    return GenerationSettings(**values)


def call_seed(sampling_seed: int, env: GameEnv, prefix: str | None = None) -> int:
    """The row seed of an episode's next model call: `item_seed(sampling_seed, "<prefix><env seed>:<call>")`, the
    prefix defaulting to `"<game>:"`. A call's sample then depends on the map and the call number only, not on the
    batching or on which other episodes are played, and both views of a map share it (common random numbers)."""
    prefix = f"{env.name}:" if prefix is None else prefix
    return item_seed(sampling_seed, f"{prefix}{env.seed}:{env.num_calls}")


def default_game_spec() -> ContextSpec:
    """OPCD's game layout: the experience goes first in the (only) user message, then a blank line, then the game."""
    return ContextSpec(placement="user", template="{context}\n\n{prompt}")


@dataclass
class RolloutResult:
    """The samples of a rollout (one per model call) and its statistics.

    `stats` holds `win_rate`, `invalid_action_rate` (invalid calls / calls), `mean_steps` (model calls per episode),
    `mean_reward`, `cap_rate` (share of episodes ended by the call budget), `mean_completion_tokens` (per call),
    `num_episodes`, `num_calls` and `episodes` (one outcome dict per episode, in env order).
    """

    samples: list[dict[str, Any]]
    stats: dict[str, Any]
    envs: list[GameEnv] = field(default_factory=list, repr=False)
    texts: list[str] = field(default_factory=list, repr=False)  # decoded completion of each sample

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """The scalar statistics, for a trainer's logger."""
        return {f"{prefix}{k}": float(v) for k, v in self.stats.items() if isinstance(v, (int, float))}


def rollout_stats(envs: Sequence[GameEnv], samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Win rate, invalid-action rate, steps, rewards and per-episode outcomes of finished episodes."""
    n = len(envs)
    calls = sum(env.num_calls for env in envs)
    outcomes = [env.outcome().to_dict() for env in envs]
    tokens = [len(s["completion_ids"]) for s in samples]
    return {
        "win_rate": sum(env.won for env in envs) / n if n else 0.0,
        "invalid_action_rate": sum(env.num_invalid for env in envs) / calls if calls else 0.0,
        "mean_steps": calls / n if n else 0.0,
        "mean_reward": sum(env.reward for env in envs) / n if n else 0.0,
        "cap_rate": sum(o["ended_at_cap"] for o in outcomes) / n if n else 0.0,
        "mean_completion_tokens": sum(tokens) / len(tokens) if tokens else 0.0,
        "num_episodes": n,
        "num_calls": calls,
        "episodes": outcomes,
    }


def play_episodes(
    envs: list[GameEnv],
    generate: GenerateFn,
    tokenizer,
    context: str | None,
    spec: ContextSpec | None = None,
    max_calls: int = 5,
    *,
    sample_context: str | None = None,
    sampling_seed: int = 0,
    seed_prefix: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> RolloutResult:
    """Play every env to the end, batching all live episodes of a step into one `generate` call.

    `generate(prompt_ids, seeds)` (a `trl_nca.core.sampling.GenerateFn`) gets the chat prompts of the live episodes,
    rendered with `tokenizer` (and `chat_template_kwargs`); with `context`, they are already the context view built by
    `spec` (default: `default_game_spec()`). Each prompt's seed is `call_seed(sampling_seed, env, seed_prefix)`. The
    replies' text is read by `parse_action`. Episodes last at most `min(env.max_calls, max_calls)` calls. Each sample
    is `{"prompt": messages without context, "context": sample_context or context, "completion_ids", "episode",
    "step", "seed", "action"}`; pass `sample_context=experience` when the student plays without context
    (`context=None`) but the samples need the experience for their context view.
    """
    spec = spec or default_game_spec()
    template_kwargs = dict(chat_template_kwargs or {})
    if max_calls < 1:
        raise ValueError(f"max_calls must be at least 1, got {max_calls}.")
    for env in envs:
        if env.done or env.history:
            raise ValueError("play_episodes needs fresh environments (no moves played yet).")
        env.max_calls = min(env.max_calls, max_calls)  # the prompts then announce the budget actually played
    samples: list[dict[str, Any]] = []
    texts: list[str] = []
    for step in range(max_calls):
        live = [i for i, env in enumerate(envs) if not env.done]
        if not live:
            break
        prompts = [build_step_messages(envs[i]) for i in live]
        views = [add_context(p, context, spec) for p in prompts] if context else prompts
        ids = [render_prompt_ids(tokenizer, view, **template_kwargs) for view in views]
        seeds = [call_seed(sampling_seed, envs[i], seed_prefix) for i in live]
        completions = check_generated(generate(ids, seeds), len(live))
        for i, prompt, completion in zip(live, prompts, completions):
            action = parse_action(completion.text)
            envs[i].step(action)
            samples.append(
                {
                    "prompt": prompt,
                    "context": sample_context if sample_context is not None else context,
                    "completion_ids": list(completion.token_ids),
                    "episode": i,
                    "step": step,
                    "seed": envs[i].seed,
                    "action": action,
                }
            )
            texts.append(completion.text)
    for env in envs:
        env.end_at_cap()
    return RolloutResult(samples=samples, stats=rollout_stats(envs, samples), envs=list(envs), texts=texts)


@dataclass
class GameRollout:
    """A game played by the student at each optimizer step: `NCATrainer(..., rollout=GameRollout(...))`.

    Implements `trl_nca.trainers.rollouts.Rollout`. `seeds(step)` are `episodes_per_step` training maps following the
    OPCD training formula (`training_seed(j, round=seed_round_offset + step)`), so every step plays new maps and no step
    ever plays a held-out evaluation map; `rollout(seeds, generate, tokenizer)` plays them without the experience and
    returns one sample per model call, whose context view puts `experience` (default: the game's shipped text) where
    `spec` says (default: the top of the user message). Its metrics are those of `RolloutResult.stats` but the counts.
    """

    game: str = "sokoban"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    episodes_per_step: int = 8
    experience: str | None = None
    max_calls: int = 5
    seed_round_offset: int = 0
    spec: ContextSpec = field(default_factory=default_game_spec)

    def __post_init__(self):
        self.game = game_class(self.game).name
        if self.episodes_per_step < 1:
            raise ValueError(f"episodes_per_step must be at least 1, got {self.episodes_per_step}.")
        if self.max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, got {self.max_calls}.")
        if self.experience is None:
            self.experience = load_experience(self.game)
        elif not self.experience.strip():
            raise ValueError("The experience text is empty; give a non-empty string or None for the shipped one.")
        if "max_calls" in self.env_kwargs or "seed" in self.env_kwargs:
            raise ValueError("Set the call budget with `max_calls` and seeds through the schedule, not in env_kwargs.")
        make_env(self.game, training_seed(0), **self.env_kwargs)  # fail early on bad settings

    def seeds(self, step_index: int) -> list[int]:
        """The training seeds of optimizer step `step_index`."""
        return [training_seed(j, round=self.seed_round_offset + step_index) for j in range(self.episodes_per_step)]

    def make_envs(self, step_index: int) -> list[GameEnv]:
        """Fresh training envs for optimizer step `step_index`."""
        return self._new_envs(self.seeds(step_index))

    def _new_envs(self, seeds: Sequence[int]) -> list[GameEnv]:
        return [make_env(self.game, int(seed), max_calls=self.max_calls, **self.env_kwargs) for seed in seeds]

    def rollout(self, seeds: Sequence[int], generate: GenerateFn, tokenizer) -> RolloutBatch:
        """The `trl_nca.trainers.rollouts.Rollout` step: play the maps of `seeds` without the experience; every model
        call becomes a sample carrying the experience for its context view."""
        result = play_episodes(
            self._new_envs(seeds), generate, tokenizer, None, self.spec, self.max_calls, sample_context=self.experience
        )
        samples = [RolloutSample(s["prompt"], s["context"], list(s["completion_ids"])) for s in result.samples]
        metrics = {k: v for k, v in result.metrics().items() if k not in ("num_episodes", "num_calls")}
        return RolloutBatch(samples, metrics)

    def play(self, step_index: int, generate: GenerateFn, tokenizer, with_context: bool = False) -> RolloutResult:
        """Play the envs of `step_index`: the student without context by default; samples always carry the experience."""
        return play_episodes(
            self.make_envs(step_index),
            generate,
            tokenizer,
            self.experience if with_context else None,
            self.spec,
            self.max_calls,
            sample_context=self.experience,
        )
