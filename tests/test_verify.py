"""The shared row scan: first maximum wins, NaN is −∞; probabilities and alternatives."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specviz import verify


def reference_argmax(row):
    best, best_i = -math.inf, 0
    for i, v in enumerate(row):
        v = -math.inf if v != v else v
        if v > best:
            best, best_i = v, i
    return best_i


def test_first_maximum_wins():
    assert verify.greedy_token(np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)) == 1


def test_nan_counts_as_negative_infinity():
    assert verify.greedy_token(np.array([np.nan, 1.0, 5.0, np.nan], dtype=np.float32)) == 2
    assert verify.greedy_token(np.array([1.0, np.nan, 0.5], dtype=np.float32)) == 0


def test_all_nan_and_all_minus_inf_pick_zero():
    assert verify.greedy_token(np.full(5, np.nan, dtype=np.float32)) == 0
    assert verify.greedy_token(np.full(5, -np.inf, dtype=np.float32)) == 0


def test_nan_before_tie():
    assert verify.greedy_token(np.array([np.nan, 2.0, 2.0], dtype=np.float32)) == 1


values = st.one_of(st.floats(-5, 5, width=32), st.just(float("nan")), st.just(float("-inf")), st.sampled_from([0.0, 1.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(values, min_size=1, max_size=40))
def test_greedy_matches_the_reference_scan(vals):
    row = np.array(vals, dtype=np.float32)
    assert verify.greedy_token(row) == reference_argmax(row.tolist())


def test_probabilities_sum_to_one_and_match_softmax():
    rng = np.random.default_rng(1)
    row = rng.standard_normal(1000).astype(np.float32) * 3
    p = np.exp(row.astype(np.float64) - row.max())
    p /= p.sum()
    for t in (0, 5, int(np.argmax(row))):
        assert abs(verify.token_prob(row, t) - p[t]) < 1e-5
    got = verify.probs_of(row, [1, 2, 3])
    assert np.allclose(got, p[[1, 2, 3]], atol=1e-6)


def test_top_alternatives_are_sorted_and_ties_prefer_low_ids():
    row = np.array([0.0, 5.0, 1.0, 5.0, 3.0, np.nan], dtype=np.float32)
    alts = verify.top_alternatives(row, 3)
    assert [a[0] for a in alts] == [1, 3, 4]
    assert alts[0][1] == alts[1][1] > alts[2][1]


def test_top_two_margin():
    assert verify.top_two_margin(np.array([1.0, 4.0, 2.5], dtype=np.float32)) == 1.5
    assert verify.top_two_margin(np.array([3.0, 3.0], dtype=np.float32)) == 0.0


def test_scan_greedy_stops_at_first_mismatch():
    rows = {0: np.array([0, 9, 0, 0.0]), 1: np.array([0, 0, 9, 0.0]), 2: np.array([9, 0, 0, 0.0])}
    calls = []

    def get(i):
        calls.append(i)
        return rows[i]

    scan = verify.scan_greedy(get, [1, 3, 3])
    assert scan.n_accepted == 1
    assert scan.target_tokens == [1, 2]
    assert calls == [0, 1]  # the row after the rejection is never read
    full = verify.scan_greedy(lambda i: rows[i], [1, 2])
    assert full.n_accepted == 2 and full.target_tokens == [1, 2, 0]
