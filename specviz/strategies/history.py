"""A growing int32 mirror of the token history, for fast numpy n-gram searches in drafters."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from . import ngram_kernel


class TokenMirror:
    """Keeps a numpy copy of the token history, appending only the new tail on :meth:`sync`."""

    def __init__(self) -> None:
        self._buf = np.zeros(256, dtype=np.int32)
        self._n = 0

    def reset(self, history: Sequence[int]) -> None:
        """Rebuild from the whole history."""
        self._n = 0
        self.sync(history)

    def sync(self, history: Sequence[int]) -> np.ndarray:
        """Bring the mirror up to ``history`` (which only ever grows or is reset) and return a view."""
        n = len(history)
        if n < self._n:
            self._n = 0
        if n > self._buf.shape[0]:
            cap = max(n, self._buf.shape[0] * 2)
            nb = np.zeros(cap, dtype=np.int32)
            nb[: self._n] = self._buf[: self._n]
            self._buf = nb
        if n > self._n:
            self._buf[self._n : n] = history[self._n : n]
            self._n = n
        return self._buf[: self._n]

    @property
    def array(self) -> np.ndarray:
        """The mirrored history as a read-only view."""
        return self._buf[: self._n]


def find_ngram(arr: np.ndarray, pattern: np.ndarray, end: int, *, last: bool) -> int:
    """Index of an occurrence of ``pattern`` in ``arr`` starting before ``end``; -1 if none.

    ``last=True`` returns the occurrence with the largest start, ``last=False`` the smallest. One call of
    the C kernel (:mod:`specviz.strategies.ngram_kernel`) where it can be had, else numpy.
    """
    got = ngram_kernel.find_ngram(arr, pattern, end, last)
    if got is not None:
        return got
    return find_ngram_numpy(arr, pattern, end, last=last)


def find_ngram_numpy(arr: np.ndarray, pattern: np.ndarray, end: int, *, last: bool) -> int:
    """:func:`find_ngram` with numpy only (the kernel's reference, and its fallback)."""
    n = pattern.shape[0]
    if n == 0 or end <= 0:
        return -1
    limit = min(end, arr.shape[0] - n + 1)
    if limit <= 0:
        return -1
    cand = np.flatnonzero(arr[:limit] == pattern[0])
    if n > 1 and cand.size:
        ok = np.ones(cand.shape[0], dtype=bool)
        for j in range(1, n):
            ok &= arr[cand + j] == pattern[j]
        cand = cand[ok]
    if cand.size == 0:
        return -1
    return int(cand[-1] if last else cand[0])
