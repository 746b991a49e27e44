"""The ``dflash`` and ``dspark`` strategies (DFlash, DFlash-2, DSpark drafts) on tiny real llama.cpp models.

The drafts are random (a random draft drafts nonsense, losslessly). For rounds that accept part of a block
the "binary" pair is used: a target whose output head can only say A or B (alternating, by construction)
and a draft whose own output head can only say A or B, so each block position guesses and some blocks are
partly accepted.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from stat_helpers import chi2_critical
from test_session import plain_reference

from specviz import Session
from specviz.backends import LlamaContext, LlamaModel
from specviz.backends.capture import LayerCapture
from specviz.backends.dflash import DFlashContext, dflash_problems, read_dflash_head
from specviz.backends.gguf_check import check_gguf
from specviz.backends.llama_ext import target_layer_ids
from specviz.decoding.events import event_from_dict
from specviz.decoding.sampling import SamplingParams, probs_from_logits
from specviz.errors import KnobError, SnapshotError, StrategyUnavailableError
from specviz.testing.tiny_dflash import write_tiny_dflash
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

A, B = 300, 301


@pytest.fixture(scope="module")
def target_path(tmp_path_factory):
    """A tiny llama target with 4 layers."""
    return write_tiny_llama(tmp_path_factory.mktemp("dflash") / "target.gguf", seed=2, n_layer=4, block_scale=0.1)


@pytest.fixture(scope="module")
def heads(target_path):
    """Random DFlash, DSpark (with and without its confidence head) and DFlash-2 drafts for the target."""
    d = target_path.parent
    return {
        "dflash": write_tiny_dflash(d / "dflash.gguf", seed=1, target_layers=(1, 3)),
        "dspark": write_tiny_dflash(d / "dspark.gguf", seed=2, target_layers=(0, 2), dspark=True),
        "dspark-noconf": write_tiny_dflash(d / "dspark0.gguf", seed=3, dspark=True, confidence_head=False),
        "dflash2": write_tiny_dflash(d / "dflash2.gguf", seed=4, target_layers=(1, 2), selector_top_k=4),
    }


def binary_weights():
    w = tiny_weights(seed=3, n_layer=4, block_scale=0.05)
    e = w["token_embd.weight"]
    u = (e[B] - e[A]).astype(np.float32)  # after A the target says B, after B it says A
    out = np.zeros_like(w["output.weight"])
    out[A], out[B] = u, -u
    w["output.weight"] = out
    return w


def binary_head_output(seed: int = 5, scale: float = 4.0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(64).astype(np.float32) * scale
    out = np.zeros((320, 64), dtype=np.float32)
    out[A], out[B] = v, -v
    return out


def rule_head_output() -> np.ndarray:
    """A head that says B after A and A after B when its state is the anchor's embedding (the target's rule)."""
    e = tiny_weights(seed=3, n_layer=4, block_scale=0.05)["token_embd.weight"]
    out = np.zeros((320, 64), dtype=np.float32)
    out[A], out[B] = e[B] - e[A], e[A] - e[B]
    return out


@pytest.fixture(scope="module")
def binary_pair(tmp_path_factory):
    """(target, {kind: draft}): the target alternates A and B; each draft's own head can say only A or B."""
    d = tmp_path_factory.mktemp("binary")
    target = write_tiny_llama(d / "target.gguf", n_layer=4, layers_from=binary_weights())
    common = dict(target_layers=(1, 2, 3), own_output=True, block_size=6)
    return target, {
        "dflash": write_tiny_dflash(d / "dflash.gguf", seed=6, output_weight=binary_head_output(), **common),
        # DSpark's first draft is the anchor's own output: a head that follows the target's rule from the anchor
        # gets it right, the masks after it guess (a weak Markov bias keeps the guesses A or B)
        "dspark": write_tiny_dflash(
            d / "dspark.gguf", seed=7, dspark=True, markov_scale=0.01, output_weight=rule_head_output(), **common
        ),
        # a DSpark draft that only guesses, unsure (small logits): its samples are both accepted and refused
        "dspark-guess": write_tiny_dflash(
            d / "dspark-guess.gguf",
            seed=9,
            dspark=True,
            markov_scale=0.01,
            output_weight=binary_head_output(scale=0.05),
            **common,
        ),
        # small candidate scores: the selector's choice among A, B and a third candidate stays uncertain
        "dflash2": write_tiny_dflash(
            d / "dflash2.gguf", seed=8, selector_top_k=3, output_weight=binary_head_output(scale=0.05), **common
        ),
    }


def knobs(head, **extra):
    return {"draft_model": str(head), "draft_p_min": 0.0, **extra}


