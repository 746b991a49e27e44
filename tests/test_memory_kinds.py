"""Speculation on every kind of model memory (specviz.backends.memory), on tiny real llama.cpp models.

The fixtures: a recurrent model (llama.cpp's ``mamba``: no tail can be removed, so every drafting round
goes through a partial-state checkpoint), a hybrid one (``lfm2``: short convolutions beside attention,
with llama.cpp's bounded recurrent-state snapshots), and a sliding-window ``gemma3`` run with the
full-size and with the ring-sized cache. Greedy speculation must give exactly the plain greedy tokens,
and the cache must hold exactly the committed positions after every round.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys

import llama_cpp.llama_cpp as lc
import numpy as np
import pytest

from specviz import Session
from specviz.backends.llama import LlamaContext, LlamaModel
from specviz.backends.memory import ring_cells, ring_covers, ring_draft_limit
from specviz.errors import RingCoverageError
from specviz.testing.memory_models import write_tiny_gemma3_swa, write_tiny_lfm2, write_tiny_mamba
from specviz.testing.tiny_models import write_tiny_llama

DRAFTLESS = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "prompt-lookup")
#: Knobs that make each strategy draft on these short generations (shorter keys than the defaults).
DRAFT_KNOBS = {
    "ngram-simple": {"size_n": 2, "size_m": 8},
    "ngram-map-k": {"size_n": 2, "size_m": 8},
    "ngram-map-k4v": {"size_n": 2, "size_m": 8},
    "ngram-mod": {"n_match": 3, "n_min": 1, "n_max": 8},
}
PROMPT = "the cat sat on the mat and the cat sat on the mat and the"
N_GEN = 60


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """The memory fixtures, written once (block scales chosen so greedy output loops, with breaks)."""
    d = tmp_path_factory.mktemp("memory_models")
    return {
        "mamba": write_tiny_mamba(d / "mamba.gguf", block_scale=0.02),
        "mamba_draft": write_tiny_mamba(d / "mamba_draft.gguf", block_scale=0.02, n_layer=1),
        "lfm2": write_tiny_lfm2(d / "lfm2.gguf", block_scale=0.25),
        "lfm2_draft": write_tiny_lfm2(d / "lfm2_draft.gguf", block_scale=0.25, layers="ca"),
        "gemma3": write_tiny_gemma3_swa(d / "gemma3.gguf", sliding_window=16),
        "llama": write_tiny_llama(d / "llama.gguf", seed=1, block_scale=0.1),
    }


def _session(path, **kw):
    return Session(path, **{"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "n_threads": 1, **kw})


def _run_checked(s: Session, strategy: str, *, max_tokens: int = N_GEN, **knobs) -> list:
    """Start and step to the end, checking after every round that the cache holds exactly the committed
    positions; return every event."""
    s.start(PROMPT, max_tokens=max_tokens, strategy=strategy, **knobs)
    assert s.kv_length == s.committed
    while s.finished is None:
        s.step()
        assert s.kv_length == s.committed, f"round {s.round_index}: cache {s.kv_length}, committed {s.committed}"
    return list(s.events)


def _plain(s: Session, max_tokens: int = N_GEN) -> list[int]:
    s.start(PROMPT, max_tokens=max_tokens, strategy="none")
    s.run()
    return list(s.tokens)


def _target_rollbacks(events) -> list:
    return [e for e in events if e.kind == "kv_rollback" and e.context == "target"]


# -- what each fixture is ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kw", "kind", "removal"),
    [
        ("llama", {}, "attention", "part"),
        ("mamba", {}, "recurrent", "full"),
        ("lfm2", {}, "hybrid", "rs"),
        ("lfm2", {"n_rs_seq": 0}, "hybrid", "full"),
        ("gemma3", {}, "sliding-window", "part"),
        ("gemma3", {"swa_full": False}, "ring", "part"),
    ],
)
def test_each_fixture_loads_and_reports_its_memory_kind(paths, name, kw, kind, removal):
    m = LlamaModel(paths[name])
    ctx = LlamaContext(m, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, **kw)
    info = ctx.memory.info
    assert (info.kind, info.removal) == (kind, removal)
    assert ctx.kv_len() == 0  # the probe leaves the cache empty
    ctx.eval([1, 300, 301], 0, rows="last")
    assert ctx.kv_len() == 3 and np.isfinite(ctx.last_row()).all()
    ctx.close()
    m.close()


@pytest.mark.parametrize("name", ["mamba", "lfm2"])
@pytest.mark.slow
def test_a_micro_batch_too_small_for_the_state_snapshots_is_refused_not_aborted(paths, name):
    """llama.cpp keeps a sequence's last n_rs_seq + 1 tokens in one micro-batch and aborts the process when
    n_ubatch cannot hold them; the context refuses that, typed, before its first decode. Run in a child
    process, since without the check the abort would take the test runner with it."""
    script = (
        "import sys\n"
        "from specviz.backends.llama import LlamaContext, LlamaModel\n"
        "from specviz.errors import ContextError\n"
        "m = LlamaModel(sys.argv[1])\n"
        "try:\n"
        "    LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=16, n_threads=1)\n"
        "except ContextError as e:\n"
        "    print('refused:', e)\n"
        "ctx = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=16, n_threads=1, n_rs_seq=8)\n"
        "ctx.eval(list(range(1, 41)), 0, rows='last')\n"
        "print('ok', ctx.kv_len())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(paths[name])], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: n_ubatch=16 is too small for n_rs_seq=16" in out.stdout
    assert "n_ubatch >= 18" in out.stdout
    assert "ok 40" in out.stdout  # a micro-batch that holds the snapshots (16 > 8 + 1) still works


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("llama", {}),
        ("mamba", {}),
        ("lfm2", {}),
        ("lfm2", {"n_rs_seq": 0}),
        ("gemma3", {}),
        ("gemma3", {"swa_full": False}),
    ],
)
def test_an_offloaded_context_computes_nothing_before_its_first_batch(paths, name, kw):
    """With layers asked on a GPU device, the memory probe runs in a throwaway context: the context's own
    scheduler has computed no graph when EAGLE-3's layer taps are switched on after creation (a reserve
    after a computed graph corrupts the heap on llama.cpp's Vulkan backend), and the facts are those of a
    probe in the context itself (on this CPU build the offloaded layers stay on the CPU)."""
    seen: list[int] = []

    @lc.ggml_backend_sched_eval_callback
    def count(t, ask, user_data):  # noqa: ARG001 - signature fixed by ggml
        seen.append(1)
        return not ask

    here, offloaded = LlamaModel(paths[name]), LlamaModel(paths[name], n_gpu_layers=99)
    common = {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "n_threads": 1, **kw}
    ref = LlamaContext(here, **common)
    ctx = LlamaContext(offloaded, **common, capture=False, eval_callback=count)
    try:
        assert seen == []  # no graph ran in this context's scheduler while it was created
        assert ctx.memory.info == ref.memory.info
        assert ctx.kv_len() == 0
        ctx.eval([1, 300, 301], 0, rows="last")
        assert seen and ctx.kv_len() == 3  # the callback is live: the first batch is the first graph
        ref.eval([1, 300, 301], 0, rows="last")
        assert np.array_equal(ctx.last_row(), ref.last_row())
    finally:
        ctx.close()
        ref.close()
        here.close()
        offloaded.close()


_LOG_LINES: list[str] = []


# module-level callbacks: llama.cpp keeps the pointer, so the ctypes objects must live as long as the process
@lc.llama_log_callback
def _capture_log(level, text, user_data):  # noqa: ARG001 - signature fixed by llama.cpp
    _LOG_LINES.append(text.decode("utf-8", "replace"))


@lc.llama_log_callback
def _quiet_log(level, text, user_data):  # noqa: ARG001
    return None


def _logged_sizes(path, **kw) -> tuple[object, list[tuple[str, float]]]:
    """The memory info of a new context and llama.cpp's own logged cache sizes (MiB, two decimals)."""
    m = LlamaModel(path)
    _LOG_LINES.clear()
    lc.llama_log_set(_capture_log, ctypes.c_void_p(0))
    try:
        ctx = LlamaContext(m, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1, **kw)
    finally:
        lc.llama_log_set(_quiet_log, ctypes.c_void_p(0))
    sizes = []
    for line in _LOG_LINES:
        got = re.search(r"(llama_kv_cache|llama_memory_recurrent): size =\s+([\d.]+) MiB", line)
        if got:
            sizes.append((got.group(1), float(got.group(2))))
    info = ctx.memory.info
    ctx.close()
    m.close()
    return info, sizes


