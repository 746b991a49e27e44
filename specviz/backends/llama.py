"""A thin, fast wrapper over llama.cpp's C API as llama-cpp-python exposes it (low level).

:class:`LlamaModel` loads a GGUF (checked first by :func:`~specviz.backends.gguf_check.check_gguf`, so a
broken file raises a typed error instead of reaching llama.cpp's abort paths) and handles the
vocabulary: tokenizing, token texts, end-of-generation ids. :class:`LlamaContext` evaluates batches,
asking logits only for the rows needed, hands out a logits row as a zero-copy numpy view, removes a
KV tail, saves and restores its state and reports its capacity.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, cast

import numpy as np

from ..errors import ContextError, ModelFormatError, SequenceError
from . import cbuild
from .binding import c_function_address, ensure_backend, llama_lib
from .context_base import ContextBase, keeps_an_output_row
from .context_settings import FLASH_ATTN_TYPE, GGML_TYPE, ContextSettings, head_sizes
from .gguf_check import check_gguf
from .memory import (
    DEFAULT_N_RS_SEQ,
    ContextMemory,
    Cut,
    memory_kind,
    probe_memory,
    sequence_cut_refusal,
    tree_refusal,
)
from .sequences import (
    MAX_SEQUENCES,
    MultiSequenceBatch,
    SequenceBatch,
    SequenceTokens,
    TreeBatch,
    plan_batch,
    plan_tree,
)

#: Cells of the throwaway context :class:`LlamaContext` measures its memory in (the cost of one cell does
#: not depend on how many there are; the probe fills two).
PROBE_N_CTX = 256


@dataclass(frozen=True)
class Capacity:
    """What a context can hold: context length, batch sizes and the model's sliding window (0 if none)."""

    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_swa: int

    def to_dict(self) -> dict:
        """Plain dictionary form."""
        return dict(n_ctx=self.n_ctx, n_batch=self.n_batch, n_ubatch=self.n_ubatch, n_swa=self.n_swa)


