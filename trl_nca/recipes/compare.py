"""Train plain OPD and NCA students from the same initial weights on a built-in task, then compare them paired.

The recipe behind `trl-nca compare` and the README's main job:

1. generate the task (`trl_nca.tasks.get_task`): training rows, held-out rows, the context and the scorer;
2. for every training seed and every method (a name plus `NCAConfig` overrides, e.g. `opd:nca_beta=0`,
   `nca:nca_beta=0.5`), train a LoRA student by self-distillation from the same base weights and save its adapter;
3. evaluate the base model and every student on the held-out rows, once without and once with the context, with the
   same per-item seeds and sampling settings (`trl_nca.eval.PairedEvaluator`);
4. write the per-model paired report, a table of mean and spread over seeds, figures (accuracy per view as in the
   paper's Figure 1, training curves, accuracy along training) and a one-sentence reading of the table.

Before any of this, `plan_comparison` checks every setting (counts, seeds, method names and values, the task, an
existing output folder) without loading a model or writing a file; `execute` then runs the plan.

Every step is resumable: a finished run leaves `done.json` (with the settings that shaped the student) next to its
adapter and is not trained again, and the evaluation records are appended item by item and reloaded on a rerun. A
rerun whose settings differ from those recorded (`settings.json` for the comparison, `done.json` per student) is
refused, naming each setting and both values; more seeds or methods may be added. Statistics over runs
(`trl_nca.recipes.statistics`) go into `comparison.json`, `comparison.md` and `harm.png`.

`CompareRecipe` holds the steps in order, each findable by name; its modules hold what each step does:
`compare_args` (the options and their checks), `compare_plan` (the runs, their settings, the output folder's checks),
`compare_eval` (the bases, the exclusion rule, the rows of the tables), `compare_students` (training and evaluating
each student, in workers or not) and `compare_report` (what is written). Every name stays importable from here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trl import ModelConfig, TrlParser

from ..console import JobEstimate, say
from ..inputs import sha256_text
from ..tasks import BuiltinTask, get_task, task_names
from ..trainers.nca_config import NCAConfig
from ..trainers.script_options import check_dtype
from . import slices
from .budgets import check_token_budgets
from .compare_args import (
    MAX_SEED,
    METHOD_NAME,
    RECIPE_FIELDS,
    CompareArguments,
    CompareInputError,
    Method,
    check_arguments,
    check_lora_sizes,
    check_methods,
    check_sdft_task,
    check_seed,
    check_types,
    parse_method,
)
from .compare_eval import (
    Evaluated,
    apply_exclusion,
    bases_decide_runs,
    diagnostic_rates,
    evaluate_bases,
    load_base,
    load_tokenizers,
)
from .compare_plan import (
    MAX_UNKNOWN_FRACTION,
    NON_SHAPING_FIELDS,
    SETTINGS_FIX,
    Plan,
    Run,
    check_model_paths,
    check_output_folder,
    check_task_fits_model,
    checked_peft_config,
    jsonable,
    paired_evaluator,
    peft_settings,
    planned_runs,
    refuse_changed_settings,
    resolve_model_paths,
    run_config,
    setting_differences,
    training_settings,
)
from .compare_report import write_comparison_report, write_plan
from .compare_students import CURVE_KEYS, compact_history, evaluate_student, train_run, units_in_workers
from .statistics import SUMMARY_KEYS, aggregate, conclusion, render_table, table_legend


__all__ = [
    "CURVE_KEYS",
    "MAX_SEED",
    "MAX_UNKNOWN_FRACTION",
    "METHOD_NAME",
    "NON_SHAPING_FIELDS",
    "RECIPE_FIELDS",
    "SETTINGS_FIX",
    "SUMMARY_KEYS",
    "CompareArguments",
    "CompareInputError",
    "CompareRecipe",
    "Evaluated",
    "Method",
    "Plan",
    "Run",
    "aggregate",
    "check_arguments",
    "check_lora_sizes",
    "check_methods",
    "check_types",
    "compact_history",
    "conclusion",
    "diagnostic_rates",
    "execute",
    "parse_method",
    "plan_comparison",
    "refuse_changed_settings",
    "render_table",
    "run_comparison",
    "run_config",
    "table_legend",
    "train_run",
    "training_settings",
    # imported from here by `trl-nca train` and the benchmarks
    "setting_differences",
    "load_base",
    "peft_settings",
]


class CompareRecipe:
    """`trl-nca compare` as named steps. `setup` checks every setting, and an existing output folder against them, and
    returns the `Plan` without writing a file or loading a model (its `_setup_*` steps, in the order they check);
    `run` carries a plan out: write it, evaluate the bases, apply the exclusion rule, train and evaluate the
    students, report.

    Raises `CompareInputError` (or the `ValueError` of an invalid config value) naming the problem. The last setup
    step resolves the model, which pretrains the organism the first time it is asked for (into its cache, not the
    output).
    """

    def __init__(self, args: CompareArguments, config, model_args):
        self.args, self.config, self.model_args = args, config, model_args

    def setup(self) -> Plan:
        check_types(self.args)
        task = self._setup_task()
        methods, baseline = self._setup_methods()
        model_name = self.model_args.model_name_or_path or "embedded"
        peft_config, model_init_kwargs = self._setup_model(model_name)
        train_rows, test_rows, evaluator = self._setup_data(task, methods)
        root = self._setup_output_dir()
        settings = self._setup_settings(task, train_rows, model_name, model_init_kwargs, peft_config, evaluator)
        runs = planned_runs(self.args, self.config, task, methods, root, settings["student"])
        check_output_folder(root, settings, runs, len(test_rows))
        self._setup_slices(runs)
        model_paths = self._setup_model_paths(task, model_name, root, settings)
        self._setup_budgets(task, methods, root, train_rows, evaluator, model_paths)
        return Plan(
            self.args,
            task,
            methods,
            baseline,
            root,
            model_paths,
            model_init_kwargs,
            peft_config,
            list(train_rows),
            list(test_rows),
            evaluator,
            settings,
            runs,
        )

    def _setup_task(self) -> BuiltinTask:
        """The built-in task, generated from its seed, and every count and seed option checked against its sizes."""
        args = self.args
        if args.task not in task_names():
            raise CompareInputError(f"`task: {args.task}` is not a built-in task; choose one of {task_names()}.")
        check_seed("task_seed", args.task_seed)
        task = get_task(args.task, seed=args.task_seed)
        check_arguments(args, task)
        return task

    def _setup_methods(self) -> tuple[list[Method], str]:
        """The methods, checked and with their values converted, and the one the others are paired against."""
        methods = check_methods([parse_method(m) for m in self.args.methods], self.config)
        names = [m.name for m in methods]
        baseline = self.args.baseline or names[0]
        if baseline not in names:
            raise CompareInputError(f"`baseline: {baseline}` is not one of the methods {names}.")
        return methods, baseline

    def _setup_model(self, model_name: str) -> tuple[Any, dict[str, Any]]:
        """The students' LoRA config and the keyword arguments every model is loaded with."""
        peft_config = checked_peft_config(self.args, self.model_args, model_name)
        model_init_kwargs = {"dtype": self.model_args.dtype or "float32", **(self.config.model_init_kwargs or {})}
        try:
            check_dtype(model_init_kwargs)
        except ValueError as error:
            raise CompareInputError(str(error)) from None
        return peft_config, model_init_kwargs

    def _setup_data(self, task: BuiltinTask, methods: list[Method]):
        """The training and held-out rows used, and the paired evaluator of the held-out ones."""
        args = self.args
        train_rows = task.train if args.num_train is None else task.train[: args.num_train]
        check_sdft_task(methods, task, train_rows)
        test_rows = task.test if args.eval_items is None else task.test[: args.eval_items]
        return train_rows, test_rows, paired_evaluator(args, self.config, task, test_rows)

    def _setup_output_dir(self) -> Path:
        root = Path(self.config.output_dir)
        if root.exists() and not root.is_dir():
            raise CompareInputError(
                f"output_dir {str(root)!r} is a file, not a folder; give a folder path (new or existing)."
            )
        return root

    def _setup_settings(self, task, train_rows, model_name, model_init_kwargs, peft_config, evaluator):
        """What shaped every student (the method's overrides and the seeds are per run), the shared training config
        (each run's seed and the task's context are the comparison's own, per run) and what shaped the evaluation."""
        args = self.args
        student = {
            "task": task.name,
            "task_seed": args.task_seed,
            "train_rows": len(train_rows),
            "train_rows_sha256": sha256_text(json.dumps(train_rows, sort_keys=True, default=str)),
            "model": model_name,
            "model_init_kwargs": jsonable(model_init_kwargs),
            "peft": peft_settings(peft_config),
            "monitor_opd": args.monitor_opd,
            "track_every": args.track_every,
            "track_items": args.track_items,
        }
        evaluation = {k: v for k, v in evaluator.generation.to_dict().items() if k != "batch_size"}
        evaluation["samples_per_view"] = args.eval_samples_per_view
        return {"student": student, "training": training_settings(self.config, RECIPE_FIELDS), "evaluation": evaluation}

    def _setup_slices(self, runs: list[Run]) -> None:
        """With `slice` or `from_slices`: the unit named by `slice` and the slices folder (to write into, or to read
        from), before any model loads or organism pretrains (`slices.check_unit`, `slices.check_slices_dir`)."""
        args = self.args
        if args.slice is None and not args.from_slices:
            return
        organisms = list(args.organism_seeds) if args.organism_seeds is not None else [None]
        if args.slice is not None:
            slices.check_unit(args.slice, slices.planned_units(organisms, runs))
        slices.check_slices_dir(args.slices_dir, writing=args.slice is not None)

    def _setup_model_paths(self, task, model_name: str, root: Path, settings: dict[str, Any]):
        """The model each organism (or the one base) resolves to, recorded in `settings` and checked against a saved
        comparison's; the task is checked to fit an organism's tokenizer before it is pretrained, any other model's
        after it is resolved."""
        check_task_fits_model(task, model_name)
        model_paths = resolve_model_paths(model_name, self.args.organism_seeds)
        check_task_fits_model(task, model_name, model_paths)
        settings["model_paths"] = {str(organism): path for organism, path in model_paths.items()}
        check_model_paths(root / "settings.json", settings["model_paths"])
        return model_paths

    def _setup_budgets(self, task, methods, root: Path, train_rows, evaluator, model_paths) -> None:
        """Every training row fits each method's token budget and every evaluated item the reply budget, with each
        model's tokenizer, before any model loads (`budgets.check_token_budgets`)."""
        configs = {m.name: run_config(self.config, task, m, 0, root, False) for m in methods}
        check_token_budgets(configs, train_rows, evaluator, model_paths)

    @staticmethod
    def run(plan: Plan) -> dict[str, Any]:
        """Train, evaluate and report a checked comparison; returns the summary written to `comparison.json`."""
        start = time.perf_counter()
        write_plan(plan)
        evaluated = Evaluated()
        job = JobEstimate(sum(not (run.folder / "done.json").exists() for run in plan.runs), workers=plan.args.workers)
        if plan.args.workers > 1 and not bases_decide_runs(plan):
            # no base result chooses the students: the bases' evaluations run in the workers beside the students
            units_in_workers(plan, load_tokenizers(plan), bases=list(plan.model_paths), job=job)
        tokenizers = evaluate_bases(plan, evaluated)  # loads what the workers wrote
        plan = apply_exclusion(plan, evaluated)
        if plan.args.workers > 1:
            units_in_workers(plan, tokenizers, job=job)
        for run in plan.runs:  # after the workers, each student is loaded back with its records
            trains, began = not (run.folder / "done.json").exists(), time.perf_counter()
            evaluate_student(plan, run, tokenizers[run.organism], evaluated)
            if trains:  # trained here (one worker): the whole job's estimate, from the students finished so far
                say(job.finished(run.name, time.perf_counter() - began), level="units")
        return write_comparison_report(plan, evaluated, start)


def plan_comparison(args: CompareArguments, config, model_args) -> Plan:
    """Check every setting of a comparison, and an existing output folder against it; write and load nothing
    (`CompareRecipe.setup`)."""
    return CompareRecipe(args, config, model_args).setup()


def plan_from_config(config: str | Path, output_dir: str | Path, *argv: str) -> Plan:
    """`plan_comparison` of a `trl-nca compare` YAML config (and extra command-line options `argv`), with its
    outputs planned in `output_dir`: for scripts that read a study's config, such as docs/results/build.py."""
    parser = TrlParser((CompareArguments, NCAConfig, ModelConfig))
    args = ["--config", str(config), "--output_dir", str(output_dir), *argv]
    return plan_comparison(*parser.parse_args_and_config(args=args))


def execute(plan: Plan) -> dict[str, Any]:
    """Train, evaluate and report a checked comparison (`CompareRecipe.run`); returns the summary written to
    `comparison.json`."""
    return CompareRecipe.run(plan)


def run_comparison(args: CompareArguments, config, model_args) -> dict[str, Any]:
    """Check (`plan_comparison`), then train, evaluate and report (`execute`); see the module docstring. Returns the
    summary written to `comparison.json`."""
    return execute(plan_comparison(args, config, model_args))
