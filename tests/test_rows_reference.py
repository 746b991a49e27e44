"""The logits-row reader's two implementations against each other: every question the C kernel
(:mod:`specviz.decoding.rowscan_kernel`) answers, on the same rows, against the numpy reference
(:mod:`specviz.decoding.rows_reference`); and the reference itself on what the seam asks of it without the
kernel."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from specviz.decoding import rows_reference as ref
from specviz.decoding import rowscan, rowscan_kernel

needs_kernel = pytest.mark.skipif(
    rowscan_kernel.unavailable_reason() is not None,
    reason=f"the row-scan kernel is not available here: {rowscan_kernel.unavailable_reason()}",
)

SIZES = [1, 7, 257, 4096 + 13, 262144]


def logits(n: int, seed: int, scale: float = 3.0, ties: bool = False) -> np.ndarray:
    """A random row; with ``ties``, values rounded to a few levels (maxima and the k-th best tie often)."""
    row = np.random.default_rng(seed).standard_normal(n) * scale
    return (np.round(row, 0) if ties else row).astype(np.float32)


@needs_kernel
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("ties", [False, True])
def test_scan_expsum_topk_and_rank_agree(n, ties):
    row = logits(n, n, ties=ties)
    got, want = rowscan_kernel.scan(row), ref.scan(row)
    assert got is not None and (got.best, got.max, got.has_nan) == (want.best, want.max, want.has_nan)
    assert got.z == pytest.approx(want.z, rel=2e-6)
    assert rowscan_kernel.expsum(row, want.max) == pytest.approx(ref.expsum(row, want.max), rel=2e-6)
    for k in {1, min(5, n), min(rowscan_kernel.TOPK_MAX, n)}:
        topk = rowscan_kernel.topk(row, k)
        assert topk is not None and topk.tolist() == ref.top_ids(row, k)
    for t in {0, n // 3, n - 1, want.best}:
        assert rowscan_kernel.rank(row, t) == ref.rank(row, t)


@needs_kernel
def test_a_row_with_nan_scans_alike():
    row = logits(1000, 1)
    row[[3, 500]] = np.nan
    got, want = rowscan_kernel.scan(row), ref.scan(row)
    assert got is not None and got.has_nan and want.has_nan and got.best == want.best


@needs_kernel
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("t", [0.3, 1.0, 2.5])
def test_the_tempered_sums_and_draws_agree(n, t):
    row = logits(n, n + 1)
    leave_out = n // 2 if n > 1 else -1
    got = rowscan_kernel.tempered(row, 1.0 / t, leave_out)
    assert got is not None
    sums, stamp = got
    want = ref.tempered(row, 1.0 / t, leave_out)
    assert (sums.max, sums.has_nan) == (want.max, want.has_nan)
    assert sums.z == pytest.approx(want.z, rel=1e-12)
    assert sums.z_without == pytest.approx(want.z_without, rel=1e-12, abs=1e-300)
    for u in np.random.default_rng(n).random(20):
        target = float(u) * sums.z_without
        pick = rowscan_kernel.tempered_pick(row, sums.max, 1.0 / t, leave_out, target, stamp)
        assert pick == ref.tempered_pick(row, want.max, 1.0 / t, leave_out, target)


@needs_kernel
@pytest.mark.parametrize("n", [1, 257, 5000, 262144])
def test_a_residual_and_its_draws_agree(n):
    xp, xq = logits(n, n + 2, 1.5), logits(n, n + 3, 1.5)
    inv_t = 1.0 / 0.8
    ps = ref.RowSums(*ref.tempered(xp, inv_t)[:2])
    qs = ref.RowSums(*ref.tempered(xq, inv_t)[:2])
    got = rowscan_kernel.residual(xp, xq, ps, qs, inv_t)
    assert got is not None
    total, stamp = got
    assert total == pytest.approx(ref.residual(xp, xq, ps, qs, inv_t), rel=1e-12, abs=1e-15)
    if total > 0:
        for u in np.random.default_rng(n).random(20):
            target = float(u) * total
            pick = rowscan_kernel.residual_pick(xp, xq, ps, qs, inv_t, target, stamp)
            assert pick == ref.residual_pick(xp, xq, ps, qs, inv_t, target)


@needs_kernel
@pytest.mark.parametrize("n", [1, 17, 1000, 262144])
def test_the_mass_by_distance_agrees(n):
    row = logits(n, n + 4)
    if n > 20:
        row[[3, 11]] = [-np.inf, np.nan]
    m = float(np.nanmax(row))
    got = rowscan_kernel.nucleus_mass(row, m, 1.0 / 0.7, 0.02, 512)
    assert got is not None
    mass, filed = got
    want_mass, want_filed = ref.nucleus_mass(row, m, 1.0 / 0.7, 0.02, 512)
    assert filed == want_filed
    np.testing.assert_allclose(mass, want_mass, rtol=1e-13, atol=1e-300)


ROW_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)


@needs_kernel
@pytest.mark.parametrize("n", [6, 1000, 262144])
@pytest.mark.parametrize("top_n", [1, 2, 5])
def test_a_greedy_verification_agrees(n, top_n):
    """The kernel's one call on a batch against the reference's rows read one by one: the same choices,
    the same refusal (alternatives, rank), probabilities to the float32 sums' accuracy."""
    rng = np.random.default_rng(n + top_n)
    rows = [logits(n, int(s), ties=True) for s in rng.integers(0, 1 << 30, 5)]
    fn = ROW_FN(lambda ctx, i: rows[i].ctypes.data)
    source = (ctypes.cast(fn, ctypes.c_void_p).value or 0, 0, n)
    choices = [ref.first_maximum(r)[0] for r in rows]
    for depth in range(5):
        draft = choices[:4]
        if depth < 4:
            draft[depth] = (draft[depth] + 1) % n if n > 1 else draft[depth]
        got = rowscan_kernel.verify_greedy(source, draft, min(top_n, n))
        want = ref.verify_greedy(draft, rows.__getitem__, min(top_n, n))
        assert got is not None and got.tokens == want.tokens
        assert got.probs == pytest.approx(want.probs, rel=2e-6)
        assert (got.refusal is None) == (want.refusal is None)
        if got.refusal is not None and want.refusal is not None:
            assert [t for t, _ in got.refusal.alternatives] == [t for t, _ in want.refusal.alternatives]
            assert (got.refusal.rank, got.refusal.margin) == (want.refusal.rank, want.refusal.margin)
            assert got.refusal.prob == pytest.approx(want.refusal.prob, rel=2e-6)


