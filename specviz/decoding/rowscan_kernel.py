"""The row scan's C kernel: the softmax normaliser ``Σ exp(logit − max)`` of a logits row in one pass.

``rowscan_kernel.c`` is compiled once per machine (:mod:`specviz.backends.cbuild`; ``make install``
builds it, else the first use does) and loaded here. :func:`expsum` returns ``None`` when the kernel
cannot be had (no C compiler, or ``SPECVIZ_ROWSCAN_KERNEL=0``); :class:`~specviz.decoding.rowscan.ScoredRow`
then computes the same sum with numpy. Both agree to about 1e-7 relative (the tests check it).

``-fno-trapping-math`` lets the compiler turn the kernel's comparisons into vector selects; it changes
no result (the kernel never reads floating-point exception flags).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..backends import cbuild

SOURCE = Path(__file__).with_name("rowscan_kernel.c")
FLAGS = ("-O3", "-fno-trapping-math")

_lock = threading.Lock()
_fn: Any = None
_why: str | None = None


def disabled() -> bool:
    """True when ``SPECVIZ_ROWSCAN_KERNEL`` switches the kernel off (``0``, ``off``, ``no``, ``false``)."""
    return os.environ.get("SPECVIZ_ROWSCAN_KERNEL", "").lower() in ("0", "off", "no", "false")


def build(force: bool = False) -> Path:
    """Compile the kernel into the cache (unless cached) and return its path; raises ``cbuild.BuildError``."""
    return cbuild.build_library(SOURCE, "specviz_rowscan", FLAGS, force=force)


def load() -> Any:
    """The kernel's ``specviz_expsum`` function, or ``None`` when unavailable (:func:`unavailable_reason`)."""
    global _fn, _why
    if disabled():
        return None
    with _lock:
        if _fn is None and _why is None:
            try:
                fn = ctypes.CDLL(str(build())).specviz_expsum
                fn.restype = ctypes.c_double
                fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]
                _fn = fn
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
