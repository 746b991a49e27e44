"""The strategy benchmark behind ``specviz bench``: every strategy on every workload kind, one table.

For each workload kind (:mod:`specviz.analysis.workloads`), every prompt is generated ``repeats`` times with
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

A row is a *setting* (:class:`BenchSetting`): a label, a strategy and its knobs, so one strategy can appear
with several draft models (an EAGLE-3 head, drafts derived from the target). Each row also pools, over its
runs, the acceptance by draft position (accepted at depth i over drafts that reached depth i) and, for
model-backed drafters, the drafter's seconds per drafted token; :func:`format_comparison` sets one row
against ``none``, the best draftless strategy and every ``draft`` row, per workload kind.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..decoding.session import Session
from ..strategies import strategy_class, strategy_names
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
    position_tries: list[int] = field(default_factory=list)  # drafts reaching each depth
    position_hits: list[int] = field(default_factory=list)  # accepted at each depth
    draft_model_seconds: float = 0.0  # a model-backed drafter's own time
    draft_model_tokens: int = 0
    #: memory (specviz.backends.memory): the target's weights and caches, the draft model's weights and
    #: caches, the saved states held at the end, checkpoints taken (bytes), the process's peak resident
    memory_bytes: int = 0
    draft_memory_bytes: int = 0
    marks_bytes: int = 0
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    peak_rss_bytes: int = 0

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
    base_strategy: str = ""  # the strategy of the setting (``strategy`` is its label)

    @property
    def per_position_acceptance(self) -> list[float]:
        """Accepted at each draft depth over drafts that reached it, pooled over the row's runs."""
        tries: list[int] = []
        hits: list[int] = []
        for r in self.samples:
            for i, (t, h) in enumerate(zip(r.position_tries, r.position_hits)):
                if i >= len(tries):
                    tries.append(0)
                    hits.append(0)
                tries[i] += t
                hits[i] += h
        return [h / t if t else 0.0 for h, t in zip(hits, tries)]

    @property
    def draft_ms_per_token(self) -> float | None:
        """A model-backed drafter's milliseconds per drafted token, pooled (None for draftless strategies)."""
        n = sum(r.draft_model_tokens for r in self.samples)
        return 1e3 * sum(r.draft_model_seconds for r in self.samples) / n if n else None

    @property
    def memory(self) -> dict[str, int]:
        """The row's memory figures: the largest of its runs (bytes; checkpoints are per run)."""
        keys = (
            "memory_bytes",
            "draft_memory_bytes",
            "marks_bytes",
            "checkpoints",
            "checkpoint_bytes",
            "peak_rss_bytes",
        )
        return {k: max((int(getattr(r, k)) for r in self.samples), default=0) for k in keys}

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary form (per-prompt medians included, individual runs left out)."""
        return {
            "memory": self.memory,
            "kind": self.kind,
            "strategy": self.strategy,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "tokens_per_second": self.tokens_per_second,
            "speedup": self.speedup,
            "total_time_speedup": self.total_time_speedup,
            "runs": self.runs,
            "per_prompt": self.per_prompt,
            "base_strategy": self.base_strategy or self.strategy,
            "per_position_acceptance": self.per_position_acceptance,
            "draft_ms_per_token": self.draft_ms_per_token,
        }


@dataclass(frozen=True)
class BenchSetting:
    """One row of the benchmark: a label, a strategy and its knobs (a draft model among them)."""

    label: str
    strategy: str
    knobs: dict[str, Any] = field(default_factory=dict)


def summarise(kind: str, strategy: str, runs: Sequence[BenchRun], none_runs: Sequence[BenchRun]) -> BenchRow:
    """The table cell of ``runs`` (one strategy on one kind), against ``none``'s runs of the same prompts."""
    prompts = sorted({r.prompt for r in runs})
    per_prompt = []
    for p in prompts:
        xs = [r for r in runs if r.prompt == p]
        per_prompt.append(
            {
                "prompt": p,
                "acceptance_rate": statistics.median(r.acceptance_rate for r in xs),
                "mean_accepted_length": statistics.median(r.mean_accepted_length for r in xs),
                "tokens_per_second": statistics.median(r.tokens_per_second for r in xs),
                "speedup": statistics.median(r.paired_speedup for r in xs),
                "copied": statistics.median(r.copied for r in xs),
            }
        )

    def across(key: str) -> float:
        return statistics.median(d[key] for d in per_prompt)

    def rate(rs: Sequence[BenchRun]) -> float:
        seconds = sum(r.seconds for r in rs)
        return sum(r.tokens for r in rs) / seconds if seconds > 0 else 0.0

    base = rate(none_runs)
    return BenchRow(
        kind,
        strategy,
        across("acceptance_rate"),
        across("mean_accepted_length"),
        across("tokens_per_second"),
        across("speedup"),
        rate(runs) / base if base else 0.0,
        len(runs),
        per_prompt,
        list(runs),
    )


