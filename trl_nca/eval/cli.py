"""`trl-nca eval`: paired with/without-context evaluation of one or several models from the command line.

`add_eval_arguments(parser)` declares the options, `run_eval(args)` runs them (raising `EvalInputError` on bad input),
and `main(argv)` makes `python -m trl_nca.eval.cli ...` work on its own.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..envs import game_generation_settings
from ..envs.registry import parse_game_options
from ..inputs import BUILTIN_CONTEXTS, load_rows, read_context
from ..sampling import GenerationSettings, VLLMBackend, vllm_available
from ..views import ContextSpec
from . import loading
from .errors import EvalInputError
from .games import check_game_options
from .paired import PairedEvaluator
from .report import ModelRun, safe_name, write_report
from .runner import run_paired, run_provenance
from .scorers import SCORERS


EPILOG = """\
examples:
  # one model, MCQ items in a local JSONL file with a per-item `context` column
  trl-nca eval --model Qwen/Qwen2.5-0.5B-Instruct --dataset data/medmcqa_test.jsonl \\
      --label-column answer --scorer mcq --limit 500 --output-dir runs/eval-base

  # base model (its with-context view is the teacher), OPD and NCA students side by side, one system prompt file
  trl-nca eval --model base=Qwen/Qwen2.5-0.5B-Instruct \\
      --model opd=Qwen/Qwen2.5-0.5B-Instruct --adapter opd=runs/opd/checkpoint-50 \\
      --model nca=Qwen/Qwen2.5-0.5B-Instruct --adapter nca=runs/nca/checkpoint-50 \\
      --dataset ytz20/sys_safety_test --split train --prompt-column messages \\
      --context-file prompts/safety_system.txt --scorer yesno --output-dir runs/eval-safety

