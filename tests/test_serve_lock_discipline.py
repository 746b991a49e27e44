"""Lock discipline of ``specviz serve``: no llama.cpp context is touched outside its session's lock and a
scheduler turn, so the idle reaper can never free a context that something is decoding on.

The first test is the crash of issue 22, end to end: a server started with a short ``--idle-timeout`` on
the tiny model, a page (a raw websocket client, :mod:`specviz.testing.page_client`) that plays a
prompt-lookup session, waits past the timeout and asks for advice — the advisor measures the verify cost
with timed decodes on the session's context. Before the fix the reaper parked (snapshot, then free) the
context while the measurement decoded on it and the process died with SIGSEGV. The others pin the rules
one by one on :class:`~specviz.server.pool.ManagedSession`.
"""

from __future__ import annotations

import threading
import time

import pytest
from browser_util import free_port, start, stop, wait_http

from specviz import Session
from specviz.server.pool import ManagedSession, SessionPool
from specviz.server.scheduler import RoundScheduler
from specviz.testing.page_client import PageClient, PageClientError

PROMPT = "the cat sat on the mat and the cat sat on the mat and the cat"


def serve_tiny(model_path, tmp_path, *extra: str):
    port = free_port()
    args = ["-m", "specviz.cli", "serve", "--model", str(model_path), "--port", str(port), *extra]
    proc = start(args, tmp_path / "serve.log")
    wait_http(f"http://127.0.0.1:{port}/", proc)
    return proc, f"http://127.0.0.1:{port}/"


def is_state(m: dict) -> bool:
    return m.get("type") == "state"


@pytest.mark.slow
def test_advice_after_the_idle_timeout_answers_and_the_server_lives(tiny_model_path, tmp_path):
    proc, url = serve_tiny(tiny_model_path, tmp_path, "--idle-timeout", "1", "--max-tokens", "1500", "--prompt", PROMPT)
    try:
        page = PageClient(url).connect()
        page.send({"type": "hello", "epoch": -1, "have": 0})
        page.wait_for(lambda m: is_state(m) and m.get("can_step"), 60)
        page.send({"type": "cmd", "cmd": "run", "n": 40})
        page.wait_for(lambda m: is_state(m) and m.get("running"), 60)
        page.wait_for(lambda m: is_state(m) and not m.get("running"), 120, since=len(page.received) - 1)
        answered = 0
        for _ in range(6):  # each time: idle past the timeout (the reaper parks), then ask for advice
            time.sleep(1.6)
            mark = len(page.received)
            page.send({"type": "advise"})
            try:
                reply = page.wait_for(
                    lambda m: m.get("type") == "advice" or (m.get("type") == "notice" and m.get("level") == "error"),
                    60,
                    since=mark,
                )
            except PageClientError:
                proc.wait(10)
                raise AssertionError(f"the server died (exit status {proc.returncode})") from None
            assert proc.poll() is None, f"the server died (exit status {proc.returncode})"
            assert reply["type"] == "advice", reply
            answered += 1
        assert answered == 6
        page.close()
    finally:
        alive = proc.poll() is None
        stop(proc)
    assert alive, (tmp_path / "serve.log").read_text()[-3000:]


class Factory:
    """Makes the sessions a ManagedSession wraps and keeps them (the test reaches the real one publicly);
    ``on_make`` runs each time (a restore makes a fresh session first)."""

    def __init__(self, model, on_make=None):
        self.model, self.on_make, self.made = model, on_make, []

    def __call__(self) -> Session:
        if self.on_make is not None:
            self.on_make()
        s = Session(self.model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1)
        self.made.append(s)
        return s


