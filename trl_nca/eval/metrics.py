"""Paired metrics of a with/without-context evaluation, their bootstrap intervals, McNemar's test and the regime rule.

For items i = 1..n, `x_i` (`xc_i`) is 1 when the response without (with) the context is correct. The discordant counts
are `harm = #{x_i = 1, xc_i = 0}` (the context breaks a correct answer) and `help = #{x_i = 0, xc_i = 1}`. Rates that
divide by an empty set (e.g. harm when nothing is correct without the context) are `None`, never 0.

Regime rule (documented in docs/evaluation.md): with `p` the exact two-sided McNemar p-value of the harm and help counts
and `alpha` (default 0.05),

- A: `harm > help` and `p < alpha` (adding the context significantly lowers accuracy; then `delta < 0`);
- B: `help > harm` and `p < alpha` (the context still significantly helps; then `delta > 0`);
- C: otherwise (no significant difference between the views, including ties and zero discordant items);
- None: no items.

Because `delta = (help - harm) / n`, the sign of the accuracy difference always agrees with the direction of A or B.

With k samples per view (`PairedEvaluator(samples_per_view=k)`), `x_i` and `xc_i` become the per-item success rates
`p_x,i` and `p_xc,i` (the fraction of the k samples that are right), and every rate keeps its formula with products
for the conjunctions: harm = sum p_x (1 - p_xc) / sum p_x, the probability that an item answered right without the
context goes wrong with it; the counts become expected counts. McNemar's test needs one binary outcome per view, so
there `mcnemar_p` is None and the regime uses `permutation_p`, the paired permutation test over items
(`sign_flip_test` on p_xc,i - p_x,i). With k = 1 every number is the one-sample one.

Harm and help have a floor: a context with no effect still gives harm, from each item's own sampling noise. Item i's
m = 2k samples hold s_i right answers; were its samples exchangeable between the views (the context has no effect),
the expected harm term p_x,i (1 - p_xc,i) over the ways of splitting them k and k is
u_i = s_i (m - s_i) / (m (m - 1)), an unbiased estimate of p_i (1 - p_i), and so is the help term's. `harm_floor` =
sum u_i / sum p_x,i and `help_floor` = sum u_i / sum (1 - p_x,i), normalised as harm and help are; `harm_excess` =
harm - harm_floor and `help_excess` = help - help_floor, each with its bootstrap interval over items
(docs/evaluation.md derives it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import numpy as np

from .columns import rated
from .records import PairedRecord, ViewOutcome


# The rates `compute_metrics` computes from the paired outcomes, in the column spec's order (`trl_nca.eval.columns`).
RATE_KEYS = tuple(column.key for column in rated())


@dataclass
class PairedArrays:
    """Per-item outcomes as arrays (one entry per record, in record order): with k samples per view (`samples`), the
    fraction of an item's k samples that are correct, format failures or truncated, and their mean length."""

    correct_x: np.ndarray
    correct_xc: np.ndarray
    format_failure_x: np.ndarray
    format_failure_xc: np.ndarray
    truncated_x: np.ndarray
    truncated_xc: np.ndarray
    length_x: np.ndarray
    length_xc: np.ndarray
    samples: int = 1


def _view_score(view: ViewOutcome, scorer: str | None) -> tuple[bool, bool]:
    if scorer is None:
        return bool(view.correct), bool(view.format_failure)
    scores = view.extra.get("scores", {})
    if scorer not in scores:
        raise KeyError(f"The records hold no outcome for scorer {scorer!r}; they have {sorted(scores)}.")
    return bool(scores[scorer]["correct"]), bool(scores[scorer]["format_failure"])


def view_samples(view: ViewOutcome) -> list[ViewOutcome]:
    """The k samples of one view of a record: the view itself (sample 0), then `extra["samples"]` (k > 1)."""
    extra = [ViewOutcome(**sample) for sample in view.extra.get("samples", [])]
    return [view, *extra]


FEW_ITEMS = 10
"""The fewest items a conditional rate needs to be shown as a plain rate: harm divides by the items right without the
context and help by those wrong without it, and the printed tables, reports and figures mark a rate over fewer items
as `few` (one item more or less moves it by 10 points or more)."""


def count_of(count: float, total: float) -> str:
    """The count behind a conditional rate, `count/total` (expected counts to one decimal with k samples per view),
    followed by `, few` when `total` is below `FEW_ITEMS`. A count computed back from a rate (`rate * total`, as the
    comparison's tables do) carries the float error of that product: each amount is first rounded to 6 decimals
    (expected counts are multiples of 1/k), then to one decimal half up, so 4.7499999999 and 4.75 are both written 4.8
    and 0.25 is 0.3, in every table."""

    def amount(value: float) -> str:
        value = round(value, 6)
        if abs(value - round(value)) < 1e-6:
            return str(round(value))
        return str(Decimal(repr(value)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))

    return f"{amount(count)}/{amount(total)}" + (", few" if total < FEW_ITEMS else "")


