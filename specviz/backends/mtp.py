"""Multi-token prediction (NextN) layers of a target, as a drafting context.

Some models carry extra "NextN" blocks after their trunk (``{arch}.nextn_predict_layers``), trained to
predict one token further from the trunk's final hidden state. llama.cpp runs them in a context of type
``LLAMA_CONTEXT_TYPE_MTP`` created from the same model with ``ctx_other`` set to the target context;
the target context outputs its hidden state for every row (``llama_set_embeddings_nextn`` unmasked),
and the MTP context decodes ``(token, hidden state)`` pairs (``llama_batch_ext`` rows with a token id
and an embedding) whose outputs are logits and the next hidden state.

:func:`mtp_problems` says why a model cannot be used (empty list: it can). The MTP graphs of the
vendored llama.cpp abort (``GGML_ASSERT``) on missing tensors or on more than one NextN block, so only
architectures whose graph requirements specviz checks are accepted (:data:`MTP_ARCHS`): ``glm4moe``,
verified with a tiny model the tests write. Others with NextN layers (deepseek2, qwen35, qwen3next …)
are refused with the reason: their MTP graphs need more (MLA attention, recurrent layers whose cache
specviz cannot roll back).

Pairing convention (llama.cpp's): the pair at MTP position ``p`` is ``(token[p], h[p - 1])``.
"""

from __future__ import annotations

import ctypes
import os
import time
import weakref
from typing import Any, Sequence

import numpy as np

from ..errors import ContextError, StrategyUnavailableError
from .gguf_check import GGUFInfo
from .llama import LlamaContext, LlamaModel, _lib

#: Architectures whose MTP graph specviz checks fully: name -> tensors (per NextN block) the graph requires.
MTP_ARCHS: dict[str, tuple[str, ...]] = {
    "glm4moe": (
        "nextn.eh_proj.weight",
        "nextn.enorm.weight",
        "nextn.hnorm.weight",
        "ffn_gate_inp.weight",
        "attn_norm.weight",
        "post_attention_norm.weight",
    ),
}


def nextn_layers(info: GGUFInfo) -> int:
    """The number of NextN blocks a GGUF declares (0 when none)."""
    v = info.metadata.get(f"{info.architecture}.nextn_predict_layers", 0)
    return int(v) if isinstance(v, (int, np.integer)) else 0


def mtp_problems(info: GGUFInfo) -> list[str]:
    """Every reason the NextN layers of the GGUF described by ``info`` cannot draft here (empty: they can)."""
    arch = info.architecture
    n = nextn_layers(info)
    if n == 0:
        return [
            f"the model ({arch}) has no NextN (multi-token prediction) layers; mtp needs a model trained "
            f"with them ({arch}.nextn_predict_layers > 0, as GLM-4.5 ships them)"
        ]
    if arch not in MTP_ARCHS:
        return [
            f"the model has {n} NextN layer(s), but specviz's MTP driver supports {', '.join(MTP_ARCHS)} only: "
            f"llama.cpp's {arch} MTP graph has requirements specviz does not check yet"
        ]
    if n != 1:
        return [f"the model has {n} NextN layers; llama.cpp's {arch} MTP graph runs exactly one"]
    n_all = int(info.metadata.get(f"{arch}.block_count", 0))
    il = n_all - n
    missing = [f"blk.{il}.{t}" for t in MTP_ARCHS[arch] if f"blk.{il}.{t}" not in info.tensors]
    if missing:
        return [f"the NextN block lacks {', '.join(missing)} (the file was converted without its MTP weights?)"]
    return []