Rerunning with the same --output-dir resumes: items already in <output-dir>/<model>/records.jsonl are not regenerated.
Outputs: <model>/records.jsonl (per item), summary.json, report.md, accuracy.png, harm_help.png, lengths.png.
"""


@dataclass
class ModelSpec:
    """One model of a comparison or an analysis: display name, weights path or Hub id, optional adapter."""

    name: str
    path: str
    adapter: str | None = None


def json_object_arg(text: str) -> dict[str, Any]:
    """argparse type of the `--chat-template-kwargs` options: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error.msg}") from error
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Declare every `trl-nca eval` option on `parser` (and set its epilog with examples)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = parser.description or (
        "Evaluate models on each item twice, without and with the context (same seed and sampling), and report "
        "accuracy per view, harm, help, lengths, McNemar test and regime (A/B/C)."
    )
    parser.epilog = EPILOG

    models = parser.add_argument_group("models")
    models.add_argument(
        "--model", action="append", default=[], metavar="[NAME=]PATH",
        help="Model folder, Hub id, or 'embedded' (the built-in SmolLM2-135M-Instruct); repeat for several models. "
        "NAME= sets its name in the report (default: the last path component). Example: "
        "--model nca=Qwen/Qwen2.5-0.5B-Instruct.",
    )  # fmt: skip
    models.add_argument(
        "--adapter", action="append", default=[], metavar="[NAME=]PATH",
        help="PEFT adapter folder. With NAME= it goes to the model of that name; without names, give one --adapter "
        "per --model in the same order ('none' for a model without adapter).",
    )  # fmt: skip
    models.add_argument("--tokenizer", help="Tokenizer folder or Hub id (default: each model's own path).")
    models.add_argument(
        "--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"], help="Weights dtype."
    )
    models.add_argument("--device", help="Device for the HF backend, e.g. cuda:0 or cpu (default: cuda if available).")
    models.add_argument(
        "--backend", default="hf", choices=["hf", "vllm"], help="Generation backend; 'vllm' needs vllm installed."
    )
    models.add_argument("--trust-remote-code", action="store_true", help="Allow custom model code from the Hub.")

    data = parser.add_argument_group("dataset")
    data.add_argument(
        "--dataset", metavar="NAME_OR_FILE",
        help="Hub dataset name, a local .jsonl/.json/.parquet/.csv file, or a save_to_disk folder.",
    )  # fmt: skip
    data.add_argument("--dataset-config", help="Hub dataset configuration name.")
    data.add_argument("--split", default="test", help="Split of a Hub dataset (default: test).")
    data.add_argument(
        "--prompt-column", help="Column with the prompt (a string or chat messages); default: `prompt` or `messages`."
    )
    data.add_argument("--label-column", default="answer", help="Column with the gold label (default: answer).")
    data.add_argument("--id-column", help="Column with unique item ids (default: the row index).")
    data.add_argument("--limit", type=int, help="Evaluate only the first N items (OPCD QA uses 500).")

    context = parser.add_argument_group("context")
    source = context.add_mutually_exclusive_group()
    source.add_argument(
        "--context-column", default="context", help="Column with each item's context (default: context)."
    )
    source.add_argument("--context-text", help="One fixed context string for every item (e.g. a system prompt).")
    source.add_argument(
        "--context-file",
        help="A UTF-8 text file holding one fixed context for every item, or a built-in one: 'medical' or 'safety'.",
    )
    context.add_argument(
        "--placement", default="system", choices=["system", "user"],
        help="Put the context in the system message (default) or inside the first user message.",
    )  # fmt: skip
    context.add_argument(
        "--template", default="{context}\n\n{prompt}",
        help="With --placement user: how context and prompt are joined; must contain {context} and {prompt}.",
    )  # fmt: skip
    context.add_argument(
        "--separator", default="\n\n", help="With --placement system: joins the context and an existing system message."
    )
    context.add_argument(
        "--chat-template-kwargs", type=json_object_arg, default={}, metavar="JSON",
        help="Extra chat template variables, e.g. '{\"enable_thinking\": false}'.",
    )  # fmt: skip

    scoring = parser.add_argument_group("scoring")
    scoring.add_argument(
        "--scorer", default="mcq",
        help=f"One of {sorted(SCORERS)}, or 'package.module:function' taking (text, label) (default: mcq, the OPCD "
        "parser; the strict parser is reported next to it). A custom scorer imports that module and runs its code, "
        "with your permissions: use only code you trust.",
    )  # fmt: skip
    scoring.add_argument(
        "--companion-scorer", action="append", metavar="SCORER",
        help="Also score with this scorer and report it (repeatable; default: mcq_strict next to mcq and vice versa).",
    )  # fmt: skip
    scoring.add_argument("--no-companion-scorers", action="store_true", help="Report the main scorer only.")

    generation = parser.add_argument_group("generation (shared by both views)")
    defaults = GenerationSettings()
    game_note = "; with --game the OPCD game default {}"
    generation.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"Default: {defaults.max_new_tokens}" + game_note.format(1024) + ".",
    )
    generation.add_argument(
        "--temperature", type=float, default=None, help=f"Default: {defaults.temperature}" + game_note.format(0.7) + "."
    )
    generation.add_argument(
        "--top-p", type=float, default=None, help=f"Default: {defaults.top_p}" + game_note.format(0.8) + "."
    )
    generation.add_argument(
        "--top-k", type=int, default=None, help=f"Default: {defaults.top_k} (0 disables top-k)" + game_note.format(20)
    )  # fmt: skip
    generation.add_argument("--greedy", action="store_true", help="Greedy decoding instead of sampling.")
    generation.add_argument(
        "--seed", type=int, default=defaults.seed, help="Run seed; each item's seed derives from it and its id."
    )
    generation.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="Prompts per generate call (default: %(default)s)."
    )
    generation.add_argument(
        "--samples-per-view", type=int, default=1, metavar="K",
        help="Answer each item K times without and K times with the context (sample j of both views shares its "
        "seed); rates become per-item success rates and harm the expected harm (docs/evaluation.md). Default: 1.",
    )  # fmt: skip

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", required=False, help="Folder for records, summary, report and figures.")
    output.add_argument("--title", help="Title of the Markdown report.")
    output.add_argument("--alpha", type=float, default=0.05, help="Significance level of the regime rule.")
    output.add_argument("--bootstrap", type=int, default=1000, help="Bootstrap resamples for intervals (0: none).")
    output.add_argument("--bootstrap-seed", type=int, default=0, help="Seed of the bootstrap resampling.")
    output.add_argument("--no-plots", action="store_true", help="Skip the PNG figures.")
    output.add_argument("--no-progress", action="store_true", help="Hide the progress bar.")

    games = parser.add_argument_group("games")
    games.add_argument(
        "--game", help="Evaluate on a text game (sokoban or frozenlake, trl_nca.eval.games) instead of --dataset."
    )
    games.add_argument(
        "--game-option", action="append", default=[], metavar="KEY=VALUE",
        help="Option passed to the game evaluator (repeatable; VALUE parsed as JSON when possible).",
    )  # fmt: skip
    return parser


_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def _split_named(spec: str) -> tuple[str | None, str]:
    name, sep, rest = spec.partition("=")
    if sep and _NAME.match(name) and rest:
        return name, rest
    return None, spec


def _default_name(path: str) -> str:
    return Path(path.rstrip("/\\")).name or path


