"""The ``eagle3`` strategy, its head GGUFs and the target-layer capture, on tiny real llama.cpp models.

The heads are random (a random head drafts nonsense, losslessly). For rounds that accept part of a draft
the "binary" pair is used: a target whose output head can only say A or B (alternating, by construction)
and a head whose output can only say A or B, so some drafts are accepted and some rejected.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from stat_helpers import chi2_critical
from test_session import plain_reference

from specviz import Session
from specviz.backends import LlamaContext, LlamaModel
from specviz.backends.capture import LayerCapture, capture_method
from specviz.backends.eagle3 import Eagle3Context, eagle3_problems
from specviz.backends.gguf_check import check_gguf
from specviz.backends.llama_ext import target_layer_ids
from specviz.decoding.sampling import SamplingParams, probs_from_logits
from specviz.errors import (
    CaptureUnavailableError,
    ContextError,
    KnobError,
    SnapshotError,
    StrategyUnavailableError,
)
from specviz.models.eagle3_gguf import Eagle3HeadConfig, random_eagle3_weights, write_eagle3_head
from specviz.testing.tiny_models import tiny_weights, write_tiny_eagle3, write_tiny_llama

A, B = 300, 301


@pytest.fixture(scope="module")
def binary_pair(tmp_path_factory):
    """(target, head): both can only output A or B; the target alternates, the head guesses."""
    d = tmp_path_factory.mktemp("binary")
    w = tiny_weights(seed=3, n_layer=4, block_scale=0.05)
    e = w["token_embd.weight"]
    u = (e[B] - e[A]).astype(np.float32)  # after A the target says B, after B it says A
    out = np.zeros_like(w["output.weight"])
    out[A], out[B] = u, -u
    w["output.weight"] = out
    target = write_tiny_llama(d / "target.gguf", n_layer=4, layers_from=w)
    d2t = tuple(sorted(set(range(0, 320, 2)) | {A, B}))
    cfg = Eagle3HeadConfig(
        n_embd=64,
        n_head=4,
        n_head_kv=2,
        n_ff=128,
        target_hidden=64,
        target_layers=(1, 2, 3),
        d2t=d2t,
        n_vocab=320,
        rms_eps=1e-5,
    )
    hw = random_eagle3_weights(cfg, seed=4)
    v = np.random.default_rng(5).standard_normal(64).astype(np.float32)
    ho = np.zeros_like(hw["output.weight"])
    ho[d2t.index(A)], ho[d2t.index(B)] = v, -v
    hw["output.weight"] = ho
    head = write_eagle3_head(d / "head.gguf", target, cfg, hw)
    return target, head


@pytest.fixture()
def session(e3_target_path):
    s = Session(e3_target_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    yield s
    s.close()


def knobs(head, **extra):
    return {"draft_model": str(head), "draft_p_min": 0.0, "draft_max": 5, **extra}


# -- fixtures and the backend -------------------------------------------------------------------------------


def test_tiny_head_is_written_quickly_and_llama_cpp_loads_it(e3_target_path, tmp_path):
    t0 = time.perf_counter()
    p = write_tiny_eagle3(tmp_path / "h.gguf", e3_target_path, n_draft_vocab=100)
    assert time.perf_counter() - t0 < 1.0
    info = check_gguf(p)
    assert info.architecture == "eagle3" and info.tensors["d2t"].ggml_type == 27  # int64, as llama.cpp asserts
    m = LlamaModel(p)
    try:
        assert m.n_layer == 1 and m.n_vocab == 320
        assert target_layer_ids(m.ptr) == [2, 2, 1]  # the converter's [2, N/2, N-3] for N = 4
    finally:
        m.close()
    assert eagle3_problems(p, target_arch="llama", target_n_layer=4, target_n_embd=64, target_n_vocab=320) == []


def test_capture_through_llama_cpp_taps_equals_the_callback_shim(e3_target_path):
    m = LlamaModel(e3_target_path)
    api_ctx = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    cb_ctx = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=16, n_threads=1, capture=True)  # 3 micro-batches
    try:
        api = LayerCapture(api_ctx, [0, 1, 3])
        cb = LayerCapture(cb_ctx, [0, 1, 3], method="callback")
        assert (api.method, cb.method) == ("api", "callback")
        toks = list(range(5, 45))
        for ctx in (api_ctx, cb_ctx):
            ctx.eval(toks, 0, rows="last")
        fa, fc = api.features(40), cb.features(40)
        assert fa.shape == (40, 192) and np.abs(fa).max() > 0
        assert np.array_equal(fa, fc)
        # layer 0's input is the token embedding row itself
        emb = tiny_weights(seed=2, n_layer=4, block_scale=0.1)["token_embd.weight"]
        assert np.allclose(fa[:, :64], emb[toks], atol=1e-6)
        # switched off, the shim copies nothing more
        cb.close()
        calls = cb_ctx.tap.state.calls
        cb_ctx.eval([7], 40, rows="all")
        assert cb_ctx.tap.state.calls == calls
    finally:
        api_ctx.close()
        cb_ctx.close()
        m.close()


def test_a_layer_named_twice_is_read_at_both_places_by_either_capture(e3_target_path):
    """A head may name a layer twice (the tiny fixture's head reads layers 2, 2, 1). The shim fills the first
    tap of a tensor's name only, so it had given the second place no rows ("the capture shim saw 0 rows")."""
    m = LlamaModel(e3_target_path)
    api_ctx = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    cb_ctx = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, capture=True)
    try:
        api = LayerCapture(api_ctx, [2, 2, 1])
        cb = LayerCapture(cb_ctx, [2, 2, 1], method="callback")
        toks = list(range(5, 25))
        for ctx in (api_ctx, cb_ctx):
            ctx.eval(toks, 0, rows="last")
        fa, fc = api.features(20), cb.features(20)
        assert fa.shape == (20, 192) and np.array_equal(fa[:, :64], fa[:, 64:128])
        assert np.array_equal(fa, fc)
    finally:
        api_ctx.close()
        cb_ctx.close()
        m.close()


