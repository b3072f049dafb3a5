"""One column specification (`trl_nca.eval.columns`) feeds the paired report, the comparison's table and legend, its
statistics and the games' summary: every column a table is flagged for is there with its definition, and a column
the same for every model is left out with a line saying so."""

import re
from pathlib import Path

from trl_nca.eval import columns
from trl_nca.eval.games import game_summary
from trl_nca.eval.metrics import compute_metrics
from trl_nca.eval.records import PairedRecord, ViewOutcome
from trl_nca.eval.report import render_markdown
from trl_nca.recipes.statistics import ORGANISM_KEYS, STAT_KEYS, SUMMARY_KEYS, aggregate, render_table, table_legend
from trl_nca.testing import load_script


def view(correct, tokens=10, truncated=False, failure=False, **extra):
    return ViewOutcome("text", None, bool(correct), tokens, truncated, failure, extra)


def records(cx, cxc, len_x, len_xc):
    return [
        PairedRecord(str(i), view(a, lx), view(b, lc)) for i, (a, b, lx, lc) in enumerate(zip(cx, cxc, len_x, len_xc))
    ]


def varied_records(seed: int, n: int = 12, right_x: float = 0.5, right_xc: float = 0.5):
    """Items whose every outcome (right, length, truncated, format failure) varies with `seed`."""
    import random

    rng = random.Random(seed)

    def outcome(right):
        return view(rng.random() < right, rng.randint(2, 9), rng.random() < 0.3, rng.random() < 0.3)

    return [PairedRecord(str(i), outcome(right_x), outcome(right_xc)) for i in range(n)]


def summary(models):
    return {
        "title": "t",
        "alpha": 0.05,
        "confidence": 0.95,
        "n_bootstrap": 0,
        "bootstrap_seed": 0,
        "versions": {},
        "models": [{"name": name, "metrics": compute_metrics(recs, n_bootstrap=0)} for name, recs in models],
    }


