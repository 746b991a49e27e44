"""The advice (:class:`Advice`): the advised setting, why, its llama.cpp flags and what it was computed from,
in words (:attr:`Advice.text`, :attr:`Advice.reason`, :meth:`Advice.report`) and as JSON (:meth:`Advice.to_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .advise_load import LoadCheck
from .advise_search import Candidate
from .uncertainty import CONFIDENCE


@dataclass
class Advice:
    """The advised setting, its expected speedup, the llama.cpp flags, and what it was computed from."""

    best: Candidate | None
    baseline_tokens_per_second: float
    per_strategy: dict[str, Candidate] = field(default_factory=dict)
    current: dict[str, Candidate] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    cost_source: str = ""
    overhead: tuple[float, float] = (0.0, 0.0)
    best_label: str = ""  #: the group of rounds (strategy and drafting policy) the best setting came from
    cost_curve: dict[str, Any] = field(default_factory=dict)
    limits: list[str] = field(default_factory=list)
    flags: str = ""
    flag_notes: list[str] = field(default_factory=list)
    by_depth: list[dict[str, Any]] = field(default_factory=list)
    by_confidence: list[dict[str, Any]] = field(default_factory=list)
    knobs: dict[str, Any] = field(default_factory=dict)
    #: acceptance per drafter that proposed drafts (a chain's members), from the diagnosis
    by_drafter: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: searched only what llama-server's flags express (``advise(..., for_server=True)``)
    for_server: bool = False
    #: the fastest setting found, not advised: its speedup beats plain decoding (or the advised setting's)
    #: only within the recording's uncertainty (its interval's lower end does not clear 1.0)
    declined: Candidate | None = None
    declined_label: str = ""
    #: the central share of bootstrap resamples the speedup intervals span (:mod:`specviz.analysis.uncertainty`)
    confidence: float = CONFIDENCE
    #: the check of the timings for outside load (:mod:`specviz.analysis.advise_load`)
    load: LoadCheck | None = None
    #: where the advice was scored with a fresh verify-cost curve that the recorded times disagree with: the
    #: best setting scored on the recorded times, shown beside it
    as_recorded: Candidate | None = None

    @property
    def pays(self) -> bool:
        """Whether the advice is to speculate (a setting other than plain decoding)."""
        return self.best is not None and self.best.strategy != "none"

    @property
    def on_flagged_timings(self) -> bool:
        """Whether the advice was scored on timings flagged for outside load with no fresh measurement behind
        them (:attr:`~specviz.analysis.advise_load.LoadCheck.judged_on_fresh`)."""
        return self.load is not None and self.load.under_load and not self.load.judged_on_fresh

    def _load_words(self) -> str:
        """``"the timings were taken under outside load (a burst: 6 of 40 rounds flagged)"``
        (:meth:`~specviz.analysis.advise_load.LoadCheck.words`)."""
        return self.load.words() if self.load is not None else ""

    @property
    def reason(self) -> str:
        """Why speculation was or was not advised, in words: the rule is that the lower end of the advised
        setting's speedup interval clears plain decoding."""
        if self.best is None:
            return "no drafting round was recorded"
        conf = f"a {self.confidence:.0%} bootstrap interval over"
        d = self.declined
        if not self.pays and self.on_flagged_timings:
            gain = f"the best setting's {d.speedup:.2f}x" if d is not None else "what speculation gains"
            return f"{self._load_words()}: {gain} cannot be judged from them"
        if not self.pays:
            if d is None:
                return "no setting is expected to beat plain decoding"
            if d.speedup_low is None:
                return (
                    f"the best setting's gain, {d.speedup:.2f}x, rests on {d.rounds} round: too few to tell how "
                    "much rounds vary, so it is not shown to pay"
                )
            return (
                f"the best setting's gain, {d.speedup:.2f}x, is within the recording's uncertainty "
                f"({d.interval_text()}, {conf} its {d.rounds} rounds): its lower end does not clear plain "
                "decoding (1.00x)"
            )
        b = self.best
        out = (
            f"the advised setting's speedup, {b.speedup:.2f}x, is shown to pay: {b.interval_text()}, {conf} "
            f"its {b.rounds} rounds, lies above plain decoding (1.00x)"
        )
        if d is not None:
            out += (
                f"; {self.declined_label} at {d.speedup:.2f}x looks faster but its gain is within the "
                f"recording's uncertainty ({d.interval_text() or 'one round'})"
            )
        return out

    @property
    def text(self) -> str:
        """The advice in a few sentences (what ``specviz advise`` prints first)."""
        if self.best is None:
            return "no drafting round to learn from: run a strategy that drafts, then ask again"
        b = self.best
        if b.strategy == "none" and self.on_flagged_timings:
            return (
                f"{self._load_words()}: speculation is not judged on them; record again on a quiet machine, or "
                "measure the verify cost afresh (advise the live session, or pass --verify-cost)"
            )
        if b.strategy == "none":
            if self.declined is not None:
                return (
                    f"speculation is not shown to pay here: {self.reason}; run without it ({self.flags}), or record "
                    "more rounds"
                )
            return (
                f"speculation does not pay here: no setting beats plain decoding "
                f"({self.baseline_tokens_per_second:.1f} tokens/s expected); run without it ({self.flags})"
            )
        pmin = f", draft_p_min {b.draft_p_min:g}" if b.draft_p_min is not None else ""
        cur = self.current.get(self.best_label)
        vs = f" (the setting run: {cur.speedup:.2f}x)" if cur is not None else ""
        iv = f" ({b.interval_text()} at {self.confidence:.0%})" if b.interval_text() else ""
        out = (
            f"{b.strategy} with draft_max {b.draft_max}, draft_min {b.draft_min}{pmin}: expected "
            f"{b.tokens_per_second:.1f} tokens/s, {b.speedup:.2f}x plain decoding{iv}{vs}"
        )
        if self.on_flagged_timings:
            out += f"; {self._load_words()}: confirm it on a quiet machine or with a fresh measurement"
        return out + self._both_figures()

    def both_figures(self) -> list[tuple[str, Candidate]]:
        """Where a fresh curve was used against recorded times under load: the advised setting scored on this
        machine now and the best one scored on the recorded times, each with its label; else empty."""
        if self.as_recorded is None or self.best is None:
            return []
        return [("on this machine now", self.best), ("as recorded, under load", self.as_recorded)]

    def _both_figures(self) -> str:
        """:meth:`both_figures` in words: ``"; on this machine now: 2.20x; as recorded, under load: 1.41x"``."""
        return "".join(f"; {label}: {c.speedup:.2f}x" for label, c in self.both_figures())

    def to_dict(self) -> dict[str, Any]:
        """Everything as one JSON-serialisable dictionary."""
        return {
            "text": self.text,
            "pays": self.pays,
            "reason": self.reason,
            "confidence": self.confidence,
            "best": self.best.to_dict() if self.best else None,
            "best_label": self.best_label,
            "declined": self.declined.to_dict() if self.declined else None,
            "declined_label": self.declined_label,
            "baseline_tokens_per_second": self.baseline_tokens_per_second,
            "per_strategy": {k: v.to_dict() for k, v in self.per_strategy.items()},
            "current": {k: v.to_dict() for k, v in self.current.items()},
            "measured": dict(self.measured),
            "cost_source": self.cost_source,
            "cost_curve": self.cost_curve,
            "limits": list(self.limits),
            "round_overhead": {"seconds": self.overhead[0], "seconds_per_row": self.overhead[1]},
            "llama_cpp_flags": self.flags,
            "flag_notes": list(self.flag_notes),
            "by_depth": self.by_depth,
            "by_confidence": self.by_confidence,
            "by_drafter": self.by_drafter,
            "knobs": self.knobs,
            "for_server": self.for_server,
            "load": self.load.to_dict() if self.load else None,
            "as_recorded": self.as_recorded.to_dict() if self.as_recorded else None,
            "both_figures": [
                {"label": label, "speedup": c.speedup, "tokens_per_second": c.tokens_per_second}
                for label, c in self.both_figures()
            ],
        }

    def report(self) -> str:
        """A plain-text report."""
        lines = [self.text, f"why: {self.reason}", f"llama-server flags: {self.flags}"]
        lines += [f"  note: {n}" for n in self.flag_notes]
        lines.append(
            f"plain decoding: {self.baseline_tokens_per_second:.1f} tokens/s expected; verify cost {self.cost_source}"
        )
        for name, c in self.per_strategy.items():
            cur = self.current.get(name)
            pmin = f" p_min {c.draft_p_min:g}" if c.draft_p_min is not None else ""
            meas = self.measured.get(name)
            iv = f", {c.interval_text()}" if c.interval_text() else ""
            lines.append(
                f"  {name:<14} best: max {c.draft_max} min {c.draft_min}{pmin} -> {c.tokens_per_second:.1f} "
                f"tok/s ({c.speedup:.2f}x{iv})"
                + (f"; as run: {cur.tokens_per_second:.1f} tok/s expected" if cur else "")
                + (f", {meas:.1f} measured" if meas else "")
            )
        if len(self.by_drafter) > 1:
            lines.append(
                "acceptance by drafter: "
                + ", ".join(
                    f"{k} {v['acceptance']:.0%} of {v['examined']}"
                    for k, v in self.by_drafter.items()
                    if v["acceptance"] is not None
                )
            )
        if self.load is not None and self.load.rounds:
            lines.append(self.load.text())
            lines += [f"  {n}" for n in self.load.notes]
        if self.as_recorded is not None:
            r = self.as_recorded
            lines.append(
                f"  as recorded, under load: {r.strategy} max {r.draft_max} min {r.draft_min} -> "
                f"{r.tokens_per_second:.1f} tok/s ({r.speedup:.2f}x)"
            )
        lines += [f"limit: {x}" for x in self.limits]
        return "\n".join(lines)
