"""The events of a source: a session (its events) or a recording (a list of events), folded over its rewinds.

:func:`~specviz.analysis.diagnose.diagnose`, :func:`~specviz.analysis.advise.advise` and
:func:`~specviz.analysis.compare.compare` each take either; this is the one place that tells them apart and
drops the events a rewind undid (:func:`specviz.decoding.rewind.effective_events`).
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence, Union, runtime_checkable

from ..decoding.events import Event
from ..decoding.rewind import effective_events

__all__ = ["HasEvents", "EventSource", "is_event_source", "events_of"]


@runtime_checkable
class HasEvents(Protocol):
    """Anything that keeps its events in order, as :class:`~specviz.decoding.session.Session` does."""

    @property
    def events(self) -> Sequence[Event]:
        """The events, oldest first."""
        ...


#: A session (or anything with ``events``) or the events themselves (a recording: :func:`specviz.read_events`).
EventSource = Union[HasEvents, Iterable[Event]]


def is_event_source(x: object) -> bool:
    """Whether ``x`` is a session (it has ``events``) or a list or tuple of events."""
    return isinstance(x, (list, tuple)) or isinstance(x, HasEvents)


def events_of(source: EventSource) -> list[Event]:
    """The events that still describe ``source`` after its rewinds: a session's ``events``, or the events
    of a recording (any list, tuple or other iterable of events), each ``Rewound`` cutting the list as the
    session did."""
    events: Iterable[Event]
    if isinstance(source, (list, tuple)) or not isinstance(source, HasEvents):
        events = source  # a recording: a list's own ``events`` attribute (a subclass's) is not its events
    else:
        events = source.events
    return effective_events(list(events))
