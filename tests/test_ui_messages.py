"""Malformed and out-of-order messages from the page: each is refused with an error shown, and changes nothing.

The inspector's Python side trusts nothing a page sends. These tests feed :class:`InspectorCore` hand-picked
bad messages and random sequences of messages (hypothesis) over a live session on the tiny llama.cpp
fixture and over a recording, and check after every message: no exception escaped ``handle``; a message
that must be refused produced an error the page shows; and a message answered with an error left the
session (tokens, knobs, pending change, events) and the inspector's log as they were.

Rounds run in the inspector's background worker. To check "changed nothing" while a worker is running,
the session's ``step`` waits on a gate that the tests open only when they let the worker run.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from declared_messages import check_sent, sent_messages_are_declared  # noqa: F401 (an autouse fixture)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from specviz.strategies import strategy_names, strategy_schema
from specviz.ui.core import InspectorCore
from specviz.ui.protocol import field, message_types, variants

# the bounds the page protocol declares (widgets/protocol.json)
MESSAGE_TYPES = message_types()
COMMANDS = variants("cmd")
MAX_RUN = field("cmd", "n", "run").hi
MAX_TOKENS = field("cmd", "max_tokens", "reset").hi

PROMPT = "the cat sat on the mat and the cat sat"


class Sink:
    """Collects the messages a core sends."""

    def __init__(self):
        self.msgs: list[dict] = []

    def __call__(self, msg):
        check_sent(msg)
        self.msgs.append(msg)


def error_shown(msgs: list[dict]) -> bool:
    """Did the page get an error to show: a notice of level error, errors beside the knob form or the strategy?"""
    return any(
        (m["type"] == "notice" and m["level"] == "error")
        or (m["type"] == "knob_errors" and m["errors"])
        or (m["type"] == "schema" and m.get("error"))
        for m in msgs
    )


class Gate:
    """Holds the inspector's worker at the start of each round until opened, so nothing changes meanwhile."""

    def __init__(self, session):
        self.open = threading.Event()
        step = session.step

        def gated_step():
            if not self.open.wait(60):
                raise TimeoutError("the test never opened the gate")
            return step()

        session.step = gated_step

    def step(self, core: InspectorCore, n: int) -> None:
        """Run ``n`` rounds now, in this thread (the Python API, not a message)."""
        self.open.set()
        core.step(n)
        self.open.clear()

    def drain(self, core: InspectorCore) -> None:
        """Let the worker run to its end, then close the gate again."""
        self.open.set()
        core.wait(60)
        assert not core.running, "the worker did not stop"
        self.open.clear()


def snapshot(core: InspectorCore) -> dict[str, Any]:
    """What a refused message must not change: the session's state and events, the inspector's log."""
    snap: dict[str, Any] = {
        "epoch": core.epoch,
        "log": list(core.log),
        "pending": core.pending,
    }
    s = core.session
    if s is None:
        snap["pos"] = core.source.position
    else:
        snap.update(
            prompt=core.source.prompt_text,
            history=list(s.history),
            knobs=dict(s.knobs),
            strategy=s.strategy,
            finished=s.finished,
            started=s.started,
            rounds=s.round_index,
            events=list(s.events),
            queued=getattr(s, "generation", s).pending,  # a Session's generation, or a served session's own
            max_tokens=s.max_tokens,
        )
    return snap


