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

`GameEvaluation` is the game task of the evaluation runner (`trl_nca.eval.runner`): the same resume mechanism, run
key and provenance record as dataset evaluations. (This module was `trl_nca.envs.evaluate`; see docs/design.md.)
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.checks import is_int, shown
from ..core.sampling import GenerateFn, GenerationSettings, check_generated
from ..core.views import ContextSpec, add_context, render_prompt_ids
from ..envs import (
    GAME_MAX_NEW_TOKENS,
    GAME_TEMPERATURE,
    GAME_TOP_K,
    GAME_TOP_P,
    GameEnv,
    build_step_messages,
    call_seed,
    default_game_spec,
    game_class,
    heldout_seeds,
    load_experience,
    make_env,
    parse_action,
    shortest_solution_length,
)
from ..envs.base import MAX_STEPS
from ..envs.prompts import format_action
from ..envs.seeds import DEFAULT_HELDOUT
from ..inputs import sha256_text, write_text_atomic
from .columns import game_keys, game_names
from .errors import EvalInputError
from .metrics import compute_metrics
from .records import PairedRecord, ViewOutcome
from .report import ModelRun, safe_name, write_report
from .runner import TaskItem, run_paired, run_provenance


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


class _Pair:
    """Both views of one map while they are played: the two envs and each view's replies."""

    def __init__(self, game: str, seed: int, max_calls: int, env_kwargs: dict[str, Any]):
        self.seed = seed
        self.envs = {view: make_env(game, seed, max_calls=max_calls, **env_kwargs) for view in ("x", "xc")}
        self.texts: dict[str, list[str]] = {"x": [], "xc": []}
        self.ids: dict[str, list[list[int]]] = {"x": [], "xc": []}

    @property
    def live(self) -> list[str]:
        return [view for view, env in self.envs.items() if not env.done]

    def outcome(self, view: str) -> ViewOutcome:
        return view_outcome(self.envs[view], self.texts[view], self.ids[view])


def play_pairs(
    generate: GenerateFn,
    tokenizer,
    game: str,
    seeds: Sequence[int],
    experience: str,
    *,
    spec: ContextSpec,
    max_calls: int,
    env_kwargs: dict[str, Any],
    sampling_seed: int,
    max_prompts: int | None = None,
    on_pair: Callable[[int, ViewOutcome, ViewOutcome], None],
    chat_template_kwargs: dict[str, Any] | None = None,
) -> None:
    """Play every map without and with `experience`, calling `on_pair(seed, x, xc)` as soon as both views of a map end.

    Maps are played with continuous batching: each `generate` call holds the next prompt of every live episode
    (both views of the maps in play, at most `max_prompts` prompts when a new map is let in; None: all maps at once),
    and a finished map's place goes to the next seed. The call `k` of a map's episode is sampled with the row seed
    `item_seed(sampling_seed, "<game>:<seed>:<k>")` in both views, so the outcome of a map depends neither on the
    batching nor on which maps were played before: a resumed evaluation gives the records of an uninterrupted one.
    """
    template_kwargs = dict(chat_template_kwargs or {})
    pending = list(seeds)[::-1]
    active: list[_Pair] = []
    while pending or active:
        live = sum(len(pair.live) for pair in active)
        while pending and (not active or max_prompts is None or live + 2 <= max_prompts):
            active.append(_Pair(game, pending.pop(), max_calls, env_kwargs))
            live += 2
        prompts, row_seeds, owners = [], [], []
        for pair in active:
            for view in pair.live:
                env = pair.envs[view]
                messages = build_step_messages(env)
                view_messages = add_context(messages, experience, spec) if view == "xc" else messages
                prompts.append(render_prompt_ids(tokenizer, view_messages, **template_kwargs))
                row_seeds.append(call_seed(sampling_seed, env, f"{game}:"))
                owners.append((pair, view))
        completions = check_generated(generate(prompts, row_seeds), len(prompts))
        for (pair, view), completion in zip(owners, completions):
            pair.envs[view].step(parse_action(completion.text))
            pair.texts[view].append(completion.text)
            pair.ids[view].append(list(completion.token_ids))
        still = []
        for pair in active:
            if pair.live:
                still.append(pair)
            else:
                on_pair(pair.seed, pair.outcome("x"), pair.outcome("xc"))
        active = still


def oracle_moves(game: str, seed: int, max_calls: int, env_kwargs: dict[str, Any]) -> int | None:
    """Shortest solution length of a map if it fits in the call budget, else None."""
    return shortest_solution_length(make_env(game, seed, max_calls=max_calls, **env_kwargs), max_moves=max_calls)


