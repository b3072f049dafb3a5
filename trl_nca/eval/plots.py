"""PNG figures of a paired report, drawn with matplotlib's Agg canvas (no display, no change to pyplot's backend)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..inputs import atomic_output
from .metrics import FEW_ITEMS, count_of


logger = logging.getLogger(__name__)

MISSING_MATPLOTLIB = 'matplotlib is not installed (`pip install matplotlib`, or `pip install "trl-nca[plots]"`)'


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


def save_figure(fig, path: str | os.PathLike) -> str:
    """Write `fig` to `path` as a PNG (atomically: a reader never sees half a file); returns the path."""
    with atomic_output(path) as temporary:
        fig.savefig(temporary)
    return str(path)


def _errors(metrics: Mapping[str, Any], key: str) -> tuple[float, float, float]:
    """(value, lower error, upper error) in percent; NaN for an undefined rate."""
    value = metrics.get(key)
    if value is None:
        return float("nan"), 0.0, 0.0
    ci = metrics["ci"].get(key)
    if ci is None:
        return 100 * value, 0.0, 0.0
    return 100 * value, max(0.0, 100 * (value - ci[0])), max(0.0, 100 * (ci[1] - value))


CONDITIONAL_TOTALS = {"harm": lambda m: m["n_correct_x"], "help": lambda m: m["n"] - m["n_correct_x"]}
"""The items each conditional rate divides by, from a model's metrics."""


def _grouped_bars(ax, summary: Mapping[str, Any], keys: Sequence[str], labels: Sequence[str]) -> None:
    from matplotlib.patches import Patch

    models = summary["models"]
    positions = np.arange(len(models))
    width = 0.8 / len(keys)
    handles = [Patch(color=f"C{j}", label=label) for j, label in enumerate(labels)]  # unfaded, whatever the bars
    for j, key in enumerate(keys):
        stats = [_errors(m["metrics"], key) for m in models]
        values = [s[0] for s in stats]
        yerr = np.array([[s[1] for s in stats], [s[2] for s in stats]])
        offset = (j - (len(keys) - 1) / 2) * width
        bars = ax.bar(positions + offset, values, width, yerr=yerr, capsize=3, color=f"C{j}")
        for x, v, bar, model, (_, _, up) in zip(positions + offset, values, bars, models, stats):
            if np.isnan(v):
                ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7)
            elif key in CONDITIONAL_TOTALS:  # the count behind the rate, and a faded, hatched bar when it is few
                m = model["metrics"]
                total = CONDITIONAL_TOTALS[key](m)
                ax.text(
                    x,
                    v + up + 1.5,
                    count_of(m[f"{key}_count"], total).replace(", ", "\n"),
                    ha="center",
                    va="bottom",
                    fontsize=6,
                )
                if total < FEW_ITEMS:
                    bar.set_alpha(0.4)
                    bar.set_hatch("//")
    ax.set_xticks(positions)
    ax.set_xticklabels([m["name"] for m in models], rotation=20, ha="right")
    ax.set_ylabel("%")
    ax.legend(handles=handles, loc="lower center", ncol=len(keys), fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1.0))
    ax.grid(axis="y", alpha=0.3)


def accuracy_figure(summary: Mapping[str, Any]):
    """Accuracy without (Acc_x) and with (Acc_xc) the context per model, with bootstrap intervals."""
    fig = new_figure(max(5.0, 1.6 + 1.2 * len(summary["models"])), 3.8)
    ax = fig.add_subplot()
    _grouped_bars(ax, summary, ["acc_x", "acc_xc"], ["without context (Acc_x)", "with context (Acc_xc)"])
    ax.set_ylim(0, 115)
    ax.set_title("Accuracy per view", pad=22)
    fig.tight_layout()
    return fig


def plot_accuracy(summary: Mapping[str, Any], path: str | os.PathLike) -> str:
    """`accuracy_figure`, written to `path` (PNG)."""
    return save_figure(accuracy_figure(summary), path)


def harm_help_figure(summary: Mapping[str, Any]):
    """Harm P(wrong with c | correct without c) and help P(correct with c | wrong without c) per model."""
    fig = new_figure(max(6.2, 1.6 + 1.2 * len(summary["models"])), 3.8)
    ax = fig.add_subplot()
    _grouped_bars(
        ax,
        summary,
        ["harm", "help"],
        ["harm: P(wrong with c | right without)", "help: P(right with c | wrong without)"],
    )
    ax.set_ylim(0, 125)
    ax.set_title(f"Harm and help of adding the context (count k/n; hatched: n < {FEW_ITEMS})", fontsize=10, pad=22)
    fig.tight_layout()
    return fig


def plot_harm_help(summary: Mapping[str, Any], path: str | os.PathLike) -> str:
    """`harm_help_figure`, written to `path` (PNG)."""
    return save_figure(harm_help_figure(summary), path)


def constant_lengths(summary: Mapping[str, Any]) -> str | None:
    """The line that stands for `lengths.png` when it would draw nothing: every model's mean reply is the same length
    (to 0.1 token) with and without the context. None when the lengths differ somewhere."""
    lengths = {
        f"{length:.1f}"
        for model in summary["models"]
        for length in (model["metrics"]["length_x"]["mean"], model["metrics"]["length_xc"]["mean"])
        if length is not None
    }
    if len(summary["models"]) < 2 or len(lengths) != 1:
        return None
    return (
        f"`lengths.png` is not drawn: every model's replies average {lengths.pop()} tokens, with the context and "
        "without it (a length change of 0 for all)."
    )


def lengths_figure(summary: Mapping[str, Any]):
    """The length change per model: its mean response length without (Len_x) and with (Len_xc) the context, joined,
    one row per model, and the relative change (with its bootstrap interval) written beside it."""
    models = summary["models"]
    fig = new_figure(6.4, max(2.2, 1.2 + 0.42 * len(models)))
    ax = fig.add_subplot()
    for i, model in enumerate(models):
        m = model["metrics"]
        len_x, len_xc = m["length_x"]["mean"], m["length_xc"]["mean"]
        if len_x is None or len_xc is None:
            ax.text(0, i, "  n/a", va="center", fontsize=7)
            continue
        ax.plot([len_x, len_xc], [i, i], color="0.6", linewidth=1.5, zorder=1)
        ax.scatter([len_x], [i], color="C0", s=28, zorder=2, label="without context (Len_x)" if i == 0 else None)
        ax.scatter([len_xc], [i], color="C1", s=28, zorder=2, label="with context (Len_xc)" if i == 0 else None)
        change = "n/a" if m.get("length_change") is None else f"{100 * m['length_change']:+.1f}%"
        ci = m.get("ci", {}).get("length_change")
        if ci is not None and m.get("length_change") is not None:
            change += f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"
        ax.annotate(change, (max(len_x, len_xc), i), xytext=(8, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(range(len(models)))
    ax.set_yticklabels([model["name"] for model in models], fontsize=8)
    ax.set_ylim(len(models) - 0.5, -0.5 - 0.6)  # first model on top, room for the legend
    left, right = ax.get_xlim()
    ax.set_xlim(max(0.0, left), right + 0.35 * (right - max(0.0, left)))  # room for the change labels
    ax.set_xlabel("mean response length (tokens)")
    ax.set_title("Length change when the context is given", fontsize=10)
    ax.legend(loc="upper left", fontsize=7, frameon=False, ncol=2)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_lengths(summary: Mapping[str, Any], path: str | os.PathLike) -> str:
    """`lengths_figure`, written to `path` (PNG)."""
    return save_figure(lengths_figure(summary), path)
