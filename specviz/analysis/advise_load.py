"""Whether a recording's timings were taken under outside load: the advisor's check of its own timings.

The advice is scored from the verify times a recording holds; a compile, a browser or another job that held
the cores while it was recorded makes them slower than the machine is. :func:`check_load` reads the rounds
(:class:`~specviz.analysis.advise_rounds.Recorded`) into a :class:`LoadCheck` by two rules, each a pure
function of the recorded figures:

- **CPU share** (where the recording has it): the process's CPU time over its wall time and threads
  (:func:`~specviz.decoding.telemetry.cpu_share`), pooled over windows of consecutive rounds at least
  :data:`CPU_WINDOW_SECONDS` long; every round of a window that is busy by
  :func:`~specviz.decoding.machine_load.is_busy` (the one threshold,
  :data:`~specviz.decoding.machine_load.BUSY_SHARE`) is flagged. Not round by round: the kernel counts a
  thread's CPU time at its scheduler tick, so one short round's share reads anywhere from half to many times
  its true value, and under two busy loops the rounds' median share stayed above 0.75 (the lost time lands in
  a few long rounds) while the run's pooled share was 0.35-0.52.
- **Spread of one batch size's verify times**: a verify of a batch size recorded at least
  :data:`SPREAD_MIN_SAMPLES` times that took more than :data:`SLOW_FACTOR` times that size's *quiet floor*,
  the lower quartile of its times, is flagged. Outside load only ever adds time, so the quiet figure is at the
  low end; the lower quartile, not the minimum, so that one lucky fast verify does not set it, and a burst
  that slowed up to three quarters of the rounds still leaves it at a quiet round's time. A quiet machine's
  verifies of one size spread by a few tens of percent at most (caches, clock changes); 1.5x is a round that
  waited for a core for a third of its time. The verify must also be :data:`MIN_EXCESS_SECONDS` above the
  floor: a tiny model's sub-millisecond verifies jitter by multiples of themselves with the timer and the
  scheduler, while a verify that waited for a core waits a scheduler slice (milliseconds).

The spread rule sees a burst (some rounds slow), not a steady load that slowed every round alike: the CPU
share, or a fresh measurement of the verify cost (:func:`compare_fresh`: the recorded times against a curve
measured on this machine now, disagreeing when they are more than :data:`DISAGREE` times slower), sees that.

The verdict (:func:`verdict`): ``"steady load"`` when most rounds (:data:`STEADY_SHARE`) were flagged, the
run's pooled CPU share is busy, or the recorded times are slower than a fresh measurement; ``"burst"`` when
at least :data:`BURST_SHARE` of the rounds (and two) were flagged; else ``"quiet"`` (an odd slow round is a
collection or a page fault, not load).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..decoding.machine_load import BUSY_SHARE, JUDGED_SECONDS, cpu_share, is_busy, share_text
from ..decoding.verify_cost import VerifyCostModel
from .advise_rounds import Recorded, RoundTiming

#: A verify this many times its batch size's quiet floor (lower quartile) is flagged (see the module docstring).
SLOW_FACTOR = 1.5
#: ...and this many seconds above it (see the module docstring).
MIN_EXCESS_SECONDS = 0.001
#: The spread rule judges a batch size only with this many verifies of it (a quartile of fewer is no floor).
SPREAD_MIN_SAMPLES = 5
#: At least this share of the rounds (and two rounds) flagged makes a burst; fewer is noise.
BURST_SHARE = 0.05
#: At least this share of the rounds flagged makes a steady load.
STEADY_SHARE = 0.5
#: The recorded verify times and a fresh curve disagree beyond noise when the recorded times' level (the median
#: of recorded over fresh seconds) is above this. The recorded times hold the reading of the logits rows too (a
#: few percent), and a curve timed five times spread 5% (:data:`~specviz.decoding.verify_cost.ADVISOR_REPEATS`):
#: 30% is well beyond both. The level only, not the per-size shape: a tiny model's sub-millisecond verifies
#: spread over sizes by more than that with the timer alone, and a burst that slowed some sizes' rounds is the
#: spread rule's to see.
DISAGREE = 1.3
#: Unflagged rounds needed to fit the verify cost without the flagged ones.
MIN_QUIET_ROUNDS = 8
#: The CPU share is judged over windows of consecutive rounds of at least this many wall seconds (the span a
#: share is judged over, :data:`~specviz.decoding.machine_load.JUDGED_SECONDS`).
CPU_WINDOW_SECONDS = JUDGED_SECONDS


def has_cpu(t: RoundTiming) -> bool:
    """Whether the recording holds ``t``'s CPU figures (CPU and wall seconds, threads)."""
    return t.cpu_seconds is not None and t.wall_seconds is not None and bool(t.n_threads)


