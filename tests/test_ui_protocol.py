"""The page protocol's declaration (widgets/protocol.json) from Python's side: each page message is validated
against it with an error naming the field and what it must be, and every message Python sends a page is
declared with the fields it sends (the whole to_page side, sent by a real session's inspector, workbench and
presenter mode)."""

from __future__ import annotations

import base64
import importlib.resources
import json

import pytest

from specviz import Session
from specviz.ui.core import InspectorCore
from specviz.ui.protocol import (
    MessageError,
    declaration,
    field,
    message_types,
    outgoing_problem,
    validate_incoming,
    variants,
)

PROMPT = "the cat of the dog and the a the cat of the"


def refusal(msg) -> str:
    with pytest.raises(MessageError) as e:
        validate_incoming(msg)
    return str(e.value)


def test_the_declaration_ships_in_the_package():
    text = (importlib.resources.files("specviz.static") / "protocol.json").read_text(encoding="utf-8")
    assert json.loads(text) == declaration()
    assert message_types()[:5] == ("hello", "cmd", "configure", "schema", "plotly")
    assert variants("cmd") == ("step", "run", "play", "pause", "reset")
    assert variants("file") == ("snapshot", "record", "restore")


@pytest.mark.parametrize(
    "msg, text",
    [
        ({"type": "hello", "have": 0}, "hello: 'epoch' must be an integer; got nothing"),
        ({"type": "hello", "epoch": 0, "have": -1}, "hello: 'have' must be an integer >= 0; got -1"),
        ({"type": "hello", "epoch": 0, "have": True}, "'have' must be an integer >= 0; got True"),
        ({"type": "cmd", "cmd": "run", "n": 0}, "cmd run: 'n' must be an integer in [1, 100000]; got 0"),
        ({"type": "cmd", "cmd": "run", "n": 2.0}, "'n' must be an integer in [1, 100000]; got 2.0"),
        ({"type": "cmd", "cmd": "run", "n": "8"}, "'n' must be an integer in [1, 100000]; got '8'"),
        ({"type": "cmd", "cmd": "reset", "max_tokens": 10**7}, "'max_tokens' must be an integer in [1, 1000000]"),
        ({"type": "cmd", "cmd": "reset", "top_k": 1.5}, "'top_k' must be an integer; got 1.5"),
        ({"type": "cmd", "cmd": "reset", "temperature": "hot"}, "'temperature' must be a number; got 'hot'"),
        ({"type": "cmd", "cmd": "reset", "stop": ["a"] * 17}, "'stop' must be a list of at most 16 texts"),
        ({"type": "cmd", "cmd": "reset", "stop": [3]}, "'stop' must be a list of at most 16 texts; got [3]"),
        ({"type": "cmd", "cmd": "reset", "chat": 1}, "'chat' must be true or false; got 1"),
        ({"type": "cmd", "cmd": "jump"}, "cmd: unknown command 'jump'; known commands: step, run, play, pause, reset"),
        ({"type": "cmd"}, "cmd: unknown command None"),
        ({"type": "configure", "knobs": {f"k{i}": 1 for i in range(65)}}, "'knobs' must be an object of knob values"),
        ({"type": "schema"}, "schema: 'strategy' must be a strategy name; got nothing"),
        ({"type": "rewind", "round": 1, "position": 2}, "rewind: give exactly one of 'round' and 'position'"),
        ({"type": "rewind"}, "rewind: give exactly one of 'round' and 'position'"),
        ({"type": "lane", "cmd": "compare", "knobs": 3}, "'knobs' must be an object of knob values (or 'name=value"),
        ({"type": "preset", "name": 5}, "preset: 'name' must be a preset's name; got 5"),
        ({"type": "file", "cmd": "restore", "id": "", "count": 1, "index": 0, "data": ""}, "'id' must be a short text"),
        ({"type": "file", "cmd": "restore", "id": "u", "count": 9000, "index": 0, "data": ""}, "[1, 2049]; got 9000"),
        ({"type": "file", "cmd": "restore", "id": "u", "count": 1, "index": 0}, "'data' must be a base64 part"),
        ({"type": "explode"}, "unknown type 'explode'; known types: hello, cmd, configure"),
        ([1], "not an object"),
    ],
)
def test_each_refusal_names_the_field_and_what_is_allowed(msg, text):
    assert text in refusal(msg)


def test_what_is_well_formed_passes_as_it_came():
    for msg in [
        {"type": "hello", "epoch": -1, "have": 0},
        {"type": "cmd", "cmd": "run", "n": 100_000},
        {"type": "cmd", "cmd": "run", "n": None},  # an optional field that is null is absent
        {"type": "cmd", "cmd": "step", "n": "ignored"},  # a field the variant does not declare is ignored
        {"type": "cmd", "cmd": "reset", "prompt": "", "max_tokens": None, "temperature": 0, "top_p": 0.5, "stop": []},
        {"type": "configure", "strategy": None, "knobs": None},
        {"type": "rewind", "position": 0, "round": None},
        {"type": "lane", "cmd": "configure", "strategy": None, "knobs": "draft_max=3"},
        {"type": "file", "cmd": "restore", "id": "u1", "count": 2049, "index": 5000, "data": "QQ=="},  # index < count
    ]:
        assert validate_incoming(msg) is msg