@pytest.mark.parametrize(
    ("name", "kw"), [("llama", {}), ("gemma3", {}), ("gemma3", {"swa_full": False}), ("lfm2", {}), ("mamba", {})]
)
def test_memory_bytes_agree_with_llamacpps_own_accounting(paths, name, kw):
    info, logged = _logged_sizes(paths[name], **kw)
    kv = [mib for what, mib in logged if what == "llama_kv_cache"]
    rs = [mib for what, mib in logged if what == "llama_memory_recurrent"]
    mib = 1 << 20
    if info.kind in ("sliding-window", "ring"):  # the full-attention cache first, then the window's
        assert kv[0] == pytest.approx(info.kv_bytes / mib, abs=0.006)
        assert kv[1] == pytest.approx(info.swa_kv_bytes / mib, abs=0.006)
    elif info.kind != "recurrent":
        assert kv == [pytest.approx(info.kv_bytes / mib, abs=0.006)]
    if info.kind in ("recurrent", "hybrid"):
        # llama.cpp logs the allocation with its snapshots; ours is the serialised state (a few header bytes more)
        assert rs == [pytest.approx(info.recurrent_bytes / mib, abs=0.006)]
        assert info.state_bytes > 0
    assert info.weight_bytes > 0


def test_the_ring_holds_far_fewer_cells_than_the_full_sliding_window_cache(paths):
    m = LlamaModel(paths["gemma3"])
    full = LlamaContext(m, n_ctx=2048, n_batch=16, n_ubatch=16, n_threads=1)
    ring = LlamaContext(m, n_ctx=2048, n_batch=16, n_ubatch=16, n_threads=1, swa_full=False)
    assert full.memory.info.swa_cells == 2048
    assert ring.memory.info.swa_cells == ring_cells(2048, 16, 16) == 256
    assert ring.memory.info.swa_kv_bytes * 8 == full.memory.info.swa_kv_bytes
    assert ring.memory.info.kv_bytes == full.memory.info.kv_bytes  # the full-attention layer is unchanged
    for c in (full, ring):
        c.close()
    m.close()


