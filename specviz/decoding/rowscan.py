"""The logits-row reader's seam: every core module reads logits rows through here, never through the
kernel module.

Two implementations answer the same questions with the same rules (the first maximum wins, NaN counts as
negative infinity, ties in an ordering go to the lower id): the numpy reference
(:mod:`specviz.decoding.rows_reference`) and the C kernel (:mod:`specviz.decoding.rowscan_kernel`), which
reads a row in one pass. This module picks: the kernel where it reads the row, else the reference. A row is
read in place (a zero-copy view of llama.cpp's logits).

- :class:`ScoredRow`: one row's greedy choice, maximum and softmax normaliser (one pass of the kernel
  with ``normaliser``), probabilities, top tokens and a token's rank; :func:`top_ids`, :func:`row_rank`,
  :func:`expsum`, :func:`top_two` the same questions alone.
- :func:`read_greedy`: a greedy verification's rows (:class:`GreedyRows`): on a :class:`ContextRows` in one
  call of the kernel, else row by row.
- :func:`tempered`, :func:`tempered_pick`, :func:`residual`, :func:`residual_pick`, :func:`nucleus_mass`:
  sampled rows read in place by the kernel, or ``None``, where the caller builds numpy's distribution
  (:func:`specviz.decoding.sampling.probs_from_logits`), the reference for those rows.

Plain decoding (strategy ``none``) goes through exactly the same scan as speculative verification, so any
difference between plain and speculative greedy output comes from the logits, never from the scan.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol, Sequence, Union

import numpy as np

from . import rows_reference as reference
from . import rowscan_kernel as native
from .rows_reference import EXP_FLOOR, GreedyRows, Refusal, RowScan, RowSums, TemperedSums, logit_margin
from .rowscan_kernel import NativeRowSource, nucleus_mass, residual, residual_pick, tempered, tempered_pick

__all__ = [
    "EXP_FLOOR",
    "ContextRows",
    "GreedyRows",
    "Refusal",
    "RowScan",
    "RowSource",
    "RowSums",
    "ScoredRow",
    "TemperedSums",
    "expsum",
    "logit_margin",
    "native_unavailable_reason",
    "nucleus_mass",
    "read_greedy",
    "residual",
    "residual_pick",
    "row_rank",
    "tempered",
    "tempered_pick",
    "top_ids",
    "top_two",
]


class RowContext(Protocol):
    """A context whose last verify batch's rows can be read: row by row, and where compiled code finds them
    (:class:`specviz.backends.llama.LlamaContext`)."""

    def row(self, i: int) -> np.ndarray:
        """Batch row ``i``'s logits as a float32 view."""
        ...

    def native_rows(self) -> NativeRowSource | None:
        """Where compiled code reads the same rows, or ``None`` when it cannot."""
        ...


class ContextRows:
    """A verify batch's rows on a context: ``rows(i)`` is row ``i`` (zero-copy, valid until the next eval),
    and :func:`read_greedy` hands the whole batch to the kernel in one call where the context says where
    its rows are."""

    __slots__ = ("context",)

    def __init__(self, context: RowContext) -> None:
        self.context = context

    def __call__(self, i: int) -> np.ndarray:
        return self.context.row(i)

    def native_source(self) -> NativeRowSource | None:
        """Where the kernel reads these rows (``None``: it reads them row by row, as numpy does)."""
        return self.context.native_rows()


#: Rows as the acceptor takes them: a callable of the row index, a sequence, or a :class:`ContextRows`.
RowSource = Union[Callable[[int], np.ndarray], Sequence[np.ndarray], ContextRows]


def native_unavailable_reason() -> str | None:
    """Why rows are read by numpy alone here (no kernel), or ``None`` when the kernel reads them."""
    return native.unavailable_reason()


def expsum(row: np.ndarray, m: float) -> float:
    """``Σ exp(row − m)`` over a NaN-free row whose maximum is ``m`` (NaN when ``m`` is not finite)."""
    if not math.isfinite(m):
        return float("nan")
    got = native.expsum(row, m)
    return got if got is not None else reference.expsum(row, m)


def top_ids(row: np.ndarray, k: int, row_max: float | None = None) -> list[int]:
    """The ids of a NaN-free row's ``k`` largest values, largest first, ties to the lowest id (``row_max``,
    the row's maximum when known, narrows numpy's search)."""
    best = native.topk(row, min(k, row.shape[0]))
    if best is not None:
        return [int(i) for i in best]
    return reference.top_ids(row, k, row_max)


def row_rank(row: np.ndarray, token: int) -> int:
    """``token``'s rank in a NaN-free row (1 = the first maximum; ties go to the lower id)."""
    got = native.rank(row, token)
    return got if got is not None else reference.rank(row, token)


class ScoredRow(reference.NumpyRow):
    """One logits row scanned once: the greedy choice, the maximum, and (lazily) the softmax normaliser;
    probabilities at temperature 1, the top tokens and a token's rank, each from the kernel where it reads
    the row. With ``normaliser`` (the acceptor, which needs the chosen token's probability of every row it
    reads) the kernel finds the choice and the normaliser in one read of the row; a row with a NaN, or one
    the kernel does not read, is scanned by numpy (a NaN-free copy where it holds a NaN)."""

    __slots__ = ()

    def __init__(self, row: np.ndarray, *, normaliser: bool = False) -> None:
        if normaliser and (s := native.scan(row)) is not None and not s.has_nan:
            self.row, self.best, self.max = row, s.best, s.max
            self._z = s.z if math.isfinite(s.max) else None
            return
        super().__init__(row)

    def z(self) -> float:
        """Σ exp(logit − max) over the row (float32 exponentials and sum; ~1e-7 relative error)."""
        if self._z is None:
            self._z = expsum(self.row, self.max)
        return self._z

    def top(self, k: int = 5) -> list[tuple[int, float]]:
        """The ``k`` most likely tokens with their probabilities, best first (ties: lowest id)."""
        return [(i, self.prob(i)) for i in top_ids(self.row, k, self.max)]

    def rank(self, token: int) -> int:
        """``token``'s rank in the row (1 = the first maximum; ties go to the lower id)."""
        return row_rank(self.row, token)


def _acceptor_row(row: np.ndarray) -> ScoredRow:
    return ScoredRow(row, normaliser=True)


def read_greedy(draft: Sequence[int], rows: RowSource, top_n: int) -> GreedyRows:
    """A greedy verification's rows: rows ``0 … len(draft)``, each read only while the draft agrees (its
    choice and that choice's probability), and the refusing row's ``top_n`` alternatives, the refused token's
    probability and rank and the top-two margin. On a :class:`ContextRows` the kernel reads the batch in one
    call; the rounds it hands back (and rows anywhere else) are read row by row, with the same rules and
    the same arithmetic. A draft token outside the vocabulary raises ``IndexError``."""
    if isinstance(rows, ContextRows):
        source = rows.native_source()
        if source is not None and (got := native.verify_greedy(source, draft, top_n)) is not None:
            return got
    row = rows if callable(rows) else rows.__getitem__
    return reference.verify_greedy(draft, row, top_n, _acceptor_row)


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