def test_ranged_integers_follow_the_knob_schema():
    n = field("cmd", "n", "run")
    assert (n.lo, n.hi, n.describe()) == (1, 100_000, "an integer in [1, 100000]")
    assert n.accepts(1) and n.accepts(100_000) and not n.accepts(100_001) and not n.accepts(0)
    assert not n.accepts(True) and not n.accepts(5.0) and not n.accepts("5"), "a page's integer is a JSON integer"


def test_outgoing_problems_name_the_type_and_field():
    assert outgoing_problem({"type": "notice", "level": "error", "text": "x"}) is None
    assert "declares no message 'hello' to the page" in outgoing_problem({"type": "hello", "epoch": 0, "have": 0})
    extra = {"type": "notice", "level": "info", "text": "", "colour": 1}
    assert "fields not declared: colour" in outgoing_problem(extra)
    assert "'text' must be text; got nothing" in outgoing_problem({"type": "notice", "level": "info"})
    bad_level = {"type": "notice", "level": "x", "text": ""}
    assert "'level' must be one of error, warning, info" in outgoing_problem(bad_level)
    state = {"type": "state", "replay": False, "running": False, "finished": None, "can_step": True, "can_reset": True}
    state.update(can_control=True, strategy="none", knobs={}, schema=[], strategies=["none"], pending=None, epoch=0)
    assert outgoing_problem({**state, "error": None}) is None
    assert "'error' must be text or null; got nothing" in outgoing_problem(state)
    assert "'finished' must be text or null; got 3" in outgoing_problem({**state, "error": None, "finished": 3})


class Every:
    """A sink that checks each message against the declaration and notes its type."""

    def __init__(self):
        self.types: set[str] = set()
        self.problems: list[str] = []

    def __call__(self, msg):
        problem = outgoing_problem(msg)
        if problem:
            self.problems.append(problem)
        self.types.add(msg["type"])
        if msg["type"] == "packed":
            for m in json.loads(msg["json"]):
                self(m)


def test_every_message_python_sends_is_declared_and_every_declared_one_is_sent(tiny_model):
    from specviz.server.presenter import SharedInspector

    presets = [{"name": "p", "title": "P", "prompt": PROMPT, "strategy": "none", "max_tokens": 6}]
    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, max_tokens=16, strategy="prompt-lookup")
    page = Every()
    core = InspectorCore(page, s, presets=presets, draft_models=["/d.gguf"])
    try:
        for msg in [
            {"type": "hello", "epoch": -1, "have": 0},
            {"type": "schema", "strategy": "ngram-simple"},
            {"type": "schema", "strategy": "nope"},
            {"type": "plotly"},
            {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": "3"}},
            {"type": "cmd", "cmd": "run", "n": 3},
            {"type": "cmd", "cmd": "jump"},
            {"type": "lane", "cmd": "branch", "round": 1},
            {"type": "lane", "cmd": "run"},
            {"type": "diagnose"},
            {"type": "advise"},
            {"type": "file", "cmd": "record"},
            {"type": "rewind", "round": 1},
            {"type": "preset", "name": "p"},
        ]:
            core.handle(msg)
            core.wait(60)
        blob = s.snapshot()
        core.handle({"type": "file", "cmd": "snapshot"})
        data = base64.b64encode(blob).decode()
        core.handle({"type": "file", "cmd": "restore", "id": "u", "index": 0, "count": 1, "data": data})
        core.handle({"type": "hello", "epoch": -1, "have": 0})
    finally:
        core.close()
        s.close()
    # presenter mode: states with a role and an audience, the viewers' packed batches, and the replay's state
    s2 = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s2.start(PROMPT, max_tokens=8, strategy="prompt-lookup")
    sh = SharedInspector(s2, prompt=PROMPT, viewer_interval=0.05)
    try:
        presenter, viewer = sh.attach(page, "presenter"), sh.attach(page, "viewer")
        sh.handle(viewer, {"type": "hello", "epoch": -1, "have": 0})
        sh.handle(presenter, {"type": "cmd", "cmd": "run", "n": 2})
        sh.core.wait(60)
        sh.flush()
        replay = InspectorCore(page, events=list(s2.events))
        replay.handle({"type": "hello", "epoch": -1, "have": 0})
        replay.handle({"type": "cmd", "cmd": "reset"})
        replay.close()
    finally:
        sh.close()
        s2.close()
    assert page.problems == []
    assert page.types == set(declaration()["to_page"]), "every declared message is one Python sends"
