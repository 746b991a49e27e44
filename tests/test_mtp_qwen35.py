"""MTP on a Qwen3.5-style model: one integrated NextN layer after a hybrid trunk, written by the tests.

The NextN layer, its checks, its MTP context and speculative rounds on the hybrid target run here: the
target's recurrent layers are rolled back after a rejected draft by its memory
(:mod:`specviz.backends.memory`: llama.cpp's recurrent-state snapshots, or a partial-state checkpoint
restored with the accepted tokens re-applied), and the MTP context keeps a plain attention cache.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from specviz import Session
from specviz.backends import LlamaContext, LlamaModel
from specviz.backends.gguf_check import check_gguf
from specviz.backends.mtp import MTP_GRAPH_ARCHS, NextNContext, TargetNextNTap, mtp_pair_problems, mtp_problems
from specviz.testing.tiny_qwen35 import write_tiny_qwen35

A, B = 300, 301


@pytest.fixture(scope="module")
def qwen35_path(tmp_path_factory):
    return write_tiny_qwen35(tmp_path_factory.mktemp("q35") / "q35.gguf", seed=1, block_scale=0.05, binary=(A, B))


@pytest.fixture(scope="module")
def qwen35(qwen35_path):
    m = LlamaModel(qwen35_path)
    yield m
    m.close()


def test_the_tiny_qwen35_model_is_written_quickly_and_loads_with_its_nextn_layer(tmp_path, qwen35):
    t0 = time.perf_counter()
    p = write_tiny_qwen35(tmp_path / "m.gguf")
    assert time.perf_counter() - t0 < 1.0
    assert (qwen35.info.architecture, qwen35.n_layer, qwen35.n_layer_nextn) == ("qwen35", 4, 1)
    assert mtp_problems(qwen35.info) == []
    assert mtp_problems(check_gguf(p)) == []
    # a hybrid trunk: gated delta-net layers between the full-attention ones
    assert "blk.0.ssm_conv1d.weight" in qwen35.info.tensors and "blk.1.attn_q.weight" in qwen35.info.tensors


def test_the_nextn_layer_drafts_in_its_mtp_context_from_the_targets_hidden_states(qwen35):
    tc = LlamaContext(qwen35, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    mc = NextNContext(qwen35, tc, n_threads=1)
    tap = TargetNextNTap(tc)
    try:
        toks = [1, 50, 60, 70, A, B]
        tc.eval(toks, 0, rows="last")
        h = tap.rows(len(toks))
        assert h.shape == (6, 64) and np.isfinite(h).all()
        # the pairs (t_p, h_{p-1}); position 0 pairs the first token with a zero state, as llama.cpp does
        rows = np.vstack([np.zeros((1, 64), np.float32), h[:-1]])
        mc.decode(toks, rows, 0, outputs=[5])
        assert mc.kv_len() == 6  # a plain attention cache: llama.cpp gives the hybrid's MTP context one
        row = mc.logits(5)
        assert np.isfinite(row).all() and int(np.argmax(row)) in (A, B)  # the shared head says only A or B
        assert mc.prenorm(5).shape == (64,)
        mc.truncate(3)  # the MTP context rolls back, whatever the target's memory
        assert mc.kv_len() == 3
    finally:
        tap.close()
        mc.close()
        tc.close()


def test_mtp_on_the_hybrid_target_is_accepted_at_configure_and_start(qwen35_path):
    # the target's memory rolls its recurrent layers back (specviz.backends.memory), so mtp is not refused
    s = Session(qwen35_path, n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1)
    try:
        s.start([1, 50, 60], 10, "none")
        s.run(max_rounds=2)
        s.configure("mtp", draft_p_min=0.0)
        s.run()
        assert s.finished == "max_tokens" and len(s.tokens) == 10
        s.start([1, 50, 60], 10, "draft-mtp", draft_p_min=0.0)
        s.run()
        assert s.finished == "max_tokens" and s.telemetry_dict()["drafted"] > 0
    finally:
        s.close()


def test_nextn_width_and_vocabulary_are_checked_against_the_target(tmp_path, qwen35):
    wide = LlamaModel(write_tiny_qwen35(tmp_path / "wide.gguf", n_embd=96, n_head=4, n_head_kv=2))
    small = LlamaModel(write_tiny_qwen35(tmp_path / "small.gguf", vocab_size=300))
    try:
        assert any("96-wide" in w for w in mtp_pair_problems(wide, qwen35))
        assert any("covers 300 tokens" in w for w in mtp_pair_problems(small, qwen35))
    finally:
        wide.close()
        small.close()


def test_every_other_nextn_architecture_is_refused_with_its_reason(tmp_path):
    from specviz.testing.tiny_models import write_tiny_llama

    info = check_gguf(write_tiny_llama(tmp_path / "l.gguf"))
    for arch, why in (*MTP_GRAPH_ARCHS.items(), ("glm4", "without building an MTP graph")):
        meta = dict(info.metadata, **{f"{arch}.nextn_predict_layers": 1})
        fake = type(info)(info.version, info.n_tensors, info.n_kv, arch, info.data_offset, info.data_bytes, meta, {})
        (reason,) = mtp_problems(fake)
        assert why in reason and "glm4moe, qwen35" in reason, (arch, reason)


# -- rounds on the hybrid target: its recurrent layers are rolled back by the memory after a rejection --------


def test_greedy_with_qwen35_mtp_equals_plain_greedy_and_keeps_both_caches_right(qwen35_path):
    from test_session import plain_reference

    s = Session(qwen35_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(s.model, prompt, 60)
    s.start(prompt, 60, "mtp", draft_p_min=0.0, draft_max=4)
    while s.finished is None:
        s.step()
        assert s.kv_length == s.committed and s.drafter.kv_length() == len(s.history) - 1
    assert s.tokens == ref
    t = s.telemetry_dict()
    assert 0 < t["accepted"] < t["drafted"] and t["catch_up_tokens"] == 0
    s.close()


@pytest.mark.parametrize(("n_rs_seq", "path"), [(16, "partial"), (0, "checkpoint")])
def test_qwen35_mtp_rolls_the_hybrid_target_back_through_its_memory(qwen35_path, n_rs_seq, path):
    # n_rs_seq 16: llama.cpp's recurrent-state snapshots take a rejected tail back (the verify batch's
    # states stay, no catch-up); 0: a partial-state checkpoint before each verify, restored after a
    # rejection with the accepted tokens re-applied, so the drafter re-reads the states it needs
    from test_session import plain_reference

    s = Session(qwen35_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_rs_seq=n_rs_seq)
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(s.model, prompt, 40)
    s.start(prompt, 40, "mtp", draft_p_min=0.0, draft_max=4)
    while s.finished is None:
        s.step()
        assert s.kv_length == s.committed and s.drafter.kv_length() == len(s.history) - 1
    assert s.tokens == ref
    t = s.telemetry_dict()
    assert t["rollback_paths"].get(path, 0) > 0 and set(t["rollback_paths"]) <= {path, "none"}, t["rollback_paths"]
    assert 0 < t["accepted"] < t["drafted"]
    assert (t["catch_up_tokens"] == 0) == (path == "partial")
    s.close()


def test_mtp_switched_in_mid_generation_on_the_hybrid_target_catches_up_exactly(qwen35_path):
    from test_session import plain_reference

    s = Session(qwen35_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(s.model, prompt, 40)
    s.start(prompt, 40, "none")
    s.run(max_rounds=6)
    s.configure("mtp", draft_p_min=0.0, draft_max=3)
    s.run()
    assert s.tokens == ref and s.drafter.kv_length() == len(s.history) - 1
    t = s.telemetry_dict()
    assert t["catch_up_tokens"] > 0 and t["drafted"] > 0
    s.close()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_qwen35_mtp_snapshot_and_rewind_restore_both_contexts(qwen35_path, temperature):
    s = Session(qwen35_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start([1, 50, 60], 50, "mtp", temperature=temperature, seed=5, draft_p_min=0.0, draft_max=3)
    s.run(max_rounds=5)
    blob = s.snapshot()
    s.run()
    original = list(s.tokens)
    r = Session.restore(blob, model=s.model, n_threads=1)
    assert r.drafter.kv_length() == len(r.history) - 1
    r.run()
    assert r.tokens == original
    r.close()
    s.rewind(2)
    s.run()
    assert s.tokens == original
    s.close()


@pytest.mark.tools
def test_qwen35_mtp_equals_llama_speculative_simple(qwen35_path, qwen35):
    from native_util import native_tool
    from test_differential_drafters import N_CTX, N_PREDICT, PROMPT, run_like_the_tool

    from specviz.analysis.native import run_tool

    knobs = {"draft_p_min": 0.0, "draft_max": 3}
    report = run_tool(
        native_tool("llama-speculative-simple"),
        qwen35_path,
        PROMPT,
        "mtp",
        knobs,
        n_predict=N_PREDICT,
        threads=1,
        n_ctx=N_CTX,
    )
    s = run_like_the_tool(qwen35, PROMPT, "mtp", knobs, N_PREDICT)
    t = s.telemetry_dict()
    s.close()
    assert (len(s.tokens), t["drafted"], t["accepted"]) == (report.n_predict, report.n_drafted, report.n_accept)
    assert report.n_drafted > report.n_accept > 0