# -- lossless speculation, every strategy, every kind ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("mamba", {}),
        ("lfm2", {}),
        ("lfm2", {"n_rs_seq": 2}),
        ("gemma3", {"swa_full": False, "n_ubatch": 16, "n_batch": 16}),
    ],
    ids=["recurrent", "hybrid", "hybrid-rs2", "ring"],
)
@pytest.mark.parametrize("strategy", DRAFTLESS)
def test_greedy_speculation_equals_plain_greedy(paths, name, kw, strategy):
    s = _session(paths[name], **kw)
    ref = _plain(s)
    events = _run_checked(s, strategy, draft_max=6, **DRAFT_KNOBS.get(strategy, {}))
    assert s.tokens == ref
    assert s.generation.telemetry.drafted > 0, "the strategy never drafted: the comparison would prove nothing"
    assert _target_rollbacks(events), "nothing was rejected: no rollback was tested"
    s.close()


@pytest.mark.parametrize(
    "name,kw",
    [("mamba", {}), ("lfm2", {}), ("gemma3", {"swa_full": False, "n_ubatch": 16, "n_batch": 16})],
    ids=["recurrent", "hybrid", "ring"],
)
def test_a_speculative_run_replays_through_every_memory_kind(paths, name, kw):
    """The equivalence check's replay (specviz/analysis/replay.py) goes through the context's memory as a
    round does: checkpoints, restores with the accepted tokens applied again, ring cuts; a correct run
    replays token for token, and a committed token changed in one round is found there."""
    import dataclasses

    from specviz.analysis.replay import replay_greedy

    s = _session(paths[name], **kw)
    calls: list[tuple] = []  # every evaluation of the target, and the states saved when it ran
    real_eval = s.ctx.eval

    def logged(tokens, start, rows="all"):
        calls.append((tuple(int(t) for t in tokens), start, rows, tuple(m.n for m in s.ctx.memory.marks)))
        return real_eval(tokens, start, rows)

    s.ctx.eval = logged
    s.start(PROMPT, max_tokens=N_GEN, strategy="prompt-lookup", draft_max=6)
    rounds = []
    while s.finished is None:
        s.step()
        rounds.append(s.generation.last_result)
    assert any(r.rollback is not None for r in rounds), "nothing was rolled back: the replay's cuts were not tested"
    ran, calls[:] = list(calls), []
    prompt = list(s.prompt_tokens)
    got = replay_greedy(s.ctx, prompt, rounds, prefill=s.prefill, upto=10**6)
    assert got.reproduced and got.tokens == len(s.tokens)
    assert calls == ran  # the same batches at the same positions from the same saved states, restores included
    s.ctx.eval = real_eval
    k = max(i for i, r in enumerate(rounds) if r.rollback is not None)  # late: after cuts and restores
    r = rounds[k]
    wrong = (r.committed[0] + 1) % s.model.n_vocab
    rounds[k] = dataclasses.replace(r, committed=[wrong, *r.committed[1:]])
    got = replay_greedy(s.ctx, prompt, rounds, prefill=s.prefill, upto=10**6)
    assert (got.reproduced, got.round, got.row, got.expected) == (False, r.index, 0, r.committed[0])
    s.close()


