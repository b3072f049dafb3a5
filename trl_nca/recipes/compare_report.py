"""What a comparison writes: its settings and task before anything runs (`write_plan`), and after the evaluations
the paired report, the table, the statistics over runs, the figures and the reading (`write_comparison_report`: `summarize`, then
`write_summary`, which the tables built from slices share, `recipes.slices`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.checks import format_pct
from ..inputs import write_text_atomic
from .compare_eval import Evaluated, per_seed_rows
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
    shown_keys,
    table_legend,
)


def write_plan(plan: Plan) -> None:
    """The comparison's settings and task, written before anything runs."""
    task = plan.task
    plan.root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(plan.root / "settings.json", json.dumps(plan.settings, indent=2, sort_keys=True) + "\n")
    write_text_atomic(
        plan.root / "task.json",
        json.dumps(
            {
                "task": task.name,
                "family": task.family,
                "description": task.description,
                **task.info,
                "num_train": len(plan.train_rows),
                "num_test": len(plan.test_rows),
            },
            indent=2,
            default=str,
        )
        + "\n",
    )


def write_comparison_report(plan: Plan, evaluated: Evaluated, start: float) -> dict[str, Any]:
    """The paired report, the table, the statistics over runs and the figures; returns the summary written to
    `comparison.json`."""
    from ..eval import write_report

    root = plan.root
    report = write_report(evaluated.runs, root / "paired_eval", title=f"{plan.task.name}: base vs students, paired")
    wall_seconds = round(time.perf_counter() - start, 1)  # this invocation (a resumed one skips finished work)
    summary = summarize(
        plan,
        evaluated,
        versions=report["versions"],
        wall_seconds=wall_seconds,
        report_path=str(root / "paired_eval" / "report.md"),
    )
    write_model_cards(plan, summary["per_seed"], summary["num_test"])
    return write_summary(plan, summary)


def _anchor(config) -> str:
    """The anchor a student's config sets, in words."""
    beta = getattr(config, "nca_beta", None)
    if beta is None:
        return f"none ({type(config).__name__}, not an NCA trainer)"
    if not beta:
        return "none (`nca_beta=0`: plain on-policy context distillation, OPD)"
    schedule = getattr(config, "nca_beta_schedule", "constant")
    gated = schedule == "gated" or (schedule == "adaptive" and getattr(config, "nca_adaptive_init", None) == 0)
    kind = "gated (off until the two views drift apart)" if gated else schedule
    return f"NCA, weight up to `nca_beta={beta}`, schedule `{schedule}`: {kind} (docs/configuration.md)"


def model_card(plan: Plan, run, row: Mapping[str, Any], n_items: int) -> str:
    """The `README.md` of a student's folder: what it is (method, anchor, organism, training seed) and its paired
    result, in place of PEFT's template."""
    from ..eval.metrics import count_of

    def rate(key: str) -> str:
        value = row.get(key)
        return "n/a" if value is None else format_pct(value)

    right_x = (row.get("acc_x") or 0.0) * n_items
    harm, help_ = row.get("harm"), row.get("help")
    harm_count = "" if harm is None else f" ({count_of(harm * right_x, right_x)})"
    help_count = "" if help_ is None else f" ({count_of(help_ * (n_items - right_x), n_items - right_x)})"
    organism = "the one base model" if run.organism is None else f"organism {run.organism}"
    table = Path(os.path.relpath(plan.root / "comparison.md", run.folder)).as_posix()
    overrides = ", ".join(f"{k}={v}" for k, v in run.method.overrides.items()) or "none"
    return "\n".join(
        [
            f"# {run.name}: a student of `trl-nca compare`",
            "",
            f"A LoRA adapter trained by trl-nca (on-policy context distillation) on the task `{plan.task.name}`, from "
            f"{organism} (`{plan.model_paths[run.organism]}`). Load it with PEFT on those weights, or evaluate it with "
            "`trl-nca eval --model BASE:THIS_FOLDER`.",
            "",
            f"- method: `{run.method.name}` (overrides: {overrides})",
            f"- anchor: {_anchor(run.config)}",
            f"- organism: {'-' if run.organism is None else run.organism}",
            f"- training seed: {run.seed}",
            "",
            f"Paired result on {n_items} held-out items, each answered without (x) and with (xc) the context (rates in %; "
            f"the columns are defined in `{table}`, and its tables compare this student with the others):",
            "",
            "| Acc_x | Acc_xc | Harm | Help | Regime |",
            "|---|---|---|---|---|",
            f"| {rate('acc_x')} | {rate('acc_xc')} | {rate('harm')}{harm_count} | {rate('help')}{help_count} | "
            f"{row.get('regime') or 'n/a'} |",
            "",
        ]
    )


