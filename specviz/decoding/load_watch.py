"""Whether outside load is holding the cores now, judged window by window as rounds come in: what lets the
cost policy learn again what it learnt during a burst of outside load once the burst has passed
(:meth:`~specviz.decoding.cost_policy.CostPolicy.observe_load`).

A :class:`LoadWatch` sums the rounds' CPU and wall seconds into a window until it spans
:data:`~specviz.decoding.machine_load.JUDGED_SECONDS` (a share over less is tick noise), then judges the
window's CPU share by the one rule (:func:`~specviz.decoding.machine_load.is_busy`) and starts the next. What
it reports is about the machine now, not about the text: it is no part of a policy's learnt state, and a
rewind or a snapshot neither saves nor restores it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .machine_load import JUDGED_SECONDS, cpu_share, is_busy

__all__ = ["LoadWatch", "Judgement"]

#: What closing a window found: ``"quiet"`` or ``"busy"``, or ``"passed"`` for the first quiet window after
#: one or more busy ones (a burst has passed).
Judgement = Literal["quiet", "busy", "passed"]


@dataclass
class LoadWatch:
    """Windows of consecutive rounds judged busy or quiet (see the module docstring).

    ``busy``: the last judged window was busy; ``bursts``: busy periods that have passed; ``windows``: windows
    judged so far.
    """

    busy: bool = False
    bursts: int = 0
    windows: int = 0
    cpu_seconds: float = 0.0  # the open window's sums
    wall_seconds: float = 0.0
    n_threads: int | None = None

    def observe(self, cpu_seconds: float, wall_seconds: float, n_threads: int | None) -> Judgement | None:
        """Add a round's CPU and wall seconds (and the threads it ran with) to the open window; once the window
        spans :data:`~specviz.decoding.machine_load.JUDGED_SECONDS`, judge it and start the next. Returns the
        judgement, or None while the window is open or when the round has no CPU figures to judge."""
        if not n_threads or wall_seconds <= 0:
            return None
        if self.n_threads not in (None, n_threads):  # other threads: the open window's share means nothing now
            self.cpu_seconds = self.wall_seconds = 0.0
        self.n_threads = n_threads
        self.cpu_seconds += max(cpu_seconds, 0.0)
        self.wall_seconds += wall_seconds
        if self.wall_seconds < JUDGED_SECONDS:
            return None
        busy = is_busy(cpu_share(self.cpu_seconds, self.wall_seconds, n_threads))
        self.cpu_seconds = self.wall_seconds = 0.0
        self.windows += 1
        judged: Judgement = "busy" if busy else ("passed" if self.busy else "quiet")
        if judged == "passed":
            self.bursts += 1
        self.busy = busy
        return judged