def pooled_share(timings: list[RoundTiming], indices: list[int]) -> float | None:
    """The CPU share of the rounds ``indices`` taken together (:func:`~specviz.decoding.telemetry.cpu_share`
    of their summed CPU seconds over their summed wall seconds times threads); None without figures."""
    cpu = sum(timings[i].cpu_seconds or 0.0 for i in indices)
    capacity = sum((timings[i].wall_seconds or 0.0) * (timings[i].n_threads or 0) for i in indices)
    return cpu_share(cpu, capacity, 1) if indices else None


def cpu_windows(timings: list[RoundTiming]) -> list[list[int]]:
    """The rounds with CPU figures, in windows of consecutive rounds of at least :data:`CPU_WINDOW_SECONDS`
    wall seconds; a shorter tail joins the window before it (a run shorter than one window is one window)."""
    windows: list[list[int]] = []
    cur: list[int] = []
    wall = 0.0
    for i, t in enumerate(timings):
        if not has_cpu(t):
            continue
        cur.append(i)
        wall += t.wall_seconds or 0.0
        if wall >= CPU_WINDOW_SECONDS:
            windows.append(cur)
            cur, wall = [], 0.0
    if cur:
        if windows:
            windows[-1].extend(cur)
        else:
            windows.append(cur)
    return windows


@dataclass
class LoadCheck:
    """What the advisor found about the load its timings were taken under (see the module docstring)."""

    rounds: int
    #: indices (into :attr:`Recorded.timings`) of the verifies flagged, by either rule
    flagged: tuple[int, ...] = ()
    by_cpu: int = 0
    by_spread: int = 0
    #: the run's pooled CPU share, its lowest window's, and the threads asked for (None where not recorded)
    cpu_share: float | None = None
    cpu_share_low: float | None = None
    n_threads: int | None = None
    load_start: tuple[float, float, float] | None = None
    load_end: tuple[float, float, float] | None = None
    #: the recorded verify times over a fresh curve's (median; None without one)
    fresh_level: float | None = None
    verdict: str = "quiet"
    #: what the advisor did about it, in words
    notes: list[str] = field(default_factory=list)
    #: the advice was scored with a fresh curve, not the flagged timings
    scored_fresh: bool = False

    @property
    def share_flagged(self) -> float:
        """The share of the rounds flagged."""
        return len(self.flagged) / self.rounds if self.rounds else 0.0

    @property
    def under_load(self) -> bool:
        """Whether the timings were taken under outside load (a burst or a steady load)."""
        return self.verdict != "quiet"

    @property
    def fresh_disagrees(self) -> bool:
        """Whether the recorded verify times are slower than a fresh curve beyond noise (:data:`DISAGREE`)."""
        return disagrees(self.fresh_level)

    @property
    def judged_on_fresh(self) -> bool:
        """Whether a fresh measurement stands behind the advice's verify costs: the recorded times disagreed
        with it (the advice is scored with it as measured), or only a burst was flagged and the fresh curve
        was scaled to the rounds' median level. A steady load that a fresh curve agrees with may hold the
        machine still: that measurement confirms nothing."""
        return self.fresh_level is not None and (self.fresh_disagrees or self.verdict == "burst")

    def words(self) -> str:
        """The verdict for people: ``"the timings were taken under outside load (a burst: 6 of 40 rounds
        flagged)"`` under load (with the recorded times' level where a fresh curve disagrees with them),
        ``"the timings look quiet (0 of 40 rounds flagged)"`` otherwise."""
        counted = f"{len(self.flagged)} of {self.rounds} rounds flagged"
        if self.fresh_disagrees:  # a steady load that slowed every round alike: the fresh curve saw it
            counted += f", the recorded verify times {self.fresh_level:.2f}x a fresh measurement's"
        if not self.under_load:
            return f"the timings look quiet ({counted})"
        what = "a burst" if self.verdict == "burst" else "a steady load"
        return f"the timings were taken under outside load ({what}: {counted})"

    def headline(self) -> str:
        """:meth:`words` and, where recorded, the run's CPU share
        (:func:`~specviz.decoding.machine_load.share_text`): the inspector's advice panel shows it."""
        if self.cpu_share is None:
            return self.words()
        return f"{self.words()}; {share_text(self.cpu_share, self.n_threads)}"

    def text(self) -> str:
        """One line: the verdict, the rounds flagged and why, the CPU share and the load averages."""
        out = (
            f"load: {self.verdict}: {len(self.flagged)} of {self.rounds} rounds flagged "
            f"({self.by_cpu} by CPU share, {self.by_spread} by a verify above {SLOW_FACTOR:g}x its batch size's "
            "lower quartile)"
        )
        if self.cpu_share is not None:
            out += f"; {share_text(self.cpu_share, self.n_threads)}"
        else:
            out += "; no CPU share recorded"
        if self.load_start is not None or self.load_end is not None:
            ends = [f"{la[0]:.2f}" if la else "?" for la in (self.load_start, self.load_end)]
            out += f"; load average {ends[0]} at the start, {ends[1]} at the end"
        if self.fresh_level is not None:
            out += f"; recorded verify times {self.fresh_level:.2f}x a fresh measurement's"
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "verdict": self.verdict,
            "rounds": self.rounds,
            "flagged": len(self.flagged),
            "share_flagged": self.share_flagged,
            "by_cpu_share": self.by_cpu,
            "by_spread": self.by_spread,
            "cpu_share": self.cpu_share,
            "cpu_share_low": self.cpu_share_low,
            "busy_share": BUSY_SHARE,
            "n_threads": self.n_threads,
            "load_average_start": list(self.load_start) if self.load_start else None,
            "load_average_end": list(self.load_end) if self.load_end else None,
            "fresh_level": self.fresh_level,
            "scored_fresh": self.scored_fresh,
            "notes": list(self.notes),
            "headline": self.headline(),
            "text": self.text(),
        }


