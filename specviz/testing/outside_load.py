"""Outside load for tests and benchmarks: bounded busy-loop processes that hold the cores while a block runs, as a
compile or another job would (:func:`busy_loops`)."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["busy_loop_code", "busy_loops"]


def busy_loop_code(seconds: float, on: float | None = None) -> str:
    """Python source of a process that spins for ``seconds`` (always, or ``on`` seconds of every ``2 * on``, in
    step with the wall clock so that every such process bursts at once) and then exits by itself."""
    if on is None:
        return f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
    return (
        f"import time\nend = time.time() + {seconds}\n"
        f"while (t := time.time()) < end:\n"
        f"    if t % {2 * on} < {on}: pass\n"
        f"    else: time.sleep({2 * on} - t % {2 * on})\n"
    )


@contextmanager
def busy_loops(n: int, seconds: float = 120.0, on: float | None = None) -> Iterator[None]:
    """``n`` busy-loop processes (:func:`busy_loop_code`; each exits by itself after ``seconds`` should the block
    outlive it) while the block runs; killed when it ends."""
    procs = [subprocess.Popen([sys.executable, "-c", busy_loop_code(seconds, on)]) for _ in range(n)]
    time.sleep(0.3)  # every process spinning before the block starts
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