def must_refuse(msg: Any) -> bool:
    """Whether ``msg`` is malformed whatever the session's state (an independent statement of the rules)."""

    def is_int(v, lo=None, hi=None):
        return isinstance(v, int) and not isinstance(v, bool) and (lo is None or v >= lo) and (hi is None or v <= hi)

    if not isinstance(msg, dict) or msg.get("type") not in MESSAGE_TYPES:
        return True
    t = msg["type"]
    if t == "hello":
        return not is_int(msg.get("epoch")) or not is_int(msg.get("have"), 0)
    if t == "cmd":
        cmd = msg.get("cmd")
        if cmd not in COMMANDS:
            return True
        if cmd == "run" and msg.get("n") is not None and not is_int(msg.get("n"), 1, MAX_RUN):
            return True
        if cmd == "reset":
            p, mt = msg.get("prompt"), msg.get("max_tokens")
            return not (p is None or isinstance(p, str)) or not (mt is None or is_int(mt, 1, MAX_TOKENS))
        return False
    if t == "configure":
        s, k = msg.get("strategy"), msg.get("knobs")
        return not (s is None or isinstance(s, str)) or not (k is None or isinstance(k, dict))
    if t == "schema":
        return not isinstance(msg.get("strategy"), str)
    return False


def check(core: InspectorCore, sink: Sink, msg: Any, *, busy: bool = False) -> list[dict]:
    """Send ``msg``; check the invariants; return what the core answered."""
    before = snapshot(core)
    n = len(sink.msgs)
    core.handle(msg)  # must not raise
    answer = sink.msgs[n:]
    if must_refuse(msg):
        assert error_shown(answer), f"{msg!r} was not refused with an error: {answer!r}"
    if (
        busy
        and isinstance(msg, dict)
        and msg.get("type") == "cmd"
        and msg.get("cmd") in ("step", "run", "play", "reset")
    ):
        assert error_shown(answer), f"{msg!r} while a worker runs was not refused: {answer!r}"
    if error_shown(answer):
        assert snapshot(core) == before, f"{msg!r} was refused but changed something"
    return answer


@pytest.fixture()
def live(tiny_model):
    """A started session on the tiny model with a gated inspector over it."""
    from specviz import Session

    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, max_tokens=24, strategy="prompt-lookup")
    gate = Gate(s)
    sink = Sink()
    core = InspectorCore(sink, s)
    yield core, sink, gate
    gate.open.set()
    core.close()
    s.ctx.close()


def notices(msgs):
    return [m["text"] for m in msgs if m["type"] == "notice" and m["level"] == "error"]


# -- hand-picked messages ----------------------------------------------------------------------------------

BAD = [
    None,
    3,
    "step",
    ["cmd", "step"],
    {},
    {"type": None},
    {"type": 7},
    {"type": "explode"},
    {"type": ["cmd"]},
    {"type": "hello"},
    {"type": "hello", "epoch": "0", "have": 0},
    {"type": "hello", "epoch": 0, "have": -1},
    {"type": "hello", "epoch": 0, "have": True},
    {"type": "hello", "epoch": 0.5, "have": 0},
    {"type": "hello", "epoch": 0, "have": 10**30},
    {"type": "cmd"},
    {"type": "cmd", "cmd": "jump"},
    {"type": "cmd", "cmd": 1},
    {"type": "cmd", "cmd": "run", "n": 0},
    {"type": "cmd", "cmd": "run", "n": -5},
    {"type": "cmd", "cmd": "run", "n": 2.5},
    {"type": "cmd", "cmd": "run", "n": "8"},
    {"type": "cmd", "cmd": "run", "n": 10**12},
    {"type": "cmd", "cmd": "run", "n": True},
    {"type": "cmd", "cmd": "reset", "prompt": 5},
    {"type": "cmd", "cmd": "reset", "prompt": ["a"]},
    {"type": "cmd", "cmd": "reset", "max_tokens": 0},
    {"type": "cmd", "cmd": "reset", "max_tokens": -3},
    {"type": "cmd", "cmd": "reset", "max_tokens": 10**20},
    {"type": "cmd", "cmd": "reset", "max_tokens": "12"},
    {"type": "configure", "strategy": 5, "knobs": {}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": [1, 2]},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": "draft_max=3"},
    {"type": "configure", "strategy": "no-such-strategy", "knobs": {}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": "0"}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": 10**40}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": [3]}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": {"v": 3}}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": None}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": float("nan")}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": {"no_such_knob": 1}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": {"x" * 10_000: 1}},
    {"type": "configure", "strategy": "prompt-lookup", "knobs": {f"k{i}": 1 for i in range(100)}},
    {"type": "configure", "strategy": "draft", "knobs": {"draft_model": "/no/such/draft.gguf"}},
    {"type": "configure", "strategy": "draft", "knobs": {"draft_model": "bad\x00path"}},
    {"type": "schema"},
    {"type": "schema", "strategy": 3},
    {"type": "schema", "strategy": "nope"},
]


