"""Every kind of llama.cpp context memory, and cutting it back the way llama.cpp's server does.

**Kinds** (:attr:`MemoryInfo.kind`), told apart by ``llama_model_is_recurrent`` / ``llama_model_is_hybrid``,
the model's sliding window and the context's ``swa_full``:

* ``attention`` — a KV cache of every position: any tail can be removed.
* ``sliding-window`` — sliding-window layers with a full-size cache (``swa_full = True``): as ``attention``.
* ``ring`` — sliding-window layers with llama.cpp's ring-sized cache (``swa_full = False``,
  ``GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256)`` cells, src/llama-kv-cache-iswa.cpp). A tail can be
  removed, but the ring overwrites keys that fell out of the window, so a cut is right only while the
  ring still holds every key the next forward needs: :func:`ring_draft_limit` (before a verify) and
  :func:`ring_covers` (rewinds).
* ``recurrent`` — one state per sequence (Mamba, RWKV): no part of it can be removed.
* ``hybrid`` — recurrent layers beside attention layers (LFM2, Granite hybrids, Jamba, Nemotron-H,
  Qwen3-Next / Qwen3.5).

**Removal** (:attr:`MemoryInfo.removal`, llama.cpp's ``common_context_seq_rm_type`` from
common/common.cpp ``common_context_can_seq_rm``, which this module's :func:`probe_memory` repeats):
``part`` (any tail), ``rs`` (a tail of up to ``n_rs_seq`` positions, from the recurrent-state snapshots
the context keeps: the ``n_rs_seq`` context parameter, honoured only by the architectures of
``llm_arch_supports_rs_rollback``), ``full`` (whole sequences only) or ``no`` (no memory to cut).

**Rollback**, as tools/server/server-context.cpp does it around ``use_ckpt_tgt``: before a verify whose
draft could need more removal than the memory allows (``full``: any draft; ``rs``: a draft longer than
``n_rs_seq``), :meth:`ContextMemory.checkpoint_for` saves a partial-state checkpoint
(``llama_state_seq_get_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: the recurrent state and
the sliding-window cells, not the full-attention cache); after a rejection :meth:`ContextMemory.cut`
restores it, removes the attention tail past it and re-applies the accepted tokens in one batch. Within
the bound, ``llama_memory_seq_rm`` rolls back through the snapshot index.

Departures from llama.cpp's server, on purpose:

* the server replays the accepted tokens as the next round's draft (``spec_is_replay``) and verifies them
  again; we re-apply them at once in a decode that keeps no logits, so a round's committed tokens are
  those of its verify and the next round starts as every round does;
* partial removal on ``rs`` memory is used only for positions inside the batch just decoded and only once
  per decode: llama.cpp's ``seq_rm`` accepts any rollback up to ``n_rs_seq``, but its snapshots hold only
  the states of the last micro-batch (measured on the tiny LFM2 fixture: a rollback of 3 after a
  one-token decode returns true and leaves a state whose next logits are off by 5.4);
* the server keeps one speculative checkpoint; we keep the verify checkpoints and the state after the
  prompt (:meth:`ContextMemory.remember`) within :data:`MARK_BUDGET_BYTES`, so a rewind restores the
  newest one at or before its position and re-applies the tokens after it.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from ..errors import ContextError, RingCoverageError
from .binding import llama_lib


class MemoryModel(Protocol):
    """What :func:`probe_memory` reads of a model (a :class:`~specviz.backends.llama.LlamaModel`)."""

    @property
    def ptr(self) -> Any: ...  # the llama_model *

    n_swa: int
    info: Any  # the GGUF check's facts (``architecture``)


class MemoryContext(Protocol):
    """What :class:`ContextMemory` uses of its context (a :class:`~specviz.backends.llama.LlamaContext`)."""

    @property
    def ptr(self) -> Any: ...  # the llama_context *

    capacity: Any  # n_ubatch
    eval_count: int
    last_batch: tuple[int, int]

    def kv_len(self) -> int: ...

    def eval_prompt(self, tokens: Sequence[int], start: int = 0) -> None: ...


__all__ = [
    "KINDS",
    "MARK_BUDGET_BYTES",
    "DEFAULT_N_RS_SEQ",
    "MemoryContext",
    "MemoryModel",
    "MemoryInfo",
    "Mark",
    "Cut",
    "ContextMemory",
    "probe_memory",
    "memory_kind",
    "SEQUENCE_CUT_KINDS",
    "sequence_cut_refusal",
    "tree_refusal",
    "ring_cells",
    "ring_draft_limit",
    "ring_covers",
    "rollback_refusal",
    "mib_text",
]

#: The memory kinds, in the order ``specviz info`` explains them.
KINDS = ("attention", "sliding-window", "ring", "recurrent", "hybrid")

#: The kinds whose cache holds several sequences and drops one sequence's tail alone
#: (``llama_memory_seq_rm`` of that sequence): a KV cache of every position, plain or full-size sliding
#: window. The others keep a state per sequence that only a per-sequence checkpoint rolls back, or a ring
#: whose coverage is tracked for one sequence (:func:`sequence_cut_refusal`).
SEQUENCE_CUT_KINDS = ("attention", "sliding-window")

#: Bytes of saved states one context keeps for rollbacks and rewinds (the newest state, the one after the
#: prompt and the verify checkpoint are kept even beyond it).
MARK_BUDGET_BYTES = 64 << 20

#: Recurrent-state snapshots per sequence asked of llama.cpp by default (``n_rs_seq``): the default
#: ``draft_max``, so default drafts roll back by partial removal where the architecture supports it.
DEFAULT_N_RS_SEQ = 16

#: Bytes llama.cpp's state writer spends per cell of a KV cache on its metadata for one sequence: the
#: position, the sequence count and the sequence id, 32-bit each (``llama_kv_cache::state_write_meta``) …
_CELL_META_BYTES = 12
#: … and the cell's extension where the model keeps one (M-RoPE's 2-D position, a PLE model's token id:
#: ``llama_kv_cache::has_cell_ext``): two positions and a token, 32-bit each.
_CELL_EXT_BYTES = 12
_EXT_ROPE_TYPES = (8, 40)  # LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_IMROPE
_EXT_ARCHS = ("qwen4exp",)  # architectures with PLE heads (hparams.ple_n_heads > 0)

_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


@dataclass(frozen=True)
class MemoryInfo:
    """What one context's memory is and what it costs.

    ``kind`` (one of :data:`KINDS`) and ``removal`` (``part``, ``rs``, ``full``, ``no``) as the module
    docstring explains; ``n_rs_seq`` the recurrent-state snapshots llama.cpp keeps (0 where the
    architecture has none); ``n_swa`` the model's window and ``swa_full`` whether its cache is full size.
    ``cells`` / ``swa_cells`` are the attention and sliding-window caches' cells. Bytes, measured from
    llama.cpp's own state serialisation when the context was created: ``kv_bytes`` the full-attention
    K and V, ``swa_kv_bytes`` the sliding-window layers' K and V, ``state_bytes`` one sequence's
    recurrent state as llama.cpp serialises it (a checkpoint of a recurrent model costs that much; a
    few dozen bytes of it are headers), ``recurrent_bytes`` the recurrent state with its ``n_rs_seq``
    snapshots (``(1 + n_rs_seq) × state_bytes``), ``weight_bytes`` the model's weights
    (``llama_model_size``).
    """

    kind: str
    removal: str
    n_rs_seq: int
    n_swa: int
    swa_full: bool
    cells: int
    swa_cells: int
    kv_bytes: int
    swa_kv_bytes: int
    state_bytes: int
    recurrent_bytes: int
    weight_bytes: int

    @property
    def can_roll_back(self) -> bool:
        """Whether a rejected draft can be dropped at all (by removal or through a checkpoint)."""
        return self.removal != "no"

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return dict(self.__dict__)

    def describe(self) -> str:
        """One line for people: the kind, how a rejected tail is dropped, and the cache sizes."""
        how = {
            "part": "any rejected tail is removed",
            "rs": f"tails of up to {self.n_rs_seq} positions are removed from llama.cpp's recurrent-state "
            "snapshots; longer drafts go through a partial-state checkpoint",
            "full": "no tail can be removed: every draft is verified after a partial-state checkpoint, "
            "restored after a rejection",
            "no": "nothing can be rolled back: only 'none' runs",
        }[self.removal]
        if self.kind == "ring":
            how += f"; the ring of {self.swa_cells} cells keeps the last keys only (window {self.n_swa})"
        sizes = [f"KV {mib_text(self.kv_bytes)}"] if self.cells else []
        if self.swa_cells:
            sizes.append(f"sliding-window KV {mib_text(self.swa_kv_bytes)} ({self.swa_cells} cells)")
        if self.state_bytes:
            snaps = f" with {self.n_rs_seq} snapshots" if self.n_rs_seq else ""
            sizes.append(f"recurrent state {mib_text(self.recurrent_bytes)}{snaps}")
        return f"{self.kind}: {how}; " + ", ".join(sizes + [f"weights {mib_text(self.weight_bytes)}"])


def mib_text(n: int) -> str:
    """A byte count for people: MiB with two decimals, or bytes below 0.01 MiB."""
    return f"{n / 1048576:.2f} MiB" if n >= 10486 else f"{n} B"


def ring_cells(n_ctx: int, n_swa: int, n_ubatch: int) -> int:
    """Cells of llama.cpp's ring-sized sliding-window cache for one sequence (src/llama-kv-cache-iswa.cpp:
    ``GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256)``)."""
    n = min(n_ctx, n_swa + n_ubatch)
    return (n + 255) // 256 * 256


def ring_draft_limit(n_past: int, n_ubatch: int, n_swa: int, draft: int) -> int:
    """The longest draft ``<= draft`` whose verify cannot cost the ring a key a rejection needs.

    The verify batch ``[pending] + draft`` starts at ``n_past`` and llama.cpp splits it into micro-batches
    of ``n_ubatch``. A micro-batch starting at position ``s`` may overwrite ring cells whose keys are out
    of the window of its first query (positions ``<= s - n_swa``, llama_kv_cache::find_slot's SWA rule).
    After a rejection of the whole draft the next forward's query sits at ``n_past + 1`` and needs keys
    from ``n_past + 2 - n_swa`` on. So a verify is safe when its last micro-batch starts at
    ``s <= n_past + 1`` — one micro-batch — or when ``s < n_swa`` (nothing is out of the window yet).
    """
    k = draft
    while k >= n_ubatch:
        s = n_past + (k // n_ubatch) * n_ubatch
        if s <= n_past + 1 or s < n_swa:
            break
        k = (k // n_ubatch) * n_ubatch - 1  # the longest draft with one micro-batch fewer
    return max(k, 0)


def ring_covers(pos_min: int, n_keep: int, n_swa: int) -> bool:
    """Whether a ring whose oldest held position is ``pos_min`` still holds every key the forward at
    position ``n_keep`` needs (positions ``n_keep - n_swa + 1 … n_keep - 1``: a query at ``p`` sees a key
    at ``p0`` while ``p - p0 < n_swa``). Positions between ``pos_min`` and the newest are all held
    (llama.cpp purges older cells when it overwrites one)."""
    return pos_min <= max(0, n_keep - n_swa + 1)


def rollback_refusal(info: MemoryInfo, what: str = "the target") -> str | None:
    """Why a drafting strategy cannot run on memory ``info`` (None when it can): llama.cpp offers no way
    to drop a rejected tail."""
    if info.can_roll_back:
        return None
    return (
        f"{what}'s memory ({info.kind}) cannot drop a rejected draft: llama.cpp can neither remove part of "
        "its sequence nor save a partial state of it; use --strategy none"
    )


def memory_kind(model: MemoryModel, swa_full: bool) -> str:
    """The kind (one of :data:`KINDS`) of the memory a context of ``model`` has, from the model's facts and
    the context's ``swa_full`` alone: known before the context is created."""
    lc = llama_lib()
    if lc.llama_model_is_recurrent(model.ptr):
        return "recurrent"
    if lc.llama_model_is_hybrid(model.ptr):
        return "hybrid"
    if int(model.n_swa) > 0:
        return "sliding-window" if swa_full else "ring"
    return "attention"


def sequence_cut_refusal(kind: str) -> str | None:
    """Why a context with memory ``kind`` cannot hold several sequences and cut one of them back alone (None
    when it can: :data:`SEQUENCE_CUT_KINDS`), with what to do instead."""
    if kind in SEQUENCE_CUT_KINDS:
        return None
    if kind == "ring":
        return (
            "the ring-sized sliding-window cache (swa_full=False) overwrites keys as each sequence moves on, and "
            "what it still holds is tracked for one sequence only; use the full-size cache (swa_full=True: "
            "leave out --swa-ring) for several sequences"
        )
    return (
        f"{kind} memory cannot remove one sequence's tail: a cut needs a partial-state checkpoint of that "
        "sequence, which specviz keeps for one sequence per context; run each sequence in a context of its "
        "own (n_seq_max=1)"
    )


def tree_refusal(kind: str) -> str | None:
    """Why a draft tree (more than one branch) cannot be verified in a target (or drafted in a draft model) whose
    memory is ``kind`` (None when it can: :data:`SEQUENCE_CUT_KINDS`), with what to do instead. A tree verifies
    each branch as a sequence of one context and keeps one branch afterwards, dropping the others' cells: the
    memory must hold several sequences and drop one of them alone."""
    if kind in SEQUENCE_CUT_KINDS:
        return None
    if kind == "ring":
        return (
            "a draft tree verifies its branches as sequences of one context, and the ring-sized sliding-window "
            "cache (swa_full=False) tracks what it holds for one sequence only; use the full-size cache "
            "(swa_full=True: leave out --swa-ring) or a chain (--tree-width 1)"
        )
    return (
        "a draft tree verifies its branches as sequences of one context and then drops every branch but the "
        f"accepted one, but {kind} memory keeps one state per sequence that llama.cpp cannot cut back by "
        "position; draft a chain (--tree-width 1)"
    )


def probe_memory(
    model: MemoryModel,
    ctx_ptr: Any,
    *,
    n_ctx: int,
    n_ubatch: int,
    swa_full: bool,
    scratch_ptr: Any = None,
    keep_row: bool = False,
) -> MemoryInfo:
    """The memory facts of a freshly created context (its cache is left empty).

    As llama.cpp's ``common_context_can_seq_rm``: a context with ``n_rs_seq`` snapshots removes tails
    within that bound; otherwise evaluate two tokens and try to remove the last one. The two one-token
    evaluations also give the bytes one cell costs in llama.cpp's state serialisation (the difference of
    the sizes at one and two positions, less the cell's metadata), for the whole memory and for its
    partial part (sliding-window cells and recurrent state).

    ``scratch_ptr``: a context of the same model and memory settings to evaluate in instead of
    ``ctx_ptr`` (whose cell count and ``n_rs_seq`` are still the ones reported). Deliberate departure
    from upstream, which probes the context itself: :class:`~specviz.backends.LlamaContext` passes a
    throwaway one, so that its own context computes nothing before its first batch. On llama.cpp's
    Vulkan backend a context whose scheduler is reserved again after it has computed a graph corrupts
    the heap at its next multi-token batch; ``llama_set_embeddings_layer_inp`` (the EAGLE-3 layer taps)
    forces such a reserve, and a probe in the context itself made every tap switched on after creation
    one.

    ``keep_row``: the one-token evaluations keep their row's logits
    (:func:`~specviz.backends.context_base.keeps_an_output_row`; a sequence's saved state holds no logits,
    so the sizes are the same).
    """
    lc = llama_lib()
    mptr = model.ptr
    run = ctx_ptr if scratch_ptr is None else scratch_ptr  # the context the probe evaluates in
    mem = lc.llama_get_memory(run)
    kind = memory_kind(model, swa_full)
    recurrent, hybrid = kind == "recurrent", kind == "hybrid"
    n_swa = int(model.n_swa)
    n_rs_seq = int(lc.llama_n_rs_seq(ctx_ptr))
    weights = int(lc.llama_model_size(mptr))
    if not mem:
        return MemoryInfo(kind, "no", 0, n_swa, swa_full, 0, 0, 0, 0, 0, 0, weights)

    def sizes() -> tuple[int, int]:
        return int(lc.llama_state_seq_get_size_ext(run, 0, 0)), int(lc.llama_state_seq_get_size_ext(run, 0, _PARTIAL))

    batch = lc.llama_batch_init(1, 0, 1)
    try:
        batch.n_tokens = 1
        batch.token[0] = 0
        batch.n_seq_id[0] = 1
        batch.seq_id[0][0] = 0
        batch.logits[0] = int(keep_row)
        lc.llama_memory_clear(mem, True)
        ok = True
        got: list[tuple[int, int]] = []
        for pos in (0, 1):
            batch.pos[0] = pos
            if lc.llama_decode(run, batch) != 0:
                ok = False
                break
            got.append(sizes())
        removable = ok and bool(lc.llama_memory_seq_rm(mem, 0, 1, -1))
    finally:
        lc.llama_batch_free(batch)
        lc.llama_memory_clear(mem, True)
        lc.llama_synchronize(run)
    if not ok:
        return MemoryInfo(kind, "no", 0, n_swa, swa_full, 0, 0, 0, 0, 0, 0, weights)
    if n_rs_seq > 0:
        removal = "rs"
    else:
        removal = "part" if removable else "full"
    (full1, part1), (full2, part2) = got
    d_full, d_part = full2 - full1, part2 - part1
    has_attn = not recurrent
    has_swa = n_swa > 0 and has_attn
    meta = _CELL_META_BYTES
    if int(lc.llama_model_rope_type(mptr)) in _EXT_ROPE_TYPES or model.info.architecture in _EXT_ARCHS:
        meta += _CELL_EXT_BYTES
    # the full state holds every KV cache's cells, each with its metadata; the partial state holds the
    # sliding-window cells and the recurrent state (a plain KV cache writes itself whole either way)
    swa_cell = max(d_part - meta, 0) if has_swa else 0
    base_cell = max(d_full - (d_part if has_swa or hybrid else 0) - meta, 0) if has_attn else 0
    cells = int(lc.llama_n_ctx(ctx_ptr)) if has_attn else 0
    swa_cells = (cells if swa_full else ring_cells(cells, n_swa, n_ubatch)) if has_swa else 0
    if recurrent:
        state = part1
    elif hybrid:
        state = part1 - d_part  # less the one sliding-window cell a hybrid with a window also writes
    else:
        state = 0
    if removal != "part" and part1 <= 0:
        removal = "no"  # neither removal nor a partial state: nothing can be rolled back
    return MemoryInfo(
        kind=kind,
        removal=removal,
        n_rs_seq=n_rs_seq,
        n_swa=n_swa,
        swa_full=swa_full,
        cells=cells,
        swa_cells=swa_cells,
        kv_bytes=base_cell * cells,
        swa_kv_bytes=swa_cell * swa_cells,
        state_bytes=state,
        recurrent_bytes=(1 + n_rs_seq) * state,
        weight_bytes=weights,
    )


@dataclass(frozen=True)
class Mark:
    """A saved partial state of a context holding ``n`` positions: ``nbytes`` long, ``seconds`` to take
    (0 when an earlier mark at the same length was reused: ``reused``); ``reason`` says why it was taken."""

    n: int
    data: bytes
    seconds: float
    reused: bool = False
    reason: str = ""

    @property
    def nbytes(self) -> int:
        """Size of the saved state in bytes."""
        return len(self.data)


@dataclass(frozen=True)
class Cut:
    """What cutting a cache back to ``to_pos`` positions (from ``from_pos``) did.

    ``path``: ``truncate`` (llama_memory_seq_rm of an attention tail), ``partial`` (seq_rm within the
    recurrent snapshots), ``checkpoint`` (the saved state at ``mark_pos`` restored, then ``reapplied``
    tokens evaluated again), ``reprefill`` (no saved state at or before ``to_pos``: the cache cleared
    and every kept token evaluated again) or ``branch`` (a draft tree's kept branch moved to sequence 0,
    every other branch's cells dropped: :meth:`~specviz.backends.llama.LlamaContext.keep_branch`). ``nbytes``
    is the restored state's size, ``seconds`` the time the cut took (restore and re-apply included).
    """

    path: str
    from_pos: int
    to_pos: int
    seconds: float
    mark_pos: int | None = None
    nbytes: int = 0
    reapplied: int = 0


class ContextMemory:
    """The memory of one :class:`~specviz.backends.llama.LlamaContext` (sequence 0): its facts
    (:attr:`info`), its saved states, and :meth:`cut`, which drops a tail on every kind of memory.

    The context calls :meth:`forget` when its cache is cleared or replaced.
    """

    def __init__(self, ctx: MemoryContext, info: MemoryInfo, *, budget: int = MARK_BUDGET_BYTES) -> None:
        self.ctx = ctx
        self.info = info
        self.budget = budget
        self.marks: list[Mark] = []  # sorted by n, one per n
        self._removed_at_eval = -1  # eval_count at the last partial removal (single use per decode)

    # -- facts -----------------------------------------------------------------------------------------
    @property
    def marks_bytes(self) -> int:
        """Bytes of the saved states held now."""
        return sum(m.nbytes for m in self.marks)

    def pos_min(self) -> int:
        """The oldest position the memory holds for sequence 0 (-1 when empty)."""
        return int(llama_lib().llama_memory_seq_pos_min(llama_lib().llama_get_memory(self.ctx.ptr), 0))

    def draft_limit(self, n_past: int, draft: int) -> int:
        """The longest draft ``<= draft`` this memory can verify at ``n_past`` and still roll back (the
        ring rule of :func:`ring_draft_limit`; any length on the other kinds)."""
        if self.info.kind != "ring":
            return draft
        return ring_draft_limit(n_past, self.ctx.capacity.n_ubatch, self.info.n_swa, draft)

    def covers(self, n_keep: int) -> bool:
        """Whether the cache can be cut to ``n_keep`` positions and the forward there still see its whole
        window (always, except on a ring that overwrote the keys: :func:`ring_covers`)."""
        if self.info.kind != "ring" or n_keep >= self.ctx.kv_len():
            return True
        return ring_covers(self.pos_min(), n_keep, self.info.n_swa)

    def needs_checkpoint(self, n_draft: int) -> bool:
        """Whether a verify of ``n_draft`` draft tokens may need a rollback llama.cpp cannot do by removal
        (as the server's ``use_ckpt_tgt``)."""
        r = self.info.removal
        if n_draft <= 0 or r == "part":
            return False
        return n_draft > self.info.n_rs_seq if r == "rs" else True

    # -- saved states ------------------------------------------------------------------------------------
    def checkpoint_for(self, n_draft: int) -> Mark | None:
        """Before a verify of ``n_draft`` draft tokens: the partial-state checkpoint it needs (taken now,
        or the state already saved at this length), or None when removal will do."""
        if not self.needs_checkpoint(n_draft):
            return None
        if self.info.removal == "rs":
            reason = f"a draft of {n_draft} exceeds the {self.info.n_rs_seq} recurrent-state snapshots"
        else:
            reason = f"{self.info.kind} memory: llama.cpp cannot remove part of the sequence"
        return self._save(reason)

    def checkpoint(self, reason: str) -> Mark:
        """Save the partial state at the current length now (or reuse one saved there); ``reason`` says why."""
        return self._save(reason)

    def remember(self) -> Mark | None:
        """After a prompt: keep the state at the current length, on memory that cannot drop a tail by
        removal (``rs``, ``full``), so a rewind never has to evaluate the prompt again; None elsewhere.
        (Rewinds restore the newest saved state at or before their position — this one or a verify's
        checkpoint — and re-apply the tokens after it.)"""
        if self.info.removal not in ("rs", "full"):
            return None
        return self._save("the state after the prompt (for rewinds)")

    def _save(self, reason: str) -> Mark:
        n = self.ctx.kv_len()
        for m in self.marks:
            if m.n == n:
                return Mark(m.n, m.data, 0.0, True, reason)
        lc = llama_lib()
        t0 = time.perf_counter()
        size = int(lc.llama_state_seq_get_size_ext(self.ctx.ptr, 0, _PARTIAL))
        buf = (ctypes.c_uint8 * max(size, 1))()
        got = int(lc.llama_state_seq_get_data_ext(self.ctx.ptr, buf, size, 0, _PARTIAL)) if size else 0
        if got <= 0:
            raise ContextError("llama.cpp could not save the partial state of the cache (a checkpoint)")
        mark = Mark(n, bytes(memoryview(buf)[:got]), time.perf_counter() - t0, False, reason)
        self.marks.append(mark)
        self.marks.sort(key=lambda m: m.n)
        self._evict(keep=mark)
        return mark

    def _evict(self, keep: Mark) -> None:
        """Drop the oldest saved states beyond the budget (never the first, the newest or ``keep``)."""
        while self.marks_bytes > self.budget and len(self.marks) > 2:
            victims = [m for m in self.marks[1:] if m is not keep and m is not self.marks[-1]]
            if not victims:
                break
            self.marks.remove(victims[0])

    def adopt(self, other: ContextMemory) -> None:
        """Take ``other``'s saved states (a context of the same model and sizes holding the same tokens: a
        fork). Saved states are immutable, so both may use them."""
        self.marks = list(other.marks)

    def forget(self, above: int = -1) -> None:
        """Drop the saved states of more than ``above`` positions (all of them by default): the cache no
        longer continues from them."""
        self.marks = [m for m in self.marks if m.n <= above]

    def _restore(self, mark: Mark) -> None:
        lc = llama_lib()
        buf = (ctypes.c_uint8 * mark.nbytes).from_buffer_copy(mark.data)
        if int(lc.llama_state_seq_set_data_ext(self.ctx.ptr, buf, mark.nbytes, 0, _PARTIAL)) == 0:
            raise ContextError(f"llama.cpp refused the checkpoint saved at position {mark.n}")

    # -- cutting -----------------------------------------------------------------------------------------
    def _removable(self, n_keep: int, kv: int) -> bool:
        """Whether ``llama_memory_seq_rm`` drops positions ``>= n_keep`` correctly right now."""
        r = self.info.removal
        if r == "part":
            return True
        if r != "rs" or self.ctx.eval_count == self._removed_at_eval:
            return False
        start, n = self.ctx.last_batch
        # the snapshots hold the states after each of the last batch's positions but its first
        return kv == start + n and start + 1 <= n_keep and kv - n_keep <= self.info.n_rs_seq

    def cut(self, n_keep: int, tokens: Sequence[int]) -> Cut:
        """Leave the cache holding exactly its first ``n_keep`` positions, which are ``tokens[:n_keep]``.

        Removal where llama.cpp can do it right (see :meth:`_removable`); otherwise the newest saved
        state at or before ``n_keep`` is restored and the tokens after it evaluated again (no saved
        state: the cache is cleared and all ``n_keep`` evaluated). A ring that no longer holds the keys
        the forward at ``n_keep`` needs raises :class:`~specviz.errors.RingCoverageError` before anything
        changes.
        """
        t0 = time.perf_counter()
        kv = self.ctx.kv_len()
        if n_keep >= kv:
            return Cut("none", kv, kv, 0.0)
        if not self.covers(n_keep):
            raise RingCoverageError(
                f"the sliding-window ring no longer holds the keys position {n_keep} needs (it holds "
                f"{self.pos_min()}..{kv - 1}, window {self.info.n_swa}); nothing changed. Use a full-size "
                "sliding-window cache (swa_full=True, --swa-full) to go back further"
            )
        lc = llama_lib()
        mem = lc.llama_get_memory(self.ctx.ptr)
        if self._removable(n_keep, kv):
            if not lc.llama_memory_seq_rm(mem, 0, n_keep, -1):
                raise ContextError(f"llama.cpp refused to remove the cache tail from position {n_keep}")
            if self.info.removal == "rs":
                self._removed_at_eval = self.ctx.eval_count
            self.forget(above=n_keep)
            path = "truncate" if self.info.removal == "part" else "partial"
            return Cut(path, kv, n_keep, time.perf_counter() - t0)
        if len(tokens) < n_keep:
            raise ContextError(f"cannot cut the cache to {n_keep} positions from {len(tokens)} known tokens")
        mark = next((m for m in reversed(self.marks) if m.n <= n_keep), None)
        if mark is not None:
            self._restore(mark)
            start = mark.n
            # the restored partial state ends at mark.n; the full-attention cells after it go
            if not lc.llama_memory_seq_rm(mem, 0, start, -1):
                raise ContextError(f"llama.cpp refused to remove the cache tail from position {start}")
        else:
            lc.llama_memory_clear(mem, True)
            start = 0
        self.forget(above=n_keep)
        if n_keep > start:
            self.ctx.eval_prompt([int(t) for t in tokens[start:n_keep]], start)
        if self.ctx.kv_len() != n_keep:
            raise ContextError(f"the cache holds {self.ctx.kv_len()} positions after a cut to {n_keep}")
        return Cut(
            "checkpoint" if mark is not None else "reprefill",
            kv,
            n_keep,
            time.perf_counter() - t0,
            mark_pos=mark.n if mark is not None else None,
            nbytes=mark.nbytes if mark is not None else 0,
            reapplied=n_keep - start,
        )
