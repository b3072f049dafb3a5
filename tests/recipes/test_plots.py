"""The figures say something: no label hides behind another artist, no panel repeats another or shows a constant,
every panel has axis labels, the early fall of Acc_xc is marked and explained, small denominators are shown as such.
Drawn from the committed run summaries of docs/results/data/ and from hand-made paired summaries."""

import copy
import json
from pathlib import Path

import pytest


pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]


def summary(name: str) -> dict:
    return json.loads((ROOT / "docs" / "results" / "data" / f"{name}.json").read_text())


def extents(fig, artists):
    """Each artist's drawn box in pixels; for a collection (whiskers, dots) the box of each of its pieces, from its
    data (a collection's own window extent spans the axes)."""
    from matplotlib.collections import LineCollection, PathCollection
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    boxes = []
    for a in artists:
        if isinstance(a, LineCollection):
            boxes.append([Bbox(a.get_transform().transform(seg)) for seg in a.get_segments()])
        elif isinstance(a, PathCollection):
            points = a.get_offset_transform().transform(a.get_offsets())
            boxes.append([Bbox([p - 2, p + 2]) for p in points])
        else:
            boxes.append([a.get_window_extent(renderer)])
    return boxes


def overlapping(fig, first, second) -> list:
    """Pairs of artists of `first` and `second` whose drawn boxes overlap."""
    a, b = extents(fig, first), extents(fig, second)
    return [
        (x, y)
        for x, boxes_x in zip(first, a)
        for y, boxes_y in zip(second, b)
        if x is not y and any(bx.overlaps(by) for bx in boxes_x for by in boxes_y)
    ]


@pytest.mark.parametrize("name", ["org-main", "units-shift", "org-sweep"])
def test_comparison_value_labels_clear_of_whiskers_dots_and_legend(name):
    from trl_nca.recipes.plots import comparison_figure

    data = summary(name)
    fig = comparison_figure(data["aggregated"], data["per_seed"], title=name)
    fig.canvas.draw()
    (ax,) = fig.axes
    labels = list(ax.texts)
    assert len(labels) == sum(
        data["aggregated"][m].get(k) is not None for m in data["aggregated"] for k in ("acc_x", "acc_xc")
    )
    caps = [line for line in ax.lines if line.get_marker() not in (None, "None", "none", "")]
    whiskers = list(ax.collections) + caps  # errorbar lines, their caps, the seeds' dots
    assert not overlapping(fig, labels, whiskers), "a value label sits on a whisker or a seed's dot"
    assert not overlapping(fig, labels, [ax.get_legend()]), "a value label sits under the legend"
    assert not overlapping(fig, labels, labels)
    assert ax.get_ylabel()


def test_curves_leave_out_the_repeated_and_the_constant_panels():
    from trl_nca.recipes.plots import curve_panels, curves_figure

    data = summary("units-shift")  # the default divergence: view_kl == nca_loss; constant nca_beta per method
    keys, notes = curve_panels(data["curves"])
    assert keys == ["opd_loss", "nca_loss"] and notes["nca"] == ", nca_beta 0.5" and "view_kl" in notes["nca_loss"]
    fig = curves_figure(data["curves"])
    assert [ax.get_title() for ax in fig.axes] == ["opd_loss", "nca_loss (= view_kl in every run)"]
    assert all(ax.get_ylabel() and ax.get_xlabel() for ax in fig.axes)
    assert "nca (mean of 16, nca_beta 0.5)" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]

    gated = summary("org-gated")["curves"]  # a scheduled anchor: the nca_beta panel stays
    assert curve_panels(gated)[0] == ["opd_loss", "nca_loss", "nca_beta"]
    apart = copy.deepcopy(data["curves"])  # another divergence: view_kl differs from nca_loss, and is drawn
    run = next(iter(apart))
    apart[run]["view_kl"] = [None if v is None else 2 * v + 1 for v in apart[run]["view_kl"]]
    assert curve_panels(apart)[0] == ["opd_loss", "nca_loss", "view_kl"]
    assert all(ax.get_ylabel() for ax in curves_figure(gated).axes)