class LlamaModel:
    """A loaded GGUF model and its vocabulary.

    ``n_gpu_layers``: how many of the model's layers llama.cpp puts on the GPU devices of a GPU build
    (:mod:`specviz.backends.devices`); more than the model has offloads the output layer too. Draft models
    a session loads for this target are placed the same way (:class:`~specviz.models.draft_cache.DraftModelCache`).
    """

    def __init__(self, path: str | os.PathLike, *, n_gpu_layers: int = 0) -> None:
        self.path = Path(path)
        self.n_gpu_layers = int(n_gpu_layers)
        self.info = check_gguf(self.path)
        ensure_backend()
        lc = llama_lib()
        params = lc.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        # multi-token-prediction (NextN) layers are skipped at load unless asked for; load them when the
        # file has some, so the mtp strategy can draft with them (the trunk's graph never runs them)
        nextn = self.info.metadata.get(f"{self.info.architecture}.nextn_predict_layers", 0)
        params.load_mtp = bool(isinstance(nextn, int) and nextn > 0)
        ptr = lc.llama_model_load_from_file(str(self.path).encode(), params)
        if not ptr:
            raise ModelFormatError(
                f"llama.cpp could not load {self.path} (architecture {self.info.architecture!r}); "
                "check that the file is a complete GGUF model supported by llama.cpp "
                f"{getattr(__import__('llama_cpp'), '__version__', '')}"
            )
        self._ptr = ptr
        self.vocab = lc.llama_model_get_vocab(ptr)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self.n_layer = int(lc.llama_model_n_layer(ptr))
        self.n_embd = int(lc.llama_model_n_embd(ptr))
        self.n_layer_nextn = int(lc.llama_model_n_layer_nextn(ptr))
        self.n_swa = int(lc.llama_model_n_swa(ptr))
        self.n_ctx_train = int(lc.llama_model_n_ctx_train(ptr))
        self.bos = int(lc.llama_vocab_bos(self.vocab))
        self.eos = int(lc.llama_vocab_eos(self.vocab))
        self.add_bos = bool(lc.llama_vocab_get_add_bos(self.vocab))
        self._piece_bytes: dict[int, bytes] = {}
        self._piece_text: dict[int, str] = {}
        self._eog: dict[int, bool] = {}
        buf = ctypes.create_string_buffer(256)
        n = lc.llama_model_desc(ptr, buf, 256)
        self.description = buf.value.decode("utf-8", "replace") if n > 0 else ""
        self._fingerprint: str | None = None

    @property
    def fingerprint(self) -> str:
        """A SHA-256 over the file's size and three 1 MiB samples (start, middle, end): tells two model
        files apart cheaply, even two of the same size and vocabulary (computed once)."""
        if self._fingerprint is None:
            import hashlib

            size = self.path.stat().st_size
            h = hashlib.sha256(str(size).encode())
            chunk = 1 << 20
            with open(self.path, "rb") as f:
                for off in sorted({0, max(0, size // 2 - chunk // 2), max(0, size - chunk)}):
                    f.seek(off)
                    h.update(f.read(chunk))
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    @property
    def ptr(self):
        """The raw ``llama_model *`` (for other low-level calls)."""
        if self._ptr is None:
            raise ContextError("the model was closed")
        return self._ptr

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (with BOS when the model adds one and ``add_special``)."""
        lc = llama_lib()
        data = text.encode("utf-8")
        cap = len(data) + 16
        arr = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            raise ContextError(f"tokenization failed for a text of {len(data)} bytes")
        return list(arr[:n])

    def piece_bytes(self, token: int) -> bytes:
        """The raw bytes llama.cpp renders for ``token`` (special tokens rendered too)."""
        b = self._piece_bytes.get(token)
        if b is None:
            lc = llama_lib()
            buf = ctypes.create_string_buffer(64)
            n = lc.llama_token_to_piece(self.vocab, token, buf, 64, 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lc.llama_token_to_piece(self.vocab, token, buf, -n, 0, True)
            b = buf.raw[: max(n, 0)]
            self._piece_bytes[token] = b
        return b

    def content_bytes(self, token: int) -> bytes:
        """The bytes llama.cpp renders for ``token`` with special tokens not rendered: a control or unknown
        token gives none, as in llama-server's ``content`` (which renders them only with ``--special``)."""
        lc = llama_lib()
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
        return buf.raw[: max(n, 0)]

    def piece(self, token: int) -> str:
        """Display text of one token (invalid UTF-8 fragments shown with the replacement mark)."""
        p = self._piece_text.get(token)
        if p is None:
            p = self._piece_text[token] = self.piece_bytes(token).decode("utf-8", errors="replace")
        return p

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        """Display text of each token (every round's events carry them: kept once rendered)."""
        known = self._piece_text
        return [known.get(t) or self.piece(t) for t in tokens]

    def detokenize(self, tokens: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of a token sequence, joining bytes first so multi-byte characters survive."""
        out = bytearray()
        for t in tokens:
            if skip_special and (t == self.bos or self.is_eog(t)):
                continue
            out += self.piece_bytes(t)
        return out.decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT …)."""
        v = self._eog.get(token)
        if v is None:
            v = bool(llama_lib().llama_vocab_is_eog(self.vocab, token))
            self._eog[token] = v
        return v

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text of ``token`` (not rendered), for vocabulary comparisons."""
        t = llama_lib().llama_vocab_get_text(self.vocab, token)
        return t.decode("utf-8", "replace") if t else ""

    def close(self) -> None:
        """Free the model (idempotent)."""
        if getattr(self, "_ptr", None):
            llama_lib().llama_model_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:  # pragma: no cover - finaliser
        try:
            self.close()
        except Exception:
            pass


def _checked_settings(
    model: LlamaModel,
    n_ctx: int,
    n_batch: int,
    n_ubatch: int,
    n_threads: int | None,
    flash_attn: str,
    cache_type_k: str,
    cache_type_v: str,
) -> ContextSettings:
    """A context's sizes and settings checked (:class:`~specviz.errors.ContextError`,
    :class:`~specviz.errors.ContextSettingsError`) before llama.cpp sees them."""
    for name, v in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch)):
        if not isinstance(v, int) or v < 8:
            raise ContextError(f"{name} must be an integer >= 8, got {v!r}")
    if n_ubatch > n_batch:
        raise ContextError(f"n_ubatch ({n_ubatch}) must not exceed n_batch ({n_batch})")
    # flash attention and the KV cache types, checked against the model's head sizes before llama.cpp
    # sees them (it would refuse the context, or split quantization blocks: specviz.backends.context_settings)
    settings = ContextSettings.make(
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_threads=n_threads or None,
        flash_attn=flash_attn,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
    )
    settings.check_model(*head_sizes(model.info.metadata, model.info.architecture))
    return settings


def _check_sequences(model: LlamaModel, n_seq_max: int, kv_unified: bool, swa_full: bool) -> None:
    """Refuse (:class:`~specviz.errors.SequenceError`) a sequence count llama.cpp does not take, or several
    sequences on a memory kind that cannot cut one of them alone
    (:func:`~specviz.backends.memory.sequence_cut_refusal`)."""
    if not isinstance(n_seq_max, int) or isinstance(n_seq_max, bool) or not 1 <= n_seq_max <= MAX_SEQUENCES:
        raise SequenceError(f"n_seq_max must be an integer in 1..{MAX_SEQUENCES} (llama.cpp's), got {n_seq_max!r}")
    if not isinstance(kv_unified, bool):
        raise SequenceError(f"kv_unified must be True or False, got {kv_unified!r}")
    if n_seq_max > 1:
        kind = memory_kind(model, swa_full)
        why = sequence_cut_refusal(kind)
        if why is not None:
            raise SequenceError(f"a context of {n_seq_max} sequences is refused: {why}", kind=kind)


def _context_params(
    lc: Any,
    model: LlamaModel,
    settings: ContextSettings,
    n_threads: int | None,
    swa_full: bool,
    n_rs_seq: int | None,
    n_seq_max: int = 1,
    kv_unified: bool = False,
) -> Any:
    """llama.cpp's context parameters for ``settings``, the sliding-window cache, the recurrent-state
    snapshots and the sequences, refused (:class:`~specviz.errors.ContextError`) where llama.cpp would abort."""
    n_ctx, n_batch, n_ubatch = settings.n_ctx, settings.n_batch, settings.n_ubatch
    threads = n_threads or max(1, os.cpu_count() or 1)
    p = lc.llama_context_default_params()
    p.n_ctx = n_ctx
    p.n_batch = n_batch
    p.n_ubatch = n_ubatch
    # llama.cpp splits n_ctx over the sequences unless the cache is unified (llama_context's n_ctx_seq), as
    # llama-server does with -np N (no -kvu)
    p.n_seq_max = n_seq_max
    p.kv_unified = kv_unified
    p.n_threads = threads
    p.n_threads_batch = threads
    p.flash_attn_type = FLASH_ATTN_TYPE[settings.flash_attn]
    p.type_k = GGML_TYPE[settings.cache_type_k]
    p.type_v = GGML_TYPE[settings.cache_type_v]
    p.no_perf = True
    # a full-size sliding-window cache keeps every key, so any rejected tail can be removed; the ring
    # (swa_full=False) keeps the window only (specviz.backends.memory decides what it allows)
    p.swa_full = bool(swa_full)
    if not swa_full and model.n_swa > 0 and lc.llama_model_is_hybrid(model.ptr):
        # the ring's coverage is read from the memory's oldest position, which a hybrid memory reports
        # for its recurrent part (its newest position): specviz cannot tell what the ring still holds
        raise ContextError(
            "the ring-sized sliding-window cache (swa_full=False) is not supported on hybrid models; "
            "use the full-size cache (swa_full=True)"
        )
    if n_rs_seq is not None and (not isinstance(n_rs_seq, int) or isinstance(n_rs_seq, bool) or n_rs_seq < 0):
        raise ContextError(f"n_rs_seq must be an integer >= 0, got {n_rs_seq!r}")
    p.n_rs_seq = DEFAULT_N_RS_SEQ if n_rs_seq is None else n_rs_seq
    if p.n_rs_seq > 0 and (lc.llama_model_is_recurrent(model.ptr) or lc.llama_model_is_hybrid(model.ptr)):
        # llama.cpp keeps a sequence's last n_rs_seq + 1 tokens in one micro-batch for its state snapshots
        # and aborts the process (GGML_ASSERT in llama_batch_allocr::split_equal) when a micro-batch cannot
        # hold them: refuse that here, before the first decode
        if min(n_batch, n_ubatch) <= p.n_rs_seq + 1:
            raise ContextError(
                f"n_ubatch={min(n_batch, n_ubatch)} is too small for n_rs_seq={p.n_rs_seq} on this "
                f"{'hybrid' if lc.llama_model_is_hybrid(model.ptr) else 'recurrent'} model: llama.cpp needs "
                f"n_ubatch (and n_batch) above n_rs_seq + 1; use n_ubatch >= {p.n_rs_seq + 2} or a smaller n_rs_seq"
            )
    return p


class LlamaContext(ContextBase):
    """One llama.cpp context (sequence 0) over a :class:`LlamaModel`.

    ``capture``: whether to install the layer-capture eval callback (:mod:`specviz.backends.capture`), which
    llama.cpp accepts only at creation. ``None`` (the default) installs it, switched off, on architectures
    whose layer inputs only it can read (``gemma3``) unless ``SPECVIZ_CAPTURE_SHIM=0``; ``True`` installs it
    wherever its tensor names are known (or raises); ``False`` never. ``eval_callback``: a ctypes
    ``ggml_backend_sched_eval_callback`` installed instead (and kept alive by the context); the benchmarks use it
    to measure what a Python callback costs. :attr:`eval_count` counts decodes.

    ``swa_full`` keeps a full-size cache for sliding-window layers (False: llama.cpp's ring, see
    :mod:`specviz.backends.memory`); ``n_rs_seq`` is how many recurrent-state snapshots llama.cpp keeps
    for rolling back (None: :data:`~specviz.backends.memory.DEFAULT_N_RS_SEQ`; llama.cpp ignores it on
    architectures without that ability). :attr:`memory` holds what the memory is and cuts it back.

    ``flash_attn`` (``auto``, ``on``, ``off``) and ``cache_type_k`` / ``cache_type_v`` (``f16``, ``q8_0`` ...)
    are llama.cpp's ``-fa`` / ``-ctk`` / ``-ctv``, checked first against the model
    (:mod:`specviz.backends.context_settings`: a refused one raises
    :class:`~specviz.errors.ContextSettingsError`); :attr:`settings` holds every setting of the context and
    :attr:`n_threads` the threads llama.cpp was given (every core when the setting is None).

    ``n_seq_max`` opens the context for several sequences (llama.cpp's ``n_seq_max``, llama-server's ``-np``):
    unless ``kv_unified``, llama.cpp gives each sequence its own share of ``n_ctx``, :attr:`n_ctx_seq`
    positions (``n_ctx / n_seq_max`` rounded up to 256; :attr:`capacity`'s ``n_ctx`` is then the whole
    cache). Every other method works on sequence 0 exactly as in a one-sequence context;
    :meth:`eval_sequences` evaluates several sequences in one decode, :meth:`sequence_row` reads their
    rows, :meth:`seq_len`, :meth:`cut_sequence` and :meth:`clear_sequence` handle one sequence's cache.
    A draft tree is verified in a unified cache (``kv_unified=True``) as ``examples/speculative`` does:
    :meth:`share_prefix` gives sequence 0's cells to the branches' sequences, :meth:`eval_tree` evaluates
    rows that each belong to several sequences in one decode, :meth:`keep_branch` leaves the accepted branch
    in sequence 0 alone. Several sequences need a memory that cuts one sequence alone (attention, full-size
    sliding window: :data:`~specviz.backends.memory.SEQUENCE_CUT_KINDS`); other kinds are refused with
    :class:`~specviz.errors.SequenceError` before the context is created.
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        capture: bool | None = None,
        eval_callback: Any = None,
        swa_full: bool = True,
        n_rs_seq: int | None = None,
        flash_attn: str = "auto",
        cache_type_k: str = "f16",
        cache_type_v: str = "f16",
        n_seq_max: int = 1,
        kv_unified: bool = False,
    ) -> None:
        self.settings = _checked_settings(
            model, n_ctx, n_batch, n_ubatch, n_threads, flash_attn, cache_type_k, cache_type_v
        )
        _check_sequences(model, n_seq_max, kv_unified, swa_full)
        lc = llama_lib()
        self.model = model
        p = _context_params(lc, model, self.settings, n_threads, swa_full, n_rs_seq, n_seq_max, kv_unified)
        self.n_threads = int(p.n_threads)  # the threads llama.cpp was given (every core when n_threads is None)
        # Layer capture for EAGLE-3 on graphs that record no layer inputs (gemma3) needs an eval callback,
        # which llama.cpp only takes at creation: install the C shim switched off (it then costs nothing;
        # see specviz.backends.capture). capture=None installs it when the shim can be built.
        self._install_capture(p, capture, eval_callback)
        ctx = lc.llama_init_from_model(model.ptr, p)
        if not ctx:
            raise ContextError(
                f"llama.cpp could not create a context with n_ctx={n_ctx}, n_batch={n_batch}, "
                f"n_ubatch={n_ubatch} ({self.settings.describe()}); try a smaller n_ctx"
            )
        self._adopt(ctx)
        self.capacity = Capacity(
            int(lc.llama_n_ctx(ctx)), int(lc.llama_n_batch(ctx)), int(lc.llama_n_ubatch(ctx)), model.n_swa
        )
        self._init_batch()
        self.n_seq_max = int(lc.llama_n_seq_max(ctx))
        self.n_ctx_seq = int(lc.llama_n_ctx_seq(ctx))  # positions one sequence may hold
        self.kv_unified = kv_unified
        self._seq_batch: MultiSequenceBatch | None = None  # eval_sequences' batch, made at its first call
        self._sequences: SequenceBatch | None = None  # where the last eval_sequences put each sequence
        self._n_vocab = model.n_vocab
        self._row_type = ctypes.c_float * model.n_vocab  # one logits row, for zero-copy views
        self._logits_fn = c_function_address("llama_get_logits_ith")  # for native_rows()
        self._out_rows: list[int] = []
        self.decode_seconds = 0.0  # cumulative time inside llama_decode (for overhead measurements)
        self.last_batch = (0, 0)  # (first position, tokens) of the last decode
        self.memory = ContextMemory(self, self._probe_memory(p, bool(swa_full)))

    def _install_capture(self, p: Any, capture: bool | None, eval_callback: Any) -> None:
        """Set :attr:`tap`, :attr:`eval_callback` and the row counters, and put the callback (the layer-capture
        shim's or ``eval_callback``) into the context parameters ``p`` (see the comment in ``__init__``)."""
        lc = llama_lib()
        self.tap = None
        self.before_eval = None  # called before every decode (the shim resets its row counters)
        self.eval_count = 0
        self._keeps_a_row = keeps_an_output_row(self.model)
        if capture is None and cbuild.switched_off("SPECVIZ_CAPTURE_SHIM"):
            capture = False  # the user switched the shim off: gemma3 targets then refuse eagle3, saying why
        self.eval_callback = eval_callback  # llama.cpp keeps only the pointer: the callback must outlive the context
        if eval_callback is not None:
            if capture:
                raise ContextError("a context takes either the layer-capture shim or an eval_callback, not both")
            p.cb_eval = eval_callback
        elif capture is not False:
            from ..errors import CaptureUnavailableError
            from .capture import CALLBACK_ARCHS, CallbackTap, capture_method

            arch = self.model.info.architecture
            # None: only where the shim is the only way (gemma3); True: wherever its tensor names are known
            # (the tests compare it with llama.cpp's own taps on llama)
            if capture or capture_method(arch) == "callback":
                if arch not in CALLBACK_ARCHS:
                    raise CaptureUnavailableError(f"the layer-capture shim does not know the {arch!r} graph")
                try:
                    self.tap = CallbackTap()
                except CaptureUnavailableError:
                    if capture:
                        raise
            if self.tap is not None:
                p.cb_eval = lc.ggml_backend_sched_eval_callback(self.tap.callback_address)
                p.cb_eval_user_data = ctypes.c_void_p(self.tap.user_data)

    def _init_batch(self) -> None:
        """The one reusable batch of :attr:`capacity`'s ``n_batch`` tokens (sequence 0), and numpy views of its
        tokens, positions and logits flags."""
        lc = llama_lib()
        cap = self.capacity.n_batch
        self._batch = lc.llama_batch_init(cap, 0, 1)
        b = self._batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(cap,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(cap,))
        self._logits_flag = np.ctypeslib.as_array(ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(cap,))
        nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(cap,))
        nseq[:] = 1
        for i in range(cap):
            b.seq_id[i][0] = 0

    def _probe_memory(self, params: Any, swa_full: bool) -> Any:
        """:func:`~specviz.backends.memory.probe_memory` of this context.

        When the model has layers on a GPU device (``n_gpu_layers > 0``) the probe runs in a throwaway
        context of this one's settings (``params``, at most :data:`PROBE_N_CTX` cells, no eval callback), so
        that this context computes nothing before its first :meth:`eval`: on llama.cpp's Vulkan backend,
        switching EAGLE-3's layer taps on after a context has computed a graph corrupts the heap (see
        ``probe_memory``). On the CPU the probe runs in the context itself, as llama.cpp's does."""
        lc = llama_lib()
        scratch = None
        if self.model.n_gpu_layers > 0:
            sp = type(params).from_buffer_copy(params)
            sp.n_ctx = min(int(params.n_ctx), PROBE_N_CTX)
            sp.n_batch = sp.n_ubatch = min(int(params.n_ubatch), sp.n_ctx)
            sp.cb_eval = type(params.cb_eval)()  # NULL: the probe needs neither the capture shim nor a caller's
            sp.cb_eval_user_data = None
            scratch = lc.llama_init_from_model(self.model.ptr, sp)
            if not scratch:
                self.close()
                raise ContextError(
                    f"llama.cpp could not create the {sp.n_ctx}-cell context that measures the memory of a "
                    f"context with n_ctx={self.capacity.n_ctx} ({self.settings.describe()}); try a smaller n_ctx"
                )
        try:
            return probe_memory(
                self.model,
                self._ctx,
                n_ctx=self.capacity.n_ctx,
                n_ubatch=self.capacity.n_ubatch,
                swa_full=swa_full,
                scratch_ptr=scratch,
                keep_row=self._keeps_a_row,
            )
        finally:
            if scratch is not None:
                lc.llama_free(scratch)

    def clear(self) -> None:
        """Empty the cache (the saved states of :attr:`memory` no longer continue it: they are dropped)."""
        super().clear()
        self.memory.forget()

    def load_state(self, data: bytes, max_pos: int | None = None) -> None:
        """Restore a state produced by :meth:`state` (checked first; positions below ``max_pos``, see
        :meth:`ContextBase.load_state`); the saved states of :attr:`memory` are dropped."""
        super().load_state(data, max_pos)
        self.memory.forget()
        self.last_batch = (0, 0)

    def _recurrent_after(self) -> int | None:
        kind = self.memory.info.kind
        if kind == "recurrent":
            return 0
        if kind == "hybrid":  # its attention cache: one, or with a sliding window two (hybrid-iswa)
            return 2 if self.memory.info.n_swa > 0 else 1
        return None

    def eval(self, tokens: Sequence[int] | np.ndarray, start: int, rows: str | Sequence[int] = "all") -> None:
        """Evaluate ``tokens`` at positions ``start…`` in one batch (≤ n_batch).

        ``rows`` picks the rows whose logits are kept: ``"all"``, ``"last"``, ``"none"`` or indices.
        Raises :class:`ContextError` when llama.cpp refuses the batch (the cache is then unchanged or
        holds only completed micro-batches, which callers remove).
        """
        n = len(tokens)
        if n == 0:
            return
        if n > self.capacity.n_batch:
            raise ContextError(f"batch of {n} tokens exceeds n_batch={self.capacity.n_batch}")
        if start + n > self.capacity.n_ctx:
            raise ContextError(f"positions {start}..{start + n - 1} exceed n_ctx={self.capacity.n_ctx}")
        self._tok[:n] = tokens
        self._pos[:n] = np.arange(start, start + n, dtype=np.int32)
        flags = self._logits_flag
        flags[:n] = 0
        if rows == "all":
            flags[:n] = 1
            self._out_rows = list(range(n))
        elif rows == "last":
            flags[n - 1] = 1
            self._out_rows = [n - 1]
        elif rows == "none":
            self._out_rows = []
        else:
            idx = [int(i) for i in rows]
            flags[idx] = 1
            self._out_rows = idx
        if not self._out_rows and self._keeps_a_row:
            flags[n - 1] = 1  # computed for llama.cpp's sake, reported to nobody (context_base.keeps_an_output_row)
        self._batch.n_tokens = n
        if self.before_eval is not None:
            self.before_eval()
        self.eval_count += 1
        self.last_batch = (start, n)
        rc = self._decode(llama_lib().llama_decode, self._ctx, self._batch)
        if rc != 0:
            raise ContextError(
                f"llama_decode failed with code {rc} for {n} tokens at position {start}"
                + (" (no free KV slot: the context is full)" if rc == 1 else "")
            )

    def eval_prompt(self, tokens: Sequence[int], start: int = 0, *, keep_last: bool = False) -> None:
        """Evaluate a long sequence in n_batch chunks, keeping no logits, or with ``keep_last`` those of its
        last token (then :meth:`last_row` reads them), as llama-server evaluates a prompt."""
        nb = self.capacity.n_batch
        for i in range(0, len(tokens), nb):
            last = keep_last and i + nb >= len(tokens)
            self.eval(tokens[i : i + nb], start + i, rows="last" if last else "none")

    def last_row(self) -> np.ndarray:
        """Logits of the last row whose logits the previous :meth:`eval` kept."""
        if not self._out_rows:
            raise ContextError("the last batch kept no logits")
        return self.row(self._out_rows[-1])

    def row(self, i: int) -> np.ndarray:
        """Logits of batch row ``i`` as a zero-copy float32 view (valid until the next eval)."""
        ptr = llama_lib().llama_get_logits_ith(self._ctx, i)
        if not ptr:
            raise ContextError(f"no logits for batch row {i}; it was not requested")
        # np.frombuffer over a ctypes array at the row's address: numpy's as_array builds the same view
        # at three times the cost (every row a round reads)
        row = self._row_type.from_address(ctypes.addressof(ptr.contents))
        return np.frombuffer(cast(Any, row), dtype=np.float32)  # a ctypes array is a buffer (numpy's stubs omit it)

    def native_rows(self) -> tuple[int, int, int] | None:
        """Where compiled code reads the rows :meth:`row` gives: the address of ``llama_get_logits_ith``,
        this context's address and the row width; None once closed or when the function's address
        cannot be had (the acceptor then reads the rows through :meth:`row`)."""
        fn = self._logits_fn
        ctx = self._ctx
        if fn is None or ctx is None:
            return None
        return fn, int(ctx), self._n_vocab

    # -- several sequences (a context opened with n_seq_max > 1) -------------------------------------------
    def _check_seq(self, seq: int) -> None:
        if not isinstance(seq, (int, np.integer)) or isinstance(seq, bool) or not 0 <= seq < self.n_seq_max:
            raise SequenceError(f"sequence id {seq!r} is outside this context's 0..{self.n_seq_max - 1} (n_seq_max)")

    def seq_len(self, seq: int) -> int:
        """Positions the cache holds for sequence ``seq`` (its largest position + 1; 0 when it holds none)."""
        self._check_seq(seq)
        return int(llama_lib().llama_memory_seq_pos_max(self._mem, seq)) + 1

    def eval_sequences(self, parts: Iterable[SequenceTokens | tuple]) -> SequenceBatch:
        """Evaluate several sequences' tokens in one decode, as llama-server verifies its busy slots.

        ``parts``: one :class:`~specviz.backends.sequences.SequenceTokens` (or tuple ``(seq, tokens, start)``
        / ``(seq, tokens, start, rows)``) per sequence, each continuing its own cache at ``start`` and
        keeping the logits of ``rows`` (``"all"``, ``"last"``, ``"none"`` or indices into its tokens).
        Returns where each sequence's tokens landed (laid out in ascending sequence order, whatever the order
        given: :func:`~specviz.backends.sequences.plan_batch`); :meth:`sequence_row` reads a kept row until the
        next decode. Refused before llama.cpp sees it (:class:`~specviz.errors.SequenceError`, nothing changed):
        no sequences, a sequence id outside ``0..n_seq_max - 1`` or given twice, no tokens, a start that does
        not continue the sequence's cache, positions past :attr:`n_ctx_seq`, more than ``n_batch`` tokens.
        A decode llama.cpp refuses raises :class:`~specviz.errors.ContextError` (as :meth:`eval`).
        """
        cap = self.capacity
        plan = plan_batch(
            parts, n_seq_max=self.n_seq_max, n_ctx_seq=self.n_ctx_seq, n_batch=cap.n_batch, seq_len=self.seq_len
        )
        seq_batch = self._multi_batch()
        seq_batch.fill(plan, self._keeps_a_row)
        spans = tuple(span for _, span in plan)
        if self.before_eval is not None:
            self.before_eval()
        self.eval_count += 1
        # sequence 0's part, for the memory's rules (ContextMemory reads the last batch of sequence 0)
        zero = next((sp for sp in spans if sp.seq == 0), None)
        self.last_batch = (zero.start, zero.n) if zero is not None else (0, 0)
        self._sequences = None
        rc = self._decode(llama_lib().llama_decode, self._ctx, seq_batch.batch)
        if rc != 0:
            raise ContextError(
                f"llama_decode failed with code {rc} for {sum(sp.n for sp in spans)} tokens of sequences "
                f"{[sp.seq for sp in spans]}" + (" (no free KV slot: the context is full)" if rc == 1 else "")
            )
        self._sequences = SequenceBatch(spans, self.eval_count)
        return self._sequences

    def eval_sequence_prompt(self, seq: int, tokens: Sequence[int], start: int = 0, *, keep_last: bool = False) -> None:
        """Evaluate a long run of sequence ``seq``'s tokens alone, in ``n_batch`` chunks, keeping no logits, or
        with ``keep_last`` those of its last token (then ``sequence_row(seq, len(last chunk) - 1)`` reads
        them): a new request's prompt while the other sequences keep their caches."""
        nb = self.capacity.n_batch
        for i in range(0, len(tokens), nb):
            last = keep_last and i + nb >= len(tokens)
            self.eval_sequences([SequenceTokens(seq, tokens[i : i + nb], start + i, "last" if last else "none")])

    def sequence_row(self, seq: int, i: int) -> np.ndarray:
        """Logits of sequence ``seq``'s token ``i`` in the last :meth:`eval_sequences` batch, as a zero-copy
        float32 view (valid until the next decode); :class:`~specviz.errors.ContextError` when the last decode
        was not such a batch, :class:`~specviz.errors.SequenceError` when that row was not kept."""
        got = self._sequences
        if got is None or got.stamp != self.eval_count:
            raise ContextError(
                "no multi-sequence batch is current: read sequence rows after eval_sequences, before the next decode"
            )
        return self.row(got.index(seq, i))

    def cut_sequence(self, seq: int, n_keep: int) -> Cut:
        """Leave sequence ``seq``'s cache holding its first ``n_keep`` positions (``llama_memory_seq_rm`` of the
        tail), the other sequences untouched. Only memory that cuts one sequence alone
        (:data:`~specviz.backends.memory.SEQUENCE_CUT_KINDS`); on the others, and for a bad ``seq`` or
        ``n_keep``, :class:`~specviz.errors.SequenceError` and nothing changes."""
        self._check_seq(seq)
        kind = self.memory.info.kind
        why = sequence_cut_refusal(kind)
        if why is not None:
            raise SequenceError(f"sequence {seq} cannot be cut alone: {why}", kind=kind)
        if not isinstance(n_keep, (int, np.integer)) or isinstance(n_keep, bool) or n_keep < 0:
            raise SequenceError(f"n_keep must be an integer >= 0, got {n_keep!r}")
        t0 = time.perf_counter()
        held = self.seq_len(seq)
        if n_keep >= held:
            return Cut("none", held, held, 0.0)
        if not llama_lib().llama_memory_seq_rm(self._mem, seq, int(n_keep), -1):
            raise ContextError(f"llama.cpp refused to remove sequence {seq}'s cache tail from position {n_keep}")
        return Cut("truncate", held, int(n_keep), time.perf_counter() - t0)

    # -- a draft tree's verify (rows in several sequences at once; a unified cache) -------------------------
    def _seq_pos_min(self, seq: int) -> int:
        """Sequence ``seq``'s smallest cached position (-1 when it holds none)."""
        return int(llama_lib().llama_memory_seq_pos_min(self._mem, seq))

    def share_prefix(self, n: int) -> None:
        """Give sequences ``1 … n - 1`` every cell of sequence 0 (each cleared first), so that each branch of a
        draft tree continues the same prefix, as ``examples/speculative`` shares the target's prompt before its
        verify batch. Needs a unified cache (``kv_unified=True``): there the cells only gain ids, while with a
        stream per sequence llama.cpp would copy the whole prefix into each sequence's stream. Refused
        (:class:`~specviz.errors.SequenceError`, nothing changed): ``n`` outside ``1 … n_seq_max``, or a split
        cache for ``n > 1``. ``n = 1`` does nothing."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 1 <= n <= self.n_seq_max:
            raise SequenceError(f"share_prefix needs 1..{self.n_seq_max} sequences (n_seq_max), got {n!r}")
        if n > 1 and not self.kv_unified:
            raise SequenceError(
                f"sharing sequence 0's prefix with {n - 1} more sequences needs a unified cache: this context gives "
                "each sequence its own stream, where llama.cpp would copy the whole prefix into each; open it with "
                "kv_unified=True"
            )
        lib = llama_lib()
        for s in range(1, int(n)):
            lib.llama_memory_seq_rm(self._mem, s, -1, -1)
            lib.llama_memory_seq_cp(self._mem, 0, s, -1, -1)

    def eval_tree(self, rows: Iterable[object], keep: str | Sequence[int] = "all") -> TreeBatch:
        """Evaluate a draft tree's verify batch in one decode: row ``i`` is ``(token, position, seqs)`` (a tuple or
        an object with those fields, such as a draft tree's ``TreeRow``) and belongs to every sequence in
        ``seqs``, the branches through its node; ``keep`` picks the rows whose logits are kept (``"all"``,
        ``"last"``, ``"none"`` or row indexes), which :meth:`row` reads by batch index until the next decode.

        A row sees the cells of its sequences only, so each node is computed after its own ancestors and none
        of its siblings (the batch's tree attention mask, with no new kernel). Refused before llama.cpp sees it
        (:class:`~specviz.errors.SequenceError`, nothing changed; :func:`~specviz.backends.sequences.plan_tree`
        lists the checks): ids outside ``0 … n_seq_max - 1``, a sequence's rows not continuing its cache at
        consecutive positions in batch order, more rows than ``n_batch``, a row in several sequences in a split
        cache. A decode llama.cpp refuses raises :class:`~specviz.errors.ContextError` and leaves every sequence
        as it was (the cells of micro-batches it completed are removed again)."""
        plan = plan_tree(
            rows,
            keep,
            n_seq_max=self.n_seq_max,
            n_ctx_seq=self.n_ctx_seq,
            n_batch=self.capacity.n_batch,
            n_vocab=self._n_vocab,
            unified=self.kv_unified or self.n_seq_max == 1,
            seq_len=self.seq_len,
            seq_pos_min=self._seq_pos_min,
        )
        batch = self._multi_batch()
        batch.fill_tree(plan, self._keeps_a_row)
        if self.before_eval is not None:
            self.before_eval()
        self.eval_count += 1
        # sequence 0's part, for the memory's rules (ContextMemory reads the last batch of sequence 0)
        at = plan.sequences.index(0) if 0 in plan.sequences else None
        self.last_batch = (plan.starts[at], plan.ends[at] - plan.starts[at]) if at is not None else (0, 0)
        self._sequences = None
        self._out_rows = []
        rc = self._decode(llama_lib().llama_decode, self._ctx, batch.batch)
        if rc != 0:
            for s, start in zip(plan.sequences, plan.starts):  # llama.cpp removes only its failed micro-batch
                llama_lib().llama_memory_seq_rm(self._mem, s, start, -1)
            raise ContextError(
                f"llama_decode failed with code {rc} for a tree of {len(plan.tokens)} rows in sequences "
                f"{list(plan.sequences)}" + (" (no free KV slot: the context is full)" if rc == 1 else "")
            )
        self._out_rows = list(plan.kept)
        return TreeBatch(len(plan.tokens), plan.kept, plan.sequences, plan.starts, plan.ends, self.eval_count)

    def keep_branch(self, seq: int, n_keep: int) -> Cut:
        """After a tree's verify: keep sequence ``seq``'s first ``n_keep`` positions as sequence 0 and drop every
        other cell, so the cache holds positions ``0 … n_keep - 1`` in sequence 0 alone, exactly as a chain's
        round leaves it (``seq``'s tail removed, every other sequence cleared, ``seq``'s cells moved to 0).
        Returns a :class:`~specviz.backends.memory.Cut` from ``seq``'s length to the kept one: path ``branch``
        where cells moved, ``truncate`` when ``seq`` is 0. Refused (:class:`~specviz.errors.SequenceError`,
        nothing changed): a bad ``seq`` or ``n_keep``, memory that cannot hold a tree
        (:func:`~specviz.backends.memory.tree_refusal`)."""
        self._check_seq(seq)
        kind = self.memory.info.kind
        why = tree_refusal(kind)
        if why is not None:
            raise SequenceError(f"no tree branch can be kept: {why}", kind=kind)
        if not isinstance(n_keep, (int, np.integer)) or isinstance(n_keep, bool) or n_keep < 0:
            raise SequenceError(f"n_keep must be an integer >= 0, got {n_keep!r}")
        t0 = time.perf_counter()
        lib, mem = llama_lib(), self._mem
        held = self.seq_len(seq)
        if n_keep < held:
            lib.llama_memory_seq_rm(mem, seq, int(n_keep), -1)
        self._drop_all_but(seq)
        if seq != 0:
            lib.llama_memory_seq_cp(mem, seq, 0, -1, -1)  # the whole range: a split cache copies whole streams
            lib.llama_memory_seq_rm(mem, seq, -1, -1)
            self.memory.forget()
        else:
            self.memory.forget(above=int(n_keep))
        return Cut("truncate" if seq == 0 else "branch", held, min(int(n_keep), held), time.perf_counter() - t0)

    def _drop_all_but(self, seq: int) -> None:
        """Remove every cell of every sequence but ``seq``: one ``seq_keep`` in a unified cache (it drops the
        other ids from shared cells too), each other sequence's stream cleared in a split one (where
        ``seq_keep`` reaches ``seq``'s stream only)."""
        lib = llama_lib()
        if self.kv_unified or self.n_seq_max == 1:
            lib.llama_memory_seq_keep(self._mem, seq)
            return
        for s in range(self.n_seq_max):
            if s != seq:
                lib.llama_memory_seq_rm(self._mem, s, -1, -1)

    def _multi_batch(self) -> MultiSequenceBatch:
        """The batch of :meth:`eval_sequences` and :meth:`eval_tree`, made at its first use."""
        if self._seq_batch is None:
            self._seq_batch = MultiSequenceBatch(llama_lib(), self.capacity.n_batch, self.n_seq_max)
        return self._seq_batch

    def clear_sequence(self, seq: int) -> None:
        """Drop every position of sequence ``seq`` (a finished request's slot, free for the next), on every
        memory kind; the other sequences keep theirs."""
        self._check_seq(seq)
        if not llama_lib().llama_memory_seq_rm(self._mem, seq, -1, -1):
            raise ContextError(f"llama.cpp refused to clear sequence {seq}")
        if seq == 0:
            self.memory.forget()

    def copy_sequence(self, src: int, dst: int) -> None:
        """Give sequence ``dst`` every cell of sequence ``src`` (``dst`` cleared first): a draft tree's new branch
        continues from its parent's cache. In a unified cache the cells gain an id and nothing is copied; with a
        stream per sequence llama.cpp copies them. Memory that cannot cut one sequence alone is refused
        (:class:`~specviz.errors.SequenceError`), as are bad ids; nothing changes then."""
        self._check_seq(src)
        self._check_seq(dst)
        kind = self.memory.info.kind
        why = sequence_cut_refusal(kind)
        if why is not None:
            raise SequenceError(f"sequence {src} cannot be copied to {dst}: {why}", kind=kind)
        if src == dst:
            return
        lib = llama_lib()
        lib.llama_memory_seq_rm(self._mem, dst, -1, -1)
        lib.llama_memory_seq_cp(self._mem, src, dst, -1, -1)

    def _free_batch(self) -> None:
        llama_lib().llama_batch_free(self._batch)
