"""Experience texts: the shipped ones, and extracting new ones from a model's own games.

`load_experience(game)` returns the short rules-and-strategy text shipped with the package (`envs/experience/*.txt`).

`extract_experience` regenerates an experience for a given model, as OPCD's pipeline does: each round it plays a batch
of episodes (with the best experience so far as context), shows the model its own trajectories (boards, moves, game
replies and results; not its reasoning) and asks for short transferable lessons, one per line. New lessons are added to
the current set, and the enlarged set is kept only if its win rate on validation maps, with the set as context, beats
the best so far. Run it from the shell with `trl-nca experience --model PATH --game sokoban --output FILE`.

Seeds: extraction episodes use training rounds from 10,000 on (training steps use rounds 0, 1, ...), validation uses
held-out indices from 1,000 on (the evaluation uses 0..127), so neither touches the evaluation maps.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.sampling import GenerateFn, check_generated, item_seed
from ..core.views import render_prompt_ids
from .base import GameEnv
from .prompts import format_action, game_rules
from .registry import game_class, load_experience, make_env, parse_game_options
from .rollout import default_game_spec, play_episodes
from .seeds import heldout_seeds, training_seeds


__all__ = [
    "ExperienceResult",
    "check_options",
    "describe_episode",
    "extract_experience",
    "format_items",
    "load_experience",  # defined with the game registry; kept importable from here
    "parse_items",
    "validation_win_rate",
]

EXTRACTION_ROUND_BASE = 10_000
VALIDATION_START = 1_000
TITLES = {"sokoban": "Sokoban", "frozenlake": "FrozenLake"}


_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(.*\S)\s*$")


def parse_items(text: str, max_chars: int = 300) -> list[str]:
    """The lessons of a reply: lines starting with '-', '*', '•' or a number ('1.' / '1)'), deduplicated, in order."""
    items: list[str] = []
    seen: set[str] = set()
    for line in (text or "").splitlines():
        match = _ITEM.match(line)
        if not match:
            continue
        item = match.group(1).strip()[:max_chars]
        key = " ".join(item.lower().split())
        if key and key not in seen:
            seen.add(key)
            items.append(item)
    return items


def format_items(items: Sequence[str], game: str) -> str:
    """An experience text from lessons, in the shipped texts' layout."""
    return f"Experience for {TITLES[game_class(game).name]}:\n" + "\n".join(f"- {item}" for item in items)


def describe_episode(env: GameEnv, number: int) -> str:
    """A finished episode as the summarising prompt shows it: start board, each move and reply, the result."""
    lines = [f"Game {number}:", "Starting board:", env.initial_board]
    for turn, record in enumerate(env.history, start=1):
        lines.append(f"Turn {turn}: {format_action(record.action)} -> {record.message}")
    result = "WON" if env.won else f"LOST ({env.end_reason})"
    lines.append(f"Result: {result} after {env.num_calls} turns.")
    return "\n".join(lines)


SUMMARY_PROMPT = """\
You just played {n} games of {title}. The rules were:
{rules}

Here is what happened:

{games}

Write the lessons from these games that would help a player win NEW {title} games: rules you learned, mistakes to \
avoid, strategies that worked. Write at most {max_new} short lessons, one per line, each starting with "- ". Write only \
the lessons."""


@dataclass
class ExperienceResult:
    """The best experience found, its validation win rate, and what each round tried."""

    text: str | None
    items: list[str]
    score: float
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validation_win_rate(
    generate: GenerateFn,
    tokenizer,
    game: str,
    experience: str | None,
    seeds: Sequence[int],
    *,
    max_calls: int = 5,
    env_kwargs: dict[str, Any] | None = None,
    sampling_seed: int = 0,
) -> float:
    """Win rate on `seeds` with `experience` as context (None: without context); calls seeded by (seed, step)."""
    envs = [make_env(game, s, max_calls=max_calls, **(env_kwargs or {})) for s in seeds]
    result = play_episodes(
        envs,
        generate,
        tokenizer,
        experience,
        default_game_spec(),
        max_calls,
        sampling_seed=sampling_seed,
        seed_prefix="val:",
    )
    return result.stats["win_rate"]


