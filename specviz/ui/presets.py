"""Presets of the demo inspector (``make demo``): one click to a case where speculation pays, one where it
loses, and the cost policy rescuing the losing one, on the embedded model's workloads.

Figures from the benchmark tables in docs/benchmarks-strategies.md (embedded Gemma 3 270M, 2 cores): quoting a
given text with prompt lookup and 16-token drafts runs at about 3x plain decoding (every draft accepted); summarising
the minutes with the same setting loses (about 0.5x: long drafts mostly rejected); the cost policy on that
same prompt keeps its drafts short where they fail and gains instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..analysis.workloads import WORKLOADS


def demo_presets(drafts: Iterable[str | Path] = ()) -> list[dict[str, Any]]:
    """The demo's presets (the first is the setting the demo opens on). ``drafts`` (derived draft GGUFs,
    a good one then a bad one) add a draft-model case whose acceptance collapses."""
    quote, minutes = WORKLOADS["quote"][0], WORKLOADS["summarise"][0]
    out: list[dict[str, Any]] = [
        {
            "name": "quote",
            "title": "✔ Pays: quote with prompt lookup",
            "description": "the model quotes the text it was given: prompt lookup drafts 16 tokens and nearly all are "
            "accepted (about 3x plain decoding on 2 cores)",
            "prompt": quote,
            "strategy": "prompt-lookup",
            "knobs": {"draft_max": 16, "draft_policy": "fixed"},
            "max_tokens": 160,
        },
        {
            "name": "summarise-fixed",
            "title": "✘ Loses: summary with 16-token drafts",
            "description": "a summary reuses only phrases: 16-token drafts are mostly rejected and cost more than they "
            "return (about 0.5x plain decoding)",
            "prompt": minutes,
            "strategy": "prompt-lookup",
            "knobs": {"draft_max": 16, "draft_policy": "fixed"},
            "max_tokens": 160,
        },
        {
            "name": "summarise-cost",
            "title": "⚖ Cost policy on the summary",
            "description": "the same summary with draft_policy=cost: the verify cost is measured and each round's "
            "draft length maximises expected tokens/s",
            "prompt": minutes,
            "strategy": "prompt-lookup",
            "knobs": {"draft_max": 16, "draft_policy": "cost"},
            "max_tokens": 160,
        },
    ]
    drafts = [str(d) for d in drafts]
    if len(drafts) >= 2:
        out.append(
            {
                "name": "bad-draft",
                "title": "✘ A draft model that disagrees",
                "description": "a draft derived by dropping six middle layers: its acceptance collapses; the "
                "diagnosis and the advice say why and what to do",
                "prompt": quote,
                "strategy": "draft",
                "knobs": {"draft_model": drafts[1], "draft_max": 4, "draft_p_min": 0.0},
                "max_tokens": 96,
            }
        )
    return out
