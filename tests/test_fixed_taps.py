"""Layer taps on a backend that must not switch them once a context has computed (issue 26).

On llama.cpp's Vulkan backend, switching a layer tap (``llama_set_embeddings_layer_inp``) after a context
has computed a graph, or making an EAGLE-3 head next to such a context, corrupts the heap at a later
verify batch (``tests/test_vulkan.py`` runs the real thing on lavapipe). specviz never switches a tap of
such a context (:func:`specviz.backends.capture.taps_fixed`): a closed capture leaves its taps on, a capture
that would switch one on is refused, and the session gives a strategy that reads the target's layers a
context that has computed nothing (a new generation, a mid-generation switch, a restored snapshot).

Here, on the CPU build, the Vulkan device is stood in for: ``fixed_tap_backend_present`` answers yes and the
model is loaded with ``n_gpu_layers`` above 0 (the CPU build keeps every layer on the CPU). A spy on the tap
switch checks that no tap of a context that has evaluated a batch is ever switched.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_session import plain_reference

from specviz import Session
from specviz.backends import LlamaContext, LlamaModel, capture, llama_ext
from specviz.backends.capture import LayerCapture, taps_fixed
from specviz.errors import CaptureUnavailableError

PROMPT = [1, 40, 41, 42, 43]


@pytest.fixture()
def placed(e3_target_path):
    """The target "on a GPU": n_gpu_layers=99 on the CPU build."""
    m = LlamaModel(e3_target_path, n_gpu_layers=99)
    yield m
    m.close()


class TapSpy:
    """Records every tap switch with whether the context switched had evaluated a batch."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, bool, bool]] = []  # (layer, on, the context had evaluated)
        self.contexts: list = []  # contexts switched, and the sessions whose current context may be
        self.sessions: list[Session] = []
        real = llama_ext.ext()

        def switch(ptr, lid, on):
            ctx = next(c for c in [*self.contexts, *(x.ctx for x in self.sessions)] if not c.closed and c.ptr == ptr)
            self.calls.append((int(lid), bool(on), ctx.eval_count > 0))
            return real.set_embeddings_layer_inp(ptr, lid, on)

        spied = dataclasses.replace(real, set_embeddings_layer_inp=switch)
        monkeypatch.setattr(llama_ext, "ext", lambda: spied)

    def after_a_batch(self) -> list[tuple[int, bool, bool]]:
        """The switches made on a context that had evaluated a batch (never allowed here)."""
        return [c for c in self.calls if c[2]]


@pytest.fixture()
def fixed(monkeypatch):
    """This build "offloads to a Vulkan device"."""
    monkeypatch.setattr(capture, "fixed_tap_backend_present", lambda: True)


def _watch(spy: TapSpy, s: Session) -> None:
    spy.sessions.append(s)


