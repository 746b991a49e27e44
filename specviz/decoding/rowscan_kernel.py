"""The logits-row reader in C (``rowscan_kernel.c``): the native implementation of the questions
:mod:`specviz.decoding.rows_reference` answers in numpy (same names, same arguments, the same named
results): the greedy scan of a row (first maximum, its value and the softmax normaliser) in one read of it,
the normaliser alone, a rejection row's top tokens and a token's rank, a greedy verification's rows in one
call (:func:`verify_greedy`), and for sampled decoding the tempered softmax's sums and a draw from it, a
draft model's residual and the mass by distance below the maximum that top-p's nucleus is found from.
Only the seam, :mod:`specviz.decoding.rowscan`, imports this module in the core.

The library is compiled once per machine and loaded through :class:`specviz.backends.cbuild.NativeLibrary`
(``make install`` builds it, else the first use does). Every function returns ``None`` where the kernel
does not read the row (no C compiler, ``SPECVIZ_ROWSCAN_KERNEL=0``, a row that is not contiguous float32,
a question outside what the kernel holds); the seam then asks the reference. Both agree to about 1e-7
relative (the tests check it). The packed outputs of ``specviz_verify_greedy`` are turned into named
fields in one place, :func:`_greedy_rows`.

``-fno-trapping-math`` lets the compiler turn the kernel's comparisons into vector selects; it changes
no result (the kernel never reads floating-point exception flags).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..backends import cbuild
from .rows_reference import GreedyRows, Refusal, RowScan, RowSums, TemperedSums

SOURCE = Path(__file__).with_name("rowscan_kernel.c")
FLAGS = ("-O3", "-fno-trapping-math")

_local = threading.local()  # per-thread output cells (ctypes objects a call writes into)

#: The kernel's functions: name -> (result type, argument types).
_SIGNATURES: cbuild.Signatures = {
    "specviz_expsum": (ctypes.c_double, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]),
    "specviz_scan": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]),
    "specviz_topk": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]),
    "specviz_rank": (ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]),
    "specviz_scan_threads": (ctypes.c_int, []),
    "specviz_default_scan_threads": (ctypes.c_int, []),
    "specviz_set_scan_threads": (ctypes.c_int, [ctypes.c_int]),
    "specviz_vector_paths": (ctypes.c_int, []),
    "specviz_tempered": (
        ctypes.c_int,
        [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_double,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
        ],
    ),
    "specviz_residual": (
        ctypes.c_double,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, *[ctypes.c_double] * 5, ctypes.c_void_p, ctypes.c_int],
    ),
    "specviz_residual_pick": (
        ctypes.c_int64,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, *[ctypes.c_double] * 6, ctypes.c_void_p],
    ),
    "specviz_tempered_pick": (
        ctypes.c_int64,
        [
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_double,
            ctypes.c_double,
            ctypes.c_int64,
            ctypes.c_double,
            ctypes.c_void_p,
        ],
    ),
    "specviz_nucleus_mass": (
        ctypes.c_int64,
        [ctypes.c_void_p, ctypes.c_int64, *[ctypes.c_double] * 3, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int],
    ),
    "specviz_verify_greedy": (
        ctypes.c_int64,
        [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ],
    ),
}

#: The most tokens :func:`topk` returns (the kernel keeps them in a fixed array).
TOPK_MAX = 64
#: The most pieces :func:`set_scan_threads` lets a long row be cut into (``SPECVIZ_SCAN_THREADS_MAX``).
SCAN_THREADS_MAX = 16
#: The environment variable read when the kernel loads: the cap :func:`set_scan_threads` sets.
SCAN_THREADS_ENV = "SPECVIZ_SCAN_THREADS"


def disabled() -> bool:
    """True when ``SPECVIZ_ROWSCAN_KERNEL`` switches the kernel off (``0``, ``off``, ``no``, ``false``)."""
    return LIBRARY.switched_off()


def build(force: bool = False) -> Path:
    """Compile the kernel into the cache (unless cached) and return its path; raises ``cbuild.BuildError``.

    With OpenMP where the compiler has it (a long row is scanned in pieces on several threads, see the C
    file), else without (every row on the calling thread)."""
    return LIBRARY.build(force)


def load() -> Any:
    """The kernel's functions (attributes named as in the C file, without ``specviz_``), or ``None``
    when unavailable (:func:`unavailable_reason`)."""
    return LIBRARY.load()


def _cap_from_environment(fns: Any) -> None:
    """Apply ``SPECVIZ_SCAN_THREADS`` when the kernel loads. A value that is not a whole number from 1 to
    ``SCAN_THREADS_MAX`` is not applied and a warning says so: the kernel is loaded on a round's path, and a
    tuning variable must not fail the round."""
    raw = os.environ.get(SCAN_THREADS_ENV, "").strip()
    if not raw:
        return
    try:
        cap = _checked_cap(int(raw) if raw.lstrip("-").isdigit() else raw)
    except ValueError as e:
        warnings.warn(
            f"{SCAN_THREADS_ENV}={raw!r}: {e}; a long row is cut into at most {int(fns.scan_threads())} pieces, "
            "as without it",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    fns.set_scan_threads(cap)


def _checked_cap(cap: object) -> int:
    """``cap`` when it is a whole number from 1 to ``SCAN_THREADS_MAX``, else ``ValueError`` saying so."""
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= SCAN_THREADS_MAX:
        raise ValueError(f"scan threads: {cap!r} is not a whole number from 1 to {SCAN_THREADS_MAX}")
    return cap


#: The kernel through the one loader of C helpers; the switch is read at every :func:`load`, so that a
#: test can turn the kernel off and on (a round's greedy path keeps its function, see :func:`verify_greedy`).
LIBRARY = cbuild.NativeLibrary(
    SOURCE,
    "specviz_rowscan",
    _SIGNATURES,
    "SPECVIZ_ROWSCAN_KERNEL",
    ((*FLAGS, "-fopenmp"), FLAGS),
    on_load=_cap_from_environment,
)


def unavailable_reason() -> str | None:
    """Why the kernel is not used, or ``None`` when it is."""
    return LIBRARY.unavailable_reason()


def expsum(row: np.ndarray, m: float) -> float | None:
    """``Σ exp(row − m)`` for a contiguous float32 row whose maximum is ``m`` (NaN counts as −∞), or
    ``None`` without the kernel."""
    fns = load()
    if fns is None or not _plain(row):
        return None
    return float(fns.expsum(row.ctypes.data, row.shape[0], m))


def _plain(row: np.ndarray) -> bool:
    return row.dtype == np.float32 and row.ndim == 1 and row.flags.c_contiguous


def scan(row: np.ndarray) -> RowScan | None:
    """The greedy scan of a contiguous float32 row in one pass (``specviz_scan``), or ``None`` without
    the kernel."""
    fns = load()
    if fns is None or not _plain(row):
        return None
    cells = getattr(_local, "scan", None)
    if cells is None:
        cells = _local.scan = (ctypes.c_int64(), (ctypes.c_double * 2)())
    best, out = cells
    has_nan = fns.scan(row.ctypes.data, row.shape[0], ctypes.addressof(best), ctypes.addressof(out))
    return RowScan(best.value, out[0], out[1], bool(has_nan))


def topk(row: np.ndarray, k: int) -> np.ndarray | None:
    """The indices of a NaN-free row's ``k`` largest values, largest first, ties to the lower index, or
    ``None`` without the kernel (or for ``k`` outside 1 … min(len(row), :data:`TOPK_MAX`))."""
    fns = load()
    if fns is None or not _plain(row) or not 1 <= k <= min(row.shape[0], TOPK_MAX):
        return None
    out = np.empty(k, dtype=np.int64)
    fns.topk(row.ctypes.data, row.shape[0], k, out.ctypes.data)
    return out


def rank(row: np.ndarray, token: int) -> int | None:
    """``token``'s rank in a NaN-free row (1 = the first maximum; ties go to the lower id), or ``None``
    without the kernel."""
    fns = load()
    if fns is None or not _plain(row):
        return None
    return int(fns.rank(row.ctypes.data, row.shape[0], token))


#: Where the kernel reads a verify batch's rows: ``(address of llama_get_logits_ith, the llama_context's
#: address, the row width)`` (:meth:`specviz.backends.llama.LlamaContext.native_rows`).
NativeRowSource = tuple[int, int, int]


class GreedyBuffers:
    """One thread's buffers for :func:`verify_greedy` and the kernel's function, kept and grown, never
    allocated per round, and the one statement in Python of ``specviz_verify_greedy``'s packed layout
    (the C file states it for the kernel), for ``k`` draft tokens and ``top_n`` alternatives:

    ``ints``
        ``[0, rows)``: each row's first maximum; ``[k + 1, k + 1 + top_n)``: the refusing row's top tokens,
        best first; ``k + 1 + top_n``: the refused draft token's rank.
    ``floats``
        :data:`ROW_FLOATS` per row read (its maximum, ``Σ exp(row − max)``, the value at its choice); from
        ``ROW_FLOATS · (k + 1)``: the value at the refused draft token, then the top tokens' values.

    ctypes arrays, not numpy: a slice of one is a list in one C call, where a numpy array's ``tolist``
    and the slicing around it run code that a decode has just pushed out of the caches (measured: the
    greedy round's Python was mostly such cold code, see docs/performance.md)."""

    #: Floats per row read: its maximum, its normaliser, the value at its choice.
    ROW_FLOATS = 3

    __slots__ = ("size", "fn", "draft", "ints", "floats", "addresses")

    def __init__(self, fn: Any, k: int, top_n: int) -> None:
        self.size = (k, top_n)
        self.fn = fn
        self.draft = (ctypes.c_int64 * max(k, 1))()
        self.ints = (ctypes.c_int64 * (k + 2 + top_n))()
        self.floats = (ctypes.c_double * (self.ROW_FLOATS * (k + 1) + 1 + top_n))()
        self.addresses = tuple(ctypes.addressof(a) for a in (self.draft, self.ints, self.floats))

    def fits(self, k: int, top_n: int) -> bool:
        """Whether these buffers hold a round of ``k`` draft tokens and ``top_n`` alternatives."""
        return k <= self.size[0] and top_n == self.size[1]


def _greedy_rows(bufs: GreedyBuffers, rows: int, k: int, top_n: int) -> GreedyRows:
    """The named fields of what ``specviz_verify_greedy`` wrote for ``rows`` rows read of a ``k``-token draft
    (the layout: :class:`GreedyBuffers`). Every probability is ``exp(value − max) / Σ``, as
    :class:`~specviz.decoding.rows_reference.NumpyRow` computes it from the same three figures."""
    exp = math.exp
    fl = bufs.floats[: GreedyBuffers.ROW_FLOATS * rows]
    maxima, sums, chosen = fl[0::3], fl[1::3], fl[2::3]
    tokens = tuple(bufs.ints[:rows])
    probs = tuple(exp(v - m) / z for v, m, z in zip(chosen, maxima, sums))
    if rows == k + 1:  # every draft token was the row's choice: the last row is the bonus
        return GreedyRows(tokens, probs, None)
    m, z = maxima[-1], sums[-1]
    top = bufs.ints[k + 1 : k + 2 + top_n]  # the top tokens, then the refused token's rank
    base = GreedyBuffers.ROW_FLOATS * (k + 1)
    values = bufs.floats[base : base + 1 + top_n]  # the refused token's value, then the top tokens'
    alternatives = tuple((t, exp(v - m) / z) for t, v in zip(top[:top_n], values[1:]))
    margin = values[1] - values[2] if top_n >= 2 else None
    return GreedyRows(tokens, probs, Refusal(exp(values[0] - m) / z, alternatives, top[top_n], margin))


def verify_greedy(source: NativeRowSource, draft: Sequence[int], top_n: int) -> GreedyRows | None:
    """:func:`specviz.decoding.rows_reference.verify_greedy` in one call of the kernel, on the rows of a
    llama.cpp context (``source``): rows ``0 … len(draft)``, each read only while the draft agrees, the
    refusing row's ``top_n`` tokens and the draft token's rank. ``None`` without the kernel, or when the
    round needs the row-by-row path (a row without logits, a NaN, a non-finite maximum, a draft token
    outside the vocabulary, ``top_n`` outside 1 … min(``n_vocab``, :data:`TOPK_MAX`)): that path then gives
    exactly what it always did.

    The kernel is looked up (and ``SPECVIZ_ROWSCAN_KERNEL`` read) when a thread first verifies and when
    its buffers grow, not every round: reading the environment right after a decode cost as much as the
    rest of the round's bookkeeping (its code is out of the caches by then)."""
    k = len(draft)
    bufs = getattr(_local, "greedy", None)
    if bufs is None or not bufs.fits(k, top_n):
        fns = load()
        if fns is None:
            return None
        bufs = _local.greedy = GreedyBuffers(fns.verify_greedy, max(k, 16), top_n)
    if k:
        bufs.draft[:k] = draft
    d_addr, i_addr, f_addr = bufs.addresses
    got = int(bufs.fn(source[0], source[1], source[2], d_addr, k, top_n, i_addr, f_addr))
    if got <= 0:
        return None
    return _greedy_rows(bufs, got, k, top_n)


class TemperedBuffers:
    """One thread's buffers for :func:`tempered` and :func:`tempered_pick`: the three sums and the per-block
    sums that a draw walks, kept and grown, never allocated per row. ``stamp`` counts the rows scanned
    into them, so that a reader can tell whether the block sums are still its row's."""

    __slots__ = ("out", "blocks", "n_blocks", "stamp")

    def __init__(self, n_blocks: int) -> None:
        self.out = (ctypes.c_double * 3)()
        self.blocks = (ctypes.c_double * max(n_blocks, 1))()
        self.n_blocks = n_blocks
        self.stamp = 0


#: The tokens a block sum covers (``SPECVIZ_BLOCK`` in the C file).
BLOCK = 256


def _tempered_buffers(n: int) -> TemperedBuffers:
    need = (n + BLOCK - 1) // BLOCK
    bufs = getattr(_local, "tempered", None)
    if bufs is None or bufs.n_blocks < need:
        stamp = bufs.stamp if bufs is not None else 0
        bufs = _local.tempered = TemperedBuffers(need)
        bufs.stamp = stamp
    return bufs


def tempered(
    row: np.ndarray, inv_t: float, leave_out: int = -1, *, generic: bool = False
) -> tuple[TemperedSums, int] | None:
    """The sums of ``exp((row − max) · inv_t)`` over a contiguous float32 row, with ``leave_out`` (-1: none)
    left out of the second sum and of the per-block sums kept for :func:`tempered_pick`; with the buffers'
    stamp, which :func:`tempered_pick` checks. ``generic`` runs the plain-C path on one thread (the tests
    check it against numpy). ``None`` without the kernel."""
    fns = load()
    if fns is None or not _plain(row):
        return None
    n = row.shape[0]
    bufs = _tempered_buffers(n)
    out_addr, blocks_addr = ctypes.addressof(bufs.out), ctypes.addressof(bufs.blocks)
    has_nan = fns.tempered(row.ctypes.data, n, inv_t, leave_out, out_addr, blocks_addr, int(generic))
    bufs.stamp += 1
    out = bufs.out
    return TemperedSums(out[0], out[1], out[2], bool(has_nan)), bufs.stamp


def tempered_pick(row: np.ndarray, m: float, inv_t: float, leave_out: int, target: float, stamp: int) -> int | None:
    """The first token (not ``leave_out``) whose running sum of ``exp((row − m) · inv_t)`` exceeds ``target``,
    walking the block sums of the :func:`tempered` call that returned ``stamp`` on this thread (the last
    token with mass when rounding leaves the target unreached; -1 when no token but ``leave_out`` has
    any). ``None`` without the kernel, or when this thread has scanned another row since (the caller scans
    again)."""
    fns = load()
    bufs = getattr(_local, "tempered", None)
    if fns is None or bufs is None or bufs.stamp != stamp or not _plain(row):
        return None
    return int(
        fns.tempered_pick(row.ctypes.data, row.shape[0], m, inv_t, leave_out, target, ctypes.addressof(bufs.blocks))
    )


def residual(
    p: np.ndarray, q: np.ndarray, ps: RowSums, qs: RowSums, inv_t: float, *, generic: bool = False
) -> tuple[float, int] | None:
    """The mass of a draft model's residual ``max(0, p − q)``, where ``p`` and ``q`` are the tempered
    softmaxes of two contiguous float32 rows of one length (``ps``, ``qs``: their maxima and sums), with
    the buffers' stamp for :func:`residual_pick`; ``generic``: the plain-C path. ``None`` without the
    kernel or for rows it does not take."""
    fns = load()
    if fns is None or not _plain(p) or not _plain(q) or p.shape != q.shape:
        return None
    bufs = _tempered_buffers(p.shape[0])
    total = fns.residual(
        p.ctypes.data, q.ctypes.data, p.shape[0], ps.max, ps.z, qs.max, qs.z, inv_t,
        ctypes.addressof(bufs.blocks), int(generic),
    )  # fmt: skip
    bufs.stamp += 1
    return float(total), bufs.stamp


def residual_pick(
    p: np.ndarray, q: np.ndarray, ps: RowSums, qs: RowSums, inv_t: float, target: float, stamp: int
) -> int | None:
    """The first token whose running sum of the residual's terms exceeds ``target`` (the last with mass
    when rounding leaves it unreached, -1 when there is none), walking the block sums of the
    :func:`residual` call that returned ``stamp`` on this thread; ``None`` without the kernel or when this
    thread has scanned another row since."""
    fns = load()
    bufs = getattr(_local, "tempered", None)
    if fns is None or bufs is None or bufs.stamp != stamp or not _plain(p) or not _plain(q) or p.shape != q.shape:
        return None
    return int(
        fns.residual_pick(
            p.ctypes.data,
            q.ctypes.data,
            p.shape[0],
            ps.max,
            ps.z,
            qs.max,
            qs.z,
            inv_t,
            target,
            ctypes.addressof(bufs.blocks),
        )  # fmt: skip
    )


def nucleus_mass(
    row: np.ndarray, m: float, inv_t: float, width: float, n_buckets: int, *, generic: bool = False
) -> tuple[np.ndarray, int] | None:
    """The mass of a contiguous float32 row's tempered terms ``exp((row − m) · inv_t)`` by distance below
    ``m``: bucket ``b`` holds the tokens whose ``(m − x) · inv_t`` lies in ``[b · width, (b + 1) · width)``,
    for the first ``n_buckets`` buckets (the tail beyond, ``-inf`` and NaN are left out); with how many tokens
    were filed. What top-p needs to find where its nucleus ends without sorting the row
    (``specviz_nucleus_mass`` in the C file; ``generic``: its plain-C path). ``None`` without the kernel."""
    fns = load()
    if fns is None or not _plain(row) or n_buckets < 1 or not width > 0.0:
        return None
    mass = np.empty(n_buckets, dtype=np.float64)
    filed = fns.nucleus_mass(row.ctypes.data, row.shape[0], m, inv_t, width, n_buckets, mass.ctypes.data, int(generic))
    return mass, int(filed)


def forget_buffers() -> None:
    """Drop this thread's greedy buffers: its next :func:`verify_greedy` looks the kernel up and binds
    its function again (what a tool that wraps the kernel's functions needs, e.g. to time them)."""
    _local.__dict__.pop("greedy", None)


def scan_threads() -> int:
    """How many threads :func:`scan` cuts a long row into (1 without OpenMP or without the kernel): the
    cap (:func:`default_scan_threads` unless :func:`set_scan_threads` or ``SPECVIZ_SCAN_THREADS`` changed
    it) or OpenMP's thread count, whichever is lower."""
    fns = load()
    return int(fns.scan_threads()) if fns is not None else 1


def default_scan_threads() -> int:
    """The cap on a long row's pieces when nothing sets one (the C file says why it is what it is); 1
    without the kernel."""
    fns = load()
    return int(fns.default_scan_threads()) if fns is not None else 1


def set_scan_threads(cap: int) -> int:
    """Cut a long row into at most ``cap`` pieces, one per thread (1 to ``SCAN_THREADS_MAX``; the default
    is :func:`default_scan_threads`), for every thread of the process, and return :func:`scan_threads`
    after it. The results do not depend on it (the pieces are joined as one pass would find them); only
    the time does. Raises ``ValueError`` for a cap out of range, and ``RuntimeError`` without the kernel."""
    _checked_cap(cap)
    fns = load()
    if fns is None:
        raise RuntimeError(f"the row-scan kernel is not loaded ({unavailable_reason()}): rows are read by numpy")
    fns.set_scan_threads(cap)
    return int(fns.scan_threads())


def vector_paths() -> set[str]:
    """The kernel's vector paths this CPU runs: ``"avx2"`` (AVX2 with FMA), ``"avx512"``; empty without
    them (plain C) or without the kernel."""
    fns = load()
    bits = int(fns.vector_paths()) if fns is not None else 0
    return {name for bit, name in ((1, "avx2"), (2, "avx512")) if bits & bit}


def scan_path() -> str:
    """The path a greedy row scan takes here: ``"avx512"``, ``"avx2"``, ``"plain C"`` or ``"numpy"`` (no
    kernel)."""
    if load() is None:
        return "numpy"
    paths = vector_paths()
    return "avx512" if "avx512" in paths else "avx2" if "avx2" in paths else "plain C"
