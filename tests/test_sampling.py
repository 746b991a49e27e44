"""Tests of specviz.decoding.sampling: distributions, exact losslessness of the acceptance rule, seeding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from stat_helpers import _rows, chi2_critical, chi2_stat

from specviz.decoding.sampling import (
    SamplingParams,
    TokenDist,
    acceptance_probability,
    probs_from_logits,
    residual_distribution,
    sample,
    sample_token,
)
from specviz.errors import ContextError, KnobError

# ------------------------------------------------------------------------------------------------
# helpers


def ref_probs(row: np.ndarray, t: float, k: int, p: float) -> np.ndarray:
    """Straightforward reference: full sort, documented order (temperature, top-k, softmax, top-p)."""
    x = np.where(np.isnan(row), -np.inf, row).astype(np.float64)
    n = x.shape[0]
    if t == 0:
        out = np.zeros(n)
        out[int(np.argmax(x))] = 1.0
        return out
    order = sorted(range(n), key=lambda i: (-x[i], i))  # descending, lower id first on ties
    keep = order[:k] if 0 < k < n else order
    z = np.full(n, -np.inf)
    z[keep] = x[keep] / t
    e = np.exp(z - z.max())
    pr = e / e.sum()
    if p < 1.0:
        kept = []
        acc = 0.0
        for i in sorted(range(n), key=lambda i: (-pr[i], i)):
            kept.append(i)
            acc += pr[i]
            if acc >= p:
                break
        mask = np.zeros(n, dtype=bool)
        mask[kept] = True
        pr = np.where(mask, pr, 0.0)
        pr /= pr.sum()
    return pr


def dense(weights) -> TokenDist:
    """A dense distribution proportional to ``weights``."""
    w = np.asarray(weights, dtype=np.float64)
    return TokenDist(w / w.sum(), None, int(w.shape[0]))


def random_dist(rng: np.random.Generator, n: int, zeros: int = 0) -> TokenDist:
    w = rng.random(n) ** 2
    if zeros:
        w[rng.choice(n, zeros, replace=False)] = 0.0
    return dense(w)


# ------------------------------------------------------------------------------------------------
# SamplingParams validation


@pytest.mark.parametrize(
    "kw,knob",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": 1000.0}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
    ],
)
def test_params_validation_names_knob_value_and_range(kw, knob):
    with pytest.raises(KnobError) as ei:
        SamplingParams(**kw)
    assert ei.value.knob == knob
    msg = str(ei.value)
    assert knob in msg and repr(kw[knob]) in msg
    assert "[" in msg or "(" in msg  # the allowed range is stated


def test_params_defaults_are_greedy_and_normalised():
    p = SamplingParams()
    assert p.greedy and p.top_k == 0 and p.top_p == 1.0
    q = SamplingParams(temperature=1, top_k=np.int64(5), top_p=1)
    assert not q.greedy and isinstance(q.temperature, float) and isinstance(q.top_k, int)
    assert q.to_dict() == {"temperature": 1.0, "top_k": 5, "top_p": 1.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.temperature = 2.0  # frozen


# ------------------------------------------------------------------------------------------------
# probs_from_logits vs a straightforward reference


@pytest.mark.parametrize(
    "t,k,p",
    [
        (1.0, 0, 1.0),
        (0.7, 0, 1.0),
        (2.5, 0, 1.0),
        (1.0, 5, 1.0),
        (0.5, 1, 1.0),
        (1.0, 0, 0.9),
        (1.0, 0, 0.3),
        (0.8, 10, 0.8),
        (1.3, 50, 0.95),
        (1.0, 200, 1.0),
        (1.0, 0, 1e-9),
    ],
)
def test_probs_match_reference(t, k, p):
    rng = np.random.default_rng(123)
    for _ in range(5):
        row = (rng.standard_normal(97) * 2).astype(np.float32)
        row[rng.choice(97, 6, replace=False)] = row[3]  # ties, including across the boundaries
        got = probs_from_logits(row, SamplingParams(t, k, p)).to_dense()
        want = ref_probs(row, t, k, p)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
        assert abs(got.sum() - 1.0) < 1e-12


def test_top_p_large_vocabulary_matches_reference_and_widens_candidates():
    rng = np.random.default_rng(5)
    row = rng.standard_normal(5000).astype(np.float32)  # flat: the nucleus needs thousands of tokens
    got = probs_from_logits(row, SamplingParams(1.0, 0, 0.95)).to_dense()
    want = ref_probs(row, 1.0, 0, 0.95)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert (got > 0).sum() > 1000


def test_top_k_ties_at_boundary_keep_lowest_ids():
    row = np.array([0.0, 5.0, 3.0, 3.0, 3.0, 1.0], dtype=np.float32)
    d = probs_from_logits(row, SamplingParams(1.0, top_k=3))
    assert list(d.token_ids()) == [1, 2, 3]
    d = probs_from_logits(row, SamplingParams(1.0, top_k=3, top_p=1.0))
    assert d.prob(4) == 0.0 and d.prob(2) == d.prob(3)


def test_top_p_keeps_the_smallest_prefix_whose_mass_reaches_top_p_exactly():
    # four equal logits: each token has probability 1/4 exactly, so the running mass is 1/4, 1/2, 3/4, 1
    row = np.zeros(4, dtype=np.float32)
    d = probs_from_logits(row, SamplingParams(1.0, top_p=0.5))
    assert list(d.token_ids()) == [0, 1]  # 1/4 + 1/4 reaches 0.5: two tokens (ties: lowest ids), not three
    assert list(d.probs) == [0.5, 0.5]
    d = probs_from_logits(row, SamplingParams(1.0, top_p=0.25))
    assert list(d.token_ids()) == [0] and list(d.probs) == [1.0]
    d = probs_from_logits(row, SamplingParams(1.0, top_p=0.5000001))
    assert list(d.token_ids()) == [0, 1, 2]


def test_top_p_keeps_everything_when_rounding_leaves_the_total_just_under_top_p():
    # seven equal logits: 1/7 each, and the float sum of seven sevenths is 1 - 2**-52, below the
    # largest top_p under 1 (1 - 2**-53): no prefix reaches top_p, so the whole support is the nucleus
    top_p = float(np.nextafter(1.0, 0.0))
    assert np.cumsum(np.full(7, 1 / 7))[-1] < top_p  # the premise
    d = probs_from_logits(np.zeros(7, dtype=np.float32), SamplingParams(1.0, top_p=top_p))
    assert list(d.token_ids()) == list(range(7))
    np.testing.assert_allclose(d.probs, np.full(7, 1 / 7), rtol=1e-15)


def test_greedy_is_point_mass_on_first_maximum():
    row = np.array([1.0, 7.0, 7.0, np.nan], dtype=np.float32)
    d = probs_from_logits(row, SamplingParams())
    assert d.prob(1) == 1.0 and d.support_size == 1
    assert sample_token(row, SamplingParams(), np.random.default_rng(0)) == (1, 1.0)


def test_nan_logits_count_as_minus_infinity():
    row = np.array([np.nan, 1.0, np.nan, 0.0, 2.0], dtype=np.float32)
    for prm in [SamplingParams(1.0), SamplingParams(1.0, 2), SamplingParams(0.5, 0, 0.999)]:
        d = probs_from_logits(row, prm)
        assert d.prob(0) == 0.0 and d.prob(2) == 0.0
        np.testing.assert_allclose(d.to_dense(), ref_probs(row, prm.temperature, prm.top_k, prm.top_p))
    nan_first = np.array([np.nan, 0.0, 0.0], dtype=np.float32)
    assert probs_from_logits(nan_first, SamplingParams()).argmax() == 1
    rng = np.random.default_rng(0)
    drawn = {sample_token(row, SamplingParams(3.0), rng)[0] for _ in range(300)}
    assert drawn == {1, 3, 4}


def test_all_nan_row_is_a_typed_error():
    with pytest.raises(ContextError):
        probs_from_logits(np.full(4, np.nan, dtype=np.float32), SamplingParams(1.0))
    with pytest.raises(ContextError):
        probs_from_logits(np.full(4, -np.inf, dtype=np.float32), SamplingParams())


def test_positive_infinity_takes_all_mass():
    row = np.array([0.0, np.inf, 3.0, np.inf], dtype=np.float32)
    d = probs_from_logits(row, SamplingParams(1.0))
    assert d.prob(1) == 0.5 and d.prob(3) == 0.5 and d.prob(2) == 0.0


def test_large_row_sparse_forms():
    rng = np.random.default_rng(1)
    row = (rng.standard_normal(262144) * 4).astype(np.float32)
    d = probs_from_logits(row, SamplingParams(0.7, top_k=40))
    assert d.support_size == 40 and abs(d.probs.sum() - 1) < 1e-12
    assert set(d.token_ids()) == set(np.argsort(-row, kind="stable")[:40])
    d2 = probs_from_logits(row, SamplingParams(0.7, top_p=0.5))
    assert d2.ids is not None and d2.prob(int(np.argmax(row))) > 0
    dense = probs_from_logits(row, SamplingParams(0.7))
    assert dense.ids is None and dense.support_size == 262144


# ------------------------------------------------------------------------------------------------
# exact losslessness of the one-step rule, by enumeration


def exact_output(p: TokenDist, q: TokenDist | None, proposal: np.ndarray) -> np.ndarray:
    """Exact distribution of the committed token when the draft token is drawn from ``proposal``."""
    n = p.n_vocab
    out = np.zeros(n)
    for d in range(n):
        if proposal[d] == 0:
            continue
        a = acceptance_probability(p, q, d)
        assert 0.0 <= a <= 1.0
        out[d] += proposal[d] * a
        if a < 1.0:
            out += proposal[d] * (1.0 - a) * residual_distribution(p, q, d).to_dense()
    return out


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_model_draft_rule_is_exactly_lossless(n):
    rng = np.random.default_rng(n)
    for trial in range(50):
        p = random_dist(rng, n, zeros=int(trial % 2 == 1 and n > 2))
        q = random_dist(rng, n, zeros=int((trial // 2) % 2 == 1 and n > 2))
        out = exact_output(p, q, q.to_dense())
        np.testing.assert_allclose(out, p.to_dense(), atol=1e-12)


def test_model_draft_rule_lossless_with_sparse_forms_from_logits():
    rng = np.random.default_rng(9)
    for _ in range(30):
        p = probs_from_logits(rng.standard_normal(12).astype(np.float32), SamplingParams(0.9, 6, 0.9))
        q = probs_from_logits(rng.standard_normal(12).astype(np.float32), SamplingParams(0.9, 6, 0.9))
        out = exact_output(p, q, q.to_dense())
        np.testing.assert_allclose(out, p.to_dense(), atol=1e-12)


@pytest.mark.parametrize("n", [2, 4, 7])
def test_point_mass_rule_is_lossless_for_any_deterministic_proposal(n):
    rng = np.random.default_rng(100 + n)
    for trial in range(50):
        p = random_dist(rng, n, zeros=int(trial % 3 == 0 and n > 2))
        # any rule picking d from the history: model it as an arbitrary distribution over d
        r = rng.random(n)
        r[rng.integers(n)] = 0.0
        r /= r.sum()
        np.testing.assert_allclose(exact_output(p, None, r), p.to_dense(), atol=1e-12)


def test_draft_token_with_zero_draft_probability_falls_back_to_point_mass_rule():
    p = dense(np.array([0.5, 0.3, 0.2]))
    q = dense(np.array([0.0, 0.5, 0.5]))
    assert acceptance_probability(p, q, 0) == 0.5
    np.testing.assert_allclose(residual_distribution(p, q, 0).to_dense(), [0.0, 0.6, 0.4])
    # conditional on d=0 having been proposed, the committed token still follows p
    a0 = acceptance_probability(p, q, 0)
    branch = np.zeros(3)
    branch[0] = a0
    branch += (1 - a0) * residual_distribution(p, q, 0).to_dense()
    np.testing.assert_allclose(branch, p.to_dense(), atol=1e-12)


def test_residual_all_zero_falls_back_to_p():
    p = dense(np.array([0.25, 0.75]))
    res = residual_distribution(p, p, 1)
    np.testing.assert_allclose(res.to_dense(), p.to_dense())
    point = TokenDist.point_mass(1, 2)
    np.testing.assert_allclose(residual_distribution(point, None, 1).to_dense(), [0.0, 1.0])


# ------------------------------------------------------------------------------------------------
# the sampled procedure: chi-square with fixed seeds, determinism, lazy rows


def test_chi2_helper_detects_a_wrong_distribution():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    wrong = np.array([0.25, 0.25, 0.25, 0.25])
    counts = np.bincount(rng.choice(4, 20000, p=wrong), minlength=4)
    stat, df = chi2_stat(counts, p)
    assert stat > chi2_critical(df)
    counts = np.bincount(rng.choice(4, 20000, p=p), minlength=4)
    stat, df = chi2_stat(counts, p)
    assert stat < chi2_critical(df)


@pytest.mark.slow
def test_plain_sampling_step_matches_distribution_and_is_seeded():
    n = 8
    row = _rows(n, 21, 0)[0]
    params = SamplingParams(1.2, top_p=0.95)
    rng = np.random.default_rng(77)
    counts = np.zeros(n, dtype=np.int64)
    for _ in range(20000):
        tok, prob = sample_token(row, params, rng)
        counts[tok] += 1
    p = probs_from_logits(row, params).to_dense()
    stat, df = chi2_stat(counts, p)
    assert stat < chi2_critical(df)
    a = [sample_token(row, params, np.random.default_rng(3)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    tok, prob = a[0]
    assert prob == pytest.approx(p[tok])


def test_token_dist_helpers():
    d = TokenDist(np.array([0.2, 0.5, 0.3]), np.array([3, 7, 9]), 12)
    assert d.prob(7) == 0.5 and d.prob(8) == 0.0 and d.prob(-1) == 0.0 and d.prob(99) == 0.0
    np.testing.assert_array_equal(d.probs_at(np.array([9, 3, 4, 50])), [0.3, 0.2, 0.0, 0.0])
    assert d.top(2) == [(7, 0.5), (9, 0.3)]
    assert d.argmax() == 7
    assert d.to_dense().sum() == pytest.approx(1.0)
    assert sample(TokenDist.point_mass(5, 10), np.random.default_rng(0)) == 5


def test_top_k_is_the_same_set_with_and_without_the_kernel(monkeypatch):
    """The kernel's one-pass top-k (k up to 64) and numpy's partition keep the same tokens, ties at the
    boundary included (a row of few distinct values puts many ties there)."""
    rng = np.random.default_rng(5)
    rows = [rng.integers(-3, 4, 262144).astype(np.float32), (rng.standard_normal(50000) * 3).astype(np.float32)]
    params = [SamplingParams(0.9, top_k=k) for k in (1, 40, 64, 65, 300)]
    with_kernel = [probs_from_logits(r, p) for r in rows for p in params]
    monkeypatch.setenv("SPECVIZ_ROWSCAN_KERNEL", "0")
    numpy_only = [probs_from_logits(r, p) for r in rows for p in params]
    for a, b in zip(with_kernel, numpy_only):
        assert list(a.token_ids()) == list(b.token_ids())
        np.testing.assert_array_equal(a.probs, b.probs)
    assert list(with_kernel[1].token_ids()) == list(np.flatnonzero(rows[0] == 3)[:40])  # ties: the lowest ids