def test_recurrent_rollbacks_go_through_checkpoints_and_reapply_the_accepted_tokens(paths):
    s = _session(paths["mamba"])
    ref = _plain(s)
    events = _run_checked(s, "prompt-lookup", draft_max=6)
    assert s.tokens == ref
    rollbacks = _target_rollbacks(events)
    assert rollbacks and all(e.path == "checkpoint" for e in rollbacks)
    checkpoints = {e.round: e for e in events if e.kind == "memory_checkpoint" and e.context == "target"}
    verified = {e.round: e for e in events if e.kind == "verified"}
    for e in rollbacks:
        ck = checkpoints[e.round]  # every rolled-back round saved its state before the verify
        assert ck.position == verified[e.round].kv_before == e.mark_pos
        assert e.reapplied == e.to_pos - e.mark_pos >= 1 and e.nbytes == ck.nbytes > 0
        assert "cannot remove part" in ck.reason
    assert any(e.reapplied > 1 for e in rollbacks), "no rollback kept an accepted draft token"
    tel = s.telemetry_dict()
    assert tel["rollback_paths"] == {"checkpoint": len(rollbacks)}
    assert tel["checkpoints"] >= len(rollbacks) and tel["checkpoint_bytes"] > 0
    assert tel["reapplied_tokens"] == sum(e.reapplied for e in rollbacks)
    s.close()


