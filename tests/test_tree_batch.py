"""A draft tree's verify through llama.cpp's sequences (``LlamaContext.eval_tree``, ``share_prefix``,
``keep_branch``; :func:`specviz.backends.sequences.plan_tree`), on tiny real llama.cpp models.

The tree (:data:`NODES`) has three branches of unequal depth: ``A B E`` (branch 0), ``A C`` (branch 1) and
``D F`` (branch 2); the pending token is the root. Every node's row must equal the last row of its path
evaluated as a plain chain in a fresh one-sequence context, and after keeping a branch the cache must continue
exactly as that chain's.

Tolerance. The fixtures are f32, so llama.cpp's CPU kernels differ between a row computed in a tree batch and
the same row computed alone only in the order of their f32 sums (``tests/test_sequences.py`` measured 0 to
3e-6 on logits up to about 15); a row that saw a sibling's cell, or missed an ancestor's, moves by whole units.
:data:`ATOL` = 1e-4 sits between the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from test_sequences import _micro_batch_counter

from specviz.backends import LlamaContext, LlamaModel
from specviz.backends.binding import llama_lib
from specviz.backends.memory import tree_refusal
from specviz.errors import ContextError, SequenceError
from specviz.testing.memory_models import write_tiny_gemma3_swa, write_tiny_mamba

#: How far a tree row may be from the same row computed as a chain (see the module docstring).
ATOL = 1e-4

ROOT = -1
PROMPT = [1, 10, 11, 12, 13, 14, 15, 16, 17, 18]
PENDING = 20
#: (token, parent) of each node; parents first.
NODES = [(30, ROOT), (31, 0), (32, 0), (40, ROOT), (33, 1), (41, 3)]
#: The leaf paths (node indexes), depth first: branch b is sequence b.
BRANCHES = [[0, 1, 4], [0, 2], [3, 5]]
NEXT = 50

SMALL = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_threads": 1}
TREE = {**SMALL, "n_seq_max": 3, "kv_unified": True}


@dataclass(frozen=True)
class Row:
    """A tree row as a draft tree gives it (fields, not a tuple)."""

    token: int
    position: int
    seqs: tuple[int, ...]


def _path(i: int) -> list[int]:
    out = []
    while i != ROOT:
        out.append(i)
        i = NODES[i][1]
    return out[::-1]


def _layout(n_past: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """The verify batch: the pending token in every branch, then each node at its depth in its branches."""
    rows = [(PENDING, n_past, (0, 1, 2))]
    for i, (token, _) in enumerate(NODES):
        seqs = tuple(b for b, branch in enumerate(BRANCHES) if i in branch)
        rows.append((token, n_past + len(_path(i)), seqs))
    return rows


def _chain(node: int) -> list[int]:
    """The tokens up to and including ``node`` (ROOT: the pending token) as a chain."""
    return PROMPT + [PENDING] + [NODES[j][0] for j in (_path(node) if node != ROOT else [])]


def _last_alone(model, tokens: list[int], **kw) -> np.ndarray:
    with LlamaContext(model, **{**SMALL, **kw}) as one:
        one.eval(tokens, 0, rows="last")
        return one.last_row().copy()


def _tree_context(model, **kw) -> LlamaContext:
    ctx = LlamaContext(model, **{**TREE, **kw})
    ctx.eval_prompt(PROMPT)
    ctx.share_prefix(3)
    return ctx


def _check_tree_rows(model, prompt_in_batch: bool = False, **kw) -> None:
    """``prompt_in_batch``: the prompt is the batch's first rows, in all three sequences, instead of shared."""
    if prompt_in_batch:
        ctx = LlamaContext(model, **{**TREE, **kw})
        rows = [(t, i, (0, 1, 2)) for i, t in enumerate(PROMPT)] + _layout(len(PROMPT))
        first = len(PROMPT)
        got = ctx.eval_tree(rows, keep=range(first, len(rows)))
        assert got.starts == (0, 0, 0)
    else:
        ctx = _tree_context(model, **kw)
        assert [ctx.seq_len(s) for s in (0, 1, 2)] == [len(PROMPT)] * 3
        got = ctx.eval_tree([Row(*r) for r in _layout(len(PROMPT))])
        first = 0
        assert got.starts == (len(PROMPT),) * 3
    assert got.kept == tuple(range(first, first + 1 + len(NODES))) and got.sequences == (0, 1, 2)
    assert got.ends == tuple(len(PROMPT) + 1 + len(b) for b in BRANCHES)
    for node in [ROOT, *range(len(NODES))]:
        row = ctx.row(first + 1 + node).copy()
        want = _last_alone(model, _chain(node), **kw)
        assert np.allclose(row, want, rtol=0, atol=ATOL), (node, float(np.max(np.abs(row - want))))
        assert int(np.argmax(row)) == int(np.argmax(want))
    ctx.close()


