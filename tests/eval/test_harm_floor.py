"""The harm floor (`trl_nca.eval.metrics`, docs/evaluation.md "The harm floor"): the harm and help a context with no
effect gives from each item's own success rate, and the excess over it, against exact enumeration and simulations
with a known null and a known effect."""

import itertools

import numpy as np
import pytest

from trl_nca.eval import compute_metrics
from trl_nca.eval.columns import no_effect_terms
from trl_nca.eval.records import PairedRecord, ViewOutcome


def view(correct_samples):
    """A view whose k samples are right or wrong as given."""
    outcomes = [ViewOutcome(str(i), None, bool(c), 3, False, False) for i, c in enumerate(correct_samples)]
    first = outcomes[0]
    first.extra = {"samples": [vars(o) for o in outcomes[1:]]} if len(outcomes) > 1 else {}
    return first


def records_of(x: np.ndarray, xc: np.ndarray) -> list[PairedRecord]:
    """Records from per-item, per-sample outcomes (arrays of shape items x k)."""
    return [PairedRecord(f"i{i}", view(a), view(b)) for i, (a, b) in enumerate(zip(x.tolist(), xc.tolist()))]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_each_item_term_is_the_mean_harm_term_over_the_splits_of_its_samples_between_the_views(k):
    # a context with no effect: the item's 2k samples are exchangeable, every split into k and k equally likely
    for right in range(2 * k + 1):
        pooled = [1] * right + [0] * (2 * k - right)
        terms = []
        for chosen in itertools.combinations(range(2 * k), k):
            x = [pooled[i] for i in chosen]
            xc = [pooled[i] for i in range(2 * k) if i not in chosen]
            terms.append(np.mean(x) * (1 - np.mean(xc)))
        term = no_effect_terms(np.array([np.mean(pooled)]), np.array([np.mean(pooled)]), k)[0]
        assert term == pytest.approx(np.mean(terms), abs=1e-15)


def test_floor_and_excess_of_a_small_example_by_hand():
    # k = 2: p_x = (1, 1/2, 0, 0), p_xc = (1/2, 1/2, 1, 1); right answers among the 4 samples: 3, 2, 2, 2
    x = np.array([[1, 1], [1, 0], [0, 0], [0, 0]])
    xc = np.array([[1, 0], [0, 1], [1, 1], [1, 1]])
    m = compute_metrics(records_of(x, xc), n_bootstrap=200)
    terms = 3 * 1 / 12 + 3 * (2 * 2 / 12)  # s (m - s) / (m (m - 1)), m = 4
    assert m["harm_floor"] == pytest.approx(terms / 1.5) and m["help_floor"] == pytest.approx(terms / 2.5)
    assert m["harm_excess"] == pytest.approx(m["harm"] - m["harm_floor"])
    assert m["help_excess"] == pytest.approx(m["help"] - m["help_floor"])
    low, high = m["ci"]["harm_excess"]
    assert low <= m["harm_excess"] <= high


def simulate(p_x: np.ndarray, p_xc: np.ndarray, k: int, rng) -> dict:
    """The metrics of one paired evaluation: item i answered k times per view, right with p_x[i] / p_xc[i]."""
    x = rng.random((p_x.size, k)) < p_x[:, None]
    xc = rng.random((p_x.size, k)) < p_xc[:, None]
    return compute_metrics(records_of(x.astype(int), xc.astype(int)), n_bootstrap=0), x.mean(1), xc.mean(1)


def standard_error(p_x_hat, p_xc_hat, k, kind="harm") -> float:
    """Error model of the excess: sum_i d_i / sum_i w_i with independent per-item terms d_i (harm: p_x,i (1 - p_xc,i)
    - u_i over w_i = p_x,i; help: (1 - p_x,i) p_xc,i - u_i over w_i = 1 - p_x,i); its standard error from the items'
    own spread, the denominator held fixed (its own noise is of a smaller order here)."""
    observed = p_x_hat * (1 - p_xc_hat) if kind == "harm" else (1 - p_x_hat) * p_xc_hat
    weight = p_x_hat if kind == "harm" else 1 - p_x_hat
    d = observed - no_effect_terms(p_x_hat, p_xc_hat, k)
    return float(d.std(ddof=1) * np.sqrt(d.size) / weight.sum())


N_ITEMS, K = 6_000, 4


def test_a_context_with_no_effect_has_no_excess_harm_or_help():
    rng = np.random.default_rng(0)
    p = rng.beta(2.0, 1.0, N_ITEMS)  # items of different difficulty, the same in both views
    m, p_x_hat, p_xc_hat = simulate(p, p, K, rng)
    assert m["harm_floor"] > 0.2  # the noise alone: E[p (1 - p)] / E[p] = 1/4 here
    assert abs(m["harm_excess"]) < 4 * standard_error(p_x_hat, p_xc_hat, K), m["harm_excess"]
    assert abs(m["help_excess"]) < 4 * standard_error(p_x_hat, p_xc_hat, K, "help"), m["help_excess"]


def test_a_context_that_breaks_answers_has_the_excess_harm_it_was_given():
    # the context turns each right answer wrong with probability e; the expected excess follows from the two views'
    # success rates: the floor term is the share of ordered pairs of distinct samples (right, wrong) among the 2k
    rng = np.random.default_rng(1)
    p = rng.beta(2.0, 1.0, N_ITEMS)
    e = 0.3
    q = p * (1 - e)
    m, p_x_hat, p_xc_hat = simulate(p, q, K, rng)
    same = K * (K - 1) * (p * (1 - p) + q * (1 - q))
    across = K * K * (p * (1 - q) + q * (1 - p))
    floor_term = (same + across) / (2 * K * (2 * K - 1))
    expected_excess = (p * (1 - q) - floor_term).sum() / p.sum()
    se = standard_error(p_x_hat, p_xc_hat, K)
    assert expected_excess > 0.08
    assert m["harm_excess"] == pytest.approx(expected_excess, abs=4 * se)
    assert m["harm"] == pytest.approx(m["harm_floor"] + m["harm_excess"])


def test_the_comparison_table_shows_the_excess_with_its_interval_and_no_floor_over_few_items():
    from trl_nca.recipes.statistics import SUMMARY_KEYS, aggregate, render_table, table_legend

    def row(acc_x, harm, floor, seed):
        return {
            "acc_x": acc_x,
            "acc_xc": 0.8,
            "harm": harm,
            "harm_floor": floor,
            "harm_excess": harm - floor,
            "ci": {"harm_excess": [harm - floor - 0.02, harm - floor + 0.03]},
            "regime": "C",
            "seed": seed,
        }

    per_seed = {"base": [row(0.01, 0.0, 30.0, None)], "opd": [row(0.8, 0.2, 0.15, 0), row(0.7, 0.25, 0.2, 1)]}
    keys = [k for k in SUMMARY_KEYS if k in ("acc_x", "acc_xc", "harm", "harm_floor", "harm_excess")]
    table = render_table(aggregate(per_seed, keys), per_seed, keys, n_items=240)
    assert "| Harm floor | Excess harm |" in table
    assert "| opd | 0 | 80.0 | 80.0 | 20.0 (38.4/192) | 15.0 | 5.0 [3.0, 8.0] | C |" in table
    assert "| base | - | 1.0 | 80.0 | 0.0 (0/2.4, few) | n/a (few) | n/a (few) | C |" in table
    assert "| base | 1 | 1.0 | 80.0 | 0.0 (few) | n/a (few) | n/a (few) | C |" in table
    assert "Excess harm per run carries its 95% bootstrap interval" in table_legend(keys)
