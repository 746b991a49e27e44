"""What every llama.cpp context of specviz shares: its cache operations, its state, one rule for freeing it,
and one for the rows a batch computes (:func:`keeps_an_output_row`).

:class:`~specviz.backends.llama.LlamaContext` (the target's and a draft model's) and
:class:`~specviz.backends.tied_context.TiedContext` (the EAGLE-3 head's and the MTP layers') hold a
``llama_context *`` and a batch of their own kind. Both read the cache length, cut the cache, save and
restore the state, and free the context the same way: :meth:`ContextBase.close` (idempotent), also on
leaving a ``with`` block and when the object is collected.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import replace
from typing import Any, Callable

from ..errors import ContextError
from .binding import llama_lib
from .saved_state import StateLimits, check_saved_state


def keeps_an_output_row(model: Any) -> bool:
    """Whether every batch that a context of ``model`` decodes asks for at least one row's logits: where the
    model has layers on a GPU device (``n_gpu_layers > 0`` in a build with one).

    On llama.cpp's Vulkan backend (seen on lavapipe, flash attention on) a context that has decoded a batch
    with no output rows later segfaults inside the device's queue at a multi-token batch, or glibc aborts
    ("double free or corruption"): a new context (after the memory probe's batches without rows) given 9
    tokens without outputs and then 16 with all of them crashed within 3 to 15 such contexts in 6 runs of
    7; with a row kept in either batch without rows, or flash attention off, none did. llama.cpp's own
    tools never decode such a batch (``llama_batch_get_one`` keeps the last token's row). So on a GPU
    placement a batch that asks for no rows computes its last one, reported to nobody; that is one row of
    the output layer, nothing on a GPU. On the CPU backend such a batch stays as it is (the row costs
    milliseconds there). Deliberate departure from upstream's Python binding, which asks for none.
    """
    from .devices import gpu_devices

    return int(getattr(model, "n_gpu_layers", 0)) > 0 and bool(gpu_devices())


class ContextBase:
    """A llama.cpp context (sequence 0) and its batch: subclasses call :meth:`_adopt` once the context
    exists and say how their batch is freed (:meth:`_free_batch`).

    ``what`` names the context in error messages (``""`` for a plain model context).
    """

    what = ""
    _ctx: Any = None  # the llama_context *, None until adopted and after close
    _batch: Any = None
    decode_seconds: float = 0.0  # cumulative time of the decodes, the device's compute included (_decode)

    def _decode(self, queue: Callable[..., int], *args: Any) -> int:
        """Call ``queue(*args)`` (``llama_decode`` or ``llama_process`` on this context), wait until the
        device has finished it, add the time to ``decode_seconds`` and return llama.cpp's code. Every decode
        of a subclass goes through here.

        On a GPU backend ``llama_decode`` (and ``llama_process``) returns once the graph is queued, and the
        first read of a logits row waits for the device. Timed without the wait, a decode would be its
        queueing alone: ``decode_seconds`` and the cost policy's verify costs would make every batch size as
        cheap as the next, and the device's compute would count as specviz's first row read. llama.cpp
        counts the wait in the decode too (``llama_synchronize`` closes its decode timings). On the CPU
        backend the decode has finished when it returns, and the wait returns at once."""
        t0 = time.perf_counter()
        rc = queue(*args)
        if rc == 0:
            self._wait_for_device()
        self.decode_seconds += time.perf_counter() - t0
        return rc

    def _wait_for_device(self) -> None:
        """Wait until every batch queued on this context has finished on its device (:meth:`_decode` says
        why); for work timed apart from ``decode_seconds`` (a DFlash draft's feature injection)."""
        llama_lib().llama_synchronize(self._ctx)

    def _adopt(self, ctx: Any) -> None:
        """Take ownership of the llama.cpp context ``ctx`` (freed by :meth:`close`)."""
        self._ctx = ctx
        self._mem = llama_lib().llama_get_memory(ctx)

    def _free_batch(self) -> None:
        """Free this context's batch (each kind of batch has its own free function)."""
        raise NotImplementedError

    def _the(self, noun: str) -> str:
        """``the <what> <noun>`` for error messages."""
        return f"the {self.what} {noun}" if self.what else f"the {noun}"

    @property
    def closed(self) -> bool:
        """True once the context was freed (or never created)."""
        return self._ctx is None

    @property
    def ptr(self) -> Any:
        """The raw ``llama_context *``; :class:`~specviz.errors.ContextError` once closed."""
        if self._ctx is None:
            raise ContextError(f"{self._the('context')} was closed")
        return self._ctx

    # -- cache ---------------------------------------------------------------------------------------
    def kv_len(self) -> int:
        """Number of positions held for sequence 0 (largest position + 1)."""
        return int(llama_lib().llama_memory_seq_pos_max(self._mem, 0)) + 1

    def clear(self) -> None:
        """Empty the cache."""
        llama_lib().llama_memory_clear(self._mem, True)

    def truncate(self, n: int) -> None:
        """Remove every cached position ``>= n`` (the rejected tail)."""
        if not llama_lib().llama_memory_seq_rm(self._mem, 0, n, -1):
            raise ContextError(f"llama.cpp refused to remove {self._the('cache tail')} from position {n}")

    # -- state ---------------------------------------------------------------------------------------
    def state(self) -> bytes:
        """The context's full state (its cache included) as bytes."""
        lc = llama_lib()
        size = lc.llama_state_get_size(self._ctx)
        buf = (ctypes.c_uint8 * size)()
        n = lc.llama_state_get_data(self._ctx, buf, size)
        return bytes(buf[:n])

    def load_state(self, data: bytes, max_pos: int | None = None) -> None:
        """Restore a state produced by :meth:`state` on a context of the same model and capacity. The state
        is checked first (:func:`~specviz.backends.saved_state.check_saved_state`: positions below
        ``max_pos``, by default the context size, one cell per position, sequence ids and sizes), so a
        crafted one is refused with :class:`~specviz.errors.ContextError` before llama.cpp reads it."""
        lc = llama_lib()
        n_ctx, n_seq = int(lc.llama_n_ctx(self.ptr)), int(lc.llama_n_seq_max(self.ptr))
        limit = n_ctx if max_pos is None else min(max_pos, n_ctx)
        lim = StateLimits(n_stream=n_seq, n_seq_max=n_seq, max_cells=n_ctx, max_pos=limit)
        check_saved_state(data, replace(lim, recurrent_after=self._recurrent_after()), self._the("context"))
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if lc.llama_state_set_data(self._ctx, buf, len(data)) == 0:
            raise ContextError(
                f"llama.cpp refused the saved state of {self._the('context')} (a different model or capacity?)"
            )

    def _recurrent_after(self) -> int | None:
        """How the context's saved state is laid out, for the check: None (attention caches only), or the
        attention cache sections written before a recurrent part. A context that knows its memory says so."""
        return None

    # -- freeing -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the batch and the context (idempotent)."""
        if self._ctx is not None:
            if self._batch is not None:
                self._free_batch()
                self._batch = None
            llama_lib().llama_free(self._ctx)
            self._ctx = None

    def __enter__(self) -> ContextBase:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - finaliser
        try:
            self.close()
        except Exception:
            pass
