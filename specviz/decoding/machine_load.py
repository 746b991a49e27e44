"""How much of the machine a run had: the rule that calls a CPU share "busy", its wording, and the load average.

A round's *CPU share* (:func:`~specviz.decoding.telemetry.cpu_share`) is the process's CPU seconds over the
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

__all__ = ["BUSY_SHARE", "is_busy", "share_text", "load_average"]

#: Below this CPU share the machine is called busy. Measured on this project's 2-core host with
#: ``n_threads`` 2 (``specviz run``'s figures, greedy, 96 tokens): the embedded model kept 0.92 (``none``)
#: and 0.96 (``ngram-simple``) of its threads' time while the host ran only light work; with two busy-loop
#: processes holding both cores it kept 0.35 and 0.52 (12.7 and 15.9 tokens/s against 68 and 77). Python's
#: single-threaded part of a round (drafting, acceptance, bookkeeping) is what keeps a quiet run below 1.
#: A toy model whose decode takes less time than that Python part (the tests' tiny models: 0.5 with 2
#: threads, quiet or not) keeps about one thread busy, so its share says nothing of the machine; the
#: rule is for models whose verify batches are most of a round, as every real one's are.
BUSY_SHARE = 0.6


def is_busy(share: float | None) -> bool:
    """Whether a CPU share says other work held the cores (below :data:`BUSY_SHARE`); an unknown share
    (None) is not called busy."""
    return share is not None and share < BUSY_SHARE


def share_text(share: float | None, n_threads: int | None) -> str:
    """The CPU share for people: ``"CPU share 38% of 2 threads: the machine was busy"`` (the clause only
    when :func:`is_busy`), or ``"CPU share not available"`` without a share."""
    if share is None or not n_threads:
        return "CPU share not available"
    text = f"CPU share {share:.0%} of {n_threads} thread{'s' if n_threads != 1 else ''}"
    return text + ": the machine was busy" if is_busy(share) else text


def load_average() -> tuple[float, float, float] | None:
    """The system's load average over 1, 5 and 15 minutes (``os.getloadavg``), or None where the system
    does not report one."""
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError):
        return None
    return (float(one), float(five), float(fifteen))
