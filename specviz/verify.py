"""The acceptor's row scan, shared by plain decoding and speculative verification.

Greedy choice uses explicit rules: the first maximum wins, and NaN counts as negative infinity. A row is
read in place (a zero-copy view of llama.cpp's logits) and scanned once; probabilities come from the
same pass's maximum. The plain path (strategy ``none``) goes through exactly the same functions, so any
difference between plain and speculative greedy output comes from the logits, never from the scan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def greedy_token(row: np.ndarray) -> int:
    """Index of the largest logit: first maximum wins, NaN counts as −∞ (all-NaN → 0)."""
    i = int(np.argmax(row))
    if row[i] != row[i]:  # numpy's argmax stops at the first NaN: rescan with NaN as -inf
        masked = np.where(np.isnan(row), -np.inf, row)
        i = int(np.argmax(masked))
    return i


def _clean(row: np.ndarray) -> np.ndarray:
    if np.isnan(row).any():
        return np.where(np.isnan(row), -np.inf, row)
    return row


def token_prob(row: np.ndarray, token: int) -> float:
    """Softmax probability of ``token`` in ``row`` (temperature 1; NaN as −∞)."""
    r = _clean(row)
    m = r.max()
    if not np.isfinite(m):
        return 0.0 if not np.isfinite(r[token]) else 1.0
    z = np.exp(r - m, dtype=np.float32).sum(dtype=np.float64)
    return float(np.exp(float(r[token]) - float(m)) / z)


def probs_of(row: np.ndarray, tokens: list[int]) -> list[float]:
    """Softmax probabilities of several tokens of one row, one exponent pass."""
    r = _clean(row)
    m = float(r.max())
    if not np.isfinite(m):
        return [0.0 for _ in tokens]
    z = float(np.exp(r - m, dtype=np.float32).sum(dtype=np.float64))
    return [float(np.exp(float(r[t]) - m) / z) for t in tokens]


def top_alternatives(row: np.ndarray, k: int = 5) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens of a row with their probabilities, best first (ties: lowest id)."""
    r = _clean(row)
    k = min(k, r.shape[0])
    idx = np.argpartition(-r, k - 1)[:k]
    idx = idx[np.lexsort((idx, -r[idx]))]
    m = float(r.max())
    z = float(np.exp(r - m, dtype=np.float32).sum(dtype=np.float64))
    return [(int(i), float(np.exp(float(r[i]) - m) / z)) for i in idx]


def top_two_margin(row: np.ndarray) -> float:
    """Difference between the largest and the second largest logit (0 at an exact tie)."""
    return top_two(row)[0]


def top_two(row: np.ndarray) -> tuple[float, int, int]:
    """``(margin, best, runner_up)``: the top-two logit margin and the two token ids (first max wins)."""
    r = _clean(row)
    if r.shape[0] < 2:
        return float("inf"), 0, 0
    best = greedy_token(r)
    saved = r[best]
    r = r.copy() if r is row else r
    r[best] = -np.inf
    second = int(np.argmax(r))
    return float(saved - r[second]), best, second


@dataclass
class GreedyScan:
    """Result of scanning verify rows against a draft: the target's choices and how many matched."""

    target_tokens: list[int]
    n_accepted: int


def scan_greedy(rows, draft: list[int]) -> GreedyScan:
    """Compare the draft with the target's greedy choice row by row, stopping at the first mismatch.

    ``rows(i)`` returns the logits row for batch row ``i`` (row 0 scores the first draft token).
    Returns the target's choices for rows ``0..n_accepted`` (the last is the bonus or correction).
    """
    chosen: list[int] = []
    for i in range(len(draft) + 1):
        t = greedy_token(rows(i))
        chosen.append(t)
        if i == len(draft) or t != draft[i]:
            return GreedyScan(chosen, i)
    raise AssertionError("unreachable")  # pragma: no cover
