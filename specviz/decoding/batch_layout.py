"""A verify batch priced as llama.cpp will lay it out, and one request's share of it.

llama.cpp computes a batch as one or more micro-batches, each a graph of its own over every weight. A unified cache
(llama-server's ``-kvu``) takes the whole batch in one (``llama_batch_allocr::split_simple``). A cache split over
the sequences (``-np`` alone) needs every micro-batch to hold the same number of tokens of each of its sequences,
whose ids run on without a gap (``split_equal``, sequential): from the first sequence with tokens left, the run of
consecutive ids that have tokens left, each giving as many as the shortest of them has left. So drafts of unequal
lengths, or an idle slot between busy ones, cost extra graphs: on this project's 2-core host eight one-row
sequences took 49 ms, one of them drafting 4 took 85 ms split and 61 ms unified, every second one drafting 4
took 197 ms split and 100 ms unified (``benchmarks/bench_batch_cost.py --shapes``).

:func:`micro_batches` follows that layout; :func:`layout_seconds` prices it from a
:class:`~specviz.decoding.batch_cost.BatchCostTable` (each micro-batch as the table's decode of that many
sequences with that many rows each, a straight line between measured cells; a unified batch as its sequences at
their mean rows, which the table's cells match within a few per cent for uneven drafts).

:func:`share_round_cost` turns that into what one request's cost policy weighs: its round at ``b`` rows priced as
the batch's seconds per expected token while it drafts nothing, plus what its ``b - 1`` draft rows add to the
batch as laid out. A draft then beats plain decoding exactly when the tokens it adds per second it adds beat the
batch's own rate, the condition under which it raises the batch's throughput. Where a draft evens the layout
out (a split cache whose other sequences all draft as long), the batch costs less than with this request plain,
and the draft's share is priced at next to nothing.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping, Sequence

from .batch_cost import BatchCostTable, decode_seconds
from .verify_cost import VerifyCostModel

__all__ = ["cell_seconds", "layout_seconds", "micro_batches", "share_round_cost"]

#: llama.cpp's default micro-batch (``n_ubatch``), the most tokens one graph takes.
N_UBATCH = 512
#: The least a round's share is priced at, as a part of the batch's seconds per token.
MIN_SHARE = 0.001


def micro_batches(rows: Sequence[int], unified: bool, n_ubatch: int = N_UBATCH) -> list[tuple[int, int]]:
    """The micro-batches of one decode as ``(sequences, tokens each)`` — for a unified cache ``(sequences, total
    tokens)`` chunks of at most ``n_ubatch`` tokens. ``rows``: the tokens each sequence adds, by sequence id from
    0 (0: the sequence is not in the batch, which breaks a split cache's run of ids)."""
    if unified:
        total, n = sum(rows), sum(1 for r in rows if r > 0)
        return [(n, min(n_ubatch, total - i)) for i in range(0, total, n_ubatch)]
    left = [max(0, int(r)) for r in rows]
    out: list[tuple[int, int]] = []
    while any(left):
        first = next(i for i, r in enumerate(left) if r > 0)
        end = first
        while end < len(left) and left[end] > 0:
            end += 1
        n = end - first
        each = min(min(left[first:end]), max(1, n_ubatch // n))
        for i in range(first, end):
            left[i] -= each
        out.append((n, each))
    return out


def cell_seconds(table: BatchCostTable, sequences: int, rows_each: float) -> float:
    """Seconds of one decode of ``sequences`` sequences adding ``rows_each`` rows each (a draft of
    ``rows_each - 1``): the table's cell, a straight line between its draft lengths (beyond the longest, its last
    segment's) and between its sequence counts (:func:`~specviz.decoding.batch_cost.decode_seconds`)."""
    drafts = table.draft_lengths
    d = max(0.0, rows_each - 1.0)
    if len(drafts) == 1:
        return decode_seconds(table, sequences, drafts[0]) * (d + 1) / (drafts[0] + 1)
    hi = next((i for i, x in enumerate(drafts) if x >= d), len(drafts) - 1)
    lo = max(hi - 1, 0)
    if lo == hi:
        hi = lo + 1
    t_lo, t_hi = decode_seconds(table, sequences, drafts[lo]), decode_seconds(table, sequences, drafts[hi])
    return t_lo + (d - drafts[lo]) * (t_hi - t_lo) / (drafts[hi] - drafts[lo])


def layout_seconds(table: BatchCostTable, rows: Sequence[int], unified: bool, n_ubatch: int = N_UBATCH) -> float:
    """Seconds of one decode whose sequences add ``rows`` (as :func:`micro_batches` takes them), laid out as
    llama.cpp lays it out: each split micro-batch priced as the table's decode of that shape; a unified one as its
    sequences at their mean rows. 0 for an empty batch."""
    return _layout_seconds(table, tuple(int(r) for r in rows), unified, n_ubatch)


@lru_cache(maxsize=4096)
def _layout_seconds(table: BatchCostTable, rows: tuple[int, ...], unified: bool, n_ubatch: int) -> float:
    """:func:`layout_seconds`, remembered: a batched run prices every request's every draft length each step, over
    the few shapes its slots take (a table is frozen, so it keys the cache)."""
    if unified:
        return sum(cell_seconds(table, n, total / n) for n, total in micro_batches(rows, True, n_ubatch) if n)
    return sum(cell_seconds(table, n, each) for n, each in micro_batches(rows, False, n_ubatch))


def share_round_cost(
    table: BatchCostTable,
    rows: Mapping[int, int],
    slot: int,
    others_expected: float,
    lane: float,
    *,
    unified: bool,
    largest: int,
    n_ubatch: int = N_UBATCH,
) -> VerifyCostModel:
    """Request ``slot``'s round as a verify-cost curve over ``1 … largest`` rows, priced within the batch (see the
    module docstring).

    ``rows``: the rows every other busy sequence adds this step, by sequence id (``slot``'s own entry ignored);
    ``others_expected``: the tokens they are expected to commit; ``lane``: each request's own seconds in a step
    besides the decode. With ``slot`` at one row the step takes ``T0 = layout + busy × lane`` seconds for
    ``1 + others_expected`` tokens; ``b`` rows cost ``T0 / (1 + others_expected)`` plus what the layout with ``slot``
    at ``b`` rows costs over the layout with it at one. Alone, that is the table's own curve plus the lane."""
    width = max([slot, *rows]) + 1
    shape = [0] * width
    for seq, r in rows.items():
        if seq != slot:
            shape[seq] = max(0, int(r))

    def at(b: int) -> float:
        shape[slot] = b
        return layout_seconds(table, shape, unified, n_ubatch)

    base = at(1)
    busy = sum(1 for r in shape if r > 0)
    per_token = (base + busy * lane) / (1.0 + max(0.0, others_expected))
    sizes = list(range(1, max(1, largest) + 1))
    # a draft that evens the layout out can make the batch cheaper than this request staying plain: it costs
    # next to nothing then (a positive floor, so that the cost policy's rates stay rates)
    floor = per_token * MIN_SHARE
    return VerifyCostModel(sizes, [max(per_token + at(b) - base, floor) for b in sizes])
