"""The rounds a session's events record, as the advisor (:mod:`.advise`) reads them.

:func:`collect` folds events into :class:`Recorded`: per group of rounds (:func:`group_label`: the strategy,
and the drafting policy when it is not the fixed one) each round's drafted length, accepted count, draft
probabilities, drafting seconds and drafter (:class:`Rounds`); the verify seconds per batch size; the cost
curve the telemetry recorded; and per round the figures the overhead fit reads.

A chain's rounds (``ngram-mod,mtp``) record which member drafted. :func:`chain_prefixes` turns them into
the rounds of each chain of its first members (``ngram-mod`` alone): llama.cpp asks the members in a fixed
order, so where a later member drafted, the earlier ones drafted nothing, and without the later member
those rounds are plain. A later member alone, or another order, cannot be derived (what it would have
drafted where an earlier member won is not recorded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..decoding.events import (
    Accepted,
    DraftProposed,
    Event,
    Finished,
    KnobsChanged,
    Rewound,
    SessionStarted,
    TelemetryEvent,
    Verified,
)
from ..strategies import strategy_class


@dataclass
class Rounds:
    """The recorded rounds of one group, as arrays."""

    strategy: str
    knobs: dict[str, Any]
    length: np.ndarray  # drafted tokens L
    accepted: np.ndarray  # accepted n
    probs: list[list[float | None]]
    draft_seconds: np.ndarray
    has_probs: bool
    drafters: list[str] = field(default_factory=list)  # who drafted each round (a chain's member; "" for none)


@dataclass
class RoundTiming:
    """One round's verify as the load check (:mod:`.advise_load`) reads it: its batch size and seconds, and
    the process's CPU seconds over the round's wall seconds with the threads it asked for, where the
    recording has them (None in recordings made before they were recorded)."""

    batch: int
    verify_seconds: float
    wall_seconds: float | None = None
    cpu_seconds: float | None = None
    n_threads: int | None = None


@dataclass
class Recorded:
    """What a session's events tell the advisor: the rounds of each group (:func:`group_label`), the verify
    seconds per batch size, the last cost curve the telemetry recorded, the measured tokens/s of each group
    (committed tokens over draft and verify seconds), and per round the figures the overhead fit reads
    (rows read, batch size, round seconds, draft seconds) where the telemetry tells them."""

    rounds: dict[str, Rounds] = field(default_factory=dict)
    verify: dict[int, list[float]] = field(default_factory=dict)
    curve: dict[str, Any] | None = None
    measured: dict[str, float] = field(default_factory=dict)
    overhead: list[tuple[int, int, float, float, float]] = field(default_factory=list)
    #: every verify in order, with the round's CPU figures where recorded (:class:`RoundTiming`)
    timings: list[RoundTiming] = field(default_factory=list)
    #: the load averages (1, 5, 15 minutes) at the first session's start and the last one's finish, if recorded
    load_start: tuple[float, float, float] | None = None
    load_end: tuple[float, float, float] | None = None


@dataclass
class _Group:
    """The rounds of one group as they are read: drafted lengths, accepted counts, draft probabilities and
    draft seconds, and the committed tokens and draft + verify seconds for the measured tokens/s."""

    strategy: str
    knobs: dict[str, Any]
    length: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    probs: list[list[float | None]] = field(default_factory=list)
    draft_seconds: list[float] = field(default_factory=list)
    drafters: list[str] = field(default_factory=list)
    committed: float = 0.0
    seconds: float = 0.0

    def rounds(self) -> Rounds:
        """The group as arrays."""
        return Rounds(
            self.strategy,
            self.knobs,
            np.array(self.length, dtype=np.int64),
            np.array(self.accepted, dtype=np.int64),
            self.probs,
            np.array(self.draft_seconds, dtype=float),
            any(p is not None for ps in self.probs for p in ps),
            list(self.drafters),
        )


@dataclass
class _RoundInFlight:
    """The round being read: its draft until its verdict, its verify seconds, then the rows it read and its
    batch size until its telemetry."""

    draft: DraftProposed | None = None
    verify_seconds: float | None = None
    rows_read: int | None = None
    batch: int = 1


def collect(events: Sequence[Event]) -> Recorded:
    """Read :class:`Recorded` from ``events`` (folded over rewinds already)."""
    groups: dict[str, _Group] = {}
    out = Recorded()
    strategy, knobs = "", {}
    cur = _RoundInFlight()
    for ev in events:
        if isinstance(ev, (SessionStarted, Finished)):
            _read_load_average(ev, out)
        if isinstance(ev, (SessionStarted, KnobsChanged, Rewound)):
            strategy, knobs = ev.strategy, dict(ev.knobs)
        elif isinstance(ev, DraftProposed):
            cur = _RoundInFlight(draft=ev)
        elif isinstance(ev, Verified):
            out.verify.setdefault(int(ev.batch_size), []).append(float(ev.seconds))
            out.timings.append(_timing(ev))
            cur.verify_seconds = float(ev.seconds)
        elif isinstance(ev, Accepted) and cur.draft is not None:
            d, cur.draft = cur.draft, None
            # rounds are grouped by strategy and drafting policy: a policy's own draft lengths shape what
            # the rounds could show, so the fixed and the cost policy's rounds of one strategy stay apart
            g = groups.setdefault(group_label(strategy, knobs), _Group(strategy, knobs))
            g.knobs = knobs
            g.length.append(len(d.tokens))
            g.accepted.append(int(ev.n_accepted))
            g.probs.append(list(d.probs))
            g.draft_seconds.append(float(d.seconds))
            g.drafters.append((d.drafter or strategy) if d.tokens else "")
            cur.rows_read, cur.batch = int(ev.n_accepted) + 1, len(d.tokens) + 1
            g.committed += len(ev.tokens)
            g.seconds += float(d.seconds) + (cur.verify_seconds or 0.0)
            cur.verify_seconds = None
        elif isinstance(ev, TelemetryEvent):
            _read_telemetry(ev.data or {}, cur, out)
    out.rounds = {name: g.rounds() for name, g in groups.items()}
    out.measured = {name: g.committed / g.seconds for name, g in groups.items() if g.seconds > 0}
    return out


def _read_telemetry(data: dict[str, Any], cur: _RoundInFlight, out: Recorded) -> None:
    """A round's telemetry: the cost policy's curve, and the round's seconds for the overhead fit."""
    pol = data.get("policy") or {}
    if isinstance(pol, dict) and pol.get("verify_cost"):
        out.curve = pol["verify_cost"]
    last = data.get("last_round") or {}
    if "seconds" in last and cur.rows_read is not None:
        rows_read, batch = cur.rows_read, cur.batch
        cur.rows_read, cur.batch = None, 1
        out.overhead.append(
            (
                rows_read,
                batch,
                float(last["seconds"]),
                float(last.get("draft_seconds", 0.0)),
                float(last.get("verify_seconds", 0.0)),
            )
        )


