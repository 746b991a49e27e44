"""Sampling distributions and lossless speculative acceptance, in numpy (top-k's and top-p's searches in the
row-scan kernel).

Nothing here touches a model: every function takes logit rows (``float32`` arrays of the vocabulary
size) or the distributions built from them, plus a seeded :class:`numpy.random.Generator`.

Building a distribution (:func:`probs_from_logits`)
    The same fixed order is applied to target and draft rows:

    1. NaN logits count as ``-inf`` (never chosen); ``+inf`` logits, if any, share all the mass.
    2. ``temperature == 0`` means greedy: a point mass on the first maximum (lowest id among ties).
    3. Temperature: logits are divided by ``temperature``.
    4. Top-k (``top_k > 0``): keep the ``k`` largest logits; ties at the boundary keep the lowest ids.
       Found with ``argpartition`` (no full sort).
    5. Softmax over the kept tokens (in float64).
    6. Top-p (``top_p < 1``): keep the smallest set of most probable tokens whose mass reaches
       ``top_p`` (at least one token; ties broken by lower id first), then renormalise. Only the
       candidates are sorted: the search widens a partitioned prefix until it holds enough mass. Without
       top-k, the row-scan kernel finds the candidates instead (:func:`_nucleus_in_place`): the row's sums and
       its mass by distance below the maximum, then only the tokens above the nucleus's last bucket are
       read, and the whole distribution is never built.

    This is the Hugging Face order (temperature before top-p). llama.cpp's default sampler chain
    applies top-p before temperature, so the two can keep slightly different nucleus sets.

The two pieces of the lossless acceptance rule live here too (:func:`acceptance_probability` and
:func:`residual_distribution`); :mod:`specviz.decoding.acceptor` applies them to a round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from specviz.errors import ContextError, KnobError

from .rowscan import nucleus_mass, tempered, top_ids

__all__ = [
    "SamplingParams",
    "TokenDist",
    "probs_from_logits",
    "sample",
    "sample_token",
    "acceptance_probability",
    "residual_distribution",
    "MAX_TEMPERATURE",
]

#: Largest temperature accepted. Beyond this the distribution is uniform for any practical row.
MAX_TEMPERATURE = 100.0
#: Largest ``top_k`` accepted (above any real vocabulary; 0 disables top-k).
MAX_TOP_K = 1 << 31


def _knob_error(name: str, value: object, allowed: str) -> KnobError:
    return KnobError(f"{name}={value!r} is outside its range: {name} must be {allowed}", knob=name, value=value)


@dataclass(frozen=True)
class SamplingParams:
    """How a logit row becomes a distribution: ``temperature``, ``top_k`` and ``top_p``.

    ``temperature`` is in ``[0, 100]``; 0 means greedy (a point mass on the first maximum) and is the
    default. ``top_k`` is an integer ``>= 0``; 0 disables it. ``top_p`` is in ``(0, 1]``; 1 disables it.
    An out-of-range or wrongly typed value raises :class:`specviz.errors.KnobError` naming the knob,
    the value and the allowed range.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)):
            raise _knob_error("temperature", t, f"a number in [0, {MAX_TEMPERATURE:g}]")
        if not (math.isfinite(float(t)) and 0.0 <= float(t) <= MAX_TEMPERATURE):
            raise _knob_error("temperature", t, f"in [0, {MAX_TEMPERATURE:g}] (0 = greedy)")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise _knob_error("top_k", k, f"an integer in [0, {MAX_TOP_K}] (0 = off)")
        if not 0 <= int(k) <= MAX_TOP_K:
            raise _knob_error("top_k", k, f"an integer in [0, {MAX_TOP_K}] (0 = off)")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
            raise _knob_error("top_p", p, "a number in (0, 1] (1 = off)")
        if not (math.isfinite(float(p)) and 0.0 < float(p) <= 1.0):
            raise _knob_error("top_p", p, "in (0, 1] (1 = off)")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_k", int(k))
        object.__setattr__(self, "top_p", float(p))

    @property
    def greedy(self) -> bool:
        """True when ``temperature == 0``: every distribution is a point mass on the argmax."""
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        """The three knobs as a JSON-serialisable dict."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


@dataclass(frozen=True)
class TokenDist:
    """A probability distribution over a vocabulary of ``n_vocab`` tokens.

    Sparse form: ``ids`` (ascending ``int64`` token ids) and ``probs`` (``float64``, same length,
    summing to 1) list the support. Dense form: ``ids is None`` and ``probs`` has ``n_vocab`` entries.
    Tokens outside the support have probability 0.
    """

    probs: np.ndarray
    ids: np.ndarray | None
    n_vocab: int

    @property
    def support_size(self) -> int:
        """How many tokens have a stored (possibly zero) probability."""
        return int(self.probs.shape[0])

    def prob(self, token: int) -> float:
        """The probability of ``token`` (0 outside the support or the vocabulary)."""
        token = int(token)
        if token < 0 or token >= self.n_vocab:
            return 0.0
        if self.ids is None:
            return float(self.probs[token])
        i = int(np.searchsorted(self.ids, token))
        if i < self.ids.shape[0] and int(self.ids[i]) == token:
            return float(self.probs[i])
        return 0.0

    def probs_at(self, tokens: np.ndarray) -> np.ndarray:
        """Probabilities of an array of token ids (vectorised :meth:`prob`)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        out = np.zeros(tokens.shape, dtype=np.float64)
        ok = (tokens >= 0) & (tokens < self.n_vocab)
        if self.ids is None:
            out[ok] = self.probs[tokens[ok]]
            return out
        if self.ids.shape[0] == 0:
            return out
        pos = np.searchsorted(self.ids, tokens)
        pos_c = np.minimum(pos, self.ids.shape[0] - 1)
        hit = ok & (self.ids[pos_c] == tokens)
        out[hit] = self.probs[pos_c[hit]]
        return out

    def token_ids(self) -> np.ndarray:
        """The token ids the stored probabilities refer to."""
        return np.arange(self.n_vocab, dtype=np.int64) if self.ids is None else self.ids

    def to_dense(self) -> np.ndarray:
        """A ``float64`` array of length ``n_vocab``."""
        if self.ids is None:
            return self.probs.copy()
        out = np.zeros(self.n_vocab, dtype=np.float64)
        out[self.ids] = self.probs
        return out

    def argmax(self) -> int:
        """The most probable token (lowest id among ties)."""
        i = int(np.argmax(self.probs))
        if self.ids is None:
            return i
        best = self.probs[i]
        return int(self.ids[self.probs == best].min())

    def top(self, n: int = 5) -> list[tuple[int, float]]:
        """The ``n`` most probable ``(token, probability)`` pairs, most probable first."""
        n = max(0, min(int(n), self.support_size))
        if n == 0:
            return []
        idx = np.argpartition(-self.probs, n - 1)[:n] if n < self.support_size else np.arange(self.support_size)
        ids = self.token_ids()[idx]
        order = np.lexsort((ids, -self.probs[idx]))
        return [(int(ids[j]), float(self.probs[idx][j])) for j in order]

    def max_prob(self) -> float:
        """The largest probability."""
        return float(self.probs.max())

    def rank(self, token: int) -> int:
        """``token``'s rank (1 = the most probable; ties go to the lower id); a token outside the support
        ranks after all of it."""
        pt = self.prob(token)
        if pt <= 0.0:
            return int(np.count_nonzero(self.probs > 0)) + 1
        ids = self.token_ids()
        return int(np.count_nonzero(self.probs > pt)) + int(np.count_nonzero((self.probs == pt) & (ids < token))) + 1

    def draw(self, u: float) -> int:
        """The token at ``u`` (in [0, 1)) of the inverse cumulative distribution: the first whose cumulative
        probability exceeds ``u`` times the total (never a zero-probability entry)."""
        cdf = np.cumsum(self.probs)
        total = float(cdf[-1])
        i = int(np.searchsorted(cdf, u * total, side="right"))
        i = min(i, cdf.shape[0] - 1)
        # never return a zero-probability entry (possible only through rounding at the very end)
        while self.probs[i] <= 0 and i > 0:
            i -= 1
        return int(self.token_ids()[i])

    @classmethod
    def point_mass(cls, token: int, n_vocab: int) -> "TokenDist":
        """All the mass on ``token``."""
        return cls(np.ones(1, dtype=np.float64), np.array([int(token)], dtype=np.int64), int(n_vocab))


