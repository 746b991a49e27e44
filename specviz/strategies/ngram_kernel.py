"""The n-gram search's C kernel (``ngram_kernel.c``): where an n-gram occurs in the token history, and
ngram-mod's hashed pool (a hash, the last pending n-gram in a slot, a draft's chain), each in one call.

Compiled once per machine (:mod:`specviz.backends.cbuild`; ``make install`` builds it, else the first
use does) and loaded here. :func:`find_ngram` and :func:`last_match` return ``None`` when the kernel
cannot be had (no C compiler, or ``SPECVIZ_NGRAM_KERNEL=0`` when it is first used) or the arrays are not
contiguous int32; :mod:`specviz.strategies.history` and :mod:`specviz.strategies.ngram_map` then search
with numpy, with the same answers (the tests check both on the same histories).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

from ..backends import cbuild

SOURCE = Path(__file__).with_name("ngram_kernel.c")
FLAGS = ("-O2",)

_I64, _U64, _I32, _PTR = ctypes.c_int64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_void_p
#: The kernel's functions: name -> (result type, argument types).
_SIGNATURES: cbuild.Signatures = {
    "specviz_find_ngram": (_I64, [_PTR, _I64, _PTR, _I64, _I64, _I32]),
    "specviz_last_match": (_I64, [_PTR, _I64, _PTR, _I64, _I64, _I64]),
    "specviz_poly_hash": (_U64, [_PTR, _I64, _U64]),
    "specviz_poly_last_slot": (_I64, [_PTR, _I64, _I64, _I64, _U64, _U64, _U64]),
    "specviz_poly_chain": (_I64, [_PTR, _U64, _I32, _PTR, _I64, _U64, _I64, _PTR]),
}
#: The switch and the build are looked at once, on first use: a drafter's look-up runs right after a
#: decode, where reading the environment each time cost more than the search.
LIBRARY = cbuild.NativeLibrary(
    SOURCE, "specviz_ngram", _SIGNATURES, "SPECVIZ_NGRAM_KERNEL", (FLAGS,), switch_read_once=True
)
_fns: Any = None  # the loaded functions once loaded (read first on the look-ups' path)


def build(force: bool = False) -> Path:
    """Compile the kernel into the cache (unless cached) and return its path; raises ``cbuild.BuildError``."""
    return LIBRARY.build(force)


def load() -> Any:
    """The kernel's functions (``find_ngram``, ``last_match``, ``poly_*``), or ``None`` when unavailable
    (:func:`unavailable_reason`)."""
    global _fns
    _fns = LIBRARY.load()
    return _fns


def unavailable_reason() -> str | None:
    """Why the kernel is not used, or ``None`` when it is."""
    return LIBRARY.unavailable_reason()


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


def _address(arr: np.ndarray, start: int) -> int:
    """The address of ``arr[start]`` (``arr`` contiguous int32)."""
    return int(arr.ctypes.data) + 4 * start


def poly_hash(arr: np.ndarray, start: int, n: int, mult: int) -> int | None:
    """ngram-mod's hash of ``arr[start : start + n]`` (see ``ngram_kernel.c``), or ``None`` without the kernel."""
    fns = _fns if _fns is not None else load()
    if fns is None or not _plain(arr) or not 0 <= start <= arr.shape[0] - n:
        return None
    return int(fns.poly_hash(_address(arr, start), n, mult))


def poly_last_slot(arr: np.ndarray, start: int, stop: int, n: int, mult: int, pool_size: int, slot: int) -> int | None:
    """The last ``p`` in ``[start, stop)`` whose n-gram ``arr[p : p + n]`` lands in ``slot`` of a pool of
    ``pool_size`` (-1: none does), or ``None`` without the kernel."""
    fns = _fns if _fns is not None else load()
    if fns is None or not _plain(arr) or start < 0 or stop + n - 1 > arr.shape[0]:
        return None
    return int(fns.poly_last_slot(arr.ctypes.data, start, stop, n, mult, pool_size, slot))


def poly_chain(
    pool: np.ndarray, empty: int, arr: np.ndarray, start: int, n: int, mult: int, n_max: int
) -> list[int] | None:
    """The chain of pool tokens that follows the n-gram ``arr[start : start + n]`` (up to ``n_max``, ending
    at the first slot holding ``empty``), or ``None`` without the kernel."""
    fns = _fns if _fns is not None else load()
    if fns is None or not (_plain(arr) and _plain(pool)) or not 0 <= start <= arr.shape[0] - n or n_max < 0:
        return None
    out = (ctypes.c_int32 * max(n_max, 1))()
    k = fns.poly_chain(pool.ctypes.data, pool.shape[0], empty, _address(arr, start), n, mult, n_max, out)
    return out[:k]
