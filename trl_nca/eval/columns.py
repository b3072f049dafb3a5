"""The paired metrics, declared once: how each is computed, defined, headed and shown.

One `Column` per metric says how `trl_nca.eval.metrics.compute_metrics` computes it from the items' paired outcomes
(`rate`; its bootstrap interval comes with it), its definition in docs/evaluation.md's metric table (`definition`:
`metric_table` writes that table, `scripts/metric_table.py` puts it on the page and `tests/eval/test_columns.py` checks
it), its header, what it means (the legend under each table and at the top of `report.md` are written from it), how a
cell is written, which tables show it, and its name in a game's summary (a win rate is an accuracy).
`trl_nca.eval.metrics`, `trl_nca.eval.report` (the paired report), `trl_nca.recipes.statistics` (the comparison's
tables and statistics) and `trl_nca.eval.games` (the games' summary) read this list, so a new paired metric is one
entry here (docs/extending.md). The order of the entries is the order of the tables' columns, and the rates keep it in
`compute_metrics`' output.

A column whose cells are the same for every model (and run) is left out of a table, with one line saying so
(`constant_columns`), unless it is one of the quantities every reading uses (`always`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


REPORT = "report"  # report.md's main table (`trl_nca.eval.report`)
COMPARISON = "comparison"  # the table of `trl-nca compare` (`trl_nca.recipes.statistics.render_table`)
STATISTICS = "statistics"  # its statistics over runs (distributions, paired differences)
ORGANISMS = "organisms"  # its differences over organisms
GAME = "game"  # a game's summary (`trl_nca.eval.games.game_summary`)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den elementwise, NaN where den == 0 (an undefined rate: None in `compute_metrics`, never 0)."""
    num = np.asarray(num, dtype=float)
    den = np.asarray(den, dtype=float)
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out


@dataclass(frozen=True)
class Column:
    """One paired metric, as `compute_metrics` computes it and as a table column.

    `key` is the metric's key in `compute_metrics` (and in a comparison's per-seed rows); `kind` says how a cell is
    written: `rate` (in %), `rate_ci` (in % with its bootstrap interval), `tokens` (a mean length), `p` (a p-value),
    `count` or `label` (a word). `count` names the count a conditional rate divides (`harm_count` of the items right
    without the context, `help_count` of those wrong without it). `game` is the key in a game's summary, where it
    differs. `run_ci`: the per-run rows of a comparison's table show the rate's interval too (each run's own, over
    items). `rate` computes the metric from a `trl_nca.eval.metrics.PairedArrays` whose arrays hold one row per sample
    of the items (the items themselves, then each bootstrap resample: `correct_x` of shape (rows, n), ...; `samples`
    is k), one value per row; None for a metric `compute_metrics` writes itself (`n`, `length_x`, `mcnemar_p`,
    `regime`). `definition` is its line in docs/evaluation.md's metric table (None: not in that table)."""

    key: str
    name: str
    means: str
    kind: str = "rate"
    tables: frozenset[str] = frozenset({REPORT})
    count: str | None = None
    game: str | None = None
    always: bool = False
    run_ci: bool = False
    rate: Callable[[Any], np.ndarray] | None = None
    definition: str | None = None

    def legend(self) -> str:
        return f"{self.name}: {self.means}"


def harm_items(a) -> np.ndarray:
    """The items right without the context and wrong with it, per row (expected counts with k samples per view)."""
    return (a.correct_x * (1 - a.correct_xc)).sum(1)


def help_items(a) -> np.ndarray:
    """The items wrong without the context and right with it, per row."""
    return ((1 - a.correct_x) * a.correct_xc).sum(1)


def no_effect_terms(correct_x: np.ndarray, correct_xc: np.ndarray, samples: int) -> np.ndarray:
    """Per item, the expected harm term p_x (1 - p_xc) (equally, help term) were the item's 2k samples exchangeable
    between the views: s (m - s) / (m (m - 1)) for s right answers among m = 2k samples (docs/evaluation.md, the harm
    floor)."""
    m = 2 * samples
    right = (correct_x + correct_xc) * samples
    return right * (m - right) / (m * (m - 1))


def no_effect_items(a) -> np.ndarray:
    """The harm (equally, help) items a context with no effect gives, per row (`no_effect_terms` summed)."""
    return no_effect_terms(a.correct_x, a.correct_xc, a.samples).sum(1)


_ALL = frozenset({REPORT, COMPARISON})
_STATS = frozenset({REPORT, COMPARISON, STATISTICS})


