"""Two settings side by side: the same prompt, token streams aligned by position, the first divergence,
the figures of each and the difference in words.

:func:`compare` takes two *lanes*, each a :class:`~specviz.decoding.session.Session` (its events), a list of events
(a recording) or a setting (``{"strategy": ..., knob: value}``, run on ``prompt`` with one loaded model),
and returns a :class:`Comparison`. A fork (:meth:`Session.fork`) compared with its original shows what
another setting does from the branch point on.

Positions are generated-token indices (0 = the first token after the prompt), so a lane and its fork line
up token for token; the first divergence is the first index where the two streams hold different tokens.
Timings are one run each on this machine: tokens/s of the two lanes are comparable only when they ran
under the same load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..decoding.events import Accepted, Finished, KnobsChanged, Rewound, SessionStarted, TelemetryEvent
from .sources import EventSource, events_of, is_event_source

__all__ = ["Lane", "Comparison", "compare"]


@dataclass
class Lane:
    """One side of a comparison: its setting, generated tokens (with how each was committed) and figures."""

    label: str
    strategy: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  #: accepted, bonus, correction, plain or kept, per token
    rounds: list[int] = field(default_factory=list)  #: the round that committed each token
    telemetry: dict[str, Any] = field(default_factory=dict)
    finished: str | None = None

    @classmethod
    def from_events(cls, events: EventSource, label: str) -> Lane:
        """The lane a session's events (or a recording's) describe; rewinds are honoured."""
        lane = cls(label)
        n_prompt = 0
        for ev in events_of(events):
            if isinstance(ev, SessionStarted):
                lane = cls(label, strategy=ev.strategy, knobs=dict(ev.knobs), prompt_tokens=list(ev.prompt_tokens))
                n_prompt = len(lane.prompt_tokens)
            elif isinstance(ev, KnobsChanged):
                lane.strategy, lane.knobs = ev.strategy, dict(ev.knobs)
            elif isinstance(ev, Accepted):
                lane.cut(ev.position - n_prompt)
                n_acc = ev.n_accepted
                for j, (t, p) in enumerate(zip(ev.tokens, ev.pieces)):
                    lane.tokens.append(int(t))
                    lane.pieces.append(p)
                    lane.kinds.append("accepted" if j < n_acc else (ev.bonus_kind or "plain"))
                    lane.rounds.append(ev.round)
            elif isinstance(ev, TelemetryEvent):
                lane.telemetry = dict(ev.data)
            elif isinstance(ev, Finished):
                lane.finished = ev.reason
            elif isinstance(ev, Rewound):
                kept = list(ev.kept_tokens)
                lane.cut(ev.position - n_prompt - len(kept))
                lane.tokens += [int(t) for t in kept]
                lane.pieces += list(ev.kept_pieces)
                lane.kinds += ["kept"] * len(kept)
                lane.rounds += [ev.round + 1] * len(kept)
                lane.telemetry = dict(ev.telemetry)
                lane.strategy, lane.knobs = ev.strategy, dict(ev.knobs)
                lane.finished = ev.finished
        return lane

    def cut(self, at: int) -> None:
        """Forget the generated tokens from index ``at`` on (a round rewrote them, or a rewind dropped them)."""
        del self.tokens[at:], self.pieces[at:], self.kinds[at:], self.rounds[at:]

    def figure(self, name: str) -> Any:
        """A telemetry figure (None when the lane has no telemetry yet)."""
        return self.telemetry.get(name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        t = self.telemetry
        return {
            "label": self.label,
            "strategy": self.strategy,
            "knobs": dict(self.knobs),
            "tokens": list(self.tokens),
            "pieces": list(self.pieces),
            "kinds": list(self.kinds),
            "rounds": list(self.rounds),
            "finished": self.finished,
            "figures": {
                k: t.get(k)
                for k in (
                    "acceptance_rate",
                    "mean_accepted_length",
                    "tokens_per_second",
                    "tokens_per_round",
                    "rounds",
                    "drafted",
                    "accepted",
                    "n_generated",
                    "per_position_acceptance",
                    "per_position_tries",
                )
            },
        }


@dataclass
class Comparison:
    """Two lanes aligned by generated-token position (see the module docstring)."""

    a: Lane
    b: Lane

    @property
    def common_prefix(self) -> int:
        """How many generated tokens the two lanes share from the start."""
        n = 0
        for x, y in zip(self.a.tokens, self.b.tokens):
            if x != y:
                break
            n += 1
        return n

    @property
    def first_divergence(self) -> int | None:
        """The first generated-token index where the two lanes hold different tokens (None: one is a prefix
        of the other)."""
        n = self.common_prefix
        return n if n < min(len(self.a.tokens), len(self.b.tokens)) else None

    def words(self) -> list[str]:
        """The difference in a few sentences."""
        a, b = self.a, self.b
        out: list[str] = []
        diff = _setting_diff(a, b)
        if diff:
            out.append(f"{b.label} differs from {a.label} in {diff}.")
        d = self.first_divergence
        if d is None:
            n = min(len(a.tokens), len(b.tokens))
            longer = a if len(a.tokens) > len(b.tokens) else b
            rest = (
                f"; {longer.label} goes on for {abs(len(a.tokens) - len(b.tokens))} more"
                if len(a.tokens) != len(b.tokens)
                else ""
            )
            out.append(f"Both generate the same {n} tokens{rest}.")
        else:
            out.append(
                f"The texts part at generated token {d}, after {d} identical tokens: {a.label} "
                f"{_q(a.pieces[d])} vs {b.label} {_q(b.pieces[d])}."
            )
        ra, rb = a.figure("acceptance_rate"), b.figure("acceptance_rate")
        if ra is not None and rb is not None and (a.figure("drafted") or b.figure("drafted")):
            out.append(
                f"{b.label} accepts {rb:.0%} of its draft tokens, {a.label} {ra:.0%} ({100 * (rb - ra):+.0f} points)."
            )
        ma, mb = a.figure("mean_accepted_length"), b.figure("mean_accepted_length")
        if ma is not None and mb is not None:
            out.append(f"A drafting round commits {mb:.2f} tokens in {b.label} and {ma:.2f} in {a.label}.")
        na, nb = a.figure("rounds"), b.figure("rounds")
        if na and nb:
            out.append(f"{b.label} took {nb} rounds for {len(b.tokens)} tokens, {a.label} {na} for {len(a.tokens)}.")
        ta, tb = a.figure("tokens_per_second"), b.figure("tokens_per_second")
        if ta and tb:
            out.append(
                f"{b.label} decodes at {tb:.1f} tokens/s, {tb / ta:.2f}x {a.label}'s {ta:.1f} "
                "(one run each on this machine)."
            )
        pa, pb = _depth_below(a, 0.5), _depth_below(b, 0.5)
        if pa is not None or pb is not None:

            def say(lane: Lane, d: int | None) -> str:
                if d is None:
                    return f"{lane.label}'s stays at or above 50% at every depth it drafted"
                return f"{lane.label}'s falls below 50% at depth {d + 1}"

            out.append("Per-position acceptance: " + say(a, pa) + "; " + say(b, pb) + ".")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (what the inspector's comparison lanes show)."""
        return {
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "common_prefix": self.common_prefix,
            "first_divergence": self.first_divergence,
            "words": self.words(),
        }

    def text(self) -> str:
        """The difference in words, one sentence per line."""
        return "\n".join(self.words())


