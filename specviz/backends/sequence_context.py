"""One sequence of a multi-sequence context, seen as a context of its own: what lets a
:class:`~specviz.decoding.session.Session` run one request of a batched run (:mod:`specviz.decoding.batch`)
unchanged, as one of llama-server's slots.

A :class:`SequenceContext` answers what the session, its rounds and its generation ask of a
:class:`~specviz.backends.llama.LlamaContext` — evaluate, read rows, the cache's length, cut a tail, clear —
for sequence ``seq`` of a shared context opened with ``n_seq_max`` sequences
(:meth:`~specviz.backends.llama.LlamaContext.eval_sequences`). Its capacity is the sequence's share of the
context (``n_ctx_seq`` positions, as llama-server splits ``-c`` over its slots). A batched run evaluates every
busy sequence's verify batch in one decode and hands each session the rows of its own sequence
(:meth:`rows_of`).

Only memory that cuts one sequence alone is shared this way (attention and full-size sliding-window caches;
the shared context refuses the others when it opens): a cut is a removal, never a checkpoint, so
:class:`SequenceMemory` holds no saved states. A sequence's cache cannot be saved or restored alone
(snapshots, forks): :meth:`SequenceContext.state` and :meth:`SequenceContext.load_state` refuse with
:class:`~specviz.errors.SequenceError`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import ContextError, SequenceError
from .binding import llama_lib
from .llama import Capacity, LlamaContext
from .memory import Cut, Mark, MemoryInfo
from .sequences import SequenceBatch, SequenceTokens


class SequenceMemory:
    """The memory of one sequence of a shared context (attention or full-size sliding window: a tail is always
    removable, so no checkpoint is ever needed and none is saved). The parts of
    :class:`~specviz.backends.memory.ContextMemory` a session uses, for sequence ``seq``."""

    def __init__(self, view: SequenceContext) -> None:
        self.view = view
        self.info: MemoryInfo = view.shared.memory.info
        self.marks: list[Mark] = []  # never any: every cut is a removal
        self.marks_bytes = 0

    def pos_min(self) -> int:
        """The oldest position the cache holds for this sequence (-1 when empty)."""
        lc = llama_lib()
        return int(lc.llama_memory_seq_pos_min(lc.llama_get_memory(self.view.shared.ptr), self.view.seq))

    def draft_limit(self, n_past: int, draft: int) -> int:
        """Any draft can be rolled back (a tail is always removable)."""
        return draft

    def covers(self, n_keep: int) -> bool:
        """Always: a full-size cache keeps every key."""
        return True

    def needs_checkpoint(self, n_draft: int) -> bool:
        """Never (removal does)."""
        return False

    def checkpoint_for(self, n_draft: int) -> Mark | None:
        """None: removal will do."""
        return None

    def remember(self) -> Mark | None:
        """None: nothing to keep for rewinds."""
        return None

    def forget(self, above: int = -1) -> None:
        """Nothing saved to forget."""

    def cut(self, n_keep: int, tokens: Sequence[int]) -> Cut:
        """Leave this sequence's cache holding its first ``n_keep`` positions (a removal of its tail)."""
        return self.view.shared.cut_sequence(self.view.seq, n_keep)


class SequenceContext:
    """Sequence ``seq`` of ``shared`` as a context of its own (see the module docstring)."""

    def __init__(self, shared: LlamaContext, seq: int) -> None:
        if not 0 <= seq < shared.n_seq_max:
            raise SequenceError(f"sequence {seq} is outside the shared context's 0..{shared.n_seq_max - 1}")
        self.shared = shared
        self.seq = seq
        self.model = shared.model
        self.settings = shared.settings
        self.n_threads = shared.n_threads
        cap = shared.capacity
        self.capacity = Capacity(shared.n_ctx_seq, cap.n_batch, cap.n_ubatch, cap.n_swa)
        self.memory = SequenceMemory(self)
        self._batch: SequenceBatch | None = None  # the last decode holding this sequence (its rows)
        self._prompt_row: np.ndarray | None = None  # a whole prompt's last row, kept past later decodes

    # -- what the session reads -------------------------------------------------------------------------
    @property
    def ptr(self) -> Any:
        """The shared context's pointer."""
        return self.shared.ptr

    def kv_len(self) -> int:
        """Positions this sequence's cache holds."""
        return self.shared.seq_len(self.seq)

    def native_rows(self) -> None:
        """None: this sequence's rows start inside a shared batch, so the acceptor reads them row by row."""
        return None

    # -- evaluating -------------------------------------------------------------------------------------
    def eval(self, tokens: Sequence[int] | np.ndarray, start: int, rows: str | Sequence[int] = "all") -> None:
        """Evaluate ``tokens`` of this sequence alone at ``start…`` (one decode of this sequence only)."""
        if len(tokens) == 0:
            return
        self._prompt_row = None
        self._batch = self.shared.eval_sequences([SequenceTokens(self.seq, list(tokens), start, rows)])

    def rows_of(self, batch: SequenceBatch) -> None:
        """Take this sequence's rows from ``batch``, a decode of several sequences that held this one."""
        batch.span(self.seq)  # refused (SequenceError) when this sequence was not in it
        self._batch, self._prompt_row = batch, None

    def eval_prompt(self, tokens: Sequence[int], start: int = 0, *, keep_last: bool = False) -> None:
        """Evaluate a prompt on this sequence in ``n_batch`` chunks, keeping no logits, or with ``keep_last``
        those of its last token, copied so that :meth:`last_row` reads them after other sequences' decodes."""
        self._prompt_row = None
        nb = self.capacity.n_batch
        for i in range(0, len(tokens), nb):
            last = keep_last and i + nb >= len(tokens)
            chunk = list(tokens[i : i + nb])
            self.eval(chunk, start + i, rows="last" if last else "none")
            if last:
                self._prompt_row = self.row(len(chunk) - 1).copy()

    def row(self, i: int) -> np.ndarray:
        """Logits of this sequence's token ``i`` in the last decode that held it (valid until the next decode)."""
        got = self._batch
        if got is None or got.stamp != self.shared.eval_count:
            raise ContextError(f"sequence {self.seq}'s rows are gone: another decode ran after the one that held it")
        return self.shared.row(got.index(self.seq, i))

    def last_row(self) -> np.ndarray:
        """The last kept row of the last decode that held this sequence, or the whole prompt's last row after
        :meth:`eval_prompt` with ``keep_last`` (kept until this sequence's next decode)."""
        if self._prompt_row is not None:
            return self._prompt_row
        got = self._batch
        if got is None:
            raise ContextError("the last batch kept no logits")
        kept = got.span(self.seq).kept
        if not kept:
            raise ContextError("the last batch kept no logits")
        return self.row(kept[-1])

    # -- the cache --------------------------------------------------------------------------------------
    def clear(self) -> None:
        """Drop every position of this sequence (the others keep theirs)."""
        self.shared.clear_sequence(self.seq)
        self._batch, self._prompt_row = None, None

    def state(self) -> bytes:
        """Refused: a sequence of a shared context cannot be saved alone."""
        raise SequenceError(
            f"sequence {self.seq} of a batched run cannot be saved alone (snapshots and forks need a session of "
            "its own): run the request alone to snapshot it"
        )

    def load_state(self, data: bytes, max_pos: int | None = None) -> None:
        """Refused: see :meth:`state`."""
        self.state()

    def close(self) -> None:
        """Nothing: the batched run owns and closes the shared context."""
