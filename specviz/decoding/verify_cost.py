"""The target's verify cost: seconds to verify a batch of b tokens, measured once per session for every
batch size a round can use, and refined by every real verify (:class:`VerifyCostModel`).

The cost policy (:class:`~specviz.decoding.cost_policy.CostPolicy`) weighs draft lengths with it; the advisor
(:mod:`specviz.analysis.advise`) reads a session's curve through ``Session.verify_cost``
(:func:`measure_for_advice`). Measuring only times batch sizes that verify-tile alignment leaves
(:mod:`specviz.decoding.tiling`), and leaves the cache as it was.
"""

from __future__ import annotations

import bisect
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import ContextError
from .tiling import tile_aligned, verify_tile

#: A verify cost's measured batch sizes and their seconds (:meth:`VerifyCostModel.points`).
CostPoints = tuple[tuple[int, ...], tuple[float, ...]]
#: Times each batch size is timed when measuring for the advisor (the fastest kept). The advice's speedups
#: rest on the curve's shape: with 2 (the cost policy's, which must be quick at a generation's start) the
#: ratio of a 16-token verify to a 1-token one spread 17% over five measurements of the embedded model
#: here, with 5 it spread 5%.
ADVISOR_REPEATS = 5


class VerifyCostModel:
    """Measured seconds to verify a batch of b tokens, b = 1…n, interpolated between measured sizes.

    The cost policy reads it every round (a curve of up to ``draft_max + 1`` sizes) and blends a real
    verify time into it every round, so both are plain-Python work on a table of every whole batch size
    up to the largest measured one (the measured sizes, and the interpolations between them), kept up to
    date by :meth:`update` (numpy's ``interp`` and ``searchsorted`` cost more per call than the whole
    lookup). :attr:`sizes` and :attr:`seconds` are the measured points, as arrays.
    """

    def __init__(self, sizes: Sequence[float], seconds: Sequence[float]) -> None:
        self._sizes = [float(b) for b in sizes]
        self._seconds = [float(t) for t in seconds]
        self._rebuild()

    @property
    def sizes(self) -> np.ndarray:
        """The measured batch sizes, ascending (a copy)."""
        return np.asarray(self._sizes, dtype=float)

    @property
    def seconds(self) -> np.ndarray:
        """The seconds of each measured size (a copy)."""
        return np.asarray(self._seconds, dtype=float)

    def _interp(self, b: float) -> float:
        """Between measured sizes: the straight line through the two around ``b`` (below the first: the
        first's seconds, as ``np.interp`` clamps)."""
        xs, ys = self._sizes, self._seconds
        if b <= xs[0]:
            return ys[0]
        j = bisect.bisect_right(xs, b) - 1
        if xs[j] == b or j == len(xs) - 1:
            return ys[j]
        return ys[j] + (b - xs[j]) * (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])

    def _rebuild(self) -> None:
        # every whole batch size up to the largest measured one: item b - 1
        self._table = [self._interp(b) for b in range(1, int(self._sizes[-1]) + 1)]
        self._at = {b: i for i, b in enumerate(self._sizes)}
        self._size_ints = tuple(int(b) for b in self._sizes)

    def __call__(self, b: int) -> float:
        """Estimated verify seconds for a batch of ``b`` tokens."""
        if isinstance(b, int) and 1 <= b <= len(self._table):
            return self._table[b - 1]
        if b <= self._sizes[-1]:
            return self._interp(b)
        return self._extend(b)

    def _extend(self, b: int) -> float:
        # beyond the last measurement: extend the last segment's slope (flat after a single measurement)
        s1, t1 = self._sizes[-1], self._seconds[-1]
        if len(self._sizes) < 2:
            return t1
        s0, t0 = self._sizes[-2], self._seconds[-2]
        return t1 + (b - s1) * (t1 - t0) / max(s1 - s0, 1)

    def curve(self, n: int) -> list[float]:
        """Estimated verify seconds for batches of 1 … ``n`` tokens (item ``b − 1``), each as :meth:`__call__`
        gives it: one slice of the table for all of a round's draft lengths instead of one look-up each."""
        out = self._table[: max(n, 0)]
        return out + [self._extend(b) for b in range(len(out) + 1, n + 1)]

    def to_dict(self) -> dict:
        """Plain form (for telemetry and snapshots)."""
        return {"sizes": list(self._size_ints), "seconds": list(self._seconds)}

    def points(self) -> CostPoints:
        """The measured sizes and their seconds as they are now, unchanged by later updates: what a
        round's telemetry keeps (``VerifyCostModel(*points)`` is this model as of then)."""
        return self._size_ints, tuple(self._seconds)

    def restore(self, points: CostPoints) -> None:
        """Set the measured points back to ``points`` (:meth:`points` of this model or another), in place: every
        holder of this model sees the restored curve."""
        sizes, seconds = points
        self._sizes = [float(b) for b in sizes]
        self._seconds = [float(t) for t in seconds]
        self._rebuild()

    def update(self, b: int, seconds: float, weight: float = 0.2) -> None:
        """Blend a real verify time for a batch of ``b`` tokens into the model (moving average)."""
        i = self._at.get(b)
        if i is None:  # a size not measured yet: a new point (rare), the table made again
            i = bisect.bisect_left(self._sizes, b)
            self._sizes.insert(i, float(b))
            self._seconds.insert(i, float(seconds))
            self._rebuild()
            return
        self._seconds[i] += weight * (seconds - self._seconds[i])
        # the table changes from the measured size before to the one after (just b where every size is measured)
        lo = int(self._sizes[i - 1]) + 1 if i > 0 else 1
        hi = int(self._sizes[i + 1]) - 1 if i + 1 < len(self._sizes) else len(self._table)
        for x in range(lo, hi + 1):
            self._table[x - 1] = self._interp(x)

    @classmethod
    def measure(
        cls, evaluate: Callable[[int], None], max_batch: int, repeats: int = 2, tile: int = 1
    ) -> "VerifyCostModel":
        """Time ``evaluate(b)`` (one verify-shaped batch of b tokens) for every batch size a round can use.

        With a verify tile those are the sizes up to the tile and its multiples; without one, every size
        up to 32 and a geometric spread beyond (a batch of hundreds of drafted tokens is rare, and timing
        each would take minutes). Each size is timed ``repeats`` times, interleaved, keeping the fastest.
        """
        usable = [b for b in range(1, max_batch + 1) if tile_aligned(b - 1, tile) == b - 1]
        spread = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024}
        sizes = sorted(b for b in usable if b <= 32 or b in spread or b == usable[-1])
        evaluate(1)  # warm up
        best = [float("inf")] * len(sizes)
        for _ in range(repeats):
            for i, b in enumerate(sizes):
                t = time.perf_counter()
                evaluate(b)
                best[i] = min(best[i], time.perf_counter() - t)
        return cls(sizes, best)


