"""The ring against the full sliding-window cache, side by side: decode and verify costs, interleaved.

Both contexts (``swa_full`` True and False) are made on the embedded Gemma 3 270M at ``--n-ctx``, the same
prompt (``--fill`` of the context) is evaluated in each, then one-token decodes and 8-token verifies
alternate between them, so whatever else the machine runs falls on both alike; the figures are the fastest
and the median of ``--repeats`` in ms. (``bench_memory.py`` measures the two caches one after the other,
with every strategy; on a shared machine that comparison carries the load of the moment.)

    python benchmarks/bench_ring_ab.py --n-ctx 8192
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench_memory import long_prompt

from specviz.backends.llama import LlamaContext, LlamaModel
from specviz.models.embedded import resolve_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--fill", type=float, default=0.85, help="share of the context the prompt fills")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads (1: the steadiest on a shared machine)")
    a = ap.parse_args(argv)
    model = LlamaModel(resolve_model(None))
    prompt = long_prompt(model, int(a.n_ctx * a.fill))
    n = len(prompt)
    ctxs: dict[str, LlamaContext] = {}
    for cache, full in (("full", True), ("ring", False)):
        ctx = LlamaContext(model, n_ctx=a.n_ctx, n_threads=a.threads, swa_full=full)
        t0 = time.perf_counter()
        ctx.eval_prompt(prompt, 0)
        print(f"{cache}: prompt of {n} tokens at {n / (time.perf_counter() - t0):.1f} tokens/s", flush=True)
        ctxs[cache] = ctx
    ms: dict[str, dict[int, list[float]]] = {k: {1: [], 8: []} for k in ctxs}
    for _ in range(a.repeats):
        for cache, ctx in ctxs.items():
            for batch in (1, 8):
                t0 = time.perf_counter()
                ctx.eval([prompt[-1]] * batch, n, rows="all")
                ms[cache][batch].append((time.perf_counter() - t0) * 1e3)
                ctx.memory.cut(n, prompt)
    for cache, by in ms.items():
        figs = "  ".join(
            f"{b}-token: fastest {min(v):.1f} ms, median {statistics.median(v):.1f} ms" for b, v in by.items()
        )
        print(f"{cache} at {n} positions: {figs}")
    for ctx in ctxs.values():
        ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
