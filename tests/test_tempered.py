"""Sampled decoding's rows read in place: the kernel's tempered sums and draws (specviz_tempered,
specviz_tempered_pick in rowscan_kernel.c) against float64 numpy, and TemperedRow against the numpy
distribution it replaces (probs_from_logits, residual_distribution, TokenDist.draw), with and without the
kernel."""

from __future__ import annotations

import numpy as np
import pytest

from specviz.decoding import rowscan_kernel
from specviz.decoding.acceptor import accept
from specviz.decoding.sampling import SamplingParams, probs_from_logits, residual_distribution
from specviz.decoding.tempered import TemperedRow, residual_draw, tempered_or_dist
from specviz.errors import ContextError

needs_kernel = pytest.mark.skipif(
    rowscan_kernel.unavailable_reason() is not None,
    reason=f"the row-scan kernel is not available here: {rowscan_kernel.unavailable_reason()}",
)

PATHS = ["dispatch", "generic"]


def terms(row: np.ndarray, t: float) -> np.ndarray:
    """exp((x − max) / T) in float64, NaN as −∞ (the reference of every sum)."""
    r = np.where(np.isnan(row), -np.inf, row).astype(np.float64)
    return np.exp((r - r.max()) / t)


def reference_draw(e: np.ndarray, leave_out: int, u: float) -> int:
    """numpy's inverse CDF (TokenDist.draw) over the terms with ``leave_out`` removed."""
    r = e.copy()
    if leave_out >= 0:
        r[leave_out] = 0.0
    cdf = np.cumsum(r)
    i = min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), r.shape[0] - 1)
    while r[i] <= 0 and i > 0:
        i -= 1
    return i