def test_hybrid_rolls_back_by_partial_removal_within_n_rs_seq_and_by_checkpoint_beyond(paths):
    s = _session(paths["lfm2"], n_rs_seq=2)
    ref = _plain(s, 80)
    # the adaptive policy drafts 1…6 tokens: rejections within the bound and beyond it
    events = _run_checked(s, "prompt-lookup", max_tokens=80, draft_max=6, draft_policy="adaptive")
    assert s.tokens == ref
    drafts = {e.round: len(e.tokens) for e in events if e.kind == "draft_proposed"}
    checkpoints = {e.round for e in events if e.kind == "memory_checkpoint" and e.context == "target"}
    assert checkpoints == {r for r, n in drafts.items() if n > 2}  # exactly the drafts beyond the bound
    rollbacks = _target_rollbacks(events)
    assert {e.path for e in rollbacks} == {"partial", "checkpoint"}
    for e in rollbacks:  # as llama.cpp's server: the checkpoint only when more than n_rs_seq were rejected
        assert e.path == ("checkpoint" if e.from_pos - e.to_pos > 2 else "partial")
    assert any(e.path == "partial" and drafts[e.round] > 2 for e in rollbacks)  # checkpointed, yet not needed
    s.close()


def test_a_partial_removal_is_refused_outside_the_batch_just_decoded(paths):
    """llama.cpp's seq_rm accepts a rollback of up to n_rs_seq positions after any decode, but its
    snapshots only hold the last batch's states: a cut there must go through a saved state."""
    m = LlamaModel(paths["lfm2"])
    ctx = LlamaContext(m, n_ctx=256, n_batch=16, n_ubatch=16, n_threads=1, n_rs_seq=4)
    ref = LlamaContext(m, n_ctx=256, n_batch=16, n_ubatch=16, n_threads=1, n_rs_seq=0)
    toks = [1, *range(300, 312)]
    want = []
    for i, t in enumerate(toks):
        ref.eval([t], i, rows="last")
        want.append(ref.last_row().copy())
    ctx.eval(toks[:8], 0, rows="none")
    ctx.eval(toks[8:9], 8, rows="none")  # a one-token decode: the snapshots now hold one state only
    cut = ctx.memory.cut(6, toks)
    assert cut.path == "reprefill" and ctx.kv_len() == 6
    ctx.eval(toks[6:7], 6, rows="last")
    np.testing.assert_allclose(ctx.last_row(), want[6], atol=1e-4)
    ctx.eval(toks[7:10], 7, rows="none")  # inside the batch just decoded: partial removal is right
    cut = ctx.memory.cut(8, toks)
    assert cut.path == "partial"
    ctx.eval(toks[8:9], 8, rows="last")
    np.testing.assert_allclose(ctx.last_row(), want[8], atol=1e-4)
    for c in (ctx, ref):
        c.close()
    m.close()


@pytest.mark.parametrize(("target", "draft"), [("mamba", "mamba_draft"), ("lfm2", "lfm2_draft")])
def test_a_draft_model_of_recurrent_or_hybrid_kind(paths, target, draft):
    s = _session(paths[target])
    ref = _plain(s)
    events = _run_checked(s, "draft", draft_model=str(paths[draft]), draft_max=5, draft_p_min=0.0)
    assert s.tokens == ref
    assert s.drafter is not None and s.drafter.kv_length() == s.committed
    draft_ckpts = [e for e in events if e.kind == "memory_checkpoint" and e.context == "draft"]
    draft_cuts = [e for e in events if e.kind == "kv_rollback" and e.context == "draft"]
    assert draft_ckpts and draft_cuts and all(e.path == "checkpoint" for e in draft_cuts)
    mem = s.telemetry_dict()["memory"]
    assert mem["draft"]["kind"] == s.drafter.memory_context().memory.info.kind
    assert mem["draft"]["n_rs_seq"] == 0  # draft contexts keep no snapshots, as llama.cpp's server sets
    # a rewind cuts both contexts back from their saved states; stepping on repeats the tokens
    s.rewind(round=2)
    assert s.kv_length == s.committed and s.drafter.kv_length() == s.committed
    while s.finished is None:
        s.step()
        assert s.kv_length == s.committed and s.drafter.kv_length() == s.committed
    assert s.tokens == ref
    s.close()


