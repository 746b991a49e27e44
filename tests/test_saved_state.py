"""A saved llama.cpp state is checked before llama.cpp reads it (:mod:`specviz.backends.saved_state`).

On the tiny model: an honest state (both value layouts: flash attention on, and off with transposed
values) restores; each crafted field is refused with a ContextError that names it, and the refused
state never reaches ``llama_state_set_data``; a crafted snapshot is refused as a SnapshotError and the
session carries on unchanged.
"""

from __future__ import annotations

import struct

import pytest

from specviz.backends import LlamaContext, LlamaModel
from specviz.backends.binding import llama_lib
from specviz.decoding.snapshot import pack, unpack
from specviz.errors import ContextError, SnapshotError


def cells_at(state: bytes) -> tuple[int, int]:
    """Offset of the first stream's cell count in a plain-cache state, and the count."""
    n = struct.unpack_from("<I", state, 0)[0]
    at = 4 + n + 4
    return at, struct.unpack_from("<I", state, at)[0]


def filled(model, **kw) -> LlamaContext:
    ctx = LlamaContext(model, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1, **kw)
    ctx.eval(list(range(10, 30)), 0, rows="last")
    return ctx


def crafted(state: bytes, kind: str) -> bytes:
    at, n = cells_at(state)
    out = bytearray(state)
    cell = at + 4 + 12 * 3
    if kind == "position beyond the context":
        struct.pack_into("<i", out, cell, 100_000)
    elif kind == "negative position":
        struct.pack_into("<i", out, cell, -1)
    elif kind == "duplicate position":
        struct.pack_into("<i", out, cell, 0)
    elif kind == "another sequence":
        struct.pack_into("<i", out, cell + 8, 1)
    elif kind == "two sequence ids":
        struct.pack_into("<I", out, cell + 4, 2)
    elif kind == "more cells than the context":
        struct.pack_into("<I", out, at, 1 << 20)
    elif kind == "empty row size":
        struct.pack_into("<Q", out, at + 4 + 12 * n + 8 + 4, 0)
    elif kind == "truncated":
        out = out[:-7]
    elif kind == "trailing bytes":
        out += b"\0" * 5
    elif kind == "no architecture":
        out = bytearray(struct.pack("<I", 1 << 30)) + out[4:]
    return bytes(out)


KINDS = [
    ("position beyond the context", "position"),
    ("negative position", "position"),
    ("duplicate position", "same position"),
    ("another sequence", "sequence"),
    ("two sequence ids", "sequence ids"),
    ("more cells than the context", "cells"),
    ("empty row size", "empty rows"),
    ("truncated", "past the end"),
    ("trailing bytes", "streams"),
    ("no architecture", "architecture"),
]


@pytest.mark.parametrize(("kind", "named"), KINDS)
def test_a_crafted_state_is_refused_before_llama_cpp_reads_it(tiny_model, monkeypatch, kind, named):
    ctx = filled(tiny_model)
    honest = ctx.state()
    calls = []
    lc = llama_lib()
    real = lc.llama_state_set_data
    monkeypatch.setattr(lc, "llama_state_set_data", lambda *a: calls.append(1) or real(*a))
    with pytest.raises(ContextError, match=named):
        ctx.load_state(crafted(honest, kind))
    assert calls == [], "the crafted state reached llama_state_set_data"
    assert ctx.state() == honest, "a refused state changed the context"
    ctx.load_state(honest)
    assert calls == [1]
    ctx.close()


@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_an_honest_state_of_either_value_layout_restores(tiny_model, monkeypatch, flash_attn):
    # flash attention off: llama.cpp then stores the values transposed, another layout of the state
    ctx = filled(tiny_model, flash_attn=flash_attn)
    state = ctx.state()
    assert struct.unpack_from("<I", state, cells_at(state)[0] + 4 + 12 * 20)[0] == (flash_attn == "off")
    ctx.clear()
    ctx.load_state(state, max_pos=20)
    assert ctx.kv_len() == 20 and ctx.state() == state
    with pytest.raises(ContextError, match="position"):
        ctx.load_state(state, max_pos=19)  # a cache may not hold more than was committed
    ctx.close()


def test_a_crafted_snapshot_is_refused_and_the_session_carries_on(tiny_session):
    s = tiny_session
    s.start("the a the a the a", 40, "prompt-lookup", seed=2)
    s.run(max_rounds=3)
    honest = s.snapshot()
    header, blobs = unpack(honest)
    s.step()
    expected = list(s.history)
    s.restore_into(honest)
    before = (list(s.history), s.round_index, s.ctx.kv_len())
    target = bytearray(blobs["target"])
    at, n = cells_at(bytes(target))
    struct.pack_into("<i", target, at + 4 + 12 * (n - 2), -1)  # the checksum is recomputed: only the check stops it
    bad = pack(
        {k: v for k, v in header.items() if k != "blobs"}, [("target", bytes(target)), ("drafter", blobs["drafter"])]
    )
    with pytest.raises(SnapshotError, match="position"):
        s.restore_into(bad)
    assert (list(s.history), s.round_index, s.ctx.kv_len()) == before
    s.step()
    assert list(s.history) == expected


@pytest.mark.parametrize(("kind", "named"), [("position", "position"), ("cells", "recurrent memory holds")])
def test_a_recurrent_models_crafted_state_is_refused(tmp_path, kind, named):
    """A recurrent memory holds one cell per sequence (its last position): both are checked."""
    from specviz.testing.memory_models import write_tiny_mamba

    model = LlamaModel(write_tiny_mamba(tmp_path / "mamba.gguf"))
    ctx = LlamaContext(model, n_ctx=64, n_batch=32, n_ubatch=32, n_threads=1)
    ctx.eval(list(range(10, 20)), 0, rows="last")
    honest = ctx.state()
    at = 4 + struct.unpack_from("<I", honest, 0)[0]  # the recurrent cell count, after the architecture name
    assert struct.unpack_from("<Ii", honest, at) == (1, 9)
    bad = bytearray(honest)
    if kind == "position":
        struct.pack_into("<i", bad, at + 4, 10**6)
    else:
        struct.pack_into("<I", bad, at, 5)
    with pytest.raises(ContextError, match=named):
        ctx.load_state(bytes(bad))
    ctx.load_state(honest, max_pos=10)
    with pytest.raises(ContextError, match="position"):
        ctx.load_state(honest, max_pos=9)
    ctx.close()
    model.close()
