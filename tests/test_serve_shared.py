"""Presenter mode without a browser: one session on the tiny model, views that record what they are sent.

A viewer's commands are refused and change nothing; the presenter's rounds and changes reach every view;
a view that joins late catches up from the recorded rounds, and only it is sent the backlog.
"""

from __future__ import annotations

import json

import pytest
from declared_messages import check_sent, sent_messages_are_declared  # noqa: F401 (an autouse fixture)

from specviz import Session
from specviz.server.pool import ManagedSession
from specviz.server.presenter import SharedInspector

PROMPT = "the cat sat on the mat and the cat sat"


class Page:
    """What a page was sent, and the events it holds (applied as the front-end's protocol does)."""

    def __init__(self):
        self.msgs: list[dict] = []
        self.epoch = -1
        self.events: list[dict] = []
        self.asked = 0
        self.batches = 0

    def __call__(self, msg):
        check_sent(msg)
        if msg["type"] == "packed":  # a viewers' batch: the front-end unpacks it the same way
            self.batches += 1
            for m in json.loads(msg["json"]):
                self(m)
            return
        self.msgs.append(msg)
        if msg["type"] != "events":
            return
        if msg["epoch"] != self.epoch:
            if msg["start"] != 0:
                self.asked += 1
                return
            self.epoch, self.events = msg["epoch"], []
        if msg["start"] > len(self.events):
            self.asked += 1  # a gap: the front-end would say hello again
            return
        self.events += msg["events"][len(self.events) - msg["start"] :]

    def hello(self):
        return {"type": "hello", "epoch": self.epoch, "have": len(self.events)}

    def last_state(self):
        return [m for m in self.msgs if m["type"] == "state"][-1]

    def notices(self):
        return [m["text"] for m in self.msgs if m["type"] == "notice"]


@pytest.fixture()
def shared(tiny_model):
    ms = ManagedSession(lambda: Session(tiny_model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1))
    ms.start(PROMPT, max_tokens=400, strategy="prompt-lookup")
    sh = SharedInspector(ms, prompt=PROMPT, viewer_interval=0)  # every view sent each message at once
    yield sh
    sh.close()
    ms.close()


def join(sh: SharedInspector, role: str) -> tuple[Page, object]:
    page = Page()
    view = sh.attach(page, role)
    sh.handle(view, page.hello())
    return page, view


