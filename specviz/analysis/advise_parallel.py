"""Advice under load: what each setting makes per request and in total when N requests share every verify
decode, as llama-server's ``-np N`` slots do, where each setting stops paying (its *break-even concurrency*),
and which single setting suits a stated load (llama-server cannot switch by load).

The recording's rounds say what each setting would draft and accept (the text does not change with the load);
the *batch cost table* (:class:`~specviz.decoding.batch_cost.BatchCostTable`, measured on this machine) says
what one decode of ``p`` sequences × ``d + 1`` rows costs. At concurrency ``p`` one request's round takes one
step of the batched run: the decode of every busy sequence's rows, and every request's own work besides the
decode (drafting, reading the rows, bookkeeping: the *lane seconds*, the recording's median round less its
verify), done one request after another. So a request's round at ``p`` costs, for a verify of ``b`` rows,

    cost_p(b) = decode(p sequences × b rows) + (p − 1) × lane seconds

(:func:`~specviz.decoding.batch_cost.batch_round_cost`; every request assumed to draft as long as this one:
the batch-cost table's cells), and the
advisor's own search and scoring (:func:`~specviz.analysis.advise.advise`,
:func:`~specviz.analysis.advise.predict`) run unchanged on that curve. The decode's seconds between measured
sequence counts are a straight line between the two around ``p`` (beyond the last: its last segment's slope).

Per concurrency (:attr:`ParallelAdvice.rows`, ``by_parallel``): the best setting there, its flags, predicted
speedup over plain decoding at the same concurrency, tokens/s per request and in total. Per setting (each one
best at some concurrency, and plain decoding): its speedup at every concurrency and its break-even: the least
concurrency at which it no longer beats plain decoding (None: it pays up to the most looked at). The *best
single setting* has the most tokens/s over the stated load (every listed concurrency weighed alike, or by how
often a run held it); the *load-aware gain* is what switching to each concurrency's best would add to it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..decoding.batch_cost import BatchCostTable, batch_round_cost, decode_seconds
from ..decoding.batch_cost import batch_round_cost as cost_at
from ..decoding.verify_cost import VerifyCostModel
from ..errors import KnobError
from .advise import advise, predict
from .advise_rounds import Recorded, collect
from .sources import events_of

__all__ = ["ParallelAdvice", "advise_parallel", "cost_at", "decode_seconds", "lane_seconds", "parse_parallels"]

#: The most requests at once the advice looks at (llama-server's slots are a handful to a few dozen).
MAX_PARALLEL = 256


def parse_parallels(text: str | Sequence[int]) -> list[int]:
    """``"1,2,4"`` (or integers) as distinct concurrencies, ascending; :class:`~specviz.errors.KnobError` naming
    a value that is not an integer in ``1..MAX_PARALLEL``."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: set[int] = set()
    for item in items:
        try:
            p = int(str(item).strip())
        except ValueError:
            p = 0
        if not 1 <= p <= MAX_PARALLEL or (not isinstance(item, str) and isinstance(item, bool)):
            raise KnobError(
                f"parallel: {item!r} is not a concurrency; give integers 1..{MAX_PARALLEL}, e.g. --parallel 1,2,4",
                knob="parallel",
                value=item,
            )
        out.add(p)
    if not out:
        raise KnobError("parallel: no concurrency given; e.g. --parallel 1,2,4", knob="parallel", value=text)
    return sorted(out)


def lane_seconds(rec: Recorded) -> float:
    """A request's own work in a round besides the verify decode: the median of the recorded rounds' seconds
    less their verify seconds (0 without the figures)."""
    spans = [max(seconds - verify, 0.0) for _, _, seconds, _, verify in rec.overhead]
    return float(statistics.median(spans)) if spans else 0.0


