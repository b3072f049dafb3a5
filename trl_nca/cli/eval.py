"""`trl-nca eval`: paired with/without-context evaluation of one or several models from the command line.

`add_eval_arguments(parser)` declares the options, `run_eval(args)` runs them (raising `EvalInputError` on bad input),
and `main(argv)` makes `python -m trl_nca.cli.eval ...` work on its own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ..console import Stopwatch, closing_line, say, take_output_flags
from ..core.sampling import GenerationSettings, VLLMBackend
from ..core.views import check_text_sizes
from ..envs import game_generation_settings
from ..envs.registry import parse_game_options
from ..eval import loading
from ..eval.errors import EvalInputError
from ..eval.games import check_game_options
from ..eval.loading import ModelSpec
from ..eval.paired import PairedEvaluator
from ..eval.report import ModelRun, safe_name
from ..eval.runner import PairedTask, run_paired, run_provenance
from ..eval.scorers import SCORERS
from ..inputs import LOCAL_FORMATS, load_rows, output_folder_lock
from . import explain
from .eval_shared import check_run_options, parse_model_specs, print_result_table, write_eval_report
from .eval_tasks import run_harness_eval
from .help_format import CommandHelpFormatter, add_log_options
from .options import CONTEXT_DEFAULTS, add_context_options, add_dtype_option, add_model_options


__all__ = ["add_eval_arguments", "build_parser", "main", "parse_model_specs", "run_eval"]


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

  # an lm-evaluation-harness task with and without a system prompt, paired per document (docs/harness.md); --limit 16
  # is a first look at the first 16 documents (drop it for the whole task)
  trl-nca eval --model Qwen/Qwen2.5-0.5B-Instruct --tasks arc_easy --context-file prompts/safety_system.txt \\
      --limit 16 --output-dir runs/eval-arc

Rerunning with the same --output-dir resumes: items already in <output-dir>/<model>/records.jsonl are not regenerated.
Outputs: <model>/records.jsonl (per item; <model>/<task>/records.jsonl with --tasks), summary.json, report.md,
accuracy.png, harm_help.png, lengths.png; the main table is printed at the end.
"""


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Declare every `trl-nca eval` option on `parser` (and set its epilog with examples)."""
    parser.formatter_class = CommandHelpFormatter
    parser.description = parser.description or (
        "Evaluate models on each item twice, without and with the context (same seed and sampling), and report "
        "accuracy per view, harm, help, lengths, McNemar test and regime (A/B/C)."
    )
    parser.epilog = EPILOG
    for add_group in (
        _add_model_arguments,
        _add_dataset_arguments,
        _add_harness_arguments,
        _add_context_arguments,
        _add_scoring_arguments,
        _add_generation_arguments,
        _add_output_arguments,
        _add_game_arguments,
        add_log_options,
    ):
        add_group(parser)
    return parser


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models")
    add_model_options(models, " Example: --model nca=Qwen/Qwen2.5-0.5B-Instruct.")
    models.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="PEFT adapter folder, the other way to give one. With NAME= it goes to the model of that name; without "
        "names, give one --adapter per --model in the same order ('none' for a model without adapter).",
    )
    models.add_argument("--tokenizer", help="Tokenizer folder or Hub id (default: each model's own path).")
    add_dtype_option(models, "auto")  # eval's default since its first version: a changed default would change numbers
    models.add_argument("--device", help="Device for the HF backend, e.g. cuda:0 or cpu (default: cuda if available).")
    models.add_argument(
        "--backend", default="hf", choices=["hf", "vllm"], help="Generation backend; 'vllm' needs vllm installed."
    )
    models.add_argument("--trust-remote-code", action="store_true", help="Allow custom model code from the Hub.")


def _add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("dataset")
    data.add_argument(
        "--dataset",
        metavar="NAME_OR_FILE",
        help="Hub dataset name, a local .jsonl/.json/.parquet/.csv file, or a save_to_disk folder.",
    )
    data.add_argument("--dataset-config", help="Hub dataset configuration name.")
    data.add_argument("--split", default="test", help="Split of a Hub dataset (default: test).")
    data.add_argument(
        "--prompt-column", help="Column with the prompt (a string or chat messages); default: `prompt` or `messages`."
    )
    data.add_argument("--label-column", default="answer", help="Column with the gold label (default: answer).")
    data.add_argument("--id-column", help="Column with unique item ids (default: the row index).")
    data.add_argument("--limit", type=int, help="Evaluate only the first N items (OPCD QA uses 500).")


def _add_harness_arguments(parser: argparse.ArgumentParser) -> None:
    harness = parser.add_argument_group(
        'lm-evaluation-harness tasks (instead of --dataset; needs `pip install "trl-nca[harness]"`, docs/harness.md)'
    )
    harness.add_argument(
        "--tasks",
        metavar="NAME[,NAME...]",
        help="lm-eval tasks, groups or tags, each run without and with the context and paired per document.",
    )
    harness.add_argument(
        "--include-path",
        "--include_path",
        dest="include_path",
        metavar="DIR",
        help="A folder of local task YAMLs (lm-eval's --include_path).",
    )
    harness.add_argument(
        "--num-fewshot",
        "--num_fewshot",
        dest="num_fewshot",
        type=int,
        metavar="N",
        help="Few-shot examples per prompt (lm-eval's --num_fewshot; default: each task's own).",
    )
    harness.add_argument(
        "--skip-empty-context",
        action="store_true",
        help="Leave out the documents whose --context-column field is empty (their two views would be one prompt); "
        "they are counted in the opening line and the report. Without it such a document is refused.",
    )
    harness.add_argument(
        "--metric",
        metavar="NAME[,FILTER]",
        help="The task's 0/1 metric that decides a correct answer (default: the first of its metric_list).",
    )


def _add_context_arguments(parser: argparse.ArgumentParser) -> None:
    # eval stores ContextSpec's defaults in its options (its checks compare --template and --separator with them)
    add_context_options(parser, defaults=CONTEXT_DEFAULTS)


def _add_scoring_arguments(parser: argparse.ArgumentParser) -> None:
    scoring = parser.add_argument_group("scoring")
    scoring.add_argument(
        "--scorer",
        default="mcq",
        help=f"One of {sorted(SCORERS)}, or 'package.module:function' taking (text, label) (default: mcq, the OPCD "
        "parser; the strict parser is reported next to it). A custom scorer imports that module and runs its code, "
        "with your permissions: use only code you trust.",
    )
    scoring.add_argument(
        "--companion-scorer",
        action="append",
        metavar="SCORER",
        help="Also score with this scorer and report it (repeatable; default: mcq_strict next to mcq and vice versa).",
    )
    scoring.add_argument("--no-companion-scorers", action="store_true", help="Report the main scorer only.")


def _add_generation_arguments(parser: argparse.ArgumentParser) -> None:
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
    )
    generation.add_argument("--greedy", action="store_true", help="Greedy decoding instead of sampling.")
    generation.add_argument(
        "--seed", type=int, default=defaults.seed, help="Run seed; each item's seed derives from it and its id."
    )
    generation.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="Prompts per generate call (default: %(default)s)."
    )
    generation.add_argument(
        "--samples-per-view",
        type=int,
        default=1,
        metavar="K",
        help="Answer each item K times without and K times with the context (sample j of both views shares its "
        "seed); rates become per-item success rates and harm the expected harm (docs/evaluation.md). Default: 1.",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", required=False, help="Folder for records, summary, report and figures.")
    output.add_argument("--title", help="Title of the Markdown report.")
    output.add_argument("--alpha", type=float, default=0.05, help="Significance level of the regime rule.")
    output.add_argument("--bootstrap", type=int, default=1000, help="Bootstrap resamples for intervals (0: none).")
    output.add_argument("--bootstrap-seed", type=int, default=0, help="Seed of the bootstrap resampling.")
    output.add_argument("--no-plots", action="store_true", help="Skip the PNG figures.")
    output.add_argument("--no-progress", action="store_true", help="Hide the progress bar.")


def _add_game_arguments(parser: argparse.ArgumentParser) -> None:
    games = parser.add_argument_group("games")
    games.add_argument(
        "--game", help="Evaluate on a text game (sokoban or frozenlake, trl_nca.eval.games) instead of --dataset."
    )
    games.add_argument(
        "--game-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Option passed to the game evaluator (repeatable; VALUE parsed as JSON when possible).",
    )


@dataclass
class EvalPlan:
    """A checked `trl-nca eval` run: the models (paths resolved), the sampling settings and the task."""

    specs: list[ModelSpec]
    settings: GenerationSettings
    task: PairedTask
    output_dir: Path


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Run `trl-nca eval` with parsed arguments and return the report summary; bad input raises `EvalInputError`.

    Every setting, the dataset (or the game options) and the context are checked before any model is loaded; then each
    model is evaluated by the one runner (`trl_nca.eval.runner.run_paired`), on dataset items or on game maps.
    """
    if args.tasks:
        return run_harness_eval(args)
    plan = plan_eval(args)
    with output_folder_lock(plan.output_dir, "trl-nca eval", "--output-dir"):  # one writer; a folder we can write
        check_position_limits(plan, args)
        explain.opening(explain.eval_opening(plan))
        runs = [evaluate_model(spec, plan, args) for spec in plan.specs]
        return write_eval_report(runs, plan.output_dir, args)


