"""Benchmark: specviz's own work per round, apart from llama.cpp's calls, per strategy and draft length.

Every function of llama-cpp-python's C binding (``llama_cpp.llama_cpp``: ``llama_decode``,
``llama_get_logits_ith``, ``llama_memory_seq_rm``, the state calls ...) is wrapped for the run with a timer.
A round's *specviz time* is the wall time of ``Session.run()`` less the time spent inside those calls,
divided by the rounds: drafting, the budget, the acceptor's row scans, the history, events, telemetry
and checkpoints. The same is measured in CPU time of the calling thread (``time.thread_time``), which a
busy machine disturbs much less than wall time (a descheduled thread's wall time counts, its CPU time
does not). The wrappers' own cost (a few hundred nanoseconds per call, a handful of calls per round)
lands on specviz's side: the figures are an upper bound.

The row scans are specviz's own work but are timed apart too (``row scans`` column: the calls into the
row-scan kernel, ``specviz/decoding/rowscan_kernel.c``): reading a 262k-value logits row is bound by
memory, and llama.cpp's own tools do at least as much per row (their sampler copies the whole row into a
candidate array), so that column is the part of specviz's time that no rewrite of the Python removes.

``--tiny-model`` runs a tiny llama written by the tests' writer instead (2 blocks, a 320-token
vocabulary, half a megabyte): its decode leaves the CPU caches as they were, so the figures are specviz's
work with warm caches, as on a machine where the weights live on a GPU. On the embedded model the
decode streams 250 MB of weights through the caches every round, and the Python that follows runs cold
(docs/performance.md measures how much that costs).

``--tiny-wide-model`` writes a random model of one block and width 16 with the embedded model's
262,144-token vocabulary (16 MB of f16): a decode of about 2 ms that leaves the caches warm, and logits
rows of a megabyte, as on a GPU host running the embedded model, where issue 26's target was missed
(docs/performance.md, "NVIDIA H200"). It puts that regime on a machine without a GPU.

The garbage collector's time is counted apart too (``of which GC`` column, through ``gc.callbacks``), and
as a mean over every run of a setting rather than a median: CPython's full collections walk every object
the process keeps (some 40,000 here, about 12 ms) and come every few hundred rounds, so most runs have
none and a median of three hides the one that has. The mean spreads them over the rounds, as a long
generation pays them.

Runs: greedy (the targets: 0.25 ms a round for ``none`` and every draftless strategy at every draft
length) and, with ``--temperature``, sampled decoding (reported, no target). Each setting runs
``--repeats`` times; the table gives the median and the best.

Usage: python benchmarks/bench_overhead.py [--model GGUF | --tiny-model | --tiny-wide-model]
           [--n-gpu-layers N] [--threads N] [--max-tokens 96] [--repeats 3] [--draft-max 1,2,4,8,16]
           [--strategies none,ngram-simple,...] [--draft-policy fixed|adaptive|cost]
           [--temperature 0.8 [--top-k 40] [--top-p 0.95]] [--kind quote] [--prompt 0] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from specviz import Session, strategy_class, strategy_names
from specviz.analysis.workloads import WORKLOADS
from specviz.backends import LlamaModel
from specviz.decoding import rowscan_kernel
from specviz.decoding.policy import POLICIES
from specviz.models.embedded import default_model_path
from specviz.testing.sized_models import LlamaShape, write_random_llama
from specviz.testing.tiny_models import write_tiny_llama

#: ``--tiny-wide-model``'s shape: the embedded Gemma 3 270M's vocabulary on one narrow block.
WIDE_TINY_SHAPE = LlamaShape(n_embd=16, n_layer=1, n_head=2, n_head_kv=1, n_ff=32, vocab_size=262144)

#: Knobs that let each draftless strategy draft on the workload prompts (the native benchmark's n-gram
#: sizes); ``draft_max`` is set per run.
KNOBS: dict[str, dict[str, Any]] = {
    "ngram-simple": {"size_n": 12, "size_m": 16},
    "ngram-map-k": {"size_n": 12, "size_m": 16},
    "ngram-map-k4v": {"size_n": 12, "size_m": 16},
    "ngram-mod": {"n_match": 24, "n_min": 12, "n_max": 16},
}


class LlamaCallTimer:
    """Wraps every C function of ``llama_cpp.llama_cpp`` with a wall-clock and a thread-CPU timer."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self.calls = 0
        self._saved: dict[str, Any] = {}

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        perf, cpu = time.perf_counter, time.thread_time

        def timed(*args: Any) -> Any:
            w0, c0 = perf(), cpu()
            try:
                return fn(*args)
            finally:
                self.cpu += cpu() - c0
                self.wall += perf() - w0
                self.calls += 1

        return timed

    def install(self) -> LlamaCallTimer:
        """Replace the module's functions with timed ones (specviz looks them up on the module per call)."""
        import llama_cpp.llama_cpp as lc

        for name in dir(lc):
            obj = getattr(lc, name)
            if name.startswith(("llama_", "ggml_")) and callable(obj) and hasattr(obj, "argtypes"):
                self._saved[name] = obj
                setattr(lc, name, self._wrap(obj))
        return self

    def uninstall(self) -> None:
        """Put the original functions back."""
        import llama_cpp.llama_cpp as lc

        for name, obj in self._saved.items():
            setattr(lc, name, obj)
        self._saved.clear()

    def reset(self) -> None:
        """Zero the counters."""
        self.wall = self.cpu = 0.0
        self.calls = 0


