"""The acceptor: one function decides what a verified round commits, for greedy and sampled decoding.

Modelled on vLLM's ``RejectionSampler.forward`` and llama.cpp's ``common_sampler_sample_and_accept_n``:
one entry point, with ``draft_dists=None`` for drafts that carry no distribution (n-gram and prompt
lookup drafts, greedy model drafts).

Terms (for one sequence; ``k`` is the draft length, ``V`` the vocabulary size):

``draft``
    ``k`` proposed token ids ``d_0 … d_{k-1}``.
``rows``
    The target's logits for the verify batch ``[pending token] + draft``: ``rows(i)`` (or ``rows[i]``) is
    a ``float32`` array of ``V`` entries for ``i`` in ``0 … k``; row ``i`` predicts the token that follows
    the committed text plus ``d_0 … d_{i-1}``. Rows are read lazily — only up to the first rejection, or
    the bonus row ``k`` — so a callable that hands out llama.cpp's logits in place reads nothing extra. A
    :class:`~specviz.decoding.rowscan.ContextRows` (a context's rows) lets the row reader read a greedy
    round's rows in one call of its kernel (:func:`~specviz.decoding.rowscan.read_greedy`).
``params``
    :class:`~specviz.decoding.sampling.SamplingParams`; temperature 0 is greedy.
``rng``
    The generation's seeded ``numpy.random.Generator`` (never touched when greedy).
``draft_dists``
    ``q_i`` for each draft position (a sequence or a callable of :class:`~specviz.decoding.sampling.TokenDist`
    or :class:`~specviz.decoding.tempered.TemperedRow`),
    built with the same ``params`` as the target, when the draft tokens were sampled from them.

Greedy (temperature 0): accept ``d_i`` while it is the first maximum of row ``i`` (NaN counts as −∞),
then commit that row's first maximum — the correction at a mismatch, the bonus after a full match.
Probabilities reported are the softmax at temperature 1 (what the target "thinks"), from the same pass.

Sampled: accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))`` (the point-mass rule ``p_i(d_i)``
without ``q``); at the first rejection draw the correction from the residual ``max(0, p_i − q_i)``
normalised (``p_i`` without ``d_i`` under the point-mass rule); after a full match draw the bonus from
``p_k``. Random numbers are drawn in a fixed order — one uniform per examined draft position, then one
for the correction or bonus — so the same seed, settings and rows give the same tokens. Either rule
leaves the committed tokens distributed exactly as the target samples them. A target row sampled at a
temperature alone (no top-k, no top-p) is read in place (:class:`~specviz.decoding.tempered.TemperedRow`:
the kernel's sums and a draw in one block, the same tokens as the whole float64 distribution); top-k and
top-p rows build :class:`~specviz.decoding.sampling.TokenDist`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, Union

import numpy as np

from .rowscan import GreedyRows, Refusal, RowSource, logit_margin, read_greedy
from .sampling import SamplingParams, acceptance_probability, residual_distribution
from .tempered import Dist, TemperedRow, residual_draw, tempered_or_dist

__all__ = [
    "PositionVerdict",
    "Verdict",
    "accept",
    "correction",
    "greedy_verdict",
    "refusal_of",
    "N_ALTERNATIVES",
]

#: How many of the target's top choices a rejection reports.
N_ALTERNATIVES = 5

DraftDists = Union[Callable[[int], Dist], Sequence[Dist], None]


@dataclass(frozen=True)
class PositionVerdict:
    """What happened to one examined draft token (sampled decoding): its probabilities, the uniform
    drawn and the outcome (accepted iff ``u < accept_prob``)."""

    index: int  #: 0-based position in the draft
    token: int  #: the draft token d_i
    p: float  #: target probability p_i(d_i) under the sampling distribution
    q: float | None  #: draft probability q_i(d_i); None for a deterministic draft
    accept_prob: float  #: min(1, p/q), or p under the point-mass rule
    u: float  #: the uniform drawn
    accepted: bool


@dataclass(frozen=True)
class Verdict:
    """The acceptor's decision for one round.

    ``tokens`` are what to commit: the accepted draft prefix ``d_0 … d_{n-1}`` (``n = n_accepted``)
    followed by exactly one token of the target's (``final_token``: the correction at the first
    rejection, or the bonus when the whole draft was accepted — then ``bonus`` is True; a round
    without a draft has ``bonus`` True and nothing accepted). ``probs[j]`` is the target's
    probability of ``tokens[j]``. At a rejection, ``rejected_prob`` is the target's probability of
    the refused draft token, ``rejected_rank`` its rank among the target's choices there (1 = the
    target's own choice; ties go to the lower id, as the greedy scan), ``margin`` the target's top-two
    logit margin there and ``alternatives`` the target's top choices, best first; all are empty/None
    otherwise. Under sampling the probabilities and the rank are those of the sampling distribution
    (after temperature, top-k and top-p; where probabilities tie at 0 in a distribution without top-k or
    top-p, the logits order the tokens); the margin is always in raw logits. ``positions`` (sampled
    decoding only) details each examined draft position. ``rows_read`` is ``n_accepted + 1``.
    """

    n_accepted: int
    tokens: tuple[int, ...]
    probs: tuple[float, ...]
    bonus: bool
    rejected_prob: float | None = None
    alternatives: tuple[tuple[int, float], ...] = ()
    positions: tuple[PositionVerdict, ...] = ()
    rows_read: int = 0
    rejected_rank: int | None = None
    margin: float | None = None

    @property
    def final_token(self) -> int:
        """The target's own token that ends the committed run."""
        return self.tokens[-1]