def measure_verify_cost(
    ctx: Any, history: Sequence[int], knobs: Mapping[str, Any], repeats: int = 2
) -> VerifyCostModel:
    """Time verify batches of every size a round can use on ``ctx`` (a
    :class:`~specviz.backends.llama.LlamaContext` holding ``history[:-1]``), once per session, and leave
    the cache unchanged. Sizes reach ``draft_max + 1`` within the batch (with ``align``: micro-batch) and
    context limits; each is timed ``repeats`` times (:meth:`VerifyCostModel.measure`)."""
    n_past = len(history) - 1
    cap = ctx.capacity
    max_b = min(
        cap.n_ubatch if knobs.get("align", True) else cap.n_batch,
        int(knobs.get("draft_max", 16)) + 1,
        cap.n_ctx - n_past,
    )
    filler = history[-1]
    # memory that cannot drop a tail (recurrent, hybrid) measures from a checkpoint, as rounds do
    ctx.memory.checkpoint_for(max(max_b, 2) - 1)

    def evaluate(b: int) -> None:
        ctx.eval([filler] * b, n_past, rows="all")
        ctx.memory.cut(n_past, history)

    return VerifyCostModel.measure(evaluate, max(max_b, 2), repeats=repeats, tile=verify_tile(knobs))


def measure_for_advice(
    ctx: Any, history: Sequence[int], knobs: Mapping[str, Any], longest: int, *, pending_in_cache: bool = False
) -> VerifyCostModel | None:
    """The verify cost for the advisor: batch sizes up to ``longest`` (the longest draft verified) plus one,
    each timed :data:`ADVISOR_REPEATS` times, with the cache left as it was; None when the context has no
    room for a batch the measurement needs (:class:`~specviz.errors.ContextError`). ``pending_in_cache``:
    the cache holds the pending token too (a whole-prompt prefill), so the batches go after it."""
    knobs = {**knobs, "draft_max": max(longest, 1)}
    after = [*history, history[-1]] if pending_in_cache else history
    try:
        return measure_verify_cost(ctx, after, knobs, repeats=ADVISOR_REPEATS)
    except ContextError:
        return None
