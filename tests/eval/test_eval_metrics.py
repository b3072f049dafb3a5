"""Paired metrics, McNemar's test, bootstrap intervals and the regime rule against hand-computed values."""

import math

import pytest

from trl_nca.eval.metrics import (
    RATE_KEYS,
    bootstrap_intervals,
    classify_regime,
    compute_metrics,
    flatten_metrics,
    mcnemar_exact,
    paired_arrays,
)
from trl_nca.eval.records import PairedRecord, ViewOutcome


# Tolerances: pytest.approx with its default tolerance compares float64 arithmetic on counts and rewards with exact
# fractions (error near 1e-16); trl_nca.testing names the tolerances of float computations.


def view(correct, tokens=10, truncated=False, format_failure=False, strict=None):
    extra = {}
    if strict is not None:
        extra = {"scores": {"mcq_strict": {"answer": None, "correct": strict, "format_failure": not strict}}}
    return ViewOutcome("text", None, bool(correct), tokens, truncated, format_failure, extra)


def records(cx, cxc, len_x=None, len_xc=None, **kwargs):
    len_x = len_x or [10] * len(cx)
    len_xc = len_xc or [10] * len(cx)
    return [
        PairedRecord(str(i), view(a, tokens=lx, **kwargs), view(b, tokens=lc, **kwargs))
        for i, (a, b, lx, lc) in enumerate(zip(cx, cxc, len_x, len_xc))
    ]


def test_mixed_outcomes_by_hand():
    # 10 items: 3 both correct, 3 harmed (correct only without c), 1 helped, 3 both wrong
    cx = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    cxc = [1, 1, 1, 0, 0, 0, 1, 0, 0, 0]
    m = compute_metrics(records(cx, cxc), n_bootstrap=0)
    assert m["n"] == 10
    assert m["acc_x"] == pytest.approx(0.6)
    assert m["acc_xc"] == pytest.approx(0.4)
    assert m["delta"] == pytest.approx(-0.2)
    assert m["harm"] == pytest.approx(3 / 6)
    assert m["harm_unconditional"] == pytest.approx(0.3)
    assert m["help"] == pytest.approx(1 / 4)
    assert m["help_unconditional"] == pytest.approx(0.1)
    assert m["both_correct"] == pytest.approx(0.3)
    assert m["both_wrong"] == pytest.approx(0.3)
    assert (m["harm_count"], m["help_count"]) == (3, 1)
    assert m["mcnemar_p"] == pytest.approx(2 * (1 + 4) / 16)  # P(X <= 1), X ~ Bin(4, 1/2), doubled
    assert m["regime"] == "C"


def test_lengths_format_failures_and_truncation():
    n = 10
    len_x = list(range(1, n + 1))
    len_xc = [2 * v for v in len_x]
    recs = records([1] * n, [1] * n, len_x, len_xc)
    for r in recs[:3]:
        r.x.format_failure = True
    for r in recs[:4]:
        r.xc.truncated = True
    m = compute_metrics(recs, n_bootstrap=0)
    assert m["length_x"] == {"mean": 5.5, "median": 5.5, "p90": pytest.approx(9.1)}
    assert m["length_xc"]["mean"] == 11.0
    assert m["length_change"] == pytest.approx(1.0)  # (11 - 5.5) / 5.5
    assert m["format_failure_x"] == pytest.approx(0.3) and m["format_failure_xc"] == 0.0
    assert m["truncated_x"] == 0.0 and m["truncated_xc"] == pytest.approx(0.4)


def test_all_correct():
    m = compute_metrics(records([1] * 5, [1] * 5))
    assert m["acc_x"] == m["acc_xc"] == m["both_correct"] == 1.0
    assert m["harm"] == 0.0  # defined: 0 harmed out of 5 correct
    assert m["help"] is None  # nothing wrong without the context
    assert m["ci"]["help"] is None
    assert m["ci"]["acc_x"] == [1.0, 1.0]
    assert m["mcnemar_p"] == 1.0 and m["regime"] == "C"


def test_all_wrong():
    m = compute_metrics(records([0] * 5, [0] * 5))
    assert m["acc_x"] == m["acc_xc"] == 0.0 and m["both_wrong"] == 1.0
    assert m["harm"] is None and m["ci"]["harm"] is None
    assert m["help"] == 0.0
    assert m["regime"] == "C"


def test_none_correct_without_context():
    m = compute_metrics(records([0] * 10, [1] * 8 + [0] * 2))
    assert m["harm"] is None and m["harm_unconditional"] == 0.0
    assert m["help"] == pytest.approx(0.8)
    assert m["mcnemar_p"] == pytest.approx(2 / 2**8)
    assert m["regime"] == "B"


def test_ties_are_regime_c():
    m = compute_metrics(records([1] * 5 + [0] * 5, [0] * 5 + [1] * 5))
    assert m["delta"] == 0.0 and m["harm"] == 1.0 and m["help"] == 1.0
    assert m["mcnemar_p"] == 1.0 and m["regime"] == "C"


