"""Nothing heavy on a served page's IO loop, and nothing a page sends or fails to read grows without bound.

* a served page's inspector core runs the messages the protocol declares ``"work": "background"`` off the
  calling thread, one at a time: the page's state says what is working, a second heavy message and every
  command meanwhile are refused with a notice (nothing changes), and light questions are answered at once;
* the message gate charges work (tokens decoded, bytes moved), not only messages, per page and per client
  address; a refused upload part is asked for again later; a page's ``hello`` (a catch-up) is paced;
* uploads are bounded in ids, bytes and age, their header checked from the first part;
* a page that stops reading is dropped once its send queue is full, not buffered.

Real llama.cpp sessions on the tiny model, without a browser.
"""

from __future__ import annotations

import base64
import threading
import time

import pytest

from specviz import Session
from specviz.server.access import GateRegistry, MessageGate
from specviz.server.pages import Gated, scrubbed, without_paths
from specviz.server.pool import ManagedSession
from specviz.server.scheduler import RoundScheduler
from specviz.ui.core import InspectorCore
from specviz.ui.protocol import MessageError, outgoing_problem, work_of
from specviz.ui.uploads import MAX_AGE, MAX_AHEAD, MAX_UPLOAD_BYTES, PART_BYTES, UploadBudget, Uploads

PROMPT = "the cat sat on the mat and the cat sat on the mat"


class Sink:
    def __init__(self):
        self.msgs: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, msg):
        problem = outgoing_problem(msg)
        assert problem is None, problem
        with self.lock:
            self.msgs.append(msg)

    def of(self, kind):
        with self.lock:
            return [m for m in self.msgs if m.get("type") == kind]

    def notices(self):
        return [m["text"] for m in self.of("notice") if m["level"] == "error"]


def wait_until(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    raise AssertionError("timed out")


@pytest.fixture()
def held_turn(tiny_model):
    """A managed session whose scheduler turn another thread holds until released (a long decode elsewhere)."""
    sched = RoundScheduler()
    ms = ManagedSession(lambda: Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1), scheduler=sched)
    ms.start(PROMPT, max_tokens=100, strategy="prompt-lookup")
    release, holding = threading.Event(), threading.Event()

    def other() -> None:
        with sched.turn("another page"):
            holding.set()
            release.wait(30)

    t = threading.Thread(target=other)
    yield ms, t, holding, release
    release.set()
    if t.is_alive():
        t.join(10)
    ms.close()


def test_a_heavy_message_runs_in_the_background_one_at_a_time(held_turn):
    ms, other, holding, release = held_turn
    sink = Sink()
    charged: list[int] = []
    core = InspectorCore(sink, ms, prompt=PROMPT, background=True, charge=charged.append)
    try:
        other.start()
        assert holding.wait(10)
        t0 = time.monotonic()
        core.handle({"type": "cmd", "cmd": "reset", "prompt": PROMPT + " again"})  # its decode waits for the turn
        assert time.monotonic() - t0 < 5, "handle returned while the reset waits"
        wait_until(lambda: core.working == "reset")
        assert any(m.get("working") == "reset" for m in sink.of("state")), "the page was told it is working"
        n = len(sink.msgs)
        core.handle({"type": "lane", "cmd": "branch"})  # a second heavy message
        core.handle({"type": "cmd", "cmd": "step"})  # a command
        core.handle({"type": "schema", "strategy": "ngram-simple"})  # a question: answered at once
        core.handle({"type": "cmd", "cmd": "pause"})  # always allowed
        refused = [t for t in sink.notices()[-2:]]
        assert len(refused) == 2 and all("still working on reset" in t for t in refused), refused
        assert sink.of("schema")[-1]["strategy"] == "ngram-simple"
        assert len(sink.msgs) > n
        assert core.workbench.lane is None and ms.round_index == 0, "nothing the refused messages asked for happened"
        release.set()
        assert core.wait_work(30)
        wait_until(lambda: sink.of("state")[-1].get("working") is None)
        assert ms.history[: len(ms.history)] and "again" in ms.model.detokenize(ms.history)
        assert charged and charged[-1] == len(ms.history), "the reset was charged the tokens it decoded"
    finally:
        core.close()


def test_without_background_every_message_runs_at_once_as_before(tiny_session):
    sink = Sink()
    core = InspectorCore(sink, tiny_session, prompt=PROMPT)
    core.handle({"type": "cmd", "cmd": "reset"})
    assert tiny_session.started and core.working is None
    assert all(m.get("working") is None for m in sink.of("state"))
    core.close()


