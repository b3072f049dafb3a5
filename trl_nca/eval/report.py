"""Reports of one or several models side by side: per-item JSONL, summary JSON, Markdown table and PNG figures.

A typical report compares the base model (whose with-context view is the teacher), an OPD student and an NCA student.
Every output carries the provenance of each model's run (model and adapter identity, context hash, seeds, sampling
settings, library versions).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.checks import format_pct
from ..inputs import write_text_atomic
from .metrics import FEW_ITEMS, compute_metrics, count_of
from .provenance import library_versions
from .records import PairedRecord
from .store import append_records


@dataclass
class ModelRun:
    """The records of one model plus how they were produced. `records_path` is the per-item JSONL, if already written."""

    name: str
    records: list[PairedRecord]
    provenance: dict[str, Any] = field(default_factory=dict)
    records_path: str | None = None


def safe_name(name: str) -> str:
    """A file-system-safe version of a model name."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return cleaned or "model"


def scorer_names(records: Sequence[PairedRecord]) -> list[str]:
    """The companion scorers stored in every record (both views)."""
    if not records:
        return []
    names = None
    for record in records:
        here = set(record.x.extra.get("scores", {})) & set(record.xc.extra.get("scores", {}))
        names = here if names is None else names & here
    return sorted(names or [])


def scorer_errors(records: Sequence[PairedRecord]) -> dict[str, Any]:
    """How many responses a scorer failed on (it raised, or returned an unusable value), per scorer and view.

    Such a response counts as wrong and as a format failure in the metrics; this count tells them apart from genuine
    format failures. `first` describes the first failure of each scorer (item, view, error message).
    """
    by_scorer: dict[str, dict[str, Any]] = {}
    for record in records:
        for view, outcome in (("x", record.x), ("xc", record.xc)):
            for name, score in outcome.extra.get("scores", {}).items():
                counts = by_scorer.setdefault(name, {"x": 0, "xc": 0, "first": None})
                if score.get("error"):
                    counts[view] += 1
                    if counts["first"] is None:
                        counts["first"] = f"item {record.item_id}, view {view}: {score['error']}"
    total = sum(c["x"] + c["xc"] for c in by_scorer.values())
    return {"total": total, "by_scorer": by_scorer}


def summarize_run(
    run: ModelRun, *, alpha: float = 0.05, n_bootstrap: int = 1000, seed: int = 0, confidence: float = 0.95
) -> dict[str, Any]:
    """Metrics of one model under its main scorer and under every companion scorer its records hold."""
    options = {"alpha": alpha, "n_bootstrap": n_bootstrap, "seed": seed, "confidence": confidence}
    main_scorer = run.provenance.get("scorer")
    by_scorer = {
        name: compute_metrics(run.records, scorer=name, **options)
        for name in scorer_names(run.records)
        if name != main_scorer
    }
    return {
        "name": run.name,
        "metrics": compute_metrics(run.records, **options),
        "metrics_by_scorer": by_scorer,
        "scorer_errors": scorer_errors(run.records),
        "records_path": run.records_path,
        "provenance": run.provenance,
    }


def _with_ci(metrics: Mapping[str, Any], key: str) -> str:
    ci = metrics["ci"].get(key)
    text = format_pct(metrics.get(key))
    if ci is None or metrics.get(key) is None:
        return text
    return f"{text} [{format_pct(ci[0])}, {format_pct(ci[1])}]"


def _p_value(metrics: Mapping[str, Any]) -> str:
    """McNemar's p-value, or the paired permutation test's (marked) with k samples per view."""
    if metrics.get("mcnemar_p") is not None:
        return f"{metrics['mcnemar_p']:.3g}"
    return f"{metrics['permutation_p']:.3g} (perm)" if metrics.get("permutation_p") is not None else "n/a"


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_failure_notes(models: Sequence[Mapping[str, Any]], threshold: float = 0.5) -> list[str]:
    """A warning for every model and view where more than `threshold` of the answers could not be parsed: there the
    accuracy measures whether the model keeps the answer format, not whether it knows the answer."""
    notes = []
    for model in models:
        m = model["metrics"]
        for view, label in (("x", "without"), ("xc", "with")):
            rate = m.get(f"format_failure_{view}")
            if rate is not None and rate > threshold:
                notes.append(
                    f"{model['name']}, {label} the context: {100 * rate:.0f}% of the answers are format failures, so "
                    f"Acc_{view} measures the answer format, not the knowledge. See the other scorers below, or a "
                    "more lenient scorer."
                )
    return notes