COLUMNS = (
    Column("n", "n", "the items evaluated.", "count", frozenset({REPORT, GAME}), always=True),
    Column(
        "acc_x",
        "Acc_x",
        "accuracy without the context (the share of items answered right).",
        "rate_ci",
        _STATS | {ORGANISMS, GAME},
        game="win_rate_x",
        always=True,
        rate=lambda a: a.correct_x.mean(1),
        definition="mean of `x_i`",
    ),
    Column(
        "acc_xc",
        "Acc_xc",
        "accuracy with the context.",
        "rate_ci",
        _STATS | {GAME},
        game="win_rate_xc",
        always=True,
        rate=lambda a: a.correct_xc.mean(1),
        definition="mean of `xc_i`",
    ),
    Column(
        "delta",
        "Delta",
        "Acc_xc - Acc_x, in percentage points.",
        "rate_ci",
        _ALL | {GAME},
        always=True,
        rate=lambda a: a.correct_xc.mean(1) - a.correct_x.mean(1),
        definition="`acc_xc - acc_x` (= `(help_count - harm_count) / n`)",
    ),
    Column(
        "harm",
        "Harm",
        "P(wrong with the context | right without it): of the items right without the context, "
        "the share the context made wrong.",
        "rate_ci",
        _STATS | {ORGANISMS, GAME},
        count="harm_count",
        always=True,
        rate=lambda a: ratio(harm_items(a), a.correct_x.sum(1)),
        definition="P(wrong with c \\| correct without c) = `harm_count / #{x_i = 1}`; undefined (None) when nothing is "
        "correct without c",
    ),
    Column(
        "harm_unconditional",
        "Harm (uncond.)",
        "the share of all items right without the context and wrong with it.",
        rate=lambda a: harm_items(a) / a.correct_x.shape[1],
        definition="`harm_count / n`, where `harm_count = #{x_i = 1, xc_i = 0}`",
    ),
    Column(
        "help",
        "Help",
        "P(right with the context | wrong without it): of the items wrong without the context, the "
        "share the context made right.",
        "rate_ci",
        _ALL | {GAME},
        count="help_count",
        always=True,
        rate=lambda a: ratio(help_items(a), a.correct_x.shape[1] - a.correct_x.sum(1)),
        definition="P(correct with c \\| wrong without c) = `help_count / #{x_i = 0}`; undefined when nothing is wrong "
        "without c",
    ),
    Column(
        "help_unconditional",
        "Help (uncond.)",
        "the share of all items wrong without the context and right with it.",
        tables=frozenset(),
        rate=lambda a: help_items(a) / a.correct_x.shape[1],
        definition="`help_count / n`, where `help_count = #{x_i = 0, xc_i = 1}`",
    ),
    Column(
        "harm_floor",
        "Harm floor",
        "the harm a context with no effect gives, from each item's own success rate over its samples of both views "
        "(docs/evaluation.md#the-harm-floor).",
        tables=_ALL,
        rate=lambda a: ratio(no_effect_items(a), a.correct_x.sum(1)),
        definition="`sum_i u_i / sum_i x_i`, with `u_i = s_i (m - s_i) / (m (m - 1))` for the `s_i` right answers among "
        "the item's `m = 2k` samples: the harm of a context with no effect ([the harm floor](#the-harm-floor))",
    ),
    Column(
        "harm_excess",
        "Excess harm",
        "Harm - Harm floor, in percentage points: the harm beyond the sampling noise of the items' own success rates.",
        "rate_ci",
        _STATS,
        run_ci=True,
        rate=lambda a: ratio(harm_items(a) - no_effect_items(a), a.correct_x.sum(1)),
        definition="`harm - harm_floor`",
    ),
    Column(
        "help_floor",
        "Help floor",
        "the help a context with no effect gives (as Harm floor).",
        rate=lambda a: ratio(no_effect_items(a), a.correct_x.shape[1] - a.correct_x.sum(1)),
        definition="`sum_i u_i / sum_i (1 - x_i)`: the help of a context with no effect",
    ),
    Column(
        "help_excess",
        "Excess help",
        "Help - Help floor, in percentage points.",
        "rate_ci",
        rate=lambda a: ratio(help_items(a) - no_effect_items(a), a.correct_x.shape[1] - a.correct_x.sum(1)),
        definition="`help - help_floor`",
    ),
    Column(
        "both_correct",
        "BothCorrect",
        "the share of items right in both views.",
        tables=_STATS | {ORGANISMS, GAME},
        game="both_won",
        rate=lambda a: (a.correct_x * a.correct_xc).mean(1),
        definition="fraction of items right in both views (BothWon for games)",
    ),
    Column(
        "both_wrong",
        "BothWrong",
        "the share of items wrong in both views.",
        tables=frozenset({REPORT, GAME}),
        game="both_lost",
        rate=lambda a: ((1 - a.correct_x) * (1 - a.correct_xc)).mean(1),
        definition="fraction of items wrong in both views (BothLost for games)",
    ),
    Column(
        "format_failure_x",
        "FF_x",
        "format failures without the context: the share of answers the scorer could not parse (they count as wrong).",
        rate=lambda a: a.format_failure_x.mean(1),
        definition="fraction of responses without c the scorer could not parse",
    ),
    Column(
        "format_failure_xc",
        "FF_xc",
        "format failures with the context.",
        rate=lambda a: a.format_failure_xc.mean(1),
        definition="fraction of responses with c the scorer could not parse",
    ),
    Column(
        "length_x",
        "Len_x",
        "the mean reply length without the context, in tokens.",
        "tokens",
        definition="mean, median and p90 of response tokens without c",
    ),
    Column(
        "length_xc",
        "Len_xc",
        "the mean reply length with the context, in tokens.",
        "tokens",
        definition="mean, median and p90 of response tokens with c",
    ),
    Column(
        "truncated_x",
        "Trunc_x",
        "the share of replies without the context cut at the token budget.",
        rate=lambda a: a.truncated_x.mean(1),
        definition="fraction of responses without c cut at `max_new_tokens`",
    ),
    Column(
        "truncated_xc",
        "Trunc_xc",
        "the share of replies with the context cut at the token budget.",
        rate=lambda a: a.truncated_xc.mean(1),
        definition="fraction of responses with c cut at `max_new_tokens`",
    ),
    Column(
        "length_change",
        "Length change",
        "Len_xc / Len_x - 1: how much longer the replies are with the context, in %.",
        tables=_ALL,
        rate=lambda a: ratio(a.length_xc.mean(1) - a.length_x.mean(1), a.length_x.mean(1)),
        definition="`(mean len_xc - mean len_x) / mean len_x`",
    ),
    Column(
        "mcnemar_p",
        "McNemar p",
        "the exact McNemar test of the harm and help counts (with several samples per view the "
        "paired permutation test over items, marked perm).",
        "p",
        frozenset({REPORT, GAME}),
        definition="exact two-sided McNemar p-value on (`harm_count`, `help_count`)",
    ),
    Column(
        "regime",
        "Regime",
        "A = adding the context significantly lowers accuracy (harm above help), B = it "
        "significantly raises it (help above harm), C = no significant difference (alpha 0.05; "
        "docs/evaluation.md#regimes).",
        "label",
        _ALL | {GAME},
        always=True,
    ),
)

