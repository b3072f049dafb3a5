"""`trl-nca eval --tasks`: the paired evaluation on lm-evaluation-harness tasks from the command line.

Every check comes before any model loads: the options, the tasks and their documents, the output folder (records of
runs this one would leave out of its report, records of another model or context), each model's chat template and
positions. Then each model runs every task, both views, and one report covers them all (`trl_nca.eval.harness`).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..console import plural
from ..eval import loading
from ..eval.errors import EvalInputError
from ..eval.harness import HarnessOptions, HarnessTask, evaluate_harness, harness_run_folder, harness_tasks
from ..eval.lm_eval_adapter import LM_BACKENDS, ModelToRun, build_lm, import_lm_eval
from ..eval.loading import ModelSpec
from ..eval.report import ModelRun
from ..eval.runner import check_records_before_loading, run_provenance
from ..inputs import output_folder_lock
from . import explain
from .eval_shared import check_run_options, parse_model_specs, write_eval_report
from .options import DEFAULT_SEPARATOR


@dataclass
class HarnessPlan:
    """A checked `trl-nca eval --tasks` run: the models, the lm-eval tasks (`HarnessTask`) and how they run."""

    specs: list[ModelSpec]
    tasks: list[HarnessTask]
    options: HarnessOptions
    output_dir: Path


def run_harness_eval(args: argparse.Namespace) -> dict[str, Any]:
    """`trl-nca eval --tasks`: every check (the options, the tasks and their documents, the output folder, each model's
    chat template and positions) before any model loads, then each model on each task, both views, one report."""
    plan = plan_harness(args)
    with output_folder_lock(plan.output_dir, "trl-nca eval", "--output-dir"):
        check_output_folder(plan)
        check_harness_prompts(plan, args)
        explain.opening(harness_opening(plan, args))
        runs = [run for spec in plan.specs for run in evaluate_model_on_tasks(spec, plan, args)]
        return write_eval_report(runs, plan.output_dir, args)


# options of the dataset path, with the value they hold when not given (the harness tasks bring their own)
NOT_FOR_TASKS = {
    "--prompt-column": ("prompt_column", None),
    "--id-column": ("id_column", None),
    "--dataset-config": ("dataset_config", None),
    "--label-column": ("label_column", "answer"),
    "--scorer": ("scorer", "mcq"),
    "--companion-scorer": ("companion_scorer", None),
    "--no-companion-scorers": ("no_companion_scorers", False),
    "--split": ("split", "test"),
    "--game-option": ("game_option", []),
    "--separator": ("separator", DEFAULT_SEPARATOR),
}


def _check_task_options(args) -> None:
    """The options that choose what to evaluate, and those that do not apply to harness tasks."""
    for option, given in (("--dataset", args.dataset), ("--game", args.game)):
        if given:
            raise EvalInputError(
                f"--tasks and {option} both choose what to evaluate: --tasks runs lm-evaluation-harness tasks, "
                f"{option} {'a dataset with prompt and label columns' if option == '--dataset' else 'a text game'}. "
                "Give one of them."
            )
    if not args.output_dir:
        raise EvalInputError("Give --output-dir, the folder for records, summary, report and figures.")
    given = [option for option, (name, unset) in NOT_FOR_TASKS.items() if getattr(args, name) != unset]
    if given:
        raise EvalInputError(
            f"{', '.join(given)} do(es) not apply to --tasks: a harness task brings its own prompts, answers and "
            "metric (choose it with --metric), and lm-eval joins a system context to the task's description itself. "
            "Drop them."
        )
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise EvalInputError(f"--num-fewshot must be 0 or more, got {args.num_fewshot}.")
    if args.limit is not None and args.limit < 1:
        raise EvalInputError(f"--limit must be at least 1, got {args.limit}.")
    if args.backend not in LM_BACKENDS:
        raise EvalInputError(f"--backend {args.backend} cannot run harness tasks; use one of {sorted(LM_BACKENDS)}.")


def plan_harness(args: argparse.Namespace) -> HarnessPlan:
    """Every check of `trl-nca eval --tasks` that needs no model, in the order the options are read."""
    _check_task_options(args)
    specs = loading.resolve_model_specs(parse_model_specs(args.model, args.adapter))
    if args.tokenizer:
        args.tokenizer = loading.resolve_model_path(args.tokenizer, "--tokenizer")
    check_run_options(args)
    import_lm_eval()  # one line naming the extra when lm-eval is missing
    context = loading.context_from_args(args)
    options = HarnessOptions(
        num_fewshot=args.num_fewshot,
        metric=args.metric,
        samples_per_view=args.samples_per_view,
        seed=args.seed,
        gen_kwargs=_harness_gen_kwargs(args),
        batch_size=args.batch_size,
        limit=args.limit,
        chat_template_kwargs=args.chat_template_kwargs,
        skip_empty_context=args.skip_empty_context,
    )
    names = [name.strip() for name in args.tasks.split(",") if name.strip()]
    tasks = harness_tasks(names, context.spec, options, include_path=args.include_path, context_source=context.source)
    if options.samples_per_view > 1:
        fixed = [t.name for t in tasks if not t.settings().do_sample]
        if fixed:
            raise EvalInputError(
                f"--samples-per-view {options.samples_per_view}: the tasks {fixed} do not sample (multiple choice, or "
                "greedy generation), so every sample would be the first one. Drop --samples-per-view, or make them "
                "sample (--temperature T)."
            )
    return HarnessPlan(specs, tasks, options, Path(args.output_dir))


def _harness_gen_kwargs(args) -> dict[str, Any]:
    """The generation options given on the command line, as overrides of the tasks' `generation_kwargs`."""
    kwargs: dict[str, Any] = {}
    if args.max_new_tokens is not None:
        kwargs["max_gen_toks"] = args.max_new_tokens
    if args.greedy:
        kwargs.update(do_sample=False, temperature=0.0)
    for name in ("temperature", "top_p", "top_k"):
        if getattr(args, name) is not None:
            kwargs.update({name: getattr(args, name), "do_sample": True})
    return kwargs


