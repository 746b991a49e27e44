"""The strategy benchmark behind ``specviz bench``: every strategy on every workload kind, one table.

For each workload kind (:mod:`specviz.workloads`) and each strategy (``none`` included), every prompt
is generated ``repeats`` times with greedy decoding; per (kind, strategy) the table reports medians of
acceptance rate, mean accepted length and decode tokens/s, and the speedup over ``none`` measured on
the same prompts in the same run (ratio of the median tokens/s).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .session import Session
from .strategies import strategy_names
from .workloads import WORKLOADS


@dataclass
class BenchRow:
    """One (workload kind, strategy) cell of the table."""

    kind: str
    strategy: str
    acceptance_rate: float
    mean_accepted_length: float
    tokens_per_second: float
    speedup: float = 1.0
    runs: int = 0
    samples: list = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary form."""
        return {"kind": self.kind, "strategy": self.strategy, "acceptance_rate": self.acceptance_rate,
                "mean_accepted_length": self.mean_accepted_length, "tokens_per_second": self.tokens_per_second,
                "speedup": self.speedup, "runs": self.runs}


def run_bench(session: Session, *, strategies: Sequence[str] | None = None, kinds: Sequence[str] | None = None,
              repeats: int = 3, max_tokens: int = 128, knobs: dict[str, dict[str, Any]] | None = None,
              common: dict[str, Any] | None = None, progress: Callable[[str], None] | None = None) -> list[BenchRow]:
    """Run the benchmark and return its rows (``none`` first in each kind)."""
    strategies = [s for s in (strategies or [n for n in strategy_names() if n != "draft"])]
    if "none" not in strategies:
        strategies = ["none"] + list(strategies)
    strategies = ["none"] + [s for s in strategies if s != "none"]
    kinds = list(kinds or WORKLOADS)
    knobs = knobs or {}
    rows: list[BenchRow] = []
    for kind in kinds:
        per: dict[str, list[dict[str, float]]] = {s: [] for s in strategies}
        for rep in range(repeats):
            for prompt in WORKLOADS[kind]:
                for strat in strategies:  # interleaved so drift hits every strategy alike
                    k = dict(common or {}) if strat != "none" else {}
                    k.update(knobs.get(strat, {}))
                    session.start(prompt, max_tokens, strat, **k)
                    session.run()
                    t = session.telemetry_dict()
                    per[strat].append({"acc": t["acceptance_rate"], "mal": t["mean_accepted_length"],
                                       "tps": t["tokens_per_second"]})
            if progress:
                progress(f"{kind}: repeat {rep + 1}/{repeats} done")
        base = statistics.median(x["tps"] for x in per["none"])
        for strat in strategies:
            xs = per[strat]
            tps = statistics.median(x["tps"] for x in xs)
            rows.append(BenchRow(kind, strat, statistics.median(x["acc"] for x in xs),
                                 statistics.median(x["mal"] for x in xs), tps, tps / base if base else 0.0,
                                 len(xs), xs))
    return rows


def format_table(rows: Sequence[BenchRow]) -> str:
    """The rows as a Markdown table."""
    out = ["| workload | strategy | acceptance | mean accepted length | tokens/s | speedup vs none |",
           "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        acc = "—" if r.strategy == "none" else f"{r.acceptance_rate:.1%}"
        out.append(f"| {r.kind} | {r.strategy} | {acc} | {r.mean_accepted_length:.2f} | "
                   f"{r.tokens_per_second:.1f} | {r.speedup:.2f}× |")
    return "\n".join(out)
