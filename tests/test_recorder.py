"""JSON Lines recording and replay of the event stream."""

from __future__ import annotations

import pytest

from specviz import Recorder, SpecvizError, iter_rounds, read_events


def test_recording_round_trips_every_event(tiny_session, tmp_path):
    path = tmp_path / "rec.jsonl"
    with Recorder(path) as rec:
        tiny_session.subscribe(rec)
        tiny_session.start("the a the a the a", 30, "prompt-lookup", max_ngram=2, draft_max=4)
        rounds = tiny_session.run()
    events = read_events(path)
    assert [e.to_dict() for e in events] == [e.to_dict() for e in tiny_session.events]
    grouped = list(iter_rounds(events))
    assert grouped[0].index == 0 and grouped[0].events[0].kind == "session_started"
    assert [r.index for r in grouped[1:]] == [r.index for r in rounds]
    assert [list(r.new_tokens) for r in grouped[1:]] == [list(r.new_tokens) for r in rounds]
    assert grouped[-1].finished == "max_tokens"


def test_malformed_recording_names_the_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"kind": "finished", "round": 1, "reason": "eos"}\nnot json\n')
    with pytest.raises(SpecvizError, match="bad.jsonl:2"):
        read_events(p)
    with pytest.raises(SpecvizError, match="not found"):
        read_events(tmp_path / "missing.jsonl")
