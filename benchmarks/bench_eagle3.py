"""Benchmark: what an EAGLE-3 draft step costs next to the target's one-token decode, on the embedded Gemma 3
270M, and what reading the target's layer inputs (the capture shim) costs a plain decode.

Heads are random, of a realistic shape for Gemma 3 270M (width 640, 4 heads, 1 KV head, feed-forward
2048, borrowing the target's token embeddings) with draft vocabularies of 8k, 16k and 32k tokens, their
matrices stored as f32 and as Q8_0 (a one-token step on a CPU reads every weight once).
A *draft step* is one ``(token, g)`` pair through the head with its logits kept (llama.cpp scatters the
draft vocabulary into a 262144-entry row), plus specviz's greedy choice over the head's ids. The *encoder*
is ``fc`` over one row of three captured layer inputs.

Capture overhead compares, on the same target context settings, a one-token and an 8-token decode:
``off`` (no eval callback), ``shim idle`` (the C shim installed and switched off — what every Gemma 3
context carries), ``shim armed`` (three layers copied out, as while ``eagle3`` drafts, features read
back), and for reference ``python cb`` (a ctypes Python callback that declines every node). Variants are
timed round-robin so drift hits them alike; medians are printed.

*A generation the head does not draft in* (issue 26): ``eagle3`` with the ``cost`` policy against ``none``
on the ``free`` prompts (128 tokens, greedy), with a head that drafts nothing worth verifying (a random one
of the trained head's shape, or ``--generation-head HEAD.gguf``). The policy keeps
the rounds plain and the head pauses; what is left over ``none`` is what keeping the head ready costs.
Two ``eagle3`` variants: ``capture held`` (the default: the capture is held while the policy promises more
plain rounds than the resume window) and ``capture kept`` (``hold_when_promised`` off: every batch read).
Per round: the whole round, the target's decodes in it, and the rest (the head's resumes and probes,
specviz's Python); ``vs none`` is the median over prompts of each prompt's median tokens-per-second ratio,
the three variants run back to back in each repeat. ``--generation-repeats 0`` skips it.

Usage: python benchmarks/bench_eagle3.py [--repeats 41] [--vocab 8192,16384,32768] [--dtype f32,q8_0]
           [--generation-repeats 3] [--generation-head HEAD.gguf] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specviz import Session
from specviz.analysis.workloads import WORKLOADS
from specviz.backends.capture import LayerCapture
from specviz.backends.eagle3 import Eagle3Context
from specviz.backends.llama import LlamaContext, LlamaModel
from specviz.models.eagle3_gguf import Eagle3HeadConfig, default_target_layers, random_eagle3_weights, write_eagle3_head
from specviz.models.embedded import default_model_path

CONTEXT = "The history of the lighthouse begins in antiquity, when fires burned on hilltops to guide ships. " * 4


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def head_config(model: LlamaModel, rng: np.random.Generator, n_draft_vocab: int, n_ff: int) -> Eagle3HeadConfig:
    """A head of the target's width (4 heads, 1 KV head) with ``n_draft_vocab`` target ids drawn by ``rng``."""
    d2t = tuple(int(x) for x in np.sort(rng.choice(model.n_vocab, size=n_draft_vocab, replace=False)))
    return Eagle3HeadConfig(
        n_embd=model.n_embd,
        n_head=4,
        n_head_kv=1,
        n_ff=n_ff,
        target_hidden=model.n_embd,
        target_layers=default_target_layers(model.n_layer),
        d2t=d2t,
        n_vocab=model.n_vocab,
    )


def _python_callback_context(model: LlamaModel, n_threads: int):
    """A target context whose eval callback is a ctypes Python function declining every node."""
    import llama_cpp.llama_cpp as lc

    @lc.ggml_backend_sched_eval_callback
    def decline(t, ask, user_data):  # noqa: ARG001 - signature fixed by ggml
        return not ask

    return LlamaContext(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=n_threads, eval_callback=decline)


def capture_overhead(model: LlamaModel, toks: list[int], repeats: int, n_threads: int) -> list[dict]:
    off = LlamaContext(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=n_threads, capture=False)
    idle = LlamaContext(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=n_threads)
    armed = LlamaContext(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=n_threads)
    pycb = _python_callback_context(model, n_threads)
    if idle.tap is None or armed.tap is None:
        raise SystemExit("the capture shim is not available (no C compiler?); run make install")
    cap = LayerCapture(armed, default_target_layers(model.n_layer))
    variants = {"off": off, "shim idle": idle, "shim armed": armed, "python cb": pycb}
    base = 48
    for ctx in variants.values():
        ctx.eval(toks[:base], 0, rows="none")
    out = []
    for n in (1, 8):
        times: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(repeats + 2):
            for name, ctx in variants.items():
                ctx.truncate(base)
                t = time.perf_counter()
                ctx.eval(toks[base : base + n], base, rows="all")
                if ctx is armed:
                    cap.features(n)
                if r >= 2:  # two warm-up rounds
                    times[name].append(time.perf_counter() - t)
        for name in variants:  # per-repeat ratios against "off", timed back to back
            ratio = statistics.median(x / y for x, y in zip(times[name], times["off"]))
            out.append({"batch": n, "variant": name, "ms": _median_ms(times[name]), "overhead_pct": 100 * (ratio - 1)})
    cap.close()
    for ctx in variants.values():
        ctx.close()
    return out


