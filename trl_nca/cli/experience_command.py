"""`trl-nca experience`: extract a game experience text from a model's own played episodes
(`trl_nca.envs.experience.extract_experience`), every setting checked before the model is loaded."""

from __future__ import annotations

import argparse
import json

from ..console import Stopwatch, closing_line, say
from ..core.sampling import HFBackend, generate_fn
from ..envs import game_generation_settings
from ..envs.experience import check_options, extract_experience, load_experience, parse_items
from ..envs.registry import GAMES
from ..envs.rollout import GAME_MAX_NEW_TOKENS, GAME_TEMPERATURE, GAME_TOP_K, GAME_TOP_P
from ..eval import loading
from ..inputs import InputError, check_output_file, output_file_lock, write_text_atomic
from . import explain
from .help_format import CommandHelpFormatter, add_log_options
from .options import add_dtype_option, add_model_options


def build_parser() -> argparse.ArgumentParser:
    """Every `trl-nca experience` option."""
    parser = argparse.ArgumentParser(
        prog="trl-nca experience",
        description="Extract a game experience text from a model's own played trajectories.",
        formatter_class=CommandHelpFormatter,
    )
    add_model_options(parser, one=True)
    parser.add_argument("--adapter", help="Optional PEFT adapter folder (or PATH:ADAPTER in --model).")
    parser.add_argument("--tokenizer", help="Tokenizer (default: the model's).")
    parser.add_argument("--game", required=True, choices=sorted(GAMES), help="The game played.")
    parser.add_argument(
        "--output", required=True, help="Text file for the experience; a .json history goes next to it."
    )
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of play, lesson extraction and validation.")
    parser.add_argument("--episodes", type=int, default=8, help="Episodes played per round.")
    parser.add_argument("--validation-size", type=int, default=16, help="Validation maps scoring each lesson set.")
    parser.add_argument("--max-items", type=int, default=12, help="Most lessons the experience keeps.")
    parser.add_argument("--max-new-items", type=int, default=5, help="Most lessons one round adds.")
    parser.add_argument("--start-from-shipped", action="store_true", help="Start from the shipped experience's items.")
    parser.add_argument("--max-calls", type=int, default=5, help="Model calls per episode.")
    parser.add_argument("--game-option", action="append", default=[], metavar="KEY=VALUE", help="Game setting.")
    parser.add_argument("--temperature", type=float, default=GAME_TEMPERATURE, help="Sampling temperature.")
    parser.add_argument("--top-p", type=float, default=GAME_TOP_P, help="Nucleus sampling threshold.")
    parser.add_argument("--top-k", type=int, default=GAME_TOP_K, help="Top-k sampling (0 disables it).")
    parser.add_argument("--max-new-tokens", type=int, default=GAME_MAX_NEW_TOKENS, help="New tokens per model call.")
    parser.add_argument("--batch-size", type=int, default=16, help="Prompts per generate call.")
    parser.add_argument("--seed", type=int, default=0, help="Sampling seed of every model call.")
    add_dtype_option(parser, "auto")  # experience's default since its first version: another would change its games
    parser.add_argument("--device", help="e.g. cuda:0 or cpu (default: cuda if available).")
    add_log_options(parser)
    return parser


def _model_and_adapter(args) -> tuple[str, str | None]:
    """The weights and the adapter of `--model PATH[:ADAPTER]` and `--adapter` (one adapter, given either way)."""
    path, adapter = loading.split_adapter(args.model)
    if adapter is not None and args.adapter is not None:
        raise InputError(f"--model {args.model!r} names an adapter and --adapter gives another; give one.")
    if not path:
        raise InputError(f"--model {args.model!r} gives no PATH; write PATH or PATH:ADAPTER.")
    return path, adapter if adapter is not None else args.adapter


def experience(argv: list[str] | None = None) -> int:
    """`trl-nca experience`: extract a game experience text from a model's own games (`trl_nca.envs.experience`);
    writes the text and a JSON history of the rounds. Every setting is checked before the model is loaded."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for name in ("rounds", "episodes", "validation_size", "max_items", "max_new_items", "max_calls", "batch_size"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
        output = check_output_file(args.output, "--output")  # written after the rounds: checked before them
        history = output.with_suffix(".json")
        if history == output:
            raise InputError(
                f"--output {args.output!r} ends in .json, the name of the JSON history written next to the text, so "
                "one would overwrite the other. Give the text file another suffix, e.g. "
                f"{output.with_suffix('.txt')}."
            )
        check_output_file(history, "--output (its JSON history)")
        clock = Stopwatch()
        env_kwargs = check_options(args.game_option, args.game, args.max_calls)
        model_path, adapter = _model_and_adapter(args)
        loading.check_weights(loading.resolve_model_path(model_path), adapter, f"--model {args.model!r}")
        settings = game_generation_settings(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            seed=args.seed,
        )
    except ValueError as error:  # InputError (EvalInputError) included
        parser.error(str(error))
    explain.opening(explain.experience_opening(args, output))
    with output_file_lock(output, "trl-nca experience", "--output"):  # one writer of the text and its history
        try:
            model = loading.load_model(model_path, adapter, dtype=args.dtype, device=args.device)
            tokenizer = loading.load_tokenizer(args.tokenizer or model_path)
        except ValueError as error:
            parser.error(str(error))
        result = _extract(args, model, tokenizer, settings, env_kwargs)
        write_text_atomic(history, json.dumps(result.to_dict(), indent=2) + "\n")
        write_text_atomic(output, (result.text or "") + "\n")
    print(f"Validation win rate {result.score:.3f} with {len(result.items)} lessons; written to {output}.")
    say(closing_line("experience", clock.seconds, {"experience": output, "history": history}))
    return 0


def _extract(args, model, tokenizer, settings, env_kwargs):
    """The rounds of `trl-nca experience` (`trl_nca.envs.experience.extract_experience`) with the parsed options."""
    initial = parse_items(load_experience(args.game)) if args.start_from_shipped else []
    return extract_experience(
        generate_fn(HFBackend(model, tokenizer), settings),
        tokenizer,
        args.game,
        rounds=args.rounds,
        episodes_per_round=args.episodes,
        validation_size=args.validation_size,
        max_items=args.max_items,
        max_new_items=args.max_new_items,
        initial_items=initial,
        max_calls=args.max_calls,
        env_kwargs=env_kwargs,
        sampling_seed=args.seed,
    )
