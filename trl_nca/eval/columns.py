"""The columns of every table of paired results, declared once beside the metric keys of `trl_nca.eval.metrics`.

One `Column` per metric says its header, what it means (the legend under each table and at the top of `report.md`
are written from it), how a cell is written, which tables show it, and its name in a game's summary (a win rate is an
accuracy). `trl_nca.eval.report` (the paired report), `trl_nca.recipes.statistics` (the comparison's tables and
statistics) and `trl_nca.eval.games` (the games' summary) read this list, so a new metric shows up everywhere from one
line here.

A column whose cells are the same for every model (and run) is left out of a table, with one line saying so
(`constant_columns`), unless it is one of the quantities every reading uses (`always`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


REPORT = "report"  # report.md's main table (`trl_nca.eval.report`)
COMPARISON = "comparison"  # the table of `trl-nca compare` (`trl_nca.recipes.statistics.render_table`)
STATISTICS = "statistics"  # its statistics over runs (distributions, paired differences)
ORGANISMS = "organisms"  # its differences over organisms
GAME = "game"  # a game's summary (`trl_nca.eval.games.game_summary`)


@dataclass(frozen=True)
class Column:
    """One metric as a table column.

    `key` is the metric's key in `compute_metrics` (and in a comparison's per-seed rows); `kind` says how a cell is
    written: `rate` (in %), `rate_ci` (in % with its bootstrap interval), `tokens` (a mean length), `p` (a p-value) or
    `label` (a word). `count` names the count a conditional rate divides (`harm_count` of the items right without the
    context, `help_count` of those wrong without it). `game` is the key in a game's summary, where it differs.
    `run_ci`: the per-run rows of a comparison's table show the rate's interval too (each run's own, over items)."""

    key: str
    name: str
    means: str
    kind: str = "rate"
    tables: frozenset[str] = frozenset({REPORT})
    count: str | None = None
    game: str | None = None
    always: bool = False
    run_ci: bool = False

    def legend(self) -> str:
        return f"{self.name}: {self.means}"


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
    ),
    Column(
        "acc_xc", "Acc_xc", "accuracy with the context.", "rate_ci", _STATS | {GAME}, game="win_rate_xc", always=True
    ),
    Column("delta", "Delta", "Acc_xc - Acc_x, in percentage points.", "rate_ci", _ALL | {GAME}, always=True),
    Column(
        "harm",
        "Harm",
        "P(wrong with the context | right without it): of the items right without the context, "
        "the share the context made wrong.",
        "rate_ci",
        _STATS | {ORGANISMS, GAME},
        count="harm_count",
        always=True,
    ),
    Column(
        "harm_unconditional", "Harm (uncond.)", "the share of all items right without the context and wrong with it."
    ),
    Column(
        "harm_floor",
        "Harm floor",
        "the harm a context with no effect gives, from each item's own success rate over its samples of both views "
        "(docs/evaluation.md#the-harm-floor).",
        tables=_ALL,
    ),
    Column(
        "harm_excess",
        "Excess harm",
        "Harm - Harm floor, in percentage points: the harm beyond the sampling noise of the items' own success rates.",
        "rate_ci",
        _STATS,
        run_ci=True,
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
    ),
    Column("help_floor", "Help floor", "the help a context with no effect gives (as Harm floor)."),
    Column("help_excess", "Excess help", "Help - Help floor, in percentage points.", "rate_ci"),
    Column(
        "both_correct",
        "BothCorrect",
        "the share of items right in both views.",
        tables=_STATS | {ORGANISMS, GAME},
        game="both_won",
    ),
    Column(
        "both_wrong",
        "BothWrong",
        "the share of items wrong in both views.",
        tables=frozenset({REPORT, GAME}),
        game="both_lost",
    ),
    Column(
        "format_failure_x",
        "FF_x",
        "format failures without the context: the share of answers the scorer could not parse (they count as wrong).",
    ),
    Column("format_failure_xc", "FF_xc", "format failures with the context."),
    Column("length_x", "Len_x", "the mean reply length without the context, in tokens.", "tokens"),
    Column("length_xc", "Len_xc", "the mean reply length with the context, in tokens.", "tokens"),
    Column(
        "length_change",
        "Length change",
        "Len_xc / Len_x - 1: how much longer the replies are with the context, in %.",
        tables=_ALL,
    ),
    Column("truncated_x", "Trunc_x", "the share of replies without the context cut at the token budget."),
    Column("truncated_xc", "Trunc_xc", "the share of replies with the context cut at the token budget."),
    Column(
        "mcnemar_p",
        "McNemar p",
        "the exact McNemar test of the harm and help counts (with several samples per view the "
        "paired permutation test over items, marked perm).",
        "p",
        frozenset({REPORT, GAME}),
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
