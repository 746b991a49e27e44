"""An EAGLE-3 head next to its target: checks, the head's llama.cpp context, encoder and draft steps.

:func:`eagle3_problems` says, without loading anything into llama.cpp, why a head GGUF cannot serve a
target (each reason is a sentence); an empty list means it can. Every case where llama.cpp would
abort instead of refusing (``GGML_ASSERT`` in the eagle3 graph: a ``d2t`` that is not int64 or does
not match the output head, a head that must borrow a tensor it cannot, a target layer past the
target's depth) is among them, so nothing reaches an abort path.

:class:`Eagle3Context` owns the head's llama.cpp context, created with ``ctx_other`` set to the target
context (llama.cpp lets a head borrow the target's token embeddings that way) and with the head's
pre-norm output switched on (``llama_set_embeddings_nextn``, masked to output rows). It runs

* :meth:`Eagle3Context.encode`: target features (``[n, 3 x target hidden]``) through ``fc`` into
  ``g`` rows (``llama_process`` with ``LLAMA_PROCESS_TYPE_ENCODE``, chunked to ``n_ubatch`` because the
  encoder graph must fit one micro-batch);
* :meth:`Eagle3Context.decode`: ``(token, g)`` pairs at positions (``llama_batch_ext`` rows carrying
  both a token id and an embedding), returning the requested rows' logits (over the *target*
  vocabulary: llama.cpp scatters the draft-vocabulary logits through ``d2t``, other entries -inf) and
  pre-norm outputs (the next step's ``g``).

The pairing convention is llama.cpp's (``common/speculative.cpp``): the pair at position ``p`` is
``(token[p + 1], g[p])``, and its output predicts ``token[p + 2]``.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ContextError, StrategyUnavailableError
from .binding import llama_lib
from .gguf_check import GGUFInfo, check_gguf, read_small_tensor
from .llama import LlamaContext, LlamaModel
from .tied_context import TiedContext

_GGML_I64 = 27


@dataclass(frozen=True)
class Eagle3HeadInfo:
    """What an EAGLE-3 head GGUF declares (read from its metadata and tensor table)."""

    path: Path
    target_layers: tuple[int, ...]
    target_hidden: int
    n_embd: int
    n_vocab: int
    n_draft_vocab: int
    own_embeddings: bool
    own_output: bool
    norm_before_fc: bool
    norm_before_residual: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        d = dict(self.__dict__)
        d["path"] = str(self.path)
        d["target_layers"] = list(self.target_layers)
        return d


def read_eagle3_head(path: str | os.PathLike, info: GGUFInfo | None = None) -> Eagle3HeadInfo:
    """The head's declared shape; :class:`StrategyUnavailableError` when the file is not an ``eagle3`` GGUF."""
    info = info or check_gguf(path)
    if info.architecture != "eagle3":
        raise StrategyUnavailableError(
            f"{path} is a {info.architecture!r} model, not an EAGLE-3 head (architecture 'eagle3'); give the eagle3 "
            "strategy an EAGLE-3 GGUF, or use the draft strategy for a whole draft model",
            knob="draft_model",
            value=str(path),
        )
    layers = info.get("eagle3.target_layers")
    tensors = info.tensors
    out = tensors.get("output.weight")
    d2t = tensors.get("d2t")
    tok = info.get("tokenizer.ggml.tokens")
    return Eagle3HeadInfo(
        path=Path(path),
        target_layers=tuple(int(x) for x in layers) if layers is not None and not isinstance(layers, int) else (),
        target_hidden=int(info.get("eagle3.target_hidden_size", 0) or 0),
        n_embd=int(info.get("eagle3.embedding_length", 0) or 0),
        n_vocab=int(tok) if isinstance(tok, int) else 0,
        n_draft_vocab=int(d2t.dims[0]) if d2t is not None else (int(out.dims[1]) if out is not None else 0),
        own_embeddings="token_embd.weight" in tensors,
        own_output=out is not None,
        norm_before_fc=bool(info.get("eagle3.norm_before_fc", False)),
        norm_before_residual=bool(info.get("eagle3.norm_before_residual", False)),
    )


