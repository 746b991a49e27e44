"""How a model-backed drafter picks a draft token from one of its logits rows.

Greedy sessions take the first maximum (NaN as -inf) and report its softmax probability; sampling
sessions draw from ``q`` — the row under the generation's temperature, top-k and top-p, exactly as the
target's distribution is built — and hand ``q`` to the acceptor, so sampled decoding stays lossless.
With a reduced draft vocabulary (EAGLE-3's and DFlash's ``d2t``) the row is read only at the target ids
the drafter can express, mapped back to target ids: exactly the distribution of llama.cpp's
full-vocabulary row, whose other entries are -inf.
"""

from __future__ import annotations

import numpy as np

from ..decoding.rowscan import ScoredRow, top_ids
from ..decoding.sampling import SamplingParams, TokenDist, probs_from_logits, sample
from ..decoding.tempered import Dist, TemperedRow, is_dense
from ..errors import ContextError


def choose_token(
    row: np.ndarray, params: SamplingParams, rng: np.random.Generator, vocab_ids: np.ndarray | None, n_vocab: int
) -> tuple[int, float, float, Dist | None]:
    """``(token, its probability, the top probability, q or None)`` from one logits ``row``."""
    sub = row[vocab_ids] if vocab_ids is not None else row
    if params.greedy:
        x = np.where(np.isnan(sub), -np.inf, sub).astype(np.float64)
        j = int(np.argmax(x))
        m = x[j]
        if m == -np.inf:
            raise ContextError("the drafter's logits row has no finite value")
        p = 1.0 / float(np.exp(x - m).sum())
        tok = int(vocab_ids[j]) if vocab_ids is not None else j
        return tok, p, p, None
    if vocab_ids is None and is_dense(params, n_vocab):
        # the whole vocabulary at a temperature: read in place (from a copy: the drafter's next step
        # overwrites its context's logits)
        t = TemperedRow(np.array(sub, dtype=np.float32), params)
        tok = sample(t, rng)
        return tok, t.prob(tok), t.max_prob(), t
    q = probs_from_logits(sub, params)
    if vocab_ids is not None:
        qids = vocab_ids if q.ids is None else vocab_ids[q.ids]
        q = TokenDist(q.probs, np.asarray(qids, dtype=np.int64), n_vocab)
    top = q.max_prob()
    tok = sample(q, rng)
    return tok, q.prob(tok), top, q


def top_candidates(row: np.ndarray, vocab_ids: np.ndarray | None, k: int) -> list[int]:
    """The ``k`` target ids the drafter ranks best in one logits ``row``, best first (its raw logits' order,
    ties to the lower index, NaN as -inf), read only at ``vocab_ids`` where the draft vocabulary is reduced:
    the draft's candidates at a position (``Draft.alternatives``), whose first is :func:`choose_token`'s
    greedy choice."""
    sr = ScoredRow(row[vocab_ids] if vocab_ids is not None else row)
    best = top_ids(sr.row, k, sr.max)
    return [int(vocab_ids[i]) for i in best] if vocab_ids is not None else best
