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
import inspect
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..eval.metrics import compute_metrics
from ..eval.records import PairedRecord, ViewOutcome
from ..sampling import GenerateFn, GenerationSettings, HFBackend, check_generated, generate_fn
from ..views import ContextSpec, add_context, render_prompt_ids
from .base import MAX_STEPS, GameEnv
from .experience import load_experience
from .prompts import build_step_messages, format_action, parse_action
from .registry import game_class, make_env
from .rollout import GAME_MAX_NEW_TOKENS, GAME_TEMPERATURE, GAME_TOP_K, GAME_TOP_P, call_seed, default_game_spec
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
        records[seed] = PairedRecord(item_id=f"{game}-{seed}", x=ox, xc=oxc, meta=meta)
        if on_record is not None:
            on_record(records[seed])

    play_pairs(
        generate, tokenizer, game, seeds, experience, spec=spec, max_calls=max_calls, env_kwargs=env_kwargs,
        sampling_seed=sampling_seed, max_prompts=batch_size, on_pair=pair, chat_template_kwargs=chat_template_kwargs,
    )  # fmt: skip
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


def _tokenizer_sha256(tokenizer) -> str:
    """A hash of what shapes the prompts' tokens: the vocabulary and the chat template."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]) if hasattr(tokenizer, "get_vocab") else []
    payload = json.dumps([vocab, getattr(tokenizer, "chat_template", None)], default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _run_key(
    game: str, experience: str, spec: ContextSpec, settings: GenerationSettings, model=None, tokenizer=None, **config
) -> str:
    """What must not change between a run and its resumption: game and settings, experience and its placement,
    sampling (not the batch size, which does not change samples), chat template options, the model's weights and the
    tokenizer. The seed list may grow or shrink: seeds are the item ids."""
    from ..eval.provenance import weights_fingerprint

    generation = {k: v for k, v in settings.to_dict().items() if k != "batch_size"}
    payload = {
        "game": game,
        "experience_sha256": hashlib.sha256(experience.encode("utf-8")).hexdigest(),
        "spec": [spec.placement, spec.template, spec.separator],
        "generation": generation,
        "model": None if model is None else [weights_fingerprint(model), str(getattr(model, "dtype", None))],
        "tokenizer": None if tokenizer is None else _tokenizer_sha256(tokenizer),
        **config,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class GameEvalPlan:
    """A validated game evaluation: which maps, which settings, which experience and where it goes."""

    game: str
    seeds: list[int]
    max_calls: int
    env_kwargs: dict[str, Any]
    experience: str
    spec: ContextSpec
    chat_template_kwargs: dict[str, Any] | None = None


RUN_OPTIONS = ("num_seeds", "seeds", "max_calls", "experience_file", "chat_template_kwargs")


def _shown(value: Any) -> str:
    return f"the {type(value).__name__} {value!r}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_game_options(game: str, options: dict[str, Any] | None, context: ContextSpec | None = None) -> GameEvalPlan:
    """Validate `--game-option` values (and an optional context) into a `GameEvalPlan`, before any model work.

    Run options: `num_seeds` (a positive integer, default 128 held-out maps), `seeds` (a non-empty list of distinct
    non-negative integers, instead of `num_seeds`), `max_calls` (positive integer, default 5), `experience_file` (a
    UTF-8 text file replacing the shipped experience), `chat_template_kwargs` (an object). Any other key is a game
    setting (`size`, `num_holes`, `dim_room`, `num_boxes`), checked by building the first map. Raises `EvalInputError`
    naming the option and the fix.
    """
    from ..eval.errors import EvalInputError

    try:
        cls = game_class(game)
    except ValueError as error:
        raise EvalInputError(str(error)) from error
    options = dict(options or {})
    if "num_seeds" in options and "seeds" in options:
        raise EvalInputError("Give either --game-option num_seeds=N or seeds=[...], not both.")
    num_seeds = options.get("num_seeds", DEFAULT_HELDOUT)
    if not _is_int(num_seeds) or num_seeds < 1:
        raise EvalInputError(
            f"--game-option num_seeds must be a positive integer (how many held-out maps to play; OPCD uses 128), "
            f"got {_shown(num_seeds)}."
        )
    if "seeds" in options:
        seeds = options["seeds"]
        if not isinstance(seeds, list) or not seeds or not all(_is_int(s) and s >= 0 for s in seeds):
            raise EvalInputError(
                "--game-option seeds must be a non-empty JSON list of non-negative integers, e.g. seeds=[3,7,11] "
                f"(or use num_seeds=N for the first N held-out maps), got {_shown(seeds)}."
            )
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        if repeated:
            raise EvalInputError(f"--game-option seeds lists {repeated} more than once; each map is played once.")
    else:
        seeds = heldout_seeds(num_seeds)
    max_calls = options.get("max_calls", 5)
    if not _is_int(max_calls) or max_calls < 1:
        raise EvalInputError(
            f"--game-option max_calls must be a positive integer (model calls per episode; OPCD uses 5), got "
            f"{_shown(max_calls)}."
        )
    template_kwargs = options.get("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise EvalInputError(
            "--game-option chat_template_kwargs must be a JSON object, e.g. chat_template_kwargs="
            f'{{"enable_thinking":false}}, got {_shown(template_kwargs)}.'
        )
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
    if context is not None:
        if context.text is None:
            raise EvalInputError("A game needs one fixed context: use --context-text or --context-file.")
        experience, spec = context.text, context
    elif "experience_file" in options:
        source = options["experience_file"]
        try:
            experience = Path(str(source)).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise EvalInputError(f"Cannot read the experience file {source!r}: {error}") from error
        if not experience.strip():
            raise EvalInputError(f"The experience file {source!r} is empty.")
        spec = default_game_spec()
    else:
        experience, spec = load_experience(cls.name), default_game_spec()
    try:
        make_env(cls.name, seeds[0], max_calls=max_calls, **env_kwargs)
    except (TypeError, ValueError) as error:
        reason = str(error).removeprefix(f"Bad settings for {cls.name}: ")
        raise EvalInputError(f"Bad --game-option for {cls.name}: {reason}") from error
    return GameEvalPlan(cls.name, list(seeds), max_calls, env_kwargs, experience, spec, template_kwargs)


def _play_plan(
    plan: GameEvalPlan, model, tokenizer, generation: GenerationSettings, output_path: str | Path | None, progress: bool
) -> list[PairedRecord]:
    """Play the maps of a plan not yet in `output_path`, appending each record as its map finishes; resumable."""
    from ..eval.store import append_records, load_records

    run_key = _run_key(
        plan.game, plan.experience, plan.spec, generation, model=model, tokenizer=tokenizer,
        env_kwargs=plan.env_kwargs, max_calls=plan.max_calls, chat_template_kwargs=plan.chat_template_kwargs,
    )  # fmt: skip
    done = load_records(output_path, expected_run_key=run_key) if output_path is not None else {}
    todo = [s for s in plan.seeds if f"{plan.game}-{s}" not in done]
    if progress:
        logger.info(
            "%s: %d of %d maps to play (%d already in %s).", plan.game, len(todo), len(plan.seeds),
            len(plan.seeds) - len(todo), output_path,
        )  # fmt: skip
    if todo:

        def keep(record: PairedRecord) -> None:
            if output_path is not None:
                append_records(output_path, [record])
            done[record.item_id] = record

        paired_game_records(
            generate_fn(HFBackend(model, tokenizer), generation), tokenizer, plan.game, todo,
            plan.experience, spec=plan.spec, max_calls=plan.max_calls, env_kwargs=plan.env_kwargs,
            sampling_seed=generation.seed, run_key=run_key, batch_size=generation.batch_size, on_record=keep,
            chat_template_kwargs=plan.chat_template_kwargs,
        )  # fmt: skip
    return [done[f"{plan.game}-{s}"] for s in plan.seeds]


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
    options: dict[str, Any] = {"max_calls": max_calls, **dict(env_kwargs or {})}
    if seeds is not None:
        options["seeds"] = list(seeds)
    else:
        options["num_seeds"] = num_seeds
    if chat_template_kwargs is not None:
        options["chat_template_kwargs"] = chat_template_kwargs
    context = None
    if experience is not None or spec is not None:
        if experience is None:
            experience = load_experience(game_class(game).name)
        base = spec or default_game_spec()
        context = ContextSpec(column=None, text=experience, placement=base.placement, template=base.template,
                              separator=base.separator)  # fmt: skip
    plan = check_game_options(game, options, context)
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
        from ..eval.report import safe_name

        records_path = Path(output_dir) / safe_name(name) / "records.jsonl"
    records = _play_plan(plan, model, tokenizer, settings, records_path, progress=False)
    summary = game_summary(records, n_bootstrap=n_bootstrap)
    if output_dir is not None:
        from ..eval.report import ModelRun, write_report

        output_dir = Path(output_dir)
        provenance = {
            "game": plan.game,
            "game_options": {"env_kwargs": plan.env_kwargs, "max_calls": plan.max_calls, "num_seeds": len(plan.seeds)},
            "context": {"sha256": hashlib.sha256(plan.experience.encode("utf-8")).hexdigest()},
            "generation": settings.to_dict(),
        }
        run = ModelRun(name, records, provenance=provenance, records_path=str(records_path))
        write_report([run], output_dir, n_bootstrap=n_bootstrap)
        (output_dir / "game_summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return records, summary


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
    the shipped experience goes into the user message. `options` (--game-option) are checked by `check_game_options`:
    `num_seeds` (default 128), `seeds` (a list), `max_calls` (5), `experience_file`, `chat_template_kwargs`; any other
    key is a game setting (`size`, `num_holes`, `dim_room`, `num_boxes`). Each map's record is appended to
    `output_path` as soon as both of its views end, so a killed run loses at most the maps in play. Sampling follows
    `generation` as given: pass `--temperature 0.7 --top-p 0.8 --top-k 20` for OPCD's game settings.
    """
    plan = check_game_options(game, options, context)
    return _play_plan(plan, model, tokenizer, generation, output_path, progress)
