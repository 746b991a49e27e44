"""A draft model drafting a tree, branching as llama.cpp's ``examples/speculative`` branches.

Each drafting step evaluates, in one draft-model decode, the newest token of every branch still drafting,
each in its own sequence of the draft context (a unified cache: a new branch shares its parent's cells). At
each branch's newest row the draft's candidates are ranked; the branch splits where the candidate of rank
``f`` (``f = 1, 2, …``, at most 7 as upstream) has a probability above ``p_split``, while the tree has fewer
than ``tree_width`` branches. The branch keeps the first candidate, each split the next. A branch stops where
the draft's best probability falls below ``draft_p_min`` (specviz's draft knob; llama-speculative has none:
set it to 0 to draft as upstream) and every branch stops once the tree holds ``n_max`` nodes (upstream lets the
last step's branches each add their token past that; the round's budget is a hard cap here).

Which probabilities: under greedy decoding the draft model's own softmax at temperature 1 (as ``draft_p_min``
reads it), and the candidates are the draft's top-ranked tokens. llama-speculative ranks the candidates of its
sampler, whose temperature-0 distribution is a point mass, so under greedy it never splits. Under sampling the
draft distribution ``q`` is the session's (temperature, top-k, top-p), a node's children are drawn i.i.d. from
``q`` (equal draws merged) and ``q`` is kept in ``DraftTree.dists`` for the multi-draft acceptor, which then keeps
the target's distribution; llama-speculative takes ``q``'s most probable tokens instead, which its single-draft
acceptance rule does not make lossless. The number of children is decided from ``q`` before any draw, so it
cannot bias them.

After the round, :func:`collapse` keeps the branch that holds the committed tokens and moves it to sequence 0,
so the draft context is a chain again, as after a chain round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from ..decoding.draft_tree import ROOT, DraftTree
from ..decoding.rowscan import ScoredRow
from ..decoding.sampling import sample
from ..decoding.tempered import tempered_or_dist

if TYPE_CHECKING:
    import numpy as np

    from ..backends.llama import LlamaContext
    from ..decoding.sampling import SamplingParams
    from ..decoding.tempered import Dist

#: The most splits one node makes in one step (llama-speculative tries ranks 1 to 7).
MAX_SPLITS_PER_NODE = 7


@dataclass
class Branch:
    """One branch while drafting: its sequence in the draft context, its newest node (ROOT before its first),
    where its next row lies in the last draft batch (None: the root's row, the context's last row), the tokens
    of its nodes the draft context holds in ``seq`` past the shared prefix, and whether it still drafts."""

    seq: int
    last: int = ROOT
    row: int | None = None
    evaluated: list[int] = field(default_factory=list)
    drafting: bool = True


@dataclass
class TreeDraft:
    """What :func:`draft_tree` made: the tree and its branches as the draft context holds them."""

    tree: DraftTree
    branches: list[Branch]
    reason: str | None


def _candidates(row: np.ndarray, params: SamplingParams) -> tuple[list[tuple[int, float]], Dist | None]:
    """The draft's ranked candidates at ``row`` (best first, ``1 + MAX_SPLITS_PER_NODE`` of them) with their
    probabilities, and, under sampling, the distribution children are drawn from."""
    n = 1 + MAX_SPLITS_PER_NODE
    if params.greedy:
        return ScoredRow(row).top(n), None
    q = tempered_or_dist(row.copy(), params)  # a copy: the next decode overwrites llama.cpp's logits
    return q.top(n), q


def _n_children(ranked: list[tuple[int, float]], free: int, p_split: float) -> int:
    """How many children a node gets: its best candidate, then one per next-ranked candidate above
    ``p_split`` (in rank order, stopping at the first below), while ``free`` branches remain."""
    n = 1
    for _, p in ranked[1:]:
        if n - 1 >= free or p <= p_split:
            break
        n += 1
    return n


def _children_tokens(
    ranked: list[tuple[int, float]], q: Dist | None, n: int, rng: np.random.Generator
) -> list[tuple[int, float]]:
    """The children's tokens and draft probabilities: the ``n`` best (greedy), or ``n`` i.i.d. draws from ``q``
    with equal draws merged (sampled)."""
    if q is None:
        return ranked[:n]
    out: list[tuple[int, float]] = []
    for _ in range(n):
        t = int(sample(q, rng))
        if all(t != u for u, _ in out):
            out.append((t, q.prob(t)))
    return out


def draft_tree(
    ctx: LlamaContext,
    n_past: int,
    n_max: int,
    *,
    width: int,
    p_split: float,
    p_min: float,
    params: SamplingParams,
    rng: np.random.Generator,
) -> TreeDraft:
    """Draft a tree of up to ``n_max`` nodes and ``width`` branches on ``ctx``, whose sequence 0 holds
    ``n_past`` positions, the newest evaluated with its row kept (the root's row: ``ctx.last_row()``).
    Sequences ``1 … width - 1`` are cleared first. See the module docstring for the rule."""
    for s in range(1, width):
        ctx.clear_sequence(s)
    tree = DraftTree(dists=None if params.greedy else {})
    branches = [Branch(0)]
    reason = None
    pos = n_past
    while len(tree) < n_max:
        growing = [b for b in branches if b.drafting]
        if not growing:
            break
        step: list[tuple[Branch, int]] = []
        for b in growing:
            if len(tree) >= n_max:
                break
            row = ctx.last_row() if b.row is None else ctx.row(b.row)
            ranked, q = _candidates(row, params)
            if not ranked or ranked[0][1] < p_min:
                b.drafting, reason = False, "p-min"
                continue
            room = min(width - len(branches), n_max - len(tree) - 1)
            kids = _children_tokens(ranked, q, _n_children(ranked, room, p_split), rng)
            if q is not None and tree.dists is not None:
                tree.dists[b.last] = q
            parent = b.last
            for j, (token, prob) in enumerate(kids):
                owner = b if j == 0 else _split(ctx, b, len(branches), branches)
                owner.last = tree.add(token, parent, prob)
                step.append((owner, token))
        if not step or len(tree) >= n_max:
            break
        _evaluate(ctx, step, pos)
        pos += 1
    tree.check()
    return TreeDraft(tree, branches, reason if len(tree) < n_max else None)


def _split(ctx: LlamaContext, parent: Branch, seq: int, branches: list[Branch]) -> Branch:
    """A new branch in sequence ``seq``, sharing ``parent``'s cells and tokens so far."""
    ctx.copy_sequence(parent.seq, seq)
    b = Branch(seq, parent.last, parent.row, list(parent.evaluated))
    branches.append(b)
    return b


def _evaluate(ctx: LlamaContext, step: list[tuple[Branch, int]], pos: int) -> None:
    """One draft decode of this step's tokens, each at ``pos`` in its branch's sequence; each branch's next
    row is its token's."""
    got = ctx.eval_sequences([(b.seq, [t], pos) for b, t in step])
    for b, t in step:
        b.row = got.index(b.seq, 0)
        b.evaluated.append(int(t))


def collapse(ctx: LlamaContext, branches: Sequence[Branch], prefix: int, history: Sequence[int]) -> list[int]:
    """After a tree round: keep, of ``branches``, the one whose evaluated tokens agree longest with ``history``
    past the shared ``prefix`` (its first such), as sequence 0 alone; return the tokens it holds past
    ``prefix``. The caller then cuts them to the common prefix with the history, as after a chain round."""
    tail = list(history[prefix:])

    def agreed(b: Branch) -> int:
        n = 0
        while n < min(len(b.evaluated), len(tail)) and b.evaluated[n] == tail[n]:
            n += 1
        return n

    best = max(branches, key=agreed)  # max keeps the first of equals: branch 0 when none agrees
    ctx.keep_branch(best.seq, prefix + len(best.evaluated))
    return list(best.evaluated)
