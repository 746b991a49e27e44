"""A DFlash / DSpark / DFlash-2 draft next to its target: what the GGUF declares, the checks, the context.

llama.cpp's ``dflash`` architecture (``src/models/dflash.cpp``; driven by
``common_speculative_impl_draft_dflash`` in ``common/speculative.cpp``) drafts a whole *block* per round:

* for every position the target evaluates, the inputs of the layers in ``dflash.target_layers`` are
  fused by ``fc`` (+ ``enc.output_norm``) and their keys and values *injected* into the draft's cache at
  that position (an embedding batch, no outputs): the draft's cache mirrors the target's;
* a block ``[last token, <mask> x n]`` is decoded in one pass with non-causal attention (unless
  ``dflash.attention.causal``) at the positions after the target's cache; the output at each mask
  position is that position's draft token, all positions drafted in parallel.

Variants, told apart by their tensors and keys (:class:`DFlashHeadInfo`):

* **DSpark** (``markov_w1.weight``): a Markov head biases each block position's logits by the previous
  position's greedy token, and an optional confidence head (``conf_proj``) predicts each position's
  acceptance, read through the NextN output slot. Anchor-first blocks (``dflash.sample_from_anchor``,
  the default) read the anchor's own output as the first draft token.
* **DFlash-2** (``dflash.selector_top_k`` > 0): a selector packs each position's top-k candidates and the
  pairwise transition scores into the NextN output (the "lattice"), walked left to right.

:func:`dflash_load_problems` says what in the file alone would make llama.cpp's loader abort (checked
before the file is loaded); :func:`dflash_problems` says why the draft cannot serve a target (every
``GGML_ASSERT`` the graph would reach with this pair among them). Empty lists mean it can.
:class:`DFlashContext` owns the draft's llama.cpp context, tied to the target's through ``ctx_other``.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ContextError, StrategyUnavailableError
from .binding import llama_lib
from .gguf_check import GGUFInfo, check_gguf, read_small_tensor
from .llama import LlamaContext, LlamaModel
from .tied_context import TiedContext

DFLASH_ARCH = "dflash"
#: llama.cpp's block size when the GGUF has no ``dflash.block_size`` (``common/speculative.cpp``).
DEFAULT_BLOCK_SIZE = 16
_GGML_I64 = 27
#: llama.cpp's refusal of ``--spec-draft-p-min`` > 0 with a DSpark draft that has no confidence head.
NO_CONFIDENCE_HEAD = "DSpark draft has no confidence head: please set --spec-draft-p-min 0"


@dataclass(frozen=True)
class DFlashHeadInfo:
    """What a ``dflash`` GGUF declares (its metadata and tensor table)."""

    path: Path
    target_layers: tuple[int, ...]
    n_embd: int
    n_vocab: int
    block_size: int  #: the trained block (``dflash.block_size``, else llama.cpp's 16)
    block_size_declared: bool
    mask_token: int | None  #: ``tokenizer.ggml.mask_token_id``
    dspark: bool  #: has DSpark's Markov head
    confidence_head: bool  #: has DSpark's confidence head (``conf_proj.weight``)
    confidence_key: bool | None  #: ``dflash.has_confidence_head`` when present
    sample_from_anchor: bool
    causal: bool
    selector_top_k: int  #: DFlash-2 when > 0
    n_draft_vocab: int  #: the rows of the output head (``d2t``'s length with a reduced vocabulary)
    has_d2t: bool
    own_embeddings: bool
    own_output: bool
    hyper_connections: int  #: > 0: DeepSeek-V4's DSpark backbone

    @property
    def kind(self) -> str:
        """``dspark``, ``dflash2`` or ``dflash``."""
        return "dspark" if self.dspark else ("dflash2" if self.selector_top_k > 0 else "dflash")

    @property
    def anchor_drafts(self) -> bool:
        """Whether the anchor's own output is the first draft token (DSpark's anchor-first layout)."""
        return self.dspark and self.sample_from_anchor

    @property
    def max_draft(self) -> int:
        """The most draft tokens one block yields: ``block_size`` anchor-first, else ``block_size - 1``."""
        return self.block_size if self.anchor_drafts else self.block_size - 1

    def block_tokens(self, n_draft: int) -> int:
        """Tokens of a block that drafts ``n_draft``: the anchor plus the masks."""
        return n_draft if self.anchor_drafts else n_draft + 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        d = dict(self.__dict__)
        d["path"] = str(self.path)
        d["target_layers"] = list(self.target_layers)
        d["kind"] = self.kind
        d["max_draft"] = self.max_draft
        d["anchor_drafts"] = self.anchor_drafts
        return d


def _flag(info: GGUFInfo, key: str) -> bool | None:
    v = info.metadata.get(key)
    if v is None:
        return None
    if isinstance(v, str):
        return v.lower() == "true"
    return bool(v)


def read_dflash_head(path: str | os.PathLike, info: GGUFInfo | None = None) -> DFlashHeadInfo:
    """The draft's declared shape; :class:`StrategyUnavailableError` when the file is not a ``dflash`` GGUF."""
    info = info or check_gguf(path)
    if info.architecture != DFLASH_ARCH:
        raise StrategyUnavailableError(
            f"{path} is a {info.architecture!r} model, not a DFlash draft (architecture 'dflash'); give the "
            "dflash/dspark strategies a DFlash GGUF",
            knob="draft_model",
            value=str(path),
        )
    m, t = info.metadata, info.tensors
    layers = m.get(f"{DFLASH_ARCH}.target_layers")
    bs = m.get(f"{DFLASH_ARCH}.block_size")
    mask = m.get("tokenizer.ggml.mask_token_id")
    tok = m.get("tokenizer.ggml.tokens")
    out = t.get("output.weight")
    d2t = t.get("d2t")
    anchor = _flag(info, f"{DFLASH_ARCH}.sample_from_anchor")
    return DFlashHeadInfo(
        path=Path(path),
        target_layers=tuple(int(x) for x in layers) if layers is not None and not isinstance(layers, int) else (),
        n_embd=int(m.get(f"{DFLASH_ARCH}.embedding_length", 0) or 0),
        n_vocab=int(tok) if isinstance(tok, int) else 0,
        block_size=int(bs) if isinstance(bs, (int, np.integer)) else DEFAULT_BLOCK_SIZE,
        block_size_declared=isinstance(bs, (int, np.integer)),
        mask_token=int(mask) if isinstance(mask, (int, np.integer)) else None,
        dspark="markov_w1.weight" in t,
        confidence_head="conf_proj.weight" in t,
        confidence_key=_flag(info, f"{DFLASH_ARCH}.has_confidence_head"),
        sample_from_anchor=True if anchor is None else anchor,
        causal=bool(_flag(info, f"{DFLASH_ARCH}.attention.causal")),
        selector_top_k=int(m.get(f"{DFLASH_ARCH}.selector_top_k", 0) or 0) if "selector_hidden.weight" in t else 0,
        n_draft_vocab=int(d2t.dims[0]) if d2t is not None else (int(out.dims[1]) if out is not None else 0),
        has_d2t=d2t is not None,
        own_embeddings="token_embd.weight" in t,
        own_output=out is not None,
        hyper_connections=int(m.get(f"{DFLASH_ARCH}.hyper_connection.count", 0) or 0),
    )


