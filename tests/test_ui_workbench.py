"""The inspector's workbench messages (specviz.ui.workbench) over a live session and a recording."""

from __future__ import annotations

import base64
import json

import pytest
from declared_messages import sent_messages_are_declared  # noqa: F401 (an autouse fixture)
from test_ui_messages import Sink, error_shown, notices, snapshot

from specviz import Session
from specviz.decoding.events import event_from_dict
from specviz.ui.core import InspectorCore

PROMPT = "the cat of the dog and the a the cat of the"
PRESETS = [
    {
        "name": "good",
        "title": "Good case",
        "prompt": PROMPT,
        "strategy": "ngram-simple",
        "knobs": {"size_n": 2, "size_m": 6},
        "max_tokens": 30,
    },
    {"name": "sampled", "title": "Sampled", "prompt": "a b c", "strategy": "none", "temperature": 0.7, "seed": 5},
]


@pytest.fixture()
def live(tiny_model):
    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, max_tokens=40, strategy="prompt-lookup", draft_max=6)
    sink = Sink()
    core = InspectorCore(sink, s, presets=PRESETS)
    yield core, sink
    core.close()
    s.close()


def of_type(msgs, t):
    return [m for m in msgs if m["type"] == t]


def refused(core, sink, msg, text):
    before = snapshot(core)
    n = len(sink.msgs)
    core.handle(msg)
    answer = sink.msgs[n:]
    assert error_shown(answer) and any(text in x for x in notices(answer)), (msg, answer)
    assert snapshot(core) == before


def test_rewind_messages(live):
    core, sink = live
    core.step(6)
    s = core.session
    n = len(sink.msgs)
    core.handle({"type": "rewind", "round": 2})
    assert s.round_index == 2 and core.log[-1]["kind"] == "rewound" and core.log[-1]["round"] == 2
    sent = [e for m in of_type(sink.msgs[n:], "events") for e in m["events"]]
    assert [e["kind"] for e in sent] == ["rewound"]
    core.handle({"type": "rewind", "position": len(s.prompt_tokens) + 1})
    assert len(s.tokens) == 1
    for msg, text in [
        ({"type": "rewind", "round": 99}, "outside the committed rounds"),
        ({"type": "rewind"}, "exactly one of"),
        ({"type": "rewind", "round": 1, "position": 3}, "exactly one of"),
        ({"type": "rewind", "round": "1"}, "'round' must be an integer"),
        ({"type": "rewind", "position": 1}, "outside the committed range"),
    ]:
        refused(core, sink, msg, text)
    r = s.round_index
    core.step(2)  # still usable
    assert s.round_index == r + 2


def test_lanes_branch_step_compare_close(live):
    core, sink = live
    core.step(4)
    core.handle({"type": "lane", "cmd": "branch", "round": 2})
    wb = core.workbench
    assert wb.lane is not None and wb.lane.round_index == 2
    cmp = of_type(sink.msgs, "comparison")[-1]
    assert cmp["lane"]["open"] and cmp["data"]["b"]["strategy"] == "prompt-lookup"
    core.handle({"type": "lane", "cmd": "configure", "strategy": "ngram-cache", "knobs": "n_draft=3"})
    assert wb.lane.generation.pending[0] == "ngram-cache"
    core.handle({"type": "lane", "cmd": "step"})
    core.wait(30)
    assert wb.lane.round_index == 3 and core.session.round_index == 5 and wb.lane.strategy == "ngram-cache"
    core.handle({"type": "lane", "cmd": "run"})
    core.wait(60)
    assert wb.lane.finished and core.session.finished
    data = of_type(sink.msgs, "comparison")[-1]["data"]
    assert data["a"]["tokens"] == core.session.tokens and data["b"]["tokens"] == wb.lane.tokens
    assert data["first_divergence"] is None  # greedy on the tiny model: the same text
    assert any("ngram-cache" in w for w in data["words"])
    # compare from the start with another setting: both lanes run to their end
    core.handle({"type": "lane", "cmd": "compare", "strategy": "prompt-lookup", "knobs": "draft_max=2"})
    core.wait(60)
    assert wb.lane.knobs["draft_max"] == 2 and wb.lane.finished
    assert any(w.startswith("B differs from A in draft_max 6 → 2") for w in wb.comparison["words"])
    for msg, text in [
        ({"type": "lane", "cmd": "fly"}, "unknown command"),
        ({"type": "lane", "cmd": "configure", "knobs": "draft_max"}, "is not name=value"),
        ({"type": "lane", "cmd": "configure", "knobs": {"draft_max": "0"}}, "draft_max"),
        ({"type": "lane", "cmd": "configure", "knobs": {"nonsense": 1}}, "unknown knob"),
    ]:
        refused(core, sink, msg, text)
    core.handle({"type": "lane", "cmd": "close"})
    assert wb.lane is None and of_type(sink.msgs, "comparison")[-1]["data"] is None
    refused(core, sink, {"type": "lane", "cmd": "step"}, "no second lane")