def parse_model_specs(models: Sequence[str], adapters: Sequence[str]) -> list[ModelSpec]:
    """Pair `--model` and `--adapter` values into named model specs (see `--help`)."""
    if not models:
        raise EvalInputError("Give at least one --model.")
    specs: list[ModelSpec] = []
    for value in models:
        name, path = _split_named(value)
        specs.append(ModelSpec(name or _default_name(path), path))
    names = [s.name for s in specs]
    for i, spec in enumerate(specs):
        if names.count(spec.name) > 1:
            spec.name = f"{spec.name}-{names[: i + 1].count(spec.name)}"
    if len({s.name for s in specs}) != len(specs):
        raise EvalInputError(f"Model names must be unique, got {[s.name for s in specs]}; name them with NAME=PATH.")
    parsed = [_split_named(a) for a in adapters]
    named = [p for p in parsed if p[0] is not None]
    if named and len(named) != len(parsed):
        raise EvalInputError("Either name every --adapter (NAME=PATH) or none of them.")
    if named:
        by_name = {s.name: s for s in specs}
        for name, path in named:
            if name not in by_name:
                raise EvalInputError(f"--adapter {name}=... names no model; the models are {sorted(by_name)}.")
            by_name[name].adapter = path
    elif parsed:
        if len(parsed) != len(specs):
            raise EvalInputError(
                f"{len(parsed)} unnamed --adapter values for {len(specs)} models: give one per model ('none' for no "
                "adapter) or name them NAME=PATH."
            )
        for spec, (_, path) in zip(specs, parsed):
            spec.adapter = None if path.lower() in ("none", "-") else path
    return specs


def _resolve_model(name: str, what: str) -> str:
    """`trl_nca.models.resolve_model_name_or_path`, the resolver of every command ('embedded' included)."""
    from ..models import EmbeddedModelUnavailableError, ModelNotFoundError, resolve_model_name_or_path

    try:
        return resolve_model_name_or_path(name, what)
    except (ModelNotFoundError, EmbeddedModelUnavailableError) as error:
        raise EvalInputError(str(error)) from error


def _check_local(path: str, what: str) -> None:
    """Fail early on a local adapter path that does not exist (Hub ids pass)."""
    if path.startswith(("/", "./", "../", "~")) and not Path(path).expanduser().exists():
        raise EvalInputError(f"{what} {path!r} not found: no such folder.")


def _context_spec(args) -> tuple[ContextSpec, str | None]:
    """The context settings from the command line, and a description of their source for the provenance."""
    layout = {"placement": args.placement, "template": args.template, "separator": args.separator}
    try:
        if args.context_file:
            # the built-in contexts of `trl-nca train` ('medical', 'safety') work here too
            source = f"builtin:{args.context_file}" if args.context_file in BUILTIN_CONTEXTS else None
            text = read_context(args.context_file)
            return ContextSpec(column=None, text=text, **layout), source or f"file:{Path(args.context_file)}"
        if args.context_text is not None:
            return ContextSpec(column=None, text=args.context_text, **layout), None
        return ContextSpec(column=args.context_column, **layout), None
    except EvalInputError:
        raise
    except (ValueError, TypeError) as error:
        raise EvalInputError(str(error)) from error


def _settings(args) -> GenerationSettings:
    """Sampling settings: the options given, else the OPCD game defaults with --game, else the QA defaults."""
    if args.game:
        defaults = game_generation_settings()
    else:
        defaults = GenerationSettings()

    def pick(name):
        value = getattr(args, name)
        return getattr(defaults, name) if value is None else value

    try:
        return GenerationSettings(
            max_new_tokens=pick("max_new_tokens"),
            temperature=pick("temperature"),
            top_p=pick("top_p"),
            top_k=pick("top_k"),
            do_sample=not args.greedy,
            seed=args.seed,
            batch_size=args.batch_size,
        )
    except ValueError as error:
        raise EvalInputError(str(error)) from error


