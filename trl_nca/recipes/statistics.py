"""Statistics of a comparison over its runs: per-method distributions, and paired differences against a baseline.

A run is one student: one method trained from one organism (or base model) with one training seed. Runs of two
methods pair up when they share the (organism, seed): same initial weights, same training seed, so their difference
is the method's effect on that draw.

- Per method, over its runs: median, interquartile range (the 25th and 75th percentiles, numpy's linear
  interpolation) and min-max of each metric.
- Per method against the baseline (plain OPD in the README's job): the difference baseline - method of each metric
  per pair, its mean with a percentile bootstrap 95% interval (pairs resampled with replacement), the exact two-sided
  sign test (`trl_nca.eval.metrics.mcnemar_exact` on the counts of positive and negative differences; ties left out)
  and the exact paired permutation test (`trl_nca.eval.metrics.sign_flip_test` on the sum of differences), and how
  many pairs have the method below the baseline.

Pairs where a metric is undefined for either run (e.g. harm when nothing is right without the context) are left out of
that metric and counted in `undefined`. Intervals and tests need at least `MIN_PAIRS` pairs, the fewest with which an
exact two-sided sign test can fall below 0.05 (`fewest_pairs`); with fewer, only the values are given, with a note
saying why (a percentile bootstrap interval from 3 pairs covers the true mean only about 75% of the time).

The unit of a claim about new models is the organism (or base model), not the training seed: runs that share an
organism are repeated measures of it. `organism_outcomes` therefore reads a comparison per organism (does the baseline
degrade there, does the method prevent it; docs/results.md section 9.1 defines both) and over organisms: how many
organisms show each outcome, a two-level bootstrap interval (organisms resampled, then seeds within each) of the mean
difference, and the exact sign test over the organisms' mean differences, again only from `MIN_PAIRS` organisms.

The comparison's own table (`aggregate`, `render_table`, `conclusion`) gives the mean and sample standard deviation
over seeds of each method, then one row per run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.checks import format_pct
from ..eval import columns
from ..eval.metrics import FEW_ITEMS, count_of, mcnemar_exact, sign_flip_test


def fewest_pairs(alpha: float = 0.05) -> int:
    """The fewest pairs with which an exact two-sided sign test can reach p < alpha (its smallest p is 2^(1-n))."""
    n = 1
    while 2.0 ** (1 - n) >= alpha:
        n += 1
    return n


MIN_PAIRS = fewest_pairs()  # 6
# the metrics of each table, from the one column specification (`trl_nca.eval.columns`); harm leads the statistics,
# the quantity they are about
STAT_KEYS = ("harm", *(k for k in columns.keys(columns.STATISTICS) if k != "harm"))
ORGANISM_KEYS = ("harm", *(k for k in columns.keys(columns.ORGANISMS) if k != "harm"))
PREVENTED_SHARE = 0.5  # the method prevents the degradation when its mean harm is at most this share of the baseline's
# the metrics of each evaluated model in a comparison's table (`aggregate`, `render_table`)
SUMMARY_KEYS = columns.keys(columns.COMPARISON)
COLUMN_NAMES = columns.names()


def _value(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def distribution(values: Sequence[float]) -> dict[str, Any] | None:
    """Median, quartiles, interquartile range, min and max of `values` (None when empty)."""
    if not values:
        return None
    v = np.asarray(values, dtype=float)
    q1, median, q3 = (float(x) for x in np.percentile(v, [25, 50, 75]))
    return {
        "n": int(v.size),
        "median": median,
        "q1": q1,
        "q3": q3,
        "iqr": q3 - q1,
        "min": float(v.min()),
        "max": float(v.max()),
    }


def distributions(
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]], keys: Sequence[str] = STAT_KEYS
) -> dict[str, dict[str, Any]]:
    """`distribution` of each metric over each method's runs (undefined values left out, counted in `undefined`)."""
    out: dict[str, dict[str, Any]] = {}
    for method, rows in per_seed.items():
        stats: dict[str, Any] = {"runs": len(rows)}
        for key in keys:
            values = [v for v in (_value(r, key) for r in rows) if v is not None]
            stats[key] = distribution(values)
            stats.setdefault("undefined", {})[key] = len(rows) - len(values)
        out[method] = stats
    return out


def bootstrap_mean_interval(
    values: Sequence[float], n_resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> list[float]:
    """Percentile bootstrap interval of the mean of `values` (resampled with replacement, own seeded generator)."""
    v = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_resamples, v.size))].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return [float(low), float(high)]