BY_KEY = {column.key: column for column in COLUMNS}


def keys(table: str) -> tuple[str, ...]:
    """The metric keys a table shows, in order (`regime` and `n`, written apart, left out)."""
    return tuple(c.key for c in COLUMNS if table in c.tables and c.kind not in ("label", "count"))


def run_interval_keys() -> tuple[str, ...]:
    """The metric keys whose interval the per-run rows of a comparison's table show (`Column.run_ci`)."""
    return tuple(c.key for c in COLUMNS if c.run_ci)


def names() -> dict[str, str]:
    """Each metric key's header."""
    return {c.key: c.name for c in COLUMNS}


def game_names() -> dict[str, str]:
    """A metric key -> its key in a game's summary, where it differs (a win rate is an accuracy)."""
    return {c.key: c.game for c in COLUMNS if c.game}


def game_keys() -> tuple[str, ...]:
    """The metric keys a game's summary holds (before its renames, `game_names`), each rate followed by its count."""
    out: list[str] = []
    for column in COLUMNS:
        if GAME in column.tables:
            out += [column.key, *([column.count] if column.count else [])]
    return tuple(out)


def legend(shown: Iterable[str]) -> list[str]:
    """One definition per shown column (metric keys), in the order of `COLUMNS`."""
    wanted = set(shown)
    return [c.legend() for c in COLUMNS if c.key in wanted]


def constant_columns(shown: Sequence[str], cells: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """Of `shown` (metric keys), those whose written cell is the same in every row of `cells`, and not `always`
    shown: key -> that cell. With one row, nothing is constant across models."""
    if len(cells) < 2:
        return {}
    return {
        key: cells[0][key]
        for key in shown
        if not (key in BY_KEY and BY_KEY[key].always) and len({row[key] for row in cells}) == 1
    }


def left_out_line(constant: Mapping[str, str], label: Mapping[str, str] | None = None) -> str:
    """The line that says which constant columns a table leaves out, and their value."""
    label = dict(label or names())
    listed = ", ".join(f"{label.get(key, key)} {value}" for key, value in constant.items())
    return f"Left out, the same for every model: {listed}."


def rated() -> tuple[Column, ...]:
    """The metrics `compute_metrics` computes from the paired outcomes (`Column.rate`), in the spec's order."""
    return tuple(c for c in COLUMNS if c.rate is not None)


def metric_table() -> str:
    """docs/evaluation.md's metric table: one row per metric with a `definition`, in the spec's order."""
    rows = ["| metric | definition |", "|---|---|"]
    rows += [f"| `{c.key}` | {c.definition} |" for c in COLUMNS if c.definition is not None]
    return "\n".join(rows) + "\n"