def eagle3_problems(
    head_path: str | os.PathLike,
    *,
    target_arch: str | None,
    target_n_layer: int,
    target_n_embd: int,
    target_n_vocab: int,
    head_info: GGUFInfo | None = None,
) -> list[str]:
    """Every reason the head at ``head_path`` cannot draft for this target (empty: it can).

    Target-side capture (whether the target's layer inputs can be read) is not checked here; see
    :func:`specviz.backends.capture.capture_unavailable_reason`.
    """
    info = head_info or check_gguf(head_path)
    try:
        h = read_eagle3_head(head_path, info)
    except StrategyUnavailableError as e:
        return [str(e)]
    why: list[str] = []
    if len(h.target_layers) != 3:
        why.append(
            f"the head lists {len(h.target_layers)} target layers (eagle3.target_layers); llama.cpp's "
            "EAGLE-3 needs exactly 3"
        )
    bad = [x for x in h.target_layers if not 0 <= x < target_n_layer]
    if bad:
        why.append(
            f"the head reads target layer {bad[0]}, but the target has layers 0-{target_n_layer - 1}"
            + (" (layer N, the final hidden state, is not supported)" if bad[0] == target_n_layer else "")
        )
    if h.target_hidden != target_n_embd:
        why.append(
            f"the head was made for a target of width {h.target_hidden} (eagle3.target_hidden_size), this "
            f"target is {target_n_embd} wide"
        )
    if h.n_vocab != target_n_vocab:
        why.append(f"the head's vocabulary has {h.n_vocab} tokens, the target's {target_n_vocab}")
    fc = info.tensors.get("fc.weight")
    if fc is None:
        why.append("the head has no fc.weight (the feature encoder)")
    elif fc.dims != (3 * target_n_embd, h.n_embd):
        why.append(f"fc.weight is {list(fc.dims)}, expected [{3 * target_n_embd}, {h.n_embd}]")
    d2t = info.tensors.get("d2t")
    if d2t is not None:
        if d2t.ggml_type != _GGML_I64:
            why.append(f"d2t has ggml type {d2t.ggml_type}; llama.cpp needs int64 (type {_GGML_I64})")
        if len(d2t.dims) != 1:
            why.append(f"d2t has {len(d2t.dims)} dimensions, expected 1")
        if not h.own_output:
            why.append("the head maps a reduced vocabulary (d2t) but has no output.weight of that size")
        elif info.tensors["output.weight"].dims[1] != d2t.dims[0]:
            why.append(f"output.weight has {info.tensors['output.weight'].dims[1]} rows but d2t maps {d2t.dims[0]}")
        if d2t.ggml_type == _GGML_I64 and len(d2t.dims) == 1:
            ids = read_small_tensor(head_path, info, "d2t")
            if len(ids) and (ids.min() < 0 or ids.max() >= target_n_vocab):
                why.append(
                    f"d2t maps to target ids {int(ids.min())}..{int(ids.max())}, outside the target's "
                    f"vocabulary of {target_n_vocab}"
                )
    elif h.own_output and info.tensors["output.weight"].dims[1] != target_n_vocab:
        why.append("the head's output.weight does not cover the target vocabulary and there is no d2t mapping")
    if not h.own_embeddings and h.n_embd != target_n_embd:
        why.append(f"the head borrows the target's token embeddings ({target_n_embd} wide) but is {h.n_embd} wide")
    if not h.own_output and h.n_embd != target_n_embd:
        why.append(f"the head borrows the target's output head ({target_n_embd} wide) but is {h.n_embd} wide")
    if target_arch == "eagle3":
        why.append("the target is itself an EAGLE-3 head")
    return why


class Eagle3Context(TiedContext):
    """The head's llama.cpp context, tied to a target context (see the module docstring)."""

    what = "EAGLE-3"

    def __init__(self, head: LlamaModel, target: LlamaContext, *, n_threads: int | None = None, n_seq: int = 1) -> None:
        from . import llama_ext

        self.head = head
        self.target = target
        layers = llama_ext.target_layer_ids(head.ptr)
        if len(layers) != 3:
            raise StrategyUnavailableError(
                f"{head.path} declares {len(layers)} target layers; EAGLE-3 needs 3",
                knob="draft_model",
                value=str(head.path),
            )
        self.target_layers = tuple(layers)
        self.n_embd = head.n_embd
        self.n_embd_target = target.model.n_embd
        self.n_vocab = head.n_vocab
        # ctx_other lets the head borrow the target's token embeddings (and output head); the pre-norm
        # output of every output row (the next step's g) and the encoder's output are switched on; n_seq > 1:
        # a draft tree's branches as sequences of a unified cache
        self._open(head, target, n_threads=n_threads, n_seq=n_seq)
        self.encode_seconds = 0.0

    # -- encoder -------------------------------------------------------------------------------------
    def encode(self, features: np.ndarray) -> np.ndarray:
        """``g`` rows (``[n, n_embd]``) for target features ``[n, 3 * target hidden]``."""
        import time

        lc = llama_lib()
        feats = np.ascontiguousarray(features, dtype=np.float32)
        n, width = feats.shape
        if width != 3 * self.n_embd_target:
            raise ContextError(f"EAGLE-3 features are {width} wide, the head expects {3 * self.n_embd_target}")
        out = np.empty((n, self.n_embd), dtype=np.float32)
        step = self.n_ubatch
        fptr = ctypes.POINTER(ctypes.c_float)
        t0 = time.perf_counter()
        for i in range(0, n, step):
            m = min(step, n - i)
            lc.llama_batch_ext_clear(self._batch)
            pos0 = self.kv_len()  # the per-token encoder ignores positions; keep them past the cache
            for j in range(m):
                row = feats[i + j]
                idx = lc.llama_batch_ext_add_embd(self._batch, 0, lc.llama_embd(row.ctypes.data_as(fptr), 1, width))
                if idx < 0:
                    raise ContextError(f"the EAGLE-3 encoder batch refused row {j} (code {idx})")
                self._pos[0] = pos0 + j
                lc.llama_batch_ext_set_pos(self._batch, idx, self._pos)
                lc.llama_batch_ext_set_output_embd(self._batch, idx, True)
            rc = lc.llama_process(self._ctx, lc.LLAMA_PROCESS_TYPE_ENCODE, self._batch)
            if rc != 0:
                raise ContextError(f"the EAGLE-3 encoder failed with code {rc} for {m} rows")
            g = self._ext.get_embeddings_nextn(self._ctx)
            if not g:
                raise ContextError("the EAGLE-3 encoder produced no output")
            out[i : i + m] = np.ctypeslib.as_array(g, shape=(m, self.n_embd))
        self.encode_seconds += time.perf_counter() - t0
        return out

    # -- decoder -------------------------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], g: np.ndarray, start: int, outputs: Sequence[int] = ()) -> None:
        """Evaluate pairs ``(tokens[i], g[i])`` at positions ``start + i``; keep outputs for rows ``outputs``."""
        self._decode_pairs(tokens, g, start, outputs, "g")