@pytest.mark.parametrize("msg", BAD, ids=[repr(m)[:50] for m in BAD])
def test_each_malformed_message_is_refused_with_an_error_and_changes_nothing(live, msg):
    core, sink, gate = live
    gate.step(core, 2)
    answer = check(core, sink, msg)
    assert error_shown(answer), f"no error shown for {msg!r}: {answer!r}"
    # the inspector still works afterwards
    n = core.session.round_index
    core.handle({"type": "cmd", "cmd": "step"})
    gate.drain(core)
    assert core.session.round_index == n + 1


def test_the_error_says_what_was_wrong(live):
    core, sink, _gate = live
    core.handle({"type": "cmd", "cmd": "run", "n": -5})
    core.handle({"type": "explode"})
    core.handle({"type": "cmd", "cmd": "reset", "max_tokens": "12"})
    core.handle(["cmd"])
    texts = notices(sink.msgs)
    assert "'n' must be an integer in [1, 100000]; got -5" in texts[0]
    assert "unknown type 'explode'" in texts[1] and "hello, cmd, configure, schema, plotly" in texts[1]
    assert "'max_tokens' must be an integer in [1, 1000000]; got '12'" in texts[2]
    assert "not an object" in texts[3]
    core.handle({"type": "configure", "strategy": "prompt-lookup", "knobs": [1, 2]})
    assert "configure: 'knobs' must be an object of knob values; got [1, 2]" in notices(sink.msgs)[-1]
    core.handle({"type": "configure", "strategy": "prompt-lookup", "knobs": {"x" * 10_000: 1}})
    assert len(notices(sink.msgs)[-1]) < 200, "a huge value is not echoed back whole"


def test_an_unforeseen_failure_becomes_a_notice(live, monkeypatch):
    core, sink, _gate = live

    def broken(*args, **kwargs):
        raise RuntimeError("something nobody foresaw")

    monkeypatch.setattr(core.session, "configure", broken)
    before = snapshot(core)
    core.handle({"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": "3"}})  # must not raise
    assert "RuntimeError: something nobody foresaw" in notices(sink.msgs)[-1]
    assert snapshot(core) == before


