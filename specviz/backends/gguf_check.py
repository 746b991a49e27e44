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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFormatError, ModelNotFoundError

# ggml type id -> (elements per block, bytes per block)
_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
}
# GGUF metadata value type -> struct format of a scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file: ggml type id, dims (ggml order, fastest first) and absolute data offset."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class GGUFInfo:
    """What the check learned: version, counts, architecture and the byte size of the tensor data."""

    version: int
    n_tensors: int
    n_kv: int
    architecture: str | None
    data_offset: int
    data_bytes: int
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Every metadata value: scalars, strings, numeric arrays (numpy); string arrays as their length."""
    tensors: dict[str, TensorEntry] = field(default_factory=dict, compare=False, repr=False)
    """The tensor table by name."""
    spans: dict[str, tuple[int, int, int]] = field(default_factory=dict, compare=False, repr=False)
    """Per metadata key: (value type, first byte, end byte) of the stored value after its type field, for
    copying values byte for byte into another file."""

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata value of ``key`` (``{arch}`` in the key is replaced by the architecture)."""
        return self.metadata.get(key.replace("{arch}", self.architecture or ""), default)


class _Reader:
    def __init__(self, f, size: int, path: Path) -> None:
        self.f, self.size, self.path = f, size, path

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ModelFormatError(
                f"{self.path}: the GGUF file is truncated (header ends early); re-download or re-export the model"
            )
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
                return np.frombuffer(self.read(width * n), dtype=_NUMPY[etype])
            for _ in range(n):
                self.value(etype)
            return n  # arrays of strings (vocabularies): only their length is kept
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
            raise ModelFormatError(
                f"{p} is not a GGUF file (it does not start with the GGUF magic); convert the model to GGUF first"
            )
        version = r.scalar("I")
        if version not in (2, 3):
            raise ModelFormatError(f"{p}: unsupported GGUF version {version} (supported: 2, 3)")
        n_tensors = r.scalar("Q")
        n_kv = r.scalar("Q")
        if n_tensors > size or n_kv > size:
            raise ModelFormatError(f"{p}: corrupt GGUF header (tensor or metadata count exceeds the file)")
        alignment = 32
        arch = None
        meta: dict[str, Any] = {}
        spans: dict[str, tuple[int, int, int]] = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.scalar("I")
            start = f.tell()
            val = r.value(vtype)
            meta[key] = val
            spans[key] = (vtype, start, f.tell())
            if key == "general.alignment" and isinstance(val, int) and val > 0:
                alignment = val
            elif key == "general.architecture" and isinstance(val, str):
                arch = val
        end = 0
        table: list[tuple[str, int, tuple[int, ...], int]] = []
        for i in range(n_tensors):
            name = r.string()  # kept for the table, never quoted in an error (see the magic above)
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
            table.append((name, ttype, tuple(dims), offset))
        data_offset = f.tell()
        data_offset += (-data_offset) % alignment
    if data_offset + end > size:
        raise ModelFormatError(
            f"{p}: the GGUF file is truncated ({size} bytes, its tensors need {data_offset + end}); "
            "re-download or re-export the model"
        )
    tensors = {n: TensorEntry(n, t, d, data_offset + o) for n, t, d, o in table}
    return GGUFInfo(version, n_tensors, n_kv, arch, data_offset, end, meta, tensors, spans)


def read_small_tensor(path: str | os.PathLike, info: GGUFInfo, name: str) -> np.ndarray:
    """The data of an unquantized tensor (f32, f16, i8-i64, f64) as a numpy array in ggml order reversed."""
    t = info.tensors.get(name)
    if t is None:
        raise ModelFormatError(f"{path}: no tensor {name!r}")
    dtypes = {0: "<f4", 1: "<f2", 24: "i1", 25: "<i2", 26: "<i4", 27: "<i8", 28: "<f8"}
    if t.ggml_type not in dtypes:
        raise ModelFormatError(f"{path}: tensor {name!r} has ggml type {t.ggml_type}, not a plain number type")
    n = 1
    for d in t.dims:
        n *= d
    with open(path, "rb") as f:
        f.seek(t.offset)
        data = np.frombuffer(f.read(n * np.dtype(dtypes[t.ggml_type]).itemsize), dtype=dtypes[t.ggml_type])
    return data.reshape(tuple(reversed(t.dims))) if len(t.dims) > 1 else data
