"""Benchmark: what each piece of specviz's own per-round work costs, timed alone.

:mod:`bench_overhead` times all of specviz's work in a round at once; this script times the pieces of a
greedy round one by one, each repeated on the same data (warm caches), in CPU time of the calling thread:
the logits row view; the row scan as argmax alone, as argmax then the softmax normaliser, and as the
acceptor's one pass (the C kernel; numpy without it); a rejection row's alternatives and rank; the rewind
checkpoint; the telemetry event as a round makes it and as a reader builds it; the round's events; the
floor of any greedy round (the kernel's one call that reads the row, and the commit of its choice); and for
a sampled row, top-p's nucleus read in place next to the whole distribution numpy builds. Each
is timed twice: warm (repeated on the same data) and right after a one-token decode, as a round runs it
(median of ``--cold-repeats``): the decode streams the model's weights through the caches, so the same
Python and the same row read cost several times more there. The warm sum is a floor for a ``none``
round; the after-a-decode column is what a round pays, and a busy machine stretches both.

A second table says what makes the caches cold: the same bookkeeping (the telemetry event, the round's
events and the checkpoint, together) timed after a decode and after things that each do one part of what a
decode does: waiting as long as a decode takes, streaming 2 MiB (the size of one core's second-level cache),
streaming 256 MiB (about the embedded model's weights), and touching one value per 4 KiB page of 256 MiB (the
address translations a decode uses up, with a sixteenth of its data).

A third table reads a verify batch's rows right after its decode (1, 5 and 12 rows, every draft token the
target's choice): the least read any exact greedy verifier must do (every value of each row), specviz's
kernel, and llama.cpp's own greedy sampler, in wall milliseconds.

Usage: python benchmarks/bench_round_pieces.py [--model GGUF] [--threads N] [--repeats 300]
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specviz import Session
from specviz.analysis.workloads import WORKLOADS
from specviz.backends import LlamaContext, LlamaModel
from specviz.decoding.events import TelemetryEvent
from specviz.decoding.round_events import round_events
from specviz.decoding.rowscan import ScoredRow
from specviz.decoding.rowscan_kernel import unavailable_reason, verify_greedy
from specviz.decoding.sampling import SamplingParams, probs_from_logits
from specviz.models.embedded import default_model_path


def cpu_us(fn: Callable[[], Any], repeats: int) -> float:
    """Mean CPU microseconds of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    fn()
    t = time.thread_time()
    for _ in range(repeats):
        fn()
    return (time.thread_time() - t) / repeats * 1e6