@dataclass
class ParallelAdvice:
    """The advice at each concurrency (see the module docstring). ``rows``: per concurrency the best setting
    (``setting``, ``flags``, ``predicted_speedup``, ``tokens_per_second`` per request, ``total_tokens_per_second``);
    ``settings``: per setting label its ``flags``, ``speedups`` by concurrency and ``break_even_parallel``;
    ``break_even_parallel``: that of the setting best alone (concurrency 1); ``best_single``: the label of the
    best single setting over ``load`` (concurrency → weight) and ``load_aware_gain`` what each concurrency's
    best would add to it (0.12: 12% more tokens)."""

    parallels: list[int]
    lane_seconds: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    break_even_parallel: int | None = None
    best_single: str = "none"
    load: dict[int, float] = field(default_factory=dict)
    load_aware_gain: float = 0.0
    looked_up_to: int = 1

    def text(self) -> str:
        """The advice for people: a table by concurrency, each setting's break-even, the single setting for
        the load and what a load-aware schedule would add."""
        out = [f"{'parallel':>8}  {'best setting':<28} {'speedup':>8} {'t/s each':>9} {'t/s total':>10}  flags"]
        for r in self.rows:
            out.append(
                f"{r['parallel']:>8}  {r['setting']:<28} {r['predicted_speedup']:>7.2f}x "
                f"{r['tokens_per_second']:>9.1f} {r['total_tokens_per_second']:>10.1f}  {r['flags']}"
            )
        for label, s in self.settings.items():
            if label == "none":
                continue
            be = s["break_even_parallel"]
            if be is None:
                where = f"pays up to {self.looked_up_to} requests at once (the most looked at)"
            else:
                where = "does not pay even alone" if be == 1 else f"stops paying at {be} requests at once"
            sp = ", ".join(f"{p}: {x:.2f}x" for p, x in s["speedups"].items())
            out.append(f"{label}: {where} ({sp})")
        single = self.settings.get(self.best_single, {})
        weights = ", ".join(f"{p}" for p in self.load)
        out.append(
            f"for a load of {weights} requests at once, the best single setting (llama-server cannot switch by "
            f"load): {self.best_single} — {single.get('flags', '--spec-type none')}"
        )
        out.append(
            f"a load-aware schedule (each concurrency's best) would add {self.load_aware_gain:+.1%} tokens over it"
        )
        out.append(
            "(a round at concurrency p: the measured decode of p sequences plus (p - 1) x "
            f"{self.lane_seconds * 1e3:.2f} ms of the other requests' own work)"
        )
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``by_parallel``, ``settings``, ``break_even_parallel``, ``best_single`` (label and flags),
        ``load``, ``load_aware_gain``, ``lane_seconds``."""
        return {
            "by_parallel": list(self.rows),
            "settings": {
                k: {**v, "speedups": {str(p): x for p, x in v["speedups"].items()}} for k, v in self.settings.items()
            },
            "break_even_parallel": self.break_even_parallel,
            "best_single": {"setting": self.best_single, "flags": self.settings.get(self.best_single, {}).get("flags")},
            "load": {str(p): w for p, w in self.load.items()},
            "load_aware_gain": self.load_aware_gain,
            "lane_seconds": self.lane_seconds,
            "looked_up_to": self.looked_up_to,
        }


def advise_parallel(
    events: Sequence[Any],
    table: BatchCostTable,
    parallels: Sequence[int],
    *,
    load: Mapping[int, float] | None = None,
    base: VerifyCostModel | None = None,
) -> ParallelAdvice:
    """The advice at each of ``parallels`` requests at once for the rounds of ``events`` (a recording), with the
    decode costs of ``table`` (see the module docstring); ``load`` weighs the concurrencies for the best single
    setting (default: each of ``parallels`` alike); ``base``, one request's verify cost at every batch size
    measured on this machine (``specviz advise --parallel`` measures it with the recorded model), which the
    table scales by concurrency (:func:`~specviz.decoding.batch_cost.batch_round_cost`). Scored for llama-server
    (its flags, no verify tile)."""
    ps = parse_parallels(list(parallels))
    rec = collect(events_of(events))
    lane = lane_seconds(rec)

    def cost_at(table: BatchCostTable, p: int, lane: float) -> VerifyCostModel:  # the base curve, scaled
        return batch_round_cost(table, p, lane, base)

    out = ParallelAdvice(ps, lane, load=dict(load) if load else {p: 1.0 for p in ps})
    out.looked_up_to = max(max(ps), max(out.load), table.sequences[-1])
    advices: dict[str, Any] = {}
    for p in ps:
        adv = advise(events, cost=cost_at(table, p, lane), for_server=True)
        b = adv.best
        label = _label(adv)
        out.rows.append(
            {
                "parallel": p,
                "setting": label,
                "flags": adv.flags or "--spec-type none",
                "predicted_speedup": b.speedup if b is not None else 1.0,
                "tokens_per_second": b.tokens_per_second if b is not None else adv.baseline_tokens_per_second,
                "total_tokens_per_second": p
                * (b.tokens_per_second if b is not None else adv.baseline_tokens_per_second),
            }
        )
        advices.setdefault(label, adv)
    span = range(1, out.looked_up_to + 1)
    out.settings["none"] = {"flags": "--spec-type none", "speedups": {p: 1.0 for p in sorted(set(ps) | set(out.load))}}
    out.settings["none"]["break_even_parallel"] = None
    for label, adv in advices.items():
        if label == "none":
            continue
        speedups = {p: _speedup(adv, events, cost_at(table, p, lane)) for p in span}
        shown = {p: speedups[p] for p in sorted(set(ps) | set(out.load))}
        be = next((p for p in span if speedups[p] <= 1.0), None)
        out.settings[label] = {"flags": adv.flags or "--spec-type none", "speedups": shown, "break_even_parallel": be}
    first = (
        out.rows[0]["setting"]
        if out.rows and ps[0] == 1
        else _label(advise(events, cost=cost_at(table, 1, lane), for_server=True))
    )
    out.break_even_parallel = out.settings.get(first, {}).get("break_even_parallel")
    plain = {
        p: advise(events, cost=cost_at(table, p, lane), for_server=True).baseline_tokens_per_second for p in out.load
    }
    _choose_single(out, plain)
    return out


def _label(adv: Any) -> str:
    """A setting's label: its strategy and knobs (``none`` for plain decoding)."""
    b = adv.best
    if b is None or b.strategy == "none":
        return "none"
    knobs = f"draft_max {b.draft_max}, draft_min {b.draft_min}"
    return f"{b.strategy} ({knobs}{'' if b.draft_p_min is None else f', p_min {b.draft_p_min}'})"


def _speedup(adv: Any, events: Sequence[Any], cost: VerifyCostModel) -> float:
    """The setting ``adv`` advised, scored on ``events`` under ``cost``: its speedup over plain decoding there."""
    got = predict(adv, events, cost=cost)
    return float(got.speedup) if got is not None else 1.0


def _choose_single(out: ParallelAdvice, plain: Mapping[int, float]) -> None:
    """The best single setting over ``out.load`` (the most tokens, each concurrency's ``plain`` tokens/s per
    request times the setting's speedup, weighed) and what each concurrency's best would add."""
    total_w = sum(out.load.values()) or 1.0

    def tokens(speedup_at: Mapping[int, float]) -> float:
        return sum(w * p * plain[p] * speedup_at[p] for p, w in out.load.items()) / total_w

    scored = {label: tokens(s["speedups"]) for label, s in out.settings.items()}
    out.best_single = max(scored, key=lambda k: scored[k]) if scored else "none"
    best_each = {p: max(s["speedups"][p] for s in out.settings.values()) for p in out.load}
    single = scored.get(out.best_single, 0.0)
    out.load_aware_gain = tokens(best_each) / single - 1.0 if single > 0 else 0.0
