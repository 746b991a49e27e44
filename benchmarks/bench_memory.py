"""Memory kinds measured: the sliding-window ring against the full cache, and checkpoint costs.

Part 1, the embedded Gemma 3 270M (sliding-window layers, window 512) at each ``--contexts`` size, with
the full-size and the ring-sized sliding-window cache (``swa_full`` True / False): the cache bytes by
part (from llama.cpp's own serialisation, :mod:`specviz.backends.memory`), the process's resident
memory added by the context and the filled prompt, the prompt's evaluation speed, the fastest one-token
decode and 8-token verify at that length, and decode tokens/s of ``none`` and of the draftless
strategies (the best one named) with the prompt filling ``--fill`` of the context. Each (strategy,
repeat) run starts from the same evaluated prompt (a rewind to round 0), so the prompt is evaluated once
per cache; tokens/s are medians over ``--repeats`` runs, with the best run beside them.

Part 2, the tiny fixtures of :mod:`specviz.testing.memory_models`: a recurrent model (``mamba``: every
drafting round takes a checkpoint) and a hybrid one (``lfm2`` with ``n_rs_seq`` 2 and 16): per round, the
checkpoint's bytes and milliseconds and a restore's milliseconds and re-applied tokens, with
``prompt-lookup``, and tokens/s of ``none`` and ``prompt-lookup``, medians over ``--repeats``.

    python benchmarks/bench_memory.py                      # 4096 and 32768, 3 repeats
    python benchmarks/bench_memory.py --contexts 4096 --repeats 1 --max-tokens 32   # a quick look

The machine is shared: run it on a quiet moment, and read the medians, not single runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from specviz import Session
from specviz.analysis.workloads import WORKLOADS
from specviz.backends.llama import LlamaModel
from specviz.backends.memory import mib_text
from specviz.decoding.machine import process_memory
from specviz.models.embedded import resolve_model
from specviz.testing.memory_models import write_tiny_lfm2, write_tiny_mamba

DRAFTLESS = ("prompt-lookup", "ngram-map-k4v", "ngram-cache")
FIXTURE_PROMPT = "the cat sat on the mat and the cat sat on the mat and the"


def long_prompt(model, n_tokens: int) -> list[int]:
    """Token ids of about ``n_tokens``: the workload prompts over and over, ending with a quote prompt (so
    the answer copies from the context, as a draftless strategy needs)."""
    texts = [p for kind in ("code-rewrite", "summarise", "free", "quote") for p in WORKLOADS[kind]]
    last = model.tokenize(WORKLOADS["quote"][0], add_special=False)
    ids = [model.bos] if model.add_bos else []
    i = 0
    while True:
        nxt = model.tokenize(texts[i % len(texts)] + "\n\n", add_special=False)
        if len(ids) + len(nxt) + len(last) > n_tokens:
            break
        ids += nxt
        i += 1
    return ids + last


def bench_ring(
    model, n_ctx: int, swa_full: bool, *, fill: float, repeats: int, max_tokens: int, threads: int | None
) -> dict:
    """One (context, cache) cell of part 1 (``model`` loaded once, so the resident figures are the context's)."""
    before = process_memory()["rss_bytes"] or 0
    s = Session(model, n_ctx=n_ctx, n_threads=threads, swa_full=swa_full)
    created = process_memory()["rss_bytes"] or 0
    info = s.ctx.memory.info
    prompt = long_prompt(s.model, int(n_ctx * fill) - max_tokens - 2)
    t0 = time.perf_counter()
    s.start(prompt, max_tokens=max_tokens, strategy="none")
    prefill = time.perf_counter() - t0
    filled = process_memory()["rss_bytes"] or 0
    decode_ms, verify_ms = _step_costs(s, repeats=max(5, 3 * repeats))
    tps: dict[str, list[float]] = {k: [] for k in ("none", *DRAFTLESS)}
    for _ in range(repeats):
        for strategy in tps:
            s.rewind(round=0)
            s.configure(strategy)
            s.run()
            tps[strategy].append(s.telemetry_dict()["tokens_per_second"])
    s.close()
    med = {k: statistics.median(v) for k, v in tps.items()}
    top = {k: max(v) for k, v in tps.items()}
    best = max(DRAFTLESS, key=lambda k: med[k])
    return {
        "n_ctx": n_ctx,
        "cache": "full" if swa_full else "ring",
        "kv_bytes": info.kv_bytes,
        "swa_kv_bytes": info.swa_kv_bytes,
        "swa_cells": info.swa_cells,
        "rss_context": created - before,
        "rss_filled": filled - before,
        "prompt_tokens": len(prompt),
        "prefill_tps": len(prompt) / prefill,
        "tps": med,
        "top": top,
        "best": best,
        "decode_ms": decode_ms,
        "verify_ms": verify_ms,
    }


def _step_costs(s: Session, *, repeats: int) -> tuple[float, float]:
    """The fastest of ``repeats`` one-token decodes and 8-token verifies after the evaluated prompt, in ms
    (the fastest, not the median: on a shared machine the other processes only ever add time)."""
    ctx, n = s.ctx, s.committed
    tok = s.history[-1]
    one: list[float] = []
    eight: list[float] = []
    for _ in range(repeats):
        for batch, out in ((1, one), (8, eight)):
            t0 = time.perf_counter()
            ctx.eval([tok] * batch, n, rows="all")
            out.append((time.perf_counter() - t0) * 1e3)
            ctx.memory.cut(n, s.history)
    return min(one), min(eight)


def bench_fixture(name: str, path: Path, *, n_rs_seq: int | None, repeats: int, max_tokens: int) -> dict:
    """One fixture row of part 2."""
    s = Session(path, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1, n_rs_seq=n_rs_seq)
    runs: dict[str, list[dict]] = {"none": [], "prompt-lookup": []}
    for _ in range(repeats):
        for strategy in runs:
            knobs = {"draft_max": 6} if strategy != "none" else {}
            s.start(FIXTURE_PROMPT, max_tokens=max_tokens, strategy=strategy, **knobs)
            s.run()
            t = s.telemetry_dict()
            ck = [e for e in s.events if e.kind == "memory_checkpoint" and not e.reused]
            rb = [e for e in s.events if e.kind == "kv_rollback" and e.path in ("checkpoint", "reprefill")]
            runs[strategy].append(
                {
                    "tps": t["tokens_per_second"],
                    "rounds": t["rounds"],
                    "checkpoints": len(ck),
                    "ckpt_bytes": statistics.median([e.nbytes for e in ck]) if ck else 0,
                    "ckpt_ms": statistics.median([e.seconds * 1e3 for e in ck]) if ck else 0.0,
                    "restores": len(rb),
                    "restore_ms": statistics.median([e.seconds * 1e3 for e in rb]) if rb else 0.0,
                    "reapplied": statistics.median([e.reapplied for e in rb]) if rb else 0.0,
                    "paths": dict(t["rollback_paths"]),
                }
            )
    info = s.ctx.memory.info
    s.close()

    def med(strategy: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[strategy])

    return {
        "fixture": name,
        "kind": info.kind,
        "removal": info.removal,
        "n_rs_seq": info.n_rs_seq,
        "state_bytes": info.state_bytes,
        "none_tps": med("none", "tps"),
        "pl_tps": med("prompt-lookup", "tps"),
        "rounds": med("prompt-lookup", "rounds"),
        "checkpoints": med("prompt-lookup", "checkpoints"),
        "ckpt_bytes": med("prompt-lookup", "ckpt_bytes"),
        "ckpt_ms": med("prompt-lookup", "ckpt_ms"),
        "restores": med("prompt-lookup", "restores"),
        "restore_ms": med("prompt-lookup", "restore_ms"),
        "reapplied": med("prompt-lookup", "reapplied"),
        "paths": runs["prompt-lookup"][-1]["paths"],
    }


def _ring_row(n: int, r: dict) -> str:
    """One printed row of part 1."""

    def cell(k: str) -> str:
        mark = "*" if k == r["best"] else " "
        return f"{r['tps'][k]:>6.1f} ({r['top'][k]:>5.1f}){mark}"

    return (
        f"{n:>6} {r['cache']:>5} {mib_text(r['kv_bytes']):>13} {mib_text(r['swa_kv_bytes']):>11} "
        f"{r['swa_cells']:>9} {mib_text(r['rss_context']):>10} {mib_text(r['rss_filled']):>12} "
        f"{r['prefill_tps']:>11.1f} {r['decode_ms']:>8.1f} {r['verify_ms']:>8.1f} {cell('none'):>15} "
        + " ".join(f"{cell(k):>15}" for k in DRAFTLESS)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="4096,32768", help="context sizes of part 1 (comma list; '' skips it)")
    ap.add_argument("--fill", type=float, default=0.85, help="share of the context the prompt fills")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: every core)")
    ap.add_argument("--skip-fixtures", action="store_true")
    a = ap.parse_args(argv)
    contexts = [int(x) for x in a.contexts.split(",") if x.strip()]
    if contexts:
        print(
            f"part 1: embedded Gemma 3 270M, prompt {a.fill:.0%} of the context, {a.max_tokens} tokens, "
            f"median of {a.repeats}"
        )
        head = (
            f"{'n_ctx':>6} {'cache':>5} {'full-attn KV':>13} {'SWA KV':>11} {'SWA cells':>9} {'RSS +ctx':>10} "
            f"{'RSS +prompt':>12} {'prefill t/s':>11} {'1-tok ms':>8} {'8-tok ms':>8} {'none t/s':>15} "
            + " ".join(f"{k:>15}" for k in DRAFTLESS)
        )
        print(head)
        model = LlamaModel(resolve_model(None))
        for n in contexts:
            for full in (True, False):
                r = bench_ring(
                    model, n, full, fill=a.fill, repeats=a.repeats, max_tokens=a.max_tokens, threads=a.threads
                )
                print(_ring_row(n, r))
                sys.stdout.flush()
        print(
            "(tokens/s: median (best) over the repeats; * the best draftless strategy of the row; 1-tok / 8-tok "
            "ms: the fastest decode / verify at the prompt's length; RSS +ctx: resident memory the context "
            "added, +prompt: and with the prompt evaluated; the model's weights are loaded before)"
        )
    if not a.skip_fixtures:
        print()
        print(
            f"part 2: tiny fixtures, prompt-lookup draft_max=6, {a.max_tokens} tokens, 1 thread, median of {a.repeats}"
        )
        print(
            f"{'fixture':<16} {'removal':>7} {'n_rs_seq':>8} {'state':>8} {'none t/s':>9} {'p-l t/s':>8} "
            f"{'rounds':>6} {'ckpts':>5} {'ckpt bytes':>10} {'ckpt ms':>8} {'restores':>8} {'restore ms':>10} "
            f"{'re-applied':>10}  paths"
        )
        with tempfile.TemporaryDirectory() as d:
            fixtures = [
                ("mamba", write_tiny_mamba(Path(d) / "m.gguf", block_scale=0.02), None),
                ("lfm2 n_rs_seq=2", write_tiny_lfm2(Path(d) / "l.gguf", block_scale=0.25), 2),
                ("lfm2 n_rs_seq=16", Path(d) / "l.gguf", 16),
            ]
            for name, path, nrs in fixtures:
                r = bench_fixture(name, path, n_rs_seq=nrs, repeats=a.repeats, max_tokens=a.max_tokens)
                print(
                    f"{name:<16} {r['removal']:>7} {r['n_rs_seq']:>8} {mib_text(r['state_bytes']):>8} "
                    f"{r['none_tps']:>9.0f} {r['pl_tps']:>8.0f} {r['rounds']:>6.0f} {r['checkpoints']:>5.0f} "
                    f"{mib_text(int(r['ckpt_bytes'])):>10} {r['ckpt_ms']:>8.3f} {r['restores']:>8.0f} "
                    f"{r['restore_ms']:>10.3f} {r['reapplied']:>10.1f}  {r['paths']}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