def test_tracking_marks_the_early_fall_of_acc_xc_and_says_why():
    from trl_nca.recipes.plots import DIP_POINTS, tracking_dips, tracking_figure, tracking_reading

    tracking = summary("org-main")["tracking"]
    dips = tracking_dips(tracking)
    # docs/results.md section 3: OPD's context view falls to about 20% around step 15 while Acc_x is still near 0
    assert dips["opd"]["step"] == 15 and dips["opd"]["low"] == pytest.approx(20.4, abs=0.5)
    assert dips["opd"]["acc_x"] < 5 and dips["opd"]["start"] - dips["opd"]["low"] >= DIP_POINTS
    reading = tracking_reading(tracking)
    assert "opd's from 100% to 20% at step 15" in reading and "docs/results.md, section 3" in reading
    fig = tracking_figure(tracking)
    markers = [line for line in fig.axes[1].lines if line.get_marker() == "v"]
    assert [(m.get_xdata()[0], round(m.get_ydata()[0])) for m in markers] == [(15, 20), (10, 0)]
    assert "docs/results.md" in " ".join(t.get_text() for t in fig.texts)
    assert all(ax.get_ylabel() and ax.get_xlabel() for ax in fig.axes)
    flat = {run: [{**row, "acc_xc": 1.0} for row in rows] for run, rows in tracking.items()}
    assert tracking_dips(flat) == {} and tracking_reading(flat) == ""
    # a panel the same for every run is left out, with a line saying so
    figure = tracking_figure(flat)
    assert [ax.get_title() for ax in figure.axes] == ["Acc_x (without context)"]
    (note,) = [" ".join(t.get_text().split()) for t in figure.texts]
    assert note == "Acc_xc is not drawn: 100% at every tracked step of every run."


def test_overlapping_method_lines_stay_apart_and_the_reading_says_when_the_anchor_was_off():
    """Where the gated anchor is still off, NCA's mean line lies on OPD's: each method's mean has its own line style
    and marker (later ones hollow), one legend per figure; the reading says the anchor was off at the fall."""
    from trl_nca.recipes.plots import curves_figure, tracking_figure, tracking_reading

    data = summary("org-main")
    same = {run.replace("opd/", "nca/"): rows for run, rows in data["tracking"].items() if run.startswith("opd/")}
    tracking = {**{r: rows for r, rows in data["tracking"].items() if r.startswith("opd/")}, **same}
    fig = tracking_figure(tracking)
    means = [line for line in fig.axes[0].lines if line.get_linewidth() > 1.5]
    assert len(means) == 2 and means[0].get_linestyle() != means[1].get_linestyle()
    assert means[0].get_marker() != means[1].get_marker() and means[1].get_markerfacecolor() == "none"
    assert sum(ax.get_legend() is not None for ax in fig.axes) == 1
    assert sum(ax.get_legend() is not None for ax in curves_figure(data["curves"]).axes) == 1
    # issue 57: each run has its own shade of its method's colour, and a panel says where two means coincide
    runs = [line for line in fig.axes[0].lines if line.get_linewidth() < 1.5]
    assert len({tuple(line.get_color()) for line in runs}) == len(runs) == len(tracking)
    shift = summary("units-shift")["curves"]
    thin = [line.get_color() for line in curves_figure(shift).axes[0].lines if line.get_linewidth() < 1.5]
    assert len({tuple(c) for c in thin}) == len(thin) == 32
    assert all("\n(" not in ax.get_title() for ax in curves_figure(shift).axes)  # the means differ from the start
    off = {run: h for run, h in shift.items() if run.startswith("opd/")}  # an anchor that never acted
    off.update({run.replace("opd/", "nca/"): h for run, h in off.items()})
    titles = [ax.get_title() for ax in curves_figure(off).axes]
    assert titles and all(title.endswith("\n(nca = opd at every step)") for title in titles), titles
    late = {run: copy.deepcopy(h) for run, h in off.items()}  # the anchor opens at the third logged step
    for run, h in late.items():
        if run.startswith("nca/"):
            h["opd_loss"] = h["opd_loss"][:2] + [v * 1.5 for v in h["opd_loss"][2:]]
    step = shift[next(iter(shift))]["step"][1]
    assert curves_figure(late).axes[0].get_title().endswith(f"(nca = opd up to step {step:g})")

    steps = list(range(5, 105, 5))
    curves = {
        "opd/seed0": {"step": steps, "nca_beta": [0.0] * 20},
        "nca/seed0": {"step": steps, "nca_beta": [0.0] * 6 + [0.05] * 14},
    }
    reading = tracking_reading(tracking, curves)
    assert "opd's from" in reading and "(its anchor weight nca_beta was 0 throughout: no anchor acted)" in reading
    assert "(its anchor still off then: nca_beta 0 until step 35)" in reading


