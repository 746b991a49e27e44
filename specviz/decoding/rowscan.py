"""The greedy row scan: the target's choice in one logits row, with explicit rules.

As the runner PR's ``LogitRowScan``: the first maximum wins, and NaN counts as negative infinity. A row is
read in place (a zero-copy view of llama.cpp's logits). The acceptor's rows are read once: the C kernel
of :mod:`specviz.decoding.rowscan_kernel` finds the choice, the maximum and the softmax normaliser in one
pass, and a rejection row's alternatives and rank in one pass each; without the kernel numpy does the same
(an argmax pass, an exponential pass and a sum pass, masks for the alternatives). A greedy round on
llama.cpp's rows skips this class altogether: the kernel's ``specviz_verify_greedy`` scans them in one call
with the same rules (:func:`specviz.decoding.acceptor.accept`'s ``native``). Plain
decoding (strategy ``none``) goes through exactly the same scan as speculative verification, so any
difference between plain and speculative greedy output comes from the logits, never from the scan.
"""

from __future__ import annotations

import math

import numpy as np

from .rowscan_kernel import expsum, rank, scan, topk

# the largest logit range in which the normaliser can skip subtracting the maximum (see ScoredRow.z)
_DIRECT_LO, _DIRECT_HI = -30.0, 60.0


def _sum(values: np.ndarray) -> float:
    """Sum of a float32 vector: einsum's vectorised blocked sum — several times faster than
    ``ndarray.sum`` on a 262 144-entry row, with the same ~1e-7 relative error."""
    return float(np.einsum("i->", values))


class ScoredRow:
    """One logits row scanned once: the greedy choice, the maximum, and (lazily) the softmax normaliser.

    NaN is detected for free: numpy's argmax returns the first NaN when there is one, so a non-NaN
    argmax proves the row has none. Only then is a NaN-free copy made. ``buf`` is an optional float32
    scratch array of the row's size, reused across rows to avoid allocating per row. With ``normaliser``
    (the acceptor, which needs the chosen token's probability of every row it reads) the C kernel finds
    the choice and the normaliser in one read of the row (:func:`~specviz.decoding.rowscan_kernel.scan`);
    a row with a NaN, or without the kernel, takes the path above.
    """

    __slots__ = ("row", "best", "max", "_z", "_buf")

    def __init__(self, row: np.ndarray, buf: np.ndarray | None = None, *, normaliser: bool = False) -> None:
        self._buf = buf
        self._z: float | None = None
        if normaliser and (s := scan(row)) is not None and not s.has_nan:
            # the kernel's one pass: the choice and the normaliser together (the row is read once)
            self.row = row
            self.best = s.best
            self.max = s.max
            self._z = s.z if math.isfinite(s.max) else None
            return
        i = int(np.argmax(row))
        if row[i] != row[i]:  # numpy's argmax stops at the first NaN: rescan with NaN as -inf
            row = np.where(np.isnan(row), -np.inf, row)
            i = int(np.argmax(row))
        self.row = row
        self.best = i
        self.max = float(row[i])

    def z(self) -> float:
        """Σ exp(logit − max) over the row (float32 exponentials and sum; ~1e-7 relative error)."""
        if self._z is None:
            if not np.isfinite(self.max):
                self._z = float("nan")
            elif (z := expsum(self.row, self.max)) is not None:
                self._z = z
            else:
                buf = self._buf if self._buf is not None and self._buf.shape == self.row.shape else None
                if _DIRECT_LO < self.max < _DIRECT_HI:
                    # Σ exp(l) · exp(−max): one pass fewer, and safe here — no exp(l) overflows float32,
                    # nor does their sum (262 144 · e^60 < 3.4e38), and exp(max) is far above underflow
                    tmp = np.exp(self.row, out=buf)
                    self._z = _sum(tmp) * math.exp(-self.max)
                else:
                    tmp = np.subtract(self.row, np.float32(self.max), out=buf)
                    np.exp(tmp, out=tmp)
                    self._z = _sum(tmp)
        return self._z

    def prob(self, token: int) -> float:
        """Softmax probability of ``token`` (temperature 1)."""
        v = float(self.row[token])
        if not math.isfinite(self.max):  # all -inf (or +inf present)
            return 1.0 if v == self.max and token == self.best else 0.0
        return math.exp(v - self.max) / self.z()

    def top(self, k: int = 5) -> list[tuple[int, float]]:
        """The ``k`` most likely tokens with their probabilities, best first (ties: lowest id)."""
        return [(i, self.prob(i)) for i in top_ids(self.row, k, self.max)]

    def rank(self, token: int) -> int:
        """``token``'s rank in the row (1 = the first maximum; ties go to the lower id)."""
        return row_rank(self.row, token)


def top_ids(row: np.ndarray, k: int, row_max: float | None = None) -> list[int]:
    """The ids of a NaN-free row's ``k`` largest values, largest first, ties to the lowest id: the kernel's
    one pass, else numpy (``row_max``, the row's maximum when known, narrows numpy's search)."""
    n = row.shape[0]
    k = min(k, n)
    best = topk(row, k)  # the kernel: one read of the row
    if best is not None:
        return [int(i) for i in best]
    m = float(np.max(row)) if row_max is None else row_max
    cand = None
    if np.isfinite(m):
        # the k best are among the logits close to the maximum: look there first (a short list)
        gap = 4.0
        while cand is None and gap <= 64.0:
            near = np.flatnonzero(row >= np.float32(m - gap))
            cand = near if near.shape[0] >= k else None
            gap *= 2
    if cand is None:
        cand = np.arange(n)
    # the k-th best value, then every logit at or above it, so ties resolve to the lowest ids
    kth = row[cand].min() if cand.shape[0] == k else np.partition(row[cand], cand.shape[0] - k)[cand.shape[0] - k]
    idx = cand[row[cand] >= kth]
    idx = idx[np.lexsort((idx, -row[idx]))][:k]
    return [int(i) for i in idx]


def row_rank(row: np.ndarray, token: int) -> int:
    """``token``'s rank in a NaN-free row (1 = the first maximum; ties go to the lower id): the kernel's one
    pass, else numpy."""
    got = rank(row, token)
    if got is not None:
        return got
    v = row[token]
    return int(np.count_nonzero(row > v)) + int(np.count_nonzero(row[:token] == v)) + 1


def top_two(row: np.ndarray) -> tuple[float, int, int]:
    """``(margin, best, runner_up)``: the top-two logit margin and the two token ids (first max wins)."""
    sr = ScoredRow(row)
    r = sr.row
    if r.shape[0] < 2:
        return float("inf"), sr.best, sr.best
    saved = r[sr.best]
    r = r.copy()
    r[sr.best] = -np.inf
    second = int(np.argmax(r))
    return float(saved - r[second]), sr.best, second
