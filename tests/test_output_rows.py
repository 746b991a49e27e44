"""A batch that keeps no logits, on a model placed on a GPU, still computes its last row (issue 26).

On llama.cpp's Vulkan backend a context that has decoded a batch with no output rows crashes at a later
multi-token batch (``tests/test_vulkan.py`` reproduces it on lavapipe); llama.cpp's own tools never decode
such a batch. So wherever a model has layers on a GPU device
(:func:`specviz.backends.context_base.keeps_an_output_row`), a target or draft context's batch without rows
(``rows="none"``), a tied head's feed without outputs, a DFlash draft's feature injection (each micro-batch)
and DFlash-2's block (whose lattice covers every row without outputs) and the memory probe's evaluations
each keep their last row, which nothing reports. On the CPU nothing changes.

Here, on the CPU build, a GPU is stood in for: ``gpu_devices`` lists one and the models are loaded with
``n_gpu_layers`` above 0 (the CPU build keeps every layer on the CPU). Whether llama.cpp computed a row is
read from llama.cpp itself (``llama_get_logits_ith`` is NULL for a row it did not compute).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_session import plain_reference

from specviz import Session
from specviz.backends import LlamaContext, LlamaModel, devices
from specviz.backends.binding import llama_lib
from specviz.backends.context_base import keeps_an_output_row
from specviz.backends.dflash import DFlashContext, read_dflash_head
from specviz.backends.eagle3 import Eagle3Context
from specviz.backends.memory import probe_memory
from specviz.errors import ContextError
from specviz.testing.tiny_dflash import write_tiny_dflash

GPU = devices.Device("Vulkan0", "a stand-in GPU", "Vulkan", "gpu", 1 << 30, 1 << 30)


@pytest.fixture()
def a_gpu(monkeypatch):
    """This build "has a GPU device"."""
    monkeypatch.setattr(devices, "gpu_devices", lambda: [GPU])


def _computed(ctx, i: int) -> bool:
    """Whether llama.cpp computed logits for row ``i`` of the context's last batch."""
    return bool(llama_lib().llama_get_logits_ith(ctx.ptr, i))


def _context(path, ngl: int):
    m = LlamaModel(path, n_gpu_layers=ngl)
    return m, LlamaContext(m, n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1)


@pytest.mark.parametrize("rows", ["none", []])
def test_a_batch_without_rows_computes_its_last_one_on_a_gpu_placement(a_gpu, e3_target_path, rows):
    m, ctx = _context(e3_target_path, 99)
    try:
        assert keeps_an_output_row(m)
        ctx.eval(list(range(1, 10)), 0, rows=rows)
        assert _computed(ctx, 8) and not _computed(ctx, 7)
        with pytest.raises(ContextError, match="kept no logits"):
            ctx.last_row()  # computed for llama.cpp's sake, reported to nobody
        ctx.eval(list(range(50, 66)), 9, rows="all")  # the next batch reads as before
        got = np.stack([ctx.row(i).copy() for i in range(16)])
    finally:
        ctx.close()
        m.close()
    m, ref = _context(e3_target_path, 0)
    try:
        ref.eval(list(range(1, 10)), 0, rows="none")
        assert not _computed(ref, 8)  # on the CPU placement such a batch stays as it is
        ref.eval(list(range(50, 66)), 9, rows="all")
        np.testing.assert_array_equal(got, np.stack([ref.row(i) for i in range(16)]))
    finally:
        ref.close()
        m.close()


def test_without_a_gpu_device_a_batch_without_rows_computes_none(e3_target_path):
    m, ctx = _context(e3_target_path, 99)  # layers asked for a GPU that this CPU build does not have
    try:
        assert not keeps_an_output_row(m)
        ctx.eval(list(range(1, 10)), 0, rows="none")
        assert not _computed(ctx, 8)
    finally:
        ctx.close()
        m.close()


def test_a_heads_feed_without_outputs_computes_its_last_row_on_a_gpu_placement(a_gpu, e3_target_path, e3_head_path):
    m, ctx = _context(e3_target_path, 99)
    head = LlamaModel(e3_head_path, n_gpu_layers=99)
    dctx = Eagle3Context(head, ctx, n_threads=1)
    try:
        g = np.zeros((4, dctx.n_embd), dtype=np.float32)
        dctx.decode([1, 40, 41, 42], g, 0)
        assert _computed(dctx, 3) and not _computed(dctx, 2)
        dctx.decode([43], g[:1], 4, outputs=[0])  # a draft step reads its one row as before
        assert _computed(dctx, 0) and dctx.logits(0).shape == (m.n_vocab,)
    finally:
        dctx.close()
        head.close()
        ctx.close()
        m.close()


