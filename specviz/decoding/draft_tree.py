"""A draft tree: several continuations of the history sharing their prefixes, verified in one target batch.

A tree's nodes are drafted tokens; node ``i``'s parent is another node or :data:`ROOT` (the pending token, the
newest committed one, which is the first row of every verify batch). Parents come before their children, so a
node's index is larger than its parent's. A node's children are in the drafter's order: its rank order (the
draft's best first) for a greedy tree, its drawing order for a sampled one.

The tree's *branches* are its leaf paths, root to leaf, depth first in the drafter's order (branch 0 follows
every first child: the drafter's main line); branch ``b`` is verified as sequence
``b`` of the target's context (llama.cpp's way of giving one batch a tree attention mask: a row belongs to the
sequence ids of every branch through it, and sees the cells of those sequences only, as
``examples/speculative`` lays out its branches). A chain is a tree of one branch.

The verify batch of a tree (:meth:`DraftTree.batch_layout`): row 0 is the pending token at position ``n_past``
in every branch's sequence, row ``1 + i`` is node ``i`` at position ``n_past + depth(i)`` in the sequences of
the branches through it.

``dists`` (sampled trees only) holds, for every node with children and for :data:`ROOT`, the draft
distribution its children were drawn from: the multi-draft acceptor (:mod:`specviz.decoding.tree_acceptor`)
needs it to keep the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .tempered import Dist

#: The parent of a first-level node: the pending token, row 0 of the verify batch.
ROOT = -1


@dataclass(frozen=True)
class TreeRow:
    """One row of a tree's verify batch: ``token`` at ``position`` in sequences ``seqs`` (ascending)."""

    token: int
    position: int
    seqs: tuple[int, ...]


