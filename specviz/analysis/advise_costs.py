"""What a replayed round costs: the verify-cost curve and the overhead of a round, for the advisor.

The verify cost of a batch of ``b`` tokens comes from a measured curve (a
:class:`~specviz.decoding.verify_cost.VerifyCostModel`, as the ``cost`` policy and
``benchmarks/bench_verify_cost.py`` measure it), else from the curve recorded in the telemetry, else from
one fitted to the recorded verify times (:func:`cost_from_times`; :func:`verify_cost` picks).
:func:`scaled_to_times` moves a curve to the level of the rounds' own verify times. Everything else a round
costs (reading the logits rows, events, telemetry) is fitted as ``a + b * rows read``
(:func:`fit_overhead`). :func:`round_costs` gathers the three and plain decoding's tokens/s under them.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from ..decoding.verify_cost import VerifyCostModel
from .advise_rounds import Recorded


def scaled_to_times(cost: VerifyCostModel, verify: dict[int, list[float]]) -> tuple[VerifyCostModel, float]:
    """``cost`` scaled to the level of the recorded verify times (the median of recorded / curve over every
    recorded verify): the curve's shape comes from the measurement, its level from the rounds themselves,
    which ran under the same load as the figures the advice is compared with. ``(cost, 1.0)`` without
    recorded times. The recorded times include the acceptor's reading of the logits rows, so the scale is
    a little above 1 on an idle machine."""
    ratios = [t / cost(b) for b, ts in verify.items() for t in ts if cost(b) > 0]
    if not ratios:
        return cost, 1.0
    scale = float(statistics.median(ratios))
    return VerifyCostModel(cost.sizes.tolist(), (cost.seconds * scale).tolist()), scale


def fit_overhead(rows: list[tuple[int, int, float, float, float]]) -> tuple[float, float]:
    """``(a, b)``: what a round costs besides drafting and its verify (the batch and the reading of its rows),
    as ``a + b * rows read``, fitted to recorded rounds ``(rows read, batch, seconds, draft seconds, verify
    seconds)``; ``(0, 0)`` without them.

    Each round's overhead is its own seconds less its own draft and verify seconds, and the line goes
    through the median overhead of each number of rows read (weighted by how many rounds read it; a
    constant, the median, when the slope would be negative). The round's own verify seconds, not the
    verify-cost curve: a round's verify varies by milliseconds from the curve, and a residual against the
    curve fitted that noise as a per-round cost of up to 4 ms (measured here on the embedded model, where
    the real overhead is a few tenths of a millisecond), which inflated every speedup predicted. Medians: a
    round held up by the machine is one sample, not a slope."""
    if not rows:
        return 0.0, 0.0
    by: dict[int, list[float]] = {}
    for r in rows:
        by.setdefault(int(r[0]), []).append(max(r[2] - r[3] - r[4], 0.0))
    everything = [v for vs in by.values() for v in vs]
    if len(by) < 2:
        return float(np.median(everything)), 0.0
    x = np.array(sorted(by), float)
    y = np.array([np.median(by[int(k)]) for k in x], float)
    w = np.sqrt(np.array([len(by[int(k)]) for k in x], float))
    b, a = np.polyfit(x, y, 1, w=w)
    if b < 0 or a < 0:
        return float(np.median(everything)), 0.0
    return float(a), float(b)


def cost_from_times(verify: dict[int, list[float]]) -> VerifyCostModel | None:
    """A verify-cost curve fitted to recorded verify times: the median per batch size seen, and for the
    sizes in between or beyond, a least-squares line through those medians. None with fewer than two sizes."""
    if len(verify) < 2:
        return None
    sizes = sorted(verify)
    med = [statistics.median(verify[b]) for b in sizes]
    slope, icpt = np.polyfit(np.array(sizes, float), np.array(med, float), 1)
    top = max(max(sizes), 64)
    all_sizes = list(range(1, top + 1))
    secs = [statistics.median(verify[b]) if b in verify else max(float(icpt + slope * b), 1e-9) for b in all_sizes]
    return VerifyCostModel(all_sizes, secs)


def verify_cost(cost: VerifyCostModel | None, rec: Recorded) -> tuple[VerifyCostModel | None, str]:
    """The verify-cost curve the advice uses and where it comes from: ``cost`` (measured), else the curve
    recorded in the telemetry, else one fitted to the recorded verify times (None with fewer than two
    batch sizes)."""
    if cost is not None:
        return cost, "measured"
    if rec.curve:
        return VerifyCostModel(rec.curve["sizes"], rec.curve["seconds"]), "recorded in the telemetry"
    return cost_from_times(rec.verify), "fitted to the recorded verify times"


def round_costs(
    rec: Recorded, cost: VerifyCostModel | None, scale_to_rounds: bool = False
) -> tuple[VerifyCostModel, str, tuple[float, float], float] | None:
    """What a round of ``rec`` costs, as the advice scores it: the verify-cost curve (:func:`verify_cost`, scaled
    to the rounds' own verify times with ``scale_to_rounds``), where it comes from, the fitted overhead of a
    round (:func:`fit_overhead`) and plain decoding's tokens/s under them; None without a curve."""
    curve, source_name = verify_cost(cost, rec)
    if curve is None:
        return None
    if scale_to_rounds and source_name != "fitted to the recorded verify times":
        curve, scale = scaled_to_times(curve, rec.verify)
        if abs(scale - 1.0) > 0.05:
            source_name += f", scaled by {scale:.2f} to the rounds' own verify times"
    overhead = fit_overhead(rec.overhead)
    return curve, source_name, overhead, 1.0 / (curve(1) + overhead[0] + overhead[1])


def session_cost(s: Any) -> VerifyCostModel | None:
    """The session's verify-cost curve for the advisor (:meth:`~specviz.decoding.session.Session.verify_cost`: the
    one the cost policy measured, or measured now on the session's own context with the cache left as it was;
    None when the context has no room, and the advisor then fits the recorded verify times instead). The
    session measures it holding its own lock (a served session, in its scheduler turn too)."""
    return s.verify_cost()
