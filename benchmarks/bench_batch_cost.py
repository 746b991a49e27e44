"""Benchmark: what one verify decode of several sequences costs — busy sequences × rows each — and where extra
rows stop being nearly free (specviz.decoding.batch_cost).

One target context opened for the most sequences (llama-server's ``-np``: ``n_ctx`` split over them), each
sequence at its own position after a prompt of its own; every cell (sequences 1, 2, 4, 8 × draft lengths 0,
2, 4, 8, 16 by default, i.e. 1, 3, 5, 9, 17 rows each) timed ``--repeats`` times in interleaved passes, the
fastest kept (the median printed with ``--json``). The load average is printed before and after: on a
shared machine the figures are only as quiet as it was.

``--shapes 5,5,5,5/1,1,1,17/5,0,5,5`` instead times decodes of those rows per sequence (0: an idle sequence)
in a cache split over the sequences (``-np``) and in a unified one (``-kvu``), side by side: llama.cpp
computes a split cache's batch in one graph only where the busy sequences add equal rows and their ids run
on without a gap.

Usage: python benchmarks/bench_batch_cost.py [--model GGUF] [--threads N] [--repeats 5] [--kv-unified]
       [--sequences 1,2,4,8] [--draft-lengths 0,2,4,8,16] [--shapes ROWS/ROWS...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from specviz.backends.llama import LlamaContext, LlamaModel
from specviz.decoding.batch_cost import DRAFT_LENGTHS, PROMPT_TOKENS, SEQUENCES, measure_batch_cost
from specviz.decoding.machine_load import load_average
from specviz.decoding.verify_cost import ADVISOR_REPEATS
from specviz.models.embedded import default_model_path

TEXT = (
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion the members "
    "agreed to fund the new library, to repair the bridge over the river and to hire two more teachers.\n"
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
)
#: Positions each sequence gets (the context's n_ctx is this times the sequences): a prompt and the widest
#: draft fit with room to spare.
N_CTX_PER_SEQUENCE = 256


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _shapes(text: str) -> list[list[int]]:
    return [_ints(part) for part in text.split("/") if part.strip()]


def shape_costs(model: LlamaModel, shapes: list[list[int]], threads: int | None, repeats: int) -> list[dict]:
    """Fastest seconds of one decode of each shape (rows per sequence) in a split and in a unified cache, timed
    in interleaved passes; each sequence at its own position after a prompt of its own, cut back after."""
    most = max(len(sh) for sh in shapes)
    batch = max(512, max(sum(sh) for sh in shapes))
    tokens = model.tokenize(TEXT)
    prompts = [tokens[q : q + PROMPT_TOKENS + q] for q in range(most)]
    ctxs = {
        unified: LlamaContext(
            model,
            n_ctx=N_CTX_PER_SEQUENCE * most,
            n_batch=batch,
            n_ubatch=batch,
            n_threads=threads,
            n_seq_max=most,
            kv_unified=unified,
        )
        for unified in (False, True)
    }
    for ctx in ctxs.values():
        for q, p in enumerate(prompts):
            ctx.eval_sequence_prompt(q, p)
    best = {(i, u): float("inf") for i in range(len(shapes)) for u in ctxs}
    for r in range(repeats + 1):  # the first pass warms up
        for i, sh in enumerate(shapes):
            for unified, ctx in ctxs.items():
                parts = [(q, tokens[40 : 40 + n], len(prompts[q])) for q, n in enumerate(sh) if n]
                t0 = time.perf_counter()
                ctx.eval_sequences(parts)
                took = time.perf_counter() - t0
                for q, n in enumerate(sh):
                    if n:
                        ctx.cut_sequence(q, len(prompts[q]))
                if r:
                    best[(i, unified)] = min(best[(i, unified)], took)
    for ctx in ctxs.values():
        ctx.close()
    return [
        {"rows": sh, "split_seconds": best[(i, False)], "unified_seconds": best[(i, True)]}
        for i, sh in enumerate(shapes)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="a GGUF (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: every core)")
    ap.add_argument("--repeats", type=int, default=ADVISOR_REPEATS)
    ap.add_argument("--sequences", type=_ints, default=list(SEQUENCES))
    ap.add_argument("--draft-lengths", type=_ints, default=list(DRAFT_LENGTHS))
    ap.add_argument("--kv-unified", action="store_true", help="one cache the sequences share (llama-server -kvu)")
    ap.add_argument("--shapes", type=_shapes, default=None, help="rows per sequence, e.g. 5,5,5,5/1,1,1,17")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    path = args.model or default_model_path()
    model = LlamaModel(path)
    if args.shapes:
        before = load_average()
        got = shape_costs(model, args.shapes, args.threads, args.repeats)
        after = load_average()
        if args.json:
            print(json.dumps({"load_average_before": before, "load_average_after": after, "shapes": got}, indent=1))
            return 0
        load = f"load average {before[0]:.2f} before, {after[0]:.2f} after" if before and after else ""
        print(f"one decode by rows per sequence on {Path(path).name}, fastest of {args.repeats}; {load}")
        print(f"{'rows per sequence':<20}{'split ms':>10}{'unified ms':>12}")
        for g in got:
            rows = ",".join(map(str, g["rows"]))
            print(f"{rows:<20}{g['split_seconds'] * 1e3:>10.1f}{g['unified_seconds'] * 1e3:>12.1f}")
        return 0
    most = max([1, *args.sequences])
    widest = most * (max([0, *args.draft_lengths]) + 1)
    batch = max(512, widest)  # llama-server's default micro-batch, or the widest batch: one micro-batch
    ctx = LlamaContext(
        model,
        n_ctx=N_CTX_PER_SEQUENCE * most,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=args.threads,
        n_seq_max=most,
        kv_unified=args.kv_unified,
    )
    before = load_average()
    t0 = time.perf_counter()
    table = measure_batch_cost(
        ctx,
        model.tokenize(TEXT),
        sequences=args.sequences,
        draft_lengths=args.draft_lengths,
        repeats=args.repeats,
    )
    wall = time.perf_counter() - t0
    after = load_average()
    facts = {
        "model": Path(path).name,
        "n_threads": ctx.n_threads,
        "cpu_count": os.cpu_count(),
        "kv_unified": args.kv_unified,
        "n_ctx_seq": ctx.n_ctx_seq,
        "load_average_before": before,
        "load_average_after": after,
        "wall_seconds": wall,
    }
    if args.json:
        print(json.dumps({**facts, **table.to_dict()}, indent=1))
        return 0
    load = f"load average {before[0]:.2f} before, {after[0]:.2f} after" if before and after else "load average n/a"
    cache = "one shared cache (-kvu)" if args.kv_unified else f"{ctx.n_ctx_seq} positions per sequence"
    print(f"batch cost on {Path(path).name}, {ctx.n_threads} threads, {cache}; {load}; {wall:.1f} s")
    print(table.text())
    ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