def dflash_load_problems(info: GGUFInfo) -> list[str]:
    """What in a ``dflash`` file alone llama.cpp's loader would abort on rather than refuse (empty: none).

    The loader's own refusals (a missing tensor, missing DFlash-2 metadata) return no model and are
    reported as such; these are its ``GGML_ASSERT`` paths: DeepSeek-V4's DSpark backbone asserts a
    positive output-group count and sliding window.
    """
    m = info.metadata
    if int(m.get(f"{DFLASH_ARCH}.hyper_connection.count", 0) or 0) <= 0:
        return []
    why = []
    if int(m.get(f"{DFLASH_ARCH}.attention.output_group_count", 0) or 0) <= 0:
        why.append("its DeepSeek-V4 backbone declares no attention.output_group_count (llama.cpp asserts one)")
    if int(m.get(f"{DFLASH_ARCH}.attention.sliding_window", 0) or 0) <= 0:
        why.append("its DeepSeek-V4 backbone declares no sliding window (llama.cpp asserts one)")
    return why


def dflash_problems(
    head: DFlashHeadInfo,
    info: GGUFInfo,
    *,
    target_arch: str | None,
    target_n_layer: int,
    target_n_embd: int,
    target_n_vocab: int,
    p_min: float,
    dspark: bool,
) -> list[str]:
    """Every reason the draft cannot serve this target with this ``p_min`` as ``dspark`` or ``dflash``
    (empty: it can). Capture of the target's layer inputs is checked separately
    (:func:`specviz.backends.capture.capture_unavailable_reason`)."""
    why: list[str] = []
    if dspark and not head.dspark:
        why.append(
            "the draft has no Markov head (markov_w1.weight): it is a plain DFlash draft; use the dflash strategy "
            "(--spec-type draft-dflash)"
        )
    if not dspark and head.dspark:
        why.append("the draft carries DSpark's Markov head; use the dspark strategy (--spec-type draft-dspark)")
    if not head.target_layers:
        why.append("the draft lists no target layers (dflash.target_layers); llama.cpp needs at least one")
    bad = [x for x in head.target_layers if not 0 <= x < target_n_layer]
    if bad:
        why.append(f"the draft reads target layer {bad[0]}, but the target has layers 0-{target_n_layer - 1}")
    if head.n_embd != target_n_embd:
        # llama.cpp sizes the encoder for len(target_layers) x the draft's own width
        why.append(
            f"the draft is {head.n_embd} wide and the target {target_n_embd}: llama.cpp's DFlash encoder reads "
            "len(target_layers) target rows of the draft's own width"
        )
    fc = info.tensors.get("fc.weight")
    want = len(head.target_layers) * target_n_embd
    if fc is None:
        why.append("the draft has no fc.weight (the feature encoder)")
    elif fc.dims[0] != want:
        why.append(f"fc.weight reads {fc.dims[0]} features, the target gives {want} (layers x width)")
    if head.n_vocab != target_n_vocab:
        why.append(f"the draft's vocabulary has {head.n_vocab} tokens, the target's {target_n_vocab}")
    if head.mask_token is None:
        why.append("the draft's vocabulary has no mask token (tokenizer.ggml.mask_token_id); DFlash blocks need one")
    elif not 0 <= head.mask_token < target_n_vocab:
        why.append(f"the mask token {head.mask_token} is outside the vocabulary of {target_n_vocab}")
    if head.block_size < 2 and not head.anchor_drafts:
        why.append(f"the block size {head.block_size} leaves no position to draft (block_size must be >= 2)")
    if head.block_size < 1:
        why.append(f"the block size {head.block_size} is not positive")
    if head.dspark and not head.block_size_declared:
        why.append("a DSpark draft needs dflash.block_size in its metadata (llama.cpp asserts it)")
    if head.has_d2t:
        d2t = info.tensors["d2t"]
        if d2t.ggml_type != _GGML_I64 or len(d2t.dims) != 1:
            why.append(f"d2t has ggml type {d2t.ggml_type} and {len(d2t.dims)} dimensions; llama.cpp needs int64, 1")
        elif not head.own_output:
            why.append("the draft maps a reduced vocabulary (d2t) but has no output.weight of that size")
        else:
            ids = read_small_tensor(head.path, info, "d2t")
            if len(ids) and (ids.min() < 0 or ids.max() >= target_n_vocab):
                why.append(f"d2t maps to ids {int(ids.min())}..{int(ids.max())}, outside the vocabulary")
    if not head.own_embeddings and head.n_embd != target_n_embd:
        why.append(f"the draft borrows the target's token embeddings ({target_n_embd} wide) but is {head.n_embd} wide")
    if head.dspark and p_min > 0 and (not head.confidence_head or head.confidence_key is False):
        why.append(f"{NO_CONFIDENCE_HEAD} (draft_p_min=0)")
    if target_arch == DFLASH_ARCH:
        why.append("the target is itself a DFlash draft")
    return why


