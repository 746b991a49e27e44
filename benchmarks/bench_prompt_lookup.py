"""Benchmark: specviz's prompt-lookup vs llama-cpp-python's own prompt lookup decoding, on the embedded
Gemma 3 270M, same prompts and settings, side by side in one run.

Prints, per prompt and as medians over repeats:
* decode tokens/s of ``Llama(draft_model=LlamaPromptLookupDecoding(...))`` (llama-cpp-python) and of
  ``specviz.Session`` with strategy ``prompt-lookup`` (prompt processing excluded in both), with its
  defaults (verify batches rounded down to the CPU kernels' four-row tile) and with that rounding off
  (``verify_tile=1``: the very batches llama-cpp-python verifies);
* the ratios specviz / llama-cpp-python;
* the share of a specviz round spent in specviz's own Python (everything but llama_decode: drafting,
  the row scan, events, telemetry).

Usage: python benchmarks/bench_prompt_lookup.py [--repeats 3] [--max-tokens 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from specviz import Session
from specviz.analysis.workloads import WORKLOADS
from specviz.models.embedded import default_model_path

MAX_NGRAM = 2  # llama-cpp-python's LlamaPromptLookupDecoding default
NUM_PRED = 10  # llama-cpp-python's default num_pred_tokens


def bench_llama_cpp_python(llm, prompt: str, max_tokens: int) -> tuple[float, list[int]]:
    """Decode tokens/s of llama-cpp-python's generate loop (first token = end of prompt processing)."""
    toks = llm.tokenize(prompt.encode("utf-8"), add_bos=True)
    llm.reset()
    out: list[int] = []
    t_first = None
    for tok in llm.generate(toks, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        if t_first is None:
            t_first = time.perf_counter()
        out.append(tok)
        if tok == llm.token_eos() or len(out) >= max_tokens:
            break
    t_last = time.perf_counter()
    n = len(out) - 1
    return (n / (t_last - t_first) if n > 0 else 0.0), out


def bench_specviz(session: Session, prompt: str, max_tokens: int, **knobs) -> tuple[float, float, list[int]]:
    """Decode tokens/s of specviz and the share of round time outside llama_decode."""
    session.start(prompt, max_tokens, "prompt-lookup", max_ngram=MAX_NGRAM, min_ngram=1, draft_max=NUM_PRED, **knobs)
    session.ctx.decode_seconds = 0.0
    session.run()
    t = session.generation.telemetry
    overhead = (t.seconds - session.ctx.decode_seconds) / t.seconds if t.seconds else 0.0
    return t.generated / t.seconds, overhead, list(session.tokens)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--llama-defaults",
        action="store_true",
        help="construct llama-cpp-python's Llama with its own defaults (threads: half the cores for "
        "one-token decodes; flash attention off) instead of specviz's settings",
    )
    args = ap.parse_args(argv)

    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    path = str(default_model_path())
    threads = os.cpu_count() or 1
    # same settings on both sides: threads for one-token and batch decodes, flash attention, batch sizes
    same = (
        {}
        if args.llama_defaults
        else {"n_ubatch": 512, "n_threads": threads, "n_threads_batch": threads, "flash_attn": True}
    )
    llm = Llama(
        model_path=path,
        n_ctx=2048,
        n_batch=512,
        verbose=False,
        logits_all=True,
        draft_model=LlamaPromptLookupDecoding(max_ngram_size=MAX_NGRAM, num_pred_tokens=NUM_PRED),
        **same,
    )
    session = Session(path, n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=threads)
    prompts = [(k, p) for k in ("code-rewrite", "quote") for p in WORKLOADS[k]]
    rows = []
    for kind, prompt in prompts:
        lcp, sv, sv1, ovh, agree, agree1 = [], [], [], [], [], []
        for rep in range(args.repeats):
            # rotate which side runs first, so warm-cache and drift effects cancel
            runs = {}
            order = ("lcp", "sv", "sv1")[rep % 3 :] + ("lcp", "sv", "sv1")[: rep % 3]
            for side in order:
                if side == "lcp":
                    runs[side] = bench_llama_cpp_python(llm, prompt, args.max_tokens)
                elif side == "sv":
                    runs[side] = bench_specviz(session, prompt, args.max_tokens)
                else:
                    runs[side] = bench_specviz(session, prompt, args.max_tokens, verify_tile=1)
            a, ta = runs["lcp"]
            b, o, tb = runs["sv"]
            lcp.append(a)
            sv.append(b)
            sv1.append(runs["sv1"][0])
            ovh.append(o)
            agree.append(_common_prefix(ta, tb) / max(len(ta), 1))
            agree1.append(_common_prefix(ta, runs["sv1"][2]) / max(len(ta), 1))
        rows.append(
            {
                "kind": kind,
                "prompt": prompt[:40],
                "llama_cpp_python_tps": statistics.median(lcp),
                "specviz_tps": statistics.median(sv),
                "ratio": statistics.median(sv) / statistics.median(lcp),
                "specviz_untiled_tps": statistics.median(sv1),
                "untiled_ratio": statistics.median(sv1) / statistics.median(lcp),
                "python_share": statistics.median(ovh),
                "agreement": statistics.median(agree),
                "untiled_agreement": statistics.median(agree1),
            }
        )
    summary = {
        "model": path,
        "llama_cpp_python_settings": "its defaults" if args.llama_defaults else "specviz's (threads, flash attention)",
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "median_llama_cpp_python_tps": statistics.median(r["llama_cpp_python_tps"] for r in rows),
        "median_specviz_tps": statistics.median(r["specviz_tps"] for r in rows),
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "median_specviz_untiled_tps": statistics.median(r["specviz_untiled_tps"] for r in rows),
        "median_untiled_ratio": statistics.median(r["untiled_ratio"] for r in rows),
        "median_python_share": statistics.median(r["python_share"] for r in rows),
        "max_python_share": max(r["python_share"] for r in rows),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(
        f"{'kind':<13} {'prompt':<42} {'llama-cpp-python':>16} {'specviz':>9} {'ratio':>6} "
        f"{'tile off':>9} {'ratio':>6} {'py share':>8} {'same text':>9} {'(tile off)':>10}"
    )
    for r in rows:
        print(
            f"{r['kind']:<13} {r['prompt'][:40]!r:<42} {r['llama_cpp_python_tps']:>12.1f} t/s "
            f"{r['specviz_tps']:>5.1f} t/s {r['ratio']:>5.2f}x {r['specviz_untiled_tps']:>5.1f} t/s "
            f"{r['untiled_ratio']:>5.2f}x {r['python_share']:>7.1%} {r['agreement']:>8.0%} "
            f"{r['untiled_agreement']:>9.0%}"
        )
    print(f"\nllama-cpp-python settings: {summary['llama_cpp_python_settings']}")
    print(
        f"median over prompts (each a median of {args.repeats} runs): llama-cpp-python "
        f"{summary['median_llama_cpp_python_tps']:.1f} t/s, specviz {summary['median_specviz_tps']:.1f} t/s "
        f"(ratio {summary['median_ratio']:.2f}x), specviz with verify_tile=1 "
        f"{summary['median_specviz_untiled_tps']:.1f} t/s (ratio {summary['median_untiled_ratio']:.2f}x); "
        f"specviz Python share of a round: median {summary['median_python_share']:.1%}, "
        f"max {summary['max_python_share']:.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
