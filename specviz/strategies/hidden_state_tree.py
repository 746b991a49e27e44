"""A hidden-state drafter's tree (``eagle3``, ``mtp``), grown as SGLang grows its EAGLE trees.

Three settings (SGLang's ``speculative_eagle_topk``, ``speculative_num_steps`` and
``speculative_num_draft_tokens``): ``topk`` children per expanded node, ``depth`` levels, and a budget of
``nodes`` verified nodes (the pending token is no node here; the round's limit caps the budget too). A node's
*score* is its cumulative draft probability, the product of the conditional probabilities along its path.

* Level 1 is the root's (the pending token's) ``topk`` candidates. Each later level expands the *frontier*:
  the ``topk`` best-scoring nodes of the level before, each giving its ``topk`` candidates; one head step
  (one decode of the frontier's pairs) per level.
* Greedy: every candidate is kept until the end, and the tree is the ``nodes`` best-scoring candidates
  (ties: the shallower, then the earlier made), which is closed under parents (a child's score is at most its
  parent's). The candidates are the head's best-ranked tokens (softmax at temperature 1, as ``draft_p_min``
  reads it), so a node's first child is the head's greedy choice and branch 0 is the chain it would draft.
* Sampled: a node's children are ``min(topk, nodes left)`` i.i.d. draws from the head's ``q`` (the session's
  temperature, top-k and top-p), equal draws merged, in drawing order, with ``q`` in ``DraftTree.dists``: the
  multi-draft acceptor then keeps the target's distribution. No candidate is dropped after it is drawn (keeping
  the best-scoring draws would bias them): the budget is spent as the frontier is expanded, best first, and how
  many children a node gets is decided before its draws.
* A node whose head's best probability is below ``draft_p_min`` gets no children (the chain's stop rule); a
  root below it gives no draft.

The head's context holds the frontier's paths as sequences of a unified cache (``topk`` of them, sequence 0
the root's): a node's pair is decoded in its branch's sequence at the position after its parent's, and a
second child of a node continues a copy of its parent's sequence. The pairs are the head's own states (its
pre-norm output at the parent's row); they are all removed after the round, as a chain's drafted pairs are, and
the committed tokens' pairs are written from the target's rows (:mod:`specviz.strategies.hidden_state`).

The returned tree numbers branch 0 (every node's first child, from the root down) first, so the verify batch's
rows of a path along it are rows ``0 … n`` as for a chain: a round that verifies only branch 0 (a generation
under a grammar) gives the drafter the same rows.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..decoding.draft_tree import ROOT, DraftTree
from ..decoding.rowscan import ScoredRow
from ..decoding.sampling import sample
from .base import DRAFT_ALTERNATIVES
from .draft_choice import choose_token, top_candidates

if TYPE_CHECKING:
    from ..decoding.sampling import SamplingParams
    from ..decoding.tempered import Dist


@dataclass(frozen=True)
class TreeSettings:
    """A hidden-state tree's settings: children per expanded node, levels, the node budget (the round's limit
    already applied) and ``draft_p_min``."""

    topk: int
    depth: int
    nodes: int
    p_min: float


@dataclass
class _Cand:
    """A candidate node while the tree grows: its token, parent candidate (ROOT), conditional and cumulative
    probability, depth, and once expanded the draft's ``q`` there (sampled) and its best candidates."""

    token: int
    parent: int
    prob: float
    score: float
    depth: int
    q: Dist | None = None
    alternatives: list[int] | None = None


@dataclass
class HiddenTree:
    """What :func:`grow_tree` drafted: the tree (None when it is empty), its branch 0's draft alternatives,
    the reason it stopped early, and how many head rows it decoded."""

    tree: DraftTree | None
    alternatives: list[list[int]]
    reason: str | None
    decoded: int


class Expander:
    """Reads one head row: its children under the session's sampling (see the module docstring)."""

    def __init__(self, params: SamplingParams, rng: np.random.Generator, vocab_ids: Any, n_vocab: int) -> None:
        self.params, self.rng, self.vocab_ids, self.n_vocab = params, rng, vocab_ids, n_vocab

    def children(self, row: np.ndarray, n: int, p_min: float) -> tuple[list[tuple[int, float]], Dist | None]:
        """Up to ``n`` children ``(token, probability)`` of the node whose head row is ``row``, and ``q``
        (sampled); none when the best probability is below ``p_min``."""
        if self.params.greedy:
            sub = row[self.vocab_ids] if self.vocab_ids is not None else row
            ranked = [(i, p) for i, p in ScoredRow(np.array(sub, dtype=np.float32)).top(n) if p > 0.0]
            if not ranked or ranked[0][1] < p_min:
                return [], None
            ids = self.vocab_ids
            return [(int(ids[i]) if ids is not None else int(i), float(p)) for i, p in ranked], None
        tok, p, top, q = choose_token(row, self.params, self.rng, self.vocab_ids, self.n_vocab)
        if top < p_min or q is None:
            return [], None
        out = [(int(tok), float(p))]
        for _ in range(n - 1):  # i.i.d. draws, equal ones merged: each new one is a draw from q without the others
            t = int(sample(q, self.rng))
            if all(t != u for u, _ in out):
                out.append((t, float(q.prob(t))))
        return out, q


