"""Several sequences in one target context and one decode (specviz.backends.sequences, LlamaContext's
``n_seq_max``), on tiny real llama.cpp models.

Tolerance. The fixtures are f32 (``add_file_type(0)``), so llama.cpp's CPU kernels differ between a row
computed in a batch of several sequences and the same row computed alone only in the order of their f32 sums:
measured here 0 to 3e-6 on logits up to about 15. The same tokens after another sequence's prompt differ by
about 4. :data:`ATOL` = 1e-4 sits between the two, far from both. (With quantized weights, as the embedded
model's, llama.cpp's CPU kernels are not batch-invariant: rows move by tenths; these tests never use one.)
"""

from __future__ import annotations

import numpy as np
import pytest

from specviz.backends import LlamaContext, LlamaModel
from specviz.backends.sequences import SequenceTokens
from specviz.errors import ContextError, SequenceError
from specviz.testing.memory_models import write_tiny_gemma3_swa, write_tiny_lfm2, write_tiny_mamba

#: How far a sequence's row from a multi-sequence decode may be from the same row computed alone (see the
#: module docstring).
ATOL = 1e-4

#: Three sequences' prompts of different lengths, so each continues at its own position.
PROMPTS = {0: [1, 10, 11, 12, 13, 14, 15, 16, 17, 18], 1: [1, 40, 41, 42], 2: [1, 70, 71, 72, 73, 74, 75]}
#: What each sequence adds in the shared batch (different lengths: a pending token and a draft each).
STEPS = {0: [20, 21, 22, 23, 24], 1: [50, 51], 2: [80, 81, 82, 83, 84, 85, 86, 87, 88]}

SMALL = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "n_threads": 1}


@pytest.fixture(scope="module")
def memory_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("seq_models")
    return {
        "gemma3": write_tiny_gemma3_swa(d / "gemma3.gguf", sliding_window=8),
        "mamba": write_tiny_mamba(d / "mamba.gguf", block_scale=0.02),
        "lfm2": write_tiny_lfm2(d / "lfm2.gguf", block_scale=0.25),
    }


def _alone(model, tokens: list[int], **kw) -> np.ndarray:
    """Every row of ``tokens`` evaluated from position 0 in a one-sequence context."""
    with LlamaContext(model, **{**SMALL, **kw}) as one:
        one.eval(tokens, 0, rows="all")
        return np.stack([one.row(i).copy() for i in range(len(tokens))])


def _prefilled(model, **kw) -> LlamaContext:
    ctx = LlamaContext(model, **{**SMALL, "n_seq_max": 3, **kw})
    for seq, prompt in PROMPTS.items():
        ctx.eval_sequence_prompt(seq, prompt)
    return ctx


def _check_rows_equal_alone(model, **kw) -> None:
    ctx = _prefilled(model, **kw)
    batch = ctx.eval_sequences([SequenceTokens(s, STEPS[s], len(PROMPTS[s])) for s in (0, 1, 2)])
    assert batch.sequences == (0, 1, 2) and batch.n_tokens == batch.n_rows == sum(map(len, STEPS.values()))
    for seq in (0, 1, 2):
        got = np.stack([ctx.sequence_row(seq, i).copy() for i in range(len(STEPS[seq]))])
        want = _alone(model, PROMPTS[seq] + STEPS[seq], **kw)[len(PROMPTS[seq]) :]
        assert np.allclose(got, want, rtol=0, atol=ATOL), (seq, float(np.max(np.abs(got - want))))
        assert ctx.seq_len(seq) == len(PROMPTS[seq]) + len(STEPS[seq])
    ctx.close()


@pytest.mark.parametrize(
    "kw",
    [
        {},  # llama-server's -np N: n_ctx split over the sequences, one stream each
        {"kv_unified": True},  # -kvu: one cache the sequences share
        {"n_ubatch": 8, "n_batch": 64},  # micro-batches of 8: llama.cpp splits the batch across sequences
    ],
    ids=["split", "unified", "ubatch8"],
)
def test_one_decode_of_several_sequences_gives_each_its_rows_alone(tiny_model, kw):
    _check_rows_equal_alone(tiny_model, **kw)


def test_rows_of_another_sequence_would_be_told_apart(tiny_model):
    """The tolerance is meaningful: the same tokens after another sequence's prompt differ far beyond it."""
    a = _alone(tiny_model, PROMPTS[0] + STEPS[0])[-1]
    b = _alone(tiny_model, PROMPTS[2] + STEPS[0])[-1]
    assert np.max(np.abs(a - b)) > 100 * ATOL


def test_sliding_window_full_cache_holds_several_sequences(memory_paths):
    """A full-size sliding-window cache (window 8; positions run past it) gives each sequence its own rows."""
    m = LlamaModel(memory_paths["gemma3"])
    try:
        _check_rows_equal_alone(m)
    finally:
        m.close()