def check_position_limits(plan: EvalPlan, args) -> None:
    """Every item's prompt in both views, plus `max_new_tokens`, must fit each model's position limit
    (`max_position_embeddings`, read from its config without loading the weights), as `trl-nca train` requires, and
    its token ids the model's embedding rows; the tokenizer must have a chat template. Checked before any model is
    loaded. Game tasks build their prompts while playing and are not checked here."""
    if not isinstance(plan.task, PairedEvaluator):
        return
    from transformers import AutoConfig

    budget = plan.settings.max_new_tokens
    for spec in plan.specs:
        try:
            config = AutoConfig.from_pretrained(spec.path, trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError):
            continue  # loading the model reports it, with its own message
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        limit = getattr(config, "max_position_embeddings", None)
        rows = getattr(config, "vocab_size", None)
        tokenizer_path = args.tokenizer or spec.path
        tokenizer = loading.load_tokenizer(tokenizer_path, trust_remote_code=args.trust_remote_code)
        if getattr(tokenizer, "chat_template", None) is None:
            raise EvalInputError(
                f"The tokenizer of {spec.name} ({tokenizer_path}) has no chat template, so the prompts with and without "
                "the context cannot be rendered as chats. Evaluate an instruct model, or give --tokenizer one that has "
                "a chat template (e.g. the instruct version's)."
            )
        if limit:  # a prompt far past the limit is refused without tokenising it (20 MB take minutes)
            _check_text_sizes(plan.task, tokenizer, limit, budget, spec)
        for item in plan.task.items(tokenizer, cache=False):  # the evaluation loads its own tokenizer
            for view, ids in (("without", item.prompt_ids_x), ("with", item.prompt_ids_xc)):
                if rows and ids and max(ids) >= rows:
                    raise EvalInputError(
                        f"Item {item.item_id!r}: its prompt {view} the context holds token id {max(ids)}, but the "
                        f"model {spec.name} ({spec.path}) has {rows} embedding rows (vocab_size): the tokenizer "
                        f"({len(tokenizer)} tokens) is not the model's. Give the model's own tokenizer (--tokenizer)."
                    )
                if limit and len(ids) + budget > limit:
                    raise EvalInputError(
                        f"Item {item.item_id!r}: its prompt {view} the context has {len(ids)} tokens, which with "
                        f"--max-new-tokens {budget} exceeds the {limit} positions of the model {spec.name} "
                        f"({spec.path}, max_position_embeddings). Lower --max-new-tokens, shorten the prompt or the "
                        "context, or leave such items out of the dataset; prompts are never truncated."
                    )


