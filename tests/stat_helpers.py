"""Statistics helpers shared by the sampling and acceptor tests."""

from __future__ import annotations

import math

import numpy as np


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Upper critical value of chi-square(df) by the Wilson-Hilferty approximation.

    z = 3.719 is the standard normal quantile for a tail probability of 1e-4.
    """
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_stat(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over the cells with positive expected probability; also the df."""
    n = counts.sum()
    expected = probs * n
    mask = probs > 0
    assert counts[~mask].sum() == 0, "a token with zero target probability was produced"
    stat = float(((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum())
    return stat, int(mask.sum()) - 1


def _rows(n: int, seed: int, k: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * 1.5).astype(np.float32) for _ in range(k + 1)]