def test_capture_refuses_before_llama_cpp_could_abort(e3_target_path):
    m = LlamaModel(e3_target_path)
    ctx = LlamaContext(m, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    try:
        with pytest.raises(CaptureUnavailableError, match="layer 4 is not a layer"):
            LayerCapture(ctx, [0, 1, 4])
        cap = LayerCapture(ctx, [1, 2, 3])
        with pytest.raises(CaptureUnavailableError, match="no batch was evaluated"):
            cap.features(1)  # llama.cpp's getter would assert on an empty buffer
        with pytest.raises(CaptureUnavailableError, match="without the capture callback"):
            LayerCapture(ctx, [1, 2, 3], method="callback")  # this context has no callback installed
        assert capture_method("gemma3") == "callback" and capture_method("glm4moe") is None
    finally:
        ctx.close()
        m.close()


def test_head_context_encodes_and_decodes_pairs(e3_target_path, e3_head_path):
    m, h = LlamaModel(e3_target_path), LlamaModel(e3_head_path)
    tc = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=8, n_threads=1)
    e = Eagle3Context(h, tc, n_threads=1)
    try:
        cap = LayerCapture(tc, e.target_layers)
        toks = list(range(10, 30))
        tc.eval(toks, 0, rows="none")
        g = e.encode(cap.features(20))  # 20 rows through an 8-row micro-batch: chunked
        assert g.shape == (20, 64) and np.isfinite(g).all()
        e.decode(toks[1:20], g[:19], 0, outputs=[18])
        assert e.kv_len() == 19
        row = e.logits(18)
        d2t = set(range(0, 320, 2))
        finite = {int(i) for i in np.flatnonzero(np.isfinite(row))}
        assert finite == d2t  # llama.cpp scatters the draft vocabulary through d2t, -inf elsewhere
        assert e.prenorm(18).shape == (64,)
        e.truncate(10)
        assert e.kv_len() == 10
    finally:
        e.close()
        tc.close()
        h.close()
        m.close()