def samples_per_view(records: Sequence[PairedRecord]) -> int:
    """k of the records (1 for one-sample records); records of different k are refused."""
    ks = {len(view_samples(r.x)) for r in records} | {len(view_samples(r.xc)) for r in records}
    if len(ks) > 1:
        raise ValueError(f"The records mix different numbers of samples per view ({sorted(ks)}).")
    return ks.pop() if ks else 1


def _mean(values: list) -> float:
    return sum(float(v) for v in values) / len(values)


def paired_arrays(records: Sequence[PairedRecord], scorer: str | None = None) -> PairedArrays:
    """Arrays of the records' outcomes; `scorer` selects a companion scorer stored in `ViewOutcome.extra['scores']`.
    With one sample per view the entries are 0 or 1; with k, per-item fractions over the k samples."""
    views = {"x": [view_samples(r.x) for r in records], "xc": [view_samples(r.xc) for r in records]}
    arrays = {}
    for name, per_item in views.items():
        scored = [[_view_score(v, scorer) for v in samples] for samples in per_item]
        arrays[f"correct_{name}"] = np.array([_mean([c for c, _ in s]) for s in scored], dtype=float)
        arrays[f"format_failure_{name}"] = np.array([_mean([f for _, f in s]) for s in scored], dtype=float)
        arrays[f"truncated_{name}"] = np.array([_mean([v.truncated for v in s]) for s in per_item], dtype=float)
        arrays[f"length_{name}"] = np.array([_mean([v.num_tokens for v in s]) for s in per_item], dtype=float)
    return PairedArrays(**arrays, samples=samples_per_view(records))


def mcnemar_exact(harm: int, help: int) -> float:
    """Exact two-sided McNemar p-value: a binomial test of `harm` out of `harm + help` discordant items at 1/2.

    p = min(1, 2 * P(X <= min(harm, help))) for X ~ Binomial(harm + help, 1/2); 1.0 when there are no discordant items.
    """
    if harm < 0 or help < 0:
        raise ValueError("Discordant counts must be non-negative.")
    n = harm + help
    if n == 0:
        return 1.0
    k = min(harm, help)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def sign_flip_test(
    differences: Sequence[float], *, max_exact: int = 20, n_resamples: int = 100_000, seed: int = 0
) -> dict[str, Any]:
    """Paired permutation test of "the differences are symmetric about 0", on the statistic |sum of differences|.

    Under the null each pair's two outcomes are exchangeable, so each difference keeps or flips its sign with
    probability 1/2. The two-sided p-value is the fraction of sign assignments whose |sum| is at least the observed
    one. Zero differences cannot flip and are left out. With at most `max_exact` non-zero differences all 2^m
    assignments are enumerated (`exact: True`); above, `n_resamples` seeded random assignments give the Monte Carlo
    estimate (1 + hits) / (1 + n_resamples). On differences in {-1, 0, 1} the exact p-value is McNemar's exact one.
    Returns `{"p": ..., "n_nonzero": m, "exact": ...}`; p is 1.0 when every difference is 0.
    """
    d = np.asarray([float(v) for v in differences if float(v) != 0.0], dtype=float)
    m = d.size
    if m == 0:
        return {"p": 1.0, "n_nonzero": 0, "exact": True}
    observed = abs(d.sum())
    tolerance = 1e-9 * max(1.0, float(np.abs(d).sum()))  # sums of the same floats in another order: rounding only
    if m <= max_exact:
        signs = 1 - 2 * ((np.arange(2**m)[:, None] >> np.arange(m)[None, :]) & 1)
        hits = int((np.abs(signs @ d) >= observed - tolerance).sum())
        return {"p": min(1.0, hits / 2**m), "n_nonzero": m, "exact": True}
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_resamples, 10_000):
        signs = rng.choice((-1.0, 1.0), size=(min(10_000, n_resamples - start), m))
        hits += int((np.abs(signs @ d) >= observed - tolerance).sum())
    return {"p": (1 + hits) / (1 + n_resamples), "n_nonzero": m, "exact": False}


def classify_regime(harm: int, help: int, n: int, alpha: float = 0.05) -> str | None:
    """Regime A (context significantly hurts), B (significantly helps) or C (no significant difference); None if n=0."""
    if n == 0:
        return None
    p = mcnemar_exact(harm, help)
    if p < alpha and harm > help:
        return "A"
    if p < alpha and help > harm:
        return "B"
    return "C"


def classify_direction(difference: float, p: float, n: int, alpha: float = 0.05) -> str | None:
    """The regime rule with any paired test: A when the context lowers accuracy (`difference` = sum of xc - x < 0)
    with `p < alpha`, B when it raises it with `p < alpha`, C otherwise; None without items."""
    if n == 0:
        return None
    if p < alpha and difference < 0:
        return "A"
    if p < alpha and difference > 0:
        return "B"
    return "C"


