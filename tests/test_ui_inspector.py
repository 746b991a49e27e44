"""Python side of the inspector: what is sent to the front-end, the controls, knob validation, replay.

The front-end only ever sees messages, so these tests capture the messages a real session (the tiny
llama.cpp fixture) makes the inspector send and check them against the session's own events.
"""

from __future__ import annotations

import importlib.resources
import time

import pytest
from declared_messages import check_sent, sent_messages_are_declared  # noqa: F401 (an autouse fixture)

pytest.importorskip("anywidget")

from specviz.decoding.recorder import Recorder  # noqa: E402
from specviz.ui.core import InspectorCore  # noqa: E402
from specviz.ui.sources import group_rounds  # noqa: E402

PROMPT = "the cat sat on the mat and the cat sat"


class Sink:
    """Collects the messages a core sends."""

    def __init__(self):
        self.msgs: list[dict] = []

    def __call__(self, msg):
        check_sent(msg)
        self.msgs.append(msg)

    def of(self, t):
        return [m for m in self.msgs if m["type"] == t]

    def events(self):
        out = []
        for m in self.of("events"):
            out.extend(m["events"])
        return out


@pytest.fixture()
def started(tiny_session):
    tiny_session.start(PROMPT, max_tokens=40, strategy="prompt-lookup")
    return tiny_session


def test_each_round_is_sent_once_and_matches_the_session(started):
    sink = Sink()
    core = InspectorCore(sink, started)
    core.handle({"type": "hello", "epoch": -1, "have": 0})
    assert sink.events() == [e.to_dict() for e in started.events]  # the backlog: SessionStarted
    n_before = len(sink.of("events"))
    assert core.step(5) == 5
    new_msgs = sink.of("events")[n_before:]
    assert len(new_msgs) == 5, "one message per round"
    expected_start = 1
    for m in new_msgs:
        assert m["start"] == expected_start, "messages are contiguous and never overlap"
        expected_start += len(m["events"])
        rounds = {e["round"] for e in m["events"] if e["kind"] != "knobs_changed"}
        assert len(rounds) == 1
    # everything the front-end got, in order, is exactly the session's event stream
    assert sink.events() == [e.to_dict() for e in started.events]
    assert core.log == [e.to_dict() for e in started.events]


def test_rounds_run_outside_the_inspector_are_sent_too(started):
    sink = Sink()
    InspectorCore(sink, started)
    started.step()
    started.step()
    kinds = [e["kind"] for e in sink.events()]
    assert kinds.count("telemetry") == 2
    assert sink.events() == [e.to_dict() for e in started.events[1:]]


def test_a_view_that_holds_events_gets_only_the_rest(started):
    sink = Sink()
    core = InspectorCore(sink, started)
    core.step(4)
    have = 7
    sink.msgs.clear()
    core.handle({"type": "hello", "epoch": core.epoch, "have": have})
    evs = sink.of("events")
    assert evs and evs[0]["start"] == have
    assert sink.events() == [e.to_dict() for e in started.events[have:]]
    # a view of another epoch (before a reset) gets everything of the current one
    sink.msgs.clear()
    core.handle({"type": "hello", "epoch": core.epoch + 5, "have": have})
    assert sink.of("events")[0]["start"] == 0


def test_anywidget_inspector_state_after_n_steps(started, monkeypatch):
    from specviz.ui import Inspector

    insp = Inspector(started)
    sent: list[dict] = []
    monkeypatch.setattr(insp, "send", lambda content, buffers=None: sent.append(content))
    insp.core._send = lambda m: sent.append(m)
    insp.step(3)
    assert insp.log == [e.to_dict() for e in started.events]
    rounds = [e for e in insp.log if e["kind"] == "telemetry"]
    assert len(rounds) == 3
    state = [m for m in sent if m["type"] == "state"][-1]
    assert state["strategy"] == "prompt-lookup" and state["can_step"] and not state["running"]
    assert state["schema"] == started.schema()
    insp.close()


def test_inspector_starts_a_session_from_a_prompt(tiny_session):
    from specviz.ui import Inspector

    insp = Inspector(tiny_session, prompt="hello hello hello", max_tokens=8, strategy="prompt-lookup", draft_max=4)
    assert tiny_session.started and tiny_session.knobs["draft_max"] == 4
    assert insp.log[0]["kind"] == "session_started"
    insp.close()


