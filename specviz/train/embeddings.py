"""The target's token embedding rows, read from its GGUF (any storage type ``gguf`` can dequantize).

An EAGLE-3 head borrows the target's ``token_embd`` at run time (llama.cpp's ``ctx_other``), unscaled (the
``eagle3`` graph reads the rows directly; Gemma's own graph multiplies them by ``sqrt(n_embd)``, the head's
does not). Training needs the same rows; only those of tokens in the corpus are read, row by row from the
file (a quantized row is a whole number of blocks), so a 262,144-token table is never expanded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..backends.gguf_check import check_gguf
from ..errors import ModelFormatError

__all__ = ["read_embedding_rows"]


def read_embedding_rows(target: str | Path, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Rows ``ids`` of the target's ``token_embd.weight`` as float32 ``[len(ids), n_embd]``."""
    from gguf import GGMLQuantizationType, quants
    from gguf.constants import GGML_QUANT_SIZES

    info = check_gguf(target)
    t = info.tensors.get("token_embd.weight")
    if t is None:
        raise ModelFormatError(f"{target}: no token_embd.weight; an EAGLE-3 head borrows the target's embeddings")
    n_embd, n_vocab = int(t.dims[0]), int(t.dims[1])
    qtype = GGMLQuantizationType(t.ggml_type)
    block, size = GGML_QUANT_SIZES[qtype]
    if n_embd % block:
        raise ModelFormatError(f"{target}: token_embd rows of {n_embd} do not hold whole {qtype.name} blocks")
    row_bytes = n_embd // block * size
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
        raise ValueError(f"token ids outside the target's vocabulary of {n_vocab}")
    raw = np.empty((len(ids), row_bytes), dtype=np.uint8)
    with open(target, "rb") as f:
        for i, tok in enumerate(ids):
            f.seek(t.offset + int(tok) * row_bytes)
            raw[i] = np.frombuffer(f.read(row_bytes), dtype=np.uint8)
    if qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(len(ids), n_embd).copy()
    if qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(len(ids), n_embd).astype(np.float32)
    out = quants.dequantize(raw, qtype)
    return np.asarray(out, dtype=np.float32).reshape(len(ids), n_embd)
