"""Benchmark: does llama-server get the speedup specviz's advice predicts? Advice learnt in specviz, measured
in the server it is for, on held-out prompts.

On the embedded Gemma 3 270M, per workload kind (grounded: ``code-rewrite``, ``quote``, ``summarise``; and
``free``):

1. run the starting setting (default: llama.cpp's ``ngram-simple`` with ``size_n 3``, drafts of up to 16,
   the fixed policy) on the *learning* prompts of the kind (``--learn``, default the first two);
2. measure the verify-cost curve (as the cost policy does) and ask
   :func:`specviz.analysis.advise.advise` for the best setting llama-server's flags express (``for_server``)
   from those rounds: the advised flags, and the advice's own prediction (``learnt``);
3. run the starting setting on the *held-out* prompts (the others) in specviz too, and score the advised
   flags on those rounds (:func:`specviz.analysis.advise.predict`): the prediction for the held-out
   prompts, made before any server starts and from specviz's rounds alone;
4. run the held-out prompts through two llama-servers built from the vendored llama.cpp —
   ``--spec-type none`` and the advised flags, the same context (``-c 4096 -b 512 -ub 512 -t T -np 1
   --swa-full``) —
   ``--repeats`` times, alternating which server goes first
   (:func:`specviz.analysis.check_server.check_advice`);
5. print per kind both predictions, each with its bootstrap interval over the rounds it is from, beside the
   server's measured speedup (its own ``predicted_n`` over ``predicted_ms``, pooled over the prompts, the
   median over the repeats), every repeat's speedup and the server's ``draft_n`` / ``draft_n_accepted``.

The advisor says speculation pays only where the lower end of the best setting's interval clears plain
decoding (:mod:`specviz.analysis.uncertainty`); where it does not, the advice is ``--spec-type none`` and
the table names the setting it declined, its gain and interval. Then both servers run ``--spec-type
none``, and their ratio shows the measurement's own spread. The load average is printed at the start and
the end.

The recordings are made by a session configured from the servers' own command line
(:func:`specviz.analysis.server_args.parse_server_args`): the same context, ``--swa-full``, and the
server's prompt layout (``prefill="whole"``: the whole prompt in one prefill, the first token from its last
row). With specviz's default layout (the last prompt token evaluated on its own, as speculative-simple)
the greedy text parted from the server's at near-ties on 3 of 4 ``summarise`` prompts, and the prediction
was made for text the server never generated.

Why two predictions. The flags are chosen on the learning prompts only, so the held-out prompts check
advice that never saw them, as a user's advice from one recording meets later requests of the same kind.
But the speedup a setting gets depends on how much of the text it can copy, and that is a property of the
text, not of the advisor: a prediction for the learning prompts, compared with a server generating other
text, measures the difference between the prompts as much as the advisor (on ``free``, the held-out
answers repeat themselves more than the learning ones). The target compares the server with specviz's
prediction for the text the server generates, as ``specviz advise --check-server`` does for a user (the
recording's own prompts): the advised flags scored on specviz's rounds of the held-out prompts. The
learnt figure, and how far the server is from it, are printed beside it: that is how far the advice
carries to prompts it was not learnt on.

Targets (issue 25): measured within 10% of predicted (for the held-out prompts), and never below
``--spec-type none`` when the advice says speculation pays. The machine is shared: run it at a quiet
moment; the per-repeat figures show how much the load moved.

Usage: python benchmarks/bench_server_advice.py [--kinds code-rewrite,quote,summarise,free]
       [--strategy ngram-simple] [--size-n 3] [--draft-max 16] [--max-tokens 128] [--learn 0,1]
       [--repeats 3] [--threads 2] [--model PATH] [--server-binary PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from specviz import Session
from specviz.analysis.advise import advise, predict, session_cost
from specviz.analysis.check_server import check_advice, context_args
from specviz.analysis.llama_server import find_server_binary
from specviz.analysis.server_args import parse_server_args
from specviz.analysis.workloads import WORKLOADS
from specviz.backends.context_settings import ContextSettings


def record(s: Session, prompts: list[str], max_tokens: int, strategy: str, knobs: dict) -> list:
    """Every prompt once with the starting setting; the events of all."""
    events: list = []
    for p in prompts:
        s.start(p, max_tokens, strategy, **knobs)
        s.run()
        events += list(s.events)
    return events


def interval(c) -> str:
    """`` (1.20-1.36x)`` for a candidate with an interval, else ``""``."""
    return f" ({c.interval_text()})" if c is not None and c.interval_text() else ""


def load() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="code-rewrite,quote,summarise,free")
    ap.add_argument("--strategy", default="ngram-simple")
    ap.add_argument("--size-n", type=int, default=3, help="size_n of an ngram-simple / ngram-map start")
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--learn", default="0,1", help="indices of the learning prompts of each kind")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--model", default=None)
    ap.add_argument("--server-binary", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    binary = find_server_binary(a.server_binary)
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    learn_idx = [int(i) for i in a.learn.split(",") if i.strip()]
    settings = ContextSettings.make(n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=a.threads)
    # specviz's session as the servers run: their context, their cache and their prompt layout (the whole
    # prompt in one prefill), so that its recording of a prompt is the text the servers generate
    s = Session(a.model, **parse_server_args(context_args(settings)).session_kwargs())
    start = {"draft_max": a.draft_max, "draft_policy": "fixed"}
    if a.strategy in ("ngram-simple", "ngram-map-k", "ngram-map-k4v"):
        start.update(size_n=a.size_n, size_m=a.draft_max)
    rows = []
    load_start = load()
    for kind in kinds:
        prompts = WORKLOADS[kind]
        learning = [prompts[i] for i in learn_idx if i < len(prompts)]
        held_out = [p for i, p in enumerate(prompts) if i not in learn_idx]
        events = record(s, learning, a.max_tokens, a.strategy, start)
        adv = advise(events, cost=session_cost(s), scale_to_rounds=True, for_server=True)
        if adv.best is None:
            print(f"{kind}: no drafting round to learn from", file=sys.stderr)
            continue
        # the prediction for the prompts the servers are sent: the advised flags on specviz's own rounds of
        # them (the starting setting, as for the learning prompts), before any server starts
        held_events = record(s, held_out, a.max_tokens, a.strategy, start)
        pred = predict(adv, held_events, cost=session_cost(s), scale_to_rounds=True)
        if pred is None:
            print(f"{kind}: the held-out prompts gave no rounds to predict the advice on", file=sys.stderr)
            continue
        if not a.json:
            print(
                f"{kind}: {adv.text}\n  why: {adv.reason}\n  flags: {adv.flags}\n  on the held-out prompts: "
                f"{pred.speedup:.2f}x expected{interval(pred)}",
                file=sys.stderr,
            )
        chk = check_advice(
            adv,
            held_out,
            s.model.path,
            settings=settings,
            max_tokens=a.max_tokens,
            repeats=a.repeats,
            binary=binary,
            progress=None if a.json else (lambda m, k=kind: print(f"  {k} {m}", file=sys.stderr)),
            predicted=pred.speedup,
        )
        pays = adv.pays
        d = adv.declined
        rows.append(
            {
                "kind": kind,
                "advice": adv.text,
                "reason": adv.reason,
                "flags": adv.flags,
                "pays": pays,
                "learnt": adv.best.speedup,
                "learnt_interval": [adv.best.speedup_low, adv.best.speedup_high],
                "declined": None if d is None else {"label": adv.declined_label, **d.to_dict()},
                "declined_text": ""
                if d is None
                else f"{adv.declined_label} max {d.draft_max} at {d.speedup:.2f}x{interval(d)}",
                "learnt_text": f"{adv.best.speedup:.2f}x{interval(adv.best)}",
                "predicted": chk.predicted_speedup,
                "predicted_interval": [pred.speedup_low, pred.speedup_high],
                "predicted_text": f"{pred.speedup:.2f}x{interval(pred)}",
                "measured": chk.measured_speedup,
                "error": chk.error,
                "error_vs_learnt": chk.measured_speedup / adv.best.speedup - 1.0,
                "speedups": chk.speedups,
                "within_10pct": abs(chk.error) <= 0.10,
                "not_below_none": (not pays) or min(chk.speedups) >= 1.0,
                "rows": chk.rows(),
            }
        )
    s.close()
    if a.json:
        print(
            json.dumps(
                {
                    "max_tokens": a.max_tokens,
                    "repeats": a.repeats,
                    "threads": a.threads,
                    "load_start": load_start,
                    "load_end": load(),
                    "rows": rows,
                }
            )
        )
        return 0
    print(
        f"bench_server_advice — {a.max_tokens} tokens, {a.repeats} repeats, {a.threads} threads, start "
        f"{a.strategy} {start}; learning prompts {learn_idx}, the others held out; learnt: the advice's own "
        "prediction (learning prompts), predicted: for the held-out prompts the servers run; intervals: 90% "
        f"bootstrap over the rounds; load average at the start {load_start}"
    )
    print(
        "| kind | advised flags | declined (not shown to pay) | learnt (vs measured) | predicted | measured (median) "
        "| per repeat | none t/s | advised t/s | draft_n | accepted | within 10% | >= none |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        none, adv_row = r["rows"]
        print(
            f"| {r['kind']} | `{r['flags']}` | {r['declined_text'] or '-'} | {r['learnt_text']} "
            f"({r['error_vs_learnt']:+.0%}) | {r['predicted_text']} | {r['measured']:.2f}x | "
            + ", ".join(f"{x:.2f}" for x in r["speedups"])
            + f" | {none['server_tokens_per_second']:.1f} | {adv_row['server_tokens_per_second']:.1f} | "
            f"{adv_row['draft_n']:.0f} | {adv_row['draft_n_accepted']:.0f} | "
            f"{'yes' if r['within_10pct'] else 'no'} ({r['error']:+.0%}) | {'yes' if r['not_below_none'] else 'no'} |"
        )
    print(f"load average at the end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