def test_taps_are_fixed_only_after_a_batch_on_a_placed_model(e3_target_path, placed, fixed):
    ctx = LlamaContext(placed, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    on_cpu = LlamaModel(e3_target_path)
    cpu_ctx = LlamaContext(on_cpu, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    try:
        assert not taps_fixed(ctx)
        ctx.eval([1, 2, 3], 0, rows="last")
        cpu_ctx.eval([1, 2, 3], 0, rows="last")
        assert taps_fixed(ctx)
        assert not taps_fixed(cpu_ctx)  # n_gpu_layers=0: nothing of it is on a device
    finally:
        ctx.close()
        cpu_ctx.close()
        on_cpu.close()


def test_a_capture_on_a_fixed_context_leaves_its_taps_on_and_refuses_new_ones(placed, fixed, monkeypatch):
    spy = TapSpy(monkeypatch)
    ctx = LlamaContext(placed, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    spy.contexts.append(ctx)
    try:
        cap = LayerCapture(ctx, [0, 2])  # before any batch: switched on
        assert spy.calls == [(0, True, False), (2, True, False)]
        ctx.eval(list(range(5, 15)), 0, rows="last")
        first = cap.features(10)
        cap.close()  # after a batch: the taps stay on
        again = LayerCapture(ctx, [2, 0])  # the same layers: read through the taps left on, nothing switched
        ctx.eval(list(range(15, 25)), 10, rows="last")
        assert again.features(10).shape == first.shape
        with pytest.raises(CaptureUnavailableError, match=r"layers 1\b.*Vulkan"):
            LayerCapture(ctx, [1, 2])  # layer 1 would be switched on
        ctx.eval([30, 31], 20, rows="last")  # the refusal changed nothing
        again.close()
        assert spy.after_a_batch() == [] and len(spy.calls) == 2
    finally:
        ctx.close()


def test_on_the_cpu_a_closed_capture_switches_its_taps_off(e3_target_path, monkeypatch):
    """The rule applies to placed models only: on the CPU the taps follow the captures, as upstream."""
    spy = TapSpy(monkeypatch)
    m = LlamaModel(e3_target_path)
    ctx = LlamaContext(m, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    spy.contexts.append(ctx)
    try:
        cap = LayerCapture(ctx, [1])
        ctx.eval(list(range(5, 15)), 0, rows="last")
        cap.close()
        assert spy.calls == [(1, True, False), (1, False, True)]
    finally:
        ctx.close()
        m.close()


def _session(model) -> Session:
    return Session(model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)


def test_switching_to_eagle3_mid_generation_gets_a_fresh_context(placed, e3_head_path, fixed, monkeypatch):
    spy = TapSpy(monkeypatch)
    ref = plain_reference(placed, PROMPT, 30)
    s = _session(placed)
    try:
        _watch(spy, s)
        s.start(PROMPT, 30, "none")
        for _ in range(5):
            s.step()
        old = s.ctx
        s.configure("eagle3", draft_model=str(e3_head_path), draft_p_min=0.0)
        s.step()  # the switch happens at this round boundary
        assert s.ctx is not old and old.closed  # the old context was freed
        assert s.kv_length == s.committed
        s.run()
        assert s.tokens == ref
        assert s.telemetry_dict()["drafted"] > 0
        s.configure("none")  # and back: the capture closes on a context that has computed
        s.start(PROMPT, 10, "none")
        s.run()
        assert spy.after_a_batch() == [] and spy.calls
    finally:
        s.close()


def test_a_second_generation_with_eagle3_gets_a_fresh_context(placed, e3_head_path, fixed, monkeypatch):
    spy = TapSpy(monkeypatch)
    ref = plain_reference(placed, PROMPT, 20)
    s = _session(placed)
    try:
        _watch(spy, s)
        s.start([1, 50, 51], 10, "none")
        s.run()
        old = s.ctx
        s.start(PROMPT, 20, "eagle3", draft_model=str(e3_head_path), draft_p_min=0.0)
        assert s.ctx is not old
        s.run()
        assert s.tokens == ref
        assert spy.after_a_batch() == [] and spy.calls
    finally:
        s.close()


def test_a_refused_strategy_keeps_the_context(placed, e3_head_path, fixed, tmp_path):
    s = _session(placed)
    try:
        s.start(PROMPT, 10, "none")
        s.run()
        old = s.ctx
        with pytest.raises(Exception, match="draft_model|not found|exist"):
            s.start(PROMPT, 10, "eagle3", draft_model=str(tmp_path / "missing.gguf"))
        assert s.ctx is old and not old.closed
        s.start(PROMPT, 10, "none")  # still usable
        s.run()
    finally:
        s.close()


def test_a_snapshot_with_eagle3_restores_into_a_session_that_has_computed(placed, e3_head_path, fixed, monkeypatch):
    spy = TapSpy(monkeypatch)
    ref = plain_reference(placed, PROMPT, 24)
    a = _session(placed)
    b = _session(placed)
    try:
        _watch(spy, a)
        a.start(PROMPT, 24, "eagle3", draft_model=str(e3_head_path), draft_p_min=0.0)
        for _ in range(4):
            a.step()
        blob = a.snapshot()
        _watch(spy, b)
        b.start([1, 50, 51], 10, "none")
        b.run()
        old = b.ctx
        with pytest.raises(Exception, match="snapshot"):
            b.restore_into(blob[:-40])  # a damaged one: refused, the context kept
        assert b.ctx is old
        b.restore_into(blob)
        assert b.ctx is not old and b.strategy == "eagle3"
        b.run()
        assert b.tokens == ref
        assert spy.after_a_batch() == []
    finally:
        a.close()
        b.close()


def test_a_rewind_to_a_round_of_eagle3_gets_a_fresh_context(placed, e3_target_path, e3_head_path, fixed, monkeypatch):
    """none, then EAGLE-3 (layers 2, 2, 1), then DFlash (layers 1, 3), each on a new context, then back to
    a round of EAGLE-3: that context's tap 2 is off, so the rewind evaluates the kept positions into a new
    one (a ``reprefill`` in the event) rather than switching it on."""
    from specviz.testing.tiny_dflash import write_tiny_dflash

    dflash = write_tiny_dflash(e3_target_path.with_name("dflash.gguf"), seed=3, target_layers=(1, 3), block_size=6)
    spy = TapSpy(monkeypatch)
    ref = plain_reference(placed, PROMPT, 40)
    s = _session(placed)
    try:
        _watch(spy, s)
        s.start(PROMPT, 40, "none")
        for _ in range(3):
            s.step()
        s.configure("eagle3", draft_model=str(e3_head_path), draft_p_min=0.0)
        for _ in range(3):
            s.step()
        eagle3_round = s.round_index
        s.configure("dflash", draft_model=str(dflash), draft_p_min=0.0, draft_max=5)
        for _ in range(3):
            s.step()
        before = s.ctx
        ev = s.rewind(eagle3_round)
        assert s.strategy == "eagle3" and s.ctx is not before and before.closed
        assert [r["path"] for r in ev.kv_rollbacks if r["context"] == "target"] == ["reprefill"]
        assert s.kv_length == s.committed
        s.run()
        assert s.tokens == ref
        assert spy.after_a_batch() == []
    finally:
        s.close()