def _check_text_sizes(task: PairedEvaluator, tokenizer, limit: int, budget: int, spec: ModelSpec) -> None:
    """An item whose text alone proves its prompt too long is refused before it is tokenised (`check_text_sizes`)."""
    sizes = [(f"Item {item_id!r}", *views) for item_id, *views in task.text_sizes()]
    where = f"the {limit} positions of the model {spec.name} ({spec.path}, max_position_embeddings)"
    check_text_sizes(sizes, tokenizer, limit, budget, "--max-new-tokens", where, error=EvalInputError)


def plan_eval(args: argparse.Namespace) -> EvalPlan:
    """Every check of `trl-nca eval`, in the order the options are read; loads no model."""
    if not args.output_dir:
        raise EvalInputError("Give --output-dir, the folder for records, summary, report and figures.")
    if args.skip_empty_context:
        raise EvalInputError(
            "--skip-empty-context applies to harness tasks (--tasks); drop it, and drop the rows with an empty context "
            "from the dataset."
        )
    specs = loading.resolve_model_specs(parse_model_specs(args.model, args.adapter))
    if args.tokenizer:
        args.tokenizer = loading.resolve_model_path(args.tokenizer, "--tokenizer")
    settings = _generation_settings(args)
    check_run_options(args)
    task = _game_task(args) if args.game else _dataset_task(args, settings)
    return EvalPlan(specs, settings, task, Path(args.output_dir))


