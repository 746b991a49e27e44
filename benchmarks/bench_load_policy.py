"""Benchmark: drafting under load. N requests at once in one batched run (llama-server's ``-np N``), each setting
fixed against the load-aware policy, total tokens/s at each concurrency.

On the embedded Gemma 3 270M, ``--max-tokens`` tokens per request, the requests' prompts taken in turn from the
``quote``, ``code-rewrite`` and ``free`` workloads, greedy; for each concurrency ``p`` in ``--parallel``, a
:class:`~specviz.decoding.batch.BatchRun` with ``p`` slots and ``p`` requests (all start together; they finish
when they finish), under:

* ``none`` (plain decoding);
* ``ngram-simple`` (``size_n`` 3) with fixed drafts of each ``--draft-max`` length (the fixed policy);
* **load-aware**: ``ngram-simple`` under the ``cost`` policy priced with the batch (a batch-cost table measured
  once on this machine at the start: :func:`~specviz.decoding.batch_cost.measure_batch_cost`), so each request's
  draft length falls as the batch fills.

Total tokens/s is every request's generated tokens over the run's wall time (prompts included, as a server's
throughput is); each cell is the median of ``--repeats`` runs, the settings interleaved. The load-aware policy's
targets (issue 54): never more than 5% below the best fixed setting and never more than 5% below ``none`` at any
concurrency. It also checks that every batched request's greedy tokens equal the same request run alone.

Usage: python benchmarks/bench_load_policy.py [--parallel 1,2,4,8] [--draft-max 2,4,8,16] [--max-tokens 128]
       [--repeats 2] [--threads N] [--model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from specviz import Session
from specviz.analysis.workloads import WORKLOADS
from specviz.backends.llama import LlamaContext
from specviz.decoding.batch import BatchRun
from specviz.decoding.batch_cost import measure_batch_cost
from specviz.decoding.machine_load import load_average

#: The load-aware policy's margins (issue 54's targets).
BELOW_BEST, BELOW_NONE = 0.05, 0.05


def prompts(n: int) -> list[str]:
    """``n`` prompts, taken in turn from the quote, code-rewrite and free workloads."""
    kinds = [WORKLOADS["quote"], WORKLOADS["code-rewrite"], WORKLOADS["free"]]
    return [kinds[i % 3][(i // 3) % len(kinds[i % 3])] for i in range(n)]


def settings(draft_maxes: list[int]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each setting's strategy and options."""
    out: dict[str, tuple[str, dict[str, Any]]] = {"none": ("none", {})}
    for k in draft_maxes:
        out[f"ngram-simple k={k}"] = ("ngram-simple", {"size_n": 3, "draft_max": k, "draft_policy": "fixed"})
    out["load-aware"] = ("ngram-simple", {"size_n": 3, "draft_max": max(draft_maxes), "draft_policy": "cost"})
    return out


def one_run(model: Any, p: int, setting: tuple[str, dict], a: argparse.Namespace, table: Any) -> tuple[float, list]:
    """One batched run of ``p`` requests: total tokens/s and each request's tokens."""
    strategy, options = setting
    priced = table if options.get("draft_policy") == "cost" else None
    with BatchRun(model, n_parallel=p, n_ctx=p * 1024, n_threads=a.threads, batch_cost=priced) as b:
        for text in prompts(p):
            b.submit(text, a.max_tokens, strategy, **options)
        t0 = time.perf_counter()
        results = b.run()
        wall = time.perf_counter() - t0
    return sum(len(r.tokens) for r in results) / wall, [r.tokens for r in results]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", default="1,2,4,8")
    ap.add_argument("--draft-max", default="2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    parallels = [int(x) for x in a.parallel.split(",")]
    setups = settings([int(x) for x in a.draft_max.split(",")])
    with Session(a.model, n_ctx=2048, n_threads=a.threads) as s:
        model = s.model
        alone = {}
        for text in set(prompts(max(parallels))):
            s.start(text, a.max_tokens, "none")
            s.run()
            alone[text] = list(s.tokens)
        ctx = LlamaContext(model, n_ctx=max(parallels) * 512, n_seq_max=max(parallels), n_threads=a.threads)
        try:
            table = measure_batch_cost(ctx, model.tokenize(WORKLOADS["quote"][0]), sequences=sorted({1, *parallels}))
        finally:
            ctx.close()
        load_start = load_average()
        cells: dict[int, dict[str, list[float]]] = {p: {name: [] for name in setups} for p in parallels}
        mismatches = 0
        for r in range(a.repeats):
            for p in parallels:
                names = list(setups) if r % 2 == 0 else list(reversed(setups))
                for name in names:
                    rate, tokens = one_run(model, p, setups[name], a, table)
                    cells[p][name].append(rate)
                    mismatches += sum(t != alone[text] for t, text in zip(tokens, prompts(p)))
    out = report_data(cells, parallels, setups, a, mismatches, load_start, table)
    if a.json:
        print(json.dumps(out))
    else:
        report(out)
    return 0


def report_data(cells, parallels, setups, a, mismatches, load_start, table) -> dict[str, Any]:
    """The medians per cell and the targets' verdicts."""
    rows = []
    for p in parallels:
        med = {name: statistics.median(v) for name, v in cells[p].items()}
        fixed = {k: v for k, v in med.items() if k != "load-aware"}
        best = max(fixed, key=lambda k: fixed[k])
        aware = med["load-aware"]
        rows.append(
            {
                "parallel": p,
                "tokens_per_second": med,
                "best_fixed": best,
                "vs_best": aware / fixed[best] - 1.0,
                "vs_none": aware / med["none"] - 1.0,
                "meets": aware >= (1 - BELOW_BEST) * fixed[best] and aware >= (1 - BELOW_NONE) * med["none"],
            }
        )
    return {
        "max_tokens": a.max_tokens,
        "repeats": a.repeats,
        "settings": list(setups),
        "rows": rows,
        "greedy_mismatches": mismatches,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "batch_cost": table.to_dict(),
    }


def report(out: dict[str, Any]) -> None:
    """The table as text."""
    names = out["settings"]
    la = out["load_average_start"], out["load_average_end"]
    print(
        f"bench_load_policy — {out['max_tokens']} tokens a request, median of {out['repeats']}, total tokens/s; "
        f"load average {la[0][0] if la[0] else float('nan'):.2f} -> {la[1][0] if la[1] else float('nan'):.2f}"
    )
    print(f"{'p':>3} " + "".join(f"{n:>18}" for n in names) + f"{'vs best':>9}{'vs none':>9}  target")
    for r in out["rows"]:
        t = r["tokens_per_second"]
        print(
            f"{r['parallel']:>3} "
            + "".join(f"{t[n]:>18.1f}" for n in names)
            + f"{r['vs_best']:>+9.1%}{r['vs_none']:>+9.1%}  {'met' if r['meets'] else 'MISSED'}"
        )
    print(f"batched greedy tokens that differ from the request run alone: {out['greedy_mismatches']}")


if __name__ == "__main__":
    sys.exit(main())