def extract_experience(
    generate: GenerateFn,
    tokenizer,
    game: str,
    *,
    rounds: int = 3,
    episodes_per_round: int = 8,
    validation_size: int = 16,
    max_items: int = 12,
    max_new_items: int = 5,
    initial_items: Sequence[str] = (),
    max_calls: int = 5,
    env_kwargs: dict[str, Any] | None = None,
    sampling_seed: int = 0,
) -> ExperienceResult:
    """Extract an experience from the model's own games; see the module docstring for the procedure.

    `generate` is a `trl_nca.core.sampling.GenerateFn` (e.g. `generate_fn(HFBackend(model, tokenizer), settings)`). The
    returned `text` is None when no lesson set beat playing without context.
    """
    game = game_class(game).name
    env_kwargs = dict(env_kwargs or {})
    val_seeds = heldout_seeds(validation_size, start=VALIDATION_START)
    common = {"max_calls": max_calls, "env_kwargs": env_kwargs, "sampling_seed": sampling_seed}

    def text_of(items):
        return format_items(items, game) if items else None

    best_items = list(initial_items)[:max_items]
    best_score = validation_win_rate(generate, tokenizer, game, text_of(best_items), val_seeds, **common)
    history: list[dict[str, Any]] = [{"round": 0, "items": list(best_items), "score": best_score, "kept": True}]
    for r in range(1, rounds + 1):
        new_items, train_win_rate = _lessons_of_round(
            generate, tokenizer, game, r, text_of(best_items), episodes_per_round, max_new_items, common
        )
        seen = {" ".join(i.lower().split()) for i in best_items}
        candidate = best_items + [i for i in new_items if " ".join(i.lower().split()) not in seen]
        candidate = candidate[:max_items]
        entry = {"round": r, "train_win_rate": train_win_rate, "new_items": new_items, "items": candidate}
        if candidate == best_items:
            entry.update(score=best_score, kept=False)
        else:
            score = validation_win_rate(generate, tokenizer, game, text_of(candidate), val_seeds, **common)
            entry.update(score=score, kept=score > best_score)
            if score > best_score:
                best_items, best_score = candidate, score
        history.append(entry)
    return ExperienceResult(text=text_of(best_items), items=best_items, score=best_score, history=history)


def _lessons_of_round(
    generate: GenerateFn, tokenizer, game: str, r: int, context: str | None, episodes: int, max_new_items: int, common
) -> tuple[list[str], float]:
    """Round `r` of `extract_experience`: play `episodes` training maps with `context`, show the model its games and
    read its new lessons. Returns the lessons and the round's training win rate."""
    max_calls, env_kwargs, sampling_seed = common["max_calls"], common["env_kwargs"], common["sampling_seed"]
    envs = [
        make_env(game, s, max_calls=max_calls, **env_kwargs)
        for s in training_seeds(episodes, round=EXTRACTION_ROUND_BASE + r)
    ]
    played = play_episodes(
        envs,
        generate,
        tokenizer,
        context,
        default_game_spec(),
        max_calls,
        sampling_seed=sampling_seed,
        seed_prefix=f"extract:{r}:",
    )
    prompt = SUMMARY_PROMPT.format(
        n=len(envs),
        title=TITLES[game],
        rules=game_rules(envs[0]),
        games="\n\n".join(describe_episode(env, k) for k, env in enumerate(envs, start=1)),
        max_new=max_new_items,
    )
    summary_ids = render_prompt_ids(tokenizer, [{"role": "user", "content": prompt}])
    reply = check_generated(generate([summary_ids], [item_seed(sampling_seed, f"summary:{r}")]), 1)[0].text
    return parse_items(reply)[:max_new_items], played.stats["win_rate"]


def check_options(values: Sequence[str], game: str, max_calls: int) -> dict[str, Any]:
    """The game settings of `--game-option`, checked by building one map."""
    options = parse_game_options(values)
    if "seed" in options or "max_calls" in options:
        raise ValueError("Set the call budget with --max-calls; 'seed' and 'max_calls' are not game settings.")
    try:
        make_env(game, 0, max_calls=max_calls, **options)
    except TypeError as error:
        raise ValueError(str(error)) from None
    return options