def _q(piece: str) -> str:
    return "“" + str(piece).replace("\n", "↵") + "”"


def _depth_below(lane: Lane, level: float) -> int | None:
    acc = lane.figure("per_position_acceptance") or []
    tries = lane.figure("per_position_tries") or []
    for i, (x, t) in enumerate(zip(acc, tries)):
        if t and x < level:
            return i
    return None


def _setting_diff(a: Lane, b: Lane) -> str:
    parts = []
    if a.strategy != b.strategy:
        parts.append(f"strategy {a.strategy} → {b.strategy}")
    for k in sorted(set(a.knobs) | set(b.knobs)):
        va, vb = a.knobs.get(k), b.knobs.get(k)
        if va != vb and va is not None and vb is not None:
            parts.append(f"{k} {va} → {vb}")
    return ", ".join(parts)


def compare(
    a: Any,
    b: Any,
    *,
    prompt: str | list[int] | None = None,
    max_tokens: int = 128,
    session: Any = None,
    model: Any = None,
    labels: tuple[str, str] = ("A", "B"),
    **common: Any,
) -> Comparison:
    """Compare two lanes (see the module docstring).

    ``a`` and ``b`` are each a Session, a list of events, or a setting dict (``strategy`` plus knobs).
    Settings are run one after the other on ``prompt`` (with ``max_tokens`` and the ``common`` start
    arguments: ``temperature``, ``seed``, ``stop``, ``messages`` …) in ``session`` (reused; its current
    generation is replaced) or in a new session on ``model`` (default: the embedded model).
    """
    lanes: list[Lane] = []
    own = None
    for x, label in zip((a, b), labels):
        evs: EventSource
        if is_event_source(x):
            evs = x  # Lane.from_events folds it over its rewinds
        else:
            if not isinstance(x, dict):
                raise TypeError(f"compare: a lane is a Session, a list of events or a setting dict; got {type(x)}")
            if prompt is None and "messages" not in common:
                raise TypeError("compare: settings need a prompt= (or messages=) to run on")
            if session is None:
                from ..decoding.session import Session

                session = own = Session(model)
            setting = dict(x)
            strategy = setting.pop("strategy", "prompt-lookup")
            session.start(prompt, max_tokens, strategy, **common, **setting)
            session.run()
            evs = list(session.events)
        lanes.append(Lane.from_events(evs, label))
    if own is not None:
        own.close()
    return Comparison(lanes[0], lanes[1])
