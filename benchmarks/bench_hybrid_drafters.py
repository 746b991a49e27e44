"""Model drafters on a hybrid target: what each rollback path of the target's memory costs them.

On the tiny Qwen3.5-style fixture (:mod:`specviz.testing.tiny_qwen35`: a gated delta-net / attention
trunk and one NextN layer whose head says only A or B, so drafts are partly accepted), ``mtp`` with
``draft_max`` 4 is run with ``n_rs_seq`` 16 (llama.cpp's recurrent-state snapshots roll a rejection back
and leave the verify batch's outputs in place) and 0 (a partial-state checkpoint before every verify,
restored after a rejection with the accepted tokens re-applied, after which the drafter re-evaluates
them to read their states), beside ``none``. It prints rounds, drafted and accepted tokens, the
target's decodes, the drafter's catch-up tokens, the rollback paths and the median seconds over
``--repeats`` runs; greedy output is checked equal to ``none``'s.

    python benchmarks/bench_hybrid_drafters.py
    python benchmarks/bench_hybrid_drafters.py --max-tokens 64 --repeats 3

The machine is shared: read the decode counts, which do not depend on the load; seconds are medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from specviz import Session
from specviz.testing.tiny_qwen35 import write_tiny_qwen35

PROMPT = [1, 50, 60, 70, 80]


def run_once(path: Path, n_rs_seq: int, strategy: str, max_tokens: int) -> tuple[dict, int, float, list[int]]:
    """One generation: its telemetry, the target's decodes, the seconds and the tokens."""
    s = Session(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_rs_seq=n_rs_seq)
    try:
        e0 = s.ctx.eval_count
        knobs = {"draft_p_min": 0.0, "draft_max": 4} if strategy == "mtp" else {}
        t0 = time.perf_counter()
        s.start(PROMPT, max_tokens, strategy, **knobs)
        s.run()
        dt = time.perf_counter() - t0
        return s.telemetry_dict(), s.ctx.eval_count - e0, dt, list(s.tokens)
    finally:
        s.close()


def main() -> None:
    """Print one row per (n_rs_seq, strategy)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = write_tiny_qwen35(Path(d) / "q35.gguf", seed=1, block_scale=0.05, binary=(300, 301))
        print("n_rs_seq strategy rounds drafted accepted target_decodes catch_up rollback_paths median_s")
        for n_rs in (16, 0):
            plain: list[int] | None = None
            for strategy in ("none", "mtp"):
                runs = [run_once(path, n_rs, strategy, args.max_tokens) for _ in range(args.repeats)]
                t, decodes, _, tokens = runs[-1]
                if strategy == "none":
                    plain = tokens
                elif tokens != plain:
                    raise SystemExit(f"n_rs_seq={n_rs}: mtp's greedy output differs from none's")
                med = statistics.median(r[2] for r in runs)
                print(
                    f"{n_rs:8d} {strategy:8s} {t['rounds']:6d} {t['drafted']:7d} {t['accepted']:8d} "
                    f"{decodes:14d} {t.get('catch_up_tokens', 0):8d} {t['rollback_paths']} {med:.3f}"
                )


if __name__ == "__main__":
    main()
