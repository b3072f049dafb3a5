"""`trl-nca analyze`: the paper's mechanistic measures for a base model and its students, from the command line.

`build_parser()` declares the options, `run_analyze(args)` runs them (raising `AnalysisInputError` on bad input),
`main(argv)` is the entry point (`python -m trl_nca.cli.analyze` works too).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.items import (
    AnalysisInputError,
    PromptItem,
    end_token_id,
    items_from_records,
    prepare_prompts,
    sample_items,
)
from ..analysis.measures import AnalysisItem
from ..analysis.report import write_analysis
from ..analysis.run import AnalysisOptions, analyze_model, load_model, parse_model_specs
from ..console import closing_line, say, take_output_flags
from ..core.sampling import GenerationSettings
from ..eval import loading
from ..eval.loading import ContextChoice, ModelSpec
from ..eval.store import load_records
from ..inputs import InputError, load_rows, output_folder_lock
from ..tasks import get_task, task_names
from ..trainers.teacher import check_same_vocabulary
from . import explain
from .help_format import CommandHelpFormatter, add_log_options
from .options import CONTEXT_OPTIONS, add_context_options, add_dtype_option, add_model_options


EPILOG = """\
examples:
  # the base model and an NCA adapter trained on it, on a built-in task (completions sampled by each model)
  trl-nca analyze --model base=embedded --model nca=embedded:runs/nca --task reply_in_french --output-dir runs/analyze

  # on the records of a paired evaluation (its prompts are re-read from the same dataset)
  trl-nca analyze --model base=Qwen/Qwen2.5-0.5B-Instruct --model nca=:runs/nca/checkpoint-50 \\
      --records runs/eval-medmcqa --dataset data/medmcqa_test.jsonl --context-file prompts/medical.txt \\
      --output-dir runs/analyze-medmcqa