# -- rewind, fork, snapshots ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mamba", "lfm2"])
def test_rewind_fork_and_snapshot_round_trips(paths, name):
    s = _session(paths[name], n_rs_seq=2) if name == "lfm2" else _session(paths[name])
    _run_checked(s, "prompt-lookup", draft_max=6)
    original, rounds = list(s.tokens), s.round_index
    assert rounds >= 6
    # rewind into the middle: the cache is rebuilt from a saved state, and stepping on repeats the rounds
    ev = s.rewind(round=3)
    assert s.kv_length == s.committed
    cut = next(r for r in ev.kv_rollbacks if r["context"] == "target")
    assert cut["path"] in ("checkpoint", "reprefill") and cut["to_pos"] == s.committed
    while s.finished is None:
        s.step()
        assert s.kv_length == s.committed
    assert s.tokens == original and s.round_index == rounds
    # rewind to the prompt, fork there, and run both
    s.rewind(round=0)
    f = s.fork()
    s.run()
    f.run()
    assert s.tokens == f.tokens == original
    # a snapshot taken mid-way restores to the same continuation
    s.rewind(round=2)
    blob = s.snapshot()
    s.run()
    r = Session.restore(blob, s.model)
    assert r.kv_length == r.committed
    r.run()
    assert r.tokens == s.tokens == original
    for x in (f, r, s):
        x.close()


# -- the sliding-window ring -------------------------------------------------------------------------------------


def test_ring_draft_limit_on_hand_worked_cases():
    # one micro-batch always fits: the verify's overwrites stay out of the window of a full rejection
    assert ring_draft_limit(1000, 16, 16, 15) == 15
    # a second micro-batch would start at 1016 and may overwrite keys 1002..1000: shorten to one
    assert ring_draft_limit(1000, 16, 16, 40) == 15
    assert ring_draft_limit(1000, 16, 512, 40) == 15
    # nothing is out of any window yet: the last micro-batch starts at 8 + 32 = 40 < 512
    assert ring_draft_limit(8, 16, 512, 40) == 40
    # the last micro-batch would start at 500 + 16 = 516 >= 512: one micro-batch only
    assert ring_draft_limit(500, 16, 512, 20) == 15
    assert ring_draft_limit(0, 16, 16, 0) == 0


def test_ring_covers_on_hand_worked_cases():
    # a forward at position 100 with a window of 16 needs keys 85..99
    assert ring_covers(85, 100, 16)
    assert not ring_covers(86, 100, 16)
    # early positions need everything from 0
    assert ring_covers(0, 10, 16) and not ring_covers(1, 10, 16)


def test_a_verify_beyond_the_ring_limit_can_lose_keys_a_rejection_needs(paths):
    """Why the limit exists: on a ring of 256 cells and a window of 16, a verify of 250 tokens in
    micro-batches of 16 overwrites keys the forward after a full rejection needs; one of 16 does not."""
    m = LlamaModel(paths["gemma3"])
    ctx = LlamaContext(m, n_ctx=1024, n_batch=256, n_ubatch=16, n_threads=1, swa_full=False)
    rng = np.random.default_rng(0)
    toks = [1, *(int(t) for t in rng.integers(3, 320, size=700))]
    ctx.eval_prompt(toks[:400], 0)
    n_past = 400
    for draft, covered in ((15, True), (250, False)):
        assert (ring_draft_limit(n_past, 16, 16, draft) == draft) is covered
        ctx.eval(toks[n_past : n_past + draft + 1], n_past, rows="none")
        assert ctx.memory.covers(n_past + 1) is covered
        if covered:
            ctx.memory.cut(n_past, toks)
    with pytest.raises(RingCoverageError):
        ctx.memory.cut(n_past + 1, toks)
    ctx.close()
    m.close()


