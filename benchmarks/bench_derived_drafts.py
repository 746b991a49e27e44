"""Benchmark: drafts derived from the embedded Gemma 3 270M by dropping layers, used with the `draft`
strategy. Prints, per layer set, acceptance rate, mean accepted length, decode tokens/s (greedy and
sampled) and the draft model's own tokens/s, beside `none` measured in the same run.

Usage: python benchmarks/bench_derived_drafts.py [--repeats 2] [--max-tokens 96] [--layers 0-16 0-5,12-17]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from specviz import Session
from specviz.analysis.workloads import WORKLOADS
from specviz.models.derive import derive_draft
from specviz.models.embedded import default_model_path

DEFAULT_LAYERS = ["0-16", "0-5,8-17", "0-15", "0-5,12-17"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--layers", nargs="+", default=DEFAULT_LAYERS)
    args = ap.parse_args(argv)

    target = default_model_path()
    prompts = [p for kind in ("code-rewrite", "quote", "free") for p in WORKLOADS[kind][:2]]
    tmp = Path(tempfile.mkdtemp(prefix="specviz-drafts-"))
    drafts = {}
    for spec in args.layers:
        out = tmp / f"draft-{spec.replace(',', '_')}.gguf"
        drafts[spec] = derive_draft(target, spec, out).path
        print(f"derived {spec} -> {out}", file=sys.stderr)
    s = Session(target, n_ctx=2048)
    rows = []
    for temperature in (0.0, 0.8):
        base = []
        stats = {spec: {"acc": [], "mal": [], "tps": [], "dtps": []} for spec in drafts}
        for rep in range(args.repeats):
            for i, prompt in enumerate(prompts):
                seed = 1000 * rep + i
                s.start(prompt, args.max_tokens, "none", temperature=temperature, seed=seed)
                s.run()
                base.append(s.telemetry_dict()["tokens_per_second"])
                for spec, path in drafts.items():
                    s.start(
                        prompt,
                        args.max_tokens,
                        "draft",
                        temperature=temperature,
                        seed=seed,
                        draft_model=str(path),
                        draft_max=args.draft_max,
                        draft_p_min=0.0,
                    )
                    s.run()
                    t = s.telemetry_dict()
                    st = stats[spec]
                    st["acc"].append(t["acceptance_rate"])
                    st["mal"].append(t["mean_accepted_length"])
                    st["tps"].append(t["tokens_per_second"])
                    st["dtps"].append(t["draft_model_tokens_per_second"])
        none_tps = statistics.median(base)
        rows.append(("none", temperature, None, None, none_tps, None, 1.0))
        for spec, st in stats.items():
            tps = statistics.median(st["tps"])
            rows.append(
                (
                    spec,
                    temperature,
                    statistics.median(st["acc"]),
                    statistics.median(st["mal"]),
                    tps,
                    statistics.median(st["dtps"]),
                    tps / none_tps,
                )
            )
    print(
        f"derived drafts of {target.name}, draft_max {args.draft_max}, {args.max_tokens} tokens, "
        f"{len(prompts)} prompts x {args.repeats} repeats (medians)"
    )
    print(
        "| kept layers | temperature | acceptance | mean accepted length | tokens/s | draft model tokens/s | vs none |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for spec, temp, acc, mal, tps, dtps, ratio in rows:
        a = "—" if acc is None else f"{acc:.1%}"
        m = "—" if mal is None else f"{mal:.2f}"
        d = "—" if dtps is None else f"{dtps:.0f}"
        print(f"| {spec} | {temp:g} | {a} | {m} | {tps:.1f} | {d} | {ratio:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