Outputs: analysis.json, report.md, hidden_cosine.png, view_kl.png, update_norms.png. See docs/analysis.md.
"""


def build_parser(prog: str = "trl-nca analyze") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        formatter_class=CommandHelpFormatter,
        description="Measure what distilling a context did inside the students: per-layer hidden-state cosine and "
        "per-token KL between the views with and without the context, the update per layer and module type, and "
        "the cosine between the OPD and NCA gradients.",
        epilog=EPILOG,
    )
    for add_group in (
        _add_model_arguments,
        _add_prompt_arguments,
        _add_context_arguments,
        _add_completion_arguments,
        _add_measure_arguments,
        _add_output_arguments,
        add_log_options,
    ):
        add_group(parser)
    return parser


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models")
    add_model_options(
        models,
        " The first is the reference (the base: default name 'base'); updates are measured against it, and it is the "
        "teacher of the gradient measure.",
    )
    models.add_argument(
        "--teacher",
        metavar="PATH[:ADAPTER]",
        help="Teacher of the gradient measure (scores the context view); default: the reference model.",
    )
    # analyze's own default: the cosines near 1 need float32's precision (eval's `auto` would change them)
    add_dtype_option(models, "float32", ": the cosines near 1 need the precision")
    models.add_argument("--device", help="e.g. cuda:0 or cpu (default: cuda if available).")
    models.add_argument("--trust-remote-code", action="store_true", help="Allow custom model code from the Hub.")


def _add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("prompts")
    data.add_argument("--task", help=f"A built-in task ({', '.join(task_names())}): rows + context.")
    data.add_argument("--task-split", default="test", choices=["train", "test"], help="Split of --task (default test).")
    data.add_argument("--task-seed", type=int, default=0, help="Seed that generates --task (default 0).")
    data.add_argument(
        "--dataset", metavar="NAME_OR_FILE", help="A local .jsonl/.json/.parquet/.csv file or Hub dataset."
    )
    data.add_argument("--dataset-config", help="Hub dataset configuration name.")
    data.add_argument("--split", default="test", help="Split of a Hub dataset (default: test).")
    data.add_argument("--prompt-column", help="Column with the prompt (default: `prompt` or `messages`).")
    data.add_argument("--id-column", help="Column with unique item ids (default: the row index, as `trl-nca eval`).")
    data.add_argument("--limit", type=int, default=32, help="Analyse the first N items (default 32).")


def _add_context_arguments(parser: argparse.ArgumentParser) -> None:
    # analyze leaves every context option None when not given: a --task brings its own context, and giving a context
    # option with --task is an error (`_prompts`)
    add_context_options(parser, "context (like `trl-nca eval`; --task brings its own)")


def _add_completion_arguments(parser: argparse.ArgumentParser) -> None:
    completions = parser.add_argument_group("completions")
    completions.add_argument(
        "--records",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="Completions from `trl-nca eval`/`compare` records: a records.jsonl file, or an eval output folder "
        "(then <PATH>/<NAME>/records.jsonl or <PATH>/<NAME>/eval/records.jsonl per model). NAME= gives one model "
        "its own; without NAME it applies to every model not named. Needs --task or --dataset for the prompts.",
    )
    completions.add_argument(
        "--records-view",
        default="x",
        choices=["x", "xc"],
        help="Which recorded response to score: x (sampled without the context, as training samples; default) or xc.",
    )
    completions.add_argument(
        "--completions",
        default="own",
        choices=["own", "base"],
        help="Without --records: each model's own samples (default), or the reference's samples for every model.",
    )
    completions.add_argument(
        "--max-new-tokens", type=int, default=None, help="Sampled tokens per completion (default: the task's, or 64)."
    )
    completions.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="Sampling temperature, also dividing the logits of every divergence (as in training; default 1.0).",
    )
    completions.add_argument("--top-p", type=float, default=1.0, help="Sampling top-p (default 1.0, as training).")
    completions.add_argument("--top-k", type=int, default=0, help="Sampling top-k (default 0 = off, as training).")
    completions.add_argument("--greedy", action="store_true", help="Greedy decoding instead of sampling.")
    completions.add_argument("--seed", type=int, default=0, help="Run seed; each item's seed derives from it.")


def _add_measure_arguments(parser: argparse.ArgumentParser) -> None:
    measures = parser.add_argument_group("measures")
    measures.add_argument(
        "--percentile", type=float, default=5.0, help="Low percentile of the per-token cosine per layer (default 5)."
    )
    measures.add_argument("--top-tokens", type=int, default=15, help="Rows of the top-KL token table (default 15).")
    measures.add_argument(
        "--grad-items",
        type=int,
        default=8,
        help="Items (the first ones) in the batch of the OPD-vs-NCA gradient cosine (default 8; 0 skips it).",
    )
    measures.add_argument(
        "--beta",
        type=float,
        default=1.0,
        help="OPD divergence of the gradient measure: 1 reverse KL (default), 0 forward.",
    )
    measures.add_argument("--batch-size", type=int, default=8, help="Items per forward and per generate call.")
    measures.add_argument("--vocab-chunk", type=int, default=8192, help="Vocabulary columns per divergence tile.")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", required=False, help="Folder for analysis.json, report.md and figures.")
    output.add_argument("--title", help="Title of the Markdown report.")
    output.add_argument("--no-plots", action="store_true", help="Skip the PNG figures.")
    output.add_argument("--no-progress", action="store_true", help="Hide the progress bars.")


@dataclass
class Prompts:
    """The prompts to analyse: the rows, their context, what they are (for the report) and the token budget of
    completions sampled here when --max-new-tokens is not given."""

    rows: list[dict[str, Any]]
    context: ContextChoice
    description: str
    max_new_tokens: int


@dataclass
class AnalysisPlan:
    """A checked `trl-nca analyze` run: the models (the reference first, paths resolved), the teacher of the gradient
    measure (None: the reference), the prompts, the records file of each model or the sampling settings."""

    specs: list[ModelSpec]
    teacher: ModelSpec | None
    prompts: Prompts
    records: dict[str, Path] | None
    settings: GenerationSettings | None
    options: AnalysisOptions


def run_analyze(args: argparse.Namespace) -> dict[str, Any]:
    """Run `trl-nca analyze` with parsed arguments; returns the result written to `analysis.json`."""
    started = time.time()
    plan = plan_analysis(args)
    with output_folder_lock(
        args.output_dir, "trl-nca analyze", "--output-dir"
    ):  # checked (a folder we can write) before any work
        explain.opening(explain.analyze_opening(plan, args.output_dir))
        reference = load_reference(plan, args)
        measured = [measure_model(number, spec, plan, reference, args) for number, spec in enumerate(plan.specs)]
        result = analysis_result(plan, args, measured, wall_seconds=time.time() - started)
        write_analysis(result, args.output_dir, plots=False if args.no_plots else None)
    return result


def plan_analysis(args: argparse.Namespace) -> AnalysisPlan:
    """Every check of `trl-nca analyze`; loads no model (the model names are resolved last)."""
    if not args.output_dir:
        raise AnalysisInputError("Give --output-dir, the folder for analysis.json, report.md and the figures.")
    _check_options(args)
    specs = parse_model_specs(args.model)
    prompts = _prompts(args)
    records = _records_paths(args.records, specs) if args.records else None
    if records is not None and args.completions != "own":
        raise AnalysisInputError("--completions applies to sampled completions; with --records drop it.")
    settings = None if records is not None else _sampling_settings(args, prompts.max_new_tokens)
    teacher = _teacher_spec(args.teacher)
    specs = loading.resolve_model_specs(specs)
    teacher = loading.resolve_model_specs([teacher])[0] if teacher is not None else None
    return AnalysisPlan(specs, teacher, prompts, records, settings, _analysis_options(args))


def _check_options(args) -> None:
    checks = [
        ("--limit", args.limit, 1),
        ("--batch-size", args.batch_size, 1),
        ("--vocab-chunk", args.vocab_chunk, 1),
        ("--top-tokens", args.top_tokens, 0),
        ("--grad-items", args.grad_items, 0),
    ]
    for name, value, low in checks:
        if value < low:
            raise AnalysisInputError(f"{name} must be at least {low}, got {value}.")
    if not 0 <= args.percentile <= 100:
        raise AnalysisInputError(f"--percentile must be within [0, 100], got {args.percentile}.")
    if not args.temperature > 0:
        raise AnalysisInputError(f"--temperature must be > 0 (it divides the logits), got {args.temperature}.")
    if not 0 <= args.beta <= 1:
        raise AnalysisInputError(f"--beta must be within [0, 1], got {args.beta}.")
    placement = args.placement or "system"
    if placement == "system" and args.template is not None:
        raise AnalysisInputError(
            "--template joins the context and the prompt in the user turn, so it applies only with --placement user; "
            "with --placement system (the default) it would be ignored. Add --placement user, or drop --template."
        )
    if placement == "user" and args.separator is not None:
        raise AnalysisInputError(
            "--separator joins the context and a system message, so it applies only with --placement system; with "
            "--placement user it would be ignored. Drop --separator, or use --template to join context and prompt."
        )
    loading.check_device(args.device)


def _prompts(args) -> Prompts:
    """The rows and context of `--task`, or of `--dataset` with the context options."""
    context_given = any(getattr(args, option) is not None for option in CONTEXT_OPTIONS)
    if args.task and args.dataset:
        raise AnalysisInputError("Give either --task or --dataset, not both.")
    if args.task:
        if context_given:
            raise AnalysisInputError(
                f"--task {args.task} brings its own context; drop the --context-*/--placement/--template/--separator "
                "options, or give the task's rows as a --dataset file with your context."
            )
        return _task_prompts(args)
    if not args.dataset:
        raise AnalysisInputError("Give the prompts: --task NAME (built-in) or --dataset FILE with a context option.")
    context = loading.context_from_args(args)

    try:
        rows = [dict(r) for r in load_rows(args.dataset, split=args.split, config=args.dataset_config)]
    except InputError as error:
        raise AnalysisInputError(str(error)) from error
    return Prompts(rows, context, f"dataset {args.dataset}", 64)


def _task_prompts(args) -> Prompts:
    try:
        task = get_task(args.task, seed=args.task_seed)
    except ValueError as error:
        raise AnalysisInputError(str(error)) from error
    spec = task.context
    context = ContextChoice(spec, "text" if spec.text is not None else f"column:{spec.column}")
    description = f"task {args.task} ({args.task_split} split, seed {args.task_seed})"
    return Prompts(task.split(args.task_split), context, description, task.max_new_tokens)


def _records_paths(values: Sequence[str], specs: Sequence[ModelSpec]) -> dict[str, Path]:
    """The records file of each model from the --records values: `NAME=PATH` for one model, one PATH for the others."""
    names = {s.name for s in specs}
    named: dict[str, str] = {}
    shared: str | None = None
    for value in values:
        name, path = loading.split_name(value)
        if name in names:
            named[name] = path
        elif name is not None and not Path(value).exists():
            raise AnalysisInputError(f"--records {value!r} names no model; the models are {sorted(names)}.")
        elif shared is not None:
            raise AnalysisInputError("Give at most one --records without NAME=; name the others NAME=PATH.")
        else:
            shared = value
    paths = {}
    for spec in specs:
        path = named.get(spec.name, shared)
        if path is None:
            raise AnalysisInputError(
                f"No --records for model {spec.name!r}: give --records {spec.name}=PATH, or one --records for all."
            )
        paths[spec.name] = _records_file(path, spec.name)
    return paths


def _records_file(path: str, name: str) -> Path:
    """A records file, or the one of model `name` in an evaluation folder (`<PATH>/<NAME>/records.jsonl`,
    `<PATH>/<NAME>/eval/records.jsonl` as `trl-nca compare` writes, or `<PATH>/records.jsonl`)."""
    candidate = Path(path).expanduser()
    if candidate.is_dir():
        options = [candidate / name / "records.jsonl", candidate / name / "eval" / "records.jsonl"]
        options.append(candidate / "records.jsonl")
        found = next((p for p in options if p.is_file()), None)
        if found is None:
            raise AnalysisInputError(
                f"No records of model {name!r} in the folder {path}: looked for "
                f"{', '.join(str(p) for p in options)}. Give the file with --records {name}=FILE."
            )
        return found
    if not candidate.is_file():
        raise AnalysisInputError(f"Records file {path!r} not found.")
    return candidate


def _sampling_settings(args, default_max_new_tokens: int) -> GenerationSettings:
    try:
        return GenerationSettings(
            max_new_tokens=args.max_new_tokens or default_max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            do_sample=not args.greedy,
            seed=args.seed,
            batch_size=args.batch_size,
        )
    except ValueError as error:
        raise AnalysisInputError(str(error)) from error


def _teacher_spec(value: str | None) -> ModelSpec | None:
    """The `--teacher PATH[:ADAPTER]` of the gradient measure."""
    if value is None:
        return None
    path, adapter = loading.split_adapter(value)
    if not path:
        raise AnalysisInputError(f"--teacher {value!r} needs weights: give PATH or PATH:ADAPTER.")
    return ModelSpec("teacher", path, adapter)


def _analysis_options(args) -> AnalysisOptions:
    return AnalysisOptions(
        batch_size=args.batch_size,
        temperature=args.temperature,
        percentile=args.percentile,
        top_tokens=args.top_tokens,
        grad_items=args.grad_items,
        beta=args.beta,
        vocab_chunk=args.vocab_chunk,
        progress=not args.no_progress,
    )


@dataclass
class Reference:
    """The reference model (adapter merged), the tokenizer every model shares, the teacher of the gradient measure,
    the prompts rendered in both views (None with --records: the records bring their own), and the reference's own
    sampled items, which every model scores with `--completions base` (set when the reference is measured)."""

    model: Any
    tokenizer: Any
    teacher: Any
    prompts: list[PromptItem] | None
    sampled: list[AnalysisItem] | None = None


def _load_options(args) -> dict[str, Any]:
    return {"dtype": args.dtype, "device": args.device, "trust_remote_code": args.trust_remote_code}


def _prompt_options(args) -> dict[str, Any]:
    return {
        "id_column": args.id_column,
        "prompt_column": args.prompt_column,
        "chat_template_kwargs": args.chat_template_kwargs,
    }


def load_reference(plan: AnalysisPlan, args) -> Reference:
    """Load the reference model (merging its adapter: updates are measured against plain weights), its tokenizer,
    the teacher, and render the prompts."""
    spec = plan.specs[0]
    model = load_model(spec.path, spec.adapter, **_load_options(args))
    if spec.adapter is not None:
        model = model.merge_and_unload()
    tokenizer = loading.load_tokenizer(spec.path, trust_remote_code=args.trust_remote_code)
    prompts = None
    if plan.records is None:
        prompts = prepare_prompts(
            plan.prompts.rows, tokenizer, plan.prompts.context.spec, limit=args.limit, **_prompt_options(args)
        )
    teacher = model
    if plan.teacher is not None:
        teacher = load_model(plan.teacher.path, plan.teacher.adapter, **_load_options(args))
        _check_same_tokenizer(tokenizer, plan.teacher, args)
    return Reference(model, tokenizer, teacher, prompts)


def _check_same_tokenizer(tokenizer, spec: ModelSpec, args) -> None:
    other = loading.load_tokenizer(spec.path, trust_remote_code=args.trust_remote_code)
    try:
        check_same_vocabulary(tokenizer, other, names=("reference model", f"model {spec.name!r}"))
    except ValueError as error:
        raise AnalysisInputError(f"Model {spec.name!r}: {error}") from error


@dataclass
class Completions:
    """The items a model is measured on, where their completions come from, and a note for the report (or None)."""

    items: list[AnalysisItem]
    info: dict[str, Any]
    note: str | None = None


@dataclass
class MeasuredModel:
    """One model's entry of `analysis.json`, and its note for the report (or None)."""

    result: dict[str, Any]
    note: str | None