class DFlashContext(TiedContext):
    """The draft's llama.cpp context, tied to a target context (see the module docstring).

    :meth:`inject` writes target features at target positions; :meth:`decode_block` decodes one block;
    :meth:`logits`, :meth:`confidence` and :meth:`lattice` read its outputs.
    """

    what = "DFlash"

    def __init__(
        self, model: LlamaModel, target: LlamaContext, head: DFlashHeadInfo, *, n_threads: int | None = None
    ) -> None:
        self.model = model
        self.target = target
        self.head = head
        self.n_embd = model.n_embd
        self.n_vocab = model.n_vocab
        self.n_features = len(head.target_layers) * target.model.n_embd
        self._open(model, target, n_threads=n_threads)
        lc = llama_lib()
        # DFlash-2 reads its lattice for every row; DSpark's confidence only for output rows (llama.cpp's masks)
        self._ext.set_embeddings_nextn(self._ctx, True, head.kind != "dflash2")
        lc.llama_set_causal_attn(self._ctx, head.causal)
        self.inject_seconds = 0.0
        self._block_rows = 0
        # an embedding row carries one position per M-RoPE section (a draft for an M-RoPE target reads
        # four): llama.cpp's {p, p, p, 0}; a token row reads the first only
        self._pos4 = (lc.llama_pos * 4)()

    def inject(self, features: np.ndarray, start: int) -> None:
        """Write the fused target features ``[n, layers x width]`` at positions ``start …`` (chunked to n_ubatch,
        as llama.cpp does; on a GPU placement each chunk keeps its last row, read by nobody)."""
        lc = llama_lib()
        feats = np.ascontiguousarray(features, dtype=np.float32)
        n, width = feats.shape
        if width != self.n_features:
            raise ContextError(f"DFlash features are {width} wide, the draft expects {self.n_features}")
        if start + n > self.n_ctx:
            raise ContextError(f"DFlash positions {start}..{start + n - 1} exceed n_ctx={self.n_ctx}")
        fptr = ctypes.POINTER(ctypes.c_float)
        t0 = time.perf_counter()
        for i in range(0, n, self.n_ubatch):
            m = min(self.n_ubatch, n - i)
            lc.llama_batch_ext_clear(self._batch)
            for j in range(m):
                row = feats[i + j]
                idx = lc.llama_batch_ext_add_embd(self._batch, 0, lc.llama_embd(row.ctypes.data_as(fptr), 1, width))
                if idx < 0:
                    raise ContextError(f"the DFlash injection batch refused row {j} (code {idx})")
                p = start + i + j
                self._pos4[0], self._pos4[1], self._pos4[2], self._pos4[3] = p, p, p, 0
                lc.llama_batch_ext_set_pos(self._batch, idx, self._pos4)
                if j == m - 1 and self._keeps_a_row:  # context_base.keeps_an_output_row: one row, read by nobody
                    lc.llama_batch_ext_set_output_logits(self._batch, idx, True)
            rc = lc.llama_process(self._ctx, lc.LLAMA_PROCESS_TYPE_DECODE, self._batch)
            if rc != 0:
                raise ContextError(f"the DFlash injection failed with code {rc} for {m} rows at position {start + i}")
        self._wait_for_device()  # inside the time: on a GPU the micro-batches are only queued by now
        self.inject_seconds += time.perf_counter() - t0

    def decode_block(self, anchor: int, n_tokens: int, start: int) -> None:
        """Decode the block ``[anchor, <mask> x (n_tokens - 1)]`` at positions ``start …`` in one pass, every row
        an output (DFlash-2: none of its own, its lattice covers every row; on a GPU placement its last row is
        kept, :func:`~specviz.backends.context_base.keeps_an_output_row`)."""
        lc = llama_lib()
        mask = self.head.mask_token
        if mask is None:
            raise ContextError("the DFlash draft has no mask token")
        if n_tokens > self.n_ubatch:
            raise ContextError(f"a DFlash block of {n_tokens} tokens exceeds n_ubatch={self.n_ubatch}")
        if start + n_tokens > self.n_ctx:
            raise ContextError(f"DFlash block positions {start}..{start + n_tokens - 1} exceed n_ctx={self.n_ctx}")
        outputs = self.head.kind != "dflash2"
        lc.llama_batch_ext_clear(self._batch)
        for i in range(n_tokens):
            idx = lc.llama_batch_ext_add_token(self._batch, 0, int(anchor if i == 0 else mask))
            if idx < 0:
                raise ContextError(f"the DFlash block batch refused row {i} (code {idx})")
            self._pos[0] = start + i
            lc.llama_batch_ext_set_pos(self._batch, idx, self._pos)
            if outputs or (i == n_tokens - 1 and self._keeps_a_row):  # context_base.keeps_an_output_row
                lc.llama_batch_ext_set_output_logits(self._batch, idx, True)
        rc = self._decode(lc.llama_process, self._ctx, lc.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            raise ContextError(f"the DFlash block decode failed with code {rc} ({n_tokens} tokens at {start})")
        self._block_rows = n_tokens

    def confidence(self) -> np.ndarray:
        """DSpark's confidence of each row of the last block (the first column of its NextN output)."""
        ptr = self._ext.get_embeddings_nextn(self._ctx)
        if not ptr:
            raise ContextError("the DSpark draft produced no confidence (has it a confidence head?)")
        return np.ctypeslib.as_array(ptr, shape=(self._block_rows, self.n_embd))[:, 0].copy()

    def lattice(self) -> tuple[np.ndarray, np.ndarray]:
        """DFlash-2's selector output of the last block: candidate ids ``[rows, k]`` and transition scores
        ``[rows, k (predecessor), k (candidate)]``; row 0 (the anchor) holds nothing."""
        ptr = self._ext.get_embeddings_nextn(self._ctx)
        if not ptr:
            raise ContextError("the DFlash-2 selector produced no lattice")
        k = self.head.selector_top_k
        rows = np.ctypeslib.as_array(ptr, shape=(self._block_rows, self.n_embd))
        cand = rows[:, :k].astype(np.int64)
        scores = rows[:, k : k + k * k].reshape(self._block_rows, k, k).astype(np.float64)
        return cand, scores


def describe(model_path: str | os.PathLike) -> dict[str, Any]:
    """DFlash facts of a draft GGUF (for ``specviz info``)."""
    info = check_gguf(model_path)
    h = read_dflash_head(model_path, info)
    return h.to_dict()