def write_model_cards(plan: Plan, per_seed: Mapping[str, Sequence[Mapping[str, Any]]], n_items: int) -> None:
    """Each student folder's `README.md` (`model_card`), written over the template PEFT saves with the adapter."""
    rows = {(method, row.get("organism"), row.get("seed")): row for method, runs in per_seed.items() for row in runs}
    for run in plan.runs:
        row = rows.get((run.method.name, run.organism, run.seed))
        if row is not None and run.folder.is_dir():
            write_text_atomic(run.folder / "README.md", model_card(plan, run, row, n_items))


OUTPUT_README = """# {task}: what this folder holds

Open `comparison.md` first: the table of every model (the base and the students), what each column means, the
readings, and the statistics over runs. Then:

- `comparison.png`, `harm.png`, `curves.png`, `tracking.png`: the figures of those tables and of training;
- `paired_eval/report.md`: the full paired report (every metric with its interval, the lengths, where each model
  came from), and its figures;
- `comparison.json`: every number above, for scripts; `settings.json` and `task.json`: what was run;
- `{student}/` and the folders beside it: each student (a LoRA adapter; its `README.md` says what it is and its
  result), with its per-item records in `eval/records.jsonl`; `{base}`: the base model's.

Running the same `trl-nca compare` command again resumes: finished students are loaded, not trained again.
"""


def summarize(
    plan: Plan,
    evaluated: Evaluated,
    *,
    versions: dict[str, Any],
    wall_seconds: float | None,
    report_path: str | None,
    diagnostics: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """The table, the statistics over runs and the readings of what `evaluated` holds, as the summary of
    `comparison.json` (its `table` and `statistics_table` are the printed texts); `diagnostics` as in
    `compare_eval.per_seed_rows`."""
    from .plots import tracking_reading

    args, task = plan.args, plan.task
    per_seed = per_seed_rows(task, evaluated, diagnostics)
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
    # the early fall of Acc_xc, when there is one, and whether each method's anchor was on by then
    summary["tracking_reading"] = tracking_reading(evaluated.tracking, evaluated.histories)
    legend = table_legend(shown_keys(per_seed, keys), args.eval_samples_per_view)
    summary["table"] = render_table(aggregated, per_seed, keys, n_items=len(plan.test_rows)) + "\n\n" + legend
    summary["statistics_table"] = render_statistics(statistics, COLUMN_NAMES)
    return summary


def paragraphs(*texts: str) -> str:
    """Markdown with each reading its own paragraph: every line of `texts` apart, a table's lines kept together."""
    blocks: list[str] = []
    for line in "\n".join(t for t in texts if t).splitlines():
        if not line.strip():
            continue
        if line.startswith("|") and blocks and blocks[-1].startswith("|"):
            blocks[-1] += "\n" + line
        else:
            blocks.append(line)
    return "\n\n".join(blocks)


def write_summary(plan: Plan, summary: dict[str, Any], heading: str = "") -> dict[str, Any]:
    """The figures, `comparison.json` and `comparison.md` of a summary (`summarize`); returns the summary with the
    figures' paths."""
    from .plots import write_figures

    root = plan.root
    root.mkdir(parents=True, exist_ok=True)
    texts = {k: summary.pop(k) for k in ("table", "statistics_table")}
    first = plan.runs[0].folder if plan.runs else root / "METHOD" / "seed0"
    base = plan.base_folder(next(iter(plan.model_paths), None)) / "records.jsonl"
    where = {"student": first.relative_to(root).as_posix(), "base": base.relative_to(root).as_posix()}
    write_text_atomic(root / "README.md", OUTPUT_README.format(task=plan.task.name, **where))
    summary["figures"] = write_figures(summary, root)
    write_text_atomic(root / "comparison.json", json.dumps(summary, indent=2, default=str) + "\n")
    readings = paragraphs(summary["conclusion"], summary["reading"], summary["tracking_reading"])
    write_text_atomic(
        root / "comparison.md",
        f"# {plan.task.name}: base, OPD and NCA{heading}\n\n{texts['table']}\n\n## Readings\n\n{readings}\n\n"
        f"## Statistics over runs\n\n{texts['statistics_table']}\n",
    )
    summary.update(texts)
    return summary