def strategy_of(kind: str) -> str:
    return "dspark" if kind.startswith("dspark") else "dflash"


@pytest.fixture()
def session(target_path):
    s = Session(target_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    yield s
    s.close()


# -- fixtures and the backend -------------------------------------------------------------------------------


def test_tiny_drafts_are_written_quickly_and_llama_cpp_loads_them(target_path, heads, tmp_path):
    t0 = time.perf_counter()
    p = write_tiny_dflash(tmp_path / "d.gguf", dspark=True, selector_top_k=0)
    assert time.perf_counter() - t0 < 1.0
    tm = LlamaModel(target_path)
    try:
        for kind, path in heads.items():
            info = check_gguf(path)
            h = read_dflash_head(path, info)
            assert h.kind == {"dspark-noconf": "dspark"}.get(kind, kind)
            assert (h.block_size, h.mask_token, h.n_vocab) == (8, 319, 320)
            m = LlamaModel(path)
            try:
                assert m.info.architecture == "dflash" and target_layer_ids(m.ptr) == list(h.target_layers)
            finally:
                m.close()
            args = dict(target_arch="llama", target_n_layer=4, target_n_embd=64, target_n_vocab=320, p_min=0.0)
            assert dflash_problems(h, info, dspark=h.dspark, **args) == []
        assert read_dflash_head(heads["dspark"]).confidence_head
        assert not read_dflash_head(heads["dspark-noconf"]).confidence_head
        assert read_dflash_head(p).max_draft == 8 and read_dflash_head(heads["dflash"]).max_draft == 7
    finally:
        tm.close()


@pytest.fixture()
def dflash_pair(target_path, heads):
    """The target's context (8-token micro-batches), the DFlash draft's context tied to it and its head."""
    tm, dm = LlamaModel(target_path), LlamaModel(heads["dflash"])
    tc = LlamaContext(tm, n_ctx=256, n_batch=64, n_ubatch=8, n_threads=1)
    head = read_dflash_head(heads["dflash"])
    dc = DFlashContext(dm, tc, head, n_threads=1)
    yield tc, dc, head
    dc.close()
    tc.close()
    dm.close()
    tm.close()


def test_a_block_decode_waits_for_the_device_inside_the_time_it_reports(dflash_pair, monkeypatch):
    from test_backend import DeviceWait

    tc, dc, head = dflash_pair
    cap = LayerCapture(tc, head.target_layers)
    tc.eval(list(range(10, 18)), 0, rows="none")
    dc.inject(cap.features(8), 0)
    DeviceWait(monkeypatch, 0.05).check(dc, lambda: dc.decode_block(30, 4, 8), "llama_process")


def test_a_feature_injection_waits_for_the_device_inside_the_time_it_reports(dflash_pair, monkeypatch):
    from test_backend import DeviceWait

    tc, dc, head = dflash_pair
    cap = LayerCapture(tc, head.target_layers)
    tc.eval(list(range(10, 30)), 0, rows="none")
    wait = DeviceWait(monkeypatch, 0.05)
    before = dc.inject_seconds
    dc.inject(cap.features(20), 0)  # three micro-batches of 8 rows, queued, then one wait
    assert [c for c, _ in wait.calls] == [int(dc.ptr)]
    assert wait.calls[0][1] == ["llama_process"] * 3
    assert dc.inject_seconds - before >= 0.05


def test_the_draft_context_injects_features_and_decodes_a_block_in_one_pass(dflash_pair):
    tc, dc, head = dflash_pair
    cap = LayerCapture(tc, head.target_layers)
    toks = list(range(10, 30))
    tc.eval(toks, 0, rows="none")
    dc.inject(cap.features(20), 0)  # 20 rows through an 8-row micro-batch: chunked, as llama.cpp does
    assert dc.kv_len() == 20
    dc.decode_block(30, 8, 20)
    assert dc.kv_len() == 28
    rows = [dc.logits(i).copy() for i in range(8)]
    assert all(np.isfinite(r).all() for r in rows)
    # non-causal: the anchor's output depends on the masks after it (a 4-token block reads otherwise)
    dc.truncate(20)
    dc.decode_block(30, 4, 20)
    assert not np.allclose(dc.logits(0), rows[0])
    dc.truncate(20)
    assert dc.kv_len() == 20


# -- the strategies -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dflash", "dspark", "dflash2"])
def test_greedy_block_drafting_equals_plain_greedy_and_keeps_both_caches_right(binary_pair, kind):
    target, drafts = binary_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    prompt = [1, 50, 60, 70, 80, 90, 100]
    ref = plain_reference(s.model, prompt, 80)
    s.start(prompt, 80, strategy_of(kind), **knobs(drafts[kind], draft_max=16))
    rollbacks = {"target": 0, "draft": 0}
    partial = 0
    while s.finished is None:
        rnd = s.step()
        assert s.kv_length == s.committed  # the target holds every committed token but the pending one
        assert s.drafter.kv_length() == s.committed  # the draft's cache mirrors it (the block is gone)
        for ev in rnd.of_kind("kv_rollback"):
            rollbacks[ev.context] += 1
        d = rnd.of_kind("draft_proposed")[0]
        if d.tokens:
            blk = d.block
            # one block, its positions drafted in parallel: the anchor plus five masks (trained block 6); DSpark's
            # anchor-first layout reads the anchor's own output as well
            positions = 6 if kind == "dspark" else 5
            assert blk["kind"] == kind and blk["size"] == 6 and blk["positions"] == positions and blk["trained"] == 6
            assert blk["anchor_drafts"] == (kind == "dspark")
            assert d.drafter == strategy_of(kind) and blk["position"] == d.position - 1
            assert all(p is not None and 0 < p <= 1 for p in d.probs)
            a = rnd.of_kind("accepted")[0]
            partial += 0 < a.n_accepted < len(d.tokens)
            back = [e for e in rnd.of_kind("kv_rollback") if e.context == "draft"]
            assert [(e.from_pos, e.to_pos) for e in back] == [(d.position - 1 + 6, d.position - 1)]
            assert event_from_dict(d.to_dict()) == d
    assert s.tokens == ref
    t = s.telemetry_dict()
    assert 0 < t["accepted"] < t["drafted"] and partial > 0
    assert rollbacks["target"] > 0 and rollbacks["draft"] > 0
    assert t["catch_up_tokens"] == 0  # the prompt's features came from the session's own prompt batch
    assert t["dflash"]["kind"] == kind and t["dflash"]["capture"] == "api"
    assert t["by_drafter"][strategy_of(kind)]["drafted"] == t["drafted"]
    s.close()


def test_random_drafts_of_every_kind_equal_plain_greedy(session, heads):
    prompt = [1, 40, 41, 42, 43]
    ref = plain_reference(session.model, prompt, 50)
    for kind in ("dflash", "dspark", "dflash2"):
        session.start(prompt, 50, strategy_of(kind), **knobs(heads[kind]))
        session.run()
        assert session.tokens == ref, kind
        assert session.telemetry_dict()["drafted"] > 0


def test_the_block_is_the_trained_one_whatever_the_rounds_limit(session, heads):
    """llama.cpp decodes --spec-draft-n-max masks; specviz always decodes the trained block (8 here) and keeps
    the first tokens the round allows."""
    session.start([1, 40, 41], 20, "dflash", **knobs(heads["dflash"], draft_max=3, align=False))
    rnd = session.step()
    d = rnd.of_kind("draft_proposed")[0]
    assert len(d.tokens) == 3 and d.block["size"] == 8 and d.block["positions"] == 7
    session.configure(draft_max=16)
    rnd = session.step()
    d = rnd.of_kind("draft_proposed")[0]
    assert len(d.tokens) == 7 and d.reason == "block"  # the block holds 7 draft positions: it said so


def test_a_micro_batch_smaller_than_the_block_caps_it(target_path, heads):
    s = Session(target_path, n_ctx=256, n_batch=64, n_ubatch=8, n_threads=1)
    h = write_tiny_dflash(target_path.with_name("wide.gguf"), seed=9, block_size=16)
    s.start([1, 40, 41], 20, "dflash", **knobs(h, align=False, draft_max=7))
    d = s.step().of_kind("draft_proposed")[0]
    assert d.block["size"] == 8 and d.block["trained"] == 16 and len(d.tokens) == 7
    s.close()


def test_dspark_confidence_head_stops_the_block_and_travels_with_it(session, heads):
    session.start([1, 40, 41], 30, "dspark", **knobs(heads["dspark"], draft_p_min=0.999))
    d = session.step().of_kind("draft_proposed")[0]
    conf = d.block["confidence"]
    assert d.reason == "confidence" and len(conf) == len(d.tokens) + 1
    assert all(c >= 0.999 for c in conf[: len(d.tokens)]) and conf[len(d.tokens)] < 0.999
    session.start([1, 40, 41], 30, "dspark", **knobs(heads["dspark"], draft_p_min=0.5))
    session.run()
    assert session.telemetry_dict()["drafted"] > 0


def test_dspark_without_a_confidence_head_refuses_p_min_with_llama_cpps_reason(session, heads):
    session.start([1, 50, 60], 20, "none")
    session.run(max_rounds=2)
    before = list(session.history)
    for call in (lambda: session.configure("dspark", **knobs(heads["dspark-noconf"], draft_p_min=0.5)),):
        with pytest.raises(StrategyUnavailableError, match="DSpark draft has no confidence head: please set"):
            call()
    with pytest.raises(StrategyUnavailableError, match="--spec-draft-p-min 0"):
        session.start([1, 50], 5, "dspark", **knobs(heads["dspark-noconf"], draft_p_min=0.5))
    assert session.history == before and session.strategy == "none"
    session.run()
    assert session.finished == "max_tokens"
    session.start([1, 40, 41], 30, "dspark", draft_model=str(heads["dspark-noconf"]))  # its default p_min is 0
    session.run()
    assert session.telemetry_dict()["drafted"] > 0


def test_dflash_p_min_stops_at_an_unsure_position(session, heads):
    session.start([1, 40, 41], 30, "dflash", **knobs(heads["dflash"], draft_p_min=0.99))
    session.run()
    reasons = {e.reason for e in session.events if e.kind == "draft_proposed"}
    assert "p-min" in reasons


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_snapshot_restores_both_contexts(binary_pair, kind, temperature):
    target, drafts = binary_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start([1, 50, 60, 70], 60, strategy_of(kind), temperature=temperature, seed=3, **knobs(drafts[kind]))
    s.run(max_rounds=6)
    blob = s.snapshot()
    kv = s.drafter.kv_length()
    s.run()
    original = list(s.tokens)
    r = Session.restore(blob, model=s.model, n_threads=1)
    assert r.drafter.kv_length() == kv == r.committed and r.kv_length == r.committed
    assert r.telemetry_dict()["catch_up_tokens"] == 0  # restored, not re-read
    r.run()
    assert r.tokens == original
    r.close()
    s.close()


def test_a_malformed_drafter_state_is_refused(binary_pair):
    target, drafts = binary_pair
    s = Session(target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    s.start([1, 50, 60], 20, "dflash", **knobs(drafts["dflash"]))
    s.run(max_rounds=3)
    blob = s.drafter.context_state()
    with pytest.raises(SnapshotError, match="malformed"):
        s.drafter.load_context_state(blob[:8] + b"{not json" + blob[30:])
    s.run()
    assert s.finished == "max_tokens"
    s.close()


def test_switching_in_mid_generation_and_a_long_prompt_catch_up(binary_pair):
    target, drafts = binary_pair
    s = Session(target, n_ctx=512, n_batch=16, n_ubatch=16, n_threads=1)
    prompt = [1] + [50 + (i % 40) for i in range(40)]  # longer than one batch: the features are caught up
    ref = plain_reference(s.model, prompt, 50)
    s.start(prompt, 50, "dflash", **knobs(drafts["dflash"], draft_policy="cost", draft_max=8))
    s.run()
    assert s.tokens == ref and s.telemetry_dict()["catch_up_tokens"] >= len(prompt) - 1
    s.start(prompt, 50, "none")
    s.run(max_rounds=12)
    s.configure("dspark", **knobs(drafts["dspark"]))
    s.run()
    t = s.telemetry_dict()
    assert s.tokens == ref and t["catch_up_tokens"] >= len(prompt) - 1 + 12 and t["drafted"] > 0
    s.close()


@pytest.mark.parametrize("kind", ["dflash", "dspark-guess", "dflash2"])
@pytest.mark.slow
def test_first_token_distribution_with_a_block_draft_matches_the_target(binary_pair, kind):
    """Lossless sampling: the first generated token follows the target's distribution, whatever the block
    drafted (each position sampled from its own q, accepted with min(1, p/q))."""
    target, drafts = binary_pair
    s = Session(target, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    params = SamplingParams(temperature=3.0)
    prompt = [1, 50, 60, A, B, A]
    ctx = LlamaContext(s.model, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    ctx.eval(prompt, 0, rows="last")
    p = probs_from_logits(ctx.row(len(prompt) - 1), params).to_dense()
    ctx.close()
    n = 1500
    counts = np.zeros(s.model.n_vocab)
    drafted = rejected = 0
    for i in range(n):
        s.start(prompt, 2, strategy_of(kind), temperature=3.0, seed=1000 + i, **knobs(drafts[kind], draft_max=2))
        rnd = s.step()
        counts[s.tokens[0]] += 1
        drafted += bool(rnd.of_kind("draft_proposed")[0].tokens)
        rejected += bool(rnd.of_kind("rejected"))
    assert drafted == n and 0 < rejected < n  # meaningful: drafts both accepted and refused
    keep = p > 0
    assert counts[~keep].sum() == 0
    stat = float(((counts[keep] - p[keep] * n) ** 2 / (p[keep] * n)).sum())
    assert stat < chi2_critical(int(keep.sum()) - 1), stat
    s.close()


def test_sampled_block_drafting_same_seed_same_output(session, heads):
    outs = []
    for seed in (11, 11, 12):
        session.start(
            [1, 70, 71], 40, "dspark", temperature=1.0, top_k=40, top_p=0.95, seed=seed, **knobs(heads["dspark"])
        )
        session.run()
        outs.append(list(session.tokens))
    assert outs[0] == outs[1] != outs[2]


# -- refusals -----------------------------------------------------------------------------------------------


def test_unusable_drafts_are_refused_with_the_reason_and_nothing_changes(session, target_path, heads, tmp_path):
    session.start([1, 50, 60], 20, "none")
    session.run(max_rounds=2)
    before = list(session.history)
    cases = [
        ("dflash", write_tiny_dflash(tmp_path / "deep.gguf", target_layers=(1, 4)), "target layer 4"),
        ("dflash", write_tiny_dflash(tmp_path / "wide.gguf", n_embd=48, n_head=4, own_embeddings=True), "48 wide"),
        ("dflash", write_tiny_dflash(tmp_path / "nomask.gguf", mask_token_id=-1), "no mask token"),
        ("dflash", write_tiny_dflash(tmp_path / "d2t.gguf", d2t=tuple(range(0, 320, 2))), "no output.weight"),
        ("dflash", write_tiny_llama(tmp_path / "llama.gguf", seed=2, n_layer=4), "not a DFlash draft"),
        ("dflash", heads["dspark"], "use the dspark strategy"),
        ("dspark", heads["dflash"], "no Markov head"),
        ("dspark", write_tiny_dflash(tmp_path / "nobs.gguf", dspark=True, block_size=None), "dflash.block_size"),
    ]
    for strategy, path, why in cases:
        with pytest.raises(StrategyUnavailableError, match=why):
            session.configure(strategy, **knobs(path))
        with pytest.raises(StrategyUnavailableError, match=why):
            session.start([1, 50], 5, strategy, **knobs(path))
    assert session.history == before and session.strategy == "none"
    session.run()
    assert session.finished == "max_tokens"
    with pytest.raises(KnobError, match="needs a DFlash draft"):
        session.start([1], 5, "dflash")
    with pytest.raises(KnobError, match="does not exist"):
        session.start([1], 5, "dspark", draft_model=str(tmp_path / "missing.gguf"))


def test_a_draft_with_a_reduced_vocabulary_and_its_own_head_drafts(session, tmp_path):
    ids = tuple(range(0, 320, 2))
    h = write_tiny_dflash(tmp_path / "reduced.gguf", seed=5, d2t=ids, own_output=True, target_layers=(0, 3))
    prompt = [1, 80, 81]
    ref = plain_reference(session.model, prompt, 30)
    session.start(prompt, 30, "dflash", **knobs(h))
    rounds = session.run()
    assert session.tokens == ref and session.telemetry_dict()["drafted"] > 0
    drafted = {t for r in rounds for t in r.of_kind("draft_proposed")[0].tokens}
    assert drafted and all(t % 2 == 0 for t in drafted)  # only ids d2t maps to


@pytest.mark.parametrize("n_rs_seq", [16, 0])
@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_block_drafts_for_a_hybrid_qwen35_target_equal_plain_greedy(tmp_path, kind, n_rs_seq):
    # a hybrid target (gated delta-net and attention layers, M-RoPE): its memory rolls the verify back
    # (n_rs_seq 16: llama.cpp's snapshots; 0: a checkpoint restored with the accepted tokens re-applied,
    # after which the draft re-reads the target's layer inputs by re-evaluation)
    from specviz.testing.tiny_qwen35 import write_tiny_qwen35

    target = write_tiny_qwen35(tmp_path / "q35.gguf", seed=1, nextn=False)
    draft = write_tiny_dflash(tmp_path / "d.gguf", seed=2, target_layers=(0, 3), dspark=kind == "dspark")
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_rs_seq=n_rs_seq)
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(s.model, prompt, 30)
    s.start(prompt, 30, kind, draft_model=str(draft), draft_p_min=0.0)
    while s.finished is None:
        s.step()
        assert s.kv_length == s.committed and s.drafter.kv_length() == s.committed
    assert s.tokens == ref
    t = s.telemetry_dict()
    assert t["drafted"] > 0 and t["rollback_paths"].get("partial" if n_rs_seq else "checkpoint", 0) > 0
    s.close()
