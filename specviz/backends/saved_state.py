"""A saved llama.cpp context state, read and checked before it is handed back to llama.cpp.

``llama_state_set_data`` trusts what it is given: on a whole-context restore it sets every cell's
position without a check (its cache invariants are ``assert``s, compiled out of release builds), so a
state crafted by hand — a snapshot's checksum is no key, anyone can recompute it — can leave a cache whose
positions, counts and sequence ids contradict each other, and the next decode reads or writes out of
bounds. :func:`check_saved_state` therefore reads the state the way the llama.cpp specviz runs writes it
and refuses it, with a :class:`~specviz.errors.ContextError` and before llama.cpp sees a byte, unless:

- it is exactly one model-architecture string followed by whole KV-cache sections (one for a plain
  cache; a sliding-window model's cache writes two, its full-attention and its window cache: at most
  :data:`MAX_SECTIONS`) and nothing after them;
- each section has at most ``n_stream`` streams (specviz's contexts have one sequence, so one stream) and
  every cell holds exactly one sequence id, in ``[0, n_seq_max)``;
- no stream holds more cells than ``max_cells``, and every position is in ``[0, max_pos)`` and appears
  once per stream (specviz's contexts hold sequence 0 at distinct positions, and never more than it
  committed);
- every layer's key and value rows have a positive size and the bytes the section declares are there
  (a cache with multi-head latent attention keeps no values, which the state does not say: a reading
  without them is tried when the one with them does not fit). Reading is linear in the state's size.

The layout followed is llama.cpp's (``src/llama-context.cpp`` ``state_write_data``,
``src/llama-kv-cache.cpp`` ``state_write``/``state_write_meta``/``state_write_data``) of the vendored
version specviz is built against. Whether a cell carries the 12-byte extension (M-RoPE's 2D position and
the token, for models that need it) is not written in the state, so both readings are tried and the one
that consumes the state exactly is checked. Deliberate departure: llama.cpp itself accepts any
position; specviz refuses what its own contexts could never have written.

A recurrent model's memory (and a hybrid model's recurrent part, written after its attention caches)
has one cell per sequence: its cells and layer header are checked here, its rows by llama.cpp itself
(it compares each layer's type and row size with its own tensors and every read with the state's end).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import ContextError

#: A cell's fixed part: position (int32), sequence-id count (uint32).
_CELL = struct.Struct("<iI")
#: The per-cell extension (x, y, token: three int32) of models with M-RoPE or per-layer token embeddings.
_EXT_BYTES = 12


@dataclass(frozen=True)
class StateLimits:
    """What a saved state may hold to be restored into a context: at most ``n_stream`` streams per cache
    section, sequence ids below ``n_seq_max``, at most ``max_cells`` cells per stream and positions below
    ``max_pos``."""

    n_stream: int
    n_seq_max: int
    max_cells: int
    max_pos: int
    #: For a memory with a recurrent part (a recurrent or hybrid model): the attention cache sections
    #: written before it (0 for a recurrent model, 1 or 2 for a hybrid one). None: attention only.
    recurrent_after: int | None = None


class _Malformed(Exception):
    """The state does not follow the layout (internal: turned into one ContextError by the caller)."""


class _Reader:
    """A cursor over the state's bytes that refuses to read past the end."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = memoryview(data)
        self.pos = pos

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.left:
            raise _Malformed(f"{what} runs past the end of the state")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.take(4, what))[0])

    def i32(self, what: str) -> int:
        return int(struct.unpack("<i", self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack("<Q", self.take(8, what))[0])


def _cells(r: _Reader, n: int, ext: bool, lim: StateLimits) -> None:
    """Read and check ``n`` cells' metadata (position, sequence ids)."""
    step = _CELL.size + (_EXT_BYTES if ext else 0) + 4
    if n * step <= r.left:
        # the common case, every cell with one sequence id: one vectorised read
        fields = [("pos", "<i4"), ("n", "<u4")] + ([("ext", f"V{_EXT_BYTES}")] if ext else []) + [("seq", "<i4")]
        cells = np.frombuffer(r.data[r.pos : r.pos + n * step], dtype=np.dtype(fields), count=n)
        if np.all(cells["n"] == 1):
            r.pos += n * step
            _check_cells(cells["pos"], cells["seq"], lim)
            return
    positions: list[int] = []
    for _ in range(n):
        pos, n_seq = _CELL.unpack(r.take(_CELL.size, "a cell"))
        if ext:
            r.take(_EXT_BYTES, "a cell's extension")
        if n_seq != 1:
            raise _Malformed(f"a cell holds {n_seq} sequence ids (specviz's contexts hold exactly one)")
        seq = r.i32("a cell's sequence id")
        if not 0 <= seq < lim.n_seq_max:
            raise _Malformed(f"a cell belongs to sequence {seq} (this context has {lim.n_seq_max})")
        positions.append(pos)
    _check_cells(np.asarray(positions, dtype=np.int64), np.zeros(len(positions), dtype=np.int64), lim)


def _check_cells(pos: np.ndarray, seq: np.ndarray, lim: StateLimits) -> None:
    if seq.size and (seq.min() < 0 or seq.max() >= lim.n_seq_max):
        raise _Malformed(f"a cell belongs to a sequence outside [0, {lim.n_seq_max})")
    if pos.size and (pos.min() < 0 or pos.max() >= lim.max_pos):
        raise _Malformed(f"a cell's position is outside [0, {lim.max_pos})")
    if np.unique(pos).size != pos.size:
        raise _Malformed("two cells hold the same position")


def _rows(r: _Reader, n_cells: int, v_trans: bool) -> None:
    """Skip one layer's key or value rows after checking their declared sizes."""
    r.i32("a layer's tensor type")
    if v_trans:
        size_el, n_embd = r.u32("a value's element size"), r.u32("a value's width")
        if size_el == 0 or n_embd == 0:
            raise _Malformed("a layer declares empty value rows")
        r.take(size_el * n_embd * n_cells, "a layer's values")
    else:
        size_row = r.u64("a layer's row size")
        if size_row == 0:
            raise _Malformed("a layer declares empty rows")
        r.take(size_row * n_cells, "a layer's rows")


#: Cache sections a state may hold: a plain cache writes one, a sliding-window model's cache two.
MAX_SECTIONS = 2
#: Layers a cache section may declare (far more than any model has; bounds the work a crafted state costs).
MAX_LAYERS = 1024


def _tail(data: bytes, pos: int, ext: bool, lim: StateLimits, streams: int, sections: int) -> None:
    """Read and check the state from ``pos`` to its end: ``streams`` more streams of the current cache
    section, then at most ``sections`` more sections; raises :class:`_Malformed` unless it all fits."""
    r = _Reader(data, pos)
    if streams == 0:
        if not r.left:
            return
        if sections == 0:
            raise _Malformed(f"more than {MAX_SECTIONS} cache sections, or bytes after them")
        n_stream = r.u32("the stream count")
        if not 1 <= n_stream <= lim.n_stream:
            raise _Malformed(f"the cache has {n_stream} streams (this context has {lim.n_stream})")
        return _tail(data, r.pos, ext, lim, n_stream, sections - 1)
    n = r.u32("a stream's cell count")
    if n == 0:
        return _tail(data, r.pos, ext, lim, streams - 1, sections)
    if n > lim.max_cells:
        raise _Malformed(f"a stream holds {n} cells, more than the {lim.max_cells} this context may hold")
    _cells(r, n, ext, lim)
    v_trans, n_layer = r.u32("the value layout"), r.u32("the layer count")
    if v_trans > 1 or n_layer > MAX_LAYERS:
        raise _Malformed(f"the cache's layer header is malformed ({n_layer} layers, value layout {v_trans})")
    for _ in range(n_layer):  # keys
        _rows(r, n, False)
    # values: a cache keeps them for every layer, or (multi-head latent attention) for none, and the
    # state does not say which; the usual reading is tried first
    fault: _Malformed | None = None
    for n_values in (n_layer, 0) if n_layer else (0,):
        rv = _Reader(data, r.pos)
        try:
            for _ in range(n_values):
                _rows(rv, n, bool(v_trans))
            return _tail(data, rv.pos, ext, lim, streams - 1, sections)
        except _Malformed as exc:
            fault = fault or exc
    raise fault or _Malformed("the cache's values are malformed")


def _attention_section(r: _Reader, ext: bool, lim: StateLimits) -> None:
    """Read and check one attention cache section ahead of a recurrent part (values for every layer)."""
    n_stream = r.u32("the stream count")
    if not 1 <= n_stream <= lim.n_stream:
        raise _Malformed(f"the cache has {n_stream} streams (this context has {lim.n_stream})")
    for _ in range(n_stream):
        n = r.u32("a stream's cell count")
        if n == 0:
            continue
        if n > lim.max_cells:
            raise _Malformed(f"a stream holds {n} cells, more than the {lim.max_cells} this context may hold")
        _cells(r, n, ext, lim)
        v_trans, n_layer = r.u32("the value layout"), r.u32("the layer count")
        if v_trans > 1 or n_layer > MAX_LAYERS:
            raise _Malformed(f"the cache's layer header is malformed ({n_layer} layers, value layout {v_trans})")
        for i in range(2 * n_layer):  # the keys, then the values
            _rows(r, n, bool(v_trans) and i >= n_layer)


def _recurrent_part(r: _Reader, lim: StateLimits) -> None:
    """Check a recurrent memory's cells (one per sequence: its last position and its sequence id) and its
    layer header. Its rows are left to llama.cpp, which checks each layer's type and row size against its
    own tensors and every read against the end of the state (their count is not written: a layer without
    recurrent state writes none)."""
    n = r.u32("the recurrent cell count")
    if n > lim.n_seq_max:
        raise _Malformed(f"the recurrent memory holds {n} cells (this context has {lim.n_seq_max} sequences)")
    positions = []
    for _ in range(n):
        pos, n_seq = _CELL.unpack(r.take(_CELL.size, "a recurrent cell"))
        if n_seq != 1:
            raise _Malformed(f"a recurrent cell holds {n_seq} sequence ids (specviz's contexts hold exactly one)")
        positions.append(pos)
        if not 0 <= r.i32("a recurrent cell's sequence id") < lim.n_seq_max:
            raise _Malformed(f"a recurrent cell belongs to a sequence outside [0, {lim.n_seq_max})")
    _check_cells(np.asarray(positions, dtype=np.int64), np.zeros(len(positions), dtype=np.int64), lim)
    s_trans, n_layer = r.u32("the recurrent layout"), r.u32("the recurrent layer count")
    if s_trans > 1 or n_layer > MAX_LAYERS:
        raise _Malformed(f"the recurrent layer header is malformed ({n_layer} layers, layout {s_trans})")


def _read(data: bytes, ext: bool, lim: StateLimits) -> None:
    r = _Reader(data)
    n = r.u32("the architecture name")
    arch = bytes(r.take(n, "the architecture name"))
    if not n or not arch.isascii() or not arch.decode().isprintable():
        raise _Malformed("the architecture name is malformed")
    if lim.recurrent_after is None:
        _tail(data, r.pos, ext, lim, 0, MAX_SECTIONS)
        return
    for _ in range(lim.recurrent_after):
        _attention_section(r, ext, lim)
    _recurrent_part(r, lim)


def check_saved_state(data: bytes, lim: StateLimits, what: str = "the context") -> None:
    """Refuse (:class:`~specviz.errors.ContextError`, naming the first fault and ``what`` was restored) a
    saved state that does not follow llama.cpp's layout exactly or holds what ``lim`` excludes (see the
    module docstring)."""
    faults = []
    for ext in (False, True):
        try:
            _read(data, ext, lim)
            return
        except _Malformed as exc:
            faults.append(str(exc))
    raise ContextError(
        f"the saved state of {what} is refused: {faults[0]}; restore a state saved by specviz from a "
        "context of the same model and capacity"
    )