def paired(models):
    """A paired summary as `write_report` gives it, for `(name, n, n_correct_x, harm_count, help_count)`."""
    out = []
    for name, n, right, harm, help_ in models:
        metrics = {
            "n": n,
            "n_correct_x": right,
            "harm_count": harm,
            "help_count": help_,
            "acc_x": right / n,
            "acc_xc": (right - harm + help_) / n,
            "harm": harm / right if right else None,
            "help": help_ / (n - right) if n - right else None,
            "length_x": {"mean": 10.0 + right},
            "length_xc": {"mean": 12.0},
            "ci": {},
        }
        metrics["length_change"] = (12.0 - metrics["length_x"]["mean"]) / metrics["length_x"]["mean"]
        out.append({"name": name, "metrics": metrics})
    return {"models": out}


def test_harm_help_gives_counts_and_hatches_the_few():
    from trl_nca.eval.plots import harm_help_figure

    fig = harm_help_figure(paired([("base", 36, 35, 6, 1), ("student", 40, 30, 3, 4)]))
    fig.canvas.draw()
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["6/35", "3/30", "1/1\nfew", "4/10"]
    hatched = [bool(p.get_hatch()) for p in ax.patches]
    assert hatched == [False, False, True, False]  # harm base, harm student, help base (1 item), help student
    assert not overlapping(fig, list(ax.texts), [ax.get_legend()])


def test_lengths_figure_shows_the_length_change_per_model():
    from trl_nca.eval.plots import lengths_figure

    models = [(f"m{i}/seed{i}", 20, i, 0, 0) for i in range(15)]
    fig = lengths_figure(paired(models))
    fig.canvas.draw()
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [m[0] for m in models]  # one readable row per model
    assert [t.get_text() for t in ax.texts][:2] == ["+20.0%", "+9.1%"]  # 10 -> 12 tokens, 11 -> 12
    assert ax.get_xlabel() and not overlapping(fig, list(ax.get_yticklabels()), list(ax.get_yticklabels()))


def test_harm_per_run_draws_rates_of_few_items_hollow():
    """fr-30's base answers almost nothing right without the context, so its harm divides by 0.2 items: a hollow dot,
    with the note saying why; the students' harms (about 200 items each) stay solid."""
    from trl_nca.recipes.plots import harm_figure

    data = summary("fr-30-fast")
    fig = harm_figure(data["per_seed"], n_items=data["num_test"])
    (ax,) = fig.axes
    hollow = [len(c.get_offsets()) for c in ax.collections if len(c.get_facecolors()) == 0]
    solid = [len(c.get_offsets()) for c in ax.collections if len(c.get_facecolors()) > 0]
    assert hollow == [1] and solid == [3, 3]  # the base; opd's and nca's three seeds
    assert any(t.get_text().startswith("hollow: fewer than 10 items") for t in ax.texts)
    (ax,) = harm_figure(data["per_seed"]).axes  # without the item count nothing is known to be few
    assert all(len(c.get_facecolors()) > 0 for c in ax.collections) and not ax.texts