def default_settings(
    strategies: Sequence[str] | None = None,
    knobs: dict[str, dict[str, Any]] | None = None,
    common: dict[str, Any] | None = None,
) -> list[BenchSetting]:
    """``none`` and one setting per strategy (default: every draftless one), labelled by the strategy's name."""
    strategies = list(strategies or [n for n in strategy_names() if not strategy_class(n).needs_model])
    out = [BenchSetting("none", "none")]
    for st in strategies:
        if st == "none":
            continue
        k = dict(common or {})
        k.update((knobs or {}).get(st, {}))
        out.append(BenchSetting(st, st, k))
    return out


def run_bench(
    session: Session,
    *,
    strategies: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    repeats: int = 3,
    max_tokens: int = 128,
    knobs: dict[str, dict[str, Any]] | None = None,
    common: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    settings: Sequence[BenchSetting] | None = None,
) -> list[BenchRow]:
    """Run the benchmark and return its rows (``none`` first in each kind).

    ``common`` knobs apply to every strategy but ``none``; ``knobs`` maps a strategy name to its own.
    ``settings`` replaces both with explicit rows (``none`` is added first when missing).
    """
    if settings is None:
        settings = default_settings(strategies, knobs, common)
    settings = [BenchSetting("none", "none")] + [x for x in settings if x.strategy != "none"]
    kinds = list(kinds or WORKLOADS)
    rows: list[BenchRow] = []
    for kind in kinds:
        runs: dict[str, list[BenchRun]] = {x.label: [] for x in settings}
        for rep in range(repeats):
            for p, prompt in enumerate(WORKLOADS[kind]):
                partner = None
                for x in settings:  # back to back, none first: each run's partner ran just before it
                    session.start(prompt, max_tokens, x.strategy, **x.knobs)
                    session.run()
                    t = session.telemetry_dict()
                    run = BenchRun(
                        p,
                        rep,
                        t["acceptance_rate"],
                        t["mean_accepted_length"],
                        t["n_generated"],
                        t["seconds"],
                        copied=copied_fraction(session.prompt_tokens, session.tokens),
                        position_tries=list(session.generation.telemetry.position_tries),
                        position_hits=list(session.generation.telemetry.position_hits),
                        draft_model_seconds=float(t.get("draft_model_seconds") or 0.0),
                        draft_model_tokens=int(t.get("draft_model_tokens") or 0),
                        **_memory_of(t),
                    )
                    if x.strategy == "none":
                        partner = run
                    elif partner is not None and partner.tokens_per_second > 0:
                        run.paired_speedup = run.tokens_per_second / partner.tokens_per_second
                    runs[x.label].append(run)
            if progress:
                progress(f"{kind}: repeat {rep + 1}/{repeats} done")
        for x in settings:
            row = summarise(kind, x.label, runs[x.label], runs["none"])
            row.base_strategy = x.strategy
            rows.append(row)
    return rows


def _memory_of(t: dict[str, Any]) -> dict[str, int]:
    """A run's memory fields from its telemetry (``memory`` section and checkpoint counters)."""
    m = t["memory"]
    tgt, d = m["target"], m["draft"]

    def held(x: dict[str, Any]) -> int:
        return int(x["weight_bytes"] + x["kv_bytes"] + x["swa_kv_bytes"] + x["recurrent_bytes"])

    return {
        "memory_bytes": held(tgt),
        "draft_memory_bytes": held(d) if d else 0,
        "marks_bytes": int(tgt["marks_bytes"] + (d["marks_bytes"] if d else 0)),
        "checkpoints": int(t["checkpoints"] + t["draft_checkpoints"]),
        "checkpoint_bytes": int(t["checkpoint_bytes"] + t["draft_checkpoint_bytes"]),
        "peak_rss_bytes": int(m["peak_rss_bytes"]),
    }


