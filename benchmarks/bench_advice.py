"""Benchmark: is the advisor right? Run a setting, ask specviz.analysis.advise, run the advised setting, compare.

On the embedded Gemma 3 270M, for the prompts of one workload kind:

1. run the starting setting (default: prompt lookup, 16-token drafts, the fixed policy) on every prompt;
2. measure the verify-cost curve once (as the cost policy does) and ask :func:`specviz.analysis.advise.advise` for
   the best draft_max / draft_min / draft_p_min from those rounds;
3. run plain decoding (``none``), the starting setting and the advised setting on the same prompts,
   ``--repeats`` times, interleaved (so the three share the machine's load);
4. print, for the starting and the advised setting, the expected tokens/s and speedup (the advisor's
   replay) beside the measured ones (generated tokens over decode seconds, pooled over the prompts).

Usage: python benchmarks/bench_advice.py [--kind summarise] [--strategy prompt-lookup] [--draft-max 16]
       [--max-tokens 128] [--prompts 4] [--repeats 2] [--model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from specviz import Session
from specviz.analysis.advise import advise, session_cost
from specviz.analysis.workloads import WORKLOADS


def run_once(s: Session, prompts: list[str], max_tokens: int, strategy: str, knobs: dict) -> tuple[list, float, int]:
    """Every prompt once: the events of all, the decode seconds and the generated tokens, pooled."""
    events, seconds, generated = [], 0.0, 0
    for p in prompts:
        s.start(p, max_tokens, strategy, **knobs)
        s.run()
        events += list(s.events)
        t = s.telemetry_dict()
        seconds += t["seconds"]
        generated += t["n_generated"]
    return events, seconds, generated


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="summarise", choices=list(WORKLOADS))
    ap.add_argument("--strategy", default="prompt-lookup")
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    prompts = WORKLOADS[a.kind][: a.prompts]
    s = Session(a.model, n_ctx=4096)
    start_knobs = {"draft_max": a.draft_max, "draft_policy": "fixed"}
    events, _, _ = run_once(s, prompts, a.max_tokens, a.strategy, start_knobs)
    cost = session_cost(s)
    adv = advise(events, cost=cost, scale_to_rounds=True)
    if adv.best is None:
        print("no drafting round to learn from", file=sys.stderr)
        return 1
    b = adv.best
    advised_knobs = dict(start_knobs, draft_max=max(b.draft_max, 1), draft_min=b.draft_min)
    if b.draft_p_min is not None:
        advised_knobs["draft_p_min"] = b.draft_p_min
    advised_strategy = b.strategy if b.strategy != "none" else "none"
    if advised_strategy == "none":
        advised_knobs = {}
    runs = {"none": ("none", {}), "start": (a.strategy, start_knobs), "advised": (advised_strategy, advised_knobs)}
    pooled = {k: [0.0, 0] for k in runs}
    for _ in range(a.repeats):
        for name, (strategy, knobs) in runs.items():
            _, secs, gen = run_once(s, prompts, a.max_tokens, strategy, knobs)
            pooled[name][0] += secs
            pooled[name][1] += gen
    measured = {k: (g / t if t else 0.0) for k, (t, g) in pooled.items()}
    cur = adv.current.get(a.strategy)
    out = {
        "model": str(s.model.path),
        "kind": a.kind,
        "prompts": len(prompts),
        "repeats": a.repeats,
        "max_tokens": a.max_tokens,
        "start": {"strategy": a.strategy, **start_knobs},
        "advised": {"strategy": advised_strategy, **advised_knobs},
        "llama_cpp_flags": adv.flags,
        "expected": {
            "plain": adv.baseline_tokens_per_second,
            "start": cur.tokens_per_second if cur else None,
            "advised": b.tokens_per_second,
        },
        "measured": measured,
        "expected_speedup": {"start": cur.speedup if cur else None, "advised": b.speedup},
        "measured_speedup": {
            k: measured[k] / measured["none"] if measured["none"] else None for k in ("start", "advised")
        },
    }
    s.close()
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"bench_advice — {a.kind}, {len(prompts)} prompts, {a.max_tokens} tokens, {a.repeats} repeats")
    print(f"advice: {adv.text}")
    print(f"llama-server: {adv.flags}")
    print(f"{'setting':<44} {'expected t/s':>12} {'measured t/s':>12} {'exp. speedup':>12} {'meas. speedup':>13}")
    e, ms, es = out["expected"], out["measured_speedup"], out["expected_speedup"]
    rows = [
        ("none (plain decoding)", e["plain"], measured["none"], 1.0, 1.0),
        (f"start: {a.strategy} {start_knobs}", e["start"], measured["start"], es["start"], ms["start"]),
        (
            f"advised: {advised_strategy} {advised_knobs}",
            e["advised"],
            measured["advised"],
            es["advised"],
            ms["advised"],
        ),
    ]
    for label, exp, meas, esp, msp in rows:

        def f(x, d=1):
            return "—" if x is None else f"{x:.{d}f}"

        print(f"{label[:44]:<44} {f(exp):>12} {f(meas):>12} {f(esp, 2) + 'x':>12} {f(msp, 2) + 'x':>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
