"""A draft model drafting a tree: each node is the draft's ranked choice after its own path (checked against the
same model decoding that path as a chain), branches split by llama.cpp's p-split rule, and the branch holding the
committed tokens is kept as sequence 0."""

from __future__ import annotations

import numpy as np
import pytest

from specviz.backends import LlamaContext, LlamaModel
from specviz.decoding.draft_tree import ROOT
from specviz.decoding.rowscan import ScoredRow
from specviz.decoding.sampling import SamplingParams
from specviz.strategies.tree_drafting import MAX_SPLITS_PER_NODE, collapse, draft_tree
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

PROMPT = [1, 40, 41, 42, 43]


@pytest.fixture(scope="module")
def draft_model(tmp_path_factory):
    path = write_tiny_llama(
        tmp_path_factory.mktemp("tree-draft") / "draft.gguf", n_layer=1, layers_from=tiny_weights(seed=1)
    )
    m = LlamaModel(path)
    yield m
    m.close()


def _ctx(model: LlamaModel, n_seq: int) -> LlamaContext:
    return LlamaContext(model, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=n_seq, kv_unified=n_seq > 1)


def _chain_row(model: LlamaModel, tokens: list[int]) -> np.ndarray:
    ctx = _ctx(model, 1)
    ctx.eval(tokens, 0, rows="last")
    row = ctx.last_row().copy()
    ctx.close()
    return row


def _drafted(model, width, n_max, p_split, p_min=0.0):
    ctx = _ctx(model, width)
    ctx.eval(PROMPT, 0, rows="last")
    got = draft_tree(
        ctx,
        len(PROMPT),
        n_max,
        width=width,
        p_split=p_split,
        p_min=p_min,
        params=SamplingParams(),
        rng=np.random.default_rng(0),
    )
    return ctx, got


def test_greedy_nodes_are_the_drafts_ranked_choices_after_their_path(draft_model):
    ctx, got = _drafted(draft_model, width=3, n_max=8, p_split=0.0)
    tree = got.tree
    ctx.close()
    assert 1 < tree.width <= 3 and len(tree) == 8
    for node in [ROOT, *range(len(tree))]:
        kids = tree.children(node)
        if not kids:
            continue
        path = [tree.tokens[i] for i in tree.path(node)]
        ranked = ScoredRow(_chain_row(draft_model, PROMPT + path)).top(1 + MAX_SPLITS_PER_NODE)
        # the children are the draft's best candidates after the node's own path, in rank order
        assert [tree.tokens[k] for k in kids] == [t for t, _ in ranked[: len(kids)]]
        for k in kids:
            assert tree.probs[k] == pytest.approx(dict(ranked)[tree.tokens[k]], rel=1e-4)


def test_a_branch_splits_only_above_p_split(draft_model):
    ctx, got = _drafted(draft_model, width=4, n_max=10, p_split=0.02)
    tree = got.tree
    ctx.close()
    for node in [ROOT, *range(len(tree))]:
        kids = tree.children(node)
        assert all(tree.probs[k] > 0.02 for k in kids[1:])  # every split candidate was above p_split
    assert tree.width <= 4


def test_without_p_split_room_the_tree_is_a_chain(draft_model):
    ctx, got = _drafted(draft_model, width=3, n_max=6, p_split=1.0)
    ctx.close()
    assert got.tree.is_chain and len(got.tree) == 6


def test_p_min_stops_a_branch(draft_model):
    ctx, got = _drafted(draft_model, width=3, n_max=8, p_split=0.0, p_min=1.0)
    ctx.close()
    assert len(got.tree) == 0 and got.reason == "p-min"


def test_collapse_keeps_the_branch_holding_the_committed_tokens(draft_model):
    ctx, got = _drafted(draft_model, width=3, n_max=8, p_split=0.0)
    tree = got.tree
    b = next(i for i, br in enumerate(got.branches) if br.seq != 0 and br.evaluated)
    kept = got.branches[b].evaluated
    history = PROMPT + kept + [7]  # the target took that branch's evaluated tokens, then a token of its own
    tokens = collapse(ctx, got.branches, len(PROMPT), history)
    assert tokens == kept
    assert ctx.seq_len(0) == len(PROMPT) + len(kept)
    assert all(ctx.seq_len(q) == 0 for q in range(1, 3))
    # the cells kept are that branch's: the next row is the chain's after the same tokens (to the rounding of
    # keys computed in batches of other sizes), and far from the row after the main line's tokens
    ctx.eval([7], len(PROMPT) + len(kept), rows="last")
    row = ctx.last_row().copy()
    ctx.close()
    np.testing.assert_allclose(row, _chain_row(draft_model, history), atol=0.02)
    main = got.branches[0].evaluated[: len(kept)]
    assert main != kept
    assert np.abs(row - _chain_row(draft_model, PROMPT + main + [7])).max() > 0.1
    assert tree.width > 1