def render_markdown(summary: Mapping[str, Any]) -> str:
    """The Markdown report: a main table, a companion-scorer table, the scorer errors, the lengths and a provenance
    section (one step each)."""
    models = summary["models"]
    lines = _main_table(summary, models)
    lines += _other_scorers(models)
    lines += _scorer_errors(models)
    lines += _lengths(models)
    lines += _provenance(models)
    versions = summary.get("versions", {})
    lines += ["", "Library versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), ""]
    return "\n".join(lines)


def _main_table(summary: Mapping[str, Any], models) -> list[str]:
    """The title, what the rates mean, one row per model and the format-failure notes."""
    conf = int(round(100 * summary.get("confidence", 0.95)))
    lines = [
        f"# {summary.get('title') or 'Paired with/without-context evaluation'}",
        "",
        f"Rates in %, with {conf}% bootstrap intervals ({summary['n_bootstrap']} resamples, seed "
        f"{summary['bootstrap_seed']}). Harm = P(wrong with c | correct without c); Help = P(correct with c | wrong "
        f"without c), each with its count (k/n: answers the context broke, of the n right without it; fixed, of the "
        f"n wrong without it; `few`: n below {FEW_ITEMS}, too few items to read as a rate). Regime: A = c "
        f"significantly hurts, B = c significantly helps, C = no significant difference (exact McNemar test on harm "
        f"vs help counts, alpha = {summary['alpha']}; docs/evaluation.md#regimes).",
        "",
        "| Model | n | Acc_x | Acc_xc | Delta | Harm | Harm (uncond.) | Help | BothCorrect | BothWrong | FF_x | FF_xc "
        "| Len_x | Len_xc | Len change | Trunc_x | Trunc_xc | McNemar p | Regime |",
        "|" + "---|" * 19,
    ]
    sampled = sorted({m["metrics"].get("samples_per_view") for m in models} - {None})
    if sampled:
        lines[4:4] = [
            f"With k = {', '.join(map(str, sampled))} samples per view, rates are means of per-item success rates, "
            "harm and help are expected rates, their counts expected counts, and the p-value (marked `perm`) is the "
            "paired permutation test over items (docs/evaluation.md).",
            "",
        ]
    for model in models:
        m = model["metrics"]
        lines.append(
            "| "
            + " | ".join(
                [
                    model["name"],
                    str(m["n"]),
                    _with_ci(m, "acc_x"),
                    _with_ci(m, "acc_xc"),
                    _with_ci(m, "delta"),
                    _with_ci(m, "harm") + f" ({count_of(m['harm_count'], m['n_correct_x'])})",
                    format_pct(m["harm_unconditional"]),
                    _with_ci(m, "help") + f" ({count_of(m['help_count'], m['n'] - m['n_correct_x'])})",
                    format_pct(m["both_correct"]),
                    format_pct(m["both_wrong"]),
                    format_pct(m["format_failure_x"]),
                    format_pct(m["format_failure_xc"]),
                    _num(m["length_x"]["mean"]),
                    _num(m["length_xc"]["mean"]),
                    format_pct(m["length_change"]),
                    format_pct(m["truncated_x"]),
                    format_pct(m["truncated_xc"]),
                    _p_value(m),
                    m["regime"] or "n/a",
                ]
            )
            + " |"
        )
    notes = format_failure_notes(models)
    if notes:
        lines += [""] + [f"> {note}" for note in notes]
    return lines


def _other_scorers(models) -> list[str]:
    """The companion scorers' table (none without companion scorers)."""
    lines: list[str] = []
    companion_rows = [
        (model["name"], scorer, m) for model in models for scorer, m in model.get("metrics_by_scorer", {}).items()
    ]
    if companion_rows:
        lines += [
            "",
            "## Other scorers",
            "",
            "| Model | Scorer | Acc_x | Acc_xc | Delta | Harm | Help | FF_x | FF_xc | McNemar p | Regime |",
            "|" + "---|" * 11,
        ]
        for name, scorer, m in companion_rows:
            cells = [name, scorer] + [_with_ci(m, k) for k in ("acc_x", "acc_xc", "delta", "harm", "help")]
            cells += [format_pct(m["format_failure_x"]), format_pct(m["format_failure_xc"]), _p_value(m)]
            lines.append("| " + " | ".join(cells + [m["regime"] or "n/a"]) + " |")
    return lines


def _scorer_errors(models) -> list[str]:
    """The responses a scorer failed on, per model and scorer."""
    lines = ["", "## Scorer errors", ""]
    errors = [(model["name"], model.get("scorer_errors") or {"total": 0, "by_scorer": {}}) for model in models]
    if not any(e["total"] for _, e in errors):
        lines.append("None: every response was scored (format failures above are genuine).")
    else:
        lines += [
            "Responses a scorer failed on (it raised, or returned an unusable value): each counts as wrong and as a "
            "format failure above.",
            "",
            "| Model | Scorer | Errors without c | Errors with c | First error |",
            "|---|---|---|---|---|",
        ]
        for name, e in errors:
            for scorer, counts in e["by_scorer"].items():
                first = (counts["first"] or "").replace("|", "\\|").replace("\n", " ")
                lines.append(f"| {name} | {scorer} | {counts['x']} | {counts['xc']} | {first} |")
    return lines


def _lengths(models) -> list[str]:
    lines = ["", "## Length (response tokens)", "", "| Model | View | Mean | Median | p90 |", "|---|---|---|---|---|"]
    for model in models:
        m = model["metrics"]
        for view in ("x", "xc"):
            stats = m[f"length_{view}"]
            lines.append(
                f"| {model['name']} | {view} | {_num(stats['mean'])} | {_num(stats['median'])} | {_num(stats['p90'])} |"
            )
    return lines


def _provenance(models) -> list[str]:
    """Where each model, its sampling settings, its context and its records come from."""
    lines = ["", "## Provenance", ""]
    for model in models:
        prov = model.get("provenance") or {}
        ident = prov.get("model") or {}
        gen = prov.get("generation") or {}
        ctx = prov.get("context") or {}
        lines.append(
            f"- **{model['name']}**: model `{ident.get('name_or_path')}`"
            + (f" (commit {ident['commit']})" if ident.get("commit") else "")
            + (f", adapter `{ident['adapter']}`" if ident.get("adapter") else "")
            + (f", weights fingerprint `{ident['fingerprint']}`" if ident.get("fingerprint") else "")
            + f"; scorer `{prov.get('scorer')}`; context sha256 `{ctx.get('sha256')}` ({ctx.get('source')}, "
            f"{ctx.get('placement')}); sampling {json.dumps(gen, sort_keys=True)}"
            + (f"; records `{model['records_path']}`" if model.get("records_path") else "")
        )
    return lines


def write_report(
    runs: Sequence[ModelRun],
    output_dir: str | os.PathLike,
    *,
    alpha: float = 0.05,
    n_bootstrap: int = 1000,
    bootstrap_seed: int = 0,
    confidence: float = 0.95,
    plots: bool | None = None,
    title: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write `summary.json`, `report.md`, the figures and any missing per-item JSONL; return the summary.

    `plots=None` (default) draws the figures when matplotlib is installed and otherwise skips them with one logged line
    (`trl_nca.eval.plots.figures_wanted`); `True` requires matplotlib; `False` skips them.

    Per-item records go to `<output_dir>/<model name>/records.jsonl` unless the run already has a `records_path`
    (e.g. the resumable file the evaluator appended to), which is then referenced, not rewritten.
    """
    names = [run.name for run in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"Model names in one report must be unique, got {names}.")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    for run in runs:
        if run.records_path is None:
            path = output_dir / safe_name(run.name) / "records.jsonl"
            if path.exists():
                path.unlink()
            append_records(path, run.records)
            run.records_path = str(path)
    summary: dict[str, Any] = {
        "title": title,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "alpha": alpha,
        "confidence": confidence,
        "n_bootstrap": n_bootstrap,
        "bootstrap_seed": bootstrap_seed,
        "versions": library_versions(),
        "models": [
            summarize_run(run, alpha=alpha, n_bootstrap=n_bootstrap, seed=bootstrap_seed, confidence=confidence)
            for run in runs
        ],
        **(dict(extra) if extra else {}),
    }
    files = {"summary": str(output_dir / "summary.json"), "markdown": str(output_dir / "report.md")}
    from .plots import figures_wanted

    if figures_wanted(plots, output_dir):
        from .plots import plot_accuracy, plot_harm_help, plot_lengths

        files["accuracy_png"] = plot_accuracy(summary, output_dir / "accuracy.png")
        files["harm_help_png"] = plot_harm_help(summary, output_dir / "harm_help.png")
        files["lengths_png"] = plot_lengths(summary, output_dir / "lengths.png")
    summary["files"] = files
    write_text_atomic(files["summary"], json.dumps(summary, indent=2, default=str) + "\n")
    write_text_atomic(files["markdown"], render_markdown(summary))
    return summary
