"""The evaluation at the end of ``specviz train-eagle3``: the head against the alternatives, on held-out prompts.

It is ``specviz bench`` with the head (:mod:`specviz.analysis.bench`): on the held-out workload kinds (``free`` and
``summarise``: never trained on, see :mod:`specviz.train.corpus`), greedy, every setting run back to back
after its ``none`` partner, the head with the cost policy. ``full`` compares it with every draftless
strategy and a draft derived from the target (every layer but the last); ``quick`` with prompt lookup and
ngram-cache only. The same report, with repeats, comes from::

    specviz bench --strategy eagle3 --draft-model HEAD.gguf --kinds free,summarise --draft-policy cost

The issue's targets are checked at the end: mean accepted length at least 2.0 and at least 1.3x ``none``
tokens/s on the held-out kinds, ahead of every draftless strategy on free generation. Acceptance does not
depend on the machine's load; tokens/s do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..analysis.bench import (
    BenchRow,
    BenchSetting,
    default_settings,
    derived_draft,
    format_comparison,
    format_positions,
    format_table,
    run_bench,
)
from .corpus import HELD_OUT_KINDS

__all__ = ["EvalReport", "evaluate_head"]

QUICK_BASELINES = ("prompt-lookup", "ngram-cache")


@dataclass
class EvalReport:
    """The rows of the evaluation and its text."""

    rows: list[BenchRow]
    subject: str
    text: str
    targets: dict[str, Any] = field(default_factory=dict)


def check_targets(rows: Sequence[BenchRow], subject: str) -> tuple[dict[str, Any], list[str]]:
    """The issue's targets, per held-out kind: (figures, lines of the verdict)."""
    out: dict[str, Any] = {}
    lines = []
    for kind in dict.fromkeys(r.kind for r in rows):
        me = next((r for r in rows if r.kind == kind and r.strategy == subject), None)
        if me is None:
            continue
        draftless = [r for r in rows if r.kind == kind and r.base_strategy not in ("none", "eagle3", "draft", "mtp")]
        best = max(draftless, key=lambda r: r.speedup) if draftless else None
        d = {
            "mean_accepted_length": me.mean_accepted_length,
            "speedup": me.speedup,
            "best_draftless": best.strategy if best else None,
            "best_draftless_speedup": best.speedup if best else None,
            "per_position_acceptance": me.per_position_acceptance,
            "draft_ms_per_token": me.draft_ms_per_token,
        }
        out[kind] = d
        ok_len = me.mean_accepted_length >= 2.0
        ok_speed = me.speedup >= 1.3
        line = (
            f"{kind}: mean accepted length {me.mean_accepted_length:.2f} ({'meets' if ok_len else 'below'} 2.0), "
            f"{me.speedup:.2f}x none ({'meets' if ok_speed else 'below'} 1.3x)"
        )
        if kind == "free" and best is not None:
            ahead = me.speedup > best.speedup
            line += f", {'ahead of' if ahead else 'behind'} the best draftless ({best.strategy} {best.speedup:.2f}x)"
        lines.append(line)
    return out, lines


def evaluate_head(
    target: str | Path,
    head: str | Path,
    *,
    kinds: Sequence[str] = HELD_OUT_KINDS,
    repeats: int = 1,
    max_tokens: int = 128,
    mode: str = "full",
    draft_policy: str = "cost",
    draft_p_min: float | None = None,
    n_threads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> EvalReport:
    """Benchmark the head at ``head`` against ``none`` and the alternatives (see the module docstring)."""
    from ..decoding.session import Session

    common = {"draft_policy": draft_policy}
    baselines = None if mode == "full" else list(QUICK_BASELINES)
    settings = default_settings(baselines, common=common)
    label = f"eagle3 {Path(head).name}"
    knobs: dict[str, Any] = {**common, "draft_model": str(head)}
    if draft_p_min is not None:
        knobs["draft_p_min"] = draft_p_min
    settings.append(BenchSetting(label, "eagle3", knobs))
    s = Session(target, n_ctx=4096, n_threads=n_threads)
    try:
        if mode == "full":
            n = s.model.n_layer
            spec = f"0-{n - 2}" if n >= 2 else "0"
            path = derived_draft(s.model.path, spec)
            settings.append(
                BenchSetting(f"draft {path.name}", "draft", {**common, "draft_model": str(path), "draft_p_min": 0.0})
            )
        rows = run_bench(s, kinds=kinds, repeats=repeats, max_tokens=max_tokens, settings=settings, progress=progress)
    finally:
        s.close()
    targets, verdict = check_targets(rows, label)
    text = "\n".join(
        [
            format_table(rows),
            "",
            "acceptance by draft position (accepted at depth i over drafts reaching it):",
            format_positions(rows),
            "",
            "tokens/s compared (paired speedups, medians over prompts):",
            format_comparison(rows, label),
            "",
            "targets (held-out prompts, cost policy; tokens/s depend on the machine's load, acceptance does not):",
            *verdict,
        ]
    )
    return EvalReport(rows, label, text, targets)