def _generation_settings(args) -> GenerationSettings:
    """Sampling settings: the options given, else the OPCD game defaults with --game, else the QA defaults."""
    defaults = game_generation_settings() if args.game else GenerationSettings()

    def given_or_default(name):
        value = getattr(args, name)
        return getattr(defaults, name) if value is None else value

    try:
        return GenerationSettings(
            max_new_tokens=given_or_default("max_new_tokens"),
            temperature=given_or_default("temperature"),
            top_p=given_or_default("top_p"),
            top_k=given_or_default("top_k"),
            do_sample=not args.greedy,
            seed=args.seed,
            batch_size=args.batch_size,
        )
    except ValueError as error:
        raise EvalInputError(str(error)) from error


def _game_task(args) -> PairedTask:
    """The game maps of `--game`, with the experience of `--context-text`/`--context-file` when given."""
    not_for_games = {
        "--dataset": args.dataset,
        "--limit": args.limit,
        "--prompt-column": args.prompt_column,
        "--id-column": args.id_column,
        "--dataset-config": args.dataset_config,
        "--label-column": None if args.label_column == "answer" else args.label_column,
        "--scorer": None if args.scorer == "mcq" else args.scorer,
    }
    given = [option for option, value in not_for_games.items() if value is not None]
    if given:
        raise EvalInputError(
            f"{', '.join(given)} do(es) not apply to --game (a game is scored by winning; choose the maps with "
            "--game-option num_seeds=N or seeds=[...]). Drop them, or evaluate a dataset without --game."
        )
    context, source = None, None
    if args.context_text is not None or args.context_file:
        given = loading.context_from_args(args)
        context, source = given.spec, given.source
    try:
        options = parse_game_options(args.game_option)
    except ValueError as error:
        raise EvalInputError(str(error)) from error
    return check_game_options(args.game, options, context, source)