def _game_options(values: Sequence[str]) -> dict[str, Any]:
    try:
        return parse_game_options(values)
    except ValueError as error:
        raise EvalInputError(str(error)) from error


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Run `trl-nca eval` with parsed arguments and return the report summary; bad input raises `EvalInputError`.

    Every setting, the dataset (or the game options) and the context are checked before any model is loaded; then each
    model is evaluated by the one runner (`trl_nca.eval.runner.run_paired`), on dataset items or on game maps.
    """
    if not args.output_dir:
        raise EvalInputError("Give --output-dir, the folder for records, summary, report and figures.")
    specs = parse_model_specs(args.model, args.adapter)
    for spec in specs:
        spec.path = _resolve_model(spec.path, f"Model {spec.name!r}:")
        if spec.adapter:
            _check_local(spec.adapter, "Adapter")
    if args.tokenizer:
        args.tokenizer = _resolve_model(args.tokenizer, "--tokenizer")
    settings = _settings(args)
    if args.samples_per_view < 1:
        raise EvalInputError(f"--samples-per-view must be at least 1, got {args.samples_per_view}.")
    if args.game and args.samples_per_view != 1:
        raise EvalInputError("--samples-per-view applies to dataset items; a game map is played once per view.")
    if args.backend == "vllm" and not vllm_available():
        raise EvalInputError("--backend vllm needs vllm installed (`pip install vllm`); use --backend hf.")
    output_dir = Path(args.output_dir)

    context, source = (None, None)
    if args.game:
        ignored = {
            "--dataset": args.dataset, "--limit": args.limit, "--prompt-column": args.prompt_column,
            "--id-column": args.id_column, "--dataset-config": args.dataset_config,
            "--label-column": None if args.label_column == "answer" else args.label_column,
            "--scorer": None if args.scorer == "mcq" else args.scorer,
        }  # fmt: skip
        given = [option for option, value in ignored.items() if value is not None]
        if given:
            raise EvalInputError(
                f"{', '.join(given)} do(es) not apply to --game (a game is scored by winning; choose the maps with "
                "--game-option num_seeds=N or seeds=[...]). Drop them, or evaluate a dataset without --game."
            )
        if args.context_text is not None or args.context_file:
            context, source = _context_spec(args)
        task = check_game_options(args.game, _game_options(args.game_option), context, source)
    else:
        if not args.dataset:
            raise EvalInputError("Give --dataset (a Hub name or a local file), or --game.")
        if args.game_option:
            raise EvalInputError("--game-option only applies with --game; drop it, or add --game NAME.")
        context, source = _context_spec(args)
        dataset = load_rows(args.dataset, split=args.split, config=args.dataset_config)
        companions = [] if args.no_companion_scorers else args.companion_scorer
        try:
            task = PairedEvaluator(
                dataset,
                context=context,
                scorer=args.scorer,
                label_column=args.label_column,
                id_column=args.id_column,
                generation=settings,
                companion_scorers=companions,
                prompt_column=args.prompt_column,
                limit=args.limit,
                chat_template_kwargs=args.chat_template_kwargs,
                context_source=source,
                samples_per_view=args.samples_per_view,
            )
        except EvalInputError:
            raise
        except ValueError as error:  # e.g. an unknown scorer name
            raise EvalInputError(str(error)) from error

    runs = []
    for spec in specs:
        records_path = output_dir / safe_name(spec.name) / "records.jsonl"
        progress = not args.no_progress
        if args.backend == "vllm":
            tokenizer = loading.load_tokenizer(args.tokenizer or spec.path, trust_remote_code=args.trust_remote_code)
            backend = VLLMBackend(spec.path, tokenizer, adapter=spec.adapter, dtype=args.dtype)
            model = backend.llm
        else:
            backend = None
            model = loading.load_model(
                spec.path, spec.adapter, dtype=args.dtype, device=args.device, trust_remote_code=args.trust_remote_code
            )
            tokenizer = loading.load_tokenizer(args.tokenizer or spec.path, trust_remote_code=args.trust_remote_code)
        provenance = run_provenance(
            task, model, tokenizer, generation=settings, model_path=spec.path, adapter=spec.adapter
        )  # fmt: skip
        provenance["backend"] = args.backend
        records = run_paired(
            task, model, tokenizer, generation=settings, output_path=records_path, backend=backend,
            provenance=provenance, progress=progress, desc=spec.name,
        )  # fmt: skip
        runs.append(ModelRun(spec.name, records, provenance=provenance, records_path=str(records_path)))
        del model, backend
        gc.collect()
        _empty_cuda_cache()

    return write_report(
        runs,
        output_dir,
        alpha=args.alpha,
        n_bootstrap=args.bootstrap,
        bootstrap_seed=args.bootstrap_seed,
        plots=not args.no_plots,
        title=args.title,
        extra={"command": {k: v for k, v in vars(args).items() if not callable(v)}},
    )


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_parser(prog: str = "trl-nca eval") -> argparse.ArgumentParser:
    """A stand-alone parser with every `trl-nca eval` option."""
    return add_eval_arguments(argparse.ArgumentParser(prog=prog))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m trl_nca.eval.cli`: exit status 0 on success, 2 with a one-line error on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        summary = run_eval(args)
    except EvalInputError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    print(f"Wrote {summary['files']['markdown']} and {summary['files']['summary']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
