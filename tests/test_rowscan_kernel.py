"""The row scan's C kernel (specviz/decoding/rowscan_kernel.c) against float64 numpy, and its fallback."""

from __future__ import annotations

import numpy as np
import pytest

from specviz.decoding import rowscan_kernel
from specviz.decoding.rowscan import ScoredRow

needs_kernel = pytest.mark.skipif(
    rowscan_kernel.unavailable_reason() is not None,
    reason=f"the row-scan kernel is not available here: {rowscan_kernel.unavailable_reason()}",
)


def reference(row: np.ndarray) -> tuple[float, float]:
    """(max, Σ exp(x − max)) in float64 with NaN as −∞."""
    r = np.where(np.isnan(row), -np.inf, row).astype(np.float64)
    m = float(r.max())
    return m, float(np.exp(r - m).sum())


@needs_kernel
@pytest.mark.parametrize("n", [1, 7, 255, 256, 257, 4096 + 13, 262144])
@pytest.mark.parametrize("scale", [0.5, 4.0, 40.0])
def test_the_kernel_matches_float64(n, scale):
    rng = np.random.default_rng(n)
    row = (rng.standard_normal(n) * scale).astype(np.float32)
    m, z = reference(row)
    got = rowscan_kernel.expsum(row, m)
    assert got is not None and abs(got - z) <= 2e-7 * z


@needs_kernel
def test_nan_and_minus_infinity_count_for_nothing_and_far_values_underflow():
    row = np.array([0.0, np.nan, -np.inf, -1.0, -200.0, np.nan] * 100, dtype=np.float32)
    got = rowscan_kernel.expsum(row, 0.0)
    assert got == pytest.approx(100 * (1 + np.exp(-1.0)), rel=1e-7)
    one = np.zeros(1, dtype=np.float32)
    assert rowscan_kernel.expsum(one, 0.0) == pytest.approx(1.0, rel=1e-7)


@needs_kernel
def test_every_exponent_of_the_range_is_accurate():
    x = np.linspace(-86.0, 0.0, 20001).astype(np.float32)
    got = np.array([rowscan_kernel.expsum(x[i : i + 1], 0.0) for i in range(x.shape[0])])
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 2e-7


def test_other_arrays_and_a_switched_off_kernel_get_numpy(monkeypatch):
    row = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    assert rowscan_kernel.expsum(row.astype(np.float64), 0.0) is None
    assert rowscan_kernel.expsum(row[::2], 0.0) is None  # not contiguous
    with_kernel = [ScoredRow(row).prob(t) for t in (0, 5, int(np.argmax(row)))]
    monkeypatch.setenv("SPECVIZ_ROWSCAN_KERNEL", "0")
    assert rowscan_kernel.expsum(row, float(row.max())) is None
    assert rowscan_kernel.unavailable_reason() == "SPECVIZ_ROWSCAN_KERNEL switches it off"
    numpy_only = [ScoredRow(row).prob(t) for t in (0, 5, int(np.argmax(row)))]
    assert np.allclose(with_kernel, numpy_only, rtol=1e-6, atol=0)
    m, z = reference(row)
    assert numpy_only[2] == pytest.approx(1 / z, rel=1e-6)
