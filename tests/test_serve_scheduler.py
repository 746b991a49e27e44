"""The round scheduler of ``specviz serve``: one holder at a time, turns in arrival order, no starvation.

The first tests drive the scheduler with rounds the test itself holds open, so the order of the turns is
decided by the scheduler alone (no sleeps, no timing). The last one plays two real sessions on the tiny
llama.cpp model through the inspector's own Play worker and checks that both progress.
"""

from __future__ import annotations

import threading

import pytest

from specviz.server.scheduler import RoundScheduler

PROMPT = "the cat sat on the mat and the cat sat"


def wait_until(cond, what: str, timeout: float = 60.0) -> None:
    """Wait for ``cond()`` (a hang guard, not a timed assertion)."""
    done = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if cond():
            return
        done.wait(0.005)
    raise AssertionError(f"never happened: {what}")


class Player:
    """A thread that takes ``n`` turns; each round lasts until the test opens it."""

    def __init__(self, sched: RoundScheduler, name: str, n: int, order: list[str]):
        self.sched, self.name, self.n, self.order = sched, name, n, order
        self.go = threading.Semaphore(0)  # one release per round the test lets finish
        self.in_round = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        for _ in range(self.n):
            with self.sched.turn(self.name):
                self.order.append(self.name)
                self.in_round.set()
                assert self.go.acquire(timeout=60)
                self.in_round.clear()


def test_turns_go_round_robin_and_a_releasing_owner_queues_behind_the_waiting_one():
    """A holds a round while B queues; when A's round ends A asks again at once — B must go first.

    An unfair lock (a plain mutex, re-acquired by the thread that just released it) fails this: A would
    run again while B waits.
    """
    sched = RoundScheduler()
    order: list[str] = []
    a, b = Player(sched, "A", 4, order), Player(sched, "B", 4, order)
    a.thread.start()
    wait_until(a.in_round.is_set, "A holds its first round")
    b.thread.start()
    wait_until(lambda: sched.waiting() == ["B"], "B waits for a turn")
    players = {"A": a, "B": b}
    for i in range(7):  # end rounds 1..7; each time the other one must be waiting, and must go next
        cur, other = (a, b) if order[-1] == "A" else (b, a)
        wait_until(lambda o=other: sched.waiting() == [o.name], f"{other.name} waits while {cur.name} runs")
        cur.go.release()  # end this round; the player loops and asks for its next turn at once
        wait_until(lambda n=i + 2: len(order) == n, f"turn {i + 2} granted")
        wait_until(lambda: players[order[-1]].in_round.is_set(), "the next round runs")
    players[order[-1]].go.release()
    a.thread.join(30)
    b.thread.join(30)
    assert order == ["A", "B"] * 4
    assert sched.grants == {"A": 4, "B": 4}
    assert sched.holder is None and sched.waiting() == []


def test_three_waiting_owners_are_served_in_arrival_order():
    sched = RoundScheduler()
    order: list[str] = []
    hold = Player(sched, "H", 1, order)
    hold.thread.start()
    wait_until(hold.in_round.is_set, "H holds the turn")
    players = [Player(sched, n, 1, order) for n in ("C", "A", "B")]
    for i, p in enumerate(players):
        p.thread.start()
        wait_until(lambda n=i + 1: len(sched.waiting()) == n, f"{p.name} queued")
    assert sched.waiting() == ["C", "A", "B"]
    hold.go.release()
    for p in players:
        wait_until(p.in_round.is_set, f"{p.name} runs")
        assert sched.holder == p.name
        p.go.release()
        p.thread.join(30)
    assert order == ["H", "C", "A", "B"]


def test_the_holder_may_take_a_nested_turn_and_a_failing_round_frees_the_turn():
    sched = RoundScheduler()
    with sched.turn("A"):
        with sched.turn("A"):  # e.g. a call in a turn that calls another that takes one
            assert sched.holder == "A"
        assert sched.holder == "A"
    assert sched.holder is None
    with pytest.raises(RuntimeError):
        with sched.turn("B"):
            raise RuntimeError("the round failed")
    assert sched.holder is None
    with sched.turn("C"):  # not stuck
        pass
    assert sched.grants == {"A": 1, "B": 1, "C": 1}


def test_two_playing_sessions_on_the_tiny_model_both_progress(tiny_model):
    """Two pages press Play: both generations advance, turn by turn; neither starves."""
    from specviz import Session
    from specviz.server.pool import SessionPool
    from specviz.ui.core import InspectorCore

    pool = SessionPool(lambda: Session(tiny_model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1), max_sessions=2)
    a, b = pool.open(), pool.open()
    cores = []
    try:
        for ms in (a, b):
            ms.start(PROMPT, max_tokens=800, strategy="prompt-lookup")
            cores.append(InspectorCore(lambda m: None, ms))
        for c in cores:
            c.play()
        # both reach 40 rounds while the other plays too (a starving one would never get there)
        wait_until(lambda: a.round_index >= 40 and b.round_index >= 40, "both sessions ran 40 rounds", 120)
        assert cores[0].running or a.finished, "a is still playing"
        assert cores[1].running or b.finished, "b is still playing"
    finally:
        for c in cores:
            c.close()
        pool.close_all()
    grants = pool.scheduler.grants
    assert grants[a] >= 41 and grants[b] >= 41  # the start and every round were granted turns
