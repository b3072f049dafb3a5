"""What a comparison writes: its settings and task before anything runs (`_write_plan`), and after the evaluations
the paired report, the table, the statistics over runs, the figures and the reading (`_report`: `summarize`, then
`write_summary`, which the tables built from slices share, `recipes.slices`)."""

from __future__ import annotations

import json
import time
from typing import Any

from ..inputs import write_text_atomic
from .compare_eval import Evaluated, _per_seed_rows
from .compare_plan import Plan
from .outcomes import read_per_organism
from .ranges import read_against_ranges
from .statistics import (
    COLUMN_NAMES,
    STAT_KEYS,
    SUMMARY_KEYS,
    aggregate,
    compare_organisms,
    compare_to_baseline,
    conclusion,
    distributions,
    render_statistics,
    render_table,
    table_legend,
)


def _write_plan(plan: Plan) -> None:
    """The comparison's settings and task, written before anything runs."""
    task = plan.task
    plan.root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(plan.root / "settings.json", json.dumps(plan.settings, indent=2, sort_keys=True) + "\n")
    write_text_atomic(
        plan.root / "task.json",
        json.dumps({"task": task.name, "family": task.family, "description": task.description, **task.info,
                    "num_train": len(plan.train_rows), "num_test": len(plan.test_rows)}, indent=2, default=str) + "\n"
    )  # fmt: skip


def _report(plan: Plan, evaluated: Evaluated, start: float) -> dict[str, Any]:
    """The paired report, the table, the statistics over runs and the figures; returns the summary written to
    `comparison.json`."""
    from ..eval import write_report

    root = plan.root
    report = write_report(evaluated.runs, root / "paired_eval", title=f"{plan.task.name}: base vs students, paired")
    wall_seconds = round(time.perf_counter() - start, 1)  # this invocation (a resumed one skips finished work)
    summary = summarize(plan, evaluated, versions=report["versions"], wall_seconds=wall_seconds,
                        report_path=str(root / "paired_eval" / "report.md"))  # fmt: skip
    return write_summary(plan, summary)


def summarize(
    plan: Plan, evaluated: Evaluated, *, versions: dict[str, Any], wall_seconds: float | None, report_path: str | None,
    diagnostics: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The table, the statistics over runs and the readings of what `evaluated` holds, as the summary of
    `comparison.json` (its `table` and `statistics_table` are the printed texts); `diagnostics` as in
    `compare_eval._per_seed_rows`."""
    from .plots import tracking_reading

    args, task = plan.args, plan.task
    per_seed = _per_seed_rows(task, evaluated, diagnostics)
    extra = ("regime", "organism", "seed")
    keys = [*SUMMARY_KEYS, *(k for k in per_seed["base"][0] if k not in SUMMARY_KEYS and k not in extra)]
    aggregated = aggregate(per_seed, keys)
    statistics = {
        "keys": list(STAT_KEYS),
        "baseline": plan.baseline,
        "distributions": distributions(per_seed, STAT_KEYS),
        "paired": compare_to_baseline(per_seed, plan.baseline, STAT_KEYS),
        "organisms": compare_organisms(per_seed, plan.baseline),
    }
    summary = {
        "task": task.name,
        "family": task.family,
        "methods": {m.name: m.overrides for m in plan.methods},
        "seeds": list(args.seeds),
        "organism_seeds": None if args.organism_seeds is None else list(args.organism_seeds),
        "num_train": len(plan.train_rows),
        "num_test": len(plan.test_rows),
        "settings": plan.settings,
        "evaluation": {**plan.evaluator.generation.to_dict(), "samples_per_view": args.eval_samples_per_view},
        "columns": keys,
        "aggregated": aggregated,
        "per_seed": per_seed,
        "statistics": statistics,
        "conclusion": conclusion(task.name, aggregated),
        "versions": versions,
        "wall_seconds": wall_seconds,
        "train_seconds": evaluated.train_seconds,  # each run's training time, measured when it ran
        "curves": evaluated.histories,
        "tracking": evaluated.tracking,
        "exclusion": evaluated.exclusion,
        "report": report_path,
    }
    summary["range_reading"] = read_against_ranges(summary)
    summary["organism_reading"] = read_per_organism(summary)
    # with organisms, the reading is per organism against the documented outcomes; else against the documented ranges
    summary["reading"] = summary["organism_reading"] or summary["range_reading"]
    summary["tracking_reading"] = tracking_reading(evaluated.tracking)  # the early fall of Acc_xc, when there is one
    summary["table"] = (
        render_table(aggregated, per_seed, keys, n_items=len(plan.test_rows)) + "\n\n" + table_legend(keys)
    )
    summary["statistics_table"] = render_statistics(statistics, COLUMN_NAMES)
    return summary


def write_summary(plan: Plan, summary: dict[str, Any], heading: str = "") -> dict[str, Any]:
    """The figures, `comparison.json` and `comparison.md` of a summary (`summarize`); returns the summary with the
    figures' paths."""
    from .plots import write_figures

    root = plan.root
    root.mkdir(parents=True, exist_ok=True)
    texts = {k: summary.pop(k) for k in ("table", "statistics_table")}
    summary["figures"] = write_figures(summary, root)
    write_text_atomic(root / "comparison.json", json.dumps(summary, indent=2, default=str) + "\n")
    write_text_atomic(
        root / "comparison.md",
        f"# {plan.task.name}: base, OPD and NCA{heading}\n\n{texts['table']}\n\n{summary['conclusion']} "
        f"{summary['reading']}\n\n"
        + (f"{summary['tracking_reading']}\n\n" if summary["tracking_reading"] else "")
        + f"## Statistics over runs\n\n{texts['statistics_table']}\n",
    )
    summary.update(texts)
    return summary