# --------------------------------------------------------------------------------------------------
# building distributions


def _clean_row(logits_row: np.ndarray, nan_check: bool = True) -> np.ndarray:
    row = np.asarray(logits_row)
    if row.ndim != 1:
        raise ValueError(f"a logit row must be one-dimensional, got shape {row.shape}")
    if row.shape[0] == 0:
        raise ValueError("a logit row must not be empty")
    if nan_check and np.isnan(row).any():
        row = np.where(np.isnan(row), -np.inf, row)
    return row


def _first_argmax(row: np.ndarray) -> int:
    # np.argmax returns the first maximum; NaN already replaced by -inf.
    return int(np.argmax(row))


def _top_k_ids(row: np.ndarray, k: int) -> np.ndarray:
    """Ascending ids of the ``k`` largest entries (``0 < k < len(row)``, NaN-free); ties at the boundary keep
    the lowest ids (the row reader's :func:`~specviz.decoding.rowscan.top_ids`, sorted by id)."""
    return np.sort(np.asarray(top_ids(row, k), dtype=np.int64))


def _nucleus(probs: np.ndarray, ids: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Keep the smallest most-probable prefix reaching ``top_p``; return renormalised probs, ids.

    Only candidates are sorted: take every entry at least as large as the ``m``-th largest (a
    deterministic superset of the top ``m``, ties included), sort those by probability (then id), and
    widen ``m`` fourfold until their cumulative mass reaches ``top_p``. Every entry left out is
    strictly smaller than every candidate, so the prefix found is the global one.
    """
    n = probs.shape[0]
    m = min(n, 64)
    while True:
        if m < n:
            threshold = np.partition(probs, n - m)[n - m]
            cand = np.flatnonzero(probs >= threshold)
        else:
            cand = np.arange(n)
        order = cand[np.lexsort((ids[cand], -probs[cand]))]
        csum = np.cumsum(probs[order])
        reach = np.flatnonzero(csum >= top_p)
        if reach.shape[0] > 0:
            keep = order[: int(reach[0]) + 1]
            break
        if cand.shape[0] >= n:
            keep = order  # rounding kept the total just under top_p: keep everything
            break
        m = min(n, m * 4)
    keep = np.sort(keep)
    kept = probs[keep]
    return kept / kept.sum(), ids[keep]


#: Buckets the kernel files a row's tokens into by distance below the maximum, for top-p's candidates.
NUCLEUS_BUCKETS = 1024


def _nucleus_in_place(row: np.ndarray, params: SamplingParams) -> TokenDist | None:
    """Top-p over a whole row (no top-k) read in place by the row-scan kernel; ``None`` when the kernel does
    not take the row (none, a NaN, a non-finite maximum, a temperature too small for its float test) or when
    rounding at a bucket's edge defeats the checks below: numpy's path then decides.

    The tokens whose term lies below ``exp(-depth)`` hold at most ``n · exp(-depth)`` of the mass (the
    maximum's term is 1), less than ``1 − top_p`` for the depth below: the buckets over ``[0, depth)`` hold
    the nucleus. The bucket whose running mass reaches ``top_p · Z`` ends it. The tokens above that bucket
    are a prefix of the sorted row whose mass falls short of ``top_p`` (checked exactly): all of them are in
    the nucleus, and only the boundary bucket's tokens are sorted, to find where the running mass reaches
    ``top_p``. Probabilities are ``exp((x − max) / T) / Z``, as :class:`~specviz.decoding.tempered.TemperedRow`
    reads them (numpy's dense path agrees to about 1e-15)."""
    n = row.shape[0]
    temp = params.temperature
    inv_t = 1.0 / temp
    depth = min(math.log(n / (1.0 - params.top_p)) + 1.0, 700.0)
    width = depth / NUCLEUS_BUCKETS
    if not inv_t / width < 1e30:  # the kernel's float test would overflow: numpy's path
        return None
    got = tempered(row, inv_t)
    if got is None or got[0].has_nan or not math.isfinite(got[0].max):
        return None
    m, z = got[0].max, got[0].z
    filed = nucleus_mass(row, m, inv_t, width, NUCLEUS_BUCKETS)
    if filed is None:
        return None
    # the boundary buckets: where the running mass reaches top_p·Z, give or take a relative 1e-9 (the
    # buckets' sums, Z and numpy's exponentials round apart)
    running = np.cumsum(filed[0])
    target = params.top_p * z
    lo = int(np.searchsorted(running, target * (1.0 - 1e-9)))
    hi = int(np.searchsorted(running, target * (1.0 + 1e-9)))
    if hi >= NUCLEUS_BUCKETS:
        return None
    ids = np.flatnonzero(row >= m - (hi + 1) * width * temp)  # the boundary buckets and everything above
    x = row[ids]
    probs = np.exp((x.astype(np.float64) - m) * inv_t) / z
    inside = x > m - lo * width * temp  # above the boundary: in the nucleus if their mass falls short
    mass_inside = float(probs[inside].sum())
    if not mass_inside < params.top_p:
        return None
    edge = np.flatnonzero(~inside)
    order = edge[np.lexsort((ids[edge], -probs[edge]))]
    reach = np.flatnonzero(mass_inside + np.cumsum(probs[order]) >= params.top_p)
    if reach.shape[0] == 0:
        return None
    keep = np.concatenate([np.flatnonzero(inside), order[: int(reach[0]) + 1]])
    keep.sort()  # positions in ids, which ascend
    kept = probs[keep]
    return TokenDist(kept / kept.sum(), ids[keep].astype(np.int64), n)


def probs_from_logits(logits_row: np.ndarray, params: SamplingParams) -> TokenDist:
    """Turn one logit row into the distribution that ``params`` samples from.

    The order (NaN → -inf, greedy shortcut, temperature, top-k, softmax, top-p) is described in the
    module docstring and is the same for target and draft rows. The result is sparse when top-k,
    top-p or greedy cut the support, dense otherwise. Raises :class:`specviz.errors.ContextError`
    when every logit is NaN or ``-inf`` (the model produced no usable row).
    """
    row = _clean_row(logits_row, nan_check=False)
    n = row.shape[0]
    if not params.greedy and params.top_p < 1.0 and not 0 < params.top_k < n:
        nucleus = _nucleus_in_place(row, params)  # before numpy's passes over the row: the kernel checks for NaN
        if nucleus is not None:
            return nucleus
    row = _clean_row(row)
    best = _first_argmax(row)
    top = row[best]
    if top == -np.inf:
        raise ContextError(
            "the logit row has no finite value (all NaN or -inf); the model output is "
            "unusable: check the model file and the decode call that produced it"
        )
    if params.greedy:
        return TokenDist.point_mass(best, n)
    if top == np.inf:
        inf_ids = np.flatnonzero(row == np.inf).astype(np.int64)
        return TokenDist(np.full(inf_ids.shape[0], 1.0 / inf_ids.shape[0]), inf_ids, n)

    ids: np.ndarray | None
    if 0 < params.top_k < n:
        ids = _top_k_ids(row, params.top_k)
        x = row[ids].astype(np.float64)
    else:
        ids = None
        x = row.astype(np.float64)
    x = (x - float(top)) / params.temperature
    probs = np.exp(x)  # -inf -> 0
    probs /= probs.sum()

    if params.top_p < 1.0:
        full_ids = ids if ids is not None else np.arange(n, dtype=np.int64)
        probs, ids = _nucleus(probs, full_ids, params.top_p)
    elif ids is None and probs.shape[0] > 0:
        return TokenDist(probs, None, n)
    return TokenDist(probs, ids, n)


# --------------------------------------------------------------------------------------------------
# sampling


def sample(dist: Drawable, rng: np.random.Generator) -> int:
    """Draw one token from ``dist`` using exactly one ``rng.random()`` call (inverse CDF, :meth:`TokenDist.draw`)."""
    return dist.draw(float(rng.random()))


def sample_token(logits_row: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, float]:
    """The plain (non-speculative) step: build the distribution and draw one token.

    Returns ``(token, probability of token under the distribution)``. With greedy params this is
    the first argmax with probability 1 and consumes no random number.
    """
    dist = probs_from_logits(logits_row, params)
    if params.greedy:
        return dist.argmax(), 1.0
    tok = sample(dist, rng)
    return tok, dist.prob(tok)


class HasProb(Protocol):
    """Anything that gives a token's probability (:class:`TokenDist`, a row read in place)."""

    def prob(self, token: int) -> float:
        """The probability of ``token``."""
        ...


class Drawable(Protocol):
    """Anything a token can be drawn from with one uniform (:class:`TokenDist`, a row read in place)."""

    def draw(self, u: float) -> int:
        """The token at ``u`` in [0, 1) of the inverse cumulative distribution."""
        ...


def acceptance_probability(p: HasProb, q: HasProb | None, token: int) -> float:
    """Probability of accepting draft ``token`` given target ``p`` and draft distribution ``q``.

    ``q is None`` (a deterministic draft) or ``q(token) == 0`` (the draft's distribution does not
    describe how ``token`` was chosen) use the point-mass rule: ``p(token)``. Otherwise
    ``min(1, p(token) / q(token))``.
    """
    pt = p.prob(token)
    if q is None:
        return pt
    qt = q.prob(token)
    if qt <= 0.0:
        return pt
    return min(1.0, pt / qt)


def residual_distribution(p: TokenDist, q: TokenDist | None, token: int) -> TokenDist:
    """The distribution a rejected ``token`` is replaced from.

    Model draft: ``max(0, p - q)`` normalised. Point-mass rule (``q is None`` or ``q(token) == 0``):
    ``p`` with ``token`` removed, normalised. When the residual has no mass (rounding when ``p`` and
    ``q`` agree), it is ``p`` itself.
    """
    ids = p.token_ids()
    if q is None or q.prob(token) <= 0.0:
        r = p.probs.copy()
        r[ids == int(token)] = 0.0
    else:
        r = np.maximum(p.probs - q.probs_at(ids), 0.0)
    total = float(r.sum())
    if not total > 0.0:
        return p
    return TokenDist(r / total, p.ids, p.n_vocab)
