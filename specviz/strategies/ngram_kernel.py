"""The n-gram search's C kernel (``ngram_kernel.c``): where an n-gram occurs in the token history, in
one call.

Compiled once per machine (:mod:`specviz.backends.cbuild`; ``make install`` builds it, else the first
use does) and loaded here. :func:`find_ngram` and :func:`last_match` return ``None`` when the kernel
cannot be had (no C compiler, or ``SPECVIZ_NGRAM_KERNEL=0`` when it is first used) or the arrays are not
contiguous int32; :mod:`specviz.strategies.history` and :mod:`specviz.strategies.ngram_map` then search
with numpy, with the same answers (the tests check both on the same histories).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..backends import cbuild

SOURCE = Path(__file__).with_name("ngram_kernel.c")
FLAGS = ("-O2",)

_lock = threading.Lock()
_fns: Any = None  # the loaded functions (a SimpleNamespace), or None
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
#: The kernel's functions: name -> (result type, argument types).
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "specviz_find_ngram": (_I64, [_PTR, _I64, _PTR, _I64, _I64, ctypes.c_int32]),
    "specviz_last_match": (_I64, [_PTR, _I64, _PTR, _I64, _I64, _I64]),
}
_why: str | None = None


def build(force: bool = False) -> Path:
    """Compile the kernel into the cache (unless cached) and return its path; raises ``cbuild.BuildError``."""
    return cbuild.build_library(SOURCE, "specviz_ngram", FLAGS, force=force)


def load() -> Any:
    """The kernel's functions (``find_ngram``, ``last_match``), or ``None`` when unavailable
    (:func:`unavailable_reason`). The switch and the build are looked at once, on first use: a
    drafter's look-up runs right after a decode, where reading the environment each time cost more
    than the search."""
    global _fns, _why
    if _fns is not None or _why is not None:
        return _fns
    with _lock:
        if _fns is None and _why is None:
            if cbuild.switched_off("SPECVIZ_NGRAM_KERNEL"):
                _why = "SPECVIZ_NGRAM_KERNEL switches it off"
                return None
            try:
                _fns = cbuild.bind(build(), _SIGNATURES)
            except (cbuild.BuildError, OSError, AttributeError) as e:
                _why = str(e)
        return _fns


def unavailable_reason() -> str | None:
    """Why the kernel is not used, or ``None`` when it is."""
    load()
    return _why


def _plain(a: np.ndarray) -> bool:
    return a.dtype == np.int32 and a.flags.c_contiguous


def find_ngram(arr: np.ndarray, pattern: np.ndarray, end: int, last: bool) -> int | None:
    """:func:`specviz.strategies.history.find_ngram` in one call of the kernel, or ``None`` without it."""
    fns = _fns if _fns is not None else load()
    if fns is None or not (_plain(arr) and _plain(pattern)):
        return None
    n = pattern.shape[0]
    return int(fns.find_ngram(arr.ctypes.data, arr.shape[0], pattern.ctypes.data, n, end, 1 if last else 0))


def last_match(arr: np.ndarray, pattern: np.ndarray, hi: int, lo: int) -> int | None:
    """ngram-map's search of positions ``lo < j <= hi`` in one call of the kernel, or ``None`` without it."""
    fns = _fns if _fns is not None else load()
    if fns is None or not (_plain(arr) and _plain(pattern)):
        return None
    return int(fns.last_match(arr.ctypes.data, arr.shape[0], pattern.ctypes.data, pattern.shape[0], hi, lo))
