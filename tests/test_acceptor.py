"""Tests of specviz.decoding.acceptor: one acceptor for greedy and sampled rounds.

Sampled rounds must leave committed tokens distributed exactly as the target samples them (checked
statistically against the target's distribution, with and without a draft distribution); greedy rounds
accept while the draft token is the row's first maximum, read no row past the first rejection, and
consume no random numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
from stat_helpers import _rows, chi2_critical, chi2_stat

from specviz.decoding.acceptor import accept
from specviz.decoding.sampling import SamplingParams, probs_from_logits, sample
from specviz.decoding.tempered import TemperedRow


@pytest.mark.parametrize("use_q", ["built", "in place", False])
@pytest.mark.slow
def test_sampled_speculation_matches_target_distribution(use_q):
    n = 6
    params = SamplingParams(1.0)
    # the target row at position 1 depends on the draft token at position 0 (as a real model does);
    # draft tokens are sampled from q, so draft position 1 only exists along with d_0
    rng_rows = np.random.default_rng(42)
    p0 = (rng_rows.standard_normal(n) * 1.5).astype(np.float32)
    p1_given = [(rng_rows.standard_normal(n) * 1.5).astype(np.float32) for _ in range(n)]
    bonus = (rng_rows.standard_normal(n)).astype(np.float32)
    q0 = (rng_rows.standard_normal(n) * 1.5).astype(np.float32)
    q1 = (rng_rows.standard_normal(n) * 1.5).astype(np.float32)
    if use_q == "in place":  # the draft's rows read in place, as a draft model hands them over
        qd0, qd1 = TemperedRow(q0, params), TemperedRow(q1, params)
    else:
        qd0, qd1 = probs_from_logits(q0, params), probs_from_logits(q1, params)
    rng = np.random.default_rng(2024)
    first = np.zeros(n, dtype=np.int64)
    second_given = np.zeros((n, n), dtype=np.int64)
    draws = 30000
    for _ in range(draws):
        if use_q:
            d0, d1 = sample(qd0, rng), sample(qd1, rng)
            dists = [qd0, qd1]
        else:
            d0, d1 = 2, 4  # a deterministic draft
            dists = None
        rows = [p0, p1_given[d0], bonus]
        out = accept([d0, d1], lambda i, rows=rows: rows[i], params, rng, dists)
        first[out.tokens[0]] += 1
        if len(out.tokens) >= 2:
            second_given[out.tokens[0], out.tokens[1]] += 1
    stat, df = chi2_stat(first, probs_from_logits(p0, params).to_dense())
    assert stat < chi2_critical(df), (stat, df)
    # given that position 0 committed the draft token, the next committed token follows p1(.|d0)
    for t in range(n):
        if second_given[t].sum() > 2000:
            stat, df = chi2_stat(second_given[t], probs_from_logits(p1_given[t], params).to_dense())
            assert stat < chi2_critical(df), (t, stat, df)


@pytest.mark.slow
def test_sampled_speculation_with_top_k_top_p_matches_target():
    n = 20
    params = SamplingParams(0.8, top_k=8, top_p=0.9)
    rows = _rows(n, 7, 1)
    qd = probs_from_logits(_rows(n, 8, 0)[0], params)
    p = probs_from_logits(rows[0], params).to_dense()
    rng = np.random.default_rng(11)
    counts = np.zeros(n, dtype=np.int64)
    for _ in range(20000):
        d = sample(qd, rng)
        out = accept([d], rows, params, rng, [qd])
        counts[out.tokens[0]] += 1
    stat, df = chi2_stat(counts, p)
    assert stat < chi2_critical(df)


def test_same_seed_same_output_and_round_structure():
    n, k = 50, 4
    params = SamplingParams(0.9, top_k=20)
    rows = _rows(n, 3, k)
    qd = [probs_from_logits(r + 0.3, params) for r in _rows(n, 4, k - 1)]

    def run(seed):
        rng = np.random.default_rng(seed)
        outs = []
        for _ in range(30):
            draft = [sample(q, rng) for q in qd]
            outs.append(accept(draft, rows, params, rng, qd))
        return outs

    a, b = run(5), run(5)
    assert a == b  # every field of every verdict, positions and uniforms included
    assert [o.tokens for o in a] != [o.tokens for o in run(6)]
    for o in a:
        assert len(o.tokens) == o.n_accepted + 1 == o.rows_read
        assert len(o.positions) == o.n_accepted + (0 if o.bonus else 1)
        assert all(pv.accepted for pv in o.positions[: o.n_accepted])
        assert o.bonus == (o.n_accepted == k)
        assert o.final_token == o.tokens[-1]
        for pv in o.positions:
            assert pv.accepted == (pv.u < pv.accept_prob)


def test_rows_are_read_lazily():
    n = 10
    rows = _rows(n, 1, 3)
    read = []

    def row(i):
        read.append(i)
        return rows[i]

    # a draft token the target cannot produce (top_k=1 excludes it) is rejected at position 0
    params = SamplingParams(1.0, top_k=1)
    worst = int(np.argmin(rows[0]))
    out = accept([worst, 0, 0], row, params, np.random.default_rng(0))
    assert out.n_accepted == 0 and read == [0] and out.rows_read == 1
    assert out.tokens == (int(np.argmax(rows[0])),)


def test_greedy_params_reduce_to_greedy_verification():
    n = 30
    rows = _rows(n, 9, 3)
    am = [int(np.argmax(r)) for r in rows]
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    out = accept([am[0], am[1], (am[2] + 1) % n], rows, SamplingParams(), rng)
    assert out.tokens == (am[0], am[1], am[2]) and out.n_accepted == 2 and not out.bonus
    out = accept(am[:3], rows, SamplingParams(), rng)
    assert out.tokens == tuple(am) and out.bonus
    assert rng.bit_generator.state == state  # greedy consumes no random numbers


def test_greedy_accepts_while_the_draft_is_the_first_maximum_and_reads_no_further():
    rows = {0: np.array([0, 9, 0, 0.0]), 1: np.array([0, 0, 9, 0.0]), 2: np.array([9, 0, 0, 0.0])}
    calls = []

    def get(i):
        calls.append(i)
        return np.asarray(rows[i], dtype=np.float32)

    v = accept([1, 3, 3], get, SamplingParams(), np.random.default_rng(0))
    assert (v.n_accepted, v.tokens, v.bonus, v.rows_read) == (1, (1, 2), False, 2)
    assert calls == [0, 1]  # the row after the rejection is never read
    assert v.rejected_prob == pytest.approx(float(np.exp(0 - 9) / (np.exp(9) * np.exp(-9) + 3 * np.exp(-9))))
    assert [t for t, _ in v.alternatives][:1] == [2]
    full = accept([1, 2], get, SamplingParams(), np.random.default_rng(0))
    assert (full.n_accepted, full.tokens, full.bonus, full.final_token) == (2, (1, 2, 0), True, 0)
    assert full.rejected_prob is None and full.alternatives == ()
    plain = accept([], get, SamplingParams(), np.random.default_rng(0))
    assert (plain.n_accepted, plain.tokens, plain.bonus) == (0, (1,), True)


def test_greedy_probabilities_are_the_targets_softmax_of_each_committed_token():
    rows = [np.array([1.0, 3.0, 0.0], dtype=np.float32), np.array([2.0, 0.0, 2.5], dtype=np.float32)]
    v = accept([1], rows, SamplingParams(), np.random.default_rng(0))
    for row, tok, p in zip(rows, v.tokens, v.probs):
        e = np.exp(row.astype(np.float64) - row.max())
        assert p == pytest.approx(e[tok] / e.sum(), rel=1e-6)


def test_sampled_rejection_reports_the_refused_tokens_probability_and_alternatives():
    params = SamplingParams(1.0, top_k=2)
    row0 = np.array([0.0, 2.0, 1.0, -5.0], dtype=np.float32)
    # the draft token 3 is outside top-k: p(3) = 0, so it is always rejected
    v = accept([3], [row0, row0], params, np.random.default_rng(1))
    p = probs_from_logits(row0, params)
    assert v.n_accepted == 0 and not v.bonus and v.rejected_prob == 0.0
    assert v.tokens[0] in (1, 2) and v.probs[0] == pytest.approx(p.prob(v.tokens[0]))
    assert list(v.alternatives) == p.top(5)
    assert len(v.positions) == 1 and not v.positions[0].accepted