def format_memory(rows: Sequence[BenchRow]) -> str:
    """The rows' memory as a Markdown table (MiB; the largest over each row's runs), ``none`` first in
    each kind: the same model's weights and caches, the draft model's, the saved states held, the
    checkpoints one run took and the process's peak resident memory so far."""
    from ..backends.memory import mib_text

    out = [
        "| workload | strategy | weights + caches | draft model | saved states | checkpoints (bytes) | peak resident |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r.memory
        out.append(
            f"| {r.kind} | {r.strategy} | {mib_text(m['memory_bytes'])} | {mib_text(m['draft_memory_bytes'])} | "
            f"{mib_text(m['marks_bytes'])} | {m['checkpoints']} ({mib_text(m['checkpoint_bytes'])}) | "
            f"{mib_text(m['peak_rss_bytes'])} |"
        )
    return "\n".join(out)


def format_table(rows: Sequence[BenchRow]) -> str:
    """The rows as a Markdown table."""
    out = [
        "| workload | strategy | acceptance | mean accepted length | tokens/s | speedup vs none | total-time speedup |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        acc = "—" if r.strategy == "none" else f"{r.acceptance_rate:.1%}"
        out.append(
            f"| {r.kind} | {r.strategy} | {acc} | {r.mean_accepted_length:.2f} | "
            f"{r.tokens_per_second:.1f} | {r.speedup:.2f}× | {r.total_time_speedup:.2f}× |"
        )
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


def derived_draft(target: str | Path, layers: str) -> Path:
    """A draft derived from ``target`` keeping ``layers`` (``specviz derive-draft``), made once into the
    specviz cache (``<cache>/derived/<target stem>-keep-<layers>.gguf``, the examples' naming)."""
    from ..models.derive import derive_draft
    from ..models.embedded import cache_dir

    target = Path(target)
    out = cache_dir() / "derived" / f"{target.stem}-keep-{layers.replace(',', '_')}.gguf"
    if not out.exists() or out.stat().st_mtime < target.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        derive_draft(target, layers, out)
    return out


def format_positions(rows: Sequence[BenchRow], depth: int = 8) -> str:
    """Acceptance by draft position (and a model drafter's milliseconds per drafted token), one line per row."""
    out = []
    for r in rows:
        if r.strategy == "none":
            continue
        acc = r.per_position_acceptance[:depth]
        cells = "  ".join(f"{i + 1}:{a:>4.0%}" for i, a in enumerate(acc)) or "no drafts"
        cost = f"  draft {r.draft_ms_per_token:.2f} ms/token" if r.draft_ms_per_token is not None else ""
        out.append(f"{r.kind:<13} {r.strategy:<30} {cells}{cost}")
    return "\n".join(out)


def format_comparison(rows: Sequence[BenchRow], subject: str) -> str:
    """Per workload kind: the ``subject`` row's tokens/s against ``none``, the best draftless strategy and
    every row of the ``draft`` strategy (paired speedups, medians over prompts; ratios of those medians)."""
    out = []
    for kind in dict.fromkeys(r.kind for r in rows):
        mine = [r for r in rows if r.kind == kind and r.strategy == subject]
        if not mine:
            continue
        me = mine[0]
        parts = [f"{me.speedup:.2f}x none"]
        draftless = [
            r
            for r in rows
            if r.kind == kind and r.strategy != "none" and not strategy_class(r.base_strategy or r.strategy).needs_model
        ]
        if draftless:
            best = max(draftless, key=lambda r: r.speedup)
            parts.append(f"{me.speedup / best.speedup:.2f}x the best draftless ({best.strategy} {best.speedup:.2f}x)")
        for r in rows:
            if r.kind == kind and r.base_strategy == "draft":
                parts.append(
                    f"{me.speedup / r.speedup:.2f}x {r.strategy} ({r.speedup:.2f}x)"
                    if r.speedup
                    else f"— vs {r.strategy}"
                )
        out.append(f"{kind:<13} {subject}: mean accepted length {me.mean_accepted_length:.2f}; " + ", ".join(parts))
    return "\n".join(out)
