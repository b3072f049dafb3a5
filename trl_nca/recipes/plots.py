"""Figures of a comparison: accuracy per view (as in the paper's Figure 1), training curves, accuracy along training."""

from __future__ import annotations

import math
import os
import textwrap
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..eval.metrics import FEW_ITEMS
from ..eval.plots import figures_wanted, new_figure, save_figure
from .statistics import rate_denominators


def _method(run_name: str) -> str:
    return run_name.split("/")[0]


def comparison_figure(
    aggregated: Mapping[str, Mapping[str, Any]],
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]],
    title: str = "",
):
    """Acc_x and Acc_xc per model: bars at the mean over seeds, whiskers from the lowest to the highest seed, dots
    for the seeds, and each mean written above its whisker; the legend sits above the axes, clear of the bars."""
    names = list(aggregated)
    fig = new_figure(max(4.5, 1.5 + 1.3 * len(names)), 3.9)
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
            top = mean
            if stat["n"] > 1:
                ax.errorbar(
                    i + offset,
                    mean,
                    yerr=[[mean - 100 * stat["min"]], [100 * stat["max"] - mean]],
                    color="black",
                    capsize=3,
                    linewidth=1,
                )
                seeds = [100 * r[key] for r in per_seed[name] if r.get(key) is not None]
                ax.scatter([i + offset] * len(seeds), seeds, s=10, color="black", zorder=3)
                top = 100 * stat["max"]
            # 5 points above the whisker's cap (3 points high): the label never touches it
            ax.annotate(
                f"{mean:.0f}",
                (i + offset, top),
                xytext=(0, 5),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylim(0, 110)
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title or "Accuracy without and with the context", pad=22)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, frameon=False, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_comparison(
    aggregated: Mapping[str, Mapping[str, Any]],
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | os.PathLike,
    title: str = "",
) -> str:
    """`comparison_figure`, written to `path` (PNG)."""
    return save_figure(comparison_figure(aggregated, per_seed, title=title), path)