def test_the_memory_probe_keeps_its_row_when_asked_and_measures_the_same(e3_target_path):
    m, ctx = _context(e3_target_path, 0)
    try:
        facts = []
        for keep in (False, True):
            facts.append(probe_memory(m, ctx.ptr, n_ctx=256, n_ubatch=32, swa_full=True, keep_row=keep))
            assert _computed(ctx, 0) is keep  # the probe's last one-token batch
            assert ctx.kv_len() == 0  # the probe leaves the cache empty either way
        assert facts[0] == facts[1] and facts[0].removal != "no"
    finally:
        ctx.close()
        m.close()


def test_a_context_on_a_gpu_placement_probes_with_its_row_kept(a_gpu, e3_target_path, monkeypatch):
    from specviz.backends import llama

    asked: list[bool] = []

    def spy(*args, **kwargs):
        asked.append(kwargs["keep_row"])
        return probe_memory(*args, **kwargs)

    monkeypatch.setattr(llama, "probe_memory", spy)
    for ngl in (99, 0):
        m, ctx = _context(e3_target_path, ngl)
        ctx.close()
        m.close()
    assert asked == [True, False]


@pytest.fixture(scope="module")
def dflash_heads(e3_target_path, tmp_path_factory):
    """A random DFlash draft and a random DFlash-2 draft for the EAGLE-3 pair's 4-layer target."""
    d = tmp_path_factory.mktemp("dflash-rows")
    return {
        "dflash": write_tiny_dflash(d / "dflash.gguf", seed=3, target_layers=(1, 3), block_size=6),
        "dflash2": write_tiny_dflash(d / "dflash2.gguf", seed=4, target_layers=(1, 2), block_size=6, selector_top_k=4),
    }


def _dflash_pass(target_path, head_path, ngl: int):
    """Features of 12 target rows injected through 8-row micro-batches, then one block of 6: which rows each
    micro-batch and the block computed, and what the block gave (DFlash's logits, DFlash-2's lattice)."""
    m = LlamaModel(target_path, n_gpu_layers=ngl)
    dm = LlamaModel(head_path, n_gpu_layers=ngl)
    head = read_dflash_head(head_path)
    ctx = LlamaContext(m, n_ctx=256, n_batch=32, n_ubatch=8, n_threads=1)
    dc = DFlashContext(dm, ctx, head, n_threads=1)
    try:
        feats = np.random.default_rng(0).standard_normal((12, dc.n_features)).astype(np.float32)
        dc.inject(feats[:8], 0)  # one micro-batch of 8
        first = [_computed(dc, i) for i in range(8)]
        dc.inject(feats, 8)  # 8 then 4: the last micro-batch's rows are the ones left
        second = [_computed(dc, i) for i in range(4)]
        dc.decode_block(40, 6, 20)
        block = [_computed(dc, i) for i in range(6)]
        if head.kind == "dflash2":
            got = tuple(a.copy() for a in dc.lattice())
        else:
            got = (np.stack([dc.logits(i).copy() for i in range(6)]),)
        return first, second, block, got
    finally:
        dc.close()
        dm.close()
        ctx.close()
        m.close()


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_dflash_injection_and_block_keep_a_row_on_a_gpu_placement(a_gpu, e3_target_path, dflash_heads, kind):
    first, second, block, got = _dflash_pass(e3_target_path, dflash_heads[kind], 99)
    assert first == [False] * 7 + [True]  # each micro-batch of the injection keeps its last row
    assert second == [False] * 3 + [True]
    # DFlash's block has every row an output; DFlash-2's has none of its own, so its last is kept
    assert block == ([True] * 6 if kind == "dflash" else [False] * 5 + [True])


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_dflash_pass_reads_the_same_with_the_row_kept(e3_target_path, dflash_heads, kind, monkeypatch):
    first, second, block, cpu = _dflash_pass(e3_target_path, dflash_heads[kind], 0)
    assert not any(first + second)  # on the CPU placement the injection computes no rows
    assert any(block) is (kind == "dflash")  # nor DFlash-2's block
    monkeypatch.setattr(devices, "gpu_devices", lambda: [GPU])
    _, _, _, kept = _dflash_pass(e3_target_path, dflash_heads[kind], 99)
    assert len(kept) == len(cpu)
    for a, b in zip(kept, cpu):
        np.testing.assert_array_equal(a, b)  # the kept row changes nothing the draft reads


@pytest.mark.parametrize("strategy", ["prompt-lookup", "eagle3", "dflash", "dflash2"])
def test_greedy_output_on_a_gpu_placement_equals_plain_greedy(
    a_gpu, e3_target_path, e3_head_path, dflash_heads, strategy
):
    m = LlamaModel(e3_target_path, n_gpu_layers=99)
    try:
        ref = plain_reference(m, [1, 40, 41, 42, 43, 40, 41, 42], 30)
        head = {"eagle3": e3_head_path, **dflash_heads}.get(strategy)
        knobs = {"draft_model": str(head), "draft_p_min": 0.0} if head is not None else {}
        s = Session(m, n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1)
        s.start([1, 40, 41, 42, 43, 40, 41, 42], 30, "dflash" if strategy == "dflash2" else strategy, **knobs)
        s.run()
        assert s.tokens == ref
        s.close()
    finally:
        m.close()