def _game_meta(game: str, seed: int, ox: ViewOutcome, oxc: ViewOutcome, moves: int | None) -> dict[str, Any]:
    """A played map's record metadata: the map, its oracle solution length (`moves`, None beyond the call budget)
    and each view's calls, invalid moves and whether it ended at the call cap."""
    return {
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


def paired_game_records(
    generate: GenerateFn,
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
    batch_size: int | None = None,
    on_record: Callable[[PairedRecord], None] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[PairedRecord]:
    """Play every seed without and with `experience` and pair the outcomes (records in seed order).

    `on_record(record)` is called as each map finishes (both views), e.g. to append it to a file; `batch_size` bounds
    the prompts of a generate call when a new map is let in (see `play_pairs`).
    """
    game = game_class(game).name
    spec = spec or default_game_spec()
    env_kwargs = dict(env_kwargs or {})
    repeated = sorted({s for s in seeds if list(seeds).count(s) > 1})
    if repeated:
        raise ValueError(f"Each map is played once; the seeds {repeated} appear more than once.")
    records: dict[int, PairedRecord] = {}

    def pair(seed: int, ox: ViewOutcome, oxc: ViewOutcome) -> None:
        meta = _game_meta(game, seed, ox, oxc, oracle_moves(game, seed, max_calls, env_kwargs))
        if run_key is not None:
            meta["run_key"] = run_key
        records[seed] = PairedRecord(item_id=f"{game}-{seed}", x=ox, xc=oxc, meta=meta)
        if on_record is not None:
            on_record(records[seed])

    play_pairs(
        generate,
        tokenizer,
        game,
        seeds,
        experience,
        spec=spec,
        max_calls=max_calls,
        env_kwargs=env_kwargs,
        sampling_seed=sampling_seed,
        max_prompts=batch_size,
        on_pair=pair,
        chat_template_kwargs=chat_template_kwargs,
    )
    return [records[seed] for seed in seeds]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def game_summary(records: Sequence[PairedRecord], n_bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Win rates both ways, BothWon, harm, help (from `trl_nca.eval.metrics`) and the game statistics of each view.

    `steps_to_success_*` is the mean number of calls of won episodes (None without wins); `invalid_move_rate_*` is
    invalid calls / calls; `cap_rate_*` the share of episodes ended by the call budget; `tokens_per_step_*` completion
    tokens per call; `oracle_ceiling` the share of maps a perfect player wins within the budget.
    """
    metrics = compute_metrics(records, n_bootstrap=n_bootstrap, seed=seed)
    renamed = game_names()  # a win rate is an accuracy (trl_nca.eval.columns)
    summary: dict[str, Any] = {renamed.get(key, key): metrics[key] for key in game_keys()}
    summary["ci"] = {renamed[key]: metrics["ci"].get(key) for key in ("acc_x", "acc_xc")}
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


def context_info(spec: ContextSpec, text: str, source: str | None) -> dict[str, Any]:
    """The provenance entry of a context: its hash, where it came from and where it goes."""
    return {
        "sha256": sha256_text(text),
        "source": source,
        "placement": spec.placement,
        "template": spec.template if spec.placement == "user" else None,
        "separator": spec.separator if spec.placement == "system" else None,
    }


@dataclass
class GameEvaluation:
    """A validated game evaluation (from `check_game_options`), and the game task of the evaluation runner: which
    maps, which settings, which experience and where it goes."""

    game: str
    seeds: list[int]
    max_calls: int
    env_kwargs: dict[str, Any]
    experience: str
    spec: ContextSpec
    chat_template_kwargs: dict[str, Any] | None = None
    context_source: str | None = None
    _items: dict[int, list[TaskItem]] = field(default_factory=dict, repr=False)

    def item_id(self, seed: int) -> str:
        return f"{self.game}-{seed}"

    def describe(self) -> dict[str, Any]:
        """The task's part of the provenance record; the seed list is not part of it (seeds are the item ids)."""
        return {
            "context": context_info(self.spec, self.experience, self.context_source),
            "scorer": "won",
            "game": self.game,
            "game_settings": dict(self.env_kwargs),
            "max_calls": self.max_calls,
            "chat_template_kwargs": dict(self.chat_template_kwargs or {}),
        }

    def prepare(self, tokenizer) -> list[TaskItem]:
        """One item per map; its fingerprint covers the first prompt of both views as the model reads it (tokens)."""
        if id(tokenizer) not in self._items:
            kwargs = dict(self.chat_template_kwargs or {})
            items = []
            for seed in self.seeds:
                messages = build_step_messages(make_env(self.game, seed, max_calls=self.max_calls, **self.env_kwargs))
                views = [messages, add_context(messages, self.experience, self.spec)]
                ids = [render_prompt_ids(tokenizer, view, **kwargs) for view in views]
                fingerprint = sha256_text(json.dumps([self.item_id(seed), ids], sort_keys=True))
                items.append(TaskItem(self.item_id(seed), fingerprint))
            self._items = {id(tokenizer): items}
        return self._items[id(tokenizer)]

    def play(self, items, generate: GenerateFn, tokenizer, settings: GenerationSettings, on_records) -> None:
        """Play both views of every map of `items` (continuous batching, see `play_pairs`); records as maps end."""
        by_id = {self.item_id(seed): seed for seed in self.seeds}
        paired_game_records(
            generate,
            tokenizer,
            self.game,
            [by_id[item.item_id] for item in items],
            self.experience,
            spec=self.spec,
            max_calls=self.max_calls,
            env_kwargs=self.env_kwargs,
            sampling_seed=settings.seed,
            batch_size=settings.batch_size,
            on_record=lambda record: on_records([record]),
            chat_template_kwargs=self.chat_template_kwargs,
        )


RUN_OPTIONS = ("num_seeds", "seeds", "max_calls", "experience_file", "chat_template_kwargs")


def check_game_options(
    game: str,
    options: dict[str, Any] | None,
    context: ContextSpec | None = None,
    context_source: str | None = None,
) -> GameEvaluation:
    """Validate `--game-option` values (and an optional context) into a `GameEvaluation`, before any model work.

    Run options: `num_seeds` (a positive integer, default 128 held-out maps), `seeds` (a non-empty list of distinct
    non-negative integers, instead of `num_seeds`), `max_calls` (positive integer, default 5), `experience_file` (a
    UTF-8 text file replacing the shipped experience), `chat_template_kwargs` (an object). Any other key is a game
    setting (`size`, `num_holes`, `dim_room`, `num_boxes`), checked by building the first map. Raises `EvalInputError`
    naming the option and the fix. `context_source` describes where a given context came from, for the provenance.
    """
    try:
        cls = game_class(game)
    except ValueError as error:
        raise EvalInputError(str(error)) from error
    options = dict(options or {})
    seeds = _checked_seeds(options)
    max_calls = options.get("max_calls", 5)
    if not is_int(max_calls) or max_calls < 1:
        raise EvalInputError(
            f"--game-option max_calls must be a positive integer (model calls per episode; OPCD uses 5), got "
            f"{shown(max_calls)}."
        )
    template_kwargs = options.get("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise EvalInputError(
            "--game-option chat_template_kwargs must be a JSON object, e.g. chat_template_kwargs="
            f'{{"enable_thinking":false}}, got {shown(template_kwargs)}.'
        )
    env_kwargs = _checked_game_settings(cls, options)
    experience, spec, source = _game_context(cls, options, context, context_source)
    try:
        make_env(cls.name, seeds[0], max_calls=max_calls, **env_kwargs)
    except (TypeError, ValueError) as error:
        reason = str(error).removeprefix(f"Bad settings for {cls.name}: ")
        raise EvalInputError(f"Bad --game-option for {cls.name}: {reason}") from error
    return GameEvaluation(cls.name, list(seeds), max_calls, env_kwargs, experience, spec, template_kwargs, source)


def _checked_seeds(options: dict[str, Any]) -> list[int]:
    """The maps of `--game-option num_seeds=N` (the first N held-out maps) or `seeds=[...]`."""
    if "num_seeds" in options and "seeds" in options:
        raise EvalInputError("Give either --game-option num_seeds=N or seeds=[...], not both.")
    num_seeds = options.get("num_seeds", DEFAULT_HELDOUT)
    if not is_int(num_seeds) or num_seeds < 1:
        raise EvalInputError(
            f"--game-option num_seeds must be a positive integer (how many held-out maps to play; OPCD uses 128), "
            f"got {shown(num_seeds)}."
        )
    if "seeds" not in options:
        return heldout_seeds(num_seeds)
    seeds = options["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(is_int(s) and s >= 0 for s in seeds):
        raise EvalInputError(
            "--game-option seeds must be a non-empty JSON list of non-negative integers, e.g. seeds=[3,7,11] "
            f"(or use num_seeds=N for the first N held-out maps), got {shown(seeds)}."
        )
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise EvalInputError(f"--game-option seeds lists {repeated} more than once; each map is played once.")
    return seeds


def _checked_game_settings(cls, options: dict[str, Any]) -> dict[str, Any]:
    """The game settings among the options (every key that is not a run option), each one the game takes."""
    env_kwargs = {k: v for k, v in options.items() if k not in RUN_OPTIONS}
    if "seed" in env_kwargs:
        raise EvalInputError("'seed' is not a game setting: choose the maps with seeds=[...] or num_seeds=N.")
    settings = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "seed", "max_calls")]
    unknown = sorted(set(env_kwargs) - set(settings))
    if unknown:
        raise EvalInputError(
            f"Unknown --game-option {', '.join(unknown)} for {cls.name}: its settings are {settings} and the run "
            f"options are {list(RUN_OPTIONS)}."
        )
    return env_kwargs


def _game_context(cls, options, context: ContextSpec | None, context_source: str | None):
    """The experience, its layout and its source: a given fixed context, else `experience_file`, else the shipped
    experience."""
    if context is not None:
        if context.text is None:
            raise EvalInputError("A game needs one fixed context: use --context-text or --context-file.")
        return context.text, context, context_source or "text"
    if "experience_file" in options:
        source = options["experience_file"]
        try:
            experience = Path(str(source)).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise EvalInputError(f"Cannot read the experience file {source!r}: {error}") from error
        if not experience.strip():
            raise EvalInputError(f"The experience file {source!r} is empty.")
        return experience, default_game_spec(), f"file:{source}"
    return load_experience(cls.name), default_game_spec(), f"shipped:{cls.name}"


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
    message). With `output_dir`, each map's record is appended to `<output_dir>/<name>/records.jsonl` as soon as both
    of its views end, a rerun resumes from that file (records of another model or other settings are refused), and
    the evaluation report (summary.json, report.md, figures) plus `game_summary.json` are written at the end. Returns
    the records and the game summary.
    """
    options = _game_options(num_seeds, seeds, max_calls, env_kwargs, chat_template_kwargs)
    task = check_game_options(game, options, _experience_context(game, experience, spec))
    settings = GenerationSettings(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        do_sample=do_sample,
        seed=seed,
        batch_size=batch_size,
    )
    records_path = None
    if output_dir is not None:
        records_path = Path(output_dir) / safe_name(name) / "records.jsonl"
    provenance = run_provenance(task, model, tokenizer, generation=settings)
    records = run_paired(task, model, tokenizer, generation=settings, output_path=records_path, provenance=provenance)
    summary = game_summary(records, n_bootstrap=n_bootstrap)
    if output_dir is not None:
        output_dir = Path(output_dir)
        run = ModelRun(name, records, provenance=provenance, records_path=str(records_path))
        write_report([run], output_dir, n_bootstrap=n_bootstrap)
        write_text_atomic(output_dir / "game_summary.json", json.dumps(summary, indent=2) + "\n")
    return records, summary


def _game_options(num_seeds, seeds, max_calls, env_kwargs, chat_template_kwargs) -> dict[str, Any]:
    """`evaluate_game`'s keywords as the `--game-option` values `check_game_options` reads."""
    options: dict[str, Any] = {"max_calls": max_calls, **dict(env_kwargs or {})}
    if seeds is not None:
        options["seeds"] = list(seeds)
    else:
        options["num_seeds"] = num_seeds
    if chat_template_kwargs is not None:
        options["chat_template_kwargs"] = chat_template_kwargs
    return options


def _experience_context(game: str, experience: str | None, spec: ContextSpec | None) -> ContextSpec | None:
    """The fixed context of an `evaluate_game` given an experience or a layout (None: `check_game_options` takes the
    shipped experience in OPCD's layout)."""
    if experience is None and spec is None:
        return None
    if experience is None:
        experience = load_experience(game_class(game).name)
    base = spec or default_game_spec()
    return ContextSpec(
        column=None, text=experience, placement=base.placement, template=base.template, separator=base.separator
    )


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
    """A game evaluation as `trl-nca eval --game NAME` runs it (see docs/evaluation.md); resumes from `output_path`.

    `context` (from --context-text/--context-file) replaces the game's experience and sets its placement; without it
    the shipped experience goes into the user message. `options` (--game-option) are checked by `check_game_options`:
    `num_seeds` (default 128), `seeds` (a list), `max_calls` (5), `experience_file`, `chat_template_kwargs`; any other
    key is a game setting (`size`, `num_holes`, `dim_room`, `num_boxes`). Each map's record is appended to
    `output_path` as soon as both of its views end, so a killed run loses at most the maps in play. Sampling follows
    `generation` as given: pass `--temperature 0.7 --top-p 0.8 --top-k 20` for OPCD's game settings.
    """
    task = check_game_options(game, options, context)
    return run_paired(
        task, model, tokenizer, generation=generation, output_path=output_path, progress=progress, desc=task.game
    )