def measure_model(number: int, spec: ModelSpec, plan: AnalysisPlan, reference: Reference, args) -> MeasuredModel:
    """Load model `number` (the reference is already loaded), take its completions, run every measure."""
    model = reference.model if number == 0 else _load_student(spec, plan, reference, args)
    completions = _completions(number, spec, model, plan, reference, args)
    measures = analyze_model(
        spec.name,
        model,
        completions.items,
        tokenizer=reference.tokenizer,
        reference=reference.model if number else None,
        teacher=reference.teacher,
        options=plan.options,
    )
    result = {"name": spec.name, "path": spec.path, "adapter": spec.adapter, "completions": completions.info}
    if number:
        del model
        loading.release_memory()
    return MeasuredModel({**result, **measures}, completions.note)


def _load_student(spec: ModelSpec, plan: AnalysisPlan, reference: Reference, args):
    """A student: its adapter on a copy of the reference when it has the reference's weights, else loaded (and its
    tokenizer checked against the reference's)."""
    first = plan.specs[0]
    same_weights = spec.path == first.path and first.adapter is None
    base = reference.model if same_weights else None
    model = load_model(spec.path, spec.adapter, base=base, **_load_options(args))
    if not same_weights:
        _check_same_tokenizer(reference.tokenizer, spec, args)
    return model


