"""Draft trees from the n-gram strategies' several continuations (``tree_width`` > 1).

An n-gram drafter holds more than one continuation where the history went on differently after the same
n-gram: ``ngram-map-k`` / ``ngram-map-k4v`` the values stored for a key, ``ngram-cache`` the followers
counted after an n-gram. With ``tree_width`` > 1 they propose them as a
:class:`~specviz.decoding.draft_tree.DraftTree`, verified in one target batch.

:func:`trie_of` merges whole continuations, in the drafter's priority order, into a trie: continuation 0 is
branch 0 (the drafter's main line), a later one shares the nodes of its common prefix with those before it
and adds its remaining tokens, so no two siblings hold the same token. A continuation that would make one
branch more than ``width`` is left out; one that only extends a leaf or lies along a path adds no branch. The
nodes are filled depth by depth (every admitted continuation's first token, then every second …) until the
node budget is spent, so a long main line cannot take the whole budget from the others, and the main line's
node comes first at every depth (it stays branch 0).

:func:`followed` reads, after the round, which drafted continuations the target followed: those holding the
whole accepted path (the kept branch's ``n_accepted`` tokens, read from the committed history). A
continuation the target left for a sibling was not refused on its own account: its statistics stay.

These drafters keep no context of their own, so a tree round leaves nothing to collapse. Their trees carry
no draft distributions (``dists`` None): under sampling each child is tested by the acceptor's point-mass
rule.
"""

from __future__ import annotations

from typing import Sequence

from ..decoding.draft_tree import ROOT, DraftTree
from .base import DRAFT_ALTERNATIVES, Draft


def _leaves_after(trie: dict[int, dict], path: Sequence[int], leaves: int) -> tuple[int, bool]:
    """The trie's leaf count once ``path`` is inserted, and whether inserting it adds any node."""
    node = trie
    for i, t in enumerate(path):
        if t not in node:
            # a new node under a leaf extends that leaf; under a node with children (or the root) it is a new leaf
            extends_leaf = not node and i > 0
            return leaves + (0 if extends_leaf else 1), True
        node = node[t]
    return leaves, False


def _insert(trie: dict[int, dict], path: Sequence[int]) -> None:
    node = trie
    for t in path:
        node = node.setdefault(t, {})


def trie_of(paths: Sequence[Sequence[int]], width: int, max_nodes: int) -> tuple[DraftTree, list[int]]:
    """The trie of ``paths`` (in priority order) of at most ``width`` branches and ``max_nodes`` nodes (see the
    module docstring), and for each path how many of its tokens the tree holds (0: left out)."""
    trie: dict[int, dict] = {}
    leaves = 0
    admitted: list[Sequence[int]] = []
    index: list[int] = []
    for i, p in enumerate(paths):
        if not p:
            continue
        after, adds = _leaves_after(trie, p, leaves)
        if adds and after > width:
            continue
        _insert(trie, p)
        leaves = after
        admitted.append(p)
        index.append(i)
    tree = DraftTree()
    node_of: dict[tuple[int, ...], int] = {}
    held = [0] * len(paths)
    depth = 0
    while len(tree) < max_nodes and any(len(p) > depth for p in admitted):
        for i, p in zip(index, admitted):
            if len(p) <= depth or held[i] < depth:  # ended, or its parent did not fit
                continue
            key = tuple(p[: depth + 1])
            if key not in node_of:
                if len(tree) >= max_nodes:
                    continue
                parent = ROOT if depth == 0 else node_of[key[:-1]]
                node_of[key] = tree.add(p[depth], parent)
            held[i] = depth + 1
        depth += 1
    return tree, held


def children_alternatives(tree: DraftTree, main: Sequence[int]) -> list[list[int]]:
    """For each node of the main line ``main``, the tokens of its parent's children in the tree's order (the
    main line's first): what the tree held at that draft position."""
    return [[tree.tokens[c] for c in tree.children(tree.parents[node])][:DRAFT_ALTERNATIVES] for node in main]


def tree_draft(tree: DraftTree, reason: str | None, alternatives: list[list[int]] | None = None) -> Draft:
    """The Draft of ``tree``: its branch 0 as the tokens, the tree itself only where it branches (a tree of one
    branch is a chain). ``alternatives`` (per branch-0 position, best first) default to the tree's children."""
    main = tree.branches[0] if len(tree) else []
    if alternatives is None:
        alternatives = children_alternatives(tree, main)
    return Draft(
        tokens=[tree.tokens[i] for i in main],
        reason=reason,
        alternatives=alternatives[: len(main)],
        tree=None if tree.is_chain else tree,
    )


def followed(paths: Sequence[Sequence[int]], committed: Sequence[int], n_accepted: int) -> list[bool]:
    """For each drafted continuation, whether the target followed it through the whole accepted path: its first
    ``n_accepted`` tokens are the first ``n_accepted`` committed ones (it holds at least that many)."""
    head = list(committed[:n_accepted])
    return [len(p) >= n_accepted and list(p[:n_accepted]) == head for p in paths]