def test_the_head_context_is_freed_by_the_same_rule_as_the_target_context(e3_target_path, e3_head_path):
    m, h = LlamaModel(e3_target_path), LlamaModel(e3_head_path)
    try:
        with LlamaContext(m, n_ctx=64, n_batch=16, n_ubatch=16, n_threads=1) as tc:
            with Eagle3Context(h, tc, n_threads=1) as e:
                assert not e.closed and e.kv_len() == 0
            assert e.closed and not tc.closed
            with pytest.raises(ContextError, match="the EAGLE-3 context was closed"):
                e.ptr  # noqa: B018 - the property refuses a freed context
            e.close()  # idempotent
        assert tc.closed
    finally:
        h.close()
        m.close()


# -- the strategy -------------------------------------------------------------------------------------------


def test_greedy_with_eagle3_equals_plain_greedy_and_keeps_both_caches_right(binary_pair):
    target, head = binary_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    prompt = [1, 50, 60, 70, 80, 90, 100]
    ref = plain_reference(s.model, prompt, 80)
    s.start(prompt, 80, "eagle3", **knobs(head))
    rollbacks = {"target": 0, "draft": 0}
    while s.finished is None:
        rnd = s.step()
        assert s.kv_length == s.committed  # the target holds every committed token but the pending one
        assert s.drafter.kv_length() == len(s.history) - 2  # the head: every pair but the deferred one
        for ev in rnd.of_kind("kv_rollback"):
            rollbacks[ev.context] += 1
        d = rnd.of_kind("draft_proposed")[0]
        assert all(p is not None and 0 < p <= 1 for p in d.probs)
        v = rnd.of_kind("verified")[0]
        assert v.draft_kv_peak == v.draft_kv_before + len(d.tokens)  # one pair per drafting step
    assert s.tokens == ref
    t = s.telemetry_dict()
    assert 0 < t["accepted"] < t["drafted"]
    assert rollbacks["target"] > 0 and rollbacks["draft"] > 0
    assert t["catch_up_tokens"] == 0  # the prompt's states came from the session's own prompt batch
    cov = t["vocab_coverage"]
    assert cov["draft_vocab"] == 161 and cov["committed"] == 80 and cov["committed_share"] == 1.0
    assert t["eagle3"]["capture"] == "api" and t["eagle3"]["target_layers"] == [1, 2, 3]
    s.close()


def test_random_head_greedy_equals_plain_and_counts_coverage(session, e3_target_path, e3_head_path):
    prompt = [1, 40, 41, 42, 43]
    ref = plain_reference(session.model, prompt, 60)
    session.start(prompt, 60, "eagle3", **knobs(e3_head_path))
    session.run()
    assert session.tokens == ref
    t = session.telemetry_dict()
    assert t["drafted"] > 0
    cov = t["vocab_coverage"]
    even = sum(1 for x in ref if x % 2 == 0)  # the tiny head's draft vocabulary is the even ids
    assert cov["expressible"] == even and cov["vocab_share"] == 0.5
    assert cov["rejections"] > 0 and cov["rejections_expressible"] <= cov["rejections"]


def test_a_draft_cut_to_the_tile_and_accepted_whole_is_no_rejection_for_the_coverage_count():
    """White box: the round verified a prefix of the head's draft (cut to suit the verify tile). Whether the
    target's next token counts as a rejection depends on the head's own next token, verified or not."""
    from specviz.strategies.hidden_state import HiddenStateDrafter

    d = object.__new__(HiddenStateDrafter)  # only what _accept reads: no models needed
    d.vocab_ids = np.array([10, 11, 12], dtype=np.int64)
    d._vocab_set = None  # the set of vocab_ids, made on first use
    d.coverage = {"rejections": 0, "rejections_expressible": 0}
    prefix = [1, 2, 3, 4, 5]

    def accept(draft, n_accepted, committed):
        d._last_draft, d._round_start = list(draft), len(prefix)
        d._accept(n_accepted, prefix + committed)
        return d.coverage["rejections"], d.coverage["rejections_expressible"]

    # 3 of a 4-token draft verified and accepted; the target's next token is the head's fourth
    assert accept([10, 11, 12, 10], 3, [10, 11, 12, 10]) == (0, 0)
    # ... or another token, which the head's vocabulary holds: a rejection, an expressible one
    assert accept([10, 11, 12, 10], 3, [10, 11, 12, 11]) == (1, 1)
    # an ordinary rejection at depth 1, of a token outside the vocabulary
    assert accept([10, 11, 12, 10], 1, [10, 13]) == (2, 1)


