"""A speculative greedy run replayed: its verify batches evaluated again on a fresh cache, each row decided by
the greedy rule anew.

The equivalence check (:mod:`specviz.analysis.equivalence`) uses it to tell a numerical flip from a bug.
llama.cpp's CPU kernels are not batch invariant, and how far a position's logits move between a one-token
decode and a verify batch depends on the CPU: about 0.3 on the AVX-512 hosts this project was first
measured on, up to 2.1 (the top-two margin up to 1.2) on an AVX2-only EPYC. So the size of the margin at
a divergence cannot say whether the speculative run decided its rows right. The replay can: it evaluates
exactly the batches the run evaluated (the prompt as the session evaluates it, then each round's pending
token and draft at the round's position, the cache cut back to what the round committed) and picks each
row's token itself, with NumPy's first maximum (NaN read as -inf), not the row-scan kernel the acceptor
uses. When every committed token comes out the same, the run did what speculative decoding with those
batches must do, and where it parts from plain decoding the batches' numerics made it; a token that comes
out otherwise is a bug in the round (the acceptor, the commit or the rollback).

The replay goes through the context's memory as a round does (a partial-state checkpoint where the memory
needs one before a verify, the same cuts), so recurrent and hybrid models replay the same evaluations too.
It reuses the session's target context and leaves its cache holding the replayed history.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..backends.llama import LlamaContext
    from ..decoding.round import RoundResult


@dataclass(frozen=True)
class Replay:
    """What the replay found. ``reproduced``: every committed token it checked came out the same.
    Otherwise ``round`` and ``row`` say where it first did not (the round's index and the batch row),
    ``expected`` the token the greedy rule gives there and ``committed`` what the run committed (None
    when the run committed a draft token past a row whose choice refused it, or fewer tokens than the
    rule gives). ``tokens`` counts the generated tokens checked."""

    reproduced: bool
    tokens: int
    round: int | None = None
    row: int | None = None
    expected: int | None = None
    committed: int | None = None

    def to_dict(self) -> dict:
        """Plain form (for the equivalence report)."""
        return asdict(self)


def first_max(row: np.ndarray) -> int:
    """The greedy choice of a logits row: its first maximum, NaN read as -inf."""
    return int(np.argmax(np.where(np.isnan(row), -np.inf, row)))


def replay_greedy(
    ctx: LlamaContext, prompt: Sequence[int], rounds: Sequence[RoundResult], *, prefill: str, upto: int
) -> Replay:
    """Replay ``rounds`` (a greedy run's :class:`~specviz.decoding.round.RoundResult` in order, from the
    start of the generation on ``prompt``) on ``ctx`` until the run's first ``upto`` generated tokens and
    the token after them are checked (or the rounds end). ``prefill`` is the session's
    (:attr:`~specviz.Session.prefill`): how the prompt was evaluated."""
    ctx.clear()
    history = list(prompt)
    if prefill == "whole":
        ctx.eval_prompt(history, 0, keep_last=True)
    else:
        ctx.eval_prompt(history[:-1], 0)
    ctx.memory.remember()  # the state after the prompt, as the session keeps it
    n_prompt = len(history)
    for r in rounds:
        if len(history) - n_prompt > upto:
            break
        if r.prefilled:  # a whole-prompt prefill's first round reads the prompt batch's last row
            rows = [ctx.last_row()]
        else:
            n_past = len(history) - 1
            ctx.memory.checkpoint_for(len(r.draft))
            ctx.eval([history[-1], *r.draft], n_past, rows="all")
            rows = [ctx.row(j) for j in range(len(r.draft) + 1)]
        for j, t in enumerate(r.committed):
            at = len(history) - n_prompt + j
            refused = 0 < j <= len(r.draft) and r.committed[j - 1] != r.draft[j - 1]  # row j-1's correction
            if refused or j >= len(rows):  # nothing follows a correction, nor the bonus
                return Replay(False, at, r.index, j, None, t)
            want = first_max(rows[j])
            if want != t:
                return Replay(False, at, r.index, j, want, t)
        if r.finish is None and len(r.committed) < _rule_length(rows, r.draft):
            # the rule commits more than the run did (an end of generation or a stop string aside)
            j = len(r.committed)
            return Replay(False, len(history) - n_prompt + j, r.index, j, first_max(rows[j]), None)
        history.extend(r.committed)
        kv_after = len(history) - 1
        if ctx.kv_len() > kv_after:
            ctx.memory.cut(kv_after, history)
    return Replay(True, len(history) - n_prompt)


def _rule_length(rows: Sequence[np.ndarray], draft: Sequence[int]) -> int:
    """How many tokens the greedy rule commits from these rows: the accepted draft prefix and one more."""
    for j, d in enumerate(draft):
        if first_max(rows[j]) != d:
            return j + 1
    return len(draft) + 1