def accept(
    draft: Sequence[int],
    rows: RowSource,
    params: SamplingParams,
    rng: np.random.Generator,
    draft_dists: DraftDists = None,
    *,
    top_n: int = N_ALTERNATIVES,
) -> Verdict:
    """Decide what one round commits (see the module docstring for the terms and the two rules)."""
    if params.greedy:
        return _accept_greedy(draft, rows, top_n)
    row = rows if callable(rows) else rows.__getitem__
    qdist = None if draft_dists is None else (draft_dists if callable(draft_dists) else draft_dists.__getitem__)
    return _accept_sampled(draft, row, params, rng, qdist, top_n)


def _accept_greedy(draft: Sequence[int], rows: RowSource, top_n: int) -> Verdict:
    return greedy_verdict(read_greedy(draft, rows, top_n))


def greedy_verdict(got: GreedyRows) -> Verdict:
    """The greedy rule on the rows the row reader read: every row's choice is committed, the draft tokens
    it agreed with and the one that ends the run (the correction at a refusal, else the bonus)."""
    n_rows = len(got.tokens)
    refused = got.refusal
    if refused is None:
        return Verdict(n_rows - 1, got.tokens, got.probs, True, rows_read=n_rows)
    return Verdict(
        n_rows - 1,
        got.tokens,
        got.probs,
        False,
        rejected_prob=refused.prob,
        alternatives=refused.alternatives,
        rows_read=n_rows,
        rejected_rank=refused.rank,
        margin=refused.margin,
    )


def _accept_sampled(
    draft: Sequence[int],
    row: Callable[[int], np.ndarray],
    params: SamplingParams,
    rng: np.random.Generator,
    qdist: Callable[[int], Dist] | None,
    top_n: int,
) -> Verdict:
    tokens: list[int] = []
    probs: list[float] = []
    positions: list[PositionVerdict] = []
    k = len(draft)
    for i in range(k):
        d = int(draft[i])
        logits = row(i)
        q = None if qdist is None else qdist(i)
        # a deterministic draft's correction is drawn from p without d: the row is read with d left out
        p = tempered_or_dist(logits, params, d if q is None else -1)
        a = acceptance_probability(p, q, d)
        u = float(rng.random())
        ok = u < a
        positions.append(PositionVerdict(i, d, p.prob(d), None if q is None else q.prob(d), a, u, ok))
        if ok:
            tokens.append(d)
            probs.append(p.prob(d))
            continue
        tok = correction(p, q, d, float(rng.random()))
        tokens.append(tok)
        probs.append(p.prob(tok))
        refused = refusal_of(p, logits, d, top_n)
        return Verdict(
            i,
            tuple(tokens),
            tuple(probs),
            False,
            rejected_prob=refused.prob,
            alternatives=refused.alternatives,
            positions=tuple(positions),
            rows_read=i + 1,
            rejected_rank=refused.rank,
            margin=refused.margin,
        )
    p = tempered_or_dist(row(k), params)
    tok = p.draw(float(rng.random()))
    tokens.append(tok)
    probs.append(p.prob(tok))
    return Verdict(k, tuple(tokens), tuple(probs), True, positions=tuple(positions), rows_read=k + 1)


class Ranked(Protocol):
    """A row's distribution as a refusal reads it (a :class:`Dist`, or a greedy row's
    :class:`~specviz.decoding.rowscan.ScoredRow`)."""

    def prob(self, token: int, /) -> float:
        """The probability of ``token``."""
        ...

    def top(self, n: int, /) -> list[tuple[int, float]]:
        """The ``n`` most probable ``(token, probability)`` pairs, best first."""
        ...

    def rank(self, token: int, /) -> int:
        """``token``'s rank (1 = the most probable)."""
        ...


def refusal_of(p: Ranked, logits: np.ndarray, d: int, top_n: int) -> Refusal:
    """What a round reports of the refused draft token ``d`` at a row (``logits``) whose distribution is
    ``p`` (the sampling distribution, or a greedy row's softmax at temperature 1): ``p(d)``, ``p``'s
    ``top_n`` best tokens, ``d``'s rank in ``p`` and the row's top-two logit margin (the fields of the row
    reader's greedy refusal)."""
    alts = tuple(p.top(top_n))
    rank = next((j + 1 for j, (t, _) in enumerate(alts) if t == d), None) or p.rank(d)
    return Refusal(p.prob(d), alts, rank, logit_margin(logits, alts))


def correction(p: Dist, q: Dist | None, d: int, u: float) -> int:
    """The token that replaces the rejected draft token ``d``, drawn with ``u`` from the residual: ``p``
    without ``d`` (a deterministic draft, or a draft distribution that gave ``d`` no mass), or
    ``max(0, p − q)`` normalised. Rows read in place draw in place (a :class:`TemperedRow` read with ``d``
    left out; :func:`residual_draw` for two of them); otherwise the distributions are built."""
    if isinstance(p, TemperedRow):
        if q is None:
            return p.draw(u)
        if isinstance(q, TemperedRow) and q.prob(d) > 0.0 and (tok := residual_draw(p, q, u)) is not None:
            return tok
        p = p.dist()
    if isinstance(q, TemperedRow):
        q = q.dist()
    return residual_distribution(p, q, d).draw(u)