def test_switching_to_eagle3_mid_generation_catches_up(session, e3_head_path):
    prompt = [1, 60, 61, 62]
    ref = plain_reference(session.model, prompt, 50)
    session.start(prompt, 50, "none")
    session.run(max_rounds=12)
    session.configure("eagle3", **knobs(e3_head_path))
    session.run()
    assert session.tokens == ref
    t = session.telemetry_dict()
    assert t["catch_up_tokens"] >= 12 and t["drafted"] > 0  # the committed states were re-read once


def test_cost_policy_and_a_long_prompt_still_exact(binary_pair):
    target, head = binary_pair
    s = Session(target, n_ctx=512, n_batch=16, n_ubatch=16, n_threads=1)
    prompt = [1] + [50 + (i % 40) for i in range(40)]  # longer than one batch: the states are caught up
    ref = plain_reference(s.model, prompt, 40)
    s.start(prompt, 40, "eagle3", **knobs(head, draft_policy="cost", draft_max=8))
    s.run()
    assert s.tokens == ref
    assert s.telemetry_dict()["catch_up_tokens"] >= len(prompt) - 1
    s.close()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_snapshot_restores_both_contexts(binary_pair, temperature):
    target, head = binary_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start([1, 50, 60, 70], 60, "eagle3", temperature=temperature, seed=3, **knobs(head))
    s.run(max_rounds=6)
    blob = s.snapshot()
    kv_head = s.drafter.kv_length()
    s.run()
    original = list(s.tokens)
    r = Session.restore(blob, model=s.model, n_threads=1)
    assert r.drafter.kv_length() == kv_head == len(r.history) - 2 and r.kv_length == r.committed
    assert r.telemetry_dict()["catch_up_tokens"] == 0  # restored, not re-read
    r.run()
    assert r.tokens == original
    r.close()
    s.close()


