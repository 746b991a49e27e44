"""The Advice panel's part under load: for a batched recording, the advice at each concurrency
(:func:`~specviz.analysis.advise_parallel.advise_parallel`) that the panel draws as predicted speedup against
concurrency, each setting's break-even marked.

It needs a batch-cost table (what one decode of ``p`` sequences × ``d + 1`` rows costs on this machine). A
table the caller gives (``Inspector.replay(path, batch_cost=...)``, ``specviz replay FILE --batch-cost
TABLE``) is used as it is; without one the table is measured on the recorded model when Advise is pressed
(:func:`~specviz.analysis.advise_fresh.measure_batch_cost_for`: seconds on a small model, minutes on the
embedded one, and noisy on a busy machine), once per inspector, and kept for the next press. Only a press
measures: a recording is shown without loading any model. When the model file is not at hand the panel says so
instead.

The concurrencies: :data:`CHART_PARALLELS` and every number of busy sequences the run held; the best single
setting is chosen for the load the run held (how often each number of sequences shared a decode).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from ..analysis.advise_fresh import measure_batch_cost_for, recorded_load
from ..analysis.advise_parallel import MAX_PARALLEL, advise_parallel
from ..decoding.batch_cost import BatchCostTable
from ..decoding.events import Event
from ..errors import KnobError

__all__ = ["CHART_PARALLELS", "chart_parallels", "measure_units", "parallel_part", "read_batch_cost"]

#: The concurrencies the chart always shows (a server's slots are a handful), beside those the run held.
CHART_PARALLELS = (1, 2, 4, 8)


def read_batch_cost(path: str | os.PathLike | None) -> BatchCostTable | None:
    """The batch-cost table in the JSON file ``path`` (``benchmarks/bench_batch_cost.py --json``, or the
    ``batch_cost`` of ``specviz advise FILE --parallel … --json``), None for None; :class:`~specviz.errors.KnobError`
    naming the file when it cannot be read or is not such a table."""
    if path is None:
        return None
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
        return BatchCostTable.from_dict(d.get("batch_cost", d) if isinstance(d, dict) else d)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise KnobError(
            f"batch cost: {str(path)!r} is not a batch-cost table ({type(e).__name__}: {e}); write one with "
            "benchmarks/bench_batch_cost.py --json",
            knob="batch_cost",
            value=str(path),
        ) from None


def chart_parallels(load: dict[int, float]) -> list[int]:
    """The concurrencies of the chart: :data:`CHART_PARALLELS` and every one of ``load``, ascending."""
    return sorted({*CHART_PARALLELS, *(p for p in load if 1 <= p <= MAX_PARALLEL)})


def measure_units(parallels: Sequence[int]) -> int:
    """The work a measurement of the table for ``parallels`` is charged (a row decoded is a unit): every
    sequence count × every draft length's rows, a few passes each."""
    from ..decoding.batch_cost import DRAFT_LENGTHS

    return 1 + 4 * sum({1, *parallels}) * sum(d + 1 for d in DRAFT_LENGTHS)


def parallel_part(
    events: Sequence[Event],
    table: BatchCostTable | None,
    *,
    charge: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], BatchCostTable | None]:
    """The advice's ``parallel`` entry for the batched recording ``events`` and the table it used (``table``, or
    one measured now: see the module docstring), or ``{"parallel_note": why}`` and None when there is no table.
    ``parallel`` is :meth:`~specviz.analysis.advise_parallel.ParallelAdvice.to_dict` with ``cost_source``."""
    load = recorded_load(events)
    parallels = chart_parallels(load)
    source = "given"
    if table is None:
        if charge is not None:
            charge(measure_units(parallels))
        table = measure_batch_cost_for(events, parallels)
        if table is None:
            note = (
                "advice under load: the recorded model is not at hand to measure what a batch costs; give a "
                "batch-cost table (specviz replay FILE --batch-cost TABLE, or Inspector.replay(path, batch_cost=...))"
            )
            return {"parallel_note": note}, None
        source = "measured now on the recorded model"
    adv = advise_parallel(events, table, parallels, load=load or None)
    return {"parallel": {**adv.to_dict(), "cost_source": source}}, table
