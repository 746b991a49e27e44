"""Several sequences in one llama.cpp batch: what each sequence asks of a decode, the checks before llama.cpp
sees it, the batch itself, and where each sequence's rows landed.

As llama-server's slots share one ``llama_decode`` (tools/server/server-context.cpp), a
:class:`~specviz.backends.llama.LlamaContext` opened for ``n_seq_max`` sequences evaluates one batch holding
several sequences' tokens, each at its own positions (:meth:`~specviz.backends.llama.LlamaContext.eval_sequences`).
Each sequence says what it adds as a :class:`SequenceTokens`; the decode answers with a
:class:`SequenceBatch`, which says for each sequence where its tokens went (:class:`SequenceSpan`) and which
batch row holds the logits of its token ``i``.

Every check runs before anything is written (:func:`plan_batch`): a refused batch raises
:class:`~specviz.errors.SequenceError` and changes nothing.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Sequence, Union

import numpy as np

from ..errors import SequenceError

#: Which of a sequence's tokens keep their logits: ``"all"``, ``"last"``, ``"none"`` or token indices (as
#: :meth:`~specviz.backends.llama.LlamaContext.eval`'s ``rows``).
Rows = Union[str, Sequence[int]]

#: llama.cpp's largest ``n_seq_max`` (``LLAMA_MAX_SEQ``, src/llama-cparams.h).
MAX_SEQUENCES = 256


class SequenceTokens(NamedTuple):
    """One sequence's part of a multi-sequence batch: ``tokens`` at positions ``start …`` of sequence ``seq``,
    keeping the logits of ``rows`` (indices into ``tokens``). A plain tuple ``(seq, tokens, start)`` or
    ``(seq, tokens, start, rows)`` is taken as one."""

    seq: int
    tokens: Sequence[int]
    start: int
    rows: Rows = "all"


@dataclass(frozen=True)
class SequenceSpan:
    """Where one sequence's tokens went in a batch: ``n`` tokens at positions ``start … start + n - 1``, the
    first at batch index ``first`` (its token ``i`` at ``first + i``); ``kept`` are the token indices whose
    logits were kept, ascending."""

    seq: int
    start: int
    n: int
    first: int
    kept: tuple[int, ...]

    @property
    def end(self) -> int:
        """The sequence's length after the decode (its next position)."""
        return self.start + self.n

    def batch_index(self, i: int) -> int:
        """The batch row holding the logits of this sequence's token ``i``
        (:class:`~specviz.errors.SequenceError` when that token's logits were not kept)."""
        if i not in self.kept:
            raise SequenceError(
                f"sequence {self.seq} kept no logits for its token {i} in this batch (kept: {list(self.kept)})"
            )
        return self.first + i

    def batch_rows(self) -> list[int]:
        """The batch rows of every kept token, in order (for code that reads rows by batch index)."""
        return [self.first + i for i in self.kept]


@dataclass(frozen=True)
class SequenceBatch:
    """Where each sequence's tokens of one multi-sequence decode landed (:class:`SequenceSpan` each, in batch
    order). ``stamp`` is the context's decode count after it: its rows are valid until the next decode."""

    spans: tuple[SequenceSpan, ...]
    stamp: int

    @property
    def sequences(self) -> tuple[int, ...]:
        """The sequence ids in the batch, in batch order."""
        return tuple(s.seq for s in self.spans)

    @property
    def n_tokens(self) -> int:
        """Tokens in the batch, every sequence's together."""
        return sum(s.n for s in self.spans)

    @property
    def n_rows(self) -> int:
        """Rows whose logits were kept, every sequence's together."""
        return sum(len(s.kept) for s in self.spans)

    def span(self, seq: int) -> SequenceSpan:
        """Sequence ``seq``'s span (:class:`~specviz.errors.SequenceError` when it was not in the batch)."""
        for s in self.spans:
            if s.seq == seq:
                return s
        raise SequenceError(f"sequence {seq} was not in this batch (it held {list(self.sequences)})")

    def index(self, seq: int, i: int) -> int:
        """The batch row holding the logits of sequence ``seq``'s token ``i``."""
        return self.span(seq).batch_index(i)


def _kept(rows: Rows, n: int, seq: int) -> tuple[int, ...]:
    """The token indices ``rows`` keeps of a part of ``n`` tokens, checked."""
    if isinstance(rows, str):
        kept = {"all": tuple(range(n)), "last": (n - 1,), "none": ()}.get(rows)
        if kept is None:
            raise SequenceError(f"sequence {seq}: rows must be 'all', 'last', 'none' or token indices, got {rows!r}")
        return kept
    idx = sorted({int(i) for i in rows})
    if idx and (idx[0] < 0 or idx[-1] >= n):
        raise SequenceError(f"sequence {seq}: row indices must lie in 0..{n - 1} (its tokens), got {list(rows)}")
    return tuple(idx)