def _completions(number: int, spec: ModelSpec, model, plan: AnalysisPlan, reference: Reference, args) -> Completions:
    if plan.records is not None:
        return _recorded_completions(spec, model, plan, reference, args)
    if args.completions == "base" and number > 0:
        return Completions(reference.sampled, {"source": f"sampled by {plan.specs[0].name}"})
    items = sample_items(
        model,
        reference.tokenizer,
        reference.prompts,
        plan.settings,
        progress=plan.options.progress,
        desc=f"{spec.name}: sampling",
    )
    if number == 0:
        reference.sampled = items
    return Completions(items, {"source": f"sampled by {spec.name}"})


def _recorded_completions(spec: ModelSpec, model, plan: AnalysisPlan, reference: Reference, args) -> Completions:
    path = plan.records[spec.name]
    items, info = items_from_records(
        load_records(path),
        plan.prompts.rows,
        reference.tokenizer,
        plan.prompts.context.spec,
        path=str(path),
        view=args.records_view,
        end_id=end_token_id(model, reference.tokenizer),
        limit=args.limit,
        **_prompt_options(args),
    )
    note = None
    if info.retokenized:
        note = (
            f"{spec.name}: {info.retokenized} completions were re-tokenised from the text of {path} (the records "
            f"hold no token ids), with the end-of-turn token appended when the response was not cut off; "
            f"{info.length_mismatches} of them differ in length from the recorded token count."
        )
    return Completions(items, {"source": "records", **info.to_dict()}, note)