def _timing(ev: Verified) -> RoundTiming:
    """A verify's :class:`RoundTiming`: its batch and seconds, and its round's CPU figures where recorded."""
    return RoundTiming(
        int(ev.batch_size),
        float(ev.seconds),
        wall_seconds=ev.round_seconds,
        cpu_seconds=ev.cpu_seconds,
        n_threads=ev.n_threads,
    )


def _read_load_average(ev: Event, out: Recorded) -> None:
    """The load average a session's start (the first) or finish (the last) recorded, if it did."""
    la = getattr(ev, "load_average", None)
    if la is None:
        return
    figures = (float(la[0]), float(la[1]), float(la[2]))
    if isinstance(ev, Finished):
        out.load_end = figures
    elif out.load_start is None:
        out.load_start = figures


def group_label(strategy: str, knobs: dict[str, Any]) -> str:
    """The name of a group of rounds: the strategy, and the drafting policy when it is not the fixed one."""
    policy = knobs.get("draft_policy", "fixed")
    return strategy if policy in ("fixed", None) else f"{strategy} ({policy} policy)"


def recorded_tile(knobs: dict[str, Any]) -> int:
    """The verify tile the rounds' drafts were aligned to (1 when they ran without alignment)."""
    return int(knobs.get("verify_tile", 1)) if knobs.get("align", True) else 1


def chain_prefixes(label: str, r: Rounds) -> list[tuple[str, Rounds]]:
    """For the rounds of a chain: the rounds of each chain of its first members (see the module docstring),
    labelled ``"ngram-mod (of ngram-mod,mtp)"``; a later member's rounds become plain (no draft), their
    drafting time the chain's median time of a round nobody drafted in."""
    members = r.strategy.split(",")
    if len(members) < 2:
        return []
    drafters = np.array(r.drafters or [""] * r.length.size)
    idle = r.draft_seconds[drafters == ""]
    idle_seconds = float(np.median(idle)) if idle.size else 0.0
    out = []
    for k in range(1, len(members)):
        keep = np.isin(drafters, members[:k])
        name = ",".join(members[:k])
        out.append(
            (
                label.replace(r.strategy, f"{name} (of {r.strategy})", 1),
                Rounds(
                    name,
                    _prefix_knobs(r.strategy, name, r.knobs),
                    np.where(keep, r.length, 0),
                    np.where(keep, r.accepted, 0),
                    [ps if kp else [] for ps, kp in zip(r.probs, keep)],
                    np.where(keep, r.draft_seconds, idle_seconds),
                    any(p is not None for ps, kp in zip(r.probs, keep) if kp for p in ps),
                    [d if kp else "" for d, kp in zip(r.drafters, keep)],
                ),
            )
        )
    return out


def knob_names(strategy: str) -> dict[str, dict[str, str]]:
    """Per member of ``strategy`` (itself when it is no chain): its knob name -> the strategy's."""
    cls = strategy_class(strategy)
    return getattr(cls, "member_knobs", {strategy: {k.name: k.name for k in cls.knobs}})


def _prefix_knobs(chain: str, prefix: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """The chain's ``knobs`` as the knobs of ``prefix`` (its first members): the session's knobs as they
    are, each member's under the name it has in ``prefix``."""
    full, part = knob_names(chain), knob_names(prefix)
    members_knobs = {x for names in full.values() for x in names.values()}
    out = {n: v for n, v in knobs.items() if n not in members_knobs}
    for m, names in part.items():
        for mine, there in names.items():
            if full[m][mine] in knobs:
                out[there] = knobs[full[m][mine]]
    return out
