"""A batched run's recording as one inspector stream: the lanes of every step, and one request's tokens.

A batched recording (``specviz run --requests LOG -np N --record``, or any list of events holding
:class:`~specviz.decoding.events.BatchStepped`) holds every request's own events (a ``session_started`` each,
request after request) and one ``batch_step`` per step of the run. The inspector shows one generation per
epoch (a ``session_started`` starts a new one), so the stream it is sent is laid out here:

* group 0: the *followed* request's start (its ``session_started`` and round-0 events);
* then one group per step, in step order: the followed request's round that step, when it ran one, then the
  step's ``batch_step`` event.

The followed request is the first that ran a round (the smallest request id in the steps' lanes). Its tokens
fill the token stream and the per-round charts as a one-request session's would; the lanes view draws every
slot from the ``batch_step`` events. The recorded sessions are matched to request ids by order: both the
sessions that ran a round (an ``accepted`` event) and the ids in the lanes are in submission order (a
request refused at its start recorded nothing and ran no round; one that ended before a round ran none).
"""

from __future__ import annotations

from typing import Sequence

from ..decoding.events import Accepted, BatchStepped, Event, SessionStarted

__all__ = ["batched_groups", "followed_request", "is_batched", "sessions_of"]


def is_batched(events: Sequence[Event]) -> bool:
    """Whether ``events`` hold a batched run's steps."""
    return any(isinstance(e, BatchStepped) for e in events)


def sessions_of(events: Sequence[Event]) -> list[list[Event]]:
    """The requests' own events, split at each ``session_started`` (the steps' events left out)."""
    out: list[list[Event]] = []
    for e in events:
        if isinstance(e, BatchStepped):
            continue
        if isinstance(e, SessionStarted) or not out:
            out.append([])
        out[-1].append(e)
    return out


def followed_request(events: Sequence[Event]) -> int | None:
    """The request whose tokens the stream shows: the smallest request id in the steps' lanes (None: no lane)."""
    ids = {int(lane["request"]) for e in events if isinstance(e, BatchStepped) for lane in e.lanes}
    return min(ids) if ids else None


def batched_groups(events: Sequence[Event]) -> list[list[Event]]:
    """``events`` (a batched recording) laid out as the inspector's rounds (see the module docstring)."""
    steps = sorted((e for e in events if isinstance(e, BatchStepped)), key=lambda e: e.round)
    ran = [s for s in sessions_of(events) if any(isinstance(e, Accepted) for e in s)]
    followed = followed_request(events)
    own: list[Event] = ran[0] if ran and followed is not None else []
    by_round: dict[int, list[Event]] = {}
    for e in own:
        by_round.setdefault(e.round, []).append(e)
    groups: list[list[Event]] = [by_round.pop(0, [])]
    for step in steps:
        lane = next((x for x in step.lanes if x["request"] == followed), None)
        mine = by_round.pop(int(lane["round"]), []) if lane is not None else []
        groups.append([*mine, step])
    rest = [e for r in sorted(by_round) for e in by_round[r]]  # rounds no lane named (none in a whole recording)
    if rest:
        groups.append(rest)
    return [g for g in groups if g]