def test_rows_asked_per_sequence_land_where_the_batch_says(tiny_model):
    ctx = _prefilled(tiny_model)
    parts = [(2, STEPS[2], len(PROMPTS[2]), [0, 4]), (0, STEPS[0], len(PROMPTS[0]), "last"), (1, STEPS[1], 4, "none")]
    batch = ctx.eval_sequences(parts)
    assert batch.sequences == (0, 1, 2)  # laid out in ascending order, as llama-server's slots
    assert [batch.index(2, 0), batch.index(2, 4), batch.index(0, 4)] == [7, 11, 4]
    assert batch.span(1).kept == () and batch.span(1).end == 6
    assert batch.span(2).batch_rows() == [7, 11]
    want = _alone(tiny_model, PROMPTS[2] + STEPS[2])[len(PROMPTS[2]) + 4]
    assert np.allclose(ctx.sequence_row(2, 4), want, rtol=0, atol=ATOL)
    with pytest.raises(SequenceError, match="kept no logits"):
        ctx.sequence_row(2, 1)
    with pytest.raises(SequenceError, match="not in this batch"):
        batch.span(7)
    ctx.eval([5], ctx.seq_len(0))  # a one-sequence decode: the batch's rows are gone
    with pytest.raises(ContextError, match="no multi-sequence batch"):
        ctx.sequence_row(2, 4)
    ctx.close()


def test_cutting_one_sequence_leaves_the_others_next_rows_unchanged(tiny_model):
    ctx = _prefilled(tiny_model)
    ctx.eval_sequences([(s, STEPS[s], len(PROMPTS[s]), "none") for s in (0, 1, 2)])
    cut = ctx.cut_sequence(1, len(PROMPTS[1]) + 1)  # sequence 1 keeps one of its two new tokens
    assert (cut.path, cut.from_pos, cut.to_pos) == ("truncate", 6, 5)
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [15, 5, 16]
    assert ctx.cut_sequence(1, 9).path == "none"  # nothing past its end
    nxt = {0: [30], 1: [60, 61], 2: [90]}
    ctx.eval_sequences([(s, nxt[s], ctx.seq_len(s)) for s in (0, 1, 2)])
    for seq, kept in ((0, STEPS[0]), (1, STEPS[1][:1]), (2, STEPS[2])):
        full = PROMPTS[seq] + kept + nxt[seq]
        want = _alone(tiny_model, full)[-len(nxt[seq]) :]
        got = np.stack([ctx.sequence_row(seq, i).copy() for i in range(len(nxt[seq]))])
        assert np.allclose(got, want, rtol=0, atol=ATOL), seq
    ctx.clear_sequence(2)
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [16, 7, 0]
    ctx.close()


def test_a_one_sequence_context_is_as_before(tiny_model):
    ctx = LlamaContext(tiny_model, **SMALL)
    assert (ctx.n_seq_max, ctx.n_ctx_seq, ctx.kv_unified) == (1, ctx.capacity.n_ctx, False)
    ctx.eval([1, 2, 3], 0)
    assert ctx.seq_len(0) == ctx.kv_len() == 3
    ctx.close()


def test_the_context_is_split_over_the_sequences_as_llama_server_splits_it(tiny_model):
    # llama.cpp: n_ctx_seq = n_ctx / n_seq_max rounded up to 256, the cache n_ctx_seq × n_seq_max
    ctx = LlamaContext(tiny_model, **{**SMALL, "n_ctx": 1024, "n_seq_max": 3})
    assert (ctx.n_ctx_seq, ctx.capacity.n_ctx) == (512, 1536)
    ctx.close()
    ctx = LlamaContext(tiny_model, **{**SMALL, "n_ctx": 1024, "n_seq_max": 3, "kv_unified": True})
    assert (ctx.n_ctx_seq, ctx.capacity.n_ctx) == (1024, 1024)
    ctx.close()


@pytest.mark.parametrize(
    ("name", "kw", "kind"),
    [("mamba", {}, "recurrent"), ("lfm2", {}, "hybrid"), ("gemma3", {"swa_full": False}, "ring")],
)
def test_memory_that_cannot_cut_one_sequence_is_refused_at_open(memory_paths, name, kw, kind):
    m = LlamaModel(memory_paths[name])
    try:
        with pytest.raises(SequenceError, match=kind) as err:
            LlamaContext(m, **{**SMALL, "n_seq_max": 2, **kw})
        assert err.value.kind == kind
        assert ("swa_full=True" if kind == "ring" else "n_seq_max=1") in str(err.value)
        with LlamaContext(m, **{**SMALL, **kw}) as one:  # one sequence still opens; its cut is memory.cut's
            one.eval([1, 2, 3], 0)
            with pytest.raises(SequenceError, match="cannot be cut alone"):
                one.cut_sequence(0, 1)
            assert one.seq_len(0) == 3
    finally:
        m.close()


