"""Rewind and branch: back to the state right after an earlier round, and a second session at the same point.

The session keeps one :class:`Checkpoint` per round: what the round left behind that the token history
alone does not determine — the telemetry counters, the drafting policy's state, the random generator's
state, the drafter's saved state (:meth:`~specviz.strategies.base.Drafter.state`) and counters, the
strategy and knobs in force, and how many events stood. A checkpoint holds no cache: the caches are cut.

:func:`rewind` goes back to a checkpoint:

* the history is cut to the checkpoint's length (or to ``position``);
* the target's cache is cut to ``len(history) - 1`` positions (the newest token stays pending, as after
  every round); the positions before it are the very ones the original rounds computed, so continuing
  from there repeats the original continuation exactly;
* the drafter is rebuilt: ``begin`` on the cut history (the ``draft`` strategy's context is cut to the
  common prefix there; ``eagle3`` and ``mtp``, whose context holds pairs built from the target's hidden
  states, rebuild it at their next draft by re-evaluating the committed positions once — llama.cpp's
  kernels give those states to about 1e-6 on the f32 test models, so the drafts repeat there), then
  ``load_state`` of the checkpoint's state; the strategy and knobs of the checkpoint come back (a
  different drafter is built when they differ);
* the telemetry, the policy, the generator and the drafter's counters come back from the checkpoint;
* the events after the checkpoint are dropped and a :class:`~specviz.decoding.events.Rewound` event is published;
* a queued configuration is discarded (it was queued for a round that no longer comes next).

A rewind to a ``position`` inside a round keeps the first tokens that round committed; everything else
is as after the round before it (its telemetry, policy, drafter state). So the telemetry does not count
those kept tokens, and the next round is numbered as the one they came from.

What a rewind does not bring back, on purpose: the measured verify-cost curve (a measurement of the
machine, not of the generation), a draft model's cumulative seconds in ``extra_telemetry``, and for
``ngram-mod`` the count of pool adds onto occupied slots (it only decides whether ``begin`` clears a
pool that is a quarter full).

:func:`fork` makes a second :class:`~specviz.decoding.session.Session` at the same point: it shares the loaded
target and draft models, has its own contexts (the target's cache is copied), its own drafter, history,
events and checkpoints, and is independent afterwards.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import RewindError, SessionStateError, SnapshotError
from .events import Event, Rewound, event_from_dict

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Checkpoint", "capture", "rewind", "fork", "effective_events", "extras_state", "load_extras"]


@dataclass(frozen=True)
class Checkpoint:
    """The state right after round ``round`` that the history does not determine (see the module
    docstring). ``n_history`` is the history length then and ``n_events`` the session's event count."""

    round: int
    n_history: int
    n_events: int
    strategy: str
    knobs: dict
    finished: str | None
    telemetry: dict
    policy: dict
    rng: dict
    drafter_state: dict | None
    drafter_stats: dict

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (for snapshots)."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Any) -> Checkpoint:
        """Rebuild from :meth:`to_dict`; a malformed entry raises :class:`~specviz.errors.SnapshotError`."""
        try:
            ck = cls(
                round=int(d["round"]),
                n_history=int(d["n_history"]),
                n_events=int(d["n_events"]),
                strategy=str(d["strategy"]),
                knobs=dict(d["knobs"]),
                finished=d.get("finished"),
                telemetry=dict(d["telemetry"]),
                policy=dict(d["policy"]),
                rng=dict(d["rng"]),
                drafter_state=None if d.get("drafter_state") is None else dict(d["drafter_state"]),
                drafter_stats=dict(d.get("drafter_stats") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"a rewind checkpoint in the snapshot is malformed ({exc})") from None
        if ck.round < 0 or ck.n_history < 1 or ck.n_events < 0:
            raise SnapshotError("a rewind checkpoint in the snapshot is out of range")
        return ck


def capture(s: Session) -> None:
    """Record the checkpoint of the session's current round (replacing one of the same round, which a
    finish without a round leaves behind). Called by the session after ``start`` and after every step."""
    d = s.drafter
    assert d is not None
    ck = Checkpoint(
        round=s.round_index,
        n_history=len(s.history),
        n_events=len(s.events),
        strategy=s.strategy,
        knobs=dict(s.knobs),
        finished=s.finished if s.finished != "cancelled" else None,
        telemetry=s.telemetry.state(),
        policy=s.policy.state(),
        rng=copy.deepcopy(dict(s.rng.bit_generator.state)),
        drafter_state=d.state() if d.state_format else None,
        drafter_stats=d.stats.to_dict(),
    )
    cks = s.checkpoints
    while cks and cks[-1].round >= ck.round:
        cks.pop()
    cks.append(ck)


def _target(s: Session, round: int | None, position: int | None) -> tuple[Checkpoint, int]:
    """The checkpoint to go back to and the history length to keep, or :class:`RewindError`."""
    if not s.started:
        raise SessionStateError("nothing to rewind: call start() first")
    if (round is None) == (position is None):
        raise RewindError("rewind: give exactly one of round=N or position=P")
    cks = s.checkpoints
    if round is not None:
        if isinstance(round, bool) or not isinstance(round, int):
            raise RewindError(f"rewind: round must be an integer; got {round!r}")
        first = cks[0].round if cks else s.round_index
        if not first <= round <= s.round_index:
            raise RewindError(
                f"rewind: round {round} is outside the committed rounds [{first}, {s.round_index}]; nothing changed"
            )
        ck = next((c for c in cks if c.round == round), None)
        if ck is None:
            raise RewindError(
                f"rewind: no checkpoint of round {round} (the session was restored from a snapshot "
                "taken after it); nothing changed"
            )
        return ck, ck.n_history
    if isinstance(position, bool) or not isinstance(position, int):
        raise RewindError(f"rewind: position must be an integer; got {position!r}")
    lo = cks[0].n_history if cks else len(s.history)
    if not lo <= position <= len(s.history):
        raise RewindError(
            f"rewind: position {position} is outside the committed range [{lo}, {len(s.history)}] "
            "(history positions after the prompt); nothing changed"
        )
    ck = [c for c in cks if c.n_history <= position][-1]
    return ck, position


def rewind(s: Session, round: int | None = None, position: int | None = None) -> Rewound:
    """Take ``s`` back to the state right after ``round`` (or to ``position`` tokens of history) and
    publish a :class:`~specviz.decoding.events.Rewound` event; see the module docstring.

    A round or position outside the committed range raises :class:`~specviz.errors.RewindError` (a
    session that has not started: :class:`~specviz.errors.SessionStateError`) and changes nothing.
    """
    with s._lock:
        ck, keep = _target(s, round, position)
        from_round, from_position = s.round_index, len(s.history)
        kv_before = s.kv_length
        draft_kv_before = s.drafter.kv_length() if s.drafter is not None and s.drafter.has_context else None
        history = s.history[:keep]
        # the drafter first: building one (another strategy) may fail, and then nothing has changed yet
        drafter = s.drafter
        assert drafter is not None
        own = {k.name for k in type(drafter).knobs}
        if ck.strategy != s.strategy or any(s.knobs.get(k) != ck.knobs.get(k) for k in own):
            drafter = s._make_drafter(ck.strategy, ck.knobs)
        s.ctx.truncate(max(keep - 1, 0))
        s.history = history
        drafter.begin(history)
        if ck.drafter_state is not None and drafter.state_format:
            drafter.load_state(copy.deepcopy(ck.drafter_state))
        for k, v in ck.drafter_stats.items():
            if hasattr(drafter.stats, k):
                setattr(drafter.stats, k, v)
        if drafter is not s.drafter:
            if s.drafter is not None:
                s.drafter.close()
            s.drafter = drafter
        from .policy import make_policy
        from .telemetry import Telemetry

        s.strategy, s.knobs = ck.strategy, dict(ck.knobs)
        s.telemetry = Telemetry.from_state(copy.deepcopy(ck.telemetry))
        s.policy = make_policy(ck.knobs.get("draft_policy", "fixed"), s.cost_model)
        s.policy.load(copy.deepcopy(ck.policy))
        s.rng.bit_generator.state = copy.deepcopy(ck.rng)
        s.round_index = ck.round
        s.finished = ck.finished if keep == ck.n_history else None
        s._pending = None
        s._cancel.clear()
        s.last_result = None
        del s.checkpoints[s.checkpoints.index(ck) + 1 :]
        del s.events[ck.n_events :]
        kept = history[ck.n_history :]
        rollbacks: list[dict[str, Any]] = []
        if kv_before > s.kv_length:
            rollbacks.append({"context": "target", "from_pos": kv_before, "to_pos": s.kv_length})
        if draft_kv_before is not None and drafter.has_context:
            after = drafter.kv_length()
            if after is not None and draft_kv_before > after:
                rollbacks.append({"context": "draft", "from_pos": draft_kv_before, "to_pos": after})
        ev = Rewound(
            ck.round,
            position=keep,
            from_round=from_round,
            from_position=from_position,
            n_events=len(s.events),
            kept_tokens=tuple(kept),
            kept_pieces=tuple(s.model.pieces(kept)),
            strategy=s.strategy,
            knobs=dict(s.knobs),
            finished=s.finished,
            telemetry=s.telemetry_dict(),
            kv_rollbacks=tuple(rollbacks),
        )
        s._emit(ev)
        return ev


def fork(s: Session) -> Session:
    """A second session at the same point as ``s``, sharing its loaded models (see the module docstring).

    The fork starts with a copy of ``s``'s events and checkpoints, so it can be rewound too; nothing it
    does afterwards changes ``s``, nor the other way round.
    """
    with s._lock:
        if not s.started or s.drafter is None:
            raise SessionStateError("nothing to fork: call start() first")
        blob = s.snapshot()
        other = type(s)(s.model, **s._ctx_args)  # type: ignore[arg-type]
        try:
            other.draft_models.close()
            other.draft_models = s.draft_models.share()
            other.restore_into(blob)  # the snapshot carries the measured verify cost curve too
            other.record_margins = s.record_margins
        except Exception:
            other.close()
            raise
        return other


def effective_events(events: Sequence[Event]) -> list[Event]:
    """The events that still describe a session after its rewinds: each :class:`~specviz.decoding.events.Rewound`
    cuts the list to its ``n_events`` (it stays in the list, as in ``Session.events``). A recording of a
    session (every event as published) gives the session's own list."""
    out: list[Event] = []
    for ev in events:
        if isinstance(ev, Rewound):
            del out[ev.n_events :]
        out.append(ev)
    return out


# -- snapshots ---------------------------------------------------------------------------------------


def extras_state(s: Session) -> dict[str, Any]:
    """What a snapshot carries besides the caches and the generation: the events and the checkpoints
    (so a restored session shows its rounds and can be rewound), and the stop strings."""
    return {
        "events": [e.to_dict() for e in s.events],
        "checkpoints": [c.to_dict() for c in s.checkpoints],
        "stop": list(getattr(s, "stop", ()) or ()),
    }


def load_extras(s: Session, d: Any) -> None:
    """Install :func:`extras_state` into a session being restored (``d`` None: a snapshot without
    them; the current round becomes the only checkpoint). Malformed data raises SnapshotError."""
    if d is None:
        s.events = []
        s.checkpoints = []
        capture(s)
        return
    if not isinstance(d, dict):
        raise SnapshotError("the snapshot's workbench section is not an object")
    try:
        events = [event_from_dict(e) for e in d.get("events") or []]
    except (ValueError, TypeError, AttributeError) as exc:
        raise SnapshotError(f"the snapshot's events are malformed ({exc})") from None
    cks = [Checkpoint.from_dict(c) for c in d.get("checkpoints") or []]
    if any(c.n_history > len(s.history) or c.n_events > len(events) for c in cks) or any(
        a.round >= b.round for a, b in zip(cks, cks[1:])
    ):
        raise SnapshotError("the snapshot's rewind checkpoints do not fit its history")
    stop = d.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop):
        raise SnapshotError("the snapshot's stop strings are malformed")
    s.events = events
    s.checkpoints = cks
    s.stop = tuple(stop)
    if not cks or cks[-1].round != s.round_index:
        capture(s)
