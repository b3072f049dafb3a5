"""Paired win-rate evaluation on fixed held-out maps: every map is played once without and once with the experience.

Each map gives one `PairedRecord` (item id `<game>-<seed>`), so the evaluation library's metrics and reports work on
games unchanged. Per view (`ViewOutcome`):

- `correct`: the episode was won (reward exactly 1.0);
- `num_tokens`: completion tokens of the whole episode, summed over its calls (`extra["tokens_per_step"]` is the mean
  per call), so the report's length columns are tokens per episode;
- `truncated`: the episode ended at the call budget ("max_steps");
- `format_failure`: at least one reply had no bracketed move;
- `answer`: the moves read from the replies, e.g. `[right] [down] (no action)`; `completion`: the last reply;
- `extra`: reward, steps (model calls), moves, invalid moves, end reason, tokens per step, all replies.

`meta` holds the game, seed, oracle result (`oracle_moves`: shortest solution length within the budget or None;
`oracle_solvable`) and, per view, steps, invalid moves and whether the episode ended at the cap. Both views of a map
sample with the same per-call seeds (common random numbers).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..eval.generation import GenerationSettings, item_seed
from ..eval.metrics import compute_metrics
from ..eval.records import PairedRecord, ViewOutcome
from ..views import ContextSpec
from .base import MAX_STEPS, GameEnv
from .experience import load_experience
from .generation import GAME_MAX_NEW_TOKENS, GAME_TEMPERATURE, GAME_TOP_K, GAME_TOP_P, hf_seeded_generate
from .prompts import format_action
from .registry import game_class, make_env
from .rollout import default_game_spec, run_episodes
from .seeds import DEFAULT_HELDOUT, heldout_seeds
from .solver import shortest_solution_length


logger = logging.getLogger(__name__)


def view_outcome(env: GameEnv, texts: Sequence[str], completion_ids: Sequence[Sequence[int]]) -> ViewOutcome:
    """The `ViewOutcome` of one finished episode."""
    actions = [t.action for t in env.history]
    tokens = sum(len(ids) for ids in completion_ids)
    no_action = sum(a is None for a in actions)
    return ViewOutcome(
        completion=texts[-1] if texts else "",
        answer=" ".join(format_action(a) for a in actions),
        correct=bool(env.won),
        num_tokens=tokens,
        truncated=env.end_reason == MAX_STEPS,
        format_failure=no_action > 0,
        extra={
            "reward": env.reward,
            "steps": env.num_calls,
            "moves": env.num_moves,
            "invalid_moves": env.num_invalid,
            "no_action_calls": no_action,
            "end_reason": env.end_reason,
            "tokens_per_step": tokens / env.num_calls if env.num_calls else 0.0,
            "replies": list(texts),
        },
    )


def play_view(
    generate_seeded,
    tokenizer,
    game: str,
    seeds: Sequence[int],
    *,
    context: str | None,
    spec: ContextSpec,
    max_calls: int,
    env_kwargs: dict[str, Any],
    sampling_seed: int,
) -> list[ViewOutcome]:
    """Play one view of every seed (all episodes batched) and return their outcomes in seed order."""
    envs = [make_env(game, seed, max_calls=max_calls, **env_kwargs) for seed in seeds]

    def generate(prompts, keys):
        row_seeds = [item_seed(sampling_seed, f"{game}:{envs[i].seed}:{step}") for i, step in keys]
        return generate_seeded(prompts, row_seeds)

    result = run_episodes(envs, generate, tokenizer, context, spec, max_calls)
    texts: list[list[str]] = [[] for _ in envs]
    ids: list[list[list[int]]] = [[] for _ in envs]
    for sample, text in zip(result.samples, result.texts):
        texts[sample["episode"]].append(text)
        ids[sample["episode"]].append(sample["completion_ids"])
    return [view_outcome(env, texts[i], ids[i]) for i, env in enumerate(envs)]


def oracle_moves(game: str, seed: int, max_calls: int, env_kwargs: dict[str, Any]) -> int | None:
    """Shortest solution length of a map if it fits in the call budget, else None."""
    return shortest_solution_length(make_env(game, seed, max_calls=max_calls, **env_kwargs), max_moves=max_calls)


def paired_game_records(
    generate_seeded,
    tokenizer,
    game: str,
    seeds: Sequence[int],
    experience: str,
    *,
    spec: ContextSpec | None = None,
    max_calls: int = 5,
    env_kwargs: dict[str, Any] | None = None,
    sampling_seed: int = 0,
    run_key: str | None = None,
) -> list[PairedRecord]:
    """Play every seed without and with `experience` and pair the outcomes."""
    game = game_class(game).name
    spec = spec or default_game_spec()
    env_kwargs = dict(env_kwargs or {})
    common = {"spec": spec, "max_calls": max_calls, "env_kwargs": env_kwargs, "sampling_seed": sampling_seed}
    x = play_view(generate_seeded, tokenizer, game, seeds, context=None, **common)
    xc = play_view(generate_seeded, tokenizer, game, seeds, context=experience, **common)
    records = []
    for seed, ox, oxc in zip(seeds, x, xc):
        moves = oracle_moves(game, seed, max_calls, env_kwargs)
        meta = {
            "game": game,
            "seed": seed,
            "oracle_moves": moves,
            "oracle_solvable": moves is not None,
            "steps_x": ox.extra["steps"],
            "steps_xc": oxc.extra["steps"],
            "invalid_moves_x": ox.extra["invalid_moves"],
            "invalid_moves_xc": oxc.extra["invalid_moves"],
            "ended_at_cap_x": ox.truncated,
            "ended_at_cap_xc": oxc.truncated,
        }
        if run_key is not None:
            meta["run_key"] = run_key
        records.append(PairedRecord(item_id=f"{game}-{seed}", x=ox, xc=oxc, meta=meta))
    return records


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def game_summary(records: Sequence[PairedRecord], n_bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Win rates both ways, BothWon, harm, help (from `trl_nca.eval.metrics`) and the game statistics of each view.

    `steps_to_success_*` is the mean number of calls of won episodes (None without wins); `invalid_move_rate_*` is
    invalid calls / calls; `cap_rate_*` the share of episodes ended by the call budget; `tokens_per_step_*` completion
    tokens per call; `oracle_ceiling` the share of maps a perfect player wins within the budget.
    """
    metrics = compute_metrics(records, n_bootstrap=n_bootstrap, seed=seed)
    summary: dict[str, Any] = {
        "n": metrics["n"],
        "win_rate_x": metrics["acc_x"],
        "win_rate_xc": metrics["acc_xc"],
        "delta": metrics["delta"],
        "both_won": metrics["both_correct"],
        "both_lost": metrics["both_wrong"],
        "harm": metrics["harm"],
        "harm_count": metrics["harm_count"],
        "help": metrics["help"],
        "help_count": metrics["help_count"],
        "mcnemar_p": metrics["mcnemar_p"],
        "regime": metrics["regime"],
        "ci": {k: metrics["ci"].get(v) for k, v in (("win_rate_x", "acc_x"), ("win_rate_xc", "acc_xc"))},
    }
    for view in ("x", "xc"):
        outcomes = [getattr(r, view) for r in records]
        calls = sum(o.extra["steps"] for o in outcomes)
        summary[f"steps_to_success_{view}"] = _mean([o.extra["steps"] for o in outcomes if o.correct])
        summary[f"invalid_move_rate_{view}"] = (
            sum(o.extra["invalid_moves"] for o in outcomes) / calls if calls else None
        )
        summary[f"cap_rate_{view}"] = _mean([float(o.truncated) for o in outcomes])
        summary[f"tokens_per_step_{view}"] = sum(o.num_tokens for o in outcomes) / calls if calls else None
        summary[f"mean_reward_{view}"] = _mean([o.extra["reward"] for o in outcomes])
    summary["oracle_ceiling"] = _mean([float(r.meta["oracle_solvable"]) for r in records])
    return summary