def test_diagnosis_advice_presets_and_hello(live):
    core, sink = live
    core.step(40)
    assert core.session.finished
    diag = of_type(sink.msgs, "diagnosis")  # sent when the generation finished
    assert diag and diag[-1]["data"]["drafted"] == core.session.telemetry_dict()["drafted"]
    core.handle({"type": "advise"})
    adv = of_type(sink.msgs, "advice")[-1]["data"]
    assert adv["cost_source"].startswith("measured") and adv["llama_cpp_flags"].startswith("--spec-type")
    assert adv["reason"] and adv["pays"] == (adv["best"]["strategy"] != "none")  # the panel shows why
    assert adv["load"]["fresh_level"] is not None  # the live session's curve is checked against its rounds
    core.handle({"type": "preset", "name": "good"})
    assert core.session.strategy == "ngram-simple" and core.session.knobs["size_m"] == 6
    core.handle({"type": "preset", "name": "sampled"})
    st = core.log[0]
    assert st["kind"] == "session_started" and st["temperature"] == 0.7 and st["seed"] == 5
    refused(core, sink, {"type": "preset", "name": "nope"}, "unknown preset")
    n = len(sink.msgs)
    core.handle({"type": "hello", "epoch": -1, "have": 0})
    kinds = [m["type"] for m in sink.msgs[n:]]
    assert "presets" in kinds and "diagnosis" in kinds and "advice" in kinds
    assert of_type(sink.msgs[n:], "presets")[0]["presets"][0] == {
        "name": "good",
        "title": "Good case",
        "description": "",
    }


def test_reset_passes_sampling_stop_and_chat(live):
    core, sink = live
    core.handle(
        {
            "type": "cmd",
            "cmd": "reset",
            "temperature": 0.8,
            "top_k": 7,
            "top_p": 0.9,
            "seed": 11,
            "stop": ["zz"],
            "max_tokens": 12,
        }
    )
    st = core.log[0]
    assert (st["temperature"], st["top_k"], st["top_p"], st["seed"], st["stop"]) == (0.8, 7, 0.9, 11, ["zz"])
    core.handle({"type": "cmd", "cmd": "reset"})  # the same settings again
    st = core.log[0]
    assert (st["temperature"], st["top_k"], st["top_p"], st["seed"]) == (0.8, 7, 0.9, 11)
    for msg, text in [
        ({"type": "cmd", "cmd": "reset", "top_k": "5"}, "'top_k' must be an integer"),
        ({"type": "cmd", "cmd": "reset", "top_p": 1.5}, "top_p"),
        ({"type": "cmd", "cmd": "reset", "temperature": -1}, "temperature"),
        ({"type": "cmd", "cmd": "reset", "stop": "x"}, "'stop' must be a list"),
        ({"type": "cmd", "cmd": "reset", "chat": "yes"}, "'chat' must be true or false"),
        ({"type": "cmd", "cmd": "reset", "chat": True}, "has no chat template"),
    ]:
        refused(core, sink, msg, text)