def test_a_truncated_drafter_state_is_refused(binary_pair):
    target, head = binary_pair
    s = Session(target, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    s.start([1, 50, 60], 20, "eagle3", **knobs(head))
    s.run(max_rounds=3)
    blob = s.drafter.context_state()
    with pytest.raises(SnapshotError, match="malformed"):
        s.drafter.load_context_state(blob[:8] + b"{not json" + blob[30:])
    s.run()
    assert s.finished == "max_tokens"
    s.close()


def test_sampled_eagle3_same_seed_same_output(session, e3_head_path):
    outs = []
    for seed in (11, 11, 12):
        session.start(
            [1, 70, 71], 40, "eagle3", temperature=1.0, top_k=40, top_p=0.95, seed=seed, **knobs(e3_head_path)
        )
        session.run()
        outs.append(list(session.tokens))
    assert outs[0] == outs[1] != outs[2]


@pytest.mark.slow
def test_first_token_distribution_with_eagle3_matches_the_target(binary_pair):
    """Lossless sampling: the first generated token follows the target's distribution, whatever the head
    drafted (sampled from q over its reduced vocabulary, accepted with min(1, p/q))."""
    target, head = binary_pair
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
        s.start(prompt, 2, "eagle3", temperature=3.0, seed=1000 + i, **knobs(head, draft_max=2))
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


# -- refusals -----------------------------------------------------------------------------------------------


def _head(tmp_path, e3_target_path, name, dtype="f32", **cfg_overrides):
    cfg = dict(
        n_embd=64,
        n_head=4,
        n_head_kv=2,
        n_ff=128,
        target_hidden=64,
        target_layers=(1, 2, 3),
        d2t=tuple(range(0, 320, 2)),
        n_vocab=320,
        rms_eps=1e-5,
    )
    cfg.update(cfg_overrides)
    c = Eagle3HeadConfig(**cfg)
    return write_eagle3_head(tmp_path / name, e3_target_path, c, random_eagle3_weights(c), dtype=dtype)


def test_unusable_heads_are_refused_with_the_reason_and_nothing_changes(session, e3_target_path, tmp_path):
    session.start([1, 50, 60], 20, "none")
    session.run(max_rounds=2)
    before = list(session.history)
    cases = [
        (_head(tmp_path, e3_target_path, "deep.gguf", target_layers=(1, 2, 4)), "target layer 4"),
        (
            _head(tmp_path, e3_target_path, "other.gguf", n_embd=48, target_hidden=48, own_embeddings=True),
            "target of width 48",
        ),
        (write_tiny_llama(tmp_path / "not_a_head.gguf", seed=2, n_layer=4), "not an EAGLE-3 head"),
    ]
    for path, why in cases:
        with pytest.raises(StrategyUnavailableError, match=why):
            session.configure("eagle3", **knobs(path))
        with pytest.raises(StrategyUnavailableError, match=why):
            session.start([1, 50], 5, "eagle3", **knobs(path))
    assert session.history == before and session.strategy == "none"
    session.run()
    assert session.finished == "max_tokens"
    with pytest.raises(KnobError, match="needs an EAGLE-3 head"):
        session.start([1], 5, "eagle3")
    with pytest.raises(KnobError, match="does not exist"):
        session.start([1], 5, "eagle3", draft_model=str(tmp_path / "missing.gguf"))


def test_a_narrower_head_with_its_own_embeddings_drafts(session, e3_target_path, tmp_path):
    head = _head(tmp_path, e3_target_path, "narrow.gguf", n_embd=32, n_head=2, n_head_kv=1, own_embeddings=True)
    prompt = [1, 80, 81]
    ref = plain_reference(session.model, prompt, 30)
    session.start(prompt, 30, "eagle3", **knobs(head))
    session.run()
    assert session.tokens == ref and session.telemetry_dict()["drafted"] > 0


def test_a_head_with_a_bad_d2t_is_refused_not_aborted(e3_target_path, tmp_path):
    """llama.cpp asserts d2t is int64 and matches the output head when it builds the graph (an abort at the
    first draft step); specviz refuses such a head up front."""
    import gguf

    good = _head(tmp_path, e3_target_path, "good.gguf")
    r = gguf.GGUFReader(str(good))
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "eagle3")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = f.contents()
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, v, f.types[0], f.types[-1])
        else:
            w.add_key_value(k, v, f.types[0])
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.name == "d2t":
            data = data.astype(np.int32)
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    why = eagle3_problems(
        tmp_path / "bad.gguf", target_arch="llama", target_n_layer=4, target_n_embd=64, target_n_vocab=320
    )
    assert any("int64" in x for x in why)
    s = Session(e3_target_path, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    with pytest.raises(StrategyUnavailableError, match="int64"):
        s.start([1, 2], 5, "eagle3", draft_model=str(tmp_path / "bad.gguf"))
    s.close()


@pytest.mark.parametrize("norm_before_fc", [False, True])
def test_an_f16_head_keeps_fc_in_f32_when_its_inputs_are_raw_layer_inputs(e3_target_path, tmp_path, norm_before_fc):
    # llama.cpp's CPU f16 product rounds its input to f16; Gemma 3's layer inputs reach 1e5 (test_eagle3_gemma)
    path = _head(tmp_path, e3_target_path, "h.gguf", dtype="f16", norm_before_fc=norm_before_fc)
    types = {k: t.ggml_type for k, t in check_gguf(path).tensors.items()}
    assert types["fc.weight"] == (1 if norm_before_fc else 0)  # GGML_TYPE_F16 = 1, F32 = 0
    assert types["output.weight"] == 1  # every other matrix as asked
