"""Benchmark: each pass of the row-scan kernel alone, its plain-C build against its vector builds.

``specviz/decoding/rowscan_kernel.c`` keeps a hand-written vector build of a pass only where it beats the
plain-C pass, built by the compiler with its own vectorisation, by more than 10% (the C file says which
passes have one and what was measured). This script measures that: each C file given is compiled as the
kernel is (``-O3 -fno-trapping-math -fopenmp``) into a temporary folder and every pass is timed on
262,144-wide float32 rows (the embedded model's vocabulary) on one thread, through each build the file
exports: ``plain C`` (the ``_generic`` function or the ``generic`` flag: what the compiler makes of the
plain loop, with ``target_clones`` where the file asks for it), ``plain C, x86-64-v3`` (the same built for
AVX2 and FMA only, as a CPU without AVX-512 runs it: a second build with ``SPECVIZ_CLONES`` defined on the
command line), ``avx2`` (the hand-written ``_avx2`` function, where there is one) and ``dispatched`` (what
the kernel runs on this CPU). Several files (``--source``, e.g. a copy of the file from an older commit)
are timed side by side in one process.

The builds are interleaved: every repeat times each build of a pass in turn (``--calls`` calls, the mean
taken), in an order that alternates from repeat to repeat, and the table gives the median over
``--repeats`` in CPU microseconds a call, with each build's ratio to the first build of its pass. The rows cycle
through eight of them (8 MiB, more than a core's second-level cache), as rows that arrive from a decode
do. The load average is printed beside the figures: other work on the machine stretches them.

Usage: python benchmarks/bench_row_kernel.py [--source FILE.c ...] [--repeats 41] [--calls 20]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

KERNEL = Path(__file__).resolve().parent.parent / "specviz" / "decoding" / "rowscan_kernel.c"
#: The kernel's build flags (rowscan_kernel.py compiles it with these and -O2 before them).
FLAGS = ("-O3", "-fno-trapping-math", "-fopenmp")
WIDTH = 262_144
ROWS = 8
TOP_N = 5
NUCLEUS_BUCKETS = 1024

c_int64, c_double, c_void_p = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p


#: The plain C built for one instruction set instead of cloned for each (the C file takes SPECVIZ_CLONES
#: from the command line when it is given there).
AVX2_ONLY = '-DSPECVIZ_CLONES=__attribute__((target("arch=x86-64-v3")))'


def compile_kernel(source: Path, folder: Path, name: str, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    """``source`` compiled as a shared library in ``folder`` with the kernel's flags (and ``extra``), loaded."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    out = folder / f"{name}.so"
    cmd = [*cc.split(), "-O2", *FLAGS, *extra, "-shared", "-fPIC", "-o", str(out), str(source)]
    subprocess.run(cmd, check=True)
    return ctypes.CDLL(str(out))


def _fn(lib: ctypes.CDLL, name: str, res: Any, args: list[Any]) -> Any:
    """``lib``'s function ``name`` typed, or ``None`` when the library does not export it."""
    fn = getattr(lib, name, None)
    if fn is not None:
        fn.restype, fn.argtypes = res, args
    return fn


