"""Benchmark: speculation under a JSON schema — each draftless strategy with and without the ``grammar``
drafter chained in front, against plain constrained decoding (``none`` under the same schema).

Prompts: JSON extraction (a person, an invoice) and tool calls (a weather lookup, a calendar event), each
with its schema, as completion prompts (the embedded model has no chat template); greedy. Per strategy:
tokens drafted and accepted over every prompt, the acceptance, the share of drafted tokens the grammar made
impossible, the forced tokens (the only token the grammar allowed there), tokens/s as the generated tokens
over the median generation time of ``--repeats`` runs per prompt (strategies interleaved within each
repeat), the speedup over ``none``, and on how many prompts the output is ``none``'s token for token (greedy
speculation is exact up to the floating-point differences between a one-row and a many-row verify batch,
which can flip a near tie). The load average is printed before and after: on a shared machine the figures
are only as quiet as it was.

The n-gram strategies run with short n-grams (:data:`KNOBS`), as a structured answer of a hundred tokens
gives llama.cpp's defaults (12-token n-grams) nothing to match; every strategy drafts at most
``--draft-max`` tokens.

Usage: python benchmarks/bench_grammar.py [--model GGUF] [--threads N] [--repeats 3] [--max-tokens 128]
       [--draft-max 8] [--strategies ngram-simple,ngram-mod,...] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from specviz import Session
from specviz.backends.llama import LlamaModel
from specviz.decoding.machine_load import load_average
from specviz.models.embedded import default_model_path

#: (name, kind, the user's message, the JSON schema of the answer)
PROMPTS: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "person",
        "extraction",
        "Extract the person from this text as JSON (name, age, city, occupation, languages).\n\n"
        "Text: Maria Lopez is a 34-year-old nurse who lives in Valencia. She speaks Spanish, Catalan and "
        "English, and has worked at the Hospital La Fe since 2015.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "city": {"type": "string"},
                "occupation": {"type": "string"},
                "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            },
            "required": ["name", "age", "city", "occupation", "languages"],
            "additionalProperties": False,
        },
    ),
    (
        "invoice",
        "extraction",
        "Extract the invoice as JSON: its number, date, customer, currency, line items (description, "
        "quantity, unit_price) and total.\n\nINVOICE No. 2024-0117, dated 12 March 2024\nBill to: Northwind "
        "Traders Ltd.\n3 x USB-C docking station at 89.90 EUR\n2 x 27-inch monitor at 249.00 EUR\n"
        "1 x wireless keyboard at 45.50 EUR\nTotal: 813.70 EUR",
        {
            "type": "object",
            "properties": {
                "invoice_number": {"type": "string"},
                "date": {"type": "string"},
                "customer": {"type": "string"},
                "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]},
                "items": {
                    "type": "array",
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "description": {"type": "string"},
                            "quantity": {"type": "integer"},
                            "unit_price": {"type": "number"},
                        },
                        "required": ["description", "quantity", "unit_price"],
                        "additionalProperties": False,
                    },
                },
                "total": {"type": "number"},
            },
            "required": ["invoice_number", "date", "customer", "currency", "items", "total"],
            "additionalProperties": False,
        },
    ),
    (
        "weather-call",
        "tool call",
        "You can call the tool get_weather(location: string, unit: 'celsius' | 'fahrenheit', days: integer). "
        'Answer with the tool call as JSON {"name": ..., "arguments": {...}}.\n\n'
        "User: What will the weather be like in Lyon, France over the next three days? Use celsius.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": ["get_weather"]},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "location": {"type": "string"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer"},
                    },
                    "required": ["location", "unit", "days"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
    ),
    (
        "calendar-call",
        "tool call",
        "You can call the tool create_event(title: string, date: string (YYYY-MM-DD), start_time: string "
        "(HH:MM), duration_minutes: integer, attendees: array of email strings). Answer with the tool call as "
        'JSON {"name": ..., "arguments": {...}}.\n\nUser: Book a 45 minute design review called "Checkout '
        'redesign" on 2024-05-21 at 14:30 with anna@example.com and li.wei@example.com.',
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": ["create_event"]},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string"},
                        "date": {"type": "string"},
                        "start_time": {"type": "string"},
                        "duration_minutes": {"type": "integer"},
                        "attendees": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                    },
                    "required": ["title", "date", "start_time", "duration_minutes", "attendees"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
    ),
]

#: The draftless strategies compared, each alone and behind the grammar drafter.
DRAFTLESS = ("ngram-simple", "ngram-map-k", "ngram-mod", "prompt-lookup", "ngram-cache")
#: Short n-grams for short structured answers (llama.cpp's defaults match 12 or 24 tokens).
KNOBS: dict[str, dict[str, Any]] = {
    "ngram-simple": {"size_n": 3},
    "ngram-map-k": {"size_n": 3},
    "ngram-mod": {"n_match": 4, "n_min": 1, "n_max": 8},
}


def strategies(draftless: list[str]) -> list[str]:
    """``none``, the grammar drafter alone, then each draftless strategy alone and with the grammar drafter."""
    return ["none", "grammar"] + [x for s in draftless for x in (s, f"grammar,{s}")]


def knobs_of(strategy: str, draft_max: int) -> dict[str, Any]:
    """The knobs a strategy (or chain) runs with: :data:`KNOBS` of its n-gram member, ``draft_max``."""
    if strategy == "none":
        return {}
    out: dict[str, Any] = {"draft_max": draft_max}
    for member in strategy.split(","):
        out.update(KNOBS.get(member, {}))
    if "size_n" in out:
        out["size_m"] = draft_max
    return out


def one_run(session: Session, prompt: tuple, strategy: str, args: argparse.Namespace) -> dict[str, Any]:
    """One greedy generation of ``prompt`` under its schema with ``strategy``: its tokens and figures."""
    _, _, text, schema = prompt
    session.start(
        text + "\n\nAnswer (JSON):",
        max_tokens=args.max_tokens,
        strategy=strategy,
        json_schema=schema,
        **knobs_of(strategy, args.draft_max),
    )
    session.run()
    t = session.telemetry_dict()
    return {
        "tokens": list(session.tokens),
        "seconds": t["seconds"],
        "drafted": t["drafted"],
        "accepted": t["accepted"],
        "generated": t["n_generated"],
        "forced": t["forced"],
        "impossible": t["grammar_impossible"],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every strategy on every prompt, ``args.repeats`` times (interleaved), summed per strategy."""
    model = LlamaModel(args.model or default_model_path())
    session = Session(model, n_ctx=2048, n_threads=args.threads)
    names = strategies(args.strategies)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    one_run(session, PROMPTS[0], "grammar", args)  # warm-up: the vocabulary's index, the caches
    for _ in range(args.repeats):
        for p in PROMPTS:
            for s in names:
                runs.setdefault((p[0], s), []).append(one_run(session, p, s, args))
    rows = []
    for s in names:
        per = [runs[(p[0], s)] for p in PROMPTS]
        seconds = sum(statistics.median(r["seconds"] for r in rs) for rs in per)
        drafted, accepted = sum(rs[0]["drafted"] for rs in per), sum(rs[0]["accepted"] for rs in per)
        generated = sum(rs[0]["generated"] for rs in per)
        same = sum(rs[0]["tokens"] == runs[(p[0], "none")][0]["tokens"] for rs, p in zip(per, PROMPTS))
        rows.append(
            {
                "strategy": s,
                "drafted": drafted,
                "accepted": accepted,
                "acceptance": accepted / drafted if drafted else None,
                "forced": sum(rs[0]["forced"] for rs in per),
                "impossible": sum(rs[0]["impossible"] for rs in per),
                "generated": generated,
                "seconds": seconds,
                "tokens_per_second": generated / seconds if seconds else 0.0,
                "prompts_as_none": same,
            }
        )
    base = rows[0]["tokens_per_second"]
    for r in rows:
        r["speedup"] = r["tokens_per_second"] / base if base else None
    return {"model": Path(args.model or default_model_path()).name, "rows": rows, "n_threads": session.ctx.n_threads}


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as an aligned text table."""
    head = (
        f"{'strategy':<26} {'drafted':>7} {'accepted':>8} {'accept':>6} {'impossible':>10} {'forced':>6} "
        f"{'tok/s':>7} {'speedup':>7} {'as none':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        acc = "—" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
        imp = "—" if not r["drafted"] else f"{r['impossible'] / r['drafted']:.0%}"
        lines.append(
            f"{r['strategy']:<26} {r['drafted']:>7} {r['accepted']:>8} {acc:>6} {imp:>10} {r['forced']:>6} "
            f"{r['tokens_per_second']:>7.1f} {r['speedup']:>6.2f}x {r['prompts_as_none']:>3}/{len(PROMPTS)}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="a GGUF (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: every core)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--strategies", type=lambda v: [s for s in v.split(",") if s], default=list(DRAFTLESS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    before = load_average()
    out = measure(args)
    out.update(
        load_before=before,
        load_after=load_average(),
        repeats=args.repeats,
        max_tokens=args.max_tokens,
        draft_max=args.draft_max,
        prompts=[{"name": p[0], "kind": p[1]} for p in PROMPTS],
    )
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"{out['model']}, {out['n_threads']} threads, {len(PROMPTS)} prompts under their schemas, greedy, up to "
        f"{args.max_tokens} tokens, draft_max {args.draft_max}; median of {args.repeats} runs"
    )
    print(table(out["rows"]))
    print(f"load average before {before}, after {out['load_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
