"""The logits-row reader in numpy: the reference every question of the native reader is checked against.

A row is a one-dimensional ``float32`` array of the vocabulary size (a zero-copy view of llama.cpp's
logits is fine). The rules, the same in both readers: NaN counts as negative infinity, the first maximum
wins, ties in an ordering go to the lower id, a tempered term ``exp((x − max) · inv_t)`` whose exponent is
at or below :data:`EXP_FLOOR` counts as 0. Each function here answers one question of
:mod:`specviz.decoding.rowscan_kernel` (same name, same arguments, the same named result) with plain numpy,
for every row; the kernel answers the same in one pass where it takes the row. :mod:`specviz.decoding.rowscan`
is the seam that picks; the kernel tests compare the two.

:func:`first_maximum`, :func:`expsum`, :func:`top_ids` and :func:`rank` are also what the seam falls back
to on rows the kernel does not take (or without the kernel); the other functions are reference only (the
core reads those rows, without the kernel, through numpy's built distribution instead,
:func:`specviz.decoding.sampling.probs_from_logits`).
"""

from __future__ import annotations

import math
import threading
from typing import Callable, NamedTuple, Sequence

import numpy as np

__all__ = [
    "EXP_FLOOR",
    "RowScan",
    "TemperedSums",
    "RowSums",
    "Refusal",
    "GreedyRows",
    "NumpyRow",
    "first_maximum",
    "scan",
    "expsum",
    "top_ids",
    "rank",
    "tempered",
    "tempered_pick",
    "residual",
    "residual_pick",
    "nucleus_mass",
    "verify_greedy",
    "logit_margin",
]

#: Exponents at or below this give a term of 0 (``SPECVIZ_EXP_FLOOR`` in ``rowscan_kernel.c``).
EXP_FLOOR = -708.0

# the largest logit range in which the normaliser can skip subtracting the maximum (see expsum)
_DIRECT_LO, _DIRECT_HI = -30.0, 60.0
_local = threading.local()  # one float32 scratch row per thread for expsum's exponentials


class RowScan(NamedTuple):
    """One row read once: the first maximum's index (NaN read as −∞), its value, ``Σ exp(row − max)``
    (meaningless when the maximum is not finite) and whether the row holds a NaN."""

    best: int
    max: float
    z: float
    has_nan: bool


class TemperedSums(NamedTuple):
    """One row's tempered sums: the maximum (NaN skipped), ``Z = Σ exp((x − max) · inv_t)`` over every token,
    the same sum without the left-out token, and whether the row holds a NaN (then the sums are not
    meaningful, nor are they with a non-finite maximum)."""

    max: float
    z: float
    z_without: float
    has_nan: bool


class RowSums(NamedTuple):
    """A tempered row's maximum and ``Z`` (see :class:`TemperedSums`): what a residual needs of each row."""

    max: float
    z: float


class Refusal(NamedTuple):
    """The row that refused its draft token, as a greedy verification reports it: the refused token's
    probability, the row's ``top_n`` best ``(token, probability)`` pairs (best first), the refused token's
    rank (1 = the row's choice) and the top-two logit margin (``None`` with fewer than two alternatives)."""

    prob: float
    alternatives: tuple[tuple[int, float], ...]
    rank: int
    margin: float | None


class GreedyRows(NamedTuple):
    """What a greedy verification read: each row's choice (its first maximum) and that choice's softmax
    probability at temperature 1, for rows ``0 … r − 1``, read while the draft agreed; ``refusal`` is the
    last row's when it refused its draft token (``None`` when every draft token was chosen and the last row
    is the bonus)."""

    tokens: tuple[int, ...]
    probs: tuple[float, ...]
    refusal: Refusal | None


def _sum(values: np.ndarray) -> float:
    """Sum of a float32 vector: einsum's vectorised blocked sum — several times faster than
    ``ndarray.sum`` on a 262 144-entry row, with the same ~1e-7 relative error."""
    return float(np.einsum("i->", values))