def analysis_result(plan: AnalysisPlan, args, measured: Sequence[MeasuredModel], wall_seconds: float) -> dict:
    """What `analysis.json` holds: the settings of the run, every model's measures, the notes, the time."""
    if plan.records is not None:
        completions = f"records ({args.records_view} view)"
    elif args.completions == "base":
        completions = f"sampled by {plan.specs[0].name} without the context, shared by every model"
    else:
        completions = "sampled by each model itself without the context"
    context = plan.prompts.context
    settings = {
        "title": args.title,
        "data": plan.prompts.description,
        "completions": completions,
        "context": {
            "source": context.source,
            "placement": context.spec.placement,
            "template": context.spec.template if context.spec.placement == "user" else None,
            "separator": context.spec.separator if context.spec.placement == "system" else None,
        },
        "sampling": plan.settings.to_dict() if plan.settings is not None else None,
        "options": plan.options.to_dict(),
        "models": [{"name": s.name, "path": s.path, "adapter": s.adapter} for s in plan.specs],
        "teacher": args.teacher or plan.specs[0].name,
        "limit": args.limit,
    }
    return {
        "settings": settings,
        "models": [m.result for m in measured],
        "notes": [m.note for m in measured if m.note is not None],
        "wall_seconds": wall_seconds,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit status 0 on success, 2 with a one-line error on bad input."""
    parser = build_parser()
    args = parser.parse_args(take_output_flags(list(sys.argv[1:] if argv is None else argv)))
    try:
        result = run_analyze(args)
    except InputError as error:  # AnalysisInputError, and the errors of the shared loading (trl_nca.eval.loading)
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    files = result["files"]
    print(Path(files["markdown"]).read_text(encoding="utf-8"))
    say(closing_line("analyze", result["wall_seconds"], {"report": files["markdown"], "result": files["json"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