def _rates(a: PairedArrays, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Every rate (`trl_nca.eval.columns.Column.rate`) for each row of an index matrix `idx` (shape (B, n)); the
    identity row gives the point estimate."""
    rows = PairedArrays(
        **{f.name: getattr(a, f.name)[idx] for f in fields(a) if f.name != "samples"}, samples=a.samples
    )
    return {column.key: column.rate(rows) for column in rated()}


def bootstrap_intervals(
    arrays: PairedArrays, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> dict[str, tuple[float, float] | None]:
    """Percentile bootstrap intervals of every rate, resampling items (pairs) with replacement.

    Resamples where a rate is undefined (empty denominator) are left out of that rate's interval; a rate undefined in
    every resample gets None. Seeded with its own generator, so it touches no global RNG.
    """
    n = len(arrays.correct_x)
    if n == 0 or n_resamples <= 0:
        return dict.fromkeys(RATE_KEYS)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_resamples, n))
    samples = _rates(arrays, idx)
    tail = 100 * (1 - confidence) / 2
    intervals: dict[str, tuple[float, float] | None] = {}
    for key in RATE_KEYS:
        values = samples[key][~np.isnan(samples[key])]
        if values.size == 0:
            intervals[key] = None
        else:
            low, high = np.percentile(values, [tail, 100 - tail])
            intervals[key] = (float(low), float(high))
    return intervals


def _none_if_nan(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def _length_stats(lengths: np.ndarray) -> dict[str, float | None]:
    if lengths.size == 0:
        return {"mean": None, "median": None, "p90": None}
    return {
        "mean": float(lengths.mean()),
        "median": float(np.median(lengths)),
        "p90": float(np.percentile(lengths, 90)),
    }


def compute_metrics(
    records: Sequence[PairedRecord],
    *,
    scorer: str | None = None,
    alpha: float = 0.05,
    n_bootstrap: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Every paired metric of `records` as a JSON-ready dict.

    Keys: `n`, the counts (`n_correct_x`, `n_correct_xc`, `harm_count`, `help_count`, `both_correct_count`,
    `both_wrong_count`), the rates in `RATE_KEYS` (None when undefined), `length_x`/`length_xc` (mean, median, p90 of
    response tokens), `mcnemar_p`, `regime`, `alpha` and `ci` (a `[low, high]` bootstrap interval per rate, or None).
    `scorer` reads a companion scorer's verdicts instead of the main ones.
    """
    arrays = paired_arrays(records, scorer)
    n = len(records)
    k = samples_per_view(records)
    cx, cxc = arrays.correct_x, arrays.correct_xc

    def count(values: np.ndarray) -> int | float:  # a count of items, or an expected count with k samples per view
        total = float(values.sum())
        return int(round(total)) if k == 1 else total

    harm_count = count(cx * (1 - cxc))
    help_count = count((1 - cx) * cxc)
    if n:
        point = {k: _none_if_nan(float(v[0])) for k, v in _rates(arrays, np.arange(n)[None, :]).items()}
    else:
        point = dict.fromkeys(RATE_KEYS)
    intervals = bootstrap_intervals(arrays, n_resamples=n_bootstrap, seed=seed, confidence=confidence)
    metrics = {
        "n": n,
        "n_correct_x": count(cx),
        "n_correct_xc": count(cxc),
        "harm_count": harm_count,
        "help_count": help_count,
        "both_correct_count": count(cx * cxc),
        "both_wrong_count": count((1 - cx) * (1 - cxc)),
        **point,
        "length_x": _length_stats(arrays.length_x),
        "length_xc": _length_stats(arrays.length_xc),
    }
    if k == 1:
        metrics["mcnemar_p"] = mcnemar_exact(harm_count, help_count)
        metrics["regime"] = classify_regime(harm_count, help_count, n, alpha)
    else:
        test = sign_flip_test(cxc - cx, seed=seed)
        metrics.update(samples_per_view=k, mcnemar_p=None, permutation_p=test["p"], permutation_exact=test["exact"])
        metrics["regime"] = classify_direction(float((cxc - cx).sum()), test["p"], n, alpha)
    metrics.update(
        alpha=alpha, confidence=confidence, ci={k: (None if v is None else [v[0], v[1]]) for k, v in intervals.items()}
    )
    return metrics


def flatten_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric scalars of `compute_metrics` output as a flat dict for trainer loggers (None and strings dropped).

    The regime is logged as `regime_code` (A=-1, C=0, B=+1) so it can be plotted next to the losses.
    """
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        if key in ("ci", "alpha", "confidence"):
            continue
        if isinstance(value, dict):
            for sub, sub_value in value.items():
                if isinstance(sub_value, (int, float)) and not isinstance(sub_value, bool):
                    flat[f"{prefix}{key}_{sub}"] = float(sub_value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"{prefix}{key}"] = float(value)
    if metrics.get("regime") is not None:
        flat[f"{prefix}regime_code"] = {"A": -1.0, "C": 0.0, "B": 1.0}[metrics["regime"]]
    return flat
