"""What a verify batch of several sequences costs: busy sequences × rows each, measured on one context
(:func:`measure_batch_cost`), and where extra rows stop being nearly free (:class:`BatchCostTable`).

A busy llama-server verifies every slot's pending token and draft in one decode. Speculation pays while a
draft's rows cost little next to a one-row decode; as sequences × rows grow the decode stops being bound by
reading the weights and every row costs its share. The table holds the seconds of one decode of ``s``
sequences each adding ``d + 1`` rows (its pending token and a draft of ``d``), each sequence at its own
position after a prompt of its own, every row's logits kept, as a verify asks.

Timing follows :meth:`~specviz.decoding.verify_cost.VerifyCostModel.measure`: one warm-up, then every cell
timed ``repeats`` times in interleaved passes (so a burst of outside load spreads over all cells instead of
spoiling one), keeping the **fastest**: the least disturbed on a shared machine. The median of the same
samples is kept beside it, to show how noisy the run was.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from ..errors import ContextError, KnobError, SequenceError
from .verify_cost import ADVISOR_REPEATS, VerifyCostModel

#: Busy sequences per decode measured by default (issue 54: a server's slots, 1 to 8).
SEQUENCES = (1, 2, 4, 8)
#: Draft lengths measured by default: 1, 3, 5, 9 and 17 rows per sequence.
DRAFT_LENGTHS = (0, 2, 4, 8, 16)
#: Rows are *nearly free* while a batch's rows beyond a one-row decode cost on average at most this much of a
#: one-row decode each. A drafted token pays for its row when its chance of being accepted exceeds the
#: row's cost in one-row decodes (the expected tokens it adds against the time it adds); at a tenth, any
#: draft position accepted one time in ten or more pays, so the draft length is set by acceptance, not by
#: the hardware.
NEARLY_FREE = 0.1
#: Tokens of sequence 0's prompt; sequence ``q``'s has ``q`` more and starts ``q`` tokens later in the text,
#: so each sequence is at its own position with a prompt of its own.
PROMPT_TOKENS = 24


class BatchCostContext(Protocol):
    """What :func:`measure_batch_cost` uses of a context (a :class:`~specviz.backends.llama.LlamaContext`
    opened with ``n_seq_max``)."""

    capacity: Any  # n_batch
    n_seq_max: int
    n_ctx_seq: int

    def eval_sequences(self, parts: Any) -> Any: ...

    def eval_sequence_prompt(self, seq: int, tokens: Sequence[int], start: int = 0) -> None: ...

    def cut_sequence(self, seq: int, n_keep: int) -> Any: ...

    def clear_sequence(self, seq: int) -> None: ...


@dataclass(frozen=True)
class BatchCostTable:
    """Seconds of one verify decode of ``s`` sequences × ``d + 1`` rows each (``s`` in :attr:`sequences`,
    ``d`` in :attr:`draft_lengths`): :attr:`fastest` (the figure every derived one uses) and :attr:`median`,
    both indexed ``[sequence count][draft length]`` in the order of those tuples, over :attr:`repeats` timings.
    The grids always hold one sequence and draft length 0: the one-row decode every figure is relative to.
    """

    sequences: tuple[int, ...]
    draft_lengths: tuple[int, ...]
    fastest: tuple[tuple[float, ...], ...]
    median: tuple[tuple[float, ...], ...]
    repeats: int

    def seconds(self, s: int, d: int) -> float:
        """The fastest seconds of ``s`` sequences with drafts of ``d``."""
        return self.fastest[self.sequences.index(s)][self.draft_lengths.index(d)]

    @property
    def one_row(self) -> float:
        """Seconds of a one-row decode (one sequence, no draft): plain decoding's step."""
        return self.seconds(1, 0)

    def per_row(self, s: int, d: int) -> float:
        """Seconds per row of that decode."""
        return self.seconds(s, d) / (s * (d + 1))

    def decodes(self, s: int, d: int) -> float:
        """That decode's cost in one-row decodes."""
        return self.seconds(s, d) / self.one_row

    def row_cost(self, s: int, d: int) -> float | None:
        """What each row beyond a one-row decode cost, in one-row decodes: ``(decodes − 1) / (rows − 1)``
        (None for the one-row decode itself)."""
        rows = s * (d + 1)
        return None if rows == 1 else (self.decodes(s, d) - 1.0) / (rows - 1)

    def marginal_row_cost(self, s: int) -> float | None:
        """What one more draft row per sequence costs at ``s`` busy sequences, in one-row decodes: the rise
        from no draft to the longest, per added row (None with a single draft length)."""
        d = self.draft_lengths[-1]
        if d == 0:
            return None
        return (self.seconds(s, d) - self.seconds(s, 0)) / (s * d) / self.one_row

    def free_batch(self, threshold: float = NEARLY_FREE) -> int:
        """The largest total batch (sequences × rows each) measured whose rows beyond a one-row decode cost on
        average at most ``threshold`` of one each (:meth:`row_cost`): up to there extra rows are nearly free.
        1 when no larger batch is."""
        best = 1
        for s in self.sequences:
            for d in self.draft_lengths:
                cost = self.row_cost(s, d)
                if cost is not None and cost <= threshold:
                    best = max(best, s * (d + 1))
        return best

    def to_dict(self) -> dict:
        """Plain form: the measured grids, the derived figures per cell and per sequence count, the free batch
        and the threshold it was judged at."""
        cells = [
            {
                "sequences": s,
                "draft": d,
                "rows": s * (d + 1),
                "seconds": self.seconds(s, d),
                "median_seconds": self.median[i][j],
                "seconds_per_row": self.per_row(s, d),
                "decodes": self.decodes(s, d),
                "row_cost": self.row_cost(s, d),
            }
            for i, s in enumerate(self.sequences)
            for j, d in enumerate(self.draft_lengths)
        ]
        return {
            "sequences": list(self.sequences),
            "draft_lengths": list(self.draft_lengths),
            "repeats": self.repeats,
            "timing": "fastest of the repeats, interleaved (median beside it)",
            "one_row_seconds": self.one_row,
            "cells": cells,
            "marginal_row_cost": {str(s): self.marginal_row_cost(s) for s in self.sequences},
            "nearly_free_threshold": NEARLY_FREE,
            "free_batch": self.free_batch(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> BatchCostTable:
        """The table :meth:`to_dict` wrote (``benchmarks/bench_batch_cost.py --json``); KeyError, TypeError or
        ValueError when ``d`` is not one (a cell missing, a grid without one sequence or draft length 0)."""
        seqs = tuple(int(s) for s in d["sequences"])
        drafts = tuple(int(x) for x in d["draft_lengths"])
        if 1 not in seqs or 0 not in drafts:
            raise ValueError("a batch-cost table holds one sequence and draft length 0 (the one-row decode)")
        cells = {(int(c["sequences"]), int(c["draft"])): c for c in d["cells"]}
        fastest = tuple(tuple(float(cells[(s, x)]["seconds"]) for x in drafts) for s in seqs)
        median = tuple(tuple(float(cells[(s, x)]["median_seconds"]) for x in drafts) for s in seqs)
        return cls(seqs, drafts, fastest, median, int(d["repeats"]))

    def text(self) -> str:
        """The table for people, in three blocks by sequence count and draft length: ms per decode, ms per row,
        and the decode's cost in one-row decodes with the marginal row cost; then where extra rows stop being
        nearly free."""
        drafts = self.draft_lengths
        head = "".join(f"{f'd={d}':>9}" for d in drafts)
        blocks = (
            ("ms per decode", lambda s, d: f"{self.seconds(s, d) * 1e3:>9.2f}", ""),
            ("ms per row", lambda s, d: f"{self.per_row(s, d) * 1e3:>9.3f}", ""),
            ("cost in one-row decodes", lambda s, d: f"{self.decodes(s, d):>9.2f}", "marginal row"),
        )
        out = [f"rows per sequence: the pending token and a draft of d ({', '.join(str(d + 1) for d in drafts)})"]
        for title, cell, extra in blocks:
            out.append(f"{title}\n{'seqs':>4}{head}" + (f"{extra:>14}" if extra else ""))
            for s in self.sequences:
                m = self.marginal_row_cost(s) if extra else None
                tail = f"{m:>14.3f}" if m is not None else ""
                out.append(f"{s:>4}" + "".join(cell(s, d) for d in drafts) + tail)
        free = self.free_batch()
        out.append(
            f"one-row decode {self.one_row * 1e3:.2f} ms (fastest of {self.repeats}); marginal row: one more draft "
            "row per sequence, in one-row decodes"
        )
        out.append(
            f"extra rows nearly free (on average at most {NEARLY_FREE:g} of a one-row decode each) up to a total "
            "batch of " + (f"{free} rows" if free > 1 else "1 row: no extra row is nearly free here")
        )
        return "\n".join(out)


def decode_seconds(table: BatchCostTable, p: int, d: int) -> float:
    """Seconds of one decode of ``p`` sequences with drafts of ``d`` (a measured draft length): the table's, or
    a straight line between the measured sequence counts around ``p`` (beyond the last, its last segment's)."""
    seqs = table.sequences
    if p in seqs:
        return table.seconds(p, d)
    lo = max((s for s in seqs if s < p), default=seqs[0])
    hi = min((s for s in seqs if s > p), default=None)
    if hi is None:  # beyond the table: the last segment's slope
        if len(seqs) < 2:
            return table.seconds(seqs[-1], d) * p / seqs[-1]
        lo, hi = seqs[-2], seqs[-1]
    t_lo, t_hi = table.seconds(lo, d), table.seconds(hi, d)
    return t_lo + (p - lo) * (t_hi - t_lo) / (hi - lo)


def batch_round_cost(
    table: BatchCostTable, p: int, lane: float, base: VerifyCostModel | None = None
) -> VerifyCostModel:
    """One request's round at ``p`` busy sequences as a verify-cost curve: the decode of ``p`` sequences (every
    request drafting alike) and the other ``p - 1`` requests' own work, ``lane`` seconds each (drafting, reading
    rows: done one after another in a step). What the advice under load scores and a batched run's cost policy
    prices.

    Without ``base``: a point at ``d + 1`` rows for each measured draft length ``d``. With ``base``, one
    sequence's verify cost measured at every batch size (:func:`~specviz.decoding.verify_cost.measure_verify_cost`):
    its points, each scaled by how much ``p`` sequences cost over one at that many rows (the table's ratio,
    a straight line between its draft lengths). The table's draft lengths give rows of 1, 3, 5, 9 and 17, sizes
    that llama.cpp's CPU kernels pay a one-row path for (a leftover row beyond a multiple of four), so the table
    alone overprices the sizes between them; the base curve keeps every size's own cost."""
    if base is None:
        sizes = [d + 1 for d in table.draft_lengths]
        return VerifyCostModel(sizes, [decode_seconds(table, p, d) + (p - 1) * lane for d in table.draft_lengths])
    drafts = table.draft_lengths
    ratios = [decode_seconds(table, p, d) / table.seconds(1, d) for d in drafts]

    def ratio(b: float) -> float:
        d = b - 1
        if d <= drafts[0]:
            return ratios[0]
        for (d0, r0), (d1, r1) in zip(zip(drafts, ratios), zip(drafts[1:], ratios[1:])):
            if d <= d1:
                return r0 + (d - d0) * (r1 - r0) / (d1 - d0)
        return ratios[-1]

    sizes = base.sizes.tolist()
    return VerifyCostModel(sizes, [base(int(b)) * ratio(b) + (p - 1) * lane for b in sizes])


def _grid(values: Sequence[int], name: str, least: int, must: int) -> tuple[int, ...]:
    """Distinct integers ``>= least``, ascending, with ``must`` among them (:class:`~specviz.errors.KnobError`)."""
    got = set()
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise KnobError(f"{name} must be integers >= {least}, got {list(values)}", knob=name, value=list(values))
        got.add(v)
    return tuple(sorted(got | {must}))


def _text(tokens: Sequence[int], start: int, n: int) -> list[int]:
    """``n`` tokens of ``tokens`` from ``start``, cycling round (a short text still gives every prompt)."""
    return [int(tokens[(start + i) % len(tokens)]) for i in range(n)]


def _check(ctx: BatchCostContext, tokens: Sequence[int], seqs: tuple[int, ...], drafts: tuple[int, ...]) -> None:
    """Refuse, before the context changes, a grid the context cannot hold."""
    if not tokens:
        raise KnobError("the batch cost needs a text's tokens to cut prompts and drafts from; none were given")
    if seqs[-1] > ctx.n_seq_max:
        raise SequenceError(
            f"measuring {seqs[-1]} sequences needs a context opened with n_seq_max >= {seqs[-1]}, "
            f"this one has {ctx.n_seq_max}"
        )
    widest = seqs[-1] * (drafts[-1] + 1)
    if widest > ctx.capacity.n_batch:
        raise ContextError(f"a batch of {widest} rows exceeds n_batch={ctx.capacity.n_batch}; open it larger")
    longest = PROMPT_TOKENS + seqs[-1] - 1 + drafts[-1] + 1  # the last sequence's prompt and its widest draft
    if longest > ctx.n_ctx_seq:
        raise ContextError(f"{longest} positions per sequence are needed, the context gives {ctx.n_ctx_seq}")


def measure_batch_cost(
    ctx: BatchCostContext,
    tokens: Sequence[int],
    *,
    sequences: Sequence[int] = SEQUENCES,
    draft_lengths: Sequence[int] = DRAFT_LENGTHS,
    repeats: int = ADVISOR_REPEATS,
) -> BatchCostTable:
    """Time one verify decode of every ``sequences`` × ``draft_lengths`` cell on ``ctx`` (opened with
    ``n_seq_max >= max(sequences)``, ``n_batch`` for the widest batch), each timed ``repeats`` times in
    interleaved passes (the module docstring says how, and why the fastest is kept).

    Sequence ``q`` gets a prompt of its own cut from ``tokens`` (:data:`PROMPT_TOKENS` + ``q`` tokens from
    offset ``q``) and drafts of the tokens after it; after every timed decode each sequence is cut back to
    its prompt. Sequences ``0 … max(sequences) − 1`` are cleared before and after. A grid the context
    cannot hold is refused before anything changes (:class:`~specviz.errors.SequenceError`,
    :class:`~specviz.errors.ContextError`, :class:`~specviz.errors.KnobError`)."""
    seqs = _grid(sequences, "sequences", 1, 1)
    drafts = _grid(draft_lengths, "draft_lengths", 0, 0)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise KnobError(f"repeats must be an integer >= 1, got {repeats!r}", knob="repeats", value=repeats)
    _check(ctx, tokens, seqs, drafts)
    prompts = [_text(tokens, q, PROMPT_TOKENS + q) for q in range(seqs[-1])]
    for q, p in enumerate(prompts):
        ctx.clear_sequence(q)
        ctx.eval_sequence_prompt(q, p)

    def decode(s: int, d: int) -> float:
        parts = [(q, _text(tokens, q + len(prompts[q]), d + 1), len(prompts[q]), "all") for q in range(s)]
        t0 = time.perf_counter()
        ctx.eval_sequences(parts)
        took = time.perf_counter() - t0
        for q in range(s):
            ctx.cut_sequence(q, len(prompts[q]))
        return took

    cells = [(s, d) for s in seqs for d in drafts]
    samples: dict[tuple[int, int], list[float]] = {c: [] for c in cells}
    try:
        decode(1, 0)  # warm up
        for _ in range(repeats):
            for c in cells:
                samples[c].append(decode(*c))
    finally:
        for q in range(seqs[-1]):
            ctx.clear_sequence(q)

    def grid(pick: Any) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(float(pick(samples[(s, d)])) for d in drafts) for s in seqs)

    return BatchCostTable(seqs, drafts, grid(min), grid(statistics.median), repeats)