def test_invalid_knob_is_reported_per_field_and_changes_nothing(started):
    sink = Sink()
    core = InspectorCore(sink, started)
    before = dict(started.knobs)
    errs = core.configure_from_form("prompt-lookup", {"draft_max": "0", "min_ngram": "abc", "max_ngram": "3"})
    assert set(errs) == {"draft_max", "min_ngram"}
    assert "draft_max" in errs["draft_max"] and "[1, 1024]" in errs["draft_max"] and "0" in errs["draft_max"]
    msg = sink.of("knob_errors")[-1]
    assert msg["errors"] == errs and msg["general"].startswith("nothing changed")
    core.step(1)
    assert started.knobs == before
    assert not [e for e in started.events if e.kind == "knobs_changed"]
    # empty field, unknown strategy, cross-knob rule
    assert "draft_max" in core.configure_from_form("prompt-lookup", {"draft_max": ""})
    assert "strategy" in core.configure_from_form("no-such-strategy", {})
    assert "draft_min" in core.configure_from_form("prompt-lookup", {"draft_min": "9", "draft_max": "3"})
    core.step(1)
    assert started.knobs == before


def test_valid_knob_applies_at_the_next_round_boundary(started):
    sink = Sink()
    core = InspectorCore(sink, started)
    assert core.configure_from_form("prompt-lookup", {"draft_max": "3", "min_ngram": "1"}) == {}
    assert core.state()["pending"] == "draft_max=3"
    assert started.knobs["draft_max"] != 3  # not yet: applied at the round boundary
    core.step(1)
    changed = [e for e in sink.events() if e["kind"] == "knobs_changed"]
    assert len(changed) == 1 and changed[0]["knobs"]["draft_max"] == 3
    assert started.knobs["draft_max"] == 3
    assert core.state()["pending"] is None
    assert sink.of("state")[-1]["knobs"]["draft_max"] == 3
    # switching strategy through the form
    assert core.configure_from_form("none", {}) == {}
    core.step(1)
    assert started.strategy == "none"


def test_schema_request_describes_the_strategy(started):
    sink = Sink()
    core = InspectorCore(sink, started)
    core.handle({"type": "schema", "strategy": "ngram-simple"})
    m = sink.of("schema")[-1]
    from specviz.strategies import strategy_schema

    assert m["knobs"] == strategy_schema("ngram-simple").to_list()
    core.handle({"type": "schema", "strategy": "nope"})
    assert "nope" in sink.of("schema")[-1]["error"]


def test_play_runs_in_the_background_and_pause_stops_after_the_round(tiny_session):
    tiny_session.start(PROMPT, max_tokens=400, strategy="prompt-lookup")
    sink = Sink()
    core = InspectorCore(sink, tiny_session)
    core.handle({"type": "cmd", "cmd": "play"})
    deadline = time.monotonic() + 30
    while len([e for e in core.log if e["kind"] == "telemetry"]) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert core.running or tiny_session.finished  # the caller was not blocked
    core.handle({"type": "cmd", "cmd": "pause"})
    core.wait(30)
    assert not core.running
    n = len(tiny_session.events)
    time.sleep(0.1)
    assert len(tiny_session.events) == n, "no round after Pause"
    # every event of a completed round was sent
    assert sink.events() == [e.to_dict() for e in tiny_session.events[1:]]
    assert sink.of("state")[-1]["running"] is False
    # Run N steps exactly N rounds in the background
    rounds = tiny_session.round_index
    core.handle({"type": "cmd", "cmd": "run", "n": 4})
    core.wait(30)
    assert tiny_session.round_index == rounds + 4


def test_play_stops_when_the_generation_finishes(tiny_session):
    tiny_session.start(PROMPT, max_tokens=12, strategy="prompt-lookup")
    core = InspectorCore(Sink(), tiny_session)
    core.play()
    core.wait(30)
    assert tiny_session.finished == "max_tokens"
    assert core.log[-1]["kind"] == "finished"
    assert core.state()["can_step"] is False


def test_reset_starts_a_new_epoch_with_the_same_or_a_new_prompt(started):
    sink = Sink()
    core = InspectorCore(sink, started)
    core.step(2)
    ids = list(started.prompt_tokens)
    core.handle({"type": "cmd", "cmd": "reset", "prompt": core.state()["prompt"], "max_tokens": 20})
    assert core.epoch == 1
    assert core.log == [started.events[0].to_dict()]
    assert list(started.prompt_tokens) == ids and started.max_tokens == 20
    last = sink.of("events")[-1]
    assert last["epoch"] == 1 and last["start"] == 0 and last["events"][0]["kind"] == "session_started"
    core.reset("hello hello hello")
    assert core.epoch == 2 and started.prompt_tokens != ids