class NextNContext:
    """The MTP context of a model with NextN layers, tied to a target context (see the module docstring)."""

    def __init__(self, model: LlamaModel, target: LlamaContext, *, n_threads: int | None = None) -> None:
        from . import llama_ext

        why = mtp_problems(model.info)
        if why:
            raise StrategyUnavailableError("; ".join(why), knob="strategy", value="mtp")
        if model.n_layer_nextn < 1:
            raise StrategyUnavailableError(
                f"{model.path} was loaded without its NextN layers", knob="strategy", value="mtp"
            )
        lc = _lib()
        self._ext = llama_ext.ext()
        self.model = model
        self.target = target
        self.n_embd = int(lc.llama_model_n_embd_out(model.ptr))
        if self.n_embd != int(lc.llama_model_n_embd_out(target.model.ptr)):
            raise StrategyUnavailableError(
                "the NextN model's hidden size differs from the target's", knob="strategy", value="mtp"
            )
        self.n_vocab = model.n_vocab
        cap = target.capacity
        threads = n_threads or max(1, os.cpu_count() or 1)
        p = lc.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = cap.n_ctx, cap.n_batch, cap.n_ubatch, 1
        p.n_threads = p.n_threads_batch = threads
        p.no_perf = True
        p.ctx_type = 1  # LLAMA_CONTEXT_TYPE_MTP
        p.ctx_other = target.ptr
        ctx = lc.llama_init_from_model(model.ptr, p)
        if not ctx:
            raise ContextError(f"llama.cpp could not create an MTP context for {model.path}")
        self._ctx = ctx
        self._mem = lc.llama_get_memory(ctx)
        self.n_ctx = int(lc.llama_n_ctx(ctx))
        self.n_batch = int(lc.llama_n_batch(ctx))
        self._ext.set_embeddings_nextn(ctx, True, True)
        self._batch = lc.llama_batch_ext_init(ctx)
        self._pos = (lc.llama_pos * 1)()
        self.decode_seconds = 0.0

    def kv_len(self) -> int:
        """Largest position held + 1."""
        return int(_lib().llama_memory_seq_pos_max(self._mem, 0)) + 1

    def clear(self) -> None:
        """Empty the cache."""
        _lib().llama_memory_clear(self._mem, True)

    def truncate(self, n: int) -> None:
        """Remove every position ``>= n``."""
        if not _lib().llama_memory_seq_rm(self._mem, 0, n, -1):
            raise ContextError(f"llama.cpp refused to remove the MTP cache tail from position {n}")

    def decode(self, tokens: Sequence[int], h: np.ndarray, start: int, outputs: Sequence[int] = ()) -> None:
        """Evaluate pairs ``(tokens[i], h[i])`` at positions ``start + i``; keep outputs for rows ``outputs``."""
        lc = _lib()
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch or start + n > self.n_ctx:
            raise ContextError(f"{n} MTP pairs at {start} do not fit (n_batch {self.n_batch}, n_ctx {self.n_ctx})")
        rows = np.ascontiguousarray(h, dtype=np.float32)
        if rows.shape != (n, self.n_embd):
            raise ContextError(f"MTP hidden rows have shape {rows.shape}, expected {(n, self.n_embd)}")
        want = set(int(i) for i in outputs)
        fptr = ctypes.POINTER(ctypes.c_float)
        lc.llama_batch_ext_clear(self._batch)
        for i in range(n):
            idx = lc.llama_batch_ext_add_token(self._batch, 0, int(tokens[i]))
            if idx < 0:
                raise ContextError(f"the MTP batch refused token {tokens[i]} (code {idx})")
            self._pos[0] = start + i
            lc.llama_batch_ext_set_pos(self._batch, idx, self._pos)
            if not lc.llama_batch_ext_set_embd_token(
                self._batch, idx, lc.llama_embd(rows[i].ctypes.data_as(fptr), 1, self.n_embd)
            ):
                raise ContextError("the MTP batch refused a hidden-state row")
            if i in want:
                lc.llama_batch_ext_set_output_logits(self._batch, idx, True)
        t0 = time.perf_counter()
        rc = lc.llama_process(self._ctx, lc.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        self.decode_seconds += time.perf_counter() - t0
        if rc != 0:
            raise ContextError(f"the MTP decoder failed with code {rc} for {n} pairs at position {start}")

    def logits(self, i: int) -> np.ndarray:
        """Logits of batch row ``i`` (a zero-copy view, valid until the next call)."""
        ptr = _lib().llama_get_logits_ith(self._ctx, i)
        if not ptr:
            raise ContextError(f"no MTP logits for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def prenorm(self, i: int) -> np.ndarray:
        """The NextN block's hidden output of row ``i`` (the next step's state; a copy)."""
        ptr = self._ext.get_embeddings_nextn_ith(self._ctx, i)
        if not ptr:
            raise ContextError(f"no MTP hidden output for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def state(self) -> bytes:
        """The MTP context's state as bytes."""
        lc = _lib()
        size = lc.llama_state_get_size(self._ctx)
        buf = (ctypes.c_uint8 * size)()
        n = lc.llama_state_get_data(self._ctx, buf, size)
        return bytes(buf[:n])

    def load_state(self, data: bytes) -> None:
        """Restore :meth:`state`."""
        lc = _lib()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if lc.llama_state_set_data(self._ctx, buf, len(data)) == 0:
            raise ContextError("llama.cpp refused the saved MTP context state")

    def close(self) -> None:
        """Free the batch and the context (idempotent)."""
        if getattr(self, "_ctx", None):
            lc = _lib()
            lc.llama_batch_ext_free(self._batch)
            lc.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:  # pragma: no cover - finaliser
        try:
            self.close()
        except Exception:
            pass


#: How many live taps keep each target context's hidden-state output on.
_NEXTN_USERS: weakref.WeakKeyDictionary[LlamaContext, int] = weakref.WeakKeyDictionary()


class TargetNextNTap:
    """Switches a target context's per-row hidden-state output on (unmasked: every batch row) and reads it."""

    def __init__(self, target: LlamaContext) -> None:
        from . import llama_ext

        self._ext = llama_ext.ext()
        self.target = target
        self.n_embd = int(_lib().llama_model_n_embd_out(target.model.ptr))
        # several drafters may hold the output on at once (a successor is built before its predecessor is
        # closed): count them on the context, and switch it off with the last one
        _NEXTN_USERS[target] = _NEXTN_USERS.get(target, 0) + 1
        self._ext.set_embeddings_nextn(target.ptr, True, False)
        self._on = True

    def rows(self, n: int) -> np.ndarray:
        """Hidden states of the first ``n`` rows of the target's last batch (a copy)."""
        ptr = self._ext.get_embeddings_nextn(self.target.ptr)
        if not ptr:
            raise ContextError("the target produced no hidden states (was a batch evaluated?)")
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()

    def close(self) -> None:
        """Switch the output off again (idempotent)."""
        if not self._on:
            return
        self._on = False
        _NEXTN_USERS[self.target] = _NEXTN_USERS.get(self.target, 1) - 1
        if _NEXTN_USERS[self.target] <= 0 and getattr(self.target, "_ctx", None) is not None:
            self._ext.set_embeddings_nextn(self.target.ptr, False, False)


def describe(model: Any) -> dict[str, Any]:
    """NextN facts of a loaded model (for ``specviz info``)."""
    return {"nextn_layers": int(getattr(model, "n_layer_nextn", 0)), "problems": mtp_problems(model.info)}