def draft_step_cost(
    model: LlamaModel,
    toks: list[int],
    vocab_sizes: list[int],
    dtypes: list[str],
    repeats: int,
    n_threads: int,
    folder: Path,
) -> list[dict]:
    """Every head's step and encoder, and the target's one-token decode, timed in the same loop (each repeat
    times them all back to back), so that machine drift hits them alike; ratios are medians of per-repeat
    ratios."""
    target = LlamaContext(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=n_threads)
    base = 48
    target.eval(toks[:base], 0, rows="last")
    rng = np.random.default_rng(0)
    heads = []
    for nv, dtype in [(nv, dt) for nv in vocab_sizes for dt in dtypes]:
        cfg = head_config(model, rng, nv, n_ff=2048)
        path = write_eagle3_head(
            folder / f"head-{nv}-{dtype}.gguf", default_model_path(), cfg, random_eagle3_weights(cfg), dtype=dtype
        )
        head = LlamaModel(path)
        e = Eagle3Context(head, target, n_threads=n_threads)
        g = rng.standard_normal((base, model.n_embd)).astype(np.float32)
        e.decode(toks[1 : base + 1], g, 0)
        heads.append(
            {
                "vocab": nv,
                "dtype": dtype,
                "model": head,
                "ctx": e,
                "ids": np.asarray(cfg.d2t, dtype=np.int64),
                "g": g,
                "t": {"step": [], "choose": [], "enc1": [], "enc8": []},
            }
        )
    feats = rng.standard_normal((8, 3 * model.n_embd)).astype(np.float32)
    t_target: list[float] = []
    for r in range(repeats + 2):
        target.truncate(base)
        t = time.perf_counter()
        target.eval([toks[base]], base, rows="all")
        if r >= 2:
            t_target.append(time.perf_counter() - t)
        for hd in heads:
            e, ids = hd["ctx"], hd["ids"]
            e.truncate(base)
            t = time.perf_counter()
            e.decode([toks[base]], hd["g"][:1], base, outputs=[0])
            t1 = time.perf_counter()
            sub = e.logits(0)[ids]
            int(ids[int(np.argmax(sub))])
            e.prenorm(0)
            t2 = time.perf_counter()
            e.encode(feats[:1])
            t3 = time.perf_counter()
            e.encode(feats)
            t4 = time.perf_counter()
            if r >= 2:
                for k, v in (("step", t1 - t), ("choose", t2 - t), ("enc1", t3 - t2), ("enc8", t4 - t3)):
                    hd["t"][k].append(v)
    target_ms = _median_ms(t_target)
    rows = [
        {
            "what": "target one-token decode",
            "draft_vocab": None,
            "dtype": "Q4_K_M",
            "ms": target_ms,
            "of_target_pct": 100.0,
        }
    ]
    for hd in heads:
        for key, what in (
            ("step", "head draft step (decode)"),
            ("choose", "head draft step + greedy choice"),
            ("enc1", "encoder, 1 row"),
            ("enc8", "encoder, 8 rows"),
        ):
            xs = hd["t"][key]
            ratio = statistics.median(x / y for x, y in zip(xs, t_target))
            rows.append(
                {
                    "what": what,
                    "draft_vocab": hd["vocab"],
                    "dtype": hd["dtype"],
                    "ms": _median_ms(xs),
                    "of_target_pct": 100 * ratio,
                }
            )
        hd["ctx"].close()
        hd["model"].close()
    target.close()
    return rows


def random_trained_shape_head(model: LlamaModel, path: Path) -> Path:
    """A random head of the trained head's shape (``specviz train-eagle3``'s: feed-forward 1536; the 6,152
    draft tokens its default run chose here), Q8_0: it drafts nothing the target accepts."""
    cfg = head_config(model, np.random.default_rng(0), 6152, n_ff=1536)
    return write_eagle3_head(path, default_model_path(), cfg, random_eagle3_weights(cfg), dtype="q8_0")


GENERATION_VARIANTS = ("none", "capture held", "capture kept")