def _scratch(n: int) -> np.ndarray:
    """This thread's float32 scratch row of ``n`` values (kept and reused, never allocated per row)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.shape[0] != n:
        buf = _local.buf = np.empty(n, dtype=np.float32)
    return buf


def first_maximum(row: np.ndarray) -> tuple[int, float, np.ndarray]:
    """``(index, value, row)``: the first maximum with NaN read as −∞, and the row itself, or a NaN-free
    copy when it holds a NaN (numpy's argmax stops at the first NaN, so a non-NaN argmax proves there is
    none and only then is a copy made)."""
    i = int(np.argmax(row))
    if row[i] != row[i]:
        row = np.where(np.isnan(row), -np.inf, row)
        i = int(np.argmax(row))
    return i, float(row[i]), row


def expsum(row: np.ndarray, m: float) -> float:
    """``Σ exp(row − m)`` over a NaN-free row whose maximum is ``m`` (float32 exponentials and sum; ~1e-7
    relative error); NaN when ``m`` is not finite."""
    if not math.isfinite(m):
        return float("nan")
    buf = _scratch(row.shape[0]) if row.dtype == np.float32 and row.ndim == 1 else None  # others: their own dtype
    if _DIRECT_LO < m < _DIRECT_HI:
        # Σ exp(l) · exp(−m): one pass fewer, and safe here — no exp(l) overflows float32, nor does their sum
        # (262 144 · e^60 < 3.4e38), and exp(m) is far above underflow
        return _sum(np.exp(row, out=buf)) * math.exp(-m)
    tmp = np.subtract(row, np.float32(m), out=buf)
    np.exp(tmp, out=tmp)
    return _sum(tmp)


def scan(row: np.ndarray) -> RowScan:
    """The greedy scan of a row: its first maximum, the maximum, the normaliser and whether it holds a NaN."""
    best, m, clean = first_maximum(row)
    return RowScan(best, m, expsum(clean, m), clean is not row)


def top_ids(row: np.ndarray, k: int, row_max: float | None = None) -> list[int]:
    """The ids of a NaN-free row's ``k`` largest values, largest first, ties to the lowest id (``row_max``,
    the row's maximum when known, narrows the search)."""
    n = row.shape[0]
    k = min(k, n)
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


def rank(row: np.ndarray, token: int) -> int:
    """``token``'s rank in a NaN-free row (1 = the first maximum; ties go to the lower id)."""
    v = row[token]
    return int(np.count_nonzero(row > v)) + int(np.count_nonzero(row[:token] == v)) + 1


def _terms(row: np.ndarray, m: float, inv_t: float) -> np.ndarray:
    """``exp((x − m) · inv_t)`` in float64, NaN and −∞ as 0, exponents at or below :data:`EXP_FLOOR` as 0."""
    x = (np.where(np.isnan(row), -np.inf, row).astype(np.float64) - m) * inv_t
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(x > EXP_FLOOR, np.exp(x), 0.0)


def tempered(row: np.ndarray, inv_t: float, leave_out: int = -1) -> TemperedSums:
    """The sums of ``exp((row − max) · inv_t)``, with ``leave_out`` (-1: none) left out of the second."""
    has_nan = bool(np.isnan(row).any())
    m = float(np.max(np.where(np.isnan(row), -np.inf, row)))
    e = _terms(row, m, inv_t)
    z = float(e.sum())
    return TemperedSums(m, z, z - (float(e[leave_out]) if leave_out >= 0 else 0.0), has_nan)


def _walk(terms: np.ndarray, target: float) -> int:
    """The first index whose running sum of ``terms`` exceeds ``target``; the last with mass when rounding
    leaves it unreached; -1 when no term has any."""
    cdf = np.cumsum(terms)
    i = int(np.searchsorted(cdf, target, side="right"))
    if i < terms.shape[0]:
        return i
    held = np.flatnonzero(terms > 0.0)
    return int(held[-1]) if held.shape[0] else -1


def tempered_pick(row: np.ndarray, m: float, inv_t: float, leave_out: int, target: float) -> int:
    """The first token (not ``leave_out``) whose running sum of ``exp((row − m) · inv_t)`` exceeds ``target``
    (the last token with mass when rounding leaves it unreached; -1 when no token but ``leave_out`` has any)."""
    e = _terms(row, m, inv_t)
    if leave_out >= 0:
        e[leave_out] = 0.0
    return _walk(e, target)


def _residual_terms(p: np.ndarray, q: np.ndarray, ps: RowSums, qs: RowSums, inv_t: float) -> np.ndarray:
    return np.maximum(_terms(p, ps.max, inv_t) / ps.z - _terms(q, qs.max, inv_t) / qs.z, 0.0)