def grow_tree(
    dctx: Any,
    pos: int,
    settings: TreeSettings,
    expander: Expander,
) -> HiddenTree:
    """Grow a tree after the root's pair, just decoded at ``pos`` in sequence 0 of ``dctx`` with its output in
    batch row 0 (see the module docstring)."""
    sampled = not expander.params.greedy
    budget = settings.nodes if sampled else None
    cands: list[_Cand] = []
    root = _Cand(-1, ROOT, 1.0, 1.0, 0)
    level = _expand(cands, root, ROOT, dctx.logits(0), settings, expander, budget)
    if not level:
        return HiddenTree(None, [], "p-min", 0)
    states = {ROOT: dctx.prenorm(0)}
    slots = {ROOT: 0}
    decoded = 0
    for d in range(2, settings.depth + 1):
        if budget is not None and len(cands) >= budget:
            break
        front = sorted(level, key=lambda c: (-cands[c].score, c))[: settings.topk]
        if budget is None:  # greedy: a node none of whose children can be among the best is not decoded
            front = _may_grow(cands, front, settings.nodes)
            if not front:
                break
        _assign_slots(dctx, front, cands, slots)
        dctx.decode_nodes(
            [cands[c].token for c in front],
            np.stack([states[cands[c].parent] for c in front]),
            pos + d - 1,
            [slots[c] for c in front],
        )
        decoded += len(front)
        level = []
        for i, c in enumerate(front):
            states[c] = dctx.prenorm(i)
            level += _expand(cands, cands[c], c, dctx.logits(i), settings, expander, budget)
        if not level:
            break
    chosen = _choose(cands, settings.nodes) if not sampled else list(range(len(cands)))
    tree, alternatives = _build(cands, chosen, root, sampled)
    return HiddenTree(tree, alternatives, None, decoded)


def _expand(
    cands: list[_Cand],
    node: _Cand,
    index: int,
    row: np.ndarray,
    settings: TreeSettings,
    expander: Expander,
    budget: int | None,
) -> list[int]:
    """Add ``node``'s children (``index``: its candidate index, or ROOT) read from its head ``row``; return
    their indexes. Sampled, at most the budget's nodes left, decided before the draws."""
    n = settings.topk if budget is None else min(settings.topk, budget - len(cands))
    if n <= 0:
        return []
    node.alternatives = top_candidates(row, expander.vocab_ids, DRAFT_ALTERNATIVES)
    kids, q = expander.children(row, n, settings.p_min)
    node.q = q
    out = []
    for token, p in kids:
        cands.append(_Cand(token, index, p, node.score * p, node.depth + 1))
        out.append(len(cands) - 1)
    return out


def _assign_slots(dctx: Any, front: list[int], cands: list[_Cand], slots: dict[int, int]) -> None:
    """Give each frontier node a sequence holding its parent's path: a parent's first frontier child takes the
    parent's sequence, the others a sequence no frontier node's parent holds, made a copy of the parent's.
    ``slots`` maps a node to its sequence and is updated for ``front``."""
    parents = [cands[c].parent for c in front]
    taken = {slots[p] for p in parents}
    free = [s for s in range(dctx.n_seq) if s not in taken]
    seen: set[int] = set()
    for c, p in zip(front, parents):
        if p not in seen:
            seen.add(p)
            slots[c] = slots[p]
        else:
            s = free.pop(0)
            dctx.copy_sequence(slots[p], s)
            slots[c] = s


def _key(cands: list[_Cand], c: int) -> tuple[float, int, int]:
    """The order of the greedy choice: the best score first, then the shallower, then the earlier made."""
    return (-cands[c].score, cands[c].depth, c)


def _may_grow(cands: list[_Cand], front: list[int], nodes: int) -> list[int]:
    """(Greedy) The nodes of ``front`` whose children could still be among the ``nodes`` chosen: those with at
    most ``nodes - 2`` candidates before them in the choice's order. A child comes after its parent and after
    everything before it (and so does every candidate made later that comes before the parent): past that rank
    none of them can be chosen, nor anything below them, so the tree is the same without decoding the node."""
    if len(cands) < nodes:
        return list(front)
    limit = heapq.nsmallest(nodes - 1, (_key(cands, x) for x in range(len(cands))))[-1] if nodes > 1 else None
    return [c for c in front if limit is not None and _key(cands, c) <= limit]


def _choose(cands: list[_Cand], nodes: int) -> list[int]:
    """(Greedy) The ``nodes`` best-scoring candidates, the shallower and then the earlier first among equals:
    a parent comes before its children, so the choice is a tree."""
    order = sorted(range(len(cands)), key=lambda c: _key(cands, c))
    return sorted(order[:nodes])


def _build(
    cands: list[_Cand], chosen: list[int], root: _Cand, sampled: bool
) -> tuple[DraftTree | None, list[list[int]]]:
    """The draft tree of the ``chosen`` candidates: branch 0 (each first child, from the root) numbered first,
    then the others level by level; with ``dists`` (sampled) for the root and every node with children."""
    kids: dict[int, list[int]] = {}
    for c in chosen:
        kids.setdefault(cands[c].parent, []).append(c)
    main: list[int] = []
    node = ROOT
    while kids.get(node):
        node = kids[node][0]
        main.append(node)
    rest = sorted((c for c in chosen if c not in set(main)), key=lambda c: (cands[c].depth, c))
    tree = DraftTree(dists={} if sampled else None)
    index = {ROOT: ROOT}
    for c in [*main, *rest]:  # a parent before its children: the choice is closed under parents
        index[c] = tree.add(cands[c].token, index[cands[c].parent], cands[c].prob)
    if tree.dists is not None:
        for c, i in index.items():
            q = root.q if c == ROOT else cands[c].q
            if kids.get(c) and q is not None:
                tree.dists[i] = q
    tree.check()
    parent_alts = [(root if cands[c].parent == ROOT else cands[cands[c].parent]).alternatives or [] for c in main]
    return (tree if len(tree) else None), parent_alts