def rows(n: int, seed: int, scale: float = 4.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


@needs_kernel
@pytest.mark.parametrize("which", PATHS)
@pytest.mark.parametrize("n", [1, 7, 16, 255, 256, 257, 4096 + 13, 65536 + 300, 262144])
@pytest.mark.parametrize("t", [0.25, 0.8, 1.0, 3.0])
def test_the_tempered_sums_match_float64(which, n, t):
    row = rows(n, n)
    leave_out = n // 3 if n > 1 else -1
    got = rowscan_kernel.tempered(row, 1.0 / t, leave_out, generic=which == "generic")
    assert got is not None
    sums, _ = got
    e = terms(row, t)
    assert sums.max == float(row.max()) and not sums.has_nan
    assert sums.z == pytest.approx(e.sum(), rel=1e-13)
    without = e.sum() - (e[leave_out] if leave_out >= 0 else 0.0)
    assert sums.z_without == pytest.approx(without, rel=1e-12, abs=1e-300)


@needs_kernel
def test_every_exponent_of_the_range_is_accurate_in_double():
    # one value at 0 (the maximum) and one at x: the sum is 1 + e^x; e^x to 1e-15 down to the floor
    xs = np.linspace(-700.0, 0.0, 5001)
    for x in xs:
        row = np.array([0.0, x], dtype=np.float32)
        sums, _ = rowscan_kernel.tempered(row, 1.0, 0)
        want = np.exp(np.float64(np.float32(x)))
        assert abs(sums.z_without - want) <= 2e-15 * want, x
    # at and below the floor (and -inf) a term is 0, as TemperedRow.prob says
    for x in (-708.0, -720.0, -np.inf):
        sums, _ = rowscan_kernel.tempered(np.array([0.0, x], dtype=np.float32), 1.0, 0)
        assert sums.z_without == 0.0 and sums.z == 1.0


@needs_kernel
@pytest.mark.parametrize("which", PATHS)
def test_nan_is_flagged_and_a_row_without_a_finite_value_has_no_sums(which):
    generic = which == "generic"
    row = rows(1000, 3)
    row[17] = np.nan
    sums, _ = rowscan_kernel.tempered(row, 1.0, -1, generic=generic)
    assert sums.has_nan and sums.max == float(np.nanmax(row))
    for bad in ([-np.inf] * 300, [np.inf, 0.0, 1.0]):
        sums, _ = rowscan_kernel.tempered(np.array(bad, dtype=np.float32), 1.0, -1, generic=generic)
        assert not np.isfinite(sums.max) and sums.z == sums.z_without == 0.0


@needs_kernel
@pytest.mark.parametrize("which", PATHS)
@pytest.mark.parametrize("n", [1, 2, 255, 256, 257, 3000, 262144])
def test_a_draw_is_numpys_inverse_cdf(which, n):
    """The first token whose running sum exceeds u times the mass, block sums walked in order: the same
    token as numpy's cumulative sum and searchsorted, with and without a left-out token, at u = 0 and u
    next to 1."""
    rng = np.random.default_rng(n + 1)
    row = rows(n, n + 2, scale=2.0)
    for t in (0.5, 1.0):
        e = terms(row, t)
        for leave_out in (-1, int(np.argmax(row)), n - 1):
            got = rowscan_kernel.tempered(row, 1.0 / t, leave_out, generic=which == "generic")
            assert got is not None
            sums, stamp = got
            us = [0.0, 1.0 - 2**-53, *rng.random(40)]
            for u in us:
                if sums.z_without == 0.0:
                    continue  # one token and it is left out: TemperedRow returns the left-out token
                pick = rowscan_kernel.tempered_pick(row, sums.max, 1.0 / t, leave_out, u * sums.z_without, stamp)
                assert pick == reference_draw(e, leave_out, u), (t, leave_out, u)


@needs_kernel
def test_a_draw_never_takes_the_left_out_token_nor_one_without_mass():
    # only three tokens have mass at this temperature; the draft token (the most likely) is left out
    row = np.full(5000, -1e4, dtype=np.float32)
    row[[10, 2000, 4999]] = [5.0, 4.0, 3.0]
    sums, stamp = rowscan_kernel.tempered(row, 1.0, 10)
    seen = {
        rowscan_kernel.tempered_pick(row, sums.max, 1.0, 10, u * sums.z_without, stamp)
        for u in np.linspace(0.0, 1.0 - 1e-16, 2001)
    }
    assert seen == {2000, 4999}
    # a target past the mass (rounding): the last token with mass, never the left-out one
    sums, stamp = rowscan_kernel.tempered(row, 1.0, 4999)
    assert rowscan_kernel.tempered_pick(row, sums.max, 1.0, 4999, 2 * sums.z, stamp) == 2000
    # nothing but the left-out token has mass
    lone = np.array([0.0, -np.inf, -np.inf], dtype=np.float32)
    sums, stamp = rowscan_kernel.tempered(lone, 1.0, 0)
    assert sums.z_without == 0.0
    assert rowscan_kernel.tempered_pick(lone, 0.0, 1.0, 0, 0.0, stamp) == -1


@needs_kernel
def test_a_stale_stamp_is_refused():
    a, b = rows(600, 1), rows(600, 2)
    _, stamp_a = rowscan_kernel.tempered(a, 1.0, -1)
    rowscan_kernel.tempered(b, 1.0, -1)
    assert rowscan_kernel.tempered_pick(a, float(a.max()), 1.0, -1, 1.0, stamp_a) is None


def tempered_rows() -> list[tuple[np.ndarray, float]]:
    out = []
    for n, seed, scale, t in [(50, 1, 2.0, 1.0), (3000, 2, 4.0, 0.7), (262144, 3, 3.0, 0.8), (1000, 4, 40.0, 0.05)]:
        out.append((rows(n, seed, scale), t))
    return out


@pytest.mark.parametrize("kernel", ["on", "off"])
@pytest.mark.slow
def test_a_tempered_row_is_numpys_distribution(kernel, monkeypatch):
    """prob, draw (p, and p without a left-out token) and the ordering against probs_from_logits,
    residual_distribution and TokenDist.draw, with the kernel and with numpy alone."""
    if kernel == "off":
        monkeypatch.setenv("SPECVIZ_ROWSCAN_KERNEL", "0")
    elif rowscan_kernel.unavailable_reason() is not None:
        pytest.skip(f"the row-scan kernel is not available here: {rowscan_kernel.unavailable_reason()}")
    rng = np.random.default_rng(9)
    for row, t in tempered_rows():
        params = SamplingParams(t)
        p = probs_from_logits(row, params)
        n = row.shape[0]
        tokens = [0, n - 1, int(np.argmax(row)), *rng.integers(0, n, 5)]
        for leave_out in (-1, int(np.argmax(row)), int(rng.integers(0, n))):
            tr = TemperedRow(row, params, leave_out)
            for tok in tokens:
                assert tr.prob(tok) == pytest.approx(p.prob(tok), rel=1e-12, abs=1e-300)
            dist = residual_distribution(p, None, leave_out) if leave_out >= 0 else p
            for u in [0.0, *rng.random(30)]:
                assert tr.draw(u) == dist.draw(u)
            assert [t for t, _ in tr.top(5)] == sorted(range(n), key=lambda i: (-row[i], i))[:5]
            assert tr.rank(tokens[-1]) == 1 + sum(
                1 for i in range(n) if row[i] > row[tokens[-1]] or (row[i] == row[tokens[-1]] and i < tokens[-1])
            )
            assert tr.prob(-1) == tr.prob(n) == 0.0


def test_the_row_orders_tokens_whose_probability_underflows():
    """At a low temperature most probabilities are exactly 0: the alternatives and the rank still follow
    the logits (numpy's distribution could only leave them tied), the same with and without the kernel."""
    row = np.array([0.0, 9.0, -3.0, 8.9, -2.0, 1.0, -50.0, 0.5], dtype=np.float32)
    params = SamplingParams(0.01)
    tr = TemperedRow(row, params)
    assert [t for t, _ in tr.top(6)] == [1, 3, 5, 7, 0, 4]
    assert [p for _, p in tr.top(6)][2:] == [0.0] * 4
    assert tr.rank(6) == 8 and tr.rank(2) == 7
    assert tr.draw(0.0) == 1 and tr.draw(0.999) == 1


def test_nan_and_infinite_rows_take_numpys_rules(monkeypatch):
    params = SamplingParams(0.9)
    row = rows(400, 5)
    row[[3, 77]] = np.nan
    tr = TemperedRow(row, params, 3)
    p = probs_from_logits(row, params)
    assert tr.prob(3) == 0.0 and tr.prob(10) == pytest.approx(p.prob(10), rel=1e-12)
    assert [t for t, _ in tr.top(3)] == [
        int(i) for i in np.argsort(-np.nan_to_num(row, nan=-np.inf), kind="stable")[:3]
    ]
    assert tr.draw(0.5) == residual_distribution(p, None, 3).draw(0.5)
    inf_row = np.array([0.0, np.inf, 1.0, np.inf], dtype=np.float32)
    tr = TemperedRow(inf_row, params)
    assert (tr.prob(1), tr.prob(3), tr.prob(2)) == (0.5, 0.5, 0.0)
    assert tr.draw(0.2) == 1 and tr.draw(0.7) == 3
    with pytest.raises(ContextError, match="no finite value"):
        TemperedRow(np.full(10, -np.inf, dtype=np.float32), params)


@needs_kernel
def test_a_draw_after_another_rows_scan_scans_again():
    a, b = rows(3000, 6), rows(3000, 7)
    params = SamplingParams(1.0)
    ta = TemperedRow(a, params, 5)
    want = [ta.draw(u) for u in (0.1, 0.5, 0.9)]
    TemperedRow(b, params, 8)  # the thread's block sums are b's now
    assert [ta.draw(u) for u in (0.1, 0.5, 0.9)] == want


def test_only_dense_parameters_read_a_row_in_place():
    row = rows(100, 8)
    assert isinstance(tempered_or_dist(row, SamplingParams(0.8)), TemperedRow)
    assert isinstance(tempered_or_dist(row, SamplingParams(0.8, top_k=100)), TemperedRow)
    assert not isinstance(tempered_or_dist(row, SamplingParams(0.8, top_k=10)), TemperedRow)
    assert not isinstance(tempered_or_dist(row, SamplingParams(0.8, top_p=0.9)), TemperedRow)
    assert not isinstance(tempered_or_dist(row, SamplingParams()), TemperedRow)
    with pytest.raises(ValueError, match="dense"):
        TemperedRow(row, SamplingParams(0.8, top_k=5))


def sampled_rounds(draft_len: int, seed: int) -> list:
    """40 sampled rounds on vocabulary-sized rows, each with one peak the draft usually proposes (its
    probability about 0.75 at temperature 1.3) and a runner-up it sometimes proposes instead."""
    n = 262144
    rng_rows = np.random.default_rng(seed)
    base = rng_rows.standard_normal((draft_len + 1, n)).astype(np.float32)
    peaks = rng_rows.integers(0, n, (draft_len + 1, 2))
    for i, (a, b) in enumerate(peaks):
        base[i, a], base[i, b] = 18.0, 16.5
    out = []
    rng = np.random.default_rng(seed)
    for r in range(40):
        draft = [int(peaks[i, 1] if (r + i) % 4 == 0 else peaks[i, 0]) for i in range(draft_len)]
        out.append(accept(draft, lambda i: base[i], SamplingParams(1.3), rng))
    return out


@pytest.mark.slow
def test_a_sampled_round_is_the_same_with_and_without_the_kernel(monkeypatch):
    """The whole verdict (tokens, positions and their uniforms, probabilities, alternatives, rank) of 40
    rounds on vocabulary-sized rows, each path from the same seed."""
    if rowscan_kernel.unavailable_reason() is not None:
        pytest.skip(f"the row-scan kernel is not available here: {rowscan_kernel.unavailable_reason()}")
    with_kernel = sampled_rounds(3, 4)
    monkeypatch.setenv("SPECVIZ_ROWSCAN_KERNEL", "0")
    without = sampled_rounds(3, 4)
    assert len({v.n_accepted for v in with_kernel}) > 1  # rejections at several depths, and full accepts
    for a, b in zip(with_kernel, without):
        assert (a.tokens, a.n_accepted, a.bonus, a.rows_read) == (b.tokens, b.n_accepted, b.bonus, b.rows_read)
        assert [t for t, _ in a.alternatives] == [t for t, _ in b.alternatives]
        assert a.rejected_rank == b.rejected_rank and a.margin == b.margin
        assert np.allclose(a.probs, b.probs, rtol=1e-12, atol=0)
        for pa, pb in zip(a.positions, b.positions):
            assert (pa.index, pa.token, pa.u, pa.accepted) == (pb.index, pb.token, pb.u, pb.accepted)
            assert pa.p == pytest.approx(pb.p, rel=1e-12, abs=1e-300)


@needs_kernel
@pytest.mark.parametrize("which", PATHS)
@pytest.mark.parametrize("n", [1, 7, 256, 257, 5000, 262144])
def test_a_draft_models_residual_is_numpys(which, n):
    """max(0, p − q) normalised: its mass and its draws against residual_distribution and TokenDist.draw."""
    rng = np.random.default_rng(n + 3)
    xp, xq = rows(n, n + 4, scale=1.5), rows(n, n + 5, scale=1.5)
    for t in (0.6, 1.0):
        params = SamplingParams(t)
        p, q = TemperedRow(xp, params), TemperedRow(xq, params)
        ps, qs = rowscan_kernel.RowSums(p.max, p.z), rowscan_kernel.RowSums(q.max, q.z)
        got = rowscan_kernel.residual(xp, xq, ps, qs, 1.0 / t, generic=which == "generic")
        assert got is not None
        total, stamp = got
        pd, qd = probs_from_logits(xp, params), probs_from_logits(xq, params)
        r = np.maximum(pd.probs - qd.probs, 0.0)
        assert total == pytest.approx(r.sum(), rel=1e-12, abs=1e-15)
        want = residual_distribution(pd, qd, int(np.argmax(xq)))
        for u in [0.0, 1.0 - 2**-53, *rng.random(30)]:
            if total > 0:
                assert rowscan_kernel.residual_pick(xp, xq, ps, qs, 1.0 / t, u * total, stamp) == want.draw(u)


def test_residual_draws_in_place_match_the_built_distributions():
    rng = np.random.default_rng(12)
    params = SamplingParams(0.9)
    for n in (300, 262144):
        xp, xq = rows(n, n, scale=2.0), rows(n, n + 1, scale=2.0)
        p, q = TemperedRow(xp, params), TemperedRow(xq, params)
        want = residual_distribution(p.dist(), q.dist(), 0)
        for u in rng.random(20):
            got = residual_draw(p, q, float(u))
            if rowscan_kernel.unavailable_reason() is None:
                assert got == want.draw(float(u))
    # p and q the same row: no residual mass, so the draw is p's own, as numpy's residual is p itself
    x = rows(1000, 3)
    p, q = TemperedRow(x, params), TemperedRow(x.copy(), params)
    if rowscan_kernel.unavailable_reason() is None:
        assert float(np.maximum(p.dist().probs - q.dist().probs, 0).sum()) == 0.0
        assert [residual_draw(p, q, u) for u in (0.1, 0.6)] == [p.draw(0.1), p.draw(0.6)]
    # what the kernel does not take: a row on numpy's path, another temperature, another length
    nan_row = x.copy()
    nan_row[4] = np.nan
    assert residual_draw(TemperedRow(nan_row, params), q, 0.5) is None
    assert residual_draw(p, TemperedRow(x, SamplingParams(0.5)), 0.5) is None
    assert residual_draw(p, TemperedRow(x[:999].copy(), params), 0.5) is None
    assert residual_draw(TemperedRow(x, params, 3), q, 0.5) is None


@pytest.mark.slow
def test_a_sampled_draft_distribution_read_in_place_gives_the_same_rounds(monkeypatch):
    """A draft model's q as a TemperedRow (what draft_model and draft_choice hand the acceptor now) and as
    numpy's TokenDist give the same verdicts from the same seed, rejections (the residual) included."""
    n = 262144
    params = SamplingParams(1.1)
    rng_rows = np.random.default_rng(21)
    target = rng_rows.standard_normal((4, n)).astype(np.float32)
    draft_rows = (target + rng_rows.standard_normal((3, n)).astype(np.float32)[[0, 1, 2, 2]] * 0.8).astype(np.float32)
    for i in range(4):  # a peak the draft shares, less sharply
        target[i, 1000 + i] = 14.0
        draft_rows[i, 1000 + i] = 13.0

    def rounds(kind: str) -> list:
        rng = np.random.default_rng(3)
        out = []
        for _ in range(30):
            qs = [
                TemperedRow(draft_rows[i], params) if kind == "in place" else probs_from_logits(draft_rows[i], params)
                for i in range(3)
            ]
            draft = [qs[i].draw(float(rng.random())) for i in range(3)]
            out.append(accept(draft, lambda i: target[i], params, rng, qs))
        return out

    a, b = rounds("in place"), rounds("built")
    assert any(not v.bonus for v in a) and any(v.n_accepted > 0 for v in a)
    for x, y in zip(a, b):
        assert (x.tokens, x.n_accepted, x.bonus) == (y.tokens, y.n_accepted, y.bonus)
        assert [pv.u for pv in x.positions] == [pv.u for pv in y.positions]
        assert np.allclose(x.probs, y.probs, rtol=1e-12, atol=0)