def _run_key(game: str, experience: str, spec: ContextSpec, settings: GenerationSettings, **config) -> str:
    """What must not change between a run and its resumption (the seed list may grow: seeds are the item ids)."""
    payload = {
        "game": game,
        "experience_sha256": hashlib.sha256(experience.encode("utf-8")).hexdigest(),
        "spec": [spec.placement, spec.template, spec.separator],
        "generation": settings.to_dict(),
        **config,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def evaluate_game(
    model,
    tokenizer,
    game: str = "sokoban",
    num_seeds: int = DEFAULT_HELDOUT,
    experience: str | None = None,
    *,
    spec: ContextSpec | None = None,
    temperature: float = GAME_TEMPERATURE,
    top_p: float = GAME_TOP_P,
    top_k: int = GAME_TOP_K,
    max_new_tokens: int = GAME_MAX_NEW_TOKENS,
    do_sample: bool = True,
    seed: int = 0,
    batch_size: int = 32,
    max_calls: int = 5,
    env_kwargs: dict[str, Any] | None = None,
    seeds: Sequence[int] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    output_dir: str | Path | None = None,
    name: str = "model",
    n_bootstrap: int = 1000,
) -> tuple[list[PairedRecord], dict[str, Any]]:
    """Paired win-rate evaluation of an HF model on `num_seeds` held-out maps (OPCD formula) or on `seeds`.

    `experience` defaults to the game's shipped text; `spec` to OPCD's layout (experience at the top of the user
    message). With `output_dir`, writes the evaluation report (records, summary.json, report.md, figures) plus
    `game_summary.json`. Returns the records and the game summary.
    """
    game = game_class(game).name
    experience = experience if experience is not None else load_experience(game)
    spec = spec or default_game_spec()
    seeds = list(seeds) if seeds is not None else heldout_seeds(num_seeds)
    settings = GenerationSettings(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        do_sample=do_sample,
        seed=seed,
        batch_size=batch_size,
    )
    generate_seeded = hf_seeded_generate(model, tokenizer, settings, chat_template_kwargs)
    records = paired_game_records(
        generate_seeded,
        tokenizer,
        game,
        seeds,
        experience,
        spec=spec,
        max_calls=max_calls,
        env_kwargs=env_kwargs,
        sampling_seed=seed,
    )
    summary = game_summary(records, n_bootstrap=n_bootstrap)
    if output_dir is not None:
        from ..eval.report import ModelRun, write_report

        output_dir = Path(output_dir)
        provenance = {
            "game": game,
            "game_options": {"env_kwargs": dict(env_kwargs or {}), "max_calls": max_calls, "num_seeds": len(seeds)},
            "context": {"sha256": hashlib.sha256(experience.encode("utf-8")).hexdigest()},
            "generation": settings.to_dict(),
        }
        write_report([ModelRun(name, records, provenance=provenance)], output_dir, n_bootstrap=n_bootstrap)
        (output_dir / "game_summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return records, summary


RUN_OPTIONS = ("num_seeds", "seeds", "max_calls", "experience_file", "chat_template_kwargs")


def run_game_eval(
    *,
    model,
    tokenizer,
    game: str,
    generation: GenerationSettings,
    context: ContextSpec | None,
    options: dict[str, Any],
    output_path: str | Path | None,
    progress: bool = False,
) -> list[PairedRecord]:
    """Entry point of `trl-nca eval --game NAME` (see docs/evaluation.md); resumes from `output_path`.

    `context` (from --context-text/--context-file) replaces the game's experience and sets its placement; without it
    the shipped experience goes into the user message. `options` (--game-option) may set `num_seeds` (default 128),
    `seeds` (a list), `max_calls` (5), `experience_file`, `chat_template_kwargs`; any other key is a game setting
    (`size`, `num_holes`, `dim_room`, `num_boxes`). Sampling follows `generation` as given: pass `--temperature 0.7
    --top-p 0.8 --top-k 20` for OPCD's game settings.
    """
    from ..eval.errors import EvalInputError
    from ..eval.store import append_records, load_records

    try:
        cls = game_class(game)
    except ValueError as error:
        raise EvalInputError(str(error)) from error
    options = dict(options or {})
    env_kwargs = {k: v for k, v in options.items() if k not in RUN_OPTIONS}
    max_calls = int(options.get("max_calls", 5))
    seeds = (
        list(options["seeds"]) if "seeds" in options else heldout_seeds(int(options.get("num_seeds", DEFAULT_HELDOUT)))
    )
    if context is not None:
        if context.text is None:
            raise EvalInputError("A game needs one fixed context: use --context-text or --context-file.")
        experience, spec = context.text, context
    elif "experience_file" in options:
        try:
            experience = Path(options["experience_file"]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise EvalInputError(f"Cannot read the experience file {options['experience_file']!r}: {error}") from error
        spec = default_game_spec()
    else:
        experience, spec = load_experience(cls.name), default_game_spec()
    try:
        make_env(cls.name, seeds[0] if seeds else 0, max_calls=max_calls, **env_kwargs)
    except (TypeError, ValueError) as error:
        raise EvalInputError(f"Bad --game-option for {cls.name}: {error}") from error
    run_key = _run_key(cls.name, experience, spec, generation, env_kwargs=env_kwargs, max_calls=max_calls)
    done = load_records(output_path, expected_run_key=run_key) if output_path is not None else {}
    todo = [s for s in seeds if f"{cls.name}-{s}" not in done]
    if progress:
        logger.info(
            "%s: %d of %d maps to play (%d already in %s).", cls.name, len(todo), len(seeds), len(done), output_path
        )
    if todo:
        generate_seeded = hf_seeded_generate(model, tokenizer, generation, options.get("chat_template_kwargs"))
        new = paired_game_records(
            generate_seeded,
            tokenizer,
            cls.name,
            todo,
            experience,
            spec=spec,
            max_calls=max_calls,
            env_kwargs=env_kwargs,
            sampling_seed=generation.seed,
            run_key=run_key,
        )
        if output_path is not None:
            append_records(output_path, new)
        done.update({r.item_id: r for r in new})
    return [done[f"{cls.name}-{s}"] for s in seeds]