def test_the_seam_reads_with_the_reference_alone(monkeypatch):
    """Switched off, the seam's answers are the reference's, the same as the kernel's where it runs."""
    row = logits(20000, 5, ties=True)
    with_kernel = (rowscan.top_ids(row, 5), rowscan.row_rank(row, 77), rowscan.ScoredRow(row, normaliser=True).best)
    monkeypatch.setenv("SPECVIZ_ROWSCAN_KERNEL", "0")
    assert rowscan.native_unavailable_reason() == "SPECVIZ_ROWSCAN_KERNEL switches it off"
    numpy_only = (rowscan.top_ids(row, 5), rowscan.row_rank(row, 77), rowscan.ScoredRow(row, normaliser=True).best)
    assert with_kernel == numpy_only == (ref.top_ids(row, 5), ref.rank(row, 77), ref.first_maximum(row)[0])
    assert rowscan.tempered(row, 1.0) is None  # sampled rows are then read through numpy's distribution


def test_the_reference_greedy_rows_follow_the_greedy_rule():
    rows = [np.array([0.0, 2.0, 1.0], dtype=np.float32), np.array([3.0, 1.0, 3.0], dtype=np.float32)]
    full = ref.verify_greedy([1], rows.__getitem__, 2)
    assert full.tokens == (1, 0) and full.refusal is None
    refused = ref.verify_greedy([2], rows.__getitem__, 2)
    assert refused.tokens == (1,) and refused.refusal is not None
    assert [t for t, _ in refused.refusal.alternatives] == [1, 2]
    assert refused.refusal.rank == 2 and refused.refusal.margin == 1.0
    with pytest.raises(IndexError):
        ref.verify_greedy([7], rows.__getitem__, 2)
