"""Copying GGUF metadata values verbatim: a value kept as its stored bytes, and a writer that writes it so.

Re-encoding a 262144-entry token list item by item takes the ``gguf`` writer about half a minute;
copying the serialised bytes takes a fraction of a second and is exact. :mod:`specviz.models.derive`
(a derived draft keeps the target's metadata) and :mod:`specviz.models.eagle3_gguf` (a head carries the
target's tokenizer) both write metadata this way.
"""

from __future__ import annotations

from typing import Any


class RawValue:
    """Metadata value bytes copied verbatim from the source file (everything after the value type)."""

    __slots__ = ("payload", "length")

    def __init__(self, payload: bytes, length: int) -> None:
        self.payload = payload
        self.length = length

    def __len__(self) -> int:
        return self.length


def raw_writer_class() -> Any:
    """A ``gguf.GGUFWriter`` subclass that writes :class:`RawValue` metadata as its stored bytes
    (imported on first use: ``gguf`` is only needed to write files)."""
    from gguf import GGUFWriter

    class RawKVWriter(GGUFWriter):
        # gguf's writer packs every value through _pack_val; a RawValue is written as stored instead
        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if isinstance(val, RawValue):
                head = self._pack("I", vtype) if add_vtype else b""
                return head + val.payload
            return super()._pack_val(val, vtype, add_vtype, sub_type=sub_type)

    return RawKVWriter
