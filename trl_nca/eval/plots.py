"""PNG figures of a paired report, drawn with matplotlib's Agg canvas (no display, no change to pyplot's backend)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..inputs import atomic_output


logger = logging.getLogger(__name__)

MISSING_MATPLOTLIB = "matplotlib is not installed (`pip install matplotlib`, or `pip install trl-nca[plots]`)"


def matplotlib_available() -> bool:
    """Whether matplotlib can be imported here (the figures need it; it is in the `plots` extra, not a dependency)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def figures_wanted(plots: bool | None, where: str | os.PathLike) -> bool:
    """Resolve a `plots` switch: `None` draws the figures when matplotlib is installed and otherwise skips them with
    one logged line saying so (the reports themselves never need matplotlib); `True` draws them (and `new_figure`
    names the missing package); `False` skips them silently."""
    if plots is not None:
        return plots
    if matplotlib_available():
        return True
    logger.warning("Figures skipped for %s: %s; the JSON and Markdown reports are written.", where, MISSING_MATPLOTLIB)
    return False


def new_figure(width: float, height: float):
    """A matplotlib figure drawn off-screen (no pyplot state), for the figures of the reports, recipes and analyses."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(f"Plots need matplotlib, and {MISSING_MATPLOTLIB}; or disable plots.") from error
    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def _errors(metrics: Mapping[str, Any], key: str) -> tuple[float, float, float]:
    """(value, lower error, upper error) in percent; NaN for an undefined rate."""
    value = metrics.get(key)
    if value is None:
        return float("nan"), 0.0, 0.0
    ci = metrics["ci"].get(key)
    if ci is None:
        return 100 * value, 0.0, 0.0
    return 100 * value, max(0.0, 100 * (value - ci[0])), max(0.0, 100 * (ci[1] - value))


def _grouped_bars(ax, summary: Mapping[str, Any], keys: Sequence[str], labels: Sequence[str]) -> None:
    models = summary["models"]
    positions = np.arange(len(models))
    width = 0.8 / len(keys)
    for j, (key, label) in enumerate(zip(keys, labels)):
        stats = [_errors(m["metrics"], key) for m in models]
        values = [s[0] for s in stats]
        yerr = np.array([[s[1] for s in stats], [s[2] for s in stats]])
        offset = (j - (len(keys) - 1) / 2) * width
        ax.bar(positions + offset, values, width, yerr=yerr, capsize=3, label=label)
        for x, v in zip(positions + offset, values):
            if np.isnan(v):
                ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(positions)
    ax.set_xticklabels([m["name"] for m in models], rotation=20, ha="right")
    ax.set_ylabel("%")
    ax.legend(loc="upper center", ncol=len(keys), fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1.0))
    ax.grid(axis="y", alpha=0.3)


def plot_accuracy(summary: Mapping[str, Any], path: str | os.PathLike) -> str:
    """Accuracy without (Acc_x) and with (Acc_xc) the context per model, with bootstrap intervals."""
    fig = new_figure(max(5.0, 1.6 + 1.2 * len(summary["models"])), 3.8)
    ax = fig.add_subplot()
    _grouped_bars(ax, summary, ["acc_x", "acc_xc"], ["without context (Acc_x)", "with context (Acc_xc)"])
    ax.set_ylim(0, 115)
    ax.set_title("Accuracy per view")
    fig.tight_layout()
    with atomic_output(path) as temporary:
        fig.savefig(temporary)
    return str(path)


def plot_harm_help(summary: Mapping[str, Any], path: str | os.PathLike) -> str:
    """Harm P(wrong with c | correct without c) and help P(correct with c | wrong without c) per model."""
    fig = new_figure(max(5.0, 1.6 + 1.2 * len(summary["models"])), 3.8)
    ax = fig.add_subplot()
    _grouped_bars(
        ax,
        summary,
        ["harm", "help"],
        ["harm: P(wrong with c | right without)", "help: P(right with c | wrong without)"],
    )
    ax.set_ylim(0, 115)
    ax.set_title("Harm and help of adding the context")
    fig.tight_layout()
    with atomic_output(path) as temporary:
        fig.savefig(temporary)
    return str(path)


def plot_lengths(runs: Sequence[Any], path: str | os.PathLike) -> str:
    """Box plots of response length (tokens) per model and view."""
    fig = new_figure(max(5.0, 1.6 + 1.4 * len(runs)), 3.8)
    ax = fig.add_subplot()
    data, labels, positions = [], [], []
    for i, run in enumerate(runs):
        for j, view in enumerate(("x", "xc")):
            lengths = [getattr(r, view).num_tokens for r in run.records]
            data.append(lengths if lengths else [0])
            labels.append(f"{run.name}\n{view}")
            positions.append(3 * i + j)
    if data:
        box = ax.boxplot(data, positions=positions, widths=0.8, patch_artist=True, medianprops={"color": "black"})
        for k, patch in enumerate(box["boxes"]):
            patch.set_facecolor("C0" if k % 2 == 0 else "C1")
        ax.set_xticks(positions)
        ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("response tokens")
    ax.set_title("Response length per view (x: without, xc: with context)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    with atomic_output(path) as temporary:
        fig.savefig(temporary)
    return str(path)