def paused_generation(model: LlamaModel, head: Path, repeats: int, n_threads: int, n_tokens: int = 128) -> list[dict]:
    """``none`` and ``eagle3`` (cost policy, capture held or kept) on each ``free`` prompt, back to back."""
    s = Session(model, n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=n_threads)
    knobs = {"draft_model": str(head), "draft_policy": "cost", "align": True}
    runs: dict[tuple[int, str], list[dict]] = {}
    try:
        s.start(WORKLOADS["free"][0], 16, "eagle3", **knobs)  # warm-up; measures the verify cost once
        s.run()
        for _ in range(repeats):
            for i, prompt in enumerate(WORKLOADS["free"]):
                for variant in GENERATION_VARIANTS:
                    if variant == "none":
                        s.start(prompt, n_tokens, "none")
                    else:
                        s.start(prompt, n_tokens, "eagle3", **knobs)
                        s.drafter.hold_when_promised = variant == "capture held"
                    d0 = s.ctx.decode_seconds
                    t0 = time.perf_counter()
                    rounds = s.run()
                    wall = time.perf_counter() - t0
                    t = s.telemetry_dict()
                    runs.setdefault((i, variant), []).append(
                        {
                            "rounds": len(rounds),
                            "tokens": len(s.tokens),
                            "seconds": wall,
                            "decode_seconds": s.ctx.decode_seconds - d0,
                            "drafted": t["drafted"],
                            "held_rounds": t.get("upkeep", {}).get("held_rounds", 0),
                        }
                    )
    finally:
        s.close()
    out = []
    prompts = range(len(WORKLOADS["free"]))
    for variant in GENERATION_VARIANTS:
        rs = [r for i in prompts for r in runs[(i, variant)]]
        ratios = [
            statistics.median(
                (r["tokens"] / r["seconds"]) / (n["tokens"] / n["seconds"])
                for r, n in zip(runs[(i, variant)], runs[(i, "none")])
            )
            for i in prompts
        ]
        out.append(
            {
                "variant": variant,
                "round_ms": statistics.median(1e3 * r["seconds"] / r["rounds"] for r in rs),
                "decode_ms": statistics.median(1e3 * r["decode_seconds"] / r["rounds"] for r in rs),
                "rest_ms": statistics.median(1e3 * (r["seconds"] - r["decode_seconds"]) / r["rounds"] for r in rs),
                "held_share": sum(r["held_rounds"] for r in rs) / sum(r["rounds"] for r in rs),
                "drafted": sum(r["drafted"] for r in rs),
                "vs_none": statistics.median(ratios),
                "vs_none_lowest": min(ratios),
            }
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--vocab", default="8192,16384,32768")
    ap.add_argument("--dtype", default="f32,q8_0", help="storage of the heads' matrices: f32, f16, q8_0")
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads per context (1 avoids llama.cpp's thread barriers stalling on a busy machine)",
    )
    ap.add_argument("--generation-repeats", type=int, default=3, help="0: skip the generation comparison")
    ap.add_argument("--generation-head", default="", help="a trained head for it (default: a random one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    vocab_sizes = [int(x) for x in args.vocab.split(",")]
    model = LlamaModel(default_model_path())
    toks = model.tokenize(CONTEXT)
    with tempfile.TemporaryDirectory() as d:
        steps = draft_step_cost(model, toks, vocab_sizes, args.dtype.split(","), args.repeats, args.threads, Path(d))
        overhead = capture_overhead(model, toks, args.repeats, args.threads)
        generation: list[dict] = []
        if args.generation_repeats > 0:
            head = Path(args.generation_head) if args.generation_head else None
            head = head or random_trained_shape_head(model, Path(d) / "head-6152-q8_0.gguf")
            generation = paused_generation(model, head, args.generation_repeats, args.threads)
    if args.json:
        print(
            json.dumps(
                {
                    "threads": args.threads,
                    "repeats": args.repeats,
                    "draft": steps,
                    "capture": overhead,
                    "generation": generation,
                }
            )
        )
        return 0
    print(f"EAGLE-3 on {default_model_path().name}: {args.threads} threads, median of {args.repeats}")
    print(f"{'':34} {'draft vocab':>11} {'weights':>8} {'ms':>8} {'% of target':>12}")
    for r in steps:
        nv = "" if r["draft_vocab"] is None else str(r["draft_vocab"])
        print(f"{r['what']:34} {nv:>11} {r['dtype']:>8} {r['ms']:>8.2f} {r['of_target_pct']:>11.1f}%")
    print()
    print("capture overhead on a plain decode (target context, 3 layers for the armed shim)")
    print(f"{'batch':>5} {'variant':>12} {'ms':>8} {'vs off':>8}")
    for r in overhead:
        print(f"{r['batch']:>5} {r['variant']:>12} {r['ms']:>8.2f} {r['overhead_pct']:>+7.1f}%")
    if generation:
        print()
        print(
            f"a generation the head does not draft in: eagle3 (cost policy) against none, the free prompts, "
            f"128 tokens, median of {args.generation_repeats} per prompt"
        )
        print(
            f"{'variant':>13} {'round ms':>9} {'decode ms':>10} {'rest ms':>8} {'held':>6} {'drafted':>8} "
            f"{'vs none':>8} {'lowest':>7}"
        )
        for r in generation:
            print(
                f"{r['variant']:>13} {r['round_ms']:>9.2f} {r['decode_ms']:>10.2f} {r['rest_ms']:>8.3f} "
                f"{100 * r['held_share']:>5.0f}% {r['drafted']:>8} {r['vs_none']:>7.3f}x {r['vs_none_lowest']:>6.3f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