def cold_us(
    fn: Callable[[], Any], before: Callable[[], Any], repeats: int, clock: Callable[[], float] = time.thread_time
) -> float:
    """Median microseconds of ``fn()`` called right after ``before()`` (a one-token decode, as in a real
    round, or something that does part of what a decode does to the caches), by ``clock``: the calling
    thread's CPU time unless told (``time.perf_counter`` for wall time, where ``fn`` uses other threads)."""
    times = []
    for _ in range(repeats):
        before()
        t = clock()
        fn()
        times.append(clock() - t)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="a GGUF to run instead of the embedded Gemma 3 270M")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--cold-repeats", type=int, default=30, help="decodes for the after-a-decode column")
    args = ap.parse_args(argv)
    model_path = Path(args.model) if args.model else default_model_path()
    model = LlamaModel(model_path)
    session = Session(model, n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=args.threads)
    session.start(WORKLOADS["quote"][0], 8, "none", seed=1)
    session.run()
    g, ctx, drafter = session.generation, session.ctx, session.drafter
    assert drafter is not None and g.last_result is not None
    row = ctx.row(0)
    last = g.last_result
    history = list(session.history)
    n_past = len(history) - 1

    def decode() -> None:
        # the round's decode: one token through the model (its weights stream through the caches)
        decode_and_remove(ctx, [history[-1]], n_past, history)

    def session_view() -> TelemetryEvent:
        # what a round does for its telemetry event: one copy of the counters, the rest when it is read
        return TelemetryEvent(1, view=session.telemetry_view())

    native = ctx.native_rows()
    assert native is not None
    committed: list[int] = []

    def floor() -> None:
        # the least a greedy round without a draft can do after its decode: read the row in the kernel's
        # one call and commit its choice (no draft, no verdict, no events, no telemetry, no checkpoint)
        got = verify_greedy(native, (), 5)
        committed.append(got.tokens[0] if got is not None else 0)

    t08, top_p = SamplingParams(0.8), SamplingParams(0.8, top_p=0.95)
    scanned = ScoredRow(row, normaliser=True)
    other = (scanned.best + 1) % model.n_vocab  # a token the row did not choose: a rejected draft's
    pieces: list[tuple[str, Callable[[], Any]]] = [
        ("logits row view (ctx.row)", lambda: ctx.row(0)),
        ("row scan: argmax alone", lambda: ScoredRow(row)),
        ("row scan: argmax, then the normaliser (two passes)", lambda: ScoredRow(row).z()),
        ("row scan: the acceptor's one pass (choice and normaliser)", lambda: ScoredRow(row, normaliser=True)),
        ("rejection row: top 5 alternatives", lambda: scanned.top(5)),
        ("rejection row: the rejected token's rank", lambda: scanned.rank(other)),
        ("checkpoint (Generation.capture)", lambda: g.capture(drafter, session.rng)),
        ("  of which: telemetry counters", lambda: g.telemetry.state()),
        ("telemetry event, as a round makes it (built on first read)", lambda: session_view()),
        ("telemetry dictionary, built", session.telemetry_dict),
        ("round events", lambda: round_events(last, model.pieces, policy="fixed")),
        ("the floor: the greedy kernel's one call and the commit (no draft, no bookkeeping)", floor),
        ("sampled row, T 0.8: the whole distribution, built by numpy", lambda: probs_from_logits(row, t08)),
        ("sampled row, T 0.8, top-p 0.95: the nucleus, read in place", lambda: probs_from_logits(row, top_p)),
    ]
    kernel = unavailable_reason()
    print(
        f"specviz's per-round pieces, timed alone: {model_path.name} ({model.n_vocab} tokens), CPU time, mean "
        f"of {args.repeats}; row scan kernel: {'C' if kernel is None else 'numpy (' + kernel + ')'}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print("| piece | µs, warm | µs, right after a decode |")
    print("|---|---:|---:|")
    for name, fn in pieces:
        print(f"| {name} | {cpu_us(fn, args.repeats):.1f} | {cold_us(fn, decode, args.cold_repeats):.1f} |")

    def bookkeeping() -> None:
        session_view()
        round_events(last, model.pieces, policy="fixed")
        g.capture(drafter, session.rng)

    big = np.frombuffer(mmap.mmap(-1, 256 << 20), dtype=np.float64)
    big[:] = 1.0
    small = np.ones((2 << 20) // 8)
    pages = big[:: 4096 // 8]
    t0 = time.perf_counter()
    for _ in range(5):
        decode()
    decode_s = (time.perf_counter() - t0) / 5
    before: list[tuple[str, Callable[[], Any]]] = [
        ("nothing (warm)", lambda: None),
        ("a one-token decode", decode),
        (f"waiting as long as a decode ({decode_s * 1e3:.1f} ms)", lambda: time.sleep(decode_s)),
        ("streaming 2 MiB (one core's second-level cache)", small.sum),
        ("streaming 256 MiB (the weights' size)", big.sum),
        ("one value per 4 KiB page of 256 MiB (address translations)", pages.sum),
    ]
    print(
        "\nthe round's bookkeeping (telemetry event, round events, checkpoint), CPU time, "
        f"median of {args.cold_repeats}"
    )
    print("| right after | µs |")
    print("|---|---:|")
    for name, fn in before:
        print(f"| {name} | {cold_us(bookkeeping, fn, args.cold_repeats):.1f} |")
    rows_table(session, args.cold_repeats)
    session.close()
    model.close()
    return 0


def decode_and_remove(ctx: LlamaContext, tokens: list[int], n_past: int, history: list[int]) -> None:
    """Decode ``tokens`` at ``n_past`` with every row kept, then remove their positions again, so that every
    such decode is the same and the rows stay readable until the next one."""
    ctx.eval(tokens, n_past, rows="all")
    ctx.memory.cut(n_past, history)


def rows_table(session: Session, repeats: int) -> None:
    """The third table: reading a verify batch's rows right after its decode, wall milliseconds (the kernel
    reads a long row on several threads), median of ``repeats``. A greedy verifier that gives llama.cpp's
    answer must look at every value of every row up to the first refusal (the choice is the row's maximum),
    so the least read (NumPy's maximum of each row, one pass, nothing kept) is a floor for any
    implementation; specviz's kernel (the choice and the normaliser, as a round runs it) and llama.cpp's
    own greedy sampler (``llama_sampler_sample``, what its tools spend on a row: it copies the row into a
    candidate array of the whole vocabulary first) are set beside it. The greedy sampler sits in a chain, as
    in the tools: a chain keeps its candidate array between calls, where a bare sampler allocates 3 MB a
    row and pays its page faults too. The batches are a plain round's (1 row) and the greedy continuation
    of the quote prompt with 4 and 11 draft tokens (5 and 12 rows), every draft token the row's choice, as
    prompt-lookup's rounds at draft length 4 and 16 are on average (3.7 and 10.7 tokens a round in
    ``bench_overhead.py``)."""
    import llama_cpp.llama_cpp as lc

    ctx, g = session.ctx, session.generation
    native = ctx.native_rows()
    assert native is not None
    n_vocab = native[2]
    n_past = len(g.history) - 1
    # the greedy continuation: each batch's draft is what the target chooses, so every row is read
    cont = [g.history[-1]]
    while len(cont) < 12:
        decode_and_remove(ctx, cont, n_past, g.history)
        cont.append(int(np.argmax(ctx.row(len(cont) - 1))))
    sampler = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    lc.llama_sampler_chain_add(sampler, lc.llama_sampler_init_greedy())  # the chain owns and frees it
    try:
        print(
            f"\na verify batch's rows read right after its decode, wall ms, median of {repeats}; {n_vocab} values a row"
        )
        print(
            "| rows | the least read (NumPy maximum, a row at a time) | specviz's kernel | llama.cpp's greedy "
            "sampler | rows read by the kernel |"
        )
        print("|---:|---:|---:|---:|---:|")
        read = [0]
        for n in (1, 5, 12):
            batch = cont[:n]

            def decode(batch: list[int] = batch) -> None:
                decode_and_remove(ctx, batch, n_past, g.history)

            def least(n: int = n) -> None:
                for i in range(n):
                    ctx.row(i).max()

            def kernel(batch: list[int] = batch, read: list[int] = read) -> None:
                got = verify_greedy(native, batch[1:], 5)
                read[0] = len(got.tokens) if got is not None else 0

            def llama(n: int = n) -> None:
                for i in range(n):
                    lc.llama_sampler_sample(sampler, native[1], i)

            figures = [cold_us(fn, decode, repeats, clock=time.perf_counter) / 1e3 for fn in (least, kernel, llama)]
            print(f"| {n} | {figures[0]:.3f} | {figures[1]:.3f} | {figures[2]:.3f} | {read[0]} |")
    finally:
        lc.llama_sampler_free(sampler)


if __name__ == "__main__":
    sys.exit(main())