def paired_difference(
    baseline: Sequence[Mapping[str, Any]],
    method: Sequence[Mapping[str, Any]],
    key: str,
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Baseline - method of metric `key` per (organism, seed) pair, with interval and tests (see the module docstring).

    Rows carry `organism` (None for a single base model) and `seed`. `below` counts pairs where the method's value is
    lower than the baseline's, `above` higher, `ties` equal.
    """
    ours = {(r.get("organism"), r.get("seed")): r for r in method}
    pairs, undefined = [], []
    for row in baseline:
        pair = (row.get("organism"), row.get("seed"))
        if pair not in ours:
            continue
        a, b = _value(row, key), _value(ours[pair], key)
        if a is None or b is None:
            undefined.append(list(pair))
        else:
            pairs.append((pair, a - b))
    diffs = [d for _, d in pairs]
    n = len(diffs)
    out: dict[str, Any] = {
        "metric": key,
        "n": n,
        "pairs": [{"organism": p[0], "seed": p[1], "difference": d} for p, d in pairs],
        "undefined": undefined,
        "below": sum(d > 0 for d in diffs),
        "above": sum(d < 0 for d in diffs),
        "ties": sum(d == 0 for d in diffs),
        "mean": float(np.mean(diffs)) if n else None,
        "median": float(np.median(diffs)) if n else None,
        "ci": None,
        "confidence": confidence,
        "sign_test_p": None,
        "permutation_p": None,
        "note": None,
    }
    if n < MIN_PAIRS:
        out["note"] = (
            f"no interval or test: they need at least {MIN_PAIRS} paired runs (same organism and training seed), and "
            f"there {'is' if n == 1 else 'are'} {n}"
        )
        return out
    out["ci"] = bootstrap_mean_interval(diffs, n_resamples=n_resamples, seed=seed, confidence=confidence)
    out["sign_test_p"] = mcnemar_exact(out["below"], out["above"])
    out["permutation_p"] = sign_flip_test(diffs)["p"]
    return out


def compare_to_baseline(
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]],
    baseline: str,
    keys: Sequence[str] = STAT_KEYS,
    **options: Any,
) -> dict[str, dict[str, Any]]:
    """`paired_difference` of every other student method against `baseline`, per metric: `{method: {key: ...}}`."""
    return {
        method: {key: paired_difference(per_seed[baseline], rows, key, **options) for key in keys}
        for method, rows in per_seed.items()
        if method not in (baseline, "base")
    }


def two_level_bootstrap_interval(
    groups: Sequence[Sequence[float]], n_resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> list[float]:
    """Percentile bootstrap interval of the mean over groups of each group's mean, resampling groups (organisms) with
    replacement and then, independently for each drawn group, its values (training seeds) with replacement."""
    arrays = [np.asarray(g, dtype=float) for g in groups]
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, len(arrays), size=(n_resamples, len(arrays)))
    means = np.empty(drawn.shape)
    for index, values in enumerate(arrays):
        slots = drawn == index
        picks = rng.integers(0, values.size, size=(int(slots.sum()), values.size))
        means[slots] = values[picks].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means.mean(axis=1), [tail, 100 - tail])
    return [float(low), float(high)]


def _by_organism(rows: Sequence[Mapping[str, Any]]) -> dict[Any, dict[Any, Mapping[str, Any]]]:
    out: dict[Any, dict[Any, Mapping[str, Any]]] = {}
    for row in rows:
        out.setdefault(row.get("organism"), {})[row.get("seed")] = row
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _organism_entry(
    organism, seeds, theirs: Mapping[Any, Mapping[str, Any]], ours: Mapping[Any, Mapping[str, Any]], keys: Sequence[str]
) -> dict[str, Any]:
    """One organism's reading: each method's means over the `seeds` both ran (the rows of `theirs`, the baseline, and
    `ours`, the method, by seed), its regime-A runs, the per-seed differences, `degraded` and `prevented`."""
    base = [theirs[s] for s in seeds]
    mine = [ours[s] for s in seeds]
    entry: dict[str, Any] = {"organism": organism, "seeds": seeds, "baseline": {}, "method": {}, "differences": {}}
    for side, rows in (("baseline", base), ("method", mine)):
        entry[side] = {key: _mean([_value(r, key) for r in rows]) for key in keys}
        entry[side]["regime_a"] = sum(r.get("regime") == "A" for r in rows)
    for key in keys:
        diffs = [
            a - b
            for a, b in ((_value(x, key), _value(y, key)) for x, y in zip(base, mine))
            if a is not None and b is not None
        ]
        entry["differences"][key] = diffs
    entry["degraded"] = 2 * entry["baseline"]["regime_a"] > len(seeds)
    harm_base, harm_mine = entry["baseline"].get("harm"), entry["method"].get("harm")
    entry["prevented"] = (
        None
        if not entry["degraded"] or harm_base is None or harm_mine is None
        else harm_mine <= PREVENTED_SHARE * harm_base
    )
    return entry


def rounding_tolerance(differences: Sequence[float]) -> float:
    """A bound on the rounding error of `np.mean(differences)` when each difference is `a - b` of two stored values of
    size at most `scale = max(1, max |difference|)` (rates: at most 1). Error model, u = eps / 2 (IEEE 754 double):
    each stored value is its exact (decimal or rational) value rounded once (at most u * scale each) and the
    subtraction rounds once more, so 3 u * scale per difference; the sum of n terms adds at most (n - 1) u * scale to
    the mean and the division by n one more u * scale: at most (n + 3) u * scale in all. This returns (n + 1) eps *
    scale = (2n + 2) u * scale, which covers that for every n >= 1. A mean within it of 0 is 0 up to rounding: -5.55e-17
    from the seeds' +21.67 and -21.67 points is a tie, while the smallest real difference of two rates over 240 items
    x 4 samples (1/960, about 1e-3) is 10^12 times larger."""
    scale = max([1.0, *(abs(float(d)) for d in differences)])
    return (len(differences) + 1) * float(np.finfo(float).eps) * scale


def _sign(differences: Sequence[float]) -> int:
    """The sign of the mean of `differences`: 0 (a tie) when it lies within `rounding_tolerance` of 0."""
    mean = float(np.mean(differences))
    return 0 if abs(mean) <= rounding_tolerance(differences) else (1 if mean > 0 else -1)


def _over_organisms(
    organisms: Sequence[Mapping[str, Any]], key: str, n_resamples: int, seed: int, confidence: float
) -> dict[str, Any]:
    """The organisms' mean differences of `key`: their mean, how many lie below and above zero and how many equal it
    (`ties`: zero up to rounding, `rounding_tolerance`; a tie counts on neither side and, as in `paired_difference`,
    is left out of the sign test), and from `MIN_PAIRS` organisms the two-level bootstrap interval and the exact sign
    test."""
    groups = [e["differences"][key] for e in organisms if e["differences"][key]]
    means = [float(np.mean(g)) for g in groups]
    signs = [_sign(g) for g in groups]
    summary: dict[str, Any] = {
        "n": len(groups),
        "mean": float(np.mean(means)) if means else None,
        "ci": None,
        "below": signs.count(1),
        "above": signs.count(-1),
        "ties": signs.count(0),
        "sign_test_p": None,
    }
    if len(groups) >= MIN_PAIRS:
        summary["ci"] = two_level_bootstrap_interval(groups, n_resamples, seed, confidence)
        summary["sign_test_p"] = mcnemar_exact(summary["below"], summary["above"])
    return summary


def organism_outcomes(
    baseline_rows: Sequence[Mapping[str, Any]],
    method_rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str] = ORGANISM_KEYS,
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """The comparison read per organism, then over organisms (see the module docstring).

    Per organism (the seeds both methods ran): each method's mean of every metric and its count of regime-A runs;
    `degraded` when the baseline is in regime A in more than half of the seeds, `prevented` (only where it degraded)
    when the method's mean harm is at most `PREVENTED_SHARE` of the baseline's. Over organisms: the counts, and per
    metric the mean of the organisms' mean differences (baseline - method) with its two-level bootstrap interval and
    the exact sign test over organisms, both only from `MIN_PAIRS` organisms.
    """
    ours, theirs = _by_organism(method_rows), _by_organism(baseline_rows)
    organisms = []
    for organism in sorted(set(ours) & set(theirs), key=lambda o: (o is None, o)):
        seeds = sorted(set(ours[organism]) & set(theirs[organism]), key=lambda s: (s is None, s))
        if not seeds:
            continue
        organisms.append(_organism_entry(organism, seeds, theirs[organism], ours[organism], keys))
    degraded = [e for e in organisms if e["degraded"]]
    out: dict[str, Any] = {
        "organisms": organisms,
        "n": len(organisms),
        "degraded": len(degraded),
        "degraded_in_any_seed": sum(e["baseline"]["regime_a"] > 0 for e in organisms),
        "prevented": sum(bool(e["prevented"]) for e in degraded),
        "prevented_share": PREVENTED_SHARE,
        "confidence": confidence,
        "over_organisms": {},
        "note": None,
    }
    for key in keys:
        out["over_organisms"][key] = _over_organisms(organisms, key, n_resamples, seed, confidence)
    if len(organisms) < MIN_PAIRS:
        out["note"] = (
            f"no interval or test over organisms: they need at least {MIN_PAIRS} organisms (the fewest with which an "
            f"exact sign test can fall below 0.05), and there {'is' if len(organisms) == 1 else 'are'} {len(organisms)}"
        )
    return out


def compare_organisms(
    per_seed: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str, keys: Sequence[str] = ORGANISM_KEYS, **options
) -> dict[str, dict[str, Any]]:
    """`organism_outcomes` of every other student method against `baseline`: `{method: ...}`."""
    return {
        method: organism_outcomes(per_seed[baseline], rows, keys, **options)
        for method, rows in per_seed.items()
        if method not in (baseline, "base")
    }


def organism_sentence(baseline: str, method: str, outcome: Mapping[str, Any]) -> str:
    """One sentence of the counts: how many organisms degrade under the baseline and how many the method rescues."""
    n, degraded = outcome["n"], outcome["degraded"]
    text = (
        f"{baseline} degraded (regime A in most of its seeds) on {degraded} of {n} organism{'s' if n != 1 else ''} "
        f"(regime A in at least one seed on {outcome['degraded_in_any_seed']})"
    )
    if degraded:
        text += (
            f"; {method} prevented it (harm at most {outcome['prevented_share']:.0%} of {baseline}'s) on "
            f"{outcome['prevented']} of those {degraded}"
        )
    return text + "."


def render_organisms(organisms: Mapping[str, Any], baseline: str, names: Mapping[str, str] | None = None) -> str:
    """The Markdown of `compare_organisms`'s result: a row per organism, then the counts and the statistics over
    organisms."""
    names = dict(names or {})
    lines: list[str] = []
    for method, outcome in organisms.items():
        lines += [
            f"Per organism, {baseline} vs {method} (rates in %, means over the organism's seeds; regime A: runs in "
            "regime A):",
            "",
            f"| organism | seeds | {baseline} harm | {baseline} regime A | {method} harm | {method} regime A | "
            f"{baseline} degraded | {method} prevented it |",
            "|" + "---|" * 8,
        ]
        for e in outcome["organisms"]:
            prevented = "-" if e["prevented"] is None else ("yes" if e["prevented"] else "no")
            lines.append(
                f"| {e['organism']} | {len(e['seeds'])} | {format_pct(e['baseline'].get('harm'))} | "
                f"{e['baseline']['regime_a']} | {format_pct(e['method'].get('harm'))} | {e['method']['regime_a']} | "
                f"{'yes' if e['degraded'] else 'no'} | {prevented} |"
            )
        lines += ["", organism_sentence(baseline, method, outcome)]
        if outcome["note"]:
            lines += ["", f"Note: {outcome['note'][0].upper() + outcome['note'][1:]}."]
            continue
        lines += ["", render_over_organisms(outcome, baseline, method, names), ""]
    return "\n".join(lines).rstrip()


def _ties(d: Mapping[str, Any]) -> str:
    """`, k equal` for the organisms whose mean difference is zero up to rounding (none in older summaries)."""
    return f", {d['ties']} equal" if d.get("ties") else ""


def render_over_organisms(
    outcome: Mapping[str, Any], baseline: str, method: str, names: Mapping[str, str] | None = None
) -> str:
    """The Markdown of an `organism_outcomes` result over organisms: per metric, the mean of the organisms' mean
    differences `baseline - method`, its two-level interval and the sign test over organisms."""
    names = dict(names or {})
    if outcome["note"]:
        return f"Note: {outcome['note'][0].upper() + outcome['note'][1:]}."
    conf = int(round(100 * outcome["confidence"]))
    lines = [
        f"Over organisms, {baseline} - {method} (percentage points): the mean of the organisms' mean differences, "
        f"its two-level bootstrap {conf}% interval (organisms, then seeds) and the exact sign test over organisms.",
        "",
        "| metric | organisms | mean | two-level interval | sign test p | method lower on |",
        "|" + "---|" * 6,
    ]
    for key, d in outcome["over_organisms"].items():
        ci = "n/a" if d["ci"] is None else f"[{format_pct(d['ci'][0])}, {format_pct(d['ci'][1])}]"
        lines.append(
            f"| {names.get(key, key)} | {d['n']} | {format_pct(d['mean'])} | {ci} | {_p(d['sign_test_p'])} | "
            f"{d['below']} of {d['n']}{_ties(d)} |"
        )
    return "\n".join(lines)


def aggregate(
    summaries: dict[str, list[dict[str, Any]]], keys: Sequence[str] = SUMMARY_KEYS
) -> dict[str, dict[str, Any]]:
    """Mean, sample standard deviation, min and max over seeds of each summary metric, per method."""
    out = {}
    for method, per_seed in summaries.items():
        stats: dict[str, Any] = {"n_seeds": len(per_seed), "regimes": [m.get("regime") for m in per_seed]}
        for key in keys:
            values = [v for v in (_value(m, key) for m in per_seed) if v is not None]
            if not values:
                stats[key] = None
                continue
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
            stats[key] = {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values)}
        out[method] = stats
    return out


def _pct(stat: dict[str, Any] | None, spread: bool = True) -> str:
    if stat is None:
        return "n/a"
    text = format_pct(stat["mean"])
    if spread and stat["n"] > 1:
        text += f" ± {format_pct(stat['std'])}"
    return text


CONDITIONAL = {"harm": lambda acc_x: acc_x, "help": lambda acc_x: 1 - acc_x}
"""The conditional rates, with the share of the items they divide by (harm: those right without the context)."""
SAME_DENOMINATOR = {"harm_floor": "harm", "harm_excess": "harm", "help_floor": "help", "help_excess": "help"}
"""Rates that divide by the items a conditional rate divides by. Where that is fewer than `FEW_ITEMS` items the table
writes them `n/a (few)`: a floor from a handful of items says nothing (a base almost never right without the context
has a harm floor of thousands of percent, from the items the context makes right)."""


def rate_denominators(row: Mapping[str, Any], n_items: int) -> dict[str, float]:
    """The items each conditional rate of a per-seed row divides by (`acc_x` times the items; expected counts with k
    samples per view)."""
    acc_x = _value(row, "acc_x")
    if acc_x is None:
        return {}
    return {key: share(acc_x) * n_items for key, share in CONDITIONAL.items()}


def _run_cells(row: Mapping[str, Any], organisms: bool) -> list[str]:
    """The cells that name a run in the per-run table: its organism (when the runs span organisms) and its training
    seed (`-` for a base model, which is not trained)."""
    seed = "-" if row.get("seed") is None else str(row["seed"])
    return [str(row.get("organism")), seed] if organisms else [seed]


def render_table(
    aggregated: dict[str, dict[str, Any]],
    per_seed: dict[str, list[dict[str, Any]]],
    keys: Sequence[str] = SUMMARY_KEYS,
    n_items: int | None = None,
) -> str:
    """Markdown (rates in %): mean ± sample standard deviation over the runs of each method, then one row per run
    (its organism, when the runs span several, and its training seed). With `n_items` (the held-out items each model
    answered), a per-run harm or help carries its count (`count_of`), and a mean over runs says how many runs it holds
    when the others' rate is undefined, and `few` when one of them divides by fewer than `FEW_ITEMS` items. A column
    the same in every run is left out, with a line saying so (`trl_nca.eval.columns.constant_columns`)."""
    rows = [row for rows in per_seed.values() for row in rows]
    written = [{k: "n/a" if _value(r, k) is None else format_pct(_value(r, k)) for k in keys} for r in rows]
    constant = columns.constant_columns(keys, written)
    keys = [k for k in keys if k not in constant]
    organisms = any(r.get("organism") is not None for r in rows)
    names = [COLUMN_NAMES.get(k, k) for k in keys]
    lines = ["| Model | runs | " + " | ".join(names) + " | Regime |", "|" + "---|" * (len(keys) + 3)]
    for method, stats in aggregated.items():
        cells = [method, str(stats["n_seeds"])]
        for k in keys:
            cell = _pct(stats[k])
            divides_as = SAME_DENOMINATOR.get(k, k)
            if n_items is not None and divides_as in CONDITIONAL and stats[k] is not None:
                notes = [f"{stats[k]['n']} of {stats['n_seeds']} runs"] if stats[k]["n"] < stats["n_seeds"] else []
                defined = [r for r in per_seed.get(method, []) if _value(r, k) is not None]
                if any(rate_denominators(r, n_items)[divides_as] < FEW_ITEMS for r in defined):
                    notes.append("few")
                cell = "n/a" if k in SAME_DENOMINATOR and "few" in notes else cell
                cell += f" ({', '.join(notes)})" if notes else ""
            cells.append(cell)
        cells.append(", ".join(r or "n/a" for r in stats["regimes"]))
        lines.append("| " + " | ".join(cells) + " |")
    who = "organism | seed" if organisms else "seed"
    lines += ["", "Per run:", "", f"| Model | {who} | " + " | ".join(names) + " | Regime |"]
    lines.append("|" + "---|" * (len(keys) + 3 + organisms))
    for method, runs in per_seed.items():
        for row in runs:
            cells = [method, *_run_cells(row, organisms)]
            totals = {} if n_items is None else rate_denominators(row, n_items)
            for k in keys:
                value = _value(row, k)
                cell = "n/a" if value is None else _pct({"mean": value, "n": 1})
                if value is not None and k in totals:
                    cell += f" ({count_of(value * totals[k], totals[k])})"
                if value is not None and totals.get(SAME_DENOMINATOR.get(k), FEW_ITEMS) < FEW_ITEMS:
                    cells.append("n/a (few)")
                    continue
                interval = (row.get("ci") or {}).get(k)
                if value is not None and interval is not None:
                    cell += f" [{format_pct(interval[0])}, {format_pct(interval[1])}]"
                cells.append(cell)
            lines.append("| " + " | ".join(cells + [row.get("regime") or "n/a"]) + " |")
    if constant:
        lines += ["", columns.left_out_line(constant, COLUMN_NAMES)]
    return "\n".join(lines)


def shown_keys(per_seed: Mapping[str, Sequence[Mapping[str, Any]]], keys: Sequence[str]) -> list[str]:
    """The keys `render_table` shows: those not the same in every run."""
    rows = [row for rows in per_seed.values() for row in rows]
    written = [{k: "n/a" if _value(r, k) is None else format_pct(_value(r, k)) for k in keys} for r in rows]
    constant = columns.constant_columns(keys, written)
    return [k for k in keys if k not in constant]


def table_legend(keys: Sequence[str], samples_per_view: int = 1) -> str:
    """The definitions under the printed table (and in `comparison.md`), one per shown column
    (`trl_nca.eval.columns`, and the task's diagnostic columns), with what the counts are."""
    lines = [
        "Columns (rates in %; each model answers every item without the context, view x, and with it, view xc):",
        "- runs: the students (organism x training seed) a mean ± standard deviation is over, or the bases (one per "
        "organism); organism: the model organism a run started from; seed: its training seed (`-`: a base, not "
        "trained).",
        *(f"- {line}" for line in columns.legend([*keys, "regime"])),
        f"- Harm and Help per run carry their counts k/n (`few`: n below {FEW_ITEMS} items, too few to read as a "
        "rate); a mean over fewer runs than trained says so (the other runs had no item to divide by: n/a).",
    ]
    with_interval = [columns.BY_KEY[k].name for k in keys if k in columns.run_interval_keys()]
    if with_interval:
        lines.append(
            f"- {', '.join(with_interval)} per run carries its 95% bootstrap interval over items; the floor and the "
            "excess are n/a where harm (help) divides by few items."
        )
    if samples_per_view > 1:
        lines.append(
            f"- With {samples_per_view} samples per view, a rate is the mean over items of the share of an item's "
            "samples that are right, and a count is an expected count: the sum over items of that share (hence "
            "fractional counts such as 11.5/48)."
        )
    diagnostics = sorted({k[: -len("_x")] for k in keys if k.endswith("_x") and f"{k[:-2]}_xc" in keys} - {"acc"})
    for name in diagnostics:
        what = (
            ": the rule applied twice, an internalised rule applied again once it is given" if name == "twice" else ""
        )
        lines.append(
            f"- {name}_x / {name}_xc: share of the answers without / with the context that equal the item's `{name}` "
            f"answer{what}."
        )
    return "\n".join(lines)


def conclusion(task: str, aggregated: dict[str, dict[str, Any]]) -> str:
    """One sentence stating what the table shows for the base, the plain OPD and the NCA students."""

    def num(method: str, key: str) -> str:
        stat = aggregated.get(method, {}).get(key)
        return "n/a" if stat is None else f"{100 * stat['mean']:.0f}%"

    parts = [
        f"On {task}, the base model answers {num('base', 'acc_x')} without and {num('base', 'acc_xc')} with the context"
    ]
    for method in aggregated:
        if method == "base":
            continue
        regimes = ", ".join(r or "n/a" for r in aggregated[method]["regimes"])
        parts.append(
            f"{method} reaches {num(method, 'acc_x')} without and {num(method, 'acc_xc')} with it (harm "
            f"{num(method, 'harm')}, length change {num(method, 'length_change')}, regime {regimes})"
        )
    return "; ".join(parts) + "."


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def render_statistics(statistics: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    """The Markdown of `statistics` (the `statistics` entry of `comparison.json`): distributions, then paired
    differences against the baseline, then one sentence per method on harm."""
    names = dict(names or {})
    lines = _distribution_table(statistics, names)
    if not statistics["paired"]:
        return "\n".join(lines)
    lines += _paired_table(statistics, names)
    organisms = statistics.get("organisms") or {}
    if any(e["organism"] is not None for outcome in organisms.values() for e in outcome["organisms"]):
        lines += ["", render_organisms(organisms, statistics["baseline"], names)]
    return "\n".join(lines)


def _distribution_table(statistics: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    """Per method: median [interquartile range] (min-max) of each metric over its runs."""
    keys = statistics["keys"]
    lines = [
        "Per method, over its runs (rates in %): median [interquartile range] (min-max).",
        "",
        "| Model | runs | " + " | ".join(names.get(k, k) for k in keys) + " |",
        "|" + "---|" * (len(keys) + 2),
    ]
    for method, stats in statistics["distributions"].items():
        cells = [method, str(stats["runs"])]
        for key in keys:
            d = stats[key]
            if d is None:
                cells.append("n/a")
            elif d["n"] == 1:
                cells.append(format_pct(d["median"]))
            else:
                cells.append(
                    f"{format_pct(d['median'])} [{format_pct(d['q1'])}-{format_pct(d['q3'])}] ({format_pct(d['min'])}-{format_pct(d['max'])})"
                )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _paired_table(statistics: Mapping[str, Any], names: Mapping[str, str]) -> list[str]:
    """The paired differences baseline - method of each metric, one sentence per method on harm, and the notes."""
    keys, baseline, paired = statistics["keys"], statistics["baseline"], statistics["paired"]
    conf = int(round(100 * next(iter(next(iter(paired.values())).values()))["confidence"]))
    lines = [
        "",
        f"Paired differences {baseline} - method per (organism, training seed), in percentage points: mean with a "
        f"{conf}% bootstrap interval, median, exact sign test and exact paired permutation test (two-sided).",
        "",
        "| Pair | metric | pairs | mean | bootstrap interval | median | sign test p | permutation p | method lower in |",
        "|" + "---|" * 9,
    ]
    sentences, notes = [], []
    for method, by_key in paired.items():
        for key in keys:
            d = by_key[key]
            ci = "n/a" if d["ci"] is None else f"[{format_pct(d['ci'][0])}, {format_pct(d['ci'][1])}]"
            lines.append(
                f"| {baseline} - {method} | {names.get(key, key)} | {d['n']} | {format_pct(d['mean'])} | {ci} | "
                f"{format_pct(d['median'])} | {_p(d['sign_test_p'])} | {_p(d['permutation_p'])} | {d['below']} of {d['n']} |"
            )
            if d["note"] and d["note"] not in notes:
                notes.append(d["note"])
        harm = by_key.get("harm")
        if harm is not None:
            text = f"{method}'s harm is below {baseline}'s in {harm['below']} of {harm['n']} paired runs"
            if harm["ties"]:
                text += f" ({harm['ties']} equal)"
            if harm["undefined"]:
                text += f"; {len(harm['undefined'])} pair(s) have an undefined harm and are left out"
            sentences.append(text + ".")
    lines += [""] + sentences
    if notes:
        lines += ["", *(f"Note: {note[0].upper() + note[1:]}." for note in notes)]
    return lines
