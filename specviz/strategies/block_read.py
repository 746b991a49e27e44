"""Reading the draft tokens out of one decoded DFlash block (plain, DSpark, DFlash-2).

The block's positions were drafted in parallel, so each position's distribution is fixed by the
history alone; the functions here pick the tokens in block order and stop where llama.cpp's
``common_speculative_impl_draft_dflash::draft`` stops:

* :func:`read_positions` (DFlash and DSpark): one logits row per position. DFlash stops at the first
  position whose top probability is below ``p_min``; DSpark stops at the first position whose
  confidence-head value is below ``p_min`` (its token probability is not tested, as upstream).
* :func:`walk_lattice` (DFlash-2): position ``i`` scores its ``k`` candidates given the candidate chosen at
  ``i - 1`` (the anchor for the first); greedy takes the best score, and stops where its softmax over
  the ``k`` scores is below ``p_min``.

Sampling draws each token from its position's distribution ``q`` (DFlash/DSpark: the logits row under
the generation's temperature, top-k and top-p; DFlash-2: the softmax of the ``k`` transition scores
under the temperature) and returns ``q`` for the acceptor: every ``q`` is a function of the history (and,
for DFlash-2, of the tokens drawn before it), so rejection sampling stays lossless. DSpark's in-graph
Markov chain conditions each position on the previous position's *greedy* token (llama.cpp's graph
does so whatever the sampler); a sampled token that differs lowers acceptance, never the exactness.

Departure from llama.cpp: upstream reads each position through a top-10 sampler and compares ``p_min``
with the top candidate's probability among those ten; specviz uses the full softmax (as its other model
drafters do), so ``p_min`` reads the draft's real confidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..decoding.sampling import SamplingParams, TokenDist, probs_from_logits, sample
from ..decoding.tempered import Dist
from .base import DRAFT_ALTERNATIVES
from .draft_choice import choose_token, top_candidates


@dataclass
class BlockRead:
    """The tokens read from a block, their probabilities, the draft distributions (sampling), why the
    read stopped early (``p-min``, ``confidence``, or None) and each read position's top candidates
    (``alternatives``: :func:`read_positions` only; a lattice's candidates depend on the walk)."""

    tokens: list[int] = field(default_factory=list)
    probs: list[float | None] = field(default_factory=list)
    dists: list[Dist] = field(default_factory=list)
    reason: str | None = None
    alternatives: list[list[int]] = field(default_factory=list)


def read_positions(
    row: Callable[[int], np.ndarray],
    rows: range,
    params: SamplingParams,
    rng: np.random.Generator,
    *,
    p_min: float,
    n_vocab: int,
    vocab_ids: np.ndarray | None = None,
    confidence: np.ndarray | None = None,
) -> BlockRead:
    """Tokens of the block rows ``rows`` (``row(i)`` gives row ``i``'s logits). With ``confidence`` (DSpark)
    ``p_min`` is compared with each row's confidence instead of its top probability."""
    out = BlockRead()
    for i in rows:
        if confidence is not None and p_min > 0 and confidence[i] < p_min:
            out.reason = "confidence"
            break
        tok, p, top, q = choose_token(row(i), params, rng, vocab_ids, n_vocab)
        if confidence is None and top < p_min:
            out.reason = "p-min"
            break
        out.tokens.append(tok)
        out.probs.append(p)
        out.alternatives.append(top_candidates(row(i), vocab_ids, DRAFT_ALTERNATIVES))
        if q is not None:
            out.dists.append(q)
    return out


def walk_lattice(
    cand: np.ndarray,
    scores: np.ndarray,
    n: int,
    params: SamplingParams,
    rng: np.random.Generator,
    *,
    p_min: float,
    n_vocab: int,
) -> BlockRead:
    """Walk DFlash-2's lattice over block rows ``1 … n`` (``cand[i]``: the ``k`` candidate ids of row ``i``;
    ``scores[i, j]``: their scores after candidate ``j`` of row ``i - 1``, row 1 reading ``scores[1, 0]``)."""
    out = BlockRead()
    prev = 0
    for i in range(1, n + 1):
        s = scores[i, prev].astype(np.float64)
        s = np.where(np.isnan(s), -np.inf, s)
        if params.greedy:
            j = int(np.argmax(s))
            p = 1.0 / float(np.exp(s - s[j]).sum())
            top = p
            q = None
        else:
            qk = probs_from_logits(s.astype(np.float32), params)
            idx = np.arange(len(s), dtype=np.int64) if qk.ids is None else np.asarray(qk.ids, dtype=np.int64)
            j = int(sample(TokenDist(qk.probs, idx, len(s)), rng))
            # the same distribution over the candidates' token ids (ascending, as TokenDist keeps them)
            toks = cand[i][idx].astype(np.int64)
            order = np.argsort(toks, kind="stable")
            q = TokenDist(qk.probs[order], toks[order], n_vocab)
            top = float(qk.probs.max())
            p = q.prob(int(cand[i][j]))
        if top < p_min:
            out.reason = "p-min"
            break
        out.tokens.append(int(cand[i][j]))
        out.probs.append(float(p))
        if q is not None:
            out.dists.append(q)
        prev = j
    return out
