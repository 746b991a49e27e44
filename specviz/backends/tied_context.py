"""A llama.cpp context tied to a target context, decoding ``(token, hidden state)`` pairs.

The EAGLE-3 head and the MTP (NextN) context share this plumbing: the context is created with
``ctx_other`` set to the target's (llama.cpp lets it borrow the target's token embeddings and output
head that way), its hidden output of every output row is switched on (``llama_set_embeddings_nextn``),
batches are ``llama_batch_ext`` rows that carry a token id and an embedding, and its cache is read,
rolled back, saved and restored like the target's.
"""

from __future__ import annotations

import ctypes
import os
from typing import Sequence

import numpy as np

from ..errors import ContextError
from .binding import llama_lib
from .context_base import ContextBase, keeps_an_output_row
from .llama import LlamaContext, LlamaModel


class TiedContext(ContextBase):
    """Base of :class:`~specviz.backends.eagle3.Eagle3Context` and :class:`~specviz.backends.mtp.NextNContext`.

    Subclasses call :meth:`_open` from their ``__init__``; ``what`` names the context in error messages.
    """

    what = "tied"
    n_vocab: int  #: logits row width (the target vocabulary), set by the subclass
    n_embd: int  #: hidden-state width, set by the subclass

    def _open(
        self, model: LlamaModel, target: LlamaContext, *, n_threads: int | None, ctx_type: int = 0, n_seq: int = 1
    ) -> None:
        from . import llama_ext

        lc = llama_lib()
        self._ext = llama_ext.ext()
        cap = target.capacity
        threads = n_threads or max(1, os.cpu_count() or 1)
        p = lc.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = cap.n_ctx, cap.n_batch, cap.n_ubatch, n_seq
        # a draft tree's branches are sequences sharing their prefix's cells: a unified cache (seq_cp adds ids)
        p.kv_unified = n_seq > 1
        p.n_threads = p.n_threads_batch = threads
        p.no_perf = True
        p.ctx_type = ctx_type
        p.ctx_other = target.ptr
        ctx = lc.llama_init_from_model(model.ptr, p)
        if not ctx:
            raise ContextError(f"llama.cpp could not create the {self.what} context for {model.path}")
        self._adopt(ctx)
        self.n_ctx = int(lc.llama_n_ctx(ctx))
        self.n_batch = int(lc.llama_n_batch(ctx))
        self.n_ubatch = int(lc.llama_n_ubatch(ctx))
        self._keeps_a_row = keeps_an_output_row(model)
        self._ext.set_embeddings_nextn(ctx, True, True)
        self._batch = lc.llama_batch_ext_init(ctx)
        if not self._batch:
            self._batch = None
            self.close()
            raise ContextError(f"llama.cpp could not create an extended batch for the {self.what} context")
        self._pos = (lc.llama_pos * 1)()
        self.n_seq = n_seq
        self.decode_seconds = 0.0

    # -- outputs -------------------------------------------------------------------------------------
    def logits(self, i: int) -> np.ndarray:
        """Logits of output row ``i`` over the target vocabulary (a zero-copy view, valid until the next call)."""
        ptr = llama_lib().llama_get_logits_ith(self._ctx, i)
        if not ptr:
            raise ContextError(f"no {self.what} logits for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def prenorm(self, i: int) -> np.ndarray:
        """The hidden output of output row ``i`` (the next step's input state; a copy)."""
        ptr = self._ext.get_embeddings_nextn_ith(self._ctx, i)
        if not ptr:
            raise ContextError(f"no {self.what} hidden output for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def _decode_pairs(
        self, tokens: Sequence[int], rows: np.ndarray, start: int, outputs: Sequence[int], row_name: str
    ) -> None:
        """Evaluate pairs ``(tokens[i], rows[i])`` (a token and an embedding row: EAGLE-3's ``g``, MTP's hidden
        state) at positions ``start + i``, keeping logits for the batch rows in ``outputs``."""
        lc = llama_lib()
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch:
            raise ContextError(f"{n} {self.what} pairs exceed n_batch={self.n_batch}")
        if start + n > self.n_ctx:
            raise ContextError(f"{self.what} positions {start}..{start + n - 1} exceed n_ctx={self.n_ctx}")
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if rows.shape != (n, self.n_embd):
            raise ContextError(f"{self.what} {row_name} rows have shape {rows.shape}, expected {(n, self.n_embd)}")
        want = set(int(i) for i in outputs)
        fptr = ctypes.POINTER(ctypes.c_float)
        lc.llama_batch_ext_clear(self._batch)
        for i in range(n):
            idx = lc.llama_batch_ext_add_token(self._batch, 0, int(tokens[i]))
            if idx < 0:
                raise ContextError(f"the {self.what} batch refused token {tokens[i]} (code {idx})")
            self._pos[0] = start + i
            lc.llama_batch_ext_set_pos(self._batch, idx, self._pos)
            if not lc.llama_batch_ext_set_embd_token(
                self._batch, idx, lc.llama_embd(rows[i].ctypes.data_as(fptr), 1, self.n_embd)
            ):
                raise ContextError(f"the {self.what} batch refused a {row_name} row")
            if i in want or (i == n - 1 and not want and self._keeps_a_row):  # context_base.keeps_an_output_row
                lc.llama_batch_ext_set_output_logits(self._batch, idx, True)
        rc = self._decode(lc.llama_process, self._ctx, lc.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            raise ContextError(
                f"the {self.what} decoder failed with code {rc} for {n} pairs at position {start}"
                + (" (no free KV slot)" if rc == 1 else "")
            )

    # -- a draft tree's branches (a context opened with n_seq > 1) ---------------------------------------------
    def copy_sequence(self, src: int, dst: int) -> None:
        """Make sequence ``dst`` hold exactly sequence ``src``'s cells (cleared first; in the unified cache the
        cells only gain an id): a branch splitting off ``src``'s path."""
        lc = llama_lib()
        for s in (src, dst):
            if not 0 <= s < self.n_seq:
                raise ContextError(f"sequence {s} is outside the {self.what} context's 0..{self.n_seq - 1}")
        if src != dst:
            lc.llama_memory_seq_rm(self._mem, dst, -1, -1)
            lc.llama_memory_seq_cp(self._mem, src, dst, -1, -1)

    def drop_branches(self) -> None:
        """Clear every sequence but 0 (a draft tree's other branches); nothing with one sequence."""
        lc = llama_lib()
        for s in range(1, self.n_seq):
            lc.llama_memory_seq_rm(self._mem, s, -1, -1)

    def decode_nodes(self, tokens: Sequence[int], rows: np.ndarray, position: int, seqs: Sequence[int]) -> None:
        """Evaluate pairs ``(tokens[i], rows[i])``, one per branch, each at ``position`` in sequence ``seqs[i]``
        (distinct), keeping every row's outputs (batch row ``i``): one level of a draft tree."""
        lc = llama_lib()
        n = len(tokens)
        if not 0 < n <= min(self.n_batch, self.n_seq) or len(set(seqs)) != n or len(seqs) != n:
            raise ContextError(f"{n} {self.what} tree nodes in sequences {list(seqs)} (n_seq={self.n_seq})")
        if position >= self.n_ctx:
            raise ContextError(f"{self.what} position {position} exceeds n_ctx={self.n_ctx}")
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if rows.shape != (n, self.n_embd):
            raise ContextError(f"{self.what} tree rows have shape {rows.shape}, expected {(n, self.n_embd)}")
        fptr = ctypes.POINTER(ctypes.c_float)
        lc.llama_batch_ext_clear(self._batch)
        for i in range(n):
            seq = int(seqs[i])
            if not 0 <= seq < self.n_seq:
                raise ContextError(f"sequence {seq} is outside the {self.what} context's 0..{self.n_seq - 1}")
            idx = lc.llama_batch_ext_add_token(self._batch, seq, int(tokens[i]))
            if idx < 0:
                raise ContextError(f"the {self.what} batch refused token {tokens[i]} (code {idx})")
            self._pos[0] = position
            lc.llama_batch_ext_set_pos(self._batch, idx, self._pos)
            if not lc.llama_batch_ext_set_embd_token(
                self._batch, idx, lc.llama_embd(rows[i].ctypes.data_as(fptr), 1, self.n_embd)
            ):
                raise ContextError(f"the {self.what} batch refused a tree row")
            lc.llama_batch_ext_set_output_logits(self._batch, idx, True)
        rc = self._decode(lc.llama_process, self._ctx, lc.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        if rc != 0:
            raise ContextError(f"the {self.what} decoder failed with code {rc} for {n} tree nodes at {position}")

    def _free_batch(self) -> None:
        llama_lib().llama_batch_ext_free(self._batch)
