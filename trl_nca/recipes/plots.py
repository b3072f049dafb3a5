"""Figures of a comparison: accuracy per view (as in the paper's Figure 1), training curves, accuracy along training."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..eval.plots import figures_wanted, new_figure
from ..inputs import atomic_output


def _method(run_name: str) -> str:
    return run_name.split("/")[0]


def plot_comparison(
    aggregated: Mapping[str, Mapping[str, Any]],
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | os.PathLike,
    title: str = "",
) -> str:
    """Acc_x and Acc_xc per model: bars at the mean over seeds, whiskers from the lowest to the highest seed, dots
    for the seeds."""
    names = list(aggregated)
    fig = new_figure(max(4.5, 1.5 + 1.3 * len(names)), 3.6)
    ax = fig.add_subplot()
    width = 0.38
    for j, (key, label) in enumerate((("acc_x", "without context (Acc_x)"), ("acc_xc", "with context (Acc_xc)"))):
        offset = (j - 0.5) * width
        for i, name in enumerate(names):
            stat = aggregated[name].get(key)
            if stat is None:
                continue
            mean = 100 * stat["mean"]
            ax.bar(i + offset, mean, width, color=f"C{j}", label=label if i == 0 else None)
            if stat["n"] > 1:
                ax.errorbar(i + offset, mean, yerr=[[mean - 100 * stat["min"]], [100 * stat["max"] - mean]],
                            color="black", capsize=3, linewidth=1)  # fmt: skip
                seeds = [100 * r[key] for r in per_seed[name] if r.get(key) is not None]
                ax.scatter([i + offset] * len(seeds), seeds, s=10, color="black", zorder=3)
            ax.text(i + offset, mean + 1.5, f"{mean:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylim(0, 112)
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title or "Accuracy without and with the context")
    ax.legend(loc="upper left", fontsize=8, frameon=False, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    with atomic_output(path) as temporary:
        fig.savefig(temporary)
    return str(path)


def _series(history: Mapping[str, Sequence[Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one logged term from a `compact_history`-style dict of lists, skipping missing values."""
    points = [(s, v) for s, v in zip(history.get("step", []), history.get(key, [])) if v is not None]
    if not points:
        return np.array([]), np.array([])
    steps, values = zip(*points)
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


def _mean_lines(ax, runs: Mapping[str, Mapping[str, Sequence[Any]]], key: str) -> None:
    by_method: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for run, history in runs.items():
        steps, values = _series(history, key)
        if steps.size:
            by_method[_method(run)].append((steps, values))
    for k, (method, series) in enumerate(by_method.items()):
        for steps, values in series:
            ax.plot(steps, values, color=f"C{k}", alpha=0.25, linewidth=0.8)
        common = min(len(s) for s, _ in series)
        mean = np.mean([v[:common] for _, v in series], axis=0)
        ax.plot(series[0][0][:common], mean, color=f"C{k}", linewidth=1.8, label=f"{method} (mean of {len(series)})")


def plot_curves(histories: Mapping[str, Mapping[str, Sequence[Any]]], path: str | os.PathLike) -> str:
    """`opd_loss`, `nca_loss`, `view_kl` and `nca_beta` per optimizer step: thin lines per seed, thick the mean."""
    keys = [k for k in ("opd_loss", "nca_loss", "view_kl", "nca_beta") if any(h.get(k) for h in histories.values())]
    if not keys:  # e.g. every job ran fewer optimizer steps than logging_steps
        fig = new_figure(5, 2.4)
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "No training loss was logged\n(each job ran fewer steps than logging_steps).",
                ha="center", va="center", fontsize=9)  # fmt: skip
        ax.set_axis_off()
        with atomic_output(path) as temporary:
            fig.savefig(temporary)
        return str(path)
    fig = new_figure(3.5 * len(keys), 3.2)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(1, len(keys), i + 1)
        _mean_lines(ax, histories, key)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    with atomic_output(path) as temporary:
        fig.savefig(temporary)
    return str(path)


def plot_tracking(tracking: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike) -> str:
    """Held-out Acc_x and Acc_xc along training (the subset evaluated every `track_every` steps)."""
    fig = new_figure(8, 3.2)
    for i, (key, label) in enumerate((("acc_x", "Acc_x (without context)"), ("acc_xc", "Acc_xc (with context)"))):
        ax = fig.add_subplot(1, 2, i + 1)
        scaled = {
            run: {"step": [row["step"] for row in rows], key: [100 * row[key] for row in rows]}
            for run, rows in tracking.items()
        }
        _mean_lines(ax, scaled, key)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.set_ylabel("%")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    with atomic_output(path) as temporary:
        fig.savefig(temporary)
    return str(path)


def plot_harm(per_seed: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike, title: str = "") -> str:
    """Harm per run, per model: a box (quartiles, whiskers to min and max) and one dot per run (organism x seed)."""
    names = list(per_seed)
    fig = new_figure(max(4.0, 1.2 + 1.1 * len(names)), 3.4)
    ax = fig.add_subplot()
    rng = np.random.default_rng(0)  # horizontal jitter of the dots only
    for i, name in enumerate(names):
        values = [100 * row["harm"] for row in per_seed[name] if row.get("harm") is not None]
        if not values:
            ax.text(i, 2, "n/a", ha="center", fontsize=8)
            continue
        if len(values) > 1:
            ax.boxplot([values], positions=[i], widths=0.5, whis=(0, 100), showfliers=False, manage_ticks=False)
        ax.scatter(i + rng.uniform(-0.12, 0.12, len(values)), values, s=14, color=f"C{i}", zorder=3)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylim(-3, 103)
    ax.set_ylabel("harm (%)")
    ax.set_title(title or "Harm per run: P(wrong with the context | right without it)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    with atomic_output(path) as temporary:
        fig.savefig(temporary)
    return str(path)


def write_figures(summary: Mapping[str, Any], folder: str | os.PathLike, prefix: str = "") -> dict[str, str]:
    """All figures of a comparison, drawn from its summary (`comparison.json`) alone, so they can be redrawn from the
    saved JSON: `{prefix}comparison.png`, `{prefix}harm.png` (harm per run), `{prefix}curves.png` and, when accuracy
    was tracked, `{prefix}tracking.png`; none (and one logged line) without matplotlib."""
    from pathlib import Path

    folder = Path(folder)
    if not figures_wanted(None, folder):  # without matplotlib: skipped, with one line saying so
        return {}
    title = summary.get("title") or summary["task"]
    figures = {
        "comparison": plot_comparison(
            summary["aggregated"], summary["per_seed"], folder / f"{prefix}comparison.png", title=title
        ),
        "harm": plot_harm(summary["per_seed"], folder / f"{prefix}harm.png", title=f"{title}: harm per run"),
        "curves": plot_curves(summary["curves"], folder / f"{prefix}curves.png"),
    }
    if any(summary.get("tracking", {}).values()):
        figures["tracking"] = plot_tracking(summary["tracking"], folder / f"{prefix}tracking.png")
    return figures