def plan_batch(
    parts: Iterable[SequenceTokens | tuple],
    *,
    n_seq_max: int,
    n_ctx_seq: int,
    n_batch: int,
    seq_len: Callable[[int], int],
) -> list[tuple[SequenceTokens, SequenceSpan]]:
    """Check a multi-sequence batch against its context and lay it out, each sequence's tokens together, the
    sequences in ascending id order whatever the order given; raise :class:`~specviz.errors.SequenceError`
    naming what was wrong.

    Ascending, as llama-server's slots add their tokens: where each sequence has its own cache stream (a split
    cache, llama-server's ``-np`` without ``-kvu``), llama.cpp puts only sequences of consecutive ascending ids
    into one micro-batch (``llama_batch_allocr::split_equal``), so another order costs extra micro-batches.

    Sequence ids lie in ``[0, n_seq_max)``, each at most once; each sequence adds at least one token, starts
    where its cache ends (``seq_len(seq)``, as llama.cpp requires: positions stay consecutive) and stays
    within its share of the context (``n_ctx_seq`` positions); all tokens together fit ``n_batch``."""
    given = [SequenceTokens(*p) for p in parts]
    if not given:
        raise SequenceError("a multi-sequence batch needs at least one sequence; none was given")
    if len(given) > n_seq_max:
        raise SequenceError(
            f"{len(given)} sequences in one batch, but the context was opened for {n_seq_max} (n_seq_max); "
            f"open it with n_seq_max >= {len(given)}"
        )
    seen: set[int] = set()
    checked: list[tuple[SequenceTokens, tuple[int, ...]]] = []
    for p in given:
        seq, n, start = p.seq, len(p.tokens), p.start
        if not isinstance(seq, (int, np.integer)) or isinstance(seq, bool) or not 0 <= seq < n_seq_max:
            raise SequenceError(f"sequence id {seq!r} is outside this context's 0..{n_seq_max - 1} (n_seq_max)")
        if seq in seen:
            raise SequenceError(f"sequence {seq} appears twice in one batch; give each sequence's tokens once")
        seen.add(seq)
        if n == 0:
            raise SequenceError(f"sequence {seq} adds no tokens; leave it out of the batch")
        held = seq_len(seq)
        if start != held:
            raise SequenceError(
                f"sequence {seq}'s tokens start at position {start}, but its cache holds {held} positions; "
                f"start at {held} (cut the sequence first to go back)"
            )
        if start + n > n_ctx_seq:
            raise SequenceError(
                f"sequence {seq}'s positions {start}..{start + n - 1} exceed its share of the context "
                f"({n_ctx_seq} positions per sequence); open the context with a larger n_ctx or fewer sequences"
            )
        checked.append((p, _kept(p.rows, n, seq)))
    out: list[tuple[SequenceTokens, SequenceSpan]] = []
    first = 0
    for p, kept in sorted(checked, key=lambda pk: int(pk[0].seq)):
        out.append((p, SequenceSpan(int(p.seq), int(p.start), len(p.tokens), first, kept)))
        first += len(p.tokens)
    if first > n_batch:
        raise SequenceError(f"a batch of {first} tokens over {len(out)} sequences exceeds n_batch={n_batch}")
    return out


class MultiSequenceBatch:
    """A reusable llama.cpp batch of up to ``capacity`` tokens, each in one of ``n_seq_max`` sequences, over
    numpy buffers this object owns (llama.cpp's ``llama_batch_init`` gives each token its own sequence-id
    array, which Python would fill one token at a time; here every token points at one shared id array, so
    laying out a batch is a few numpy assignments). Never freed by llama.cpp: the buffers live as long as
    this object, which its context keeps."""

    def __init__(self, lc, capacity: int, n_seq_max: int) -> None:
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        self.ids = np.arange(n_seq_max, dtype=np.int32)  # sequence s's id lives at ids[s]
        self.id_address = self.ids.ctypes.data + self.ids.itemsize * np.arange(n_seq_max, dtype=np.uintp)
        self.seq_ptr = np.zeros(capacity, dtype=np.uintp)  # token i's llama_seq_id *: an address in ids
        b = lc.llama_batch()
        b.n_tokens = 0
        b.token = self.token.ctypes.data_as(ctypes.POINTER(lc.llama_token))
        b.pos = self.pos.ctypes.data_as(ctypes.POINTER(lc.llama_pos))
        b.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b.seq_id = ctypes.cast(self.seq_ptr.ctypes.data, ctypes.POINTER(ctypes.POINTER(lc.llama_seq_id)))
        b.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.batch = b

    def fill(self, plan: list[tuple[SequenceTokens, SequenceSpan]], keep_a_row: bool) -> None:
        """Lay out ``plan`` (:func:`plan_batch`'s). ``keep_a_row``: where no sequence keeps a row, the batch's
        last row is computed anyway (:func:`~specviz.backends.context_base.keeps_an_output_row`)."""
        n_total = 0
        for part, span in plan:
            a, b = span.first, span.end - span.start + span.first
            self.token[a:b] = part.tokens
            self.pos[a:b] = np.arange(span.start, span.end, dtype=np.int32)
            self.seq_ptr[a:b] = self.id_address[span.seq]
            self.logits[a:b] = 0
            if span.kept:
                self.logits[a + np.asarray(span.kept)] = 1
            n_total = b
        if keep_a_row and not any(span.kept for _, span in plan):
            self.logits[n_total - 1] = 1  # computed for llama.cpp's sake, reported to nobody
        self.batch.n_tokens = n_total