def test_snapshot_and_record_downloads_and_restore_upload(live, tiny_model):
    core, sink = live
    core.step(5)
    s = core.session
    core.handle({"type": "file", "cmd": "snapshot"})
    parts = of_type(sink.msgs, "download")
    assert parts and parts[0]["name"] == "specviz-snapshot.bin" and len(parts) == parts[0]["count"]
    blob = b"".join(base64.b64decode(p["data"]) for p in sorted(parts, key=lambda p: p["index"]))
    r = Session.restore(blob, model=tiny_model)
    assert r.history == s.history
    r.close()
    n = len(sink.msgs)
    core.handle({"type": "file", "cmd": "record"})
    rec = of_type(sink.msgs[n:], "download")
    text = b"".join(base64.b64decode(p["data"]) for p in rec).decode()
    assert [event_from_dict(json.loads(x)) for x in text.splitlines()] == s.events
    # go on, then load the snapshot back in two parts
    core.step(3)
    epoch = core.epoch
    b64 = base64.b64encode(blob).decode()
    half = len(b64) // 8 * 4
    core.handle({"type": "file", "cmd": "restore", "id": "u1", "index": 1, "count": 2, "data": b64[half:]})
    assert s.round_index == 8  # not all parts yet
    core.handle({"type": "file", "cmd": "restore", "id": "u1", "index": 0, "count": 2, "data": b64[:half]})
    assert s.round_index == 5 and core.epoch == epoch + 1 and len(core.log) == len(s.events)
    last = of_type(sink.msgs, "events")[-1]
    assert last["epoch"] == core.epoch and last["start"] == 0
    core.step(1)
    assert s.round_index == 6
    bad = base64.b64encode(b"not a snapshot").decode()
    refused(core, sink, {"type": "file", "cmd": "restore", "id": "u2", "index": 0, "count": 1, "data": bad}, "restore:")
    refused(core, sink, {"type": "file", "cmd": "restore", "id": "u3", "index": 2, "count": 2, "data": ""}, "'index'")
    refused(core, sink, {"type": "file", "cmd": "burn"}, "unknown command")


def test_a_recording_is_diagnosed_but_not_rewound(tiny_model):
    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, max_tokens=30, strategy="prompt-lookup")
    s.run()
    sink = Sink()
    core = InspectorCore(sink, events=list(s.events))
    core.handle({"type": "diagnose"})
    assert of_type(sink.msgs, "diagnosis")[-1]["data"]["drafted"] == s.telemetry_dict()["drafted"]
    core.handle({"type": "advise"})
    assert of_type(sink.msgs, "advice")[-1]["data"]["cost_source"] == "fitted to the recorded verify times"
    for msg in ({"type": "rewind", "round": 1}, {"type": "lane", "cmd": "branch"}, {"type": "file", "cmd": "snapshot"}):
        n = len(sink.msgs)
        core.handle(msg)
        assert any("recording cannot be" in t for t in notices(sink.msgs[n:])), msg
    core.handle({"type": "file", "cmd": "record"})
    assert of_type(sink.msgs, "download")
    s.close()


def test_demo_presets_are_valid_settings():
    from specviz.strategies import check_knob_rules, strategy_class, strategy_schema
    from specviz.ui.presets import demo_presets

    ps = demo_presets()
    assert [p["name"] for p in ps] == ["quote", "summarise-fixed", "summarise-cost"]
    assert [p["name"] for p in demo_presets(["good.gguf", "bad.gguf"])][-1] == "bad-draft"
    for p in ps:
        cfg = strategy_schema(p["strategy"]).validate(p["knobs"])
        check_knob_rules(strategy_class(p["strategy"]), cfg)
        assert p["prompt"] and p["max_tokens"] > 0 and p["title"] and p["description"]
    # the demo opens on the paying case, and the cost policy preset differs from the losing one only by it
    assert ps[0]["knobs"]["draft_policy"] == "fixed" and ps[2]["knobs"] == {**ps[1]["knobs"], "draft_policy": "cost"}