@pytest.mark.parametrize(
    "kw",
    [{}, {"prompt_in_batch": True}, {"prompt_in_batch": True, "n_ubatch": 8}],
    ids=["shared-prefix", "prompt-in-batch", "ubatch8"],  # ubatch8: 17 rows in 3 micro-batches
)
def test_every_tree_row_equals_its_path_as_a_chain(tiny_model, kw):
    _check_tree_rows(tiny_model, **kw)


def test_a_sibling_would_be_told_apart(tiny_model):
    """The tolerance is meaningful: node C's row after its sibling B (instead of after A) differs far beyond it."""
    a = _last_alone(tiny_model, _chain(2))
    b = _last_alone(tiny_model, _chain(1) + [NODES[2][0]])
    assert np.max(np.abs(a - b)) > 100 * ATOL


@pytest.fixture(scope="module")
def memory_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("tree_models")
    return {
        "gemma3": write_tiny_gemma3_swa(d / "gemma3.gguf", sliding_window=8),
        "mamba": write_tiny_mamba(d / "mamba.gguf", block_scale=0.02),
    }


def test_a_sliding_window_tree_equals_its_chains(memory_paths):
    """A full-size sliding-window cache (window 8; the tree's positions run past it).

    On this gemma3 fixture llama.cpp's rows depend on the order of the cells in the cache: a plain chain whose
    cells have a gap (left by a cleared sequence) differs from the same chain laid out in order by 9.0e-4 with
    flash attention (5e-7 without), and by 1.8e-3 with flash attention (3.0e-4 without) where the next token
    lands in the gap before a cell of a later position. A kept branch's cells have such gaps (its siblings'
    cells were between them). So the comparisons run with flash attention off, and the one layout with a cell
    before a later position's (branch 0 kept whole: the next token fills the gap before E's cell) is compared
    with a plain chain laid out in the same cells, which it equals to within f32 rounding."""
    m = LlamaModel(memory_paths["gemma3"])
    try:
        _check_tree_rows(m, flash_attn="off")
        for branch, n_keep in ((1, 13), (2, 13), (2, 12)):
            _check_kept_branch(m, branch, n_keep, flash_attn="off").close()
        ctx = _tree_context(m)
        ctx.eval_tree(_layout(len(PROMPT)), keep="none")
        ctx.keep_branch(0, len(PROMPT) + 4)
        ctx.eval([NEXT], len(PROMPT) + 4, rows="last")
        assert np.allclose(ctx.last_row(), _gapped_chain_row(m), rtol=0, atol=ATOL)
        ctx.close()
    finally:
        m.close()


