"""How much of the machine a run had: the rule that calls a CPU share "busy", its wording, and the load average.

A round's *CPU share* (:func:`cpu_share`) is the process's CPU seconds over the
round's wall seconds times the threads llama.cpp was asked for. A run that had its threads' cores to itself
keeps them busy for most of its wall time: llama.cpp's workers compute (and spin a little while waiting for
the next graph), and only Python's single-threaded part of a round (drafting, acceptance, bookkeeping) leaves
the other threads idle. A run sharing its cores with other work gets a slice of them: the wall time goes on
while its threads wait for a core, and the share falls.

:data:`BUSY_SHARE` and :func:`share_text` are the one place that rule and its wording live; the telemetry
(``cpu_busy``), ``specviz run``'s line and the advisor all use them.
"""

from __future__ import annotations

import os

__all__ = [
    "BUSY_SHARE",
    "JUDGED_SECONDS",
    "cpu_share",
    "is_busy",
    "judged_share",
    "judged_share_text",
    "share_text",
    "load_average",
]

#: Below this CPU share the machine is called busy. Measured on this project's 2-core host with
#: ``n_threads`` 2, greedy (``specviz run``'s figures): on the quiet host (load average 0.0) the embedded
#: model kept 1.00 of its threads' time over 96 tokens with ``none`` (77 tokens/s) and with ``ngram-simple``
#: (87), and the tests' tiny model, whose rounds are mostly Python, 0.81 and 1.07 over 200; with two
#: busy-loop processes holding both cores the embedded model kept 0.35 and 0.52 (12.7 and 15.9 tokens/s) and
#: the tiny model 0.48 and 0.59; under steady outside load (load average 4) the embedded model kept 0.33.
#: Judge a run's share (or a window's: sums over its rounds), not one round's: the kernel adds a running
#: worker thread's time at its scheduler tick, so a round shorter than a few ticks reads noisily (the tiny
#: model's rounds read 0.5 or up to 18; the embedded model's quiet rounds 0.80 to 1.13, median 0.97).
BUSY_SHARE = 0.6
#: A share is judged (called busy or not) only over at least this many wall seconds, a run's or a window of
#: rounds': 50 or more scheduler ticks, so the tick's accounting error is a few per cent (see above).
JUDGED_SECONDS = 0.2


def cpu_share(cpu_seconds: float, wall_seconds: float, n_threads: int | None) -> float | None:
    """The share of its threads' time a run had: the process's CPU seconds over wall seconds times the
    threads asked for (1.0: every thread busy the whole time; llama.cpp's waiting workers spin a little, so a
    quiet run can pass 1). None when no wall time passed or the threads are not known."""
    if wall_seconds <= 0 or not n_threads:
        return None
    return cpu_seconds / (wall_seconds * n_threads)


def is_busy(share: float | None) -> bool:
    """Whether a CPU share says other work held the cores (below :data:`BUSY_SHARE`); an unknown share
    (None) is not called busy."""
    return share is not None and share < BUSY_SHARE


def judged_share(share: float | None, wall_seconds: float) -> float | None:
    """``share`` where it was taken over at least :data:`JUDGED_SECONDS` of wall time, else None (too short
    to judge: :func:`is_busy` calls it not busy)."""
    return share if share is not None and wall_seconds >= JUDGED_SECONDS else None


def share_text(share: float | None, n_threads: int | None) -> str:
    """The CPU share for people: ``"CPU share 38% of 2 threads: the machine was busy"`` (the clause only
    when :func:`is_busy`), or ``"CPU share not available"`` without a share."""
    if share is None or not n_threads:
        return "CPU share not available"
    text = f"CPU share {share:.0%} of {n_threads} thread{'s' if n_threads != 1 else ''}"
    return text + ": the machine was busy" if is_busy(share) else text


def judged_share_text(share: float | None, wall_seconds: float, n_threads: int | None) -> str:
    """:func:`share_text` of a share taken over ``wall_seconds``, or ``"CPU share not judged (0.05 s)"``
    where a share was taken over less than :data:`JUDGED_SECONDS` (:func:`judged_share`)."""
    if share is not None and n_threads and judged_share(share, wall_seconds) is None:
        return f"CPU share not judged ({wall_seconds:.2f} s)"
    return share_text(judged_share(share, wall_seconds), n_threads)


def load_average() -> tuple[float, float, float] | None:
    """The system's load average over 1, 5 and 15 minutes (``os.getloadavg``), or None where the system
    does not report one."""
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError):
        return None
    return (float(one), float(five), float(fifteen))