def residual(p: np.ndarray, q: np.ndarray, ps: RowSums, qs: RowSums, inv_t: float) -> float:
    """The mass of a draft model's residual ``max(0, p − q)``, where ``p`` and ``q`` are the tempered
    softmaxes of two rows of one length (``ps``, ``qs``: their maxima and sums)."""
    return float(_residual_terms(p, q, ps, qs, inv_t).sum())


def residual_pick(p: np.ndarray, q: np.ndarray, ps: RowSums, qs: RowSums, inv_t: float, target: float) -> int:
    """The first token whose running sum of the residual's terms exceeds ``target`` (the last with mass when
    rounding leaves it unreached, -1 when there is none)."""
    return _walk(_residual_terms(p, q, ps, qs, inv_t), target)


def nucleus_mass(row: np.ndarray, m: float, inv_t: float, width: float, n_buckets: int) -> tuple[np.ndarray, int]:
    """The mass of a row's tempered terms by distance below ``m``: bucket ``b`` holds ``exp(−d)`` of the
    tokens whose ``d = (m − x) · inv_t`` lies in ``[b · width, (b + 1) · width)``, for ``b < n_buckets`` (the
    tail beyond, −∞ and NaN are left out); with how many tokens were filed."""
    d = (m - row.astype(np.float64)) * inv_t
    with np.errstate(invalid="ignore"):
        u = d * (1.0 / width)
        filed = u < n_buckets  # NaN and +inf compare false
    mass = np.zeros(n_buckets)
    np.add.at(mass, u[filed].astype(np.int64), np.exp(-d[filed]))
    return mass, int(filed.sum())


class NumpyRow:
    """One logits row scanned by numpy: the greedy choice, the maximum, and (lazily) the softmax normaliser;
    probabilities at temperature 1, the top tokens and a token's rank. The row is read in place unless it
    holds a NaN (then a NaN-free copy is kept)."""

    __slots__ = ("row", "best", "max", "_z")

    def __init__(self, row: np.ndarray) -> None:
        self.best, self.max, self.row = first_maximum(row)
        self._z: float | None = None

    def z(self) -> float:
        """Σ exp(logit − max) over the row (NaN when the maximum is not finite)."""
        if self._z is None:
            self._z = expsum(self.row, self.max)
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
        return rank(self.row, token)


def verify_greedy(
    draft: Sequence[int],
    row: Callable[[int], np.ndarray],
    top_n: int,
    scored: Callable[[np.ndarray], NumpyRow] = NumpyRow,
) -> GreedyRows:
    """A greedy verification's rows, read one at a time: rows ``0 … len(draft)`` of ``row``, each read only
    while the draft agrees, the refusing row's ``top_n`` tokens, the refused token's rank and the top-two
    margin. ``scored`` scans one row (numpy's :class:`NumpyRow`; the seam passes the kernel's). A draft
    token outside the vocabulary raises ``IndexError``."""
    tokens: list[int] = []
    probs: list[float] = []
    k = len(draft)
    for i in range(k + 1):
        sr = scored(row(i))
        tokens.append(sr.best)
        probs.append(sr.prob(sr.best))
        if i == k:
            break
        d = int(draft[i])
        if sr.best != d:
            alts = tuple(sr.top(top_n))
            refused = Refusal(sr.prob(d), alts, _rank(sr, d, alts), logit_margin(sr.row, alts))
            return GreedyRows(tuple(tokens), tuple(probs), refused)
    return GreedyRows(tuple(tokens), tuple(probs), None)


def _rank(sr: NumpyRow, token: int, alts: Sequence[tuple[int, float]]) -> int:
    """Rank of ``token`` in a scanned row: read from the alternatives when it is among them, else one
    counting pass over the row (once per rejection)."""
    for j, (t, _) in enumerate(alts):
        if t == token:
            return j + 1
    return sr.rank(token)


def logit_margin(row: np.ndarray, alts: Sequence[tuple[int, float]]) -> float | None:
    """The top-two logit margin of ``row`` given its best tokens, best first (``None`` with fewer than two)."""
    if len(alts) < 2:
        return None
    return float(row[alts[0][0]]) - float(row[alts[1][0]])