@pytest.mark.parametrize("n", [0, -1, 257, True, 2.0])
def test_a_bad_sequence_count_is_refused(tiny_model, n):
    with pytest.raises(SequenceError, match="n_seq_max"):
        LlamaContext(tiny_model, **{**SMALL, "n_seq_max": n})


def _bad_batches():
    ok0, ok1 = (0, [5, 6], 10), (1, [7], 4)
    return [
        ([], "at least one sequence"),
        ([ok0, ok1, (2, [8], 7), (0, [9], 12)], "opened for 3"),
        ([ok0, (3, [8], 0)], "outside"),
        ([ok0, (-1, [8], 0)], "outside"),
        ([ok0, (0, [8], 12)], "twice"),
        ([ok0, (1, [], 4)], "no tokens"),
        ([ok0, (1, [7], 2)], "holds 4 positions"),
        ([ok0, (1, [7] * 253, 4)], "share of the context"),
        ([ok0, (1, [7] * 63, 4)], "n_batch=64"),
        ([ok0, (1, [7], 4, [1])], "row indices"),
        ([ok0, (1, [7], 4, "first")], "rows must be"),
    ]


@pytest.mark.parametrize(("parts", "says"), _bad_batches())
def test_a_bad_batch_is_refused_and_changes_nothing(tiny_model, parts, says):
    ctx = _prefilled(tiny_model)
    before = ([ctx.seq_len(s) for s in (0, 1, 2)], ctx.eval_count)
    with pytest.raises(SequenceError, match=says):
        ctx.eval_sequences(parts)
    assert ([ctx.seq_len(s) for s in (0, 1, 2)], ctx.eval_count) == before
    ctx.close()


def test_bad_sequence_ids_and_cuts_are_refused(tiny_model):
    ctx = _prefilled(tiny_model)
    for call in (lambda: ctx.seq_len(3), lambda: ctx.cut_sequence(5, 0), lambda: ctx.clear_sequence(-1)):
        with pytest.raises(SequenceError, match="outside"):
            call()
    with pytest.raises(SequenceError, match="n_keep"):
        ctx.cut_sequence(0, -2)
    assert [ctx.seq_len(s) for s in (0, 1, 2)] == [10, 4, 7]
    ctx.close()


def _micro_batch_counter():
    """An eval callback counting llama.cpp's graph computations (each computes ``result_norm`` once), and
    the count."""
    import ctypes
    from pathlib import Path

    import llama_cpp
    import llama_cpp.llama_cpp as lc

    lib = sorted((Path(llama_cpp.__file__).parent / "lib").glob("libggml-base.so*"))
    if not lib:
        pytest.skip("libggml-base is not a shared library here")
    name = ctypes.CDLL(str(lib[0])).ggml_get_name
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    seen = [0]

    @lc.ggml_backend_sched_eval_callback
    def count(t, ask, user_data):  # noqa: ARG001 - signature fixed by ggml
        if ask and name(t) == b"result_norm":
            seen[0] += 1
        return not ask

    return count, seen


@pytest.mark.parametrize(
    ("kv_unified", "rows", "graphs"),
    [
        (False, (5, 5, 5, 5), 1),
        (False, (1, 1, 1, 17), 2),  # unequal drafts: 1 token of each, then sequence 3's other 16
        (False, (5, 0, 5, 5), 2),  # an idle sequence between busy ones
        (True, (1, 1, 1, 17), 1),
        (True, (5, 0, 5, 5), 1),
    ],
)
def test_how_llama_cpp_splits_a_batch_of_sequences_into_micro_batches(tiny_model, kv_unified, rows, graphs):
    """With a cache split over the sequences (llama-server's -np without -kvu) llama.cpp computes in one graph
    an equal number of tokens of each of a run of consecutive ascending sequence ids; a unified cache takes
    the batch whole. Given in descending order, the batch is laid out ascending and costs no more."""
    count, seen = _micro_batch_counter()
    kw = {**SMALL, "n_ctx": 1024, "n_seq_max": 4, "kv_unified": kv_unified, "capture": False}
    ctx = LlamaContext(tiny_model, **kw, eval_callback=count)
    for q in range(4):
        ctx.eval_sequence_prompt(q, [1, 5, 6, 7])
    seen[0] = 0
    ctx.eval_sequences([(q, [9] * rows[q], 4) for q in reversed(range(4)) if rows[q]])
    assert seen[0] == graphs
    ctx.close()