def test_a_viewers_commands_are_refused_and_change_nothing(shared):
    presenter, pv = join(shared, "presenter")
    viewer, vv = join(shared, "viewer")
    shared.handle(pv, {"type": "cmd", "cmd": "run", "n": 3})
    shared.core.wait(30)
    s = shared.core.session
    before = (list(s.tokens), s.strategy, dict(s.knobs), len(shared.core.log), shared.core.epoch)
    seen_by_presenter = len(presenter.msgs)
    for msg in (
        {"type": "cmd", "cmd": "step"},
        {"type": "cmd", "cmd": "play"},
        {"type": "cmd", "cmd": "pause"},
        {"type": "cmd", "cmd": "run", "n": 5},
        {"type": "cmd", "cmd": "reset", "prompt": "hello"},
        {"type": "configure", "strategy": "ngram-simple", "knobs": {}},
        {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": "2"}},
        {"type": "rewind", "round": 1},
        [1, 2],
    ):
        n = len(viewer.notices())
        shared.handle(vv, msg)
        assert len(viewer.notices()) == n + 1, msg
        assert "refused" in viewer.notices()[-1] and "only the presenter" in viewer.notices()[-1]
    shared.core.wait(5)
    assert not shared.core.running
    assert (list(s.tokens), s.strategy, dict(s.knobs), len(shared.core.log), shared.core.epoch) == before
    assert s._inner.generation.pending is None
    assert len(presenter.msgs) == seen_by_presenter, "the presenter saw nothing of the viewer's attempts"
    # a viewer may still ask for what it needs to draw
    shared.handle(vv, {"type": "schema", "strategy": "ngram-simple"})
    assert viewer.msgs[-1]["type"] == "schema" and viewer.msgs[-1]["knobs"]


def test_state_tells_each_page_its_role_and_a_viewer_controls_nothing(shared):
    presenter, _ = join(shared, "presenter")
    viewer, _ = join(shared, "viewer")
    join(shared, "viewer")
    ps, vs = presenter.last_state(), viewer.last_state()
    assert ps["role"] == "presenter" and ps["can_control"] and ps["can_step"]
    assert vs["role"] == "viewer" and not vs["can_control"] and not vs["can_step"] and not vs["can_reset"]
    assert vs["audience"] == {"presenters": 1, "viewers": 2} == presenter.last_state()["audience"]


def test_the_presenters_rounds_and_changes_reach_every_page_as_they_happen(shared):
    presenter, pv = join(shared, "presenter")
    viewers = [join(shared, "viewer")[0] for _ in range(3)]
    shared.handle(pv, {"type": "cmd", "cmd": "run", "n": 4})
    shared.core.wait(30)
    shared.handle(pv, {"type": "configure", "strategy": "ngram-simple", "knobs": {"size_n": "2"}})
    # the queued change shows on every page before it applies
    for v in viewers:
        assert "ngram-simple" in (v.last_state()["pending"] or "")
    assert [m for m in presenter.msgs if m["type"] == "knob_errors"][-1]["errors"] == {}
    assert all(not any(m["type"] == "knob_errors" for m in v.msgs) for v in viewers), "form replies are private"
    shared.handle(pv, {"type": "cmd", "cmd": "step"})
    shared.core.wait(30)
    for v in viewers + [presenter]:
        assert v.events == shared.core.log
        assert any(e["kind"] == "knobs_changed" and e["strategy"] == "ngram-simple" for e in v.events)
        assert v.last_state()["strategy"] == "ngram-simple"
    # a reset by the presenter starts a new epoch on every page
    shared.handle(pv, {"type": "cmd", "cmd": "reset", "prompt": "the dog ran and the dog ran"})
    for v in viewers:
        assert v.epoch == shared.core.epoch == 1 and v.events == shared.core.log


def test_a_page_that_joins_late_catches_up_and_only_it_is_sent_the_backlog(shared):
    presenter, pv = join(shared, "presenter")
    early, _ = join(shared, "viewer")
    shared.handle(pv, {"type": "cmd", "cmd": "run", "n": 25})
    shared.core.wait(60)
    log = list(shared.core.log)
    assert len(log) > 100
    sent_before = (len(presenter.msgs), len(early.msgs))
    late, lv = join(shared, "viewer")
    assert late.events == log, "the late page holds every recorded event"
    assert sum(len(m["events"]) for m in late.msgs if m["type"] == "events") == len(log), "each event sent once"
    # the others got the new audience, not the backlog
    for page, n in zip((presenter, early), sent_before):
        assert [m["type"] for m in page.msgs[n:]] == ["state"]
    # a page holding part of the log (a reconnect) gets only the rest
    part = Page()
    part.epoch, part.events = 0, log[:40]
    view = shared.attach(part, "viewer")
    shared.handle(view, part.hello())
    assert part.events == log
    assert sum(len(m["events"]) for m in part.msgs if m["type"] == "events") == len(log) - 40
    # and everyone follows the next rounds
    shared.handle(pv, {"type": "cmd", "cmd": "run", "n": 2})
    shared.core.wait(30)
    for page in (presenter, early, late, part):
        assert page.events == shared.core.log


def test_a_page_that_goes_away_is_dropped(shared):
    presenter, pv = join(shared, "presenter")
    gone, gv = join(shared, "viewer")
    shared.detach(gv)
    assert presenter.last_state()["audience"] == {"presenters": 1, "viewers": 0}
    n = len(gone.msgs)
    shared.handle(pv, {"type": "cmd", "cmd": "step"})
    shared.core.wait(30)
    assert len(gone.msgs) == n

    def broken(msg):
        raise ConnectionError("the page went away")

    shared.attach(broken, "viewer")
    shared.handle(pv, {"type": "cmd", "cmd": "step"})  # a failing page does not stop the others
    shared.core.wait(30)
    assert presenter.events == shared.core.log
    assert shared.audience() == {"presenters": 1, "viewers": 0}
    with pytest.raises(ValueError):
        shared.attach(Page(), "owner")


def test_viewers_are_sent_rounds_in_batches_that_merge_into_the_same_log(tiny_model):
    """With batching (the server's default), the viewers' rounds wait in one outbox and arrive as one packed
    message for every viewer: fewer messages, the same events; the presenter gets each round at once."""
    ms = ManagedSession(lambda: Session(tiny_model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1))
    ms.start(PROMPT, max_tokens=400, strategy="prompt-lookup")
    sh = SharedInspector(ms, prompt=PROMPT, viewer_interval=3600)  # the test flushes by hand
    try:
        presenter, pv = join(sh, "presenter")
        viewers = [join(sh, "viewer")[0] for _ in range(3)]  # their catch-ups are replies: sent at once
        assert all(v.events == sh.core.log for v in viewers)
        sh.flush()
        n0 = [len(v.msgs) for v in viewers]
        sh.handle(pv, {"type": "cmd", "cmd": "run", "n": 12})
        sh.core.wait(30)
        assert presenter.events == sh.core.log
        assert [len(v.msgs) for v in viewers] == n0, "nothing reaches a viewer before the batch goes"
        pending = [m["type"] for m in sh.pending()]
        assert pending.count("state") == 1 and pending.count("events") == 1, pending
        sh.flush()
        for v, n in zip(viewers, n0):
            assert v.events == sh.core.log
            assert len([m for m in v.msgs[n:] if m["type"] == "events"]) == 1
            assert v.last_state()["running"] is False and v.last_state()["role"] == "viewer"
        # a viewer that joins while rounds wait in the outbox: its catch-up covers them (not sent twice)
        sh.handle(pv, {"type": "cmd", "cmd": "run", "n": 2})
        sh.core.wait(30)
        late, _ = join(sh, "viewer")
        assert late.events == sh.core.log and late.batches == 0 and late.asked == 0
        for v in viewers:  # the others got the queued rounds first, before the late page's state
            assert v.events == sh.core.log
        # a reset between batches: the new epoch's events are not merged into the old one's
        sh.handle(pv, {"type": "cmd", "cmd": "step"})
        sh.core.wait(30)
        sh.handle(pv, {"type": "cmd", "cmd": "reset", "prompt": "the dog ran and the dog ran"})
        sh.handle(pv, {"type": "cmd", "cmd": "run", "n": 3})
        sh.core.wait(30)
        sh.flush()
        for v in viewers + [late]:
            assert v.epoch == sh.core.epoch == 1 and v.events == sh.core.log
    finally:
        sh.close()
        ms.close()


def test_merging_keeps_order_and_gaps():
    from specviz.server.presenter import merge_into

    box: list[dict] = []
    merge_into(box, {"type": "events", "epoch": 0, "start": 0, "events": [1, 2]})
    merge_into(box, {"type": "state", "running": True})
    merge_into(box, {"type": "events", "epoch": 0, "start": 2, "events": [3]})
    merge_into(box, {"type": "state", "running": False})
    assert box == [{"type": "events", "epoch": 0, "start": 0, "events": [1, 2, 3]}, {"type": "state", "running": False}]
    merge_into(box, {"type": "events", "epoch": 0, "start": 5, "events": [6]})  # a gap: not merged
    merge_into(box, {"type": "events", "epoch": 1, "start": 0, "events": [9]})  # a new epoch: not merged
    assert [m.get("start") for m in box] == [0, None, 5, 0]