def check_output_folder(plan: HarnessPlan) -> None:
    """Refuse an `--output-dir` holding the records of a model or task this run leaves out: its report (summary.json,
    report.md) would replace theirs with this run's alone, and the records would stay there unlisted."""
    planned = {
        harness_run_folder(plan.output_dir, spec.name, task.name) / "records.jsonl"
        for spec in plan.specs
        for task in plan.tasks
    }
    others = sorted(p for p in plan.output_dir.glob("*/*/records.jsonl") if p not in planned)
    if others:
        listed = ", ".join(str(p.parent.relative_to(plan.output_dir)) for p in others[:5])
        more = f" (and {len(others) - 5} more)" if len(others) > 5 else ""
        raise EvalInputError(
            f"--output-dir {plan.output_dir} holds the records of runs this one leaves out: {listed}{more}; its report "
            "would list this run's alone. Give every task again in --tasks (and every model in --model): finished "
            "documents are resumed, not rerun. Or give another --output-dir."
        )


def _recorded_provenance(output_dir: Path) -> dict[str, Any]:
    """The provenance of each entry of the report already in `output_dir` (its summary.json), by entry name."""
    try:
        summary = json.loads((output_dir / "summary.json").read_text(encoding="utf-8"))
        return {m["name"]: m.get("provenance") or {} for m in summary.get("models", []) if isinstance(m, dict)}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}  # no report yet, or one the run will replace: the records' own check still runs


def check_harness_prompts(plan: HarnessPlan, args) -> None:
    """Each model's tokenizer (never its weights): a chat template that keeps the context, every document's prompt
    with the context within the model's positions (`HarnessTask.check`), and records already in the output folder
    made by this very run (`check_records_before_loading`)."""
    from transformers import AutoConfig

    recorded = _recorded_provenance(plan.output_dir)
    for spec in plan.specs:
        try:
            config = AutoConfig.from_pretrained(spec.path, trust_remote_code=args.trust_remote_code)
            config = config.get_text_config() if hasattr(config, "get_text_config") else config
            limit = getattr(config, "max_position_embeddings", None)
        except (OSError, ValueError):
            limit = None  # loading the model reports it, with its own message
        tokenizer = loading.load_tokenizer(args.tokenizer or spec.path, trust_remote_code=args.trust_remote_code)
        for task in plan.tasks:
            task.check(tokenizer, limit, f"{spec.name} ({spec.path})")
            provenance = run_provenance(
                task, None, tokenizer, generation=task.settings(), model_path=spec.path, adapter=spec.adapter
            )
            provenance["backend"] = args.backend
            path = harness_run_folder(plan.output_dir, spec.name, task.name) / "records.jsonl"
            check_records_before_loading(path, provenance, recorded.get(f"{spec.name}/{task.name}"))


def harness_opening(plan: HarnessPlan, args) -> str:
    """`trl-nca eval --tasks`' opening line."""
    tasks = ", ".join(f"{task.name} ({plural(len(task.docs), 'document')})" for task in plan.tasks)
    skipped = [f"{task.name}: {len(task.skipped)}" for task in plan.tasks if task.skipped]
    left_out = f" (left out for an empty context: {', '.join(skipped)})" if skipped else ""
    first_look = "" if args.limit else "; for a first look, --limit 16 runs the first 16 documents of each task"
    return (
        f"trl-nca eval: evaluate {plural(len(plan.specs), 'model')} ({', '.join(s.name for s in plan.specs)}) paired "
        f"on {plural(len(plan.tasks), 'lm-eval task')}: {tasks}{left_out}, each run without and with the context x "
        f"{plural(plan.options.samples_per_view, 'sample')}; output {plan.output_dir}; a line as each view of a task "
        f"finishes{first_look}."
    )


def evaluate_model_on_tasks(spec: ModelSpec, plan: HarnessPlan, args) -> list[ModelRun]:
    """One model on every task (`trl_nca.eval.harness.evaluate_harness`): records in `<model>/<task>/records.jsonl`,
    resumed on a rerun; then its memory is freed. The backend (`LM_BACKENDS`) says whether the weights are loaded
    here first."""
    backend = LM_BACKENDS[args.backend]
    tokenizer = loading.load_tokenizer(args.tokenizer or spec.path, trust_remote_code=args.trust_remote_code)
    model = None
    if backend.loads_model:
        model = loading.load_model(
            spec.path, spec.adapter, dtype=args.dtype, device=args.device, trust_remote_code=args.trust_remote_code
        )
    lm = build_lm(
        args.backend,
        ModelToRun(
            model,
            tokenizer,
            path=spec.path,
            adapter=spec.adapter,
            dtype=args.dtype,
            tokenizer_path=args.tokenizer,
            seed=plan.options.seed,
            batch_size=plan.options.batch_size,
            chat_template_kwargs=plan.options.chat_template_kwargs,
        ),
    )
    runs = evaluate_harness(
        model,
        tokenizer,
        plan.tasks,
        context=plan.tasks[0].context,
        adapter=spec.adapter,
        options=plan.options,
        output_dir=plan.output_dir,
        model_name=spec.name,
        lm=lm,
        check=False,
        model_path=spec.path,
        backend=args.backend,
        progress=not args.no_progress,
    )
    del model, lm
    loading.release_memory()
    return runs
