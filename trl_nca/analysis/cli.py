"""`trl-nca analyze`: the paper's mechanistic measures for a base model and its students, from the command line.

`build_parser()` declares the options, `run_analyze(args)` runs them (raising `AnalysisInputError` on bad input),
`main(argv)` is the entry point (`python -m trl_nca.analysis.cli` works too).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..eval.cli import json_object_arg
from ..views import ContextSpec
from .items import AnalysisInputError, end_token_id, items_from_records, prepare_prompts, sample_items
from .run import _NAME, AnalysisOptions, ModelSpec, analyze_model, load_model, parse_model_specs


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
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure what distilling a context did inside the students: per-layer hidden-state cosine and "
        "per-token KL between the views with and without the context, the update per layer and module type, and "
        "the cosine between the OPD and NCA gradients.",
        epilog=EPILOG,
    )
    models = parser.add_argument_group("models")
    models.add_argument(
        "--model", action="append", default=[], metavar="NAME=PATH[:ADAPTER]",
        help="A model folder, Hub id or alias ('embedded', 'organism'), optionally with a PEFT adapter folder after "
        "a colon; repeat for several. The first is the reference (the base: default name 'base'); updates are "
        "measured against it, and it is the teacher of the gradient measure. NAME=:ADAPTER puts an adapter on the "
        "reference's weights.",
    )  # fmt: skip
    models.add_argument(
        "--teacher", metavar="PATH[:ADAPTER]",
        help="Teacher of the gradient measure (scores the context view); default: the reference model.",
    )  # fmt: skip
    models.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16", "auto"],
        help="Weights dtype (default float32: the cosines near 1 need the precision).",
    )  # fmt: skip
    models.add_argument("--device", help="e.g. cuda:0 or cpu (default: cuda if available).")
    models.add_argument("--trust-remote-code", action="store_true", help="Allow custom model code from the Hub.")

    data = parser.add_argument_group("prompts")
    data.add_argument("--task", help="A built-in task (reply_in_french, island_facts, organism_shift): rows + context.")
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

    context = parser.add_argument_group("context (like `trl-nca eval`; --task brings its own)")
    source = context.add_mutually_exclusive_group()
    source.add_argument("--context-column", default=None, help="Column with each item's context (default: context).")
    source.add_argument("--context-text", help="One fixed context string for every item.")
    source.add_argument("--context-file", help="A UTF-8 file with one fixed context, or 'medical' / 'safety'.")
    context.add_argument("--placement", default=None, choices=["system", "user"], help="Default: system.")
    context.add_argument("--template", default=None, help="With --placement user; needs {context} and {prompt}.")
    context.add_argument("--separator", default=None, help="With --placement system: joins context and system message.")
    context.add_argument(
        "--chat-template-kwargs",
        type=json_object_arg,
        default={},
        metavar="JSON",
        help="Extra chat template variables.",
    )

    completions = parser.add_argument_group("completions")
    completions.add_argument(
        "--records", action="append", default=[], metavar="[NAME=]PATH",
        help="Completions from `trl-nca eval`/`compare` records: a records.jsonl file, or an eval output folder "
        "(then <PATH>/<NAME>/records.jsonl or <PATH>/<NAME>/eval/records.jsonl per model). NAME= gives one model "
        "its own; without NAME it applies to every model not named. Needs --task or --dataset for the prompts.",
    )  # fmt: skip
    completions.add_argument(
        "--records-view", default="x", choices=["x", "xc"],
        help="Which recorded response to score: x (sampled without the context, as training samples; default) or xc.",
    )  # fmt: skip
    completions.add_argument(
        "--completions", default="own", choices=["own", "base"],
        help="Without --records: each model's own samples (default), or the reference's samples for every model.",
    )  # fmt: skip
    completions.add_argument(
        "--max-new-tokens", type=int, default=None, help="Sampled tokens per completion (default: the task's, or 64)."
    )
    completions.add_argument(
        "--temperature", type=float, default=1.0,
        help="Sampling temperature, also dividing the logits of every divergence (as in training; default 1.0).",
    )  # fmt: skip
    completions.add_argument("--top-p", type=float, default=1.0, help="Sampling top-p (default 1.0, as training).")
    completions.add_argument("--top-k", type=int, default=0, help="Sampling top-k (default 0 = off, as training).")
    completions.add_argument("--greedy", action="store_true", help="Greedy decoding instead of sampling.")
    completions.add_argument("--seed", type=int, default=0, help="Run seed; each item's seed derives from it.")

    measures = parser.add_argument_group("measures")
    measures.add_argument(
        "--percentile", type=float, default=5.0, help="Low percentile of the per-token cosine per layer (default 5)."
    )
    measures.add_argument("--top-tokens", type=int, default=15, help="Rows of the top-KL token table (default 15).")
    measures.add_argument(
        "--grad-items", type=int, default=8,
        help="Items (the first ones) in the batch of the OPD-vs-NCA gradient cosine (default 8; 0 skips it).",
    )  # fmt: skip
    measures.add_argument(
        "--beta",
        type=float,
        default=1.0,
        help="OPD divergence of the gradient measure: 1 reverse KL (default), 0 forward.",
    )
    measures.add_argument("--batch-size", type=int, default=8, help="Items per forward and per generate call.")
    measures.add_argument("--vocab-chunk", type=int, default=8192, help="Vocabulary columns per divergence tile.")

    output = parser.add_argument_group("output")
    output.add_argument("--output-dir", required=False, help="Folder for analysis.json, report.md and figures.")
    output.add_argument("--title", help="Title of the Markdown report.")
    output.add_argument("--no-plots", action="store_true", help="Skip the PNG figures.")
    output.add_argument("--no-progress", action="store_true", help="Hide the progress bars.")
    return parser


def _context(args) -> tuple[ContextSpec | None, str]:
    """The context from the options (None when none was given), and a description of its source."""
    given = any(
        v is not None
        for v in (
            args.context_column,
            args.context_text,
            args.context_file,
            args.placement,
            args.template,
            args.separator,
        )
    )
    if not given:
        return None, ""
    layout = {"placement": args.placement or "system"}
    if args.template is not None:
        layout["template"] = args.template
    if args.separator is not None:
        layout["separator"] = args.separator
    try:
        if args.context_file:
            from ..inputs import read_context

            return ContextSpec(column=None, text=read_context(args.context_file), **layout), f"file:{args.context_file}"
        if args.context_text is not None:
            return ContextSpec(column=None, text=args.context_text, **layout), "text"
        column = args.context_column or "context"
        return ContextSpec(column=column, **layout), f"column:{column}"
    except (ValueError, TypeError, OSError) as error:
        raise AnalysisInputError(str(error)) from error


def _rows_and_context(args):
    """(rows, context spec, description of the data, default max_new_tokens)."""
    context, source = _context(args)
    if args.task and args.dataset:
        raise AnalysisInputError("Give either --task or --dataset, not both.")
    if args.task:
        from ..tasks import get_task

        if context is not None:
            raise AnalysisInputError(
                f"--task {args.task} brings its own context; drop the --context-*/--placement/--template/--separator "
                "options, or give the task's rows as a --dataset file with your context."
            )
        try:
            task = get_task(args.task, seed=args.task_seed)
        except ValueError as error:
            raise AnalysisInputError(str(error)) from error
        rows = task.split(args.task_split)
        spec = task.context
        source = "text" if spec.text is not None else f"column:{spec.column}"
        return (
            rows,
            spec,
            source,
            f"task {args.task} ({args.task_split} split, seed {args.task_seed})",
            task.max_new_tokens,
        )
    if not args.dataset:
        raise AnalysisInputError("Give the prompts: --task NAME (built-in) or --dataset FILE with a context option.")
    from ..inputs import InputError, load_rows

    try:
        rows = [dict(r) for r in load_rows(args.dataset, split=args.split, config=args.dataset_config)]
    except InputError as error:
        raise AnalysisInputError(str(error)) from error
    if context is None:
        context, source = ContextSpec(column="context"), "column:context"
    return rows, context, source, f"dataset {args.dataset}", 64


def _records_paths(values: Sequence[str], specs: Sequence[ModelSpec]) -> dict[str, Path]:
    """The records file of each model from the --records values."""
    named: dict[str, str] = {}
    shared: str | None = None
    names = {s.name for s in specs}
    for value in values:
        name, sep, path = value.partition("=")
        if sep and name in names:
            named[name] = path
        elif sep and _NAME.match(name) and not Path(value).exists():
            raise AnalysisInputError(f"--records {value!r} names no model; the models are {sorted(names)}.")
        else:
            if shared is not None:
                raise AnalysisInputError("Give at most one --records without NAME=; name the others NAME=PATH.")
            shared = value
    paths = {}
    for spec in specs:
        path = named.get(spec.name, shared)
        if path is None:
            raise AnalysisInputError(
                f"No --records for model {spec.name!r}: give --records {spec.name}=PATH, or one --records for all."
            )
        candidate = Path(path).expanduser()
        if candidate.is_dir():
            options = [candidate / spec.name / "records.jsonl", candidate / spec.name / "eval" / "records.jsonl"]
            options.append(candidate / "records.jsonl")
            found = next((p for p in options if p.is_file()), None)
            if found is None:
                raise AnalysisInputError(
                    f"No records of model {spec.name!r} in the folder {path}: looked for "
                    f"{', '.join(str(p) for p in options)}. Give the file with --records {spec.name}=FILE."
                )
            candidate = found
        elif not candidate.is_file():
            raise AnalysisInputError(f"Records file {path!r} not found.")
        paths[spec.name] = candidate
    return paths


def _check_options(args) -> None:
    checks = [
        ("--limit", args.limit, 1), ("--batch-size", args.batch_size, 1), ("--vocab-chunk", args.vocab_chunk, 1),
        ("--top-tokens", args.top_tokens, 0), ("--grad-items", args.grad_items, 0),
    ]  # fmt: skip
    for name, value, low in checks:
        if value < low:
            raise AnalysisInputError(f"{name} must be at least {low}, got {value}.")
    if not 0 <= args.percentile <= 100:
        raise AnalysisInputError(f"--percentile must be within [0, 100], got {args.percentile}.")
    if not args.temperature > 0:
        raise AnalysisInputError(f"--temperature must be > 0 (it divides the logits), got {args.temperature}.")
    if not 0 <= args.beta <= 1:
        raise AnalysisInputError(f"--beta must be within [0, 1], got {args.beta}.")


def run_analyze(args: argparse.Namespace) -> dict[str, Any]:
    """Run `trl-nca analyze` with parsed arguments; returns the result written to `analysis.json`."""
    from ..sampling import GenerationSettings
    from ..teacher import check_same_vocabulary
    from .report import write_analysis

    started = time.time()
    if not args.output_dir:
        raise AnalysisInputError("Give --output-dir, the folder for analysis.json, report.md and the figures.")
    _check_options(args)
    specs = parse_model_specs(args.model)
    rows, context, context_source, data, task_tokens = _rows_and_context(args)
    records = _records_paths(args.records, specs) if args.records else None
    if records is not None and args.completions != "own":
        raise AnalysisInputError("--completions applies to sampled completions; with --records drop it.")
    try:
        settings = None
        if records is None:
            settings = GenerationSettings(
                max_new_tokens=args.max_new_tokens or task_tokens, temperature=args.temperature, top_p=args.top_p,
                top_k=args.top_k, do_sample=not args.greedy, seed=args.seed, batch_size=args.batch_size,
            )  # fmt: skip
    except ValueError as error:
        raise AnalysisInputError(str(error)) from error
    options = AnalysisOptions(
        batch_size=args.batch_size, temperature=args.temperature, percentile=args.percentile,
        top_tokens=args.top_tokens, grad_items=args.grad_items, beta=args.beta, vocab_chunk=args.vocab_chunk,
        progress=not args.no_progress,
    )  # fmt: skip
    load = {"dtype": args.dtype, "device": args.device, "trust_remote_code": args.trust_remote_code}

    reference_spec = specs[0]
    reference = load_model(reference_spec.path, reference_spec.adapter, **load)
    if reference_spec.adapter is not None:
        reference = reference.merge_and_unload()  # the updates are measured against plain weights
    tokenizer = _tokenizer(reference_spec.path, args.trust_remote_code)
    prompt_options = {
        "id_column": args.id_column, "prompt_column": args.prompt_column,
        "chat_template_kwargs": args.chat_template_kwargs,
    }  # fmt: skip
    prompts = None
    if records is None:
        prompts = prepare_prompts(rows, tokenizer, context, limit=args.limit, **prompt_options)
    teacher = reference
    if args.teacher:
        path, _, adapter = args.teacher.partition(":")
        teacher = load_model(path, adapter or None, **load)
        check_same_vocabulary(tokenizer, _tokenizer(path, args.trust_remote_code))

    notes: list[str] = []
    results = []
    shared_items = None
    for number, spec in enumerate(specs):
        if number == 0:
            model = reference
        else:
            same_weights = spec.path == reference_spec.path and reference_spec.adapter is None
            model = load_model(spec.path, spec.adapter, base=reference if same_weights else None, **load)
            if not same_weights:
                try:
                    check_same_vocabulary(tokenizer, _tokenizer(spec.path, args.trust_remote_code))
                except ValueError as error:
                    raise AnalysisInputError(f"Model {spec.name!r}: {error}") from error
        info: dict[str, Any]
        if records is not None:
            from ..eval.store import load_records

            path = records[spec.name]
            items, record_info = items_from_records(
                load_records(path), rows, tokenizer, context, path=str(path), view=args.records_view,
                end_id=end_token_id(model, tokenizer), limit=args.limit, **prompt_options,
            )  # fmt: skip
            info = {"source": "records", **record_info.to_dict()}
            if record_info.retokenized:
                notes.append(
                    f"{spec.name}: {record_info.retokenized} completions were re-tokenised from the text of {path} "
                    f"(the records hold no token ids), with the end-of-turn token appended when the response was not "
                    f"cut off; {record_info.length_mismatches} of them differ in length from the recorded token count."
                )
        elif args.completions == "base" and shared_items is not None:
            items, info = shared_items, {"source": f"sampled by {reference_spec.name}"}
        else:
            items = sample_items(
                model, tokenizer, prompts, settings, progress=options.progress, desc=f"{spec.name}: sampling"
            )
            info = {"source": f"sampled by {spec.name}"}
            if args.completions == "base":
                shared_items = items
        result = analyze_model(
            spec.name, model, items, tokenizer=tokenizer, reference=reference if number else None, teacher=teacher,
            options=options,
        )  # fmt: skip
        results.append({"name": spec.name, "path": spec.path, "adapter": spec.adapter, "completions": info, **result})
        if number:
            del model
            gc.collect()

    if records is not None:
        completions = f"records ({args.records_view} view)"
    elif args.completions == "base":
        completions = f"sampled by {reference_spec.name} without the context, shared by every model"
    else:
        completions = "sampled by each model itself without the context"
    result = {
        "settings": {
            "title": args.title,
            "data": data,
            "completions": completions,
            "context": {
                "source": context_source,
                "placement": context.placement,
                "template": context.template if context.placement == "user" else None,
                "separator": context.separator if context.placement == "system" else None,
            },  # fmt: skip
            "sampling": settings.to_dict() if settings is not None else None,
            "options": options.to_dict(),
            "models": [{"name": s.name, "path": s.path, "adapter": s.adapter} for s in specs],
            "teacher": args.teacher or reference_spec.name,
            "limit": args.limit,
        },
        "models": results,
        "notes": notes,
        "wall_seconds": time.time() - started,
    }
    write_analysis(result, args.output_dir, plots=not args.no_plots)
    return result


def _tokenizer(path: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    from ..models import resolve_model_name_or_path

    try:
        return AutoTokenizer.from_pretrained(resolve_model_name_or_path(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise AnalysisInputError(f"Tokenizer of {path!r} could not be loaded: {error}") from error


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit status 0 on success, 2 with a one-line error on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = run_analyze(args)
    except AnalysisInputError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    files = result["files"]
    print(Path(files["markdown"]).read_text(encoding="utf-8"))
    print(f"Wrote {files['json']} and {files['markdown']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
