"""JSON Lines recording and replay of the event stream.

:class:`Recorder` is a subscriber that writes each event as one JSON object per line (flushed per
round, so a crashed session leaves a readable file). :func:`read_events` reads a file back into event
objects; :func:`iter_rounds` groups them into rounds, which is what a replaying inspector consumes.
No model is needed to replay.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Iterator

from ..errors import SpecvizError
from .events import Event, Round, event_from_dict


class Recorder:
    """Write every event of a session to ``path`` as JSON Lines.

    Use ``rec = Recorder(path); session.subscribe(rec)``; call :meth:`close` (or use it as a context
    manager) when done.
    """

    def __init__(self, path: str | os.PathLike, *, append: bool = False) -> None:
        self.path = Path(path)
        self._f: IO[str] | None = self.path.open("a" if append else "w", encoding="utf-8")

    def __call__(self, event: Event) -> None:
        """Write one event (subscriber protocol)."""
        if self._f is None:
            return
        self._f.write(json.dumps(event.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n")
        if event.kind in ("telemetry", "finished", "session_started", "knobs_changed"):
            self._f.flush()

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: str | os.PathLike) -> list[Event]:
    """Every event recorded in ``path``; a malformed line raises :class:`SpecvizError` with its number."""
    p = Path(path)
    if not p.exists():
        raise SpecvizError(f"recording not found: {p}")
    events: list[Event] = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                events.append(event_from_dict(json.loads(line)))
            except (ValueError, TypeError) as e:
                raise SpecvizError(f"{p}:{n}: not a specviz event ({e}); is this a specviz recording?") from None
    return events


def iter_rounds(events: list[Event]) -> Iterator[Round]:
    """Group a flat event list into rounds (round 0 holds the session start and early config changes)."""
    cur: list[Event] = []
    idx = 0
    for ev in events:
        if ev.round != idx and cur:
            yield Round(idx, tuple(cur), _new_tokens(cur), _finished(cur))
            cur = []
        idx = ev.round
        cur.append(ev)
    if cur:
        yield Round(idx, tuple(cur), _new_tokens(cur), _finished(cur))


def _new_tokens(evs: list[Event]) -> tuple:
    for e in evs:
        if e.kind == "accepted":
            return tuple(e.tokens)  # type: ignore[attr-defined]
    return ()


def _finished(evs: list[Event]) -> str | None:
    for e in evs:
        if e.kind == "finished":
            return e.reason  # type: ignore[attr-defined]
    return None
