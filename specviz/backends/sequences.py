"""Several sequences in one llama.cpp batch: what each sequence asks of a decode, the checks before llama.cpp
sees it, the batch itself, and where each sequence's rows landed.

As llama-server's slots share one ``llama_decode`` (tools/server/server-context.cpp), a
:class:`~specviz.backends.llama.LlamaContext` opened for ``n_seq_max`` sequences evaluates one batch holding
several sequences' tokens, each at its own positions (:meth:`~specviz.backends.llama.LlamaContext.eval_sequences`).
Each sequence says what it adds as a :class:`SequenceTokens`; the decode answers with a
:class:`SequenceBatch`, which says for each sequence where its tokens went (:class:`SequenceSpan`) and which
batch row holds the logits of its token ``i``.

A draft tree's verify batch is the other shape (:meth:`~specviz.backends.llama.LlamaContext.eval_tree`): one
row may belong to several sequences, the branches through its node. :func:`plan_tree` checks such rows and lays
them out (:class:`TreePlan`), :meth:`MultiSequenceBatch.fill_tree` points each row at its own list of ids, and
the decode answers with a :class:`TreeBatch`.

Every check runs before anything is written (:func:`plan_batch`, :func:`plan_tree`): a refused batch raises
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


# -- a draft tree's verify batch: rows in several sequences at once ----------------------------------------


@dataclass(frozen=True)
class TreePlan:
    """A checked tree batch (:func:`plan_tree`) as the arrays a :class:`MultiSequenceBatch` takes: row ``i`` is
    ``tokens[i]`` at ``positions[i]`` in the ``counts[i]`` sequences ``ids[o : o + counts[i]]`` (``o`` the sum of
    the counts before it; each row's ids ascending); ``kept`` the rows whose logits are kept, ascending.
    ``sequences`` are the ids the batch touches (ascending), ``starts`` each one's length before the decode and
    ``ends`` after it."""

    tokens: np.ndarray
    positions: np.ndarray
    counts: np.ndarray
    ids: np.ndarray
    kept: tuple[int, ...]
    sequences: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]


@dataclass(frozen=True)
class TreeBatch:
    """What one tree decode (:meth:`~specviz.backends.llama.LlamaContext.eval_tree`) evaluated: ``n_tokens``
    rows, the logits of ``kept`` (batch indexes, ascending: ``row(i)`` reads them until the next decode);
    each of ``sequences`` grew from its ``starts`` entry to its ``ends`` entry. ``stamp`` is the context's
    decode count after it."""

    n_tokens: int
    kept: tuple[int, ...]
    sequences: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    stamp: int

    def end(self, seq: int) -> int:
        """Sequence ``seq``'s length after the decode (:class:`~specviz.errors.SequenceError` when the batch did
        not touch it)."""
        if seq not in self.sequences:
            raise SequenceError(f"sequence {seq} was not in this tree batch (it held {list(self.sequences)})")
        return self.ends[self.sequences.index(seq)]


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _tree_row(i: int, row: object, n_seq_max: int) -> tuple[int, int, tuple[int, ...]]:
    """Row ``i`` of a tree batch as ``(token, position, ids ascending)``, checked: an object with ``token``,
    ``position`` and ``seqs`` (a draft tree's ``TreeRow``) or a plain ``(token, position, seqs)`` tuple."""
    try:
        if hasattr(row, "seqs"):
            token, position, seqs = row.token, row.position, row.seqs  # type: ignore[attr-defined]
        else:
            token, position, seqs = row  # type: ignore[misc]
        ids = tuple(seqs)
    except (TypeError, ValueError, AttributeError):
        raise SequenceError(f"tree row {i} must be (token, position, seqs) or have those fields, got {row!r}") from None
    if not _is_int(token) or not _is_int(position):
        raise SequenceError(f"tree row {i}'s token and position must be integers, got {token!r} and {position!r}")
    if not ids:
        raise SequenceError(f"tree row {i} belongs to no sequence; give it at least one sequence id")
    for s in ids:
        if not _is_int(s) or not 0 <= s < n_seq_max:
            raise SequenceError(
                f"tree row {i}: sequence id {s!r} is outside this context's 0..{n_seq_max - 1} (n_seq_max)"
            )
    if len(set(ids)) != len(ids):
        raise SequenceError(f"tree row {i} names a sequence twice ({list(ids)}); give each id once")
    return int(token), int(position), tuple(sorted(int(s) for s in ids))


def _tree_kept(keep: Rows, n: int) -> tuple[int, ...]:
    """The rows ``keep`` keeps of a tree batch of ``n`` rows, checked."""
    if isinstance(keep, str):
        kept = {"all": tuple(range(n)), "last": (n - 1,), "none": ()}.get(keep)
        if kept is None:
            raise SequenceError(f"keep must be 'all', 'last', 'none' or row indexes, got {keep!r}")
        return kept
    try:
        idx = sorted({int(i) for i in keep})
    except (TypeError, ValueError):
        raise SequenceError(f"keep must be 'all', 'last', 'none' or row indexes, got {keep!r}") from None
    if idx and (idx[0] < 0 or idx[-1] >= n):
        raise SequenceError(f"kept row indexes must lie in 0..{n - 1} (the tree's rows), got {list(keep)}")
    return tuple(idx)


def _check_continues(
    flat: np.ndarray, flat_pos: np.ndarray, flat_row: np.ndarray, held: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Check that each sequence's rows, in batch order, sit at its length, its length + 1, …; return the
    sequences touched (ascending) and how many rows each gains. ``flat*``: one entry per (row, id) pair;
    ``held``: every sequence's length, by id."""
    order = np.lexsort((flat_row, flat))  # by sequence, then batch order
    seqs, pos, rows = flat[order], flat_pos[order], flat_row[order]
    touched, first, counts = np.unique(seqs, return_index=True, return_counts=True)
    rank = np.arange(len(seqs)) - np.repeat(first, counts)  # each entry's place among its sequence's rows
    want = held[seqs] + rank
    bad = np.flatnonzero(pos != want)
    if bad.size:
        j = int(bad[0])
        s, h = int(seqs[j]), int(held[seqs[j]])
        raise SequenceError(
            f"tree row {int(rows[j])} is at position {int(pos[j])} in sequence {s}, which holds {h} positions and "
            f"reaches it as its row {int(rank[j])} of this batch: a sequence's rows, in batch order, must sit at "
            f"{h}, {h + 1}, … (share the prefix first, and give parents before their children)"
        )
    return touched, counts


def _check_coupled(counts: np.ndarray, flat: np.ndarray, held: np.ndarray, pos_min: np.ndarray) -> None:
    """llama.cpp's rule for a row in several sequences (``llama_batch_allocr::init``): the sequences it couples
    hold the same positions before the decode."""
    first = np.repeat(flat[np.cumsum(counts) - counts], counts)  # each entry's row's first id
    bad = np.flatnonzero((held[flat] != held[first]) | (pos_min[flat] != pos_min[first]))
    if bad.size:
        a, b = int(first[bad[0]]), int(flat[bad[0]])
        raise SequenceError(
            f"sequences {a} and {b} share a tree row but hold different positions "
            f"({int(pos_min[a])}..{int(held[a]) - 1} and {int(pos_min[b])}..{int(held[b]) - 1}); "
            "share one prefix first (share_prefix)"
        )


def plan_tree(
    rows: Iterable[object],
    keep: Rows = "all",
    *,
    n_seq_max: int,
    n_ctx_seq: int,
    n_batch: int,
    n_vocab: int,
    unified: bool,
    seq_len: Callable[[int], int],
    seq_pos_min: Callable[[int], int],
) -> TreePlan:
    """Check a tree batch against its context and lay it out in the order given; raise
    :class:`~specviz.errors.SequenceError` naming what was wrong.

    ``rows``: ``(token, position, seqs)`` tuples or objects with those fields (a draft tree's ``TreeRow``s),
    row ``i`` of the batch each; ``keep``: ``"all"``, ``"last"``, ``"none"`` or row indexes. At least one row
    and at most ``n_batch``; tokens in the vocabulary; every row in at least one sequence, ids in
    ``[0, n_seq_max)``, none twice. Each sequence's rows, in batch order, continue its cache
    (``seq_len(seq)``, ``+ 1``, …: llama.cpp's rule) and stay within its share of the context (``n_ctx_seq``).
    A row in several sequences couples them (llama.cpp gives its cell every id; a row sees the cells of its
    first id, so a branch's node sees its ancestors and no sibling): only in a ``unified`` cache (with a
    stream per sequence llama.cpp cannot split such a batch), and only between sequences that hold the same
    positions (``seq_pos_min`` / ``seq_len``), as llama.cpp requires."""
    parsed = [_tree_row(i, r, n_seq_max) for i, r in enumerate(rows)]
    n = len(parsed)
    if n == 0:
        raise SequenceError("a tree batch needs at least one row; none was given")
    if n > n_batch:
        raise SequenceError(f"a tree batch of {n} rows exceeds n_batch={n_batch}; verify fewer nodes")
    tokens = np.array([p[0] for p in parsed], dtype=np.int64)
    positions = np.array([p[1] for p in parsed], dtype=np.int64)
    counts = np.array([len(p[2]) for p in parsed], dtype=np.int64)
    flat = np.fromiter((s for p in parsed for s in p[2]), dtype=np.int64, count=int(counts.sum()))
    bad = np.flatnonzero((tokens < 0) | (tokens >= n_vocab))
    if bad.size:
        i = int(bad[0])
        raise SequenceError(f"tree row {i}'s token {int(tokens[i])} is outside the vocabulary 0..{n_vocab - 1}")
    if not unified and counts.max() > 1:
        i = int(np.flatnonzero(counts > 1)[0])
        raise SequenceError(
            f"tree row {i} belongs to sequences {list(parsed[i][2])}, but this context gives each sequence its own "
            "cache stream, where llama.cpp cannot decode a row shared by several; open it with kv_unified=True"
        )
    held = np.zeros(n_seq_max, dtype=np.int64)
    pos_min = np.full(n_seq_max, -1, dtype=np.int64)
    for s in np.unique(flat).tolist():
        held[s], pos_min[s] = seq_len(s), seq_pos_min(s)
    flat_row = np.repeat(np.arange(n), counts)
    touched, gained = _check_continues(flat, positions[flat_row], flat_row, held)
    ends = held[touched] + gained
    over = np.flatnonzero(ends > n_ctx_seq)
    if over.size:
        s = int(touched[over[0]])
        raise SequenceError(
            f"sequence {s}'s positions {int(held[s])}..{int(ends[over[0]]) - 1} exceed its share of the context "
            f"({n_ctx_seq} positions per sequence); open the context with a larger n_ctx"
        )
    if counts.max() > 1:
        _check_coupled(counts, flat, held, pos_min)
    return TreePlan(
        tokens=tokens.astype(np.int32),
        positions=positions.astype(np.int32),
        counts=counts.astype(np.int32),
        ids=flat.astype(np.int32),
        kept=_tree_kept(keep, n),
        sequences=tuple(int(s) for s in touched),
        starts=tuple(int(held[s]) for s in touched),
        ends=tuple(int(e) for e in ends),
    )


class MultiSequenceBatch:
    """A reusable llama.cpp batch of up to ``capacity`` tokens, each in one of ``n_seq_max`` sequences, over
    numpy buffers this object owns (llama.cpp's ``llama_batch_init`` gives each token its own sequence-id
    array, which Python would fill one token at a time; here every token points at one shared id array, so
    laying out a batch is a few numpy assignments; a tree's rows, each in several sequences, point into a
    buffer of ids laid out row after row: :meth:`fill_tree`). Never freed by llama.cpp: the buffers live as long as
    this object, which its context keeps."""

    def __init__(self, lc, capacity: int, n_seq_max: int) -> None:
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        self.ids = np.arange(n_seq_max, dtype=np.int32)  # sequence s's id lives at ids[s]
        self.id_address = self.ids.ctypes.data + self.ids.itemsize * np.arange(n_seq_max, dtype=np.uintp)
        self.seq_ptr = np.zeros(capacity, dtype=np.uintp)  # token i's llama_seq_id *: an address in ids
        self.tree_ids = np.zeros(capacity, dtype=np.int32)  # a tree batch's ids, row after row (fill_tree)
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
            self.n_seq_id[a:b] = 1  # a tree batch (fill_tree) may have left several ids here
            self.logits[a:b] = 0
            if span.kept:
                self.logits[a + np.asarray(span.kept)] = 1
            n_total = b
        if keep_a_row and not any(span.kept for _, span in plan):
            self.logits[n_total - 1] = 1  # computed for llama.cpp's sake, reported to nobody
        self.batch.n_tokens = n_total

    def fill_tree(self, plan: TreePlan, keep_a_row: bool) -> None:
        """Lay out ``plan`` (:func:`plan_tree`'s): row ``i`` belongs to ``plan.counts[i]`` sequences, whose ids
        this batch copies into a buffer of its own (each row's ``llama_seq_id *`` points at its slice), all in
        numpy assignments. ``keep_a_row`` as in :meth:`fill`."""
        n, total = len(plan.tokens), len(plan.ids)
        if self.tree_ids.size < total:  # grown, never shrunk; every pointer is set again below
            self.tree_ids = np.zeros(max(total, 2 * self.tree_ids.size), dtype=np.int32)
        self.tree_ids[:total] = plan.ids
        self.token[:n] = plan.tokens
        self.pos[:n] = plan.positions
        self.n_seq_id[:n] = plan.counts
        offsets = np.cumsum(plan.counts) - plan.counts  # where each row's ids start in tree_ids
        self.seq_ptr[:n] = self.tree_ids.ctypes.data + self.tree_ids.itemsize * offsets.astype(np.uintp)
        self.logits[:n] = 0
        if plan.kept:
            self.logits[np.asarray(plan.kept)] = 1
        elif keep_a_row:
            self.logits[n - 1] = 1  # computed for llama.cpp's sake, reported to nobody
        self.batch.n_tokens = n