def test_the_declaration_marks_what_grows_with_the_model_or_the_history():
    background = {
        ("cmd", "reset"),
        ("configure", None),
        ("rewind", None),
        ("lane", "branch"),
        ("lane", "compare"),
        ("lane", "configure"),
        ("lane", "close"),
        ("diagnose", None),
        ("advise", None),
        ("preset", None),
        ("file", "snapshot"),
        ("file", "record"),
    }
    always = {("hello", None), ("schema", None), ("plotly", None), ("cmd", "pause")}
    for t, v in background | always | {("cmd", "step"), ("lane", "step"), ("file", "restore")}:
        msg = {"type": t, "cmd": v} if v else {"type": t}
        work, _ = work_of(msg)
        expected = "background" if (t, v) in background else "always" if (t, v) in always else None
        assert work == expected, (t, v, work)


def test_the_gate_charges_work_per_page_and_per_address():
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    reg = GateRegistry(clock=clock, work_rate=100.0, work_burst=1000.0, factor=2.0)
    a, b = reg.page_gate("10.0.0.1"), reg.page_gate("10.0.0.1")
    c = reg.page_gate("10.0.0.2")
    reset = {"type": "cmd", "cmd": "reset"}
    assert a.check(reset) is None
    a.charge(1500)  # the reset decoded 1500 tokens: this page's allowance is spent
    refusal = a.check(reset)
    assert refusal and "share of the server's work" in refusal and "try again in" in refusal
    assert a.check({"type": "schema", "strategy": "none"}) is None, "a light message still passes"
    assert b.check(reset) is None, "another page of the same client still has its own allowance"
    b.charge(1000)  # together they spent the address's 2000
    assert b.check(reset) is not None and "share" in b.check(reset)
    assert c.check(reset) is None, "another client is not affected"
    now[0] += 10.0  # refilled: 1000 per page, 2000 per address
    assert a.check(reset) is None and b.check(reset) is None
    # an upload part is charged its bytes on arrival
    part = {"type": "file", "cmd": "restore", "id": "u", "index": 0, "count": 1, "data": "A" * 700_000}
    before = c.charged
    assert c.check(part) is None and c.charged - before >= 700_000 * 3 // 4 // (16 * 1024)
    # the registry keeps a bounded number of addresses
    small = GateRegistry(max_addresses=3)
    for i in range(10):
        small.page_gate(f"10.1.0.{i}")
    assert len(small._gates) == 3  # noqa: SLF001 - the bound itself is what is checked


def test_the_presenters_page_is_not_starved_by_its_address():
    """Viewers may share the presenter's address (a venue's NAT, this machine): their traffic drains the
    address's allowance, and the presenter's page, under no address's gate, still gets its commands in."""
    reg = GateRegistry(clock=lambda: 0.0, work_rate=100.0, work_burst=1000.0, factor=2.0)
    viewers = [reg.page_gate("10.0.0.1") for _ in range(3)]
    presenter = reg.presenter_gate()
    reset = {"type": "cmd", "cmd": "reset"}
    for v in viewers:
        v.charge(1000)
    assert viewers[0].check(reset) is not None, "the address's allowance is spent"
    assert presenter.check(reset) is None
    presenter.charge(1500)
    assert presenter.check(reset) is not None, "the presenter still has a page's own bounds"