def test_replay_shows_a_recording_and_steps_through_it(started, tmp_path):
    from specviz.ui import Inspector

    path = tmp_path / "rec.jsonl"
    rec = Recorder(path)
    for e in started.events:
        rec(e)
    unsub = started.subscribe(rec)
    started.run(6)
    unsub()
    rec.close()
    recorded = [e.to_dict() for e in started.events]

    insp = Inspector.replay(path)
    sent: list[dict] = []
    insp.core._send = sent.append
    assert insp.session is None
    assert insp.log == recorded
    insp.core.handle({"type": "hello", "epoch": -1, "have": 0})
    got = [e for m in sent if m["type"] == "events" for e in m["events"]]
    assert got == recorded
    st = [m for m in sent if m["type"] == "state"][-1]
    assert st["replay"] and not st["can_control"] and not st["can_step"]
    # rewind, then step one round at a time
    groups = group_rounds(started.events)
    insp.reset()
    assert insp.log == [e.to_dict() for e in groups[0]]
    insp.step(1)
    assert insp.log == [e.to_dict() for g in groups[:2] for e in g]
    # a recording cannot be reconfigured
    assert "strategy" in insp.configure("prompt-lookup", draft_max=2)
    insp.close()


def test_front_end_files_ship_in_the_package():
    from specviz.ui.bundle import source_files
    from specviz.ui.core import static_text

    static = importlib.resources.files("specviz.static")
    js = static_text("inspector.js")  # assembled from the source modules shipped in specviz.static/inspector/
    css = (static / "inspector.css").read_text(encoding="utf-8")
    assert "export default" in js and "function render" in js
    assert ".specviz-inspector" in css
    sources = [(static / "inspector" / p).read_text(encoding="utf-8") for p in source_files()]
    for text in [js, *sources]:
        # the SVG namespace is a name (createElementNS's), never fetched; any other address would be a load
        text = text.replace('"http://www.w3.org/2000/svg"', "")
        assert "http://" not in text and "https://" not in text, "nothing is loaded from the network"
    assert "@import" not in css and "url(" not in css


def test_plotly_is_sent_from_the_installed_package(started):
    sink = Sink()
    core = InspectorCore(sink, started)
    core.handle({"type": "plotly"})
    src = sink.of("plotly")[0]["source"]
    assert "plotly" in src[:500].lower() and len(src) > 1_000_000


def test_panel_component_wraps_the_same_core(started):
    pytest.importorskip("panel")
    from specviz.ui.core import static_text
    from specviz.ui.panel_app import InspectorComponent

    comp = InspectorComponent(started)
    assert comp._esm == static_text("inspector.js")
    sent = []
    comp.core._send = sent.append
    comp._handle_msg({"type": "cmd", "cmd": "step"})
    comp.core.wait(30)
    assert [e["kind"] for e in comp.core.log].count("telemetry") == 1
    assert any(m["type"] == "events" for m in sent)


def test_draft_models_are_offered_in_the_state_and_found_in_the_derived_cache(started, tmp_path, monkeypatch):
    from specviz.server.app import derived_drafts_dir, draft_candidates

    sink = Sink()
    core = InspectorCore(sink, started, draft_models=["/models/a.gguf"])
    core.handle({"type": "hello", "epoch": 0, "have": 0})
    state = [m for m in sink.msgs if m["type"] == "state"][-1]
    assert state["draft_models"] == ["/models/a.gguf"]
    # drafts derived from the target are found by the target's file stem, explicit ones first
    monkeypatch.setenv("SPECVIZ_MODEL_CACHE", str(tmp_path / "cache"))
    d = derived_drafts_dir()
    d.mkdir(parents=True)
    (d / "target-keep-0-1.gguf").write_bytes(b"")
    (d / "other-keep-0.gguf").write_bytes(b"")
    assert draft_candidates(tmp_path / "target.gguf", ["/x/mine.gguf"]) == [
        "/x/mine.gguf",
        str(d / "target-keep-0-1.gguf"),
    ]


def test_a_state_read_before_a_newer_equal_one_is_never_sent_after_it(started):
    # A thread reads the state (seq 2: "running"), then another reads a newer one (seq 3) equal to what the
    # page already holds, which is not sent again. The older read must then be dropped: sent after the
    # newer one it would leave the page showing "running" (Play and Step disabled) when nothing runs.
    import threading

    sink = Sink()
    core = InspectorCore(sink, started)
    core.handle({"type": "hello", "epoch": -1, "have": 0})
    held = core.state()
    assert sink.of("state")[-1] == {**held, "seq": 1}
    running = {**held, "running": True}
    reading, release = threading.Event(), threading.Event()

    def slow_running_state() -> dict:
        reading.set()
        release.wait(10)
        return running

    core.state = slow_running_state  # type: ignore[method-assign]
    t = threading.Thread(target=core._send_state)
    t.start()
    assert reading.wait(10)
    core.state = lambda: dict(held)  # type: ignore[method-assign]
    core._send_state()  # seq 3, equal to what the page holds: nothing to send
    release.set()
    t.join(10)
    states = sink.of("state")
    assert [s["seq"] for s in states] == [1]
    assert all(not s["running"] for s in states)
