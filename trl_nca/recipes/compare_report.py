"""What a comparison writes: its settings and task before anything runs (`write_plan`), and after the evaluations
the paired report, the table, the statistics over runs, the figures and the reading (`write_comparison_report`: `summarize`, then
`write_summary`, which the tables built from slices share, `recipes.slices`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.checks import format_pct
from ..core.views import ContextSpec
from ..eval import write_report
from ..eval.metrics import count_of
from ..inputs import write_text_atomic
from .compare_eval import Evaluated, per_seed_rows
from .compare_plan import Plan
from .outcomes import read_per_organism
from .plots import tracking_reading, write_figures
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


TEST_ITEMS = "test_items.jsonl"


def write_plan(plan: Plan) -> None:
    """The comparison's settings and task, and the held-out items it evaluates on (`test_items.jsonl`, what
    `trl-nca eval --dataset` reads), written before anything runs."""
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
    rows = "".join(json.dumps(row, sort_keys=True, default=str) + "\n" for row in plan.test_rows)
    write_text_atomic(plan.root / TEST_ITEMS, rows)  # what the students' model cards evaluate them on


def write_comparison_report(plan: Plan, evaluated: Evaluated, start: float) -> dict[str, Any]:
    """The paired report, the table, the statistics over runs and the figures; returns the summary written to
    `comparison.json`."""
    root = plan.root
    report = write_report(evaluated.runs, root / "paired_eval", title=f"{plan.task.name}: base vs students, paired")
    sittings = [*earlier_sittings(root), {"wall_seconds": round(time.perf_counter() - start, 1)}]
    summary = summarize(
        plan,
        evaluated,
        versions=report["versions"],
        wall_seconds=round(sum(s["wall_seconds"] for s in sittings), 1),
        report_path=str(root / "paired_eval" / "report.md"),
    )
    summary["sittings"] = sittings
    write_model_cards(plan, summary["per_seed"], summary["num_test"])
    return write_summary(plan, summary)


def earlier_sittings(root: Path) -> list[dict[str, float]]:
    """The sittings of the job recorded in the `comparison.json` an earlier sitting wrote in `root` (each with the
    wall seconds it ran; a summary written before sittings were recorded was one sitting of its `wall_seconds`). A
    resume keeps them: `wall_seconds` is their sum, the time the whole job took."""
    try:
        earlier = json.loads((root / "comparison.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(earlier, dict):
        return []
    listed = earlier.get("sittings")
    if isinstance(listed, list):
        return [s for s in listed if isinstance(s, dict) and isinstance(s.get("wall_seconds"), (int, float))]
    seconds = earlier.get("wall_seconds")
    return [{"wall_seconds": seconds}] if isinstance(seconds, (int, float)) and seconds >= 0 else []


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
            f"{organism} (`{base_model_name(plan, run.organism)}`). Load it with PEFT on those weights, or evaluate it "
            "paired on the comparison's held-out items, with its settings (run from the folder `trl-nca compare` ran "
            "in):",
            "",
            "```bash",
            eval_command(plan, run),
            "```",
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


def base_model_name(plan: Plan, organism: int | None) -> str:
    """A student's base as a model name every command takes: a shipped organism's name (`organism-rules-s2`), else
    the model the comparison was given (an alias, a Hub id or a path); the resolved folder only for an organism that
    does not ship (`organism-quick`)."""
    name = str(plan.settings["student"]["model"])
    if organism is None:
        return name
    from ..models.organism import shipped_name, spec_for_alias

    return shipped_name(dataclasses.replace(spec_for_alias(name), seed=organism)) or plan.model_paths[organism]


def eval_command(plan: Plan, run) -> str:
    """The `trl-nca eval` command that evaluates the student of `run` as the comparison did: its base and adapter,
    the held-out items (`test_items.jsonl`), the task's context, scorer and the evaluation's sampling settings."""
    context, generation, default = plan.task.context, plan.evaluator.generation, ContextSpec()
    name = run.name.replace("/", "-")  # a model's name in `trl-nca eval` holds no slash
    argv = ["trl-nca", "eval", "--model", f"{name}={base_model_name(plan, run.organism)}:{run.folder.as_posix()}"]
    argv += ["--dataset", (plan.root / TEST_ITEMS).as_posix(), "--id-column", "id", "--scorer", plan.task.scorer]
    if context.text is not None:
        argv += ["--context-text", context.text]
    else:
        argv += ["--context-column", str(context.column)]
    argv += ["--placement", context.placement]
    if context.placement == "user" and context.template != default.template:
        argv += ["--template", context.template]
    if context.placement == "system" and context.separator != default.separator:
        argv += ["--separator", context.separator]
    argv += ["--max-new-tokens", str(generation.max_new_tokens), "--temperature", str(generation.temperature)]
    argv += ["--top-p", str(generation.top_p), "--top-k", str(generation.top_k), "--seed", str(generation.seed)]
    samples = getattr(plan.evaluator, "samples_per_view", 1)
    if samples > 1:
        argv += ["--samples-per-view", str(samples)]
    dtype = plan.model_init_kwargs.get("dtype") or plan.model_init_kwargs.get("torch_dtype")
    if isinstance(dtype, str) and dtype != "auto":
        argv += ["--dtype", dtype]
    argv += ["--output-dir", (plan.root / "eval" / name).as_posix()]
    return shlex.join(argv)


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
  `test_items.jsonl`: the held-out items every model was evaluated on (what `trl-nca eval --dataset` reads);
- `{student}/` and the folders beside it: each student (a LoRA adapter; its `README.md` says what it is and its
  result), with its per-item records in `eval/records.jsonl`; `{base}`: the base model's.

Running the same `trl-nca compare` command again resumes: finished students are loaded, not trained again.
"""


def table_keys(per_seed: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """The metric keys of a comparison's table: `SUMMARY_KEYS`, then the task's diagnostic rates (those of the first
    row, the base's when it is there)."""
    first = next(iter(per_seed.values()))[0]
    return [
        *SUMMARY_KEYS,
        *(k for k in first if k not in SUMMARY_KEYS and k not in ("regime", "organism", "seed", "ci")),
    ]


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
    args, task = plan.args, plan.task
    per_seed = per_seed_rows(task, evaluated, diagnostics)
    keys = table_keys(per_seed)
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
        "wall_seconds": wall_seconds,  # every sitting of the job (`sittings`), a resume's included
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
