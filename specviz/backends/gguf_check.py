"""A fast structural check of a GGUF file before llama.cpp sees it.

llama.cpp refuses most broken files by returning NULL, but some malformed inputs reach its abort
paths, which would kill the Python process. :func:`check_gguf` reads the header, the metadata and the
tensor table with plain Python (no dependency) and verifies that every tensor's data lies inside the
file. It raises :class:`~specviz.errors.ModelNotFoundError` or :class:`~specviz.errors.ModelFormatError`
with what was wrong.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFormatError, ModelNotFoundError

# ggml type id -> (elements per block, bytes per block)
_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
}
# GGUF metadata value type -> struct format of a scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFInfo:
    """What the check learned: version, counts, architecture and the byte size of the tensor data."""

    version: int
    n_tensors: int
    n_kv: int
    architecture: str | None
    data_offset: int
    data_bytes: int


class _Reader:
    def __init__(self, f, size: int, path: Path) -> None:
        self.f, self.size, self.path = f, size, path

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ModelFormatError(f"{self.path}: the GGUF file is truncated (header ends early); "
                                   "re-download or re-export the model")
        return b

    def scalar(self, fmt: str):
        return struct.unpack("<" + fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("Q")
        if n > self.size:
            raise ModelFormatError(f"{self.path}: corrupt GGUF metadata (string length {n} exceeds the file)")
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.scalar("I")
            n = self.scalar("Q")
            if n > self.size:
                raise ModelFormatError(f"{self.path}: corrupt GGUF metadata (array length {n} exceeds the file)")
            if etype in _SCALARS:
                width = struct.calcsize(_SCALARS[etype])
                self.read(width * n)  # skipped: arrays are not needed for the check
                return None
            for _ in range(n):
                self.value(etype)
            return None
        raise ModelFormatError(f"{self.path}: corrupt GGUF metadata (unknown value type {vtype})")


def check_gguf(path: str | os.PathLike) -> GGUFInfo:
    """Check that ``path`` is a complete GGUF file; return what was read or raise a typed error."""
    p = Path(path)
    if not p.exists():
        raise ModelNotFoundError(f"model file not found: {p}; pass the path of an existing .gguf file")
    if p.is_dir():
        raise ModelFormatError(f"{p} is a directory, not a GGUF file; pass the path of a .gguf file")
    size = p.stat().st_size
    with p.open("rb") as f:
        r = _Reader(f, size, p)
        if size < 24:
            raise ModelFormatError(f"{p}: file is {size} bytes, too small to be a GGUF model")
        magic = r.read(4)
        if magic != b"GGUF":
            # the message never quotes the file's bytes: it may reach a page (or a log) that must not see them
            raise ModelFormatError(f"{p} is not a GGUF file (it does not start with the GGUF magic); "
                                   "convert the model to GGUF first")
        version = r.scalar("I")
        if version not in (2, 3):
            raise ModelFormatError(f"{p}: unsupported GGUF version {version} (supported: 2, 3)")
        n_tensors = r.scalar("Q")
        n_kv = r.scalar("Q")
        if n_tensors > size or n_kv > size:
            raise ModelFormatError(f"{p}: corrupt GGUF header (tensor or metadata count exceeds the file)")
        alignment = 32
        arch = None
        for _ in range(n_kv):
            key = r.string()
            vtype = r.scalar("I")
            val = r.value(vtype)
            if key == "general.alignment" and isinstance(val, int) and val > 0:
                alignment = val
            elif key == "general.architecture" and isinstance(val, str):
                arch = val
        end = 0
        for i in range(n_tensors):
            r.string()  # the tensor's name: not needed, and never quoted (see the magic above)
            n_dims = r.scalar("I")
            if n_dims > 8:
                raise ModelFormatError(f"{p}: corrupt tensor info for tensor {i} ({n_dims} dimensions)")
            dims = [r.scalar("Q") for _ in range(n_dims)]
            ttype = r.scalar("I")
            offset = r.scalar("Q")
            n_el = 1
            for d in dims:
                n_el *= d
            blk, bsz = _TYPE_SIZES.get(ttype, (1, 0))
            nbytes = (n_el // blk) * bsz
            end = max(end, offset + nbytes)
        data_offset = f.tell()
        data_offset += (-data_offset) % alignment
    if data_offset + end > size:
        raise ModelFormatError(
            f"{p}: the GGUF file is truncated ({size} bytes, its tensors need {data_offset + end}); "
            "re-download or re-export the model")
    return GGUFInfo(version, n_tensors, n_kv, arch, data_offset, end)