class Rows:
    """Logits-like rows (normal, scale 3), a second set for a draft model, and the outputs the calls write."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.p = [(rng.standard_normal(WIDTH) * 3).astype(np.float32) for _ in range(ROWS)]
        self.q = [(rng.standard_normal(WIDTH) * 3).astype(np.float32) for _ in range(ROWS)]
        self.maxima = [float(r.max()) for r in self.p]
        self.sums = [float(np.exp(r.astype(np.float64) - m).sum()) for r, m in zip(self.p, self.maxima)]
        self.qmaxima = [float(r.max()) for r in self.q]
        self.qsums = [float(np.exp(r.astype(np.float64) - m).sum()) for r, m in zip(self.q, self.qmaxima)]
        self.best = ctypes.c_int64()
        self.out = (ctypes.c_double * 3)()
        self.idx = np.empty(64, dtype=np.int64)
        self.blocks = np.empty(WIDTH // 256 + 1, dtype=np.float64)
        self.mass = np.empty(NUCLEUS_BUCKETS, dtype=np.float64)
        self.i = 0

    def next(self) -> int:
        """The index of the next row to read (cycling)."""
        self.i = (self.i + 1) % ROWS
        return self.i


def passes(lib: ctypes.CDLL, rows: Rows) -> dict[str, dict[str, Callable[[], Any]]]:
    """For each pass of ``lib``, its builds: name -> a call on the next row."""
    sig4 = [c_void_p, c_int64, c_void_p, c_void_p]
    scan = {s: _fn(lib, "specviz_scan" + s, ctypes.c_int, sig4) for s in ("_generic", "_avx2", "")}
    topk = {
        s: _fn(lib, "specviz_topk" + s, c_int64, [c_void_p, c_int64, c_int64, c_void_p])
        for s in ("_generic", "_avx2", "")
    }
    rank = {s: _fn(lib, "specviz_rank" + s, c_int64, [c_void_p, c_int64, c_int64]) for s in ("_generic", "_avx2", "")}
    expsum = _fn(lib, "specviz_expsum", c_double, [c_void_p, c_int64, ctypes.c_float])
    tempered = _fn(
        lib, "specviz_tempered", ctypes.c_int, [c_void_p, c_int64, c_double, c_int64, c_void_p, c_void_p, ctypes.c_int]
    )
    residual = _fn(
        lib, "specviz_residual", c_double, [c_void_p, c_void_p, c_int64, *[c_double] * 5, c_void_p, ctypes.c_int]
    )
    nucleus = _fn(
        lib, "specviz_nucleus_mass", c_int64, [c_void_p, c_int64, *[c_double] * 3, c_int64, c_void_p, ctypes.c_int]
    )
    _fn(lib, "specviz_set_scan_threads", ctypes.c_int, [ctypes.c_int])(1)  # one thread: the pass itself
    best, out = ctypes.addressof(rows.best), ctypes.addressof(rows.out)
    idx, blocks, mass = rows.idx.ctypes.data, rows.blocks.ctypes.data, rows.mass.ctypes.data
    p = [r.ctypes.data for r in rows.p]
    q = [r.ctypes.data for r in rows.q]
    ranked = [int(np.argsort(r)[WIDTH // 2]) for r in rows.p]  # a median token: the rank's pass runs to it
    width = (np.log(WIDTH / 0.1) + 1.0) / NUCLEUS_BUCKETS  # top-p 0.9, as sampling.py sets it

    def builds(table: dict[str, Any], call: Callable[[Any], Callable[[], Any]]) -> dict[str, Callable[[], Any]]:
        names = {"_generic": "plain C", "_avx2": "avx2", "": "dispatched"}
        return {names[s]: call(fn) for s, fn in table.items() if fn is not None}

    def flag(call: Callable[[int], Any]) -> dict[str, Callable[[], Any]]:
        return {"plain C": lambda: call(1), "dispatched": lambda: call(0)}

    def nxt() -> int:
        return rows.next()

    return {
        "expsum": {"plain C": lambda: expsum(p[(i := nxt())], WIDTH, rows.maxima[i])},
        "scan": builds(scan, lambda fn: lambda: fn(p[nxt()], WIDTH, best, out)),
        "topk": builds(topk, lambda fn: lambda: fn(p[nxt()], WIDTH, TOP_N, idx)),
        "rank": builds(rank, lambda fn: lambda: fn(p[(i := nxt())], WIDTH, ranked[i])),
        "tempered": flag(lambda g: tempered(p[nxt()], WIDTH, 1.0 / 0.8, -1, out, blocks, g)),
        "residual": flag(
            lambda g: residual(
                p[(i := nxt())],
                q[i],
                WIDTH,
                rows.maxima[i],
                rows.sums[i],
                rows.qmaxima[i],
                rows.qsums[i],
                1.0,
                blocks,
                g,
            )
        ),
        "nucleus_mass": flag(
            lambda g: nucleus(p[(i := nxt())], WIDTH, rows.maxima[i], 1.0, width, NUCLEUS_BUCKETS, mass, g)
        ),
    }


def timed(fn: Callable[[], Any], calls: int) -> float:
    """Mean microseconds of ``fn()`` over ``calls`` calls, in the calling thread's CPU time (a busy machine
    takes the core away between calls; it still shares the caches)."""
    t = time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.thread_time_ns() - t) / calls / 1e3


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--source", type=Path, action="append", help="a kernel C file (repeatable; default: the kernel)")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args(argv)
    sources = args.source or [KERNEL]
    rows = Rows()
    with tempfile.TemporaryDirectory() as tmp:
        # (pass, label) -> the call; label is "build" or "file: build" with several files
        table: dict[str, dict[str, Callable[[], Any]]] = {}
        for n, src in enumerate(sources):
            lib = compile_kernel(src, Path(tmp), f"k{n}")
            v3 = compile_kernel(src, Path(tmp), f"k{n}v3", (AVX2_ONLY,))
            prefix = "" if len(sources) == 1 else f"{src.name}#{n}: "
            for (name, builds), (_, v3_builds) in zip(passes(lib, rows).items(), passes(v3, rows).items()):
                for build, fn in builds.items():
                    table.setdefault(name, {})[prefix + build] = fn
                    if build == "plain C":
                        table[name][prefix + "plain C, x86-64-v3"] = v3_builds[build]
        times: dict[tuple[str, str], list[float]] = {}
        load = [os.getloadavg()[0]]
        for fns in table.values():
            for fn in fns.values():
                fn()  # warm: the pass's code and the clones' resolution
        for r in range(args.repeats):
            for name, fns in table.items():
                order = list(fns.items())
                order = order if r % 2 == 0 else order[::-1]
                for label, fn in order:
                    times.setdefault((name, label), []).append(timed(fn, args.calls))
        load.append(os.getloadavg()[0])
    print(
        f"bench_row_kernel: {WIDTH}-wide float32 rows, one thread, median of {args.repeats} repeats of "
        f"{args.calls} calls, interleaved; load average {load[0]:.2f} before, {load[1]:.2f} after"
    )
    print(f"{'pass':<14}{'build':<44}{'µs a call':>10}{'vs plain C':>12}")
    for name, fns in table.items():
        base = statistics.median(times[(name, next(iter(fns)))])
        for label in fns:
            med = statistics.median(times[(name, label)])
            print(f"{name:<14}{label:<44}{med:>10.1f}{med / base:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
