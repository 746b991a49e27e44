"""Benchmark: what one verify batch of b tokens costs the embedded Gemma 3 270M, b = 1…N.

A verify batch asks logits for every row, as a speculative round does. Sizes are timed in a shuffled
order, ``--repeats`` times each, and the median is printed with the cost per token. On a CPU the
figures show the verify tile: batches whose size is a multiple of 4 are cheaper per token than their
neighbours (llama.cpp's kernels for quantised weights multiply four rows at a time).

Usage: python benchmarks/bench_verify_cost.py [--max-batch 33] [--repeats 9] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

from specviz.backends.llama import LlamaContext, LlamaModel
from specviz.models.embedded import default_model_path

CONTEXT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 8


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-batch", type=int, default=33)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    model = LlamaModel(default_model_path())
    ctx = LlamaContext(model, n_ctx=1024, n_threads=os.cpu_count() or 1)
    toks = model.tokenize(CONTEXT)
    base = 128
    ctx.eval_prompt(toks[:base])
    sizes = list(range(1, args.max_batch + 1))
    times: dict[int, list[float]] = {b: [] for b in sizes}
    rng = random.Random(0)
    for _ in range(args.repeats):
        order = sizes[:]
        rng.shuffle(order)
        for b in order:
            ctx.truncate(base)
            t = time.perf_counter()
            ctx.eval(toks[base : base + b], base, rows="all")
            times[b].append(time.perf_counter() - t)
    rows = [
        {
            "batch": b,
            "median_ms": statistics.median(times[b]) * 1e3,
            "per_token_ms": statistics.median(times[b]) * 1e3 / b,
        }
        for b in sizes
    ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"verify cost on {default_model_path().name}, {os.cpu_count()} threads, median of {args.repeats}")
    print(f"{'batch':>5} {'ms':>8} {'ms/token':>9}")
    for r in rows:
        mark = "  <- multiple of 4" if r["batch"] % 4 == 0 else ""
        print(f"{r['batch']:>5} {r['median_ms']:>8.1f} {r['per_token_ms']:>9.2f}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