def _gapped_chain_row(model) -> np.ndarray:
    """Branch 0's chain then :data:`NEXT`, in one sequence laid out in the cells a kept branch 0 occupies: the
    prompt, R, A and B in cells 0..12, E in cell 15, NEXT in cell 13 (cells 13 and 14 held by another sequence
    while E is evaluated, then freed)."""
    chain = _chain(BRANCHES[0][-1])
    ctx = LlamaContext(model, **{**SMALL, "n_seq_max": 2, "kv_unified": True})
    ctx.eval(chain[:-1], 0, rows="none")
    ctx.eval_sequences([(1, [7, 8], 0, "none")])
    ctx.eval(chain[-1:], len(chain) - 1, rows="none")
    ctx.clear_sequence(1)
    ctx.eval([NEXT], len(chain), rows="last")
    row = ctx.last_row().copy()
    ctx.close()
    return row


def _check_kept_branch(model, branch: int, n_keep: int, **kw) -> LlamaContext:
    ctx = _tree_context(model, **kw)
    ctx.eval_tree(_layout(len(PROMPT)), keep="none")
    held = len(PROMPT) + 1 + len(BRANCHES[branch])
    cut = ctx.keep_branch(branch, n_keep)
    assert (cut.path, cut.from_pos, cut.to_pos) == ("truncate" if branch == 0 else "branch", held, n_keep)
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [n_keep, 0, 0] and ctx.kv_len() == n_keep
    ctx.eval([NEXT], n_keep, rows="last")
    kept = _chain(BRANCHES[branch][-1])[:n_keep]
    want = _last_alone(model, kept + [NEXT], **kw)
    assert np.allclose(ctx.last_row(), want, rtol=0, atol=ATOL), (branch, n_keep)
    return ctx


@pytest.mark.parametrize(
    ("branch", "extra"),
    [(0, 4), (0, 2), (1, 3), (1, 2), (2, 3), (2, 1), (1, 0)],
)
def test_a_kept_branch_continues_as_its_chain(tiny_model, branch, extra):
    """Keeping branch b's first n positions leaves sequence 0 alone holding them: the next row equals the
    chain's, so no other branch's cell is visible and none of the kept ones is missing."""
    _check_kept_branch(tiny_model, branch, len(PROMPT) + extra).close()


def test_tree_rounds_follow_one_another(tiny_model):
    """A second tree round after a kept branch: shared again, evaluated, its rows equal their chains."""
    ctx = _check_kept_branch(tiny_model, 1, len(PROMPT) + 3)  # holds PROMPT, PENDING, A, C, NEXT
    n_past = ctx.kv_len()
    ctx.share_prefix(3)
    rows = [(PENDING, n_past, (0, 1, 2)), (30, n_past + 1, (0, 1)), (31, n_past + 2, (1,)), (40, n_past + 1, (2,))]
    ctx.eval_tree(rows, keep=[2, 3])
    base = PROMPT + [PENDING, 30, 32, NEXT, PENDING]
    for i, tail in ((2, [30, 31]), (3, [40])):
        assert np.allclose(ctx.row(i), _last_alone(tiny_model, base + tail), rtol=0, atol=ATOL), i
    with pytest.raises(ContextError, match="not requested"):
        ctx.row(1)
    ctx.close()


def test_keep_branch_in_a_split_cache(tiny_model):
    """With a stream per sequence (no shared rows: each branch evaluated as its own sequence) the kept branch's
    stream is copied to sequence 0's."""
    ctx = LlamaContext(tiny_model, **{**SMALL, "n_seq_max": 3})
    for s in range(3):
        ctx.eval_sequence_prompt(s, PROMPT)
    ctx.eval_sequences([(s, _chain(BRANCHES[s][-1])[len(PROMPT) :], len(PROMPT), "none") for s in range(3)])
    cut = ctx.keep_branch(2, len(PROMPT) + 2)
    assert cut.path == "branch" and [ctx.seq_len(s) for s in (0, 1, 2)] == [len(PROMPT) + 2, 0, 0]
    ctx.eval([NEXT], len(PROMPT) + 2, rows="last")
    want = _last_alone(tiny_model, _chain(3) + [NEXT])
    assert np.allclose(ctx.last_row(), want, rtol=0, atol=ATOL)
    ctx.close()