def test_the_budget_shortens_drafts_the_ring_could_not_roll_back(paths):
    kw = {"swa_full": False, "n_ubatch": 16, "n_batch": 64, "n_ctx": 1024}
    s = _session(paths["gemma3"], **kw)
    ref = _plain(s, 300)
    events = _run_checked(s, "prompt-lookup", max_tokens=300, draft_max=48, align=False)
    assert s.tokens == ref
    drafts = [e for e in events if e.kind == "draft_proposed"]
    ring_capped = [e for e in drafts if e.cap == "ring"]
    assert ring_capped and all(e.limit == 15 and len(e.tokens) <= 15 for e in ring_capped)
    s.close()


def test_rewind_to_a_position_the_ring_no_longer_covers_is_refused_and_changes_nothing(paths):
    s = _session(paths["gemma3"], swa_full=False, n_ubatch=16, n_batch=16, n_ctx=1024)
    _run_checked(s, "prompt-lookup", max_tokens=320, draft_max=8)
    before = (list(s.history), len(s.events), s.round_index, s.kv_length, s.finished)
    with pytest.raises(RingCoverageError, match="nothing changed"):
        s.rewind(round=1)
    assert (list(s.history), len(s.events), s.round_index, s.kv_length, s.finished) == before
    # a recent round is still covered: the rewind works and stepping on repeats the tokens
    original = list(s.tokens)
    s.rewind(position=len(s.history) - 5)
    s.run()
    assert s.tokens == original
    s.close()


# -- typed refusals --------------------------------------------------------------------------------------------


def test_a_memory_that_cannot_roll_back_refuses_drafting_strategies_and_changes_nothing(paths):
    import dataclasses

    from specviz.errors import RollbackUnavailableError

    s = _session(paths["mamba"])
    s.start(PROMPT, max_tokens=8, strategy="none")
    # a memory llama.cpp can neither cut nor save a partial state of (no such tiny model: the rule is the point)
    s.ctx.memory.info = dataclasses.replace(s.ctx.memory.info, removal="no")
    history, events = list(s.history), len(s.events)
    with pytest.raises(RollbackUnavailableError, match="cannot drop a rejected draft"):
        s.configure("prompt-lookup")
    with pytest.raises(RollbackUnavailableError, match="use --strategy none"):
        s.start(PROMPT, max_tokens=8, strategy="ngram-cache")
    assert (s.history, len(s.events), s.strategy) == (history, events, "none")
    s.run()  # plain decoding still runs
    assert s.finished == "max_tokens"
    s.close()


def test_a_snapshot_of_a_ring_session_is_refused_by_a_full_cache_session(paths):
    from specviz.errors import SnapshotError

    ring = _session(paths["gemma3"], swa_full=False)
    ring.start(PROMPT, max_tokens=8, strategy="prompt-lookup")
    ring.run()
    blob = ring.snapshot()
    full = _session(paths["gemma3"])
    with pytest.raises(SnapshotError, match="swa_full=False"):
        full.restore_into(blob)
    assert not full.started
    again = Session.restore(blob, ring.model)  # Session.restore makes a matching (ring) session
    assert again.ctx.memory.info.kind == "ring" and again.tokens == ring.tokens
    for x in (ring, full, again):
        x.close()


def test_the_ring_is_refused_on_hybrid_models_with_a_window(tmp_path):
    from specviz.errors import ContextError

    m = LlamaModel(write_tiny_lfm2(tmp_path / "lfm2_swa.gguf", sliding_window=8))
    with pytest.raises(ContextError, match="not supported on hybrid models"):
        LlamaContext(m, n_ctx=256, n_threads=1, swa_full=False)
    ctx = LlamaContext(m, n_ctx=256, n_threads=1)
    assert ctx.memory.info.kind == "hybrid" and ctx.memory.info.swa_cells == 256
    ctx.close()
    m.close()