def test_the_verify_cost_is_measured_in_a_turn_with_the_lock_held_and_cannot_be_parked(tiny_model):
    sched = RoundScheduler()
    factory = Factory(tiny_model)
    ms = ManagedSession(factory, scheduler=sched)
    try:
        ms.start(PROMPT, max_tokens=200, strategy="prompt-lookup")
        for _ in range(5):
            ms.step()
        seen: list[tuple[object, bool]] = []
        reaper: list[threading.Thread] = []
        ctx = factory.made[-1].ctx
        real_eval = ctx.eval

        def spy(*a, **k):
            if not reaper:  # the reaper tries to park the session as the measurement starts (another thread)
                reaper.append(threading.Thread(target=ms.release))
                reaper[0].start()
                time.sleep(0.05)
            seen.append((sched.holder, ms.released))
            return real_eval(*a, **k)

        ctx.eval = spy
        try:
            cost = ms.verify_cost()
        finally:
            ctx.eval = real_eval
        reaper[0].join(10)
        assert cost is not None and len(seen) > 10, "the verify cost was measured with decodes"
        assert all(holder is ms for holder, _ in seen), "every decode ran in the session's turn"
        assert not any(parked for _, parked in seen), "the session was not parked while measuring"
        assert ms.released, "the reaper parked it once the measurement was done"
    finally:
        ms.close()


def test_no_llama_handle_is_handed_out_and_reads_do_not_wake_a_parked_session(tiny_model):
    ms = ManagedSession(Factory(tiny_model))
    try:
        ms.start(PROMPT, max_tokens=100, strategy="prompt-lookup")
        ms.step()
        for name in ("ctx", "drafter", "policy", "rng"):
            with pytest.raises(AttributeError):
                getattr(ms, name)
        assert ms.release()
        assert ms.cost_model is None and ms.events and ms.released, "reading a parked session keeps it parked"
    finally:
        ms.close()


def test_every_action_and_every_restore_resets_the_idle_clock(tiny_model):
    now = [0.0]
    factory = Factory(tiny_model)
    ms = ManagedSession(factory, clock=lambda: now[0])
    try:
        ms.start(PROMPT, max_tokens=200, strategy="prompt-lookup")
        ms.step()
        ms.step()
        for action in (
            ms.step,
            lambda: ms.configure(draft_max=4),
            ms.snapshot,
            ms.verify_cost,
            lambda: ms.rewind(1),
            ms.cancel,
        ):
            now[0] += 100.0
            assert ms.idle_seconds() == pytest.approx(100.0)
            action()
            assert ms.idle_seconds() == 0.0
        assert ms.release()
        now[0] += 100.0
        factory.on_make = lambda: now.__setitem__(0, now[0] + 50.0)  # the restore "takes" 50 s
        ms.step()
        assert ms.restores == 1 and ms.idle_seconds() == 0.0, "the idle clock starts after the restore"
    finally:
        ms.close()


class Blocker:
    """A subscriber that holds up the session's next round (the round holds the session's lock) until let go."""

    def __init__(self) -> None:
        self.armed, self.entered, self.leave = False, threading.Event(), threading.Event()

    def __call__(self, ev) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            self.leave.wait(10)

    def block(self, ms: ManagedSession) -> threading.Thread:
        self.armed = True
        self.entered.clear()
        self.leave.clear()
        t = threading.Thread(target=ms.step)
        t.start()
        assert self.entered.wait(10)
        return t


def test_parking_and_closing_wait_for_the_lock_and_the_reaper_rechecks_idleness(tiny_model):
    now = [0.0]
    pool = SessionPool(Factory(tiny_model), idle_timeout=10.0, clock=lambda: now[0])
    try:
        ms = pool.open()
        assert ms is not None
        ms.start(PROMPT, max_tokens=200, strategy="prompt-lookup")
        blocker = Blocker()
        ms.subscribe(blocker)
        now[0] += 20.0
        t = blocker.block(ms)  # a round that began just as the reaper looked: nothing is parked under it
        assert pool.release_idle() == 0 and not ms.released
        blocker.leave.set()
        t.join()
        assert pool.release_idle() == 0 and not ms.released, "the round touched the session"
        # the reaper saw an idle session, but an action started before it took the lock: not parked
        now[0] += 20.0
        assert ms.release(idle_for=10.0) and ms.released
        ms.step()
        now[0] += 5.0
        assert not ms.release(idle_for=10.0) and not ms.released
        # close waits for a running round instead of freeing the context under it
        t = blocker.block(ms)
        closed = threading.Event()
        c = threading.Thread(target=lambda: (pool.close(ms), closed.set()))
        c.start()
        assert not closed.wait(0.3), "close did not wait for the round"
        blocker.leave.set()
        t.join()
        c.join(10)
        assert closed.is_set() and ms.closed
    finally:
        pool.close_all()
