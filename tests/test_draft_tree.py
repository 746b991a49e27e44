"""The draft tree's shape: branches, the sequences of each node, the verify batch's layout, the checks."""

from __future__ import annotations

import pytest

from specviz.decoding.draft_tree import ROOT, DraftTree, TreeRow


def _tree() -> DraftTree:
    # root ─ 5 ─ 7 ─ 8
    #      │   └ 9
    #      └ 6
    t = DraftTree()
    a = t.add(5, ROOT, 0.6)
    t.add(6, ROOT, 0.3)
    c = t.add(7, a, 0.9)
    t.add(8, c)
    t.add(9, a, 0.05)
    return t


def test_branches_follow_the_drafters_order_depth_first():
    t = _tree()
    assert t.branches == [[0, 2, 3], [0, 4], [1]]
    assert t.width == 3 and t.max_depth == 3 and not t.is_chain
    assert t.children(ROOT) == [0, 1] and t.children(0) == [2, 4] and t.children(3) == []
    assert [t.depth(i) for i in range(5)] == [1, 1, 2, 3, 2] and t.depth(ROOT) == 0
    assert t.path(3) == [0, 2, 3] and t.path(ROOT) == []


def test_each_node_belongs_to_every_branch_through_it():
    t = _tree()
    assert t.node_sequences() == [(0, 1), (2,), (0,), (0,), (1,)]
    assert [t.branch_through(i) for i in (ROOT, 0, 1, 4)] == [0, 0, 2, 1]


def test_batch_layout_puts_the_pending_token_in_every_sequence():
    rows = _tree().batch_layout(pending=1, n_past=10)
    assert rows[0] == TreeRow(1, 10, (0, 1, 2))
    assert rows[1:] == [
        TreeRow(5, 11, (0, 1)),
        TreeRow(6, 11, (2,)),
        TreeRow(7, 12, (0,)),
        TreeRow(8, 13, (0,)),
        TreeRow(9, 12, (1,)),
    ]


def test_a_chain_is_one_branch():
    t = DraftTree.chain([4, 5, 6], [0.9, 0.8, None])
    assert t.branches == [[0, 1, 2]] and t.is_chain and t.probs == [0.9, 0.8, None]
    assert t.batch_layout(3, 0)[3] == TreeRow(6, 3, (0,))
    assert DraftTree().width == 0 and DraftTree().is_chain


def test_adding_a_node_updates_the_shape():
    t = DraftTree.chain([4])
    assert t.width == 1
    t.add(5, ROOT)
    assert t.branches == [[0], [1]]


def test_malformed_trees_are_refused():
    with pytest.raises(ValueError, match="not a node"):
        DraftTree().add(1, 0)
    t = DraftTree.chain([4])
    t.add(4, ROOT)
    with pytest.raises(ValueError, match="same token"):
        t.check()
    bad = DraftTree(tokens=[1, 2], parents=[ROOT, 1], probs=[None, None])
    with pytest.raises(ValueError, match="earlier node"):
        bad.check()
    sampled = DraftTree.chain([1, 2])
    sampled.dists = {}
    with pytest.raises(ValueError, match="draft distribution"):
        sampled.check()


def test_plain_data_for_events():
    d = _tree().to_dict()
    assert d["parents"] == [-1, -1, 0, 2, 0] and d["depths"] == [1, 1, 2, 3, 2]
    assert d["branches"] == [[0, 2, 3], [0, 4], [1]]
