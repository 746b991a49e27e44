"""The greedy row scan: first maximum wins, NaN is −∞; probabilities, alternatives, the top-two margin."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specviz.decoding.rowscan import ScoredRow, top_two


def reference_argmax(row):
    best, best_i = -math.inf, 0
    for i, v in enumerate(row):
        v = -math.inf if v != v else v
        if v > best:
            best, best_i = v, i
    return best_i


def test_first_maximum_wins():
    assert ScoredRow(np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)).best == 1


def test_nan_counts_as_negative_infinity():
    assert ScoredRow(np.array([np.nan, 1.0, 5.0, np.nan], dtype=np.float32)).best == 2
    assert ScoredRow(np.array([1.0, np.nan, 0.5], dtype=np.float32)).best == 0


def test_all_nan_and_all_minus_inf_pick_zero():
    assert ScoredRow(np.full(5, np.nan, dtype=np.float32)).best == 0
    assert ScoredRow(np.full(5, -np.inf, dtype=np.float32)).best == 0


def test_nan_before_tie():
    assert ScoredRow(np.array([np.nan, 2.0, 2.0], dtype=np.float32)).best == 1


values = st.one_of(
    st.floats(-5, 5, width=32), st.just(float("nan")), st.just(float("-inf")), st.sampled_from([0.0, 1.0])
)


@settings(max_examples=300, deadline=None)
@given(st.lists(values, min_size=1, max_size=40))
def test_greedy_matches_the_reference_scan(vals):
    row = np.array(vals, dtype=np.float32)
    assert ScoredRow(row).best == reference_argmax(row.tolist())


def test_probabilities_sum_to_one_and_match_softmax():
    rng = np.random.default_rng(1)
    row = rng.standard_normal(1000).astype(np.float32) * 3
    p = np.exp(row.astype(np.float64) - row.max())
    p /= p.sum()
    for t in (0, 5, int(np.argmax(row))):
        assert abs(ScoredRow(row).prob(t) - p[t]) < 1e-5
    sr = ScoredRow(row)
    got = [sr.prob(t) for t in (1, 2, 3)]
    assert np.allclose(got, p[[1, 2, 3]], atol=1e-6)


def test_top_alternatives_are_sorted_and_ties_prefer_low_ids():
    row = np.array([0.0, 5.0, 1.0, 5.0, 3.0, np.nan], dtype=np.float32)
    alts = ScoredRow(row).top(3)
    assert [a[0] for a in alts] == [1, 3, 4]
    assert alts[0][1] == alts[1][1] > alts[2][1]


def _reference_top(row, k):
    vals = [(-math.inf if v != v else float(v)) for v in row]
    order = sorted(range(len(vals)), key=lambda i: (-vals[i], i))
    return order[:k]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from([-100.0, -3.0, -1.0, 0.0, 0.5, 1.0, 2.0, 7.0, 7.5, 8.0, float("nan")]), min_size=1, max_size=40
    ),
    st.integers(1, 8),
)
def test_top_alternatives_match_a_reference_sort_with_ties(vals, k):
    row = np.array(vals, dtype=np.float32)
    assert [t for t, _ in ScoredRow(row).top(k)] == _reference_top(vals, k)


def test_top_alternatives_on_vocabulary_sized_rows():
    rng = np.random.default_rng(3)
    n = 262144
    for spread, ties in ((3.0, False), (0.05, False), (3.0, True), (200.0, False)):
        row = (rng.standard_normal(n) * spread).astype(np.float32)
        if ties:  # several tokens share the best values: the lowest ids must win
            row[[7, 70000, 200000, 9]] = row.max() + 1
        got = [t for t, _ in ScoredRow(row).top(5)]
        ref = np.lexsort((np.arange(n), -row))[:5].tolist()
        assert got == ref, (spread, ties)


@pytest.mark.parametrize("shift", [0.0, 45.0, -25.0, 80.0, -60.0])
def test_normaliser_is_exact_inside_and_outside_the_direct_range(shift):
    rng = np.random.default_rng(4)
    row = (rng.standard_normal(262144) * 3 + shift).astype(np.float32)
    exact = float(np.exp(row.astype(np.float64) - float(row.max())).sum())
    assert abs(ScoredRow(row).z() - exact) / exact < 2e-6
    best = int(np.argmax(row))
    assert abs(ScoredRow(row).prob(best) - 1 / exact) * exact < 2e-6


def test_top_two_margin_and_tokens():
    assert top_two(np.array([1.0, 4.0, 2.5], dtype=np.float32)) == (1.5, 1, 2)
    assert top_two(np.array([3.0, 3.0], dtype=np.float32)) == (0.0, 0, 1)
    assert top_two(np.array([np.nan, 2.0, 1.0], dtype=np.float32)) == (1.0, 1, 2)


def test_top_two_of_a_single_entry_row_has_an_infinite_margin():
    # a one-token vocabulary has no runner-up: the choice cannot be a near tie
    assert top_two(np.array([0.3], dtype=np.float32)) == (float("inf"), 0, 0)
