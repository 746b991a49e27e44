"""A property test over crafted snapshots, run as a script in its own process by ``test_snapshot_mutations.py``.

A snapshot's checksum is no key: anyone can change the bytes and recompute it. Hypothesis takes an honest
snapshot of a session on a tiny real GGUF model, mutates the target context's llama.cpp state inside it —
a cell's position (out of range, negative, a duplicate), its sequence id or sequence-id count, the cell
count, the layer header, single bytes anywhere, truncation, trailing bytes — re-checksums the envelope and
restores it into the live session. After every example:

* a refused restore raised :class:`~specviz.errors.SnapshotError` and changed nothing: the history, the
  round, the cache length are as before, and the next round is the one the honest snapshot makes;
* an accepted restore left a usable session: the cache llama.cpp then holds (read back from its own
  state) has exactly one cell of sequence 0 at each committed position, and the next round decodes (a
  mutation of the keys' and values' numbers is harmless to llama.cpp: only the output changes).

A segmentation fault or an abort kills this process; the test runner outside sees the exit status.

Usage: python tests/snapshot_mutations.py [EXAMPLES]
"""

from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specviz import Session
from specviz.decoding.snapshot import pack, unpack
from specviz.errors import SnapshotError
from specviz.testing.tiny_models import write_tiny_llama

N_CTX = 256
EDGE_POSITIONS = [-(2**31), -2, -1, 0, 1, N_CTX - 1, N_CTX, N_CTX + 1, 2**31 - 1]


def cells_offset(state: bytes) -> tuple[int, int]:
    """Where the first stream's cell count lies in a plain-cache state (after the architecture name and
    the stream count), and that count."""
    n = struct.unpack_from("<I", state, 0)[0]
    at = 4 + n + 4
    return at, struct.unpack_from("<I", state, at)[0]


def cached_positions(state: bytes) -> list[tuple[int, int, int]]:
    """(position, sequence-id count, first sequence id) of every cell of a plain-cache state."""
    at, n_cells = cells_offset(state)
    return [struct.unpack_from("<iIi", state, at + 4 + 12 * i) for i in range(n_cells)]


@st.composite
def mutations(draw: st.DrawFn, state: bytes) -> bytes:
    """One crafted variant of ``state``."""
    at, n_cells = cells_offset(state)
    out = bytearray(state)
    kind = draw(
        st.sampled_from(["position", "duplicate", "seq", "n_seq", "cell_count", "layer", "byte", "truncate", "extend"])
    )
    cell = at + 4 + 12 * draw(st.integers(0, n_cells - 1))
    if kind == "position":
        pos = draw(st.one_of(st.sampled_from(EDGE_POSITIONS), st.integers(-(2**31), 2**31 - 1)))
        struct.pack_into("<i", out, cell, pos)
    elif kind == "duplicate":
        other = draw(st.integers(0, n_cells - 1))
        struct.pack_into("<i", out, cell, other)
    elif kind == "seq":
        struct.pack_into("<i", out, cell + 8, draw(st.sampled_from([-1, 1, 2, 255, 2**31 - 1])))
    elif kind == "n_seq":
        struct.pack_into("<I", out, cell + 4, draw(st.sampled_from([0, 2, 3, 2**32 - 1])))
    elif kind == "cell_count":
        struct.pack_into("<I", out, at, draw(st.sampled_from([0, 1, n_cells - 1, n_cells + 1, N_CTX + 1, 2**32 - 1])))
    elif kind == "layer":  # v_trans, n_layer, the first key type and row size
        field = at + 4 + 12 * n_cells + 4 * draw(st.integers(0, 3))
        struct.pack_into("<I", out, field, draw(st.sampled_from([0, 1, 2, 3, 2**31, 2**32 - 1])))
    elif kind == "byte":
        i = draw(st.integers(0, len(out) - 1))
        out[i] ^= draw(st.integers(1, 255))
    elif kind == "truncate":
        out = out[: draw(st.integers(0, len(out) - 1))]
    else:
        out += bytes(draw(st.lists(st.integers(0, 255), min_size=1, max_size=64)))
    return bytes(out)


def main(examples: int) -> None:
    d = Path(tempfile.mkdtemp(prefix="specviz-mutations-"))
    model = write_tiny_llama(d / "tiny.gguf", seed=1, block_scale=0.1)
    s = Session(model, n_ctx=N_CTX, n_batch=64, n_ubatch=64, n_threads=1)
    s.start("the a the a the a b the a", 150, "prompt-lookup", seed=3)
    s.run(max_rounds=4)
    honest = s.snapshot()
    header, blobs = unpack(honest)
    s.step()
    after_honest = list(s.history)
    s.restore_into(honest)
    outcome = {"refused": 0, "accepted": 0}

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(mutations(blobs["target"]))
    def restore_a_crafted_snapshot(target: bytes) -> None:
        s.restore_into(honest)
        before = (list(s.history), s.round_index, s.ctx.kv_len())
        crafted = pack(
            {k: v for k, v in header.items() if k != "blobs"},
            [("target", target), *[(k, v) for k, v in blobs.items() if k != "target"]],
        )
        try:
            s.restore_into(crafted)
        except SnapshotError:
            outcome["refused"] += 1
            assert (list(s.history), s.round_index, s.ctx.kv_len()) == before, "a refused restore changed the session"
            s.step()
            assert list(s.history) == after_honest, "after a refused restore the next round differs"
            return
        outcome["accepted"] += 1
        cells = cached_positions(s.ctx.state())
        assert sorted(cells) == [(p, 1, 0) for p in range(len(s.history) - 1)], (
            f"an accepted restore left a cache that is not one cell per committed position: {cells}"
        )
        s.step()  # raises (and fails the property) when the restored cache cannot be decoded on

    restore_a_crafted_snapshot()
    s.close()
    print(f"passed: {outcome['refused']} crafted snapshots refused, {outcome['accepted']} accepted and usable")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