class KernelTimer(LlamaCallTimer):
    """Wraps the row-scan kernel's functions (a thread binds the greedy verifier's function when it
    first verifies: installing and uninstalling drop this thread's buffers, so that it binds again)."""

    def install(self) -> KernelTimer:
        """Replace the loaded kernel's functions with timed ones (nothing without the kernel)."""
        fns = rowscan_kernel.load()
        if fns is not None:
            for name in list(vars(fns)):
                self._saved[name] = getattr(fns, name)
                setattr(fns, name, self._wrap(self._saved[name]))
        rowscan_kernel.forget_buffers()
        return self

    def uninstall(self) -> None:
        """Put the original functions back."""
        fns = rowscan_kernel.load()
        for name, obj in self._saved.items():
            setattr(fns, name, obj)
        self._saved.clear()
        rowscan_kernel.forget_buffers()


class GcTimer:
    """Times CPython's garbage collections (``gc.callbacks``), wall clock, while installed."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.collections = 0
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.wall += time.perf_counter() - self._start
            self.collections += 1

    def install(self) -> GcTimer:
        """Start timing collections."""
        gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        """Stop timing collections."""
        gc.callbacks.remove(self._callback)

    def reset(self) -> None:
        """Zero the counters."""
        self.wall = 0.0
        self.collections = 0


def one_run(
    session: Session,
    timer: LlamaCallTimer,
    kernel: KernelTimer,
    prompt: str,
    strategy: str,
    knobs: dict,
    args,
    collector: GcTimer,
) -> dict:
    """One generation; specviz's and llama.cpp's time per round, and the row scans' and the garbage
    collector's shares of specviz's (``gc_seconds``: the collections' total, for a mean over runs)."""
    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    session.start(prompt, args.max_tokens, strategy, seed=1, **sampling, **knobs)
    timer.reset()
    kernel.reset()
    collector.reset()
    w0, c0 = time.perf_counter(), time.thread_time()
    session.run()
    wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
    rounds = session.round_index
    return {
        "rounds": rounds,
        "tokens": len(session.tokens),
        "specviz_wall_ms": (wall - timer.wall) / rounds * 1e3,
        "specviz_cpu_ms": (cpu - timer.cpu) / rounds * 1e3,
        "llama_ms": timer.wall / rounds * 1e3,
        "scan_ms": kernel.wall / rounds * 1e3,
        "llama_calls": timer.calls / rounds,
        "gc_seconds": collector.wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="a GGUF to run instead of the embedded Gemma 3 270M")
    ap.add_argument("--tiny-model", action="store_true", help="a tiny llama whose decode keeps the caches warm")
    ap.add_argument(
        "--tiny-wide-model",
        action="store_true",
        help="a one-block random model with the embedded model's 262k vocabulary: warm caches, megabyte rows",
    )
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="layers on the GPU (a GPU build of llama.cpp)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--draft-max", default="1,2,4,8,16", help="draft lengths (draft_max) to run each strategy at")
    ap.add_argument("--strategies", default="", help="default: none and every draftless strategy")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: sampled decoding (reported, no target)")
    ap.add_argument("--top-k", type=int, default=0, help="sampled decoding's top-k (0: off)")
    ap.add_argument("--top-p", type=float, default=1.0, help="sampled decoding's top-p (1: off)")
    ap.add_argument("--kind", default="quote", choices=sorted(WORKLOADS))
    ap.add_argument(
        "--draft-policy",
        default="fixed",
        choices=POLICIES,
        help="the drafting strategies' policy (cost: its own work each round is specviz's too)",
    )
    ap.add_argument("--prompt", type=int, default=0)
    ap.add_argument("--target-ms", type=float, default=0.25, help="the per-round target, marked in the table")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    draftless = [n for n in strategy_names() if not strategy_class(n).needs_model]
    strategies = [s for s in args.strategies.split(",") if s] or draftless
    for s in strategies:
        if s not in draftless:
            ap.error(f"--strategies: {s!r} is not a draftless strategy ({', '.join(draftless)})")
    lengths = [int(x) for x in args.draft_max.split(",") if x]
    if sum((args.tiny_model, args.tiny_wide_model, bool(args.model))) > 1:
        ap.error("--model, --tiny-model and --tiny-wide-model each choose the model: give one")
    tmp = tempfile.TemporaryDirectory() if args.tiny_model or args.tiny_wide_model else None
    if tmp is not None and args.tiny_model:
        model_path = write_tiny_llama(Path(tmp.name) / "tiny-llama.gguf")
    elif tmp is not None:
        model_path = write_random_llama(Path(tmp.name) / "tiny-wide-262k.gguf", WIDE_TINY_SHAPE)
    else:
        model_path = Path(args.model) if args.model else default_model_path()
    model = LlamaModel(model_path, n_gpu_layers=args.n_gpu_layers)
    session = Session(model, n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=args.threads)
    prompt = WORKLOADS[args.kind][args.prompt]
    kernel = KernelTimer().install()
    timer = LlamaCallTimer().install()
    collector = GcTimer().install()
    try:
        one_run(session, timer, kernel, prompt, "none", {}, args, collector)  # warm-up: page the model in
        rows: list[dict[str, Any]] = []
        for strat in strategies:
            for k in [1] if strat == "none" else lengths:
                knobs = (
                    {} if strat == "none" else dict(KNOBS.get(strat, {}), draft_max=k, draft_policy=args.draft_policy)
                )
                runs = [
                    one_run(session, timer, kernel, prompt, strat, knobs, args, collector) for _ in range(args.repeats)
                ]
                row = {"strategy": strat, "draft_max": None if strat == "none" else k}
                for key in ("rounds", "tokens", "llama_ms", "llama_calls", "scan_ms"):
                    row[key] = statistics.median(r[key] for r in runs)
                for key in ("specviz_wall_ms", "specviz_cpu_ms"):
                    row[key] = statistics.median(r[key] for r in runs)
                    row[key + "_best"] = min(r[key] for r in runs)
                row["gc_ms"] = sum(r["gc_seconds"] for r in runs) / sum(r["rounds"] for r in runs) * 1e3  # a mean
                rows.append(row)
                print(f"{strat} draft_max={k}: {row['specviz_wall_ms']:.3f} ms", file=sys.stderr, flush=True)
    finally:
        collector.uninstall()
        timer.uninstall()
        kernel.uninstall()
    mode = "greedy" if args.temperature == 0 else f"sampled (temperature {args.temperature}"
    mode += "" if args.temperature == 0 else f", top-k {args.top_k}, top-p {args.top_p})"
    mode += "" if args.draft_policy == "fixed" else f", the {args.draft_policy} policy"
    print(
        f"\nspecviz's own time per round, {mode}: {model_path.name}, n_gpu_layers={args.n_gpu_layers}, "
        f"{args.threads} threads, {args.kind} prompt #{args.prompt}, {args.max_tokens} tokens, median (best) "
        f"of {args.repeats}; row scans: {rowscan_kernel.scan_path()}; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| strategy | draft_max | rounds | tokens/round | specviz ms/round (wall) | specviz ms/round (CPU) "
        "| of which row scans | of which GC (mean) | llama.cpp ms/round | llama.cpp calls/round |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        over = " ⚠" if r["specviz_wall_ms_best"] > args.target_ms and args.temperature == 0 else ""
        print(
            f"| {r['strategy']} | {r['draft_max'] if r['draft_max'] is not None else '–'} | {r['rounds']:.0f} "
            f"| {r['tokens'] / r['rounds']:.2f} | {r['specviz_wall_ms']:.3f} ({r['specviz_wall_ms_best']:.3f}){over} "
            f"| {r['specviz_cpu_ms']:.3f} ({r['specviz_cpu_ms_best']:.3f}) | {r['scan_ms']:.3f} | {r['gc_ms']:.3f} "
            f"| {r['llama_ms']:.2f} "
            f"| {r['llama_calls']:.1f} |"
        )
    if args.json:
        print(json.dumps(rows, indent=1))
    session.close()
    model.close()
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
