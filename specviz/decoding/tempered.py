"""The sampling distribution of one logits row at a temperature, read in place: ``p_i = exp((x_i − m) / T) / Z``.

The acceptor needs little of a sampled row: the probability of a few tokens (the draft token's, the
committed token's), one draw (the bonus from ``p``, or the correction from ``p`` without the rejected
draft token, the point-mass rule's residual), and at a rejection the top tokens and a rank. Building the
whole distribution in float64 with numpy (:func:`~specviz.decoding.sampling.probs_from_logits`) and a
cumulative sum for the draw cost about 3 ms a row on the embedded model's 262 144 tokens, a seventh of a
decode. :class:`TemperedRow` asks the row-scan kernel (:func:`~specviz.decoding.rowscan.tempered`)
for the row's maximum and its sums instead (every term in double, as numpy's), reads single
probabilities off the row, and draws by walking the kernel's block sums to the one block that holds the
draw. A row with a NaN or a non-finite maximum, or a machine without the kernel, takes numpy's
distribution inside the same class, so that the acceptor sees one rule either way.

Which rows: a *dense* distribution, temperature only (``top_k`` 0 or at least the vocabulary, ``top_p``
1); top-k and top-p cut the support, which :class:`~specviz.decoding.sampling.TokenDist` holds sparsely
(:func:`tempered_or_dist` picks). The order of tokens (the alternatives shown for a rejection, the rejected
token's rank) is the row's: the tempered softmax orders tokens as their logits do, and the logits also
order the tokens whose probability underflows to 0, which numpy's distribution could only leave tied.
A term below ``exp(-708)`` counts as 0 (:data:`EXP_FLOOR`, the kernel's floor).
"""

from __future__ import annotations

import math
from typing import Union

import numpy as np

from . import rowscan
from .rowscan import EXP_FLOOR, row_rank, top_ids
from .sampling import SamplingParams, TokenDist, probs_from_logits, residual_distribution

__all__ = ["TemperedRow", "Dist", "tempered_or_dist", "residual_draw", "EXP_FLOOR"]


def is_dense(params: SamplingParams, n_vocab: int) -> bool:
    """Whether ``params`` sample from the whole vocabulary at a temperature (no top-k or top-p cut)."""
    return not params.greedy and not 0 < params.top_k < n_vocab and params.top_p >= 1.0