def _bad_trees(n: int):
    ok = _layout(n)
    return [
        ([], "all", "at least one row"),
        ([*ok[:3], (32, n + 2, (3,))], "all", "outside"),
        ([*ok[:3], (32, n + 2, (-1,))], "all", "outside"),
        ([*ok[:3], (32, n + 2, (True,))], "all", "outside"),
        ([*ok[:3], (32, n + 2, (1, 1))], "all", "twice"),
        ([*ok[:3], (32, n + 2, ())], "all", "no sequence"),
        ([ok[0], (30, n + 2, (0, 1))], "all", "position"),  # a gap
        ([(PENDING, n + 1, (0, 1, 2))], "all", "holds 10 positions"),  # not where the cache ends
        ([ok[0], ok[2], ok[1]], "all", "position"),  # a child before its parent
        ([ok[0], (320, n + 1, (0,))], "all", "vocabulary"),
        ([ok[0], (-1, n + 1, (0,))], "all", "vocabulary"),
        ([(7, n + i, (0,)) for i in range(65)], "all", "n_batch=64"),
        (ok, [7], "kept row indexes"),
        (ok, "first", "keep must be"),
        ([ok[0], (30, n + 1)], "all", "must be"),
        ([ok[0], (30, float(n + 1), (0,))], "all", "integers"),
    ]


@pytest.mark.parametrize(("rows", "keep", "says"), _bad_trees(len(PROMPT)))
def test_a_bad_tree_is_refused_and_changes_nothing(tiny_model, rows, keep, says):
    ctx = _tree_context(tiny_model)
    before = ([ctx.seq_len(s) for s in (0, 1, 2)], ctx.eval_count)
    with pytest.raises(SequenceError, match=says):
        ctx.eval_tree(rows, keep)
    assert ([ctx.seq_len(s) for s in (0, 1, 2)], ctx.eval_count) == before
    ctx.close()


def test_sequences_that_hold_different_positions_cannot_share_a_row(tiny_model):
    ctx = _tree_context(tiny_model)
    llama_lib().llama_memory_seq_rm(ctx._mem, 2, 0, 1)  # sequence 2 now holds 1..9: same end, another start
    with pytest.raises(SequenceError, match="share a tree row"):
        ctx.eval_tree(_layout(len(PROMPT)))
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [len(PROMPT)] * 3
    ctx.close()


def test_positions_past_a_sequences_share_are_refused(tiny_model):
    ctx = LlamaContext(tiny_model, **{**TREE, "n_batch": 256, "n_ubatch": 256})
    ctx.eval_prompt(list(range(1, 251)))
    ctx.share_prefix(3)
    with pytest.raises(SequenceError, match="share of the context"):
        ctx.eval_tree([(7, 250 + i, (0,)) for i in range(7)])
    assert ctx.seq_len(0) == 250
    ctx.close()


def test_a_tree_on_a_split_cache_is_refused(tiny_model):
    ctx = LlamaContext(tiny_model, **{**SMALL, "n_seq_max": 3})
    for s in range(3):
        ctx.eval_sequence_prompt(s, PROMPT)
    before = [ctx.seq_len(s) for s in (0, 1, 2)]
    with pytest.raises(SequenceError, match="kv_unified=True"):
        ctx.eval_tree(_layout(len(PROMPT)))
    with pytest.raises(SequenceError, match="kv_unified=True"):
        ctx.share_prefix(2)
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == before
    ctx.share_prefix(1)  # nothing to share
    ctx.eval_tree([(PENDING, len(PROMPT), (1,))])  # rows in one sequence each need no unified cache
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [10, 11, 10]
    ctx.close()


@pytest.mark.parametrize("n", [0, 4, True, 2.0])
def test_share_prefix_refuses_a_bad_count(tiny_model, n):
    ctx = LlamaContext(tiny_model, **TREE)
    ctx.eval_prompt(PROMPT)
    with pytest.raises(SequenceError, match="share_prefix needs"):
        ctx.share_prefix(n)
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [10, 0, 0]
    ctx.close()