def _header(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("| Model |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_each_table_shows_and_defines_the_columns_it_is_flagged_for():
    """The report's main table and the definitions above it, the comparison's table and legend, the statistics and
    the games' summary all come from the spec: a column added there with a table's flag shows up in that table."""
    varied = summary([("base", varied_records(0, 12)), ("student", varied_records(1, 17, 0.9, 0.1))])
    report = render_markdown(varied)
    shown = [c for c in columns.COLUMNS if columns.REPORT in c.tables]
    assert _header(report) == ["Model", *(c.name for c in shown)]
    for column in shown:
        assert f"- {column.legend()}" in report  # defined once, above the table

    per_seed = {
        name: [{**{k: m["metrics"][k] for k in SUMMARY_KEYS}, "regime": "C", "seed": 0}]
        for name, m in zip(("base", "opd"), varied["models"], strict=True)
    }
    table = render_table(aggregate(per_seed, SUMMARY_KEYS), per_seed, SUMMARY_KEYS, n_items=4)
    flagged = [c for c in columns.COLUMNS if columns.COMPARISON in c.tables]
    assert _header(table) == ["Model", "runs", *(c.name for c in flagged)]
    legend = table_legend(SUMMARY_KEYS)
    assert all(column.legend() in legend for column in flagged)
    assert set(STAT_KEYS) == set(columns.keys(columns.STATISTICS))
    assert set(ORGANISM_KEYS) == set(columns.keys(columns.ORGANISMS))

    game = game_summary(
        [
            PairedRecord(
                str(i),
                view(i % 2, steps=1, invalid_moves=0, reward=0.0),
                view(1, steps=2, invalid_moves=0, reward=1.0),
                meta={"oracle_solvable": True},
            )
            for i in range(4)
        ],
        n_bootstrap=0,
    )
    renamed = columns.game_names()
    for key in columns.game_keys():
        assert renamed.get(key, key) in game
    assert game["win_rate_x"] == 0.5 and game["both_won"] == 0.5 and "acc_x" not in game


def test_a_column_the_same_for_every_model_is_left_out_with_a_line():
    same_length = summary(
        [
            ("base", records([1, 1, 0, 0], [1, 0, 1, 1], [6, 6, 6, 6], [6, 6, 6, 6])),
            ("student", records([1, 0, 0, 0], [1, 1, 0, 1], [6, 6, 6, 6], [6, 6, 6, 6])),
        ]
    )
    report = render_markdown(same_length)
    header = _header(report)
    assert "Len_x" not in header and "Length change" not in header and "Trunc_x" not in header
    assert "Acc_x" in header and "Harm" in header  # the quantities every reading uses stay
    left = next(line for line in report.splitlines() if line.startswith("Left out, the same for every model:"))
    assert "Len_x 6.0" in left and "Length change 0.0" in left and "FF_x 0.0" in left
    assert "- Len_x:" not in report  # a column left out is not defined either
    assert "`lengths.png` is not drawn: every model's replies average 6.0 tokens" in report

    per_seed = {
        "base": [{"acc_x": 0.0, "acc_xc": 1.0, "length_change": 0.0, "regime": "B", "organism": 0}],
        "opd": [{"acc_x": 0.5, "acc_xc": 0.5, "length_change": 0.0, "regime": "C", "organism": 0, "seed": 1}],
    }
    keys = ("acc_x", "acc_xc", "length_change")
    table = render_table(aggregate(per_seed, keys), per_seed, keys)
    assert (
        "Length change" not in table.splitlines()[0]
        and "Left out, the same for every model: Length change 0.0." in table
    )
    # organisms are organisms and seeds are seeds in the per-run table
    assert "| Model | organism | seed | Acc_x | Acc_xc | Regime |" in table
    assert re.search(r"^\| opd \| 0 \| 1 \| 50\.0 \|", table, re.M) and re.search(r"^\| base \| 0 \| - \|", table, re.M)


def _metric_table_script():
    return load_script(Path(__file__).resolve().parents[2] / "scripts" / "metric_table.py")


def test_the_evaluation_page_holds_the_metric_table_of_the_spec():
    """docs/evaluation.md's metric table is the spec's (`columns.metric_table`): after a metric is added to the spec,
    `python scripts/metric_table.py` writes it there."""
    script = _metric_table_script()
    page = script.PAGE.read_text(encoding="utf-8")
    assert script.render(page) == page, "docs/evaluation.md is out of date: run python scripts/metric_table.py"
    for column in columns.COLUMNS:
        assert (f"| `{column.key}` |" in page) == (column.definition is not None), column.key


def test_every_rate_of_the_spec_is_computed_defined_and_interval_bounded():
    """A paired metric is one entry of the spec: `compute_metrics` computes every rate the spec declares (with its
    bootstrap interval), in the spec's order, and each has its line in the metric table."""
    metrics = compute_metrics(varied_records(0), n_bootstrap=50)
    rates = [c.key for c in columns.rated()]
    assert [key for key in metrics if key in rates] == rates
    assert list(metrics["ci"]) == rates
    assert all(c.definition for c in columns.rated())


def test_a_summary_written_before_a_column_existed_renders_without_it_and_says_so():
    """A summary.json of an earlier trl-nca (docs/quickstart's holds no harm floor) is still a report: the columns it
    lacks are named, not a KeyError."""
    older = summary([("base", varied_records(0, 12)), ("student", varied_records(1, 17, 0.9, 0.1))])
    for model in older["models"]:
        for key in ("harm_floor", "harm_excess"):
            del model["metrics"][key]
    report = render_markdown(older)
    header = _header(report)
    assert "Harm" in header and "Harm floor" not in header and "Excess harm" not in header
    assert (
        "Not in this summary (written by an earlier trl-nca): Harm floor, Excess harm. Run the evaluation again"
        in report
    )