@dataclass
class DraftTree:
    """Drafted tokens as a tree (see the module docstring). ``tokens[i]``, ``parents[i]`` and ``probs[i]`` (the
    drafter's probability of node ``i``'s token at its parent, None where it has none) describe node ``i``.
    Build one with :meth:`chain` or by :meth:`add`; :meth:`check` states the invariants."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float | None] = field(default_factory=list)
    dists: dict[int, Dist] | None = None

    @classmethod
    def chain(cls, tokens: list[int], probs: list[float | None] | None = None) -> DraftTree:
        """A tree of one branch: ``tokens`` in order."""
        tree = cls()
        parent = ROOT
        for i, t in enumerate(tokens):
            parent = tree.add(t, parent, None if probs is None else probs[i])
        return tree

    def add(self, token: int, parent: int, prob: float | None = None) -> int:
        """Add a node for ``token`` under ``parent`` (a node index or :data:`ROOT`); return its index.
        A parent that is not yet a node raises ValueError."""
        if parent != ROOT and not 0 <= parent < len(self.tokens):
            raise ValueError(f"node parent {parent} is not a node of this tree (it has {len(self.tokens)})")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.probs.append(None if prob is None else float(prob))
        self.__dict__.pop("_shape", None)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)

    # -- shape -------------------------------------------------------------------------------------
    @cached_property
    def _shape(self) -> tuple[list[int], list[list[int]], list[list[int]]]:
        """Depths, children lists (index ``ROOT`` at the end: ``children[-1]``), and branches."""
        n = len(self.tokens)
        depth = [0] * n
        children: list[list[int]] = [[] for _ in range(n + 1)]
        for i, p in enumerate(self.parents):
            depth[i] = 1 if p == ROOT else depth[p] + 1
            children[p].append(i)  # ROOT == -1 lands in the last list
        branches: list[list[int]] = []
        stack = list(reversed(children[ROOT]))
        while stack:  # depth first, children in the drafter's order: branch 0 follows every first child
            node = stack.pop()
            if children[node]:
                stack.extend(reversed(children[node]))
            else:
                branches.append(self._path(node))
        return depth, children, branches

    def _path(self, node: int) -> list[int]:
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def depth(self, node: int) -> int:
        """Node ``node``'s depth: 1 for a child of the root (its draft position is ``depth - 1``); 0 for ROOT."""
        return 0 if node == ROOT else self._shape[0][node]

    def children(self, node: int) -> list[int]:
        """The children of ``node`` (or of ROOT), in the drafter's order."""
        return list(self._shape[1][node])

    def path(self, node: int) -> list[int]:
        """The nodes from the root's first child down to ``node`` (empty for ROOT)."""
        return [] if node == ROOT else self._path(node)

    @property
    def branches(self) -> list[list[int]]:
        """The leaf paths, root to leaf, depth first in the drafter's order; branch ``b`` is sequence ``b``."""
        return [list(b) for b in self._shape[2]]

    @property
    def width(self) -> int:
        """How many branches (leaves) the tree has; 0 when it is empty."""
        return len(self._shape[2])

    @property
    def max_depth(self) -> int:
        """The longest branch's length."""
        return max(self._shape[0], default=0)

    @property
    def is_chain(self) -> bool:
        """Whether the tree is one branch (or empty)."""
        return self.width <= 1

    def node_sequences(self) -> list[tuple[int, ...]]:
        """For each node, the ids of the branches (sequences) through it, ascending."""
        seqs: list[list[int]] = [[] for _ in self.tokens]
        for b, branch in enumerate(self._shape[2]):
            for node in branch:
                seqs[node].append(b)
        return [tuple(s) for s in seqs]

    def branch_through(self, node: int) -> int:
        """The first branch whose path holds ``node`` (for ROOT, branch 0); a node's first branch follows its
        first child at every level below it."""
        if node == ROOT:
            return 0
        for b, branch in enumerate(self._shape[2]):
            if node in branch:
                return b
        raise ValueError(f"node {node} is not in this tree")

    def batch_layout(self, pending: int, n_past: int) -> list[TreeRow]:
        """The verify batch's rows: the pending token at ``n_past`` in every branch's sequence, then each node
        at ``n_past + depth`` in its branches' sequences (rows ``1 + i``)."""
        every = tuple(range(max(self.width, 1)))
        rows = [TreeRow(int(pending), n_past, every)]
        depth = self._shape[0]
        for i, seqs in enumerate(self.node_sequences()):
            rows.append(TreeRow(self.tokens[i], n_past + depth[i], seqs))
        return rows

    # -- checks and plain data -----------------------------------------------------------------------
    def check(self) -> None:
        """Raise ValueError unless the tree is well formed: equal-length node lists, every parent an earlier
        node or ROOT, no two siblings with the same token (a duplicate could never be verified apart), and,
        when ``dists`` is given, one for ROOT and for every node with children."""
        n = len(self.tokens)
        if len(self.parents) != n or len(self.probs) != n:
            raise ValueError(
                f"a draft tree's node lists differ in length: {n} tokens, {len(self.parents)} parents, "
                f"{len(self.probs)} probabilities"
            )
        for i, p in enumerate(self.parents):
            if p != ROOT and not 0 <= p < i:
                raise ValueError(f"node {i}'s parent {p} is not an earlier node or ROOT ({ROOT})")
        for node in [ROOT, *range(n)]:
            kids = [self.tokens[c] for c in self.children(node)]
            if len(set(kids)) != len(kids):
                raise ValueError(f"node {node} has two children with the same token ({kids})")
            if self.dists is not None and kids and node not in self.dists:
                raise ValueError(f"a sampled tree needs the draft distribution at node {node}, which has children")

    def to_dict(self) -> dict[str, Any]:
        """Plain data for events and recordings: ``tokens``, ``parents``, ``probs``, ``depths``, ``branches``."""
        return {
            "tokens": list(self.tokens),
            "parents": list(self.parents),
            "probs": list(self.probs),
            "depths": [self.depth(i) for i in range(len(self.tokens))],
            "branches": self.branches,
        }