def _series(history: Mapping[str, Sequence[Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one logged term from a `compact_history`-style dict of lists, skipping missing values."""
    points = [(s, v) for s, v in zip(history.get("step", []), history.get(key, [])) if v is not None]
    if not points:
        return np.array([]), np.array([])
    steps, values = zip(*points)
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


RUN_SHADES = ("Blues", "Oranges", "Greens", "Purples")  # each method's runs: shades of its own colour


def _run_colors(k: int, count: int) -> list:
    """`count` distinguishable shades of method `k`'s colour, one per run (light to dark)."""
    from matplotlib import colormaps

    shades = colormaps[RUN_SHADES[k % len(RUN_SHADES)]]
    return [shades(0.35 + 0.5 * i / max(count - 1, 1)) for i in range(count)]


def _mean_lines(
    ax, runs: Mapping[str, Mapping[str, Sequence[Any]]], key: str, labels: Mapping[str, str] | None = None
) -> str:
    """Each run of `key` as a thin line (each run its own shade of its method's colour), and each method's mean as a
    thick one; returns a note naming where two methods' means coincide (an anchor still off trains as plain OPD), or
    an empty string."""
    by_method: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for run, history in runs.items():
        steps, values = _series(history, key)
        if steps.size:
            by_method[_method(run)].append((steps, values))
    means: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for k, (method, series) in enumerate(by_method.items()):
        for (steps, values), color in zip(series, _run_colors(k, len(series)), strict=True):
            ax.plot(steps, values, color=color, alpha=0.6, linewidth=0.8)
        common = min(len(s) for s, _ in series)
        means[method] = (series[0][0][:common], np.mean([v[:common] for _, v in series], axis=0))
        label = f"{method} (mean of {len(series)}{(labels or {}).get(method, '')})"
        # where two methods' means coincide, the first is a wide pale band and the later ones dashed, with hollow
        # markers placed between the first's, so both stay visible (and the panel's title says where they coincide)
        every = max(1, common // 8)
        ax.plot(
            *means[method],
            color=f"C{k}",
            linewidth=3.5 if k == 0 else 1.6,
            alpha=0.55 if k == 0 else 1.0,
            label=label,
            linestyle=LINE_STYLES[k % len(LINE_STYLES)],
            marker=MARKERS[k % len(MARKERS)],
            markersize=4 + 2 * (k > 0),
            markerfacecolor=f"C{k}" if k == 0 else "none",  # the later methods' markers hollow, around the first's
            markevery=(k * every // len(MARKERS) % every, every),
        )
    return _coinciding(means)


def _coinciding(means: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> str:
    """`nca = opd up to step 20` for each later method whose mean equals the first's from the first step on."""
    if len(means) < 2:
        return ""
    (first, (steps, values)), *others = means.items()
    notes = []
    for method, (_, other) in others:
        n = min(len(values), len(other))
        same = np.isclose(values[:n], other[:n], rtol=1e-6, atol=1e-12)
        upto = n if same.all() else int(np.argmin(same))
        if upto == n and n > 1:
            notes.append(f"{method} = {first} at every step")
        elif upto > 1:  # past the first logged step
            notes.append(f"{method} = {first} up to step {steps[upto - 1]:g}")
    return "; ".join(notes)


LINE_STYLES = ("-", (0, (5, 3)), (0, (1, 2)), "-.")  # solid, dashed, dotted, dash-dot: one per method
MARKERS = ("o", "s", "^", "D")


CURVE_LABELS = {
    "opd_loss": "KL(q_x || teacher) per token",
    "nca_loss": "KL(sg[q_x] || q_c) per token",
    "view_kl": "KL(q_x || q_c) per token",
    "nca_beta": "anchor weight nca_beta",
}
"""The y-axis label of each panel of `curves.png`: the logged term's divergence (docs/quickstart.md's log table)."""


def curve_panels(histories: Mapping[str, Mapping[str, Sequence[Any]]]) -> tuple[list[str], dict[str, str]]:
    """The panels of `curves.png` and the notes they carry instead of the panels left out: `view_kl` is left out
    where it equals `nca_loss` at every logged step of every run (the default divergence makes them the same
    number), and `nca_beta` where it is constant in every run (each method's weight then goes into its legend)."""
    keys = [k for k in ("opd_loss", "nca_loss", "view_kl", "nca_beta") if any(h.get(k) for h in histories.values())]
    notes: dict[str, str] = {}
    if "nca_loss" in keys and "view_kl" in keys:
        pairs = [(a, b) for h in histories.values() for a, b in zip(h.get("nca_loss") or [], h.get("view_kl") or [])]
        if all(a is None and b is None or None not in (a, b) and math.isclose(a, b, rel_tol=1e-5) for a, b in pairs):
            keys.remove("view_kl")
            notes["nca_loss"] = " (= view_kl in every run)"
    if "nca_beta" in keys:
        values = {run: {v for v in h.get("nca_beta") or [] if v is not None} for run, h in histories.items()}
        by_method: dict[str, set[float]] = defaultdict(set)
        for run, seen in values.items():
            by_method[_method(run)] |= seen
        if all(len(seen) <= 1 for seen in by_method.values()):
            keys.remove("nca_beta")
            notes.update({m: f", nca_beta {next(iter(v)):g}" for m, v in by_method.items() if v})
    return keys, notes


def curves_figure(histories: Mapping[str, Mapping[str, Sequence[Any]]]):
    """`opd_loss`, `nca_loss`, `view_kl` and `nca_beta` per optimizer step: thin lines per run (each its own shade of
    its method's colour), thick the mean, each panel's title saying where two methods' means coincide; the panels that
    repeat another or show a constant are left out (`curve_panels`)."""
    keys, notes = curve_panels(histories)
    if not keys:  # e.g. every job ran fewer optimizer steps than logging_steps
        fig = new_figure(5, 2.4)
        ax = fig.add_subplot()
        ax.text(
            0.5,
            0.5,
            "No training loss was logged\n(each job ran fewer steps than logging_steps).",
            ha="center",
            va="center",
            fontsize=9,
        )
        ax.set_axis_off()
        return fig
    fig = new_figure(3.6 * len(keys), 3.2)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(1, len(keys), i + 1)
        same = _mean_lines(ax, histories, key, labels={m: n for m, n in notes.items() if m not in CURVE_LABELS})
        ax.set_title(key + notes.get(key, "") + (f"\n({same})" if same else ""), fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(CURVE_LABELS[key])
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def plot_curves(histories: Mapping[str, Mapping[str, Sequence[Any]]], path: str | os.PathLike) -> str:
    """`curves_figure`, written to `path` (PNG)."""
    return save_figure(curves_figure(histories), path)


DIP_POINTS = 20.0
"""How far (percentage points) a method's mean held-out Acc_xc must fall below its value at step 0 for
`tracking_dips` to report the fall: less is within the seed-to-seed spread of a 32-item tracking subset."""

DIP_CAUSE = (
    "The context view moves before the no-context view has learnt the rule: training moves the weights the two views "
    "share, plain OPD trains only the no-context view, and an anchor also pulls the context view toward the "
    "no-context view (docs/results.md, section 3)."
)


def _mean_track(rows_per_run: Sequence[Sequence[Mapping[str, Any]]], key: str) -> tuple[list[int], np.ndarray]:
    common = min(len(rows) for rows in rows_per_run)
    steps = [row["step"] for row in rows_per_run[0][:common]]
    return steps, np.mean([[100 * row[key] for row in rows[:common]] for rows in rows_per_run], axis=0)


def tracking_dips(tracking: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per method, the early fall of its mean held-out Acc_xc along training, when it falls at least `DIP_POINTS`
    below step 0: `start`, `low` (the lowest mean, in %), `step` (where), `acc_x` (the mean Acc_x there), `end` and
    `end_step` (the last tracked step)."""
    by_method: dict[str, list[Sequence[Mapping[str, Any]]]] = defaultdict(list)
    for run, rows in tracking.items():
        if rows:
            by_method[_method(run)].append(rows)
    dips = {}
    for method, runs in by_method.items():
        steps, acc_xc = _mean_track(runs, "acc_xc")
        _, acc_x = _mean_track(runs, "acc_x")
        low = int(np.argmin(acc_xc))
        if acc_xc[0] - acc_xc[low] >= DIP_POINTS:
            dips[method] = {
                "start": float(acc_xc[0]),
                "low": float(acc_xc[low]),
                "step": steps[low],
                "acc_x": float(acc_x[low]),
                "end": float(acc_xc[-1]),
                "end_step": steps[-1],
            }
    return dips


def anchor_opens(curves: Mapping[str, Mapping[str, Sequence[Any]]]) -> dict[str, int | None]:
    """Per method, the first logged step at which any of its runs had a nonzero anchor weight (`nca_beta`), or None
    when the weight stayed 0 in every run (plain OPD, or a gated anchor that never opened)."""
    opens: dict[str, int | None] = {}
    for run, curve in curves.items():
        steps, betas = curve.get("step", []), curve.get("nca_beta") or []
        first = next((step for step, beta in zip(steps, betas, strict=False) if beta), None)
        method = _method(run)
        known = opens.get(method)
        opens[method] = first if known is None else (known if first is None else min(known, first))
    return opens


def tracking_reading(
    tracking: Mapping[str, Sequence[Mapping[str, Any]]], curves: Mapping[str, Mapping[str, Sequence[Any]]] | None = None
) -> str:
    """One sentence on the early fall of Acc_xc that `tracking.png` shows (measured from the tracked accuracies,
    means over seeds), with its cause; empty when no method's Acc_xc falls by `DIP_POINTS`. With the training
    `curves`, each method says whether its anchor was still off at the fall (then it trained as plain OPD, and two
    methods can read the same)."""
    dips = tracking_dips(tracking)
    if not dips:
        return ""
    opens = anchor_opens(curves or {})
    parts = []
    for method, d in dips.items():
        text = (
            f"{method}'s from {d['start']:.0f}% to {d['low']:.0f}% at step {d['step']} (Acc_x {d['acc_x']:.0f}% "
            f"there), and Acc_xc {d['end']:.0f}% at the last tracked step, {d['end_step']}"
        )
        if method in opens:
            first = opens[method]
            if first is None:
                text += " (its anchor weight nca_beta was 0 throughout: no anchor acted)"
            elif first > d["step"]:
                text += f" (its anchor still off then: nca_beta 0 until step {first})"
        parts.append(text)
    return f"Along training the held-out Acc_xc first falls, {'; '.join(parts)}. {DIP_CAUSE}"


TRACK_PANELS = (("acc_x", "Acc_x (without context)"), ("acc_xc", "Acc_xc (with context)"))


def tracking_figure(tracking: Mapping[str, Sequence[Mapping[str, Any]]]):
    """Held-out Acc_x and Acc_xc along training (the subset evaluated every `track_every` steps); the early fall of
    Acc_xc (`tracking_dips`) is marked on its panel, its cause under the figure. A panel whose accuracy is the same
    at every tracked step of every run is left out, and a line under the figure says so."""
    dips = tracking_dips(tracking)
    methods = list(dict.fromkeys(_method(run) for run, rows in tracking.items() if rows))
    panels, notes = [], []
    for key, label in TRACK_PANELS:
        values = {round(100 * row[key], 1) for rows in tracking.values() for row in rows}
        if len(values) == 1:
            notes.append(f"{label.split(' ')[0]} is not drawn: {values.pop():.0f}% at every tracked step of every run.")
        else:
            panels.append((key, label))
    if dips:
        lows = ", ".join(
            f"{m} {d['low']:.0f}% at step {d['step']} (Acc_x {d['acc_x']:.0f}% then)" for m, d in dips.items()
        )
        notes += [
            f"v: the lowest mean Acc_xc, {lows}.",
            "The context view moves before the no-context view has learnt the rule (docs/results.md, section 3).",
        ]
    width = 4 * max(1, len(panels))
    notes = [line for note in notes for line in textwrap.wrap(note, int(15 * width))]  # about 15 characters an inch
    height = 3.2 + 0.13 * len(notes)
    fig = new_figure(width, height)
    for i, (key, label) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        scaled = {
            run: {"step": [row["step"] for row in rows], key: [100 * row[key] for row in rows]}
            for run, rows in tracking.items()
        }
        _mean_lines(ax, scaled, key)  # accuracies on a few items agree by chance: no note where the means coincide
        ax.set_title(label)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("held-out accuracy (%)")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        if i == 0:  # one legend per figure
            ax.legend(fontsize=7, frameon=False)
        if key == "acc_xc":
            for method, d in dips.items():
                ax.plot([d["step"]], [d["low"]], marker="v", color=f"C{methods.index(method)}", markersize=8, zorder=4)
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=7)
        fig.tight_layout(rect=(0, (0.08 + 0.12 * len(notes)) / height, 1, 1))  # 7-point lines: 0.12 inch each
    else:
        fig.tight_layout()
    return fig


def plot_tracking(tracking: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike) -> str:
    """`tracking_figure`, written to `path` (PNG)."""
    return save_figure(tracking_figure(tracking), path)


def harm_figure(per_seed: Mapping[str, Sequence[Mapping[str, Any]]], title: str = "", n_items: int | None = None):
    """Harm per run, per model: a box (quartiles, whiskers to min and max) and one dot per run (organism x seed). With
    `n_items` (the evaluated items), a run whose harm divides by fewer than `FEW_ITEMS` items right without the context
    is a hollow dot, left out of the box, and a note says so: a rate of so few items is not one to read."""
    names = list(per_seed)
    fig = new_figure(max(4.0, 1.2 + 1.1 * len(names)), 3.4)
    ax = fig.add_subplot()
    rng = np.random.default_rng(0)  # horizontal jitter of the dots only
    any_few = False
    for i, name in enumerate(names):
        rows = [row for row in per_seed[name] if row.get("harm") is not None]
        if not rows:
            ax.text(i, 2, "n/a", ha="center", fontsize=8)
            continue
        few = [
            n_items is not None and rate_denominators(row, n_items).get("harm", FEW_ITEMS) < FEW_ITEMS for row in rows
        ]
        values = np.array([100 * row["harm"] for row in rows])
        solid = values[~np.array(few)]
        if len(solid) > 1:
            ax.boxplot([solid], positions=[i], widths=0.5, whis=(0, 100), showfliers=False, manage_ticks=False)
        x = i + rng.uniform(-0.12, 0.12, len(values))
        for hollow in (False, True):
            pick = np.array(few) == hollow
            if pick.any():
                face = "none" if hollow else f"C{i}"
                ax.scatter(x[pick], values[pick], s=14, facecolors=face, edgecolors=f"C{i}", zorder=3)
        any_few = any_few or any(few)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylim(-3, 103)
    ax.set_ylabel("harm (%)")
    ax.set_title(title or "Harm per run: P(wrong with the context | right without it)")
    ax.grid(axis="y", alpha=0.3)
    if any_few:
        ax.text(
            0.99,
            0.97,
            f"hollow: fewer than {FEW_ITEMS} items right without the context (too few to read)",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=7,
        )
    fig.tight_layout()
    return fig


def plot_harm(
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | os.PathLike,
    title: str = "",
    n_items: int | None = None,
) -> str:
    """`harm_figure`, written to `path` (PNG)."""
    return save_figure(harm_figure(per_seed, title=title, n_items=n_items), path)


def write_figures(summary: Mapping[str, Any], folder: str | os.PathLike, prefix: str = "") -> dict[str, str]:
    """All figures of a comparison, drawn from its summary (`comparison.json`) alone, so they can be redrawn from the
    saved JSON: `{prefix}comparison.png`, `{prefix}harm.png` (harm per run), `{prefix}curves.png` and, when accuracy
    was tracked, `{prefix}tracking.png`; none (and one logged line) without matplotlib."""
    folder = Path(folder)
    if not figures_wanted(None, folder):  # without matplotlib: skipped, with one line saying so
        return {}
    title = summary.get("title") or summary["task"]
    figures = {
        "comparison": plot_comparison(
            summary["aggregated"], summary["per_seed"], folder / f"{prefix}comparison.png", title=title
        ),
        "harm": plot_harm(
            summary["per_seed"],
            folder / f"{prefix}harm.png",
            title=f"{title}: harm per run",
            n_items=summary.get("num_test"),
        ),
        "curves": plot_curves(summary["curves"], folder / f"{prefix}curves.png"),
    }
    if any(summary.get("tracking", {}).values()):
        figures["tracking"] = plot_tracking(summary["tracking"], folder / f"{prefix}tracking.png")
    return figures