def busy_by_cpu(timings: list[RoundTiming]) -> list[int]:
    """Indices of the rounds in a window (:func:`cpu_windows`) whose pooled CPU share is busy
    (:func:`~specviz.decoding.machine_load.is_busy`)."""
    return [i for w in cpu_windows(timings) if is_busy(pooled_share(timings, w)) for i in w]


def slow_by_spread(timings: list[RoundTiming]) -> list[int]:
    """Indices of the verifies above :data:`SLOW_FACTOR` times their batch size's lower quartile and
    :data:`MIN_EXCESS_SECONDS` above it (sizes recorded at least :data:`SPREAD_MIN_SAMPLES` times)."""
    by: dict[int, list[float]] = {}
    for t in timings:
        by.setdefault(t.batch, []).append(t.verify_seconds)
    floor = {b: float(np.percentile(ts, 25)) for b, ts in by.items() if len(ts) >= SPREAD_MIN_SAMPLES}
    return [
        i
        for i, t in enumerate(timings)
        if t.batch in floor
        and t.verify_seconds > SLOW_FACTOR * floor[t.batch]
        and t.verify_seconds - floor[t.batch] > MIN_EXCESS_SECONDS
    ]


def verdict(rounds: int, flagged: int, run_share: float | None, fresh_disagrees: bool = False) -> str:
    """``"steady load"``, ``"burst"`` or ``"quiet"`` (see the module docstring)."""
    if rounds and (flagged / rounds >= STEADY_SHARE or is_busy(run_share) or fresh_disagrees):
        return "steady load"
    if rounds and flagged >= 2 and flagged / rounds >= BURST_SHARE:
        return "burst"
    return "quiet"


def check_load(rec: Recorded, fresh: VerifyCostModel | None = None) -> LoadCheck:
    """The :class:`LoadCheck` of ``rec``'s rounds; ``fresh``: a verify-cost curve measured on this machine now,
    compared with the recorded times (:func:`compare_fresh`)."""
    timings = rec.timings
    cpu, spread = busy_by_cpu(timings), slow_by_spread(timings)
    windows = cpu_windows(timings)
    shares = [s for w in windows if (s := pooled_share(timings, w)) is not None]
    threads = next((t.n_threads for t in timings if t.n_threads), None)
    flagged = tuple(sorted(set(cpu) | set(spread)))
    level = compare_fresh(fresh, rec.verify) if fresh is not None else None
    run = pooled_share(timings, [i for w in windows for i in w])
    return LoadCheck(
        rounds=len(timings),
        flagged=flagged,
        by_cpu=len(cpu),
        by_spread=len(spread),
        cpu_share=run,
        cpu_share_low=min(shares) if shares else None,
        n_threads=threads,
        load_start=rec.load_start,
        load_end=rec.load_end,
        fresh_level=level,
        verdict=verdict(len(timings), len(flagged), run, disagrees(level)),
    )


def compare_fresh(fresh: VerifyCostModel, verify: dict[int, list[float]]) -> float | None:
    """The level of the recorded verify times against a fresh curve: the median of recorded over fresh seconds
    over every recorded verify (None without one)."""
    ratios = [t / fresh(b) for b, ts in verify.items() for t in ts if fresh(b) > 0]
    return float(statistics.median(ratios)) if ratios else None


def disagrees(level: float | None) -> bool:
    """Whether recorded times ``level`` times a fresh curve's are slower beyond noise (:data:`DISAGREE`)."""
    return level is not None and level > DISAGREE


def quiet_verify(rec: Recorded, check: LoadCheck) -> dict[int, list[float]] | None:
    """The verify times of the rounds not flagged, per batch size; None when fewer than
    :data:`MIN_QUIET_ROUNDS` remain or they hold fewer than two batch sizes (too few to fit a curve to)."""
    left_out = set(check.flagged)
    kept = [t for i, t in enumerate(rec.timings) if i not in left_out]
    out: dict[int, list[float]] = {}
    for t in kept:
        out.setdefault(t.batch, []).append(t.verify_seconds)
    return out if len(kept) >= MIN_QUIET_ROUNDS and len(out) >= 2 else None
