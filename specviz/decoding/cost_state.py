"""What the cost policy has learnt, as one dataclass: :class:`CostCounters` is the policy's whole state, what
a snapshot or a rewind checkpoint carries (:meth:`CostCounters.as_dict`) and reads back through one validator
(:meth:`CostCounters.checked`). :class:`~specviz.decoding.cost_policy.CostPolicy` is a ``CostCounters`` with the
rules that use them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

#: How a saved counter of each declared type is read back (a value that is not one raises TypeError or ValueError).
_CONVERT: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": bool}


def _no_tries() -> list[float]:
    return [0.0] * CostCounters.BUCKETS


@dataclass(eq=False)
class CostCounters:
    """The cost policy's counters (see :class:`~specviz.decoding.cost_policy.CostPolicy` for what each means).

    ``tries`` / ``hits``: decayed tried and accepted draft tokens per run-position bucket; ``run``: draft
    tokens accepted in a row up to now; ``probe_every``: plain rounds before the next probe; ``probing``: the
    last length chosen was a probe whose verdict has not come back; ``last_length``: that length (None before
    the first); ``quiet``: plain rounds still promised; the ``*_seconds`` are moving averages over the last 20
    of their ``*_calls`` (or ``asked``, ``declines``, ``resumes``); ``proposal_rate``: the share of asking
    rounds that got a draft.
    """

    BUCKETS: ClassVar[int] = 7  # run positions 0, 1, 2-3, 4-7, 8-15, 16-31, 32+
    PROBE_EVERY: ClassVar[int] = 8
    PROBE_MAX: ClassVar[int] = 16
    #: The counters learnt from timings (each ``*_seconds`` moving average with its count), which outside load
    #: inflates: what :meth:`timings` saves and :meth:`restore_timings` puts back (acceptance is no timing).
    TIMING_FIELDS: ClassVar[tuple[str, ...]] = (
        "draft_tok_seconds",
        "draft_calls",
        "upkeep_tok_seconds",
        "upkeep_calls",
        "plain_upkeep_seconds",
        "plain_upkeep_calls",
        "decline_seconds",
        "declines",
        "resume_seconds",
        "resumes",
    )

    tries: list[float] = field(default_factory=_no_tries)
    hits: list[float] = field(default_factory=_no_tries)
    run: int = 0
    draft_tok_seconds: float = 0.0
    draft_calls: int = 0
    shadow_tries: int = 0
    shadow_hits: int = 0
    rounds_since_evidence: int = 0
    probe_every: int = PROBE_EVERY
    probing: bool = False
    upkeep_tok_seconds: float = 0.0  # feeding the drafter's model per committed token, rounds with a draft asked
    upkeep_calls: int = 0
    plain_upkeep_seconds: float = 0.0  # what the drafter spends in a round kept plain
    plain_upkeep_calls: int = 0
    last_length: int | None = None
    asked: int = 0  # rounds that asked the drafter for a draft and heard back
    proposal_rate: float = 1.0
    declines: int = 0
    decline_seconds: float = 0.0  # what asking cost in a round that got no draft
    resumes: int = 0
    resume_seconds: float = 0.0  # bringing a paused drafter's model back before a draft
    quiet: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Every counter, JSON-serialisable (the lists copied)."""
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), list) else v
            for f in dataclasses.fields(CostCounters)
        }

    @classmethod
    def checked(cls, d: Mapping[str, Any]) -> CostCounters:
        """The counters of a saved :meth:`as_dict` ``d``, each read as its field's type (a value that cannot be
        raises TypeError or ValueError: a snapshot or a checkpoint carrying it is refused). A counter missing
        from ``d`` starts at its default; estimates of another bucket layout (an older policy's) start afresh,
        and the run with them; ``probe_every``, ``proposal_rate`` and ``quiet`` are kept within their bounds."""
        out = cls()
        for f in dataclasses.fields(CostCounters):
            convert = _CONVERT.get(str(f.type))
            if convert is not None and f.name in d:
                setattr(out, f.name, convert(d[f.name]))
        tries, hits = d.get("tries"), d.get("hits")
        layout = [
            isinstance(x, list) and len(x) == cls.BUCKETS and all(isinstance(v, (int, float)) for v in x)
            for x in (tries, hits)
        ]
        if all(layout) and isinstance(tries, list) and isinstance(hits, list):
            out.tries, out.hits = [float(v) for v in tries], [float(v) for v in hits]
        else:
            out.run = 0
        last = d.get("last_length")
        out.last_length = int(last) if isinstance(last, int) else None
        out.probe_every = min(max(out.probe_every, cls.PROBE_EVERY), cls.PROBE_MAX)
        out.proposal_rate = min(max(out.proposal_rate, 0.0), 1.0)
        out.quiet = max(0, out.quiet)
        return out

    def load_counters(self, d: Mapping[str, Any]) -> None:
        """Set every counter from a saved :meth:`as_dict` (:meth:`checked`: nothing changes when it refuses)."""
        saved = self.checked(d)
        for f in dataclasses.fields(CostCounters):
            setattr(self, f.name, getattr(saved, f.name))

    def timings(self) -> dict[str, float | int]:
        """The counters learnt from timings (:data:`TIMING_FIELDS`), as they are now."""
        return {name: getattr(self, name) for name in self.TIMING_FIELDS}

    def restore_timings(self, saved: Mapping[str, float | int] | None) -> None:
        """Put back :meth:`timings` ``saved``; None: forget them (every moving average starts again, its next
        observation taken whole)."""
        for name in self.TIMING_FIELDS:
            setattr(self, name, saved[name] if saved is not None else type(getattr(self, name))(0))
