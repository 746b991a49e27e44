"""The row scan's C kernel: the softmax normaliser ``Σ exp(logit − max)`` of a logits row in one pass,
and the whole greedy scan of a row (first maximum, its value and the normaliser) in one read of it.

``rowscan_kernel.c`` is compiled once per machine (:mod:`specviz.backends.cbuild`; ``make install``
builds it, else the first use does) and loaded here. :func:`expsum` and :func:`scan` return ``None`` when
the kernel cannot be had (no C compiler, or ``SPECVIZ_ROWSCAN_KERNEL=0``); :class:`~specviz.decoding.rowscan.ScoredRow`
then computes the same sum with numpy. Both agree to about 1e-7 relative (the tests check it).

``-fno-trapping-math`` lets the compiler turn the kernel's comparisons into vector selects; it changes
no result (the kernel never reads floating-point exception flags).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..backends import cbuild

SOURCE = Path(__file__).with_name("rowscan_kernel.c")
FLAGS = ("-O3", "-fno-trapping-math")

_lock = threading.Lock()
_fn: Any = None
_scan_fn: Any = None
_why: str | None = None
_local = threading.local()  # per-thread output cells for scan (a ctypes object a call writes into)


def disabled() -> bool:
    """True when ``SPECVIZ_ROWSCAN_KERNEL`` switches the kernel off (``0``, ``off``, ``no``, ``false``)."""
    return os.environ.get("SPECVIZ_ROWSCAN_KERNEL", "").lower() in ("0", "off", "no", "false")


def build(force: bool = False) -> Path:
    """Compile the kernel into the cache (unless cached) and return its path; raises ``cbuild.BuildError``."""
    return cbuild.build_library(SOURCE, "specviz_rowscan", FLAGS, force=force)


def load() -> Any:
    """The kernel's ``specviz_expsum`` function, or ``None`` when unavailable (:func:`unavailable_reason`)."""
    global _fn, _scan_fn, _why
    if disabled():
        return None
    with _lock:
        if _fn is None and _why is None:
            try:
                lib = ctypes.CDLL(str(build()))
                fn = lib.specviz_expsum
                fn.restype = ctypes.c_double
                fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]
                sc = lib.specviz_scan
                sc.restype = ctypes.c_int
                sc.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
                _fn, _scan_fn = fn, sc
            except (cbuild.BuildError, OSError) as e:
                _why = str(e)
        return _fn


def unavailable_reason() -> str | None:
    """Why the kernel is not used, or ``None`` when it is."""
    if disabled():
        return "SPECVIZ_ROWSCAN_KERNEL switches it off"
    load()
    return _why


def expsum(row: np.ndarray, m: float) -> float | None:
    """``Σ exp(row − m)`` for a contiguous float32 row whose maximum is ``m`` (NaN counts as −∞), or
    ``None`` without the kernel."""
    fn = load()
    if fn is None or row.dtype != np.float32 or not row.flags.c_contiguous:
        return None
    return float(fn(row.ctypes.data, row.shape[0], m))


class Scan(NamedTuple):
    """One row read once: the first maximum's index (NaN read as −∞), its value, ``Σ exp(row − max)``
    (meaningless when the maximum is not finite) and whether the row holds a NaN."""

    best: int
    max: float
    z: float
    has_nan: bool


def scan(row: np.ndarray) -> Scan | None:
    """The greedy scan of a contiguous float32 row in one pass (``specviz_scan``), or ``None`` without
    the kernel."""
    if load() is None or row.dtype != np.float32 or not row.flags.c_contiguous or row.ndim != 1:
        return None
    cells = getattr(_local, "cells", None)
    if cells is None:
        cells = _local.cells = (ctypes.c_int64(), (ctypes.c_double * 2)())
    best, out = cells
    has_nan = _scan_fn(row.ctypes.data, row.shape[0], ctypes.addressof(best), ctypes.addressof(out))
    return Scan(best.value, out[0], out[1], bool(has_nan))