def test_keep_branch_refuses_bad_ids_and_lengths(tiny_model):
    ctx = _tree_context(tiny_model)
    ctx.eval_tree(_layout(len(PROMPT)), keep="none")
    before = [ctx.seq_len(s) for s in (0, 1, 2)]
    with pytest.raises(SequenceError, match="outside"):
        ctx.keep_branch(3, 5)
    for n_keep in (-1, True, 2.0):
        with pytest.raises(SequenceError, match="n_keep"):
            ctx.keep_branch(1, n_keep)
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == before
    ctx.close()


def test_a_full_cache_leaves_every_sequence_as_it_was(tiny_model):
    """A tree that passes every check but finds no free cells: llama.cpp refuses it, nothing is left behind."""
    ctx = LlamaContext(tiny_model, **{**TREE, "n_batch": 256, "n_ubatch": 8})
    prompt = [int(t) for t in np.arange(250) % 300 + 1]
    ctx.eval_prompt(prompt)
    ctx.share_prefix(3)
    assert ctx.capacity.n_ctx == 256
    with pytest.raises(ContextError, match="llama_decode failed"):
        ctx.eval_tree(_layout(250))  # 7 rows, 6 free cells
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [250] * 3
    ctx.eval_tree(_layout(250)[:5], keep="last")  # 5 rows fit
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [253, 253, 252]
    ctx.close()


def test_memory_that_cannot_hold_a_tree_is_refused_naming_trees(memory_paths):
    assert tree_refusal("attention") is None and tree_refusal("sliding-window") is None
    assert "--tree-width 1" in tree_refusal("recurrent") and "--swa-ring" in tree_refusal("ring")
    m = LlamaModel(memory_paths["mamba"])
    try:
        with LlamaContext(m, **SMALL) as one:
            one.eval([1, 2, 3], 0)
            with pytest.raises(SequenceError, match="draft tree") as err:
                one.keep_branch(0, 1)
            assert err.value.kind == "recurrent" and one.seq_len(0) == 3
    finally:
        m.close()


def test_a_sequence_batch_after_a_tree_batch_has_one_id_per_row(tiny_model):
    """The batch a tree filled with several ids per row serves a plain multi-sequence batch next."""
    ctx = _tree_context(tiny_model)
    ctx.eval_tree(_layout(len(PROMPT)), keep="none")
    ctx.keep_branch(0, len(PROMPT) + 1)
    ctx.eval_sequence_prompt(1, PROMPT[:4])
    got = ctx.eval_sequences([(0, [NEXT, 51], len(PROMPT) + 1), (1, [52], 4)])
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [len(PROMPT) + 3, 5, 0]
    want0 = _last_alone(tiny_model, PROMPT + [PENDING, NEXT, 51])
    want1 = _last_alone(tiny_model, PROMPT[:4] + [52])
    assert np.allclose(ctx.row(got.index(0, 1)), want0, rtol=0, atol=ATOL)
    assert np.allclose(ctx.row(got.index(1, 0)), want1, rtol=0, atol=ATOL)
    ctx.close()


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_a_tree_is_one_graph_in_a_unified_cache(tiny_model, memory_paths, name):
    """llama.cpp takes a unified cache's tree batch whole (its simple split; with a sliding window too), so a
    tree's verify costs one graph, as a chain's of as many rows."""
    count, seen = _micro_batch_counter()
    m = tiny_model if name == "llama" else LlamaModel(memory_paths["gemma3"])
    ctx = LlamaContext(m, **{**TREE, "capture": False}, eval_callback=count)
    ctx.eval_prompt(PROMPT)
    ctx.share_prefix(3)
    seen[0] = 0
    ctx.eval_tree(_layout(len(PROMPT)))
    assert seen[0] == 1
    ctx.close()
    if m is not tiny_model:
        m.close()
