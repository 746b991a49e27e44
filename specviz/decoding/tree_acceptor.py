"""The tree acceptor: one function decides what a verified draft tree commits, for greedy and sampled decoding.

:func:`accept_tree` is to a :class:`~specviz.decoding.draft_tree.DraftTree` what
:func:`~specviz.decoding.acceptor.accept` is to a chain; it walks the tree from its root down one path and
reads only the rows along it.

Terms (for one sequence; ``V`` is the vocabulary size):

``tree``
    The drafted :class:`~specviz.decoding.draft_tree.DraftTree`: node ``i`` holds ``tree.tokens[i]`` under
    ``tree.parents[i]`` (another node or ``ROOT``, the pending token); a node's children are in the drafter's
    order. A sampled tree's ``tree.dists[n]`` is the draft distribution ``q_n`` its children were drawn from
    at node ``n`` (or at ``ROOT``).
``rows``
    The target's logits for the tree's verify batch (:meth:`DraftTree.batch_layout
    <specviz.decoding.draft_tree.DraftTree.batch_layout>`): ``rows(0)`` (or ``rows[0]``) is the pending
    token's row, ``rows(1 + i)`` node ``i``'s; each is a ``float32`` array of ``V`` entries and predicts the
    token that follows the committed text plus the path to its node. Rows are read lazily, only along the
    path walked.
``params``, ``rng``
    As for the chain acceptor: :class:`~specviz.decoding.sampling.SamplingParams` (temperature 0 is greedy)
    and the generation's seeded ``numpy.random.Generator`` (never touched when greedy).

Greedy (temperature 0): start at the root; the target's choice at the current node's row is the row's first
maximum (NaN counts as −∞), read by the row reader (:class:`~specviz.decoding.rowscan.ScoredRow`, the rule
of :func:`~specviz.decoding.rowscan.read_greedy`); move to the child holding that token and repeat; stop at
a node none of whose children holds it (the choice is then the correction) or at a leaf (the bonus).

Sampled: multi-draft rejection sampling (SpecInfer's), in its form for children drawn *without
replacement*. At a node with children ``x_1 … x_m`` (in drawing order) let ``p`` be the target's sampling
distribution of the node's row (temperature, top-k, top-p, as the chain acceptor builds it:
:func:`~specviz.decoding.tempered.tempered_or_dist`) and ``q = tree.dists[node]``. For ``j = 1 … m``:
accept ``x_j`` with probability ``min(1, p(x_j) / q(x_j))``; on rejection set ``p ← max(0, p − q)``
normalised, then ``q ← q`` without ``x_j``, normalised. If every child is rejected, the correction is drawn
from the last residual ``p``; at a leaf the bonus is drawn from the row's ``p``. Without ``dists`` (children
not drawn from a distribution) each child is tested by the point-mass rule: accept ``x_j`` with ``p(x_j)``,
on rejection remove ``x_j`` from ``p`` and renormalise. Random numbers are drawn in a fixed order, one
uniform per examined child, then one for the correction or the bonus.

Why ``q`` loses each rejected child: a tree cannot hold one token twice under a node
(:meth:`DraftTree.check <specviz.decoding.draft_tree.DraftTree.check>`), so a drafter drawing i.i.d. from
``q`` keeps each drawn token once, in first-drawn order; the next distinct child is then drawn from ``q``
without the tokens before it, and the rule above keeps the committed token distributed exactly as ``p``.
The rule with ``q`` left whole is exact only for i.i.d. drafts verified with their repeats (a repeat of a
rejected token is rejected for certain, but its ``p ← max(0, p − q)`` step still moves the residual), and
on merged children it is not: with four tokens and three draws it missed ``p`` by 0.04 in one token's
probability, computed exactly. The rule holds for any number of children, however the drafter decides
when to stop drawing, as long as each child is a draw from ``q`` without the children before it.

A chain (a tree of one branch) gives exactly :func:`~specviz.decoding.acceptor.accept`'s Verdict on the
same rows: greedy through the same row reader and the chain acceptor's own verdict builder
(:func:`~specviz.decoding.acceptor.greedy_verdict`, :func:`~specviz.decoding.acceptor.refusal_of`), sampled
with the same ``rng`` state (one child per node, so ``q`` is never reduced, and the same uniforms are drawn
in the same order for the same tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .acceptor import N_ALTERNATIVES, PositionVerdict, Verdict, correction, greedy_verdict, refusal_of
from .draft_tree import ROOT, DraftTree
from .rowscan import GreedyRows, RowSource, ScoredRow
from .sampling import SamplingParams, TokenDist, acceptance_probability, residual_distribution
from .tempered import Dist, TemperedRow, tempered_or_dist

__all__ = ["RowChoice", "TreeVerdict", "accept_tree", "branch_rows", "N_CHOICE_ALTERNATIVES"]

#: How many alternatives to the target's choice each row read reports (for the tree view's hover).
N_CHOICE_ALTERNATIVES = 4


@dataclass(frozen=True)
class RowChoice:
    """The target's choice at one row read along the accepted path: ``node`` is the row's node (``ROOT`` for
    row 0), ``token`` the token committed after it (greedy: the row's first maximum; sampled: the accepted
    child's token, or the correction or bonus drawn there), ``prob`` its probability and ``alternatives``
    the row's next most probable tokens other than ``token`` (at most :data:`N_CHOICE_ALTERNATIVES`), best
    first, with their probabilities. Greedy probabilities are the softmax at temperature 1; sampled ones
    those of the row's sampling distribution (before any residual)."""

    node: int
    token: int
    prob: float
    alternatives: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class TreeVerdict:
    """What a verified tree commits.

    ``path`` holds the accepted nodes, root first. ``branch`` is the kept branch (an index into
    ``tree.branches``, the sequence kept in the target's context): the first branch through the last
    accepted node, which follows that node's first child where the walk stopped at a node with children
    (:meth:`DraftTree.branch_through <specviz.decoding.draft_tree.DraftTree.branch_through>`). ``verdict`` is
    an ordinary :class:`~specviz.decoding.acceptor.Verdict` for that branch read as a chain:
    ``n_accepted == len(path)``, ``tokens`` the accepted tokens and the target's final token, ``probs`` the
    target's probabilities of them, ``bonus``, ``rows_read`` (``len(path) + 1``) and, at a refusal, the
    details of the branch's first refused token as the chain acceptor reports them; its ``positions``
    (sampled) are the kept branch's examined nodes. ``choices`` holds one :class:`RowChoice` per row read,
    root first. ``examined`` (sampled only) pairs every examined node, siblings included, with its test, in
    the order tested; a child tested after rejected siblings reports the residual's ``p`` and the reduced
    ``q`` it was tested against.
    """

    path: tuple[int, ...]
    branch: int
    verdict: Verdict
    choices: tuple[RowChoice, ...]
    examined: tuple[tuple[int, PositionVerdict], ...] = ()


def accept_tree(
    tree: DraftTree,
    rows: RowSource,
    params: SamplingParams,
    rng: np.random.Generator,
    *,
    top_n: int = N_ALTERNATIVES,
) -> TreeVerdict:
    """Decide what one tree round commits (see the module docstring for the terms and the two rules)."""
    if params.greedy:
        return _accept_greedy(tree, _reader(rows), top_n)
    return _accept_sampled(tree, _reader(rows), params, rng, top_n)


def branch_rows(rows: RowSource, tree: DraftTree, branch: int) -> Callable[[int], np.ndarray]:
    """Branch ``branch``'s rows as a chain's: row ``j`` is the root's row for ``j = 0``, else the row of the
    branch's node ``j − 1`` (the rows :func:`~specviz.decoding.acceptor.accept` reads for that branch's
    tokens). A row outside the branch raises IndexError."""
    nodes = _branch_nodes(tree, branch)
    read = _reader(rows)

    def row(j: int) -> np.ndarray:
        if not 0 <= j <= len(nodes):
            raise IndexError(f"row {j} is outside branch {branch}, which has {len(nodes) + 1} rows")
        return read(0 if j == 0 else 1 + nodes[j - 1])

    return row


def _reader(rows: RowSource) -> Callable[[int], np.ndarray]:
    return rows if callable(rows) else rows.__getitem__


def _branch_nodes(tree: DraftTree, branch: int) -> list[int]:
    """The nodes of branch ``branch``, root to leaf (an empty tree's branch 0 has none)."""
    if branch == 0 and len(tree) == 0:
        return []
    branches = tree.branches
    if not 0 <= branch < len(branches):
        raise IndexError(f"branch {branch} is not in this tree (it has {len(branches)})")
    return branches[branch]


def _row_choice(node: int, token: int, prob: float, top: Sequence[tuple[int, float]]) -> RowChoice:
    others = tuple((t, p) for t, p in top if t != token)[:N_CHOICE_ALTERNATIVES]
    return RowChoice(node, token, prob, others)


def _accept_greedy(tree: DraftTree, read: Callable[[int], np.ndarray], top_n: int) -> TreeVerdict:
    """Walk the tree by the row reader's choices (:class:`ScoredRow`: the first maximum, NaN as −∞, as
    :func:`~specviz.decoding.rowscan.read_greedy` reads a chain); the kept branch's verdict is the chain
    acceptor's (:func:`~specviz.decoding.acceptor.greedy_verdict`) on what the walk read, its refusal that
    of the stopping node's first child."""
    node = ROOT
    path: list[int] = []
    choices: list[RowChoice] = []
    tokens: list[int] = []
    probs: list[float] = []
    while True:
        scored = ScoredRow(read(1 + node), normaliser=True)
        token = scored.best
        tokens.append(token)
        probs.append(scored.prob(token))
        choices.append(_row_choice(node, token, probs[-1], scored.top(N_CHOICE_ALTERNATIVES + 1)))
        kids = tree.children(node)
        child = next((c for c in kids if tree.tokens[c] == token), None)
        if child is None:
            refused = refusal_of(scored, scored.row, tree.tokens[kids[0]], top_n) if kids else None
            break
        path.append(child)
        node = child
    verdict = greedy_verdict(GreedyRows(tuple(tokens), tuple(probs), refused))
    return TreeVerdict(tuple(path), tree.branch_through(node), verdict, tuple(choices))


def _accept_sampled(
    tree: DraftTree, read: Callable[[int], np.ndarray], params: SamplingParams, rng: np.random.Generator, top_n: int
) -> TreeVerdict:
    node = ROOT
    path: list[int] = []
    tokens: list[int] = []
    probs: list[float] = []
    choices: list[RowChoice] = []
    examined: list[tuple[int, PositionVerdict]] = []
    while True:
        logits = read(1 + node)
        kids = tree.children(node)
        if not kids:  # a leaf: the bonus from the row's p
            p = tempered_or_dist(logits, params)
            token = p.draw(float(rng.random()))
            break
        q = None if tree.dists is None else tree.dists.get(node)
        first = tree.tokens[kids[0]]
        # without q the first child's correction is drawn from p without it: the row is read with it left out
        p = tempered_or_dist(logits, params, first if q is None else -1)
        got, token, tests = _test_children(p, q, [tree.tokens[c] for c in kids], len(path), rng)
        examined.extend((kids[j], t) for j, t in enumerate(tests))
        if got is None:
            break
        tokens.append(token)
        probs.append(p.prob(token))
        choices.append(_row_choice(node, token, p.prob(token), p.top(N_CHOICE_ALTERNATIVES + 1)))
        path.append(kids[got])
        node = kids[got]
    tokens.append(token)
    probs.append(p.prob(token))
    choices.append(_row_choice(node, token, p.prob(token), p.top(N_CHOICE_ALTERNATIVES + 1)))
    branch = tree.branch_through(node)
    on_branch = set(_branch_nodes(tree, branch))
    positions = tuple(t for n, t in examined if n in on_branch)
    n = len(path)
    if not kids:
        verdict = Verdict(n, tuple(tokens), tuple(probs), True, positions=positions, rows_read=n + 1)
    else:
        refused = refusal_of(p, logits, first, top_n)
        verdict = Verdict(
            n,
            tuple(tokens),
            tuple(probs),
            False,
            rejected_prob=refused.prob,
            alternatives=refused.alternatives,
            positions=positions,
            rows_read=n + 1,
            rejected_rank=refused.rank,
            margin=refused.margin,
        )
    return TreeVerdict(tuple(path), branch, verdict, tuple(choices), tuple(examined))


def _test_children(
    p: Dist, q: Dist | None, kids: list[int], position: int, rng: np.random.Generator
) -> tuple[int | None, int, list[PositionVerdict]]:
    """Test a node's children in order (the module docstring's rule): ``(j, kids[j], tests)`` for the
    accepted ``j``-th child, or ``(None, correction, tests)`` when every child was rejected."""
    r, qc = p, q
    tests: list[PositionVerdict] = []
    for j, x in enumerate(kids):
        a = acceptance_probability(r, qc, x)
        u = float(rng.random())
        ok = u < a
        tests.append(PositionVerdict(position, x, r.prob(x), None if qc is None else qc.prob(x), a, u, ok))
        if ok:
            return j, x, tests
        if j == len(kids) - 1:
            return None, correction(r, qc, x, float(rng.random())), tests
        r = residual_distribution(_built(r), None if qc is None else _built(qc), x)
        qc = None if qc is None else _without(_built(qc), x)
    raise ValueError("a node with children was tested with none")


def _built(d: Dist) -> TokenDist:
    return d.dist() if isinstance(d, TemperedRow) else d


def _without(q: TokenDist, token: int) -> TokenDist:
    """``q`` with ``token`` removed and the rest renormalised: the next child's distribution, drawn without
    the children before it (left with no mass when ``token`` held it all: no child can follow)."""
    probs = q.probs.copy()
    probs[q.token_ids() == int(token)] = 0.0
    total = float(probs.sum())
    return TokenDist(probs / total if total > 0.0 else probs, q.ids, q.n_vocab)