def test_no_items():
    m = compute_metrics([])
    assert m["n"] == 0 and m["regime"] is None
    assert all(m[k] is None for k in RATE_KEYS)
    assert all(m["ci"][k] is None for k in RATE_KEYS)
    assert m["length_x"]["mean"] is None


def test_mcnemar_known_table():
    assert mcnemar_exact(10, 2) == pytest.approx(0.0386, abs=5e-5)
    assert mcnemar_exact(2, 10) == mcnemar_exact(10, 2)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64)
    scipy_stats = pytest.importorskip("scipy.stats")
    for b, c in [(10, 2), (7, 3), (0, 9), (25, 11)]:
        assert mcnemar_exact(b, c) == pytest.approx(scipy_stats.binomtest(b, b + c, 0.5).pvalue)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


@pytest.mark.parametrize(
    "harm, help_, n, expected",
    [
        (10, 2, 100, "A"),  # p = 0.039: the context significantly hurts
        (2, 10, 100, "B"),  # the context significantly helps
        (6, 0, 50, "A"),  # p = 0.031
        (5, 0, 50, "C"),  # p = 0.0625: too few discordant items to call it
        (4, 4, 50, "C"),  # tie
        (0, 0, 50, "C"),  # views agree on every item
        (0, 0, 0, None),  # no items
    ],
)
def test_regime_rule(harm, help_, n, expected):
    assert classify_regime(harm, help_, n) == expected


def test_regime_alpha_is_respected():
    assert classify_regime(10, 2, 100, alpha=0.01) == "C"
    m = compute_metrics(records([1] * 10 + [0] * 2, [0] * 10 + [1] * 2), alpha=0.05, n_bootstrap=0)
    assert m["regime"] == "A" and m["delta"] < 0


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    cx = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0] * 3
    cxc = [1, 1, 1, 0, 0, 0, 1, 0, 0, 0] * 3
    arrays = paired_arrays(records(cx, cxc))
    a = bootstrap_intervals(arrays, n_resamples=300, seed=1)
    b = bootstrap_intervals(arrays, n_resamples=300, seed=1)
    c = bootstrap_intervals(arrays, n_resamples=300, seed=2)
    assert a == b and a != c
    m = compute_metrics(records(cx, cxc), n_bootstrap=300, seed=1)
    for key in RATE_KEYS:
        low, high = m["ci"][key]
        assert low <= m[key] + 1e-12 and m[key] - 1e-12 <= high, key
    assert m["ci"]["acc_x"][0] < m["acc_x"] < m["ci"]["acc_x"][1]
    narrow = compute_metrics(records(cx, cxc), n_bootstrap=300, seed=1, confidence=0.5)
    assert narrow["ci"]["acc_x"][1] - narrow["ci"]["acc_x"][0] < m["ci"]["acc_x"][1] - m["ci"]["acc_x"][0]


def test_companion_scorer_metrics():
    recs = [PairedRecord(str(i), view(1, strict=i < 2), view(1, strict=False)) for i in range(4)]
    m = compute_metrics(recs, scorer="mcq_strict", n_bootstrap=0)
    assert m["acc_x"] == 0.5 and m["acc_xc"] == 0.0 and m["harm"] == 1.0
    assert m["format_failure_x"] == 0.5
    with pytest.raises(KeyError, match="mcq_strict"):
        compute_metrics(records([1], [1]), scorer="mcq_strict")


def test_flatten_metrics_for_loggers():
    m = compute_metrics(records([1] * 10 + [0] * 2, [0] * 10 + [1] * 2), n_bootstrap=0)
    flat = flatten_metrics(m, "paired/")
    assert flat["paired/acc_x"] == pytest.approx(10 / 12)
    assert flat["paired/regime_code"] == -1.0
    assert flat["paired/length_x_mean"] == 10.0
    assert all(isinstance(v, float) and not math.isnan(v) for v in flat.values())
    assert "paired/help" in flat and "paired/ci" not in flat
    assert "paired/harm" not in flatten_metrics(compute_metrics(records([0], [0]), n_bootstrap=0), "paired/")


def test_count_of_a_conditional_rate():
    """The count behind a rate: whole counts as integers, expected counts (k samples per view) to one decimal, and
    `few` below FEW_ITEMS."""
    from trl_nca.eval.metrics import FEW_ITEMS, count_of

    assert FEW_ITEMS == 10
    assert count_of(6, 35) == "6/35" and count_of(1, 1) == "1/1, few" and count_of(0, 0) == "0/0, few"
    assert count_of(0.9875 * 240 * 0.1, 0.9875 * 240) == "23.7/237" and count_of(2.5, 9.75) == "2.5/9.8, few"
    assert count_of(3, 10) == "3/10"
    # one rounding in every table (issue 57: "0.8/4.7" in comparison.md, "0.8/4.8" in report.md): a count computed
    # back from its rate (30.75 of 240 items answered right, as k=4 samples give) is written as the count itself
    acc_x = 123 / 4 / 240
    assert acc_x * 240 == 30.749999999999996 and count_of(0.8, acc_x * 240) == count_of(0.8, 30.75) == "0.8/30.8"