class TemperedRow:
    """The dense sampling distribution of one logits ``row`` under ``params`` (see the module docstring),
    with ``leave_out`` (a token id, or -1) left out of :meth:`draw`: the point-mass rule's residual after
    that draft token was rejected. :meth:`prob`, :meth:`top` and :meth:`rank` are always of the whole
    distribution ``p``.

    The row is read in place (a zero-copy view of llama.cpp's logits is fine while it stays valid).
    """

    __slots__ = ("row", "params", "inv_t", "leave_out", "max", "z", "z_without", "_stamp", "_dist", "_clean", "_full")

    def __init__(self, row: np.ndarray, params: SamplingParams, leave_out: int = -1) -> None:
        if not is_dense(params, row.shape[0]):
            raise ValueError("a TemperedRow is a dense distribution: temperature > 0, no top-k or top-p cut")
        self.row = row
        self.params = params
        self.inv_t = 1.0 / params.temperature
        self.leave_out = int(leave_out)
        self._dist: TokenDist | None = None  # numpy's distribution, where the kernel's sums are not used
        self._clean: np.ndarray | None = None
        self._full: TokenDist | None = None
        got = rowscan.tempered(row, self.inv_t, self.leave_out)
        if got is not None and not got[0].has_nan and math.isfinite(got[0].max):
            sums, self._stamp = got
            self.max, self.z, self.z_without = sums.max, sums.z, sums.z_without
            return
        # numpy's distribution: no kernel, a NaN (counted as -inf) or a non-finite maximum (+inf shares the
        # mass; a row without a finite value raises ContextError, as probs_from_logits always did)
        self._stamp = -1
        self._dist = probs_from_logits(row, params)
        clean = np.asarray(row)
        if np.isnan(clean).any():
            clean = np.where(np.isnan(clean), -np.inf, clean)
        self._clean = clean
        self.max = float(np.max(clean))
        self.z = self.z_without = float("nan")

    @property
    def on_numpy(self) -> bool:
        """True when numpy's distribution stands in for the kernel's sums (no kernel, a NaN, a non-finite
        maximum)."""
        return self._dist is not None

    def prob(self, token: int) -> float:
        """``p(token)`` (0 outside the vocabulary)."""
        token = int(token)
        if self._dist is not None:
            return self._dist.prob(token)
        if not 0 <= token < self.row.shape[0]:
            return 0.0
        x = (float(self.row[token]) - self.max) * self.inv_t
        return math.exp(x) / self.z if x > EXP_FLOOR else 0.0

    def max_prob(self) -> float:
        """The largest probability: ``1 / Z`` (the maximum's term is exactly 1)."""
        return self._dist.max_prob() if self._dist is not None else 1.0 / self.z

    def draw(self, u: float) -> int:
        """The token at ``u`` (in [0, 1)) of the inverse cumulative distribution of ``p`` with
        :attr:`leave_out` left out and the rest renormalised (``p`` itself when nothing else has mass), as
        :meth:`TokenDist.draw <specviz.decoding.sampling.TokenDist.draw>` reads a distribution."""
        if self._dist is not None:
            dist = residual_distribution(self._dist, None, self.leave_out) if self.leave_out >= 0 else self._dist
            return dist.draw(u)
        if not self.z_without > 0.0:  # the left-out token holds all the mass: the residual is p itself
            return self.leave_out
        got = rowscan.tempered_pick(self.row, self.max, self.inv_t, self.leave_out, u * self.z_without, self._stamp)
        if got is None:  # this thread scanned another row since: scan this one again, then draw
            again = rowscan.tempered(self.row, self.inv_t, self.leave_out)
            assert again is not None
            self._stamp = again[1]
            got = rowscan.tempered_pick(self.row, self.max, self.inv_t, self.leave_out, u * self.z_without, self._stamp)
            assert got is not None
        return got

    def top(self, n: int = 5) -> list[tuple[int, float]]:
        """The ``n`` most probable ``(token, p)`` pairs, most probable first (the row's order: ties in
        probability go to the higher logit, then to the lower id)."""
        row = self._clean if self._clean is not None else self.row
        n = max(0, min(int(n), row.shape[0]))
        return [(t, self.prob(t)) for t in top_ids(row, n, self.max)] if n else []

    def rank(self, token: int) -> int:
        """``token``'s rank in ``p`` (1 = the most probable; the row's order, as :meth:`top`)."""
        return row_rank(self._clean if self._clean is not None else self.row, int(token))

    def dist(self) -> TokenDist:
        """``p`` as a :class:`~specviz.decoding.sampling.TokenDist` (built once, in float64 by numpy): what a
        draft distribution's residual ``max(0, p − q)`` needs."""
        if self._dist is not None:
            return self._dist
        if self._full is None:
            self._full = probs_from_logits(self.row, self.params)
        return self._full


#: A distribution a round samples from: built (:class:`~specviz.decoding.sampling.TokenDist`) or a row read in
#: place (:class:`TemperedRow`); both give ``prob``, ``draw``, ``top``, ``rank`` and ``max_prob``.
Dist = Union[TokenDist, TemperedRow]


def residual_draw(p: TemperedRow, q: TemperedRow, u: float) -> int | None:
    """The token at ``u`` of a draft model's residual ``max(0, p − q)`` normalised (``p`` itself when the
    residual has no mass), as :func:`~specviz.decoding.sampling.residual_distribution` and
    :meth:`TokenDist.draw <specviz.decoding.sampling.TokenDist.draw>` give it, read in place from both
    rows by the kernel. ``None`` when the kernel does not take them (either row on numpy's path, rows of
    other lengths or temperatures, ``p`` read with a token left out): the caller builds the distributions."""
    if p.on_numpy or q.on_numpy or p.leave_out != -1 or p.inv_t != q.inv_t or p.row.shape != q.row.shape:
        return None
    ps, qs = rowscan.RowSums(p.max, p.z), rowscan.RowSums(q.max, q.z)
    got = rowscan.residual(p.row, q.row, ps, qs, p.inv_t)
    if got is None:
        return None
    total, stamp = got
    if not total > 0.0:  # p and q agree to rounding: numpy's residual is p itself
        return p.draw(u)
    return rowscan.residual_pick(p.row, q.row, ps, qs, p.inv_t, u * total, stamp)


def tempered_or_dist(row: np.ndarray, params: SamplingParams, leave_out: int = -1) -> Dist:
    """The target's distribution for one row: a :class:`TemperedRow` when ``params`` are dense, else
    :func:`~specviz.decoding.sampling.probs_from_logits`'s sparse :class:`TokenDist` (top-k, top-p)."""
    if is_dense(params, row.shape[0]):
        return TemperedRow(row, params, leave_out)
    return probs_from_logits(row, params)
