"""Run one prompt under several drafting strategies and print their telemetry side by side.

Each strategy gets its own :class:`specviz.Session` on one loaded model (greedy, so every strategy must
produce the target's own text; the last column says whether it did — a difference at a near-tie is
possible, see ``specviz verify``).

    python examples/compare_strategies.py [--model PATH] [--max-tokens 96]
        [--strategies none,prompt-lookup,ngram-simple,ngram-cache] [--draft-model PATH] [--prompt TEXT]

``--draft-model`` adds the ``draft`` strategy with that draft GGUF.
"""

from __future__ import annotations

import argparse

PROMPT = """import numpy as np

def mean(xs):
    return sum(xs) / len(xs)

def variance(xs):
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)

def std(xs):
"""

COLUMNS = [
    ("strategy", "{:<15}", None),
    ("rounds", "{:>7}", "rounds"),
    ("drafted", "{:>8}", "drafted"),
    ("accepted", "{:>9}", "accepted"),
    ("accept", "{:>7.0%}", "acceptance_rate"),
    ("mean len", "{:>9.2f}", "mean_accepted_length"),
    ("tok/round", "{:>10.2f}", "tokens_per_round"),
    ("draft s", "{:>8.3f}", "draft_seconds"),
    ("verify s", "{:>9.3f}", "verify_seconds"),
    ("tok/s", "{:>7.1f}", "tokens_per_second"),
]


def compare(
    model,
    prompt: str,
    strategies: list[str],
    max_tokens: int,
    n_ctx: int = 2048,
    n_threads: int | None = None,
    **knobs_by_strategy: dict,
) -> dict[str, dict]:
    """Generate ``prompt`` under each strategy; returns ``{strategy: {"telemetry": …, "text": …}}``."""
    from specviz import Session

    out = {}
    for name in strategies:
        with Session(model, n_ctx=n_ctx, n_threads=n_threads) as s:
            s.start(prompt, max_tokens=max_tokens, strategy=name, **knobs_by_strategy.get(name, {}))
            s.run()
            out[name] = {"telemetry": s.telemetry_dict(), "text": s.text, "finished": s.finished}
    return out


def table(results: dict[str, dict], reference: str | None = "none") -> str:
    """The results as a fixed-width text table (one row per strategy)."""
    head = (
        "".join(
            f"{{:{'<' if i == 0 else '>'}{len(fmt.format(*(['x'] if i == 0 else [0])))}}}".format(label)
            for i, (label, fmt, _) in enumerate(COLUMNS)
        )
        + "  same text"
    )
    lines = [head, "-" * len(head)]
    ref = results.get(reference, {}).get("text") if reference else None
    for name, r in results.items():
        t = r["telemetry"]
        cells = [fmt.format(name if key is None else t[key]) for _, fmt, key in COLUMNS]
        same = "—" if ref is None or name == reference else ("yes" if r["text"] == ref else "NO")
        lines.append("".join(cells) + f"  {same:>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run the comparison and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="target GGUF (default: the embedded Gemma 3 270M)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--strategies", default="none,prompt-lookup,ngram-simple,ngram-map-k,ngram-cache")
    ap.add_argument("--draft-model", default=None, help="also run the draft strategy with this draft GGUF")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: llama.cpp's choice)")
    a = ap.parse_args(argv)

    from specviz.backends import LlamaModel
    from specviz.models.embedded import resolve_model

    strategies = [s.strip() for s in a.strategies.split(",") if s.strip()]
    knobs = {}
    if a.draft_model:
        strategies.append("draft")
        knobs["draft"] = {"draft_model": a.draft_model}
    model = LlamaModel(resolve_model(a.model))
    try:
        results = compare(model, a.prompt, strategies, a.max_tokens, n_ctx=a.n_ctx, n_threads=a.threads, **knobs)
    finally:
        model.close()
    print(f"{len(strategies)} strategies, {a.max_tokens} tokens each, greedy\n")
    print(table(results, "none" if "none" in results else None))


if __name__ == "__main__":
    main()