def test_commands_while_rounds_run_are_refused_and_pause_is_not(live):
    core, sink, gate = live
    core.handle({"type": "cmd", "cmd": "play"})
    assert core.running  # held at the gate: nothing has changed yet
    for cmd in ({"cmd": "step"}, {"cmd": "run", "n": 3}, {"cmd": "play"}, {"cmd": "reset", "prompt": "new text"}):
        answer = check(core, sink, {"type": "cmd", **cmd}, busy=True)
        assert "Pause first" in notices(answer)[0]
    # a knob change is queued for the next round, as the form says ("Apply at next round")
    answer = check(
        core, sink, {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": "3"}}, busy=True
    )
    assert not error_shown(answer) and core.state()["pending"] == "draft_max=3"
    answer = check(core, sink, {"type": "cmd", "cmd": "pause"}, busy=True)
    assert not error_shown(answer)
    gate.drain(core)
    assert core.session.round_index == 1, "Pause stopped the worker after its round"


def test_out_of_order_commands_are_refused(live, tiny_model):
    core, sink, gate = live
    core.handle({"type": "cmd", "cmd": "play"})
    gate.drain(core)
    assert core.session.finished == "max_tokens"
    for cmd in ("step", "run", "play"):
        assert (
            "has finished (max_tokens); Reset starts it again"
            in notices(check(core, sink, {"type": "cmd", "cmd": cmd}))[0]
        )
    # a hello that claims more events than were sent
    answer = check(core, sink, {"type": "hello", "epoch": core.epoch, "have": len(core.log) + 1})
    assert "reload the page" in notices(answer)[0]
    assert not [m for m in answer if m["type"] == "events"]
    # a hello of another epoch gets this one from its start; one of this epoch only what it lacks
    answer = check(core, sink, {"type": "hello", "epoch": core.epoch + 7, "have": 3})
    assert [m["start"] for m in answer if m["type"] == "events"] == [0]
    answer = check(core, sink, {"type": "hello", "epoch": core.epoch, "have": 3})
    assert [m["start"] for m in answer if m["type"] == "events"] == [3]
    # a session that has not started: stepping and configuring are refused, Reset starts it
    from specviz import Session

    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        sink2 = Sink()
        core2 = InspectorCore(sink2, s, prompt=PROMPT)
        for msg in ({"type": "cmd", "cmd": "step"}, {"type": "configure", "strategy": "none", "knobs": {}}):
            assert "no generation has started" in notices(check(core2, sink2, msg))[0]
        assert not error_shown(check(core2, sink2, {"type": "cmd", "cmd": "reset", "prompt": "", "max_tokens": 6}))
        assert s.started and s.max_tokens == 6
        core2.close()
    finally:
        s.ctx.close()


def test_a_refused_reset_keeps_the_generation(live):
    core, sink, gate = live
    gate.step(core, 2)
    prompt = core.state()["prompt"]
    answer = check(core, sink, {"type": "cmd", "cmd": "reset", "prompt": "x " * 600, "max_tokens": 8})
    assert "context" in notices(answer)[0]
    assert core.state()["prompt"] == prompt, "the refused prompt is not remembered"
    core.handle({"type": "cmd", "cmd": "step"})
    gate.drain(core)
    assert core.session.round_index == 3


def test_a_recording_refuses_what_a_replay_cannot_do(started_replay):
    core, sink = started_replay
    answer = check(core, sink, {"type": "configure", "strategy": "prompt-lookup", "knobs": {"draft_max": "2"}})
    assert answer[-1]["errors"] == {"strategy": "a recorded session cannot be reconfigured"}
    for cmd in ("step", "run", "play"):
        assert (
            "the recording is at its end; Reset rewinds it"
            in notices(check(core, sink, {"type": "cmd", "cmd": cmd}))[0]
        )
    # Reset rewinds (whatever prompt the page sends), then the recording steps again
    assert not error_shown(check(core, sink, {"type": "cmd", "cmd": "reset", "prompt": "ignored", "max_tokens": 3}))
    assert not error_shown(check(core, sink, {"type": "cmd", "cmd": "step"}))
    core.wait(30)
    assert core.source.position == 2


@pytest.fixture()
def started_replay(tiny_session):
    tiny_session.start(PROMPT, max_tokens=16, strategy="prompt-lookup")
    tiny_session.run()
    sink = Sink()
    core = InspectorCore(sink, events=list(tiny_session.events))
    yield core, sink
    core.close()


# -- random message sequences ------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
junk = st.recursive(
    _scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6
)
small_int = st.integers(min_value=-3, max_value=60)
maybe = st.one_of  # readability: maybe(a, b) is "a or b"

_knob_names = sorted({k.name for name in strategy_names() for k in strategy_schema(name).knobs}) + ["no_such_knob"]
_knob_value = maybe(
    st.integers(min_value=-5, max_value=40).map(str),
    st.integers(min_value=-(2**66), max_value=2**66),
    st.floats(allow_nan=True),
    st.booleans(),
    st.sampled_from(["", "abc", "1e309", "true", "fixed", "cost"]),
    junk,
)


def _fields(**kw) -> st.SearchStrategy[dict]:
    """Dictionaries with some of the given fields (each may be missing)."""
    return st.fixed_dictionaries({}, optional=kw)


_strategy_name = st.sampled_from([*strategy_names(), "nope", ""])
_prompt = st.sampled_from(["", PROMPT, "hello hello hello", "x " * 600])
_knobs = st.dictionaries(st.sampled_from(_knob_names), _knob_value, max_size=3)
# well-formed messages (each may still be refused for the session's state), then the same with junk fields
well_formed = st.one_of(
    _fields(type=st.just("hello"), epoch=st.integers(-1, 3), have=small_int).filter(lambda m: len(m) == 3),
    st.fixed_dictionaries(
        {"type": st.just("cmd"), "cmd": st.sampled_from(["step", "run", "play", "pause"])},
        optional={"n": st.integers(1, 6)},
    ),
    st.fixed_dictionaries(
        {"type": st.just("cmd"), "cmd": st.just("reset")},
        optional={"prompt": _prompt, "max_tokens": st.integers(1, 30)},
    ),
    st.fixed_dictionaries({"type": st.just("configure"), "strategy": _strategy_name, "knobs": _knobs}),
    st.fixed_dictionaries({"type": st.just("schema"), "strategy": _strategy_name}),
)
malformed = st.one_of(
    junk,
    _fields(type=junk),
    _fields(type=st.just("hello"), epoch=maybe(st.integers(-2, 3), junk), have=maybe(small_int, junk)),
    _fields(
        type=st.just("cmd"),
        cmd=maybe(st.sampled_from([*COMMANDS, "jump", ""]), junk),
        n=maybe(small_int, junk),
        prompt=maybe(_prompt, junk),
        max_tokens=maybe(st.integers(-2, 30), st.just(MAX_TOKENS + 1), junk),
    ),
    _fields(type=st.just("configure"), strategy=maybe(_strategy_name, junk), knobs=maybe(_knobs, junk)),
    _fields(type=st.just("schema"), strategy=maybe(_strategy_name, junk)),
)
messages = st.one_of(well_formed, well_formed, malformed)
# a step of a sequence: a message, or "let the worker run" (the gate opens until the worker stops)
actions = st.lists(maybe(messages, st.just("drain")), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(actions=actions, start=st.booleans())
@pytest.mark.slow
def test_random_message_sequences_never_escape_and_refusals_change_nothing(tiny_model, actions, start):
    from specviz import Session

    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    if start:
        s.start(PROMPT, max_tokens=20, strategy="prompt-lookup")
    gate = Gate(s)
    sink = Sink()
    core = InspectorCore(sink, s, prompt=None if start else PROMPT)
    try:
        for a in actions:
            if a == "drain":
                gate.drain(core)
            else:
                answer = check(core, sink, a, busy=core.running)
                kind = a.get("cmd", a.get("type")) if isinstance(a, dict) else type(a).__name__
                event(f"{'refused' if error_shown(answer) else 'accepted'} {str(kind)[:12]}")
        gate.drain(core)
        # the page's view of the log is still exactly the session's event stream
        assert core.log == [e.to_dict() for e in s.events]
    finally:
        gate.open.set()
        core.close()
        s.ctx.close()


@settings(max_examples=60, deadline=None)
@given(actions=actions)
@pytest.mark.slow
def test_random_messages_to_a_replay(tiny_model, actions):
    from specviz import Session

    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        s.start(PROMPT, max_tokens=12, strategy="prompt-lookup")
        s.run()
        recorded = [e.to_dict() for e in s.events]
    finally:
        s.ctx.close()
    sink = Sink()
    core = InspectorCore(sink, events=list(s.events))
    try:
        for a in actions:
            if a != "drain":  # a replay's worker is not gated: let it finish so the check is exact
                check(core, sink, a)
            core.wait(30)
        assert recorded[: len(core.log)] == core.log, "a replay only ever shows the recording"
    finally:
        core.close()
