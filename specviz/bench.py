"""The strategy benchmark behind ``specviz bench``: every strategy on every workload kind, one table.

For each workload kind (:mod:`specviz.workloads`), every prompt is generated ``repeats`` times with
greedy decoding by each strategy (``none`` included). Within a repeat the strategies run back to back
on the same prompt, ``none`` first, so each run has a partner run of ``none`` taken moments before it.

The figures of a (kind, strategy) cell:

* per prompt, the median over repeats of the acceptance rate, the mean accepted length, the decode
  tokens/s and the *paired speedup* (a run's tokens/s over its partner ``none`` run's);
* the cell reports the median over the kind's prompts of those per-prompt medians;
* ``total-time speedup``: all the kind's runs pooled — total tokens over total decode seconds,
  divided by the same for ``none``. A prompt that speculation cannot help weighs in by the time it
  takes, so this figure is never above what the slowest prompts allow; it is the one to read when the
  per-prompt speedups are far apart.

Pairing removes most of the machine's drift between repeats (both partners run under the same load),
and taking medians per prompt first keeps one slow repeat of one prompt from moving the cell.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .session import Session
from .strategies import strategy_class, strategy_names
from .workloads import WORKLOADS, copied_fraction


@dataclass
class BenchRun:
    """One generation of the benchmark: a prompt, a repeat, a strategy, and what it measured."""

    prompt: int
    repeat: int
    acceptance_rate: float
    mean_accepted_length: float
    tokens: int
    seconds: float
    paired_speedup: float = 1.0  # tokens/s over the partner none run's (same prompt and repeat)
    copied: float = 0.0  # share of the output copied from the prompt (workloads.copied_fraction)

    @property
    def tokens_per_second(self) -> float:
        """Decode tokens per second of this run."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class BenchRow:
    """One (workload kind, strategy) cell of the table, with the per-prompt medians it came from."""

    kind: str
    strategy: str
    acceptance_rate: float
    mean_accepted_length: float
    tokens_per_second: float
    speedup: float = 1.0
    total_time_speedup: float = 1.0
    runs: int = 0
    per_prompt: list[dict[str, float]] = field(default_factory=list)
    samples: list[BenchRun] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary form (per-prompt medians included, individual runs left out)."""
        return {"kind": self.kind, "strategy": self.strategy, "acceptance_rate": self.acceptance_rate,
                "mean_accepted_length": self.mean_accepted_length, "tokens_per_second": self.tokens_per_second,
                "speedup": self.speedup, "total_time_speedup": self.total_time_speedup, "runs": self.runs,
                "per_prompt": self.per_prompt}


def summarise(kind: str, strategy: str, runs: Sequence[BenchRun], none_runs: Sequence[BenchRun]) -> BenchRow:
    """The table cell of ``runs`` (one strategy on one kind), against ``none``'s runs of the same prompts."""
    prompts = sorted({r.prompt for r in runs})
    per_prompt = []
    for p in prompts:
        xs = [r for r in runs if r.prompt == p]
        per_prompt.append({
            "prompt": p,
            "acceptance_rate": statistics.median(r.acceptance_rate for r in xs),
            "mean_accepted_length": statistics.median(r.mean_accepted_length for r in xs),
            "tokens_per_second": statistics.median(r.tokens_per_second for r in xs),
            "speedup": statistics.median(r.paired_speedup for r in xs),
            "copied": statistics.median(r.copied for r in xs),
        })

    def across(key: str) -> float:
        return statistics.median(d[key] for d in per_prompt)

    def rate(rs: Sequence[BenchRun]) -> float:
        seconds = sum(r.seconds for r in rs)
        return sum(r.tokens for r in rs) / seconds if seconds > 0 else 0.0

    base = rate(none_runs)
    return BenchRow(kind, strategy, across("acceptance_rate"), across("mean_accepted_length"),
                    across("tokens_per_second"), across("speedup"), rate(runs) / base if base else 0.0,
                    len(runs), per_prompt, list(runs))


def run_bench(session: Session, *, strategies: Sequence[str] | None = None, kinds: Sequence[str] | None = None,
              repeats: int = 3, max_tokens: int = 128, knobs: dict[str, dict[str, Any]] | None = None,
              common: dict[str, Any] | None = None, progress: Callable[[str], None] | None = None) -> list[BenchRow]:
    """Run the benchmark and return its rows (``none`` first in each kind).

    ``common`` knobs apply to every strategy but ``none``; ``knobs`` maps a strategy name to its own.
    """
    strategies = list(strategies or [n for n in strategy_names() if not strategy_class(n).needs_model])
    strategies = ["none"] + [s for s in strategies if s != "none"]
    kinds = list(kinds or WORKLOADS)
    knobs = knobs or {}
    rows: list[BenchRow] = []
    for kind in kinds:
        runs: dict[str, list[BenchRun]] = {s: [] for s in strategies}
        for rep in range(repeats):
            for p, prompt in enumerate(WORKLOADS[kind]):
                partner = None
                for strat in strategies:  # back to back, none first: each run's partner ran just before it
                    k = dict(common or {}) if strat != "none" else {}
                    k.update(knobs.get(strat, {}))
                    session.start(prompt, max_tokens, strat, **k)
                    session.run()
                    t = session.telemetry_dict()
                    run = BenchRun(p, rep, t["acceptance_rate"], t["mean_accepted_length"], t["n_generated"],
                                   t["seconds"], copied=copied_fraction(session.prompt_tokens, session.tokens))
                    if strat == "none":
                        partner = run
                    elif partner is not None and partner.tokens_per_second > 0:
                        run.paired_speedup = run.tokens_per_second / partner.tokens_per_second
                    runs[strat].append(run)
            if progress:
                progress(f"{kind}: repeat {rep + 1}/{repeats} done")
        rows.extend(summarise(kind, strat, runs[strat], runs["none"]) for strat in strategies)
    return rows


def format_table(rows: Sequence[BenchRow]) -> str:
    """The rows as a Markdown table."""
    out = ["| workload | strategy | acceptance | mean accepted length | tokens/s | speedup vs none "
           "| total-time speedup |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        acc = "—" if r.strategy == "none" else f"{r.acceptance_rate:.1%}"
        out.append(f"| {r.kind} | {r.strategy} | {acc} | {r.mean_accepted_length:.2f} | "
                   f"{r.tokens_per_second:.1f} | {r.speedup:.2f}× | {r.total_time_speedup:.2f}× |")
    return "\n".join(out)


def format_per_prompt(rows: Sequence[BenchRow]) -> str:
    """Per-prompt medians of every row's paired speedup, one line per (kind, strategy).

    Each kind starts with a ``copied`` line: the share of ``none``'s output copied from the prompt,
    which a draftless strategy can find there (an output that repeats itself offers more).
    """
    out = []
    for r in rows:
        if r.strategy == "none":
            cells = "  ".join(f"#{d['prompt']} {d['copied']:>5.0%}" for d in r.per_prompt)
            out.append(f"{r.kind:<13} {'copied':<14} {cells}")
            continue
        cells = "  ".join(f"#{d['prompt']} {d['speedup']:.2f}×" for d in r.per_prompt)
        out.append(f"{r.kind:<13} {r.strategy:<14} {cells}")
    return "\n".join(out)
