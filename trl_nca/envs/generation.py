"""`generate` functions for game rollouts built on Hugging Face `model.generate` (left padding, per-row seeds).

They reuse the evaluation library's `HFBackend`, whose per-row samplers make a reply depend only on its prompt and its
seed, not on which other episodes share the batch. Game evaluation seeds each call by (game, env seed, step), so both
views of a map draw the same random numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..eval.generation import GenerationSettings, HFBackend, item_seed
from ..views import render_prompt_ids


# The OPCD game evaluation's sampling: T=0.7, top-p 0.8, top-k 20.
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


def hf_seeded_generate(
    model, tokenizer, settings: GenerationSettings, chat_template_kwargs: dict[str, Any] | None = None
) -> Callable[[Sequence[Sequence[dict[str, str]]], Sequence[int]], list[list[int]]]:
    """A function `(chat prompts, row seeds) -> completion token ids` (each through its end-of-turn token, if any)."""
    backend = HFBackend(model, tokenizer)
    template_kwargs = dict(chat_template_kwargs or {})

    def generate(prompts, seeds):
        ids = [render_prompt_ids(tokenizer, p, **template_kwargs) for p in prompts]
        out: list[list[int]] = []
        for start in range(0, len(ids), settings.batch_size):
            chunk = slice(start, start + settings.batch_size)
            out += [g.token_ids for g in backend.generate(ids[chunk], list(seeds[chunk]), settings)]
        return out

    return generate


def hf_generate(
    model, tokenizer, settings: GenerationSettings, chat_template_kwargs: dict[str, Any] | None = None
) -> Callable[[Sequence[Sequence[dict[str, str]]]], list[list[int]]]:
    """A `generate(prompts)` for `play_episodes`; row seeds come from `settings.seed` and a running call counter."""
    seeded = hf_seeded_generate(model, tokenizer, settings, chat_template_kwargs)
    calls = [0]

    def generate(prompts):
        seeds = [item_seed(settings.seed, f"call{calls[0]}:row{i}") for i in range(len(prompts))]
        calls[0] += 1
        return seeded(prompts, seeds)

    return generate
