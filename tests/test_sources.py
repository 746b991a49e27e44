"""specviz.analysis.sources: the events of a session or of a recording, folded over rewinds."""

from __future__ import annotations

from specviz.analysis.sources import events_of, is_event_source
from specviz.decoding.events import Finished, Rewound, SessionStarted, TelemetryEvent


class Keeper:
    """A stand-in for a session: it keeps its events."""

    def __init__(self, events):
        self.events = events


def recording():
    """A session start, two rounds' telemetry, a rewind to round 1 (keeping two events), and a finish."""
    return [
        SessionStarted(0),
        TelemetryEvent(1),
        TelemetryEvent(2),
        Rewound(1, n_events=2),
        Finished(2, reason="eos"),
    ]


def test_a_recording_and_a_session_give_the_same_folded_events():
    want = [SessionStarted(0), TelemetryEvent(1), Rewound(1, n_events=2), Finished(2, reason="eos")]
    assert events_of(recording()) == want
    assert events_of(tuple(recording())) == want
    assert events_of(iter(recording())) == want
    assert events_of(Keeper(recording())) == want


def test_a_list_is_a_recording_even_when_it_has_an_events_attribute():
    class Listed(list):
        events = [Finished(9)]

    assert events_of(Listed(recording()))[-1] == Finished(2, reason="eos")


def test_what_counts_as_a_source():
    assert is_event_source([]) and is_event_source(()) and is_event_source(Keeper([]))
    assert not is_event_source({"strategy": "none"}) and not is_event_source(3)