@pytest.mark.slow
def test_a_refused_upload_part_is_asked_for_again_and_hellos_are_paced():
    now = [0.0]
    gate = MessageGate(work_rate=10.0, work_burst=10.0, clock=lambda: now[0])
    sent, handled = [], []
    front = Gated(gate, sent.append, handled.append, interval=1.0, clock=lambda: now[0])
    gate.charge(100)
    front({"type": "file", "cmd": "restore", "id": "u1", "index": 3, "count": 9, "data": "AAAA"})
    assert handled == [] and sent[-1]["type"] == "upload"
    assert sent[-1]["next"] == 3 and sent[-1]["retry_ms"] >= 250 and outgoing_problem(sent[-1]) is None
    # hellos: the first at once, the next ones wait (the newest wins) and come after the interval
    front({"type": "hello", "epoch": -1, "have": 0})
    assert handled == [{"type": "hello", "epoch": -1, "have": 0}]
    front({"type": "hello", "epoch": 0, "have": 1})
    front({"type": "hello", "epoch": 0, "have": 2})
    assert len(handled) == 1
    wait_until(lambda: len(handled) == 2, 5)
    assert handled[-1] == {"type": "hello", "epoch": 0, "have": 2}
    time.sleep(0.2)
    assert len(handled) == 2
    front.cancel()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_uploads_are_bounded_in_ids_bytes_and_age_and_the_header_is_checked_first(tiny_session):
    tiny_session.start(PROMPT, max_tokens=20)
    tiny_session.run(3)
    snap = tiny_session.snapshot()
    now = [0.0]
    up = Uploads(clock=lambda: now[0])
    parts = [snap[i : i + 4096] for i in range(0, len(snap), 4096)]
    assert len(parts) > 2
    assert up.add("u1", 0, len(parts), b64(parts[0])) == (1, None)
    assert up.held_bytes() == 4096
    with pytest.raises(MessageError, match="another upload"):  # one open upload per page
        up.add("u2", 0, len(parts), b64(parts[0]))
    now[0] += MAX_AGE + 1  # stale: forgotten, a new one may start
    assert up.add("u2", 0, len(parts), b64(parts[0])) == (1, None)
    assert up.open_ids == ["u2"]
    with pytest.raises(MessageError, match="at most"):  # a part larger than a part may be
        up.add("u2", 1, len(parts), b64(b"x" * (PART_BYTES + 1)))
    assert up.open_ids == [], "the upload that broke a bound is dropped"
    with pytest.raises(MessageError, match="MiB"):  # declared larger than the stated size: refused unread
        up.add("u3", 0, MAX_UPLOAD_BYTES // PART_BYTES + 1, b64(snap[:64]))
    # a header declared larger than the file (or than the limit) is refused from the first part
    forged = snap[:19] + (10**9).to_bytes(8, "little") + snap[27:64]
    with pytest.raises(MessageError, match="header"):
        up.add("u4", 0, 1, b64(forged))
    with pytest.raises(MessageError, match="not a specviz snapshot"):
        up.add("u5", 0, 1, b64(b"GIF89a" + b"\0" * 64))
    assert up.open_ids == [] and up.held_bytes() == 0
    # parts far ahead of the first missing one are refused (little is kept before the header is checked)
    with pytest.raises(MessageError, match="in order"):
        up.add("u6", MAX_AHEAD + 1, 100, b64(parts[1]))
    # every page's uploads share one budget
    budget = UploadBudget(limit=3 * 4096)
    pages = [Uploads(budget=budget), Uploads(budget=budget)]
    pages[0].add("a", 0, len(parts), b64(parts[0]))
    pages[0].add("a", 1, len(parts), b64(parts[1]))
    pages[1].add("b", 0, len(parts), b64(parts[0]))
    with pytest.raises(MessageError, match="as many uploads as it can"):
        pages[1].add("b", 1, len(parts), b64(parts[1]))
    assert budget.held == 2 * 4096 and pages[1].open_ids == []
    pages[0].close()
    assert budget.held == 0, "a page that went away gave its bytes back"
    # a whole upload, in parts out of order, comes back byte for byte
    one = Uploads()
    small = [snap[i : i + 4096] for i in range(0, len(snap), 4096)]
    order = [1, 0] + list(range(2, len(small)))
    for i in order:
        nxt, blob = one.add("s", i, len(small), b64(small[i]))
    assert blob == snap and one.open_ids == []


def test_no_server_path_reaches_a_page():
    text = "cannot read /home/alice/models/secret-model.gguf: bad"
    assert without_paths(text) == "cannot read secret-model.gguf: bad"
    assert without_paths("tokens/s at http://host:5006/x and a/b") == "tokens/s at http://host:5006/x and a/b"
    got = []
    send = scrubbed(got.append)
    send({"type": "notice", "level": "error", "text": "the snapshot was taken with model /srv/m/a.gguf"})
    send({"type": "knob_errors", "errors": {"draft_model": "no /opt/d/x.gguf"}, "general": "see /var/log/y.txt"})
    assert "/srv" not in str(got) and "/opt" not in str(got) and "/var" not in str(got)
    assert got[0]["text"].endswith("a.gguf") and got[1]["errors"]["draft_model"] == "no x.gguf"


class NeverDrainingDoc:
    """A page document whose next tick never comes (Bokeh's lock held by a write the page never reads)."""

    session_context = object()

    def add_next_tick_callback(self, cb):
        pass


def test_a_page_that_stops_reading_is_dropped_not_buffered(monkeypatch):
    from specviz.ui import panel_app
    from specviz.ui.panel_app import OrderedSender

    class Loop:
        def add_callback(self, cb):
            cb()

        def call_later(self, delay, cb):
            pass

    monkeypatch.setattr(panel_app.IOLoop, "current", staticmethod(lambda: Loop()))
    monkeypatch.setattr(OrderedSender, "_connected", lambda self: True)
    dropped = []
    sender = OrderedSender(object(), NeverDrainingDoc(), on_stall=lambda: dropped.append(1))
    part = {"type": "download", "id": "f", "name": "s.bin", "mime": "x", "index": 0, "count": 1, "data": "A" * 700_000}
    for _ in range(200):
        sender(part)
    assert sender.dropped and dropped == [1], "the page was dropped once its queue was full"
    assert sender.room(timeout=0.1) is False
    sender(part)  # nothing more is kept for it
    assert sender._queued_bytes == 0  # noqa: SLF001 - the bound itself is what is checked
