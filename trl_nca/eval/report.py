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

from ..console import plural
from ..core.checks import format_pct
from ..inputs import write_text_atomic
from .columns import COLUMNS, REPORT, Column, constant_columns, left_out_line, legend
from .metrics import FEW_ITEMS, compute_metrics, count_of
from .plots import constant_lengths, figures_wanted, plot_accuracy, plot_harm_help, plot_lengths
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
    lines += _lengths(summary)
    lines += _provenance(models)
    versions = summary.get("versions", {})
    lines += ["", "Library versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), ""]
    return "\n".join(lines)


def _cell(column: Column, m: Mapping[str, Any]) -> str:
    """One cell of the report's main table, written as its column's kind says (`trl_nca.eval.columns`)."""
    if column.kind == "count":
        return str(m[column.key])
    if column.kind == "label":
        return m[column.key] or "n/a"
    if column.kind == "p":
        return _p_value(m)
    if column.kind == "tokens":
        return _num(m[column.key]["mean"])
    text = _with_ci(m, column.key) if column.kind == "rate_ci" else format_pct(m[column.key])
    if column.count == "harm_count":
        text += f" ({count_of(m['harm_count'], m['n_correct_x'])})"
    elif column.count == "help_count":
        text += f" ({count_of(m['help_count'], m['n'] - m['n_correct_x'])})"
    return text


def _table(models) -> tuple[list[Column], list[str], list[str]]:
    """The main table's shown columns, its lines (header and one row per model) and its notes: the columns left out
    because they are the same for every model, and those a summary written before they existed does not hold."""
    columns = [c for c in COLUMNS if REPORT in c.tables]
    absent = [c for c in columns if any(c.key not in model["metrics"] for model in models)]
    columns = [c for c in columns if c not in absent]
    rows = [{c.key: _cell(c, model["metrics"]) for c in columns} for model in models]
    constant = constant_columns([c.key for c in columns], rows)
    shown = [c for c in columns if c.key not in constant]
    lines = ["| Model | " + " | ".join(c.name for c in shown) + " |", "|" + "---|" * (len(shown) + 1)]
    for model, row in zip(models, rows, strict=True):
        lines.append("| " + " | ".join([model["name"], *(row[c.key] for c in shown)]) + " |")
    notes = [left_out_line(constant)] if constant else []
    if absent:
        notes.append(
            f"Not in this summary (written by an earlier trl-nca): {', '.join(c.name for c in absent)}. "
            "Run the evaluation again for them."
        )
    return shown, lines, notes


def console_table(summary: Mapping[str, Any]) -> str:
    """The report's main table, as `trl-nca eval` prints it at its end (the definitions are in report.md)."""
    shown, lines, notes = _table(summary["models"])
    return "\n".join([*lines, *notes, f"Columns defined in {summary.get('files', {}).get('markdown', 'report.md')}."])


def _main_table(summary: Mapping[str, Any], models) -> list[str]:
    """The title, what the rates mean, every column's definition (`trl_nca.eval.columns`), one row per model (a
    column the same for every model left out, with a line saying so) and the format-failure notes."""
    conf = int(round(100 * summary.get("confidence", 0.95)))
    shown, table, table_notes = _table(models)
    lines = [
        f"# {summary.get('title') or 'Paired with/without-context evaluation'}",
        "",
        f"Each item is answered without the context (view x) and with it (view xc). Rates in %, with {conf}% "
        f"bootstrap intervals ({summary['n_bootstrap']} resamples, seed {summary['bootstrap_seed']}). Harm and Help "
        f"carry their counts (k/n: the answers the context broke, of the n right without it; those it fixed, of the n "
        f"wrong without it; `few`: n below {FEW_ITEMS}, too few items to read as a rate). The columns:",
        "",
        *(f"- {line}" for line in legend(c.key for c in shown)),
        "",
        *table,
    ]
    sampled = sorted({m["metrics"].get("samples_per_view") for m in models} - {None})
    if sampled:
        lines[4:4] = [  # after the paragraph on the rates
            f"With k = {', '.join(map(str, sampled))} samples per view, rates are means of per-item success rates, "
            "harm and help are expected rates, and their counts expected counts: the sum over items of the share of "
            "the k samples that count (hence fractional counts such as 49.1/235.5); the p-value (marked `perm`) is "
            "the paired permutation test over items (docs/evaluation.md).",
            "",
        ]
    for note in table_notes:
        lines += ["", note]
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


def generates(model: Mapping[str, Any]) -> bool:
    """Whether a report entry's answers were generated (lengths, truncation and sampling apply), not chosen by
    log-likelihood (an lm-eval multiple-choice or log-likelihood task)."""
    return (model.get("provenance") or {}).get("generates", True) is not False


SCORED_NOTE = (
    "chosen by log-likelihood (lm-eval's multiple-choice or log-likelihood tasks), not generated, so reply lengths, "
    "truncation and sampling settings do not apply to them"
)


def generated_only(summary: Mapping[str, Any]) -> dict[str, Any]:
    """`summary` with only the entries whose answers were generated (for the lengths' table and figure)."""
    return {**summary, "models": [m for m in summary["models"] if generates(m)]}


def _lengths(summary: Mapping[str, Any]) -> list[str]:
    """The reply lengths of each model and view; when every model's are the same, one line instead of the figure;
    entries whose answers were not generated are left out, with a line saying so."""
    scored = [m["name"] for m in summary["models"] if not generates(m)]
    generated = generated_only(summary)
    lines = ["", "## Length (response tokens)", ""]
    if scored:
        who = "Every answer here was" if not generated["models"] else f"The answers of {', '.join(scored)} were"
        lines += [f"{who} {SCORED_NOTE}: no length table for them.", ""]
    if not generated["models"]:
        return lines
    note = constant_lengths(generated)
    lines += [*([note, ""] if note else []), "| Model | View | Mean | Median | p90 |", "|---|---|---|---|---|"]
    for model in generated["models"]:
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
        ctx = prov.get("context") or {}
        skipped = ctx.get("skipped_empty") or {}
        sampling = (
            f"sampling {json.dumps(prov.get('generation') or {}, sort_keys=True)}"
            if generates(model)
            else "answers chosen by log-likelihood (no sampling)"
        )
        lines.append(
            f"- **{model['name']}**: model `{ident.get('name_or_path')}`"
            + (f" (commit {ident['commit']})" if ident.get("commit") else "")
            + (f", adapter `{ident['adapter']}`" if ident.get("adapter") else "")
            + (f", weights fingerprint `{ident['fingerprint']}`" if ident.get("fingerprint") else "")
            + f"; scorer `{prov.get('scorer')}`; context sha256 `{ctx.get('sha256')}` ({ctx.get('source')}, "
            f"{ctx.get('placement')})"
            + (f", {plural(skipped['count'], 'document')} with an empty context left out" if skipped else "")
            + f"; {sampling}"
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
    _write_missing_records(runs, output_dir)
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
    files.update(_write_figures(summary, output_dir, plots))
    summary["files"] = files
    write_text_atomic(files["summary"], json.dumps(summary, indent=2, default=str) + "\n")
    write_text_atomic(files["markdown"], render_markdown(summary))
    return summary


def _write_missing_records(runs: Sequence[ModelRun], output_dir: Path) -> None:
    """The per-item JSONL of each run that has none yet, at `<output_dir>/<model name>/records.jsonl`."""
    for run in runs:
        if run.records_path is None:
            path = output_dir / safe_name(run.name) / "records.jsonl"
            if path.exists():
                path.unlink()
            append_records(path, run.records)
            run.records_path = str(path)


def _write_figures(summary: Mapping[str, Any], output_dir: Path, plots: bool | None) -> dict[str, str]:
    """The figures, when wanted: accuracy and harm/help of every entry, and the lengths of the entries whose answers
    were generated, unless they are all the same (a line of the report then stands for it)."""
    if not figures_wanted(plots, output_dir):
        return {}

    files = {
        "accuracy_png": plot_accuracy(summary, output_dir / "accuracy.png"),
        "harm_help_png": plot_harm_help(summary, output_dir / "harm_help.png"),
    }
    generated = generated_only(summary)
    if generated["models"] and constant_lengths(generated) is None:
        files["lengths_png"] = plot_lengths(generated, output_dir / "lengths.png")
    elif (output_dir / "lengths.png").exists():  # from an earlier report of other lengths
        (output_dir / "lengths.png").unlink()
    return files