def _dataset_task(args, settings: GenerationSettings) -> PairedTask:
    """The dataset items of `--dataset`, their context and scorer."""
    if not args.dataset:
        raise EvalInputError("Give --dataset (a Hub name or a local file), or --game.")
    if args.game_option:
        raise EvalInputError("--game-option only applies with --game; drop it, or add --game NAME.")
    context = loading.context_from_args(args)
    dataset_path = Path(args.dataset).expanduser()
    if args.split not in ("test", "train") and (dataset_path.is_file() or dataset_path.suffix.lower() in LOCAL_FORMATS):
        raise EvalInputError(
            f"--dataset {args.dataset!r} is a single file, so it has no split {args.split!r}: its rows would be "
            "evaluated as that split. Give the file of that split as --dataset and drop --split (it applies to Hub "
            "datasets and DatasetDict folders)."
        )
    dataset = load_rows(args.dataset, split=args.split, config=args.dataset_config)
    try:
        return PairedEvaluator(
            dataset,
            context=context.spec,
            scorer=args.scorer,
            label_column=args.label_column,
            id_column=args.id_column,
            generation=settings,
            companion_scorers=[] if args.no_companion_scorers else args.companion_scorer,
            prompt_column=args.prompt_column,
            limit=args.limit,
            chat_template_kwargs=args.chat_template_kwargs,
            context_source=context.source,
            samples_per_view=args.samples_per_view,
        )
    except EvalInputError:
        raise
    except ValueError as error:  # e.g. an unknown scorer name
        raise EvalInputError(str(error)) from error


class LoadedModel(NamedTuple):
    """One model ready to generate: the weights (or the vLLM engine), its tokenizer, and the backend (None: HF)."""

    model: Any
    tokenizer: Any
    backend: VLLMBackend | None


def load_for_backend(spec: ModelSpec, args) -> LoadedModel:
    """The model of `spec` for `--backend`: a vLLM engine, or the HF model on `--device`."""
    tokenizer_path = args.tokenizer or spec.path
    if args.backend == "vllm":
        tokenizer = loading.load_tokenizer(tokenizer_path, trust_remote_code=args.trust_remote_code)
        backend = VLLMBackend(spec.path, tokenizer, adapter=spec.adapter, dtype=args.dtype)
        return LoadedModel(backend.llm, tokenizer, backend)
    model = loading.load_model(
        spec.path, spec.adapter, dtype=args.dtype, device=args.device, trust_remote_code=args.trust_remote_code
    )
    tokenizer = loading.load_tokenizer(tokenizer_path, trust_remote_code=args.trust_remote_code)
    return LoadedModel(model, tokenizer, None)


def evaluate_model(spec: ModelSpec, plan: EvalPlan, args) -> ModelRun:
    """Evaluate one model on the plan's task (resuming its records), then free its memory."""
    records_path = plan.output_dir / safe_name(spec.name) / "records.jsonl"
    loaded = load_for_backend(spec, args)
    provenance = run_provenance(
        plan.task,
        loaded.model,
        loaded.tokenizer,
        generation=plan.settings,
        model_path=spec.path,
        adapter=spec.adapter,
    )
    provenance["backend"] = args.backend
    records = run_paired(
        plan.task,
        loaded.model,
        loaded.tokenizer,
        generation=plan.settings,
        output_path=records_path,
        backend=loaded.backend,
        provenance=provenance,
        progress=not args.no_progress,
        desc=spec.name,
    )
    del loaded
    loading.release_memory()
    return ModelRun(spec.name, records, provenance=provenance, records_path=str(records_path))


def build_parser(prog: str = "trl-nca eval") -> argparse.ArgumentParser:
    """A stand-alone parser with every `trl-nca eval` option."""
    return add_eval_arguments(argparse.ArgumentParser(prog=prog))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m trl_nca.cli.eval`: exit status 0 on success, 2 with a one-line error on bad input."""
    parser = build_parser()
    args = parser.parse_args(take_output_flags(list(sys.argv[1:] if argv is None else argv)))
    clock = Stopwatch()
    try:
        summary = run_eval(args)
    except EvalInputError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    print_result_table(summary)
    files = summary["files"]
    say(
        closing_line(
            "eval",
            clock.seconds,
            {"report": files["markdown"], "summary": files["summary"], "records": args.output_dir},
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
