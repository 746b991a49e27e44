"""Benchmark: draft trees against a chain at the same verify budget, on the embedded Gemma 3 270M with drafts
derived from it (`specviz derive-draft`, layers 0-16: a strong draft; 0-11: a weaker one), greedy.

At each budget ``B`` (``draft_max``, alignment off, ``draft_p_min`` 0, the fixed policy) a round verifies at most
``1 + B`` rows whatever it drafts: the chain drafts ``B`` tokens deep; a tree (``tree_width`` W, ``p_split`` P,
as llama.cpp's ``examples/speculative``) spends the same ``B`` nodes on branches, so it is shallower. Per draft
and budget: the chain, and a tree for each width and ``p_split``; ``none`` (plain decoding) once. Columns:
the mean accepted length (tokens per drafting round, the target's own included), tokens/s, the speedup over the
chain of the same budget and over ``none`` (each the median over prompts of the per-prompt ratio of medians),
verify rows per drafting round, the share of drafting rounds that branched, and on how many prompts the output
is ``none``'s token for token (greedy trees are lossless up to a near tie a many-row batch can flip). Figures
are medians over repeats, then over prompts; the settings run back to back within each repeat (in reverse order
every other repeat), so drift hits them alike. The load average is printed before and after: on a shared
machine the figures are only as quiet as it was.

``--eagle3-head HEAD.gguf`` adds the ``eagle3`` strategy with that head, as a chain and as SGLang-style trees
(``tree_topk`` W, ``tree_depth`` B, ``tree_nodes`` B) where the strategy has those knobs.

Usage: python benchmarks/bench_tree.py [--repeats 3] [--max-tokens 64] [--prompts 1] [--budgets 4,8,16]
       [--widths 2,4] [--p-splits 0.1,0.3] [--layers 0-16 0-11] [--threads N] [--eagle3-head HEAD.gguf] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specviz import Session
from specviz.analysis.workloads import WORKLOADS
from specviz.decoding.events import Verified
from specviz.decoding.machine_load import load_average
from specviz.models.derive import derive_draft
from specviz.models.embedded import default_model_path
from specviz.strategies import strategy_class

KINDS = ("code-rewrite", "quote", "free")


@dataclass(frozen=True, eq=False)  # compared (and hashed) by identity: each row is its own
class Setting:
    """One row: a label, the draft it uses, its budget, the strategy and its knobs."""

    draft: str
    budget: int
    label: str
    strategy: str
    knobs: dict[str, Any]
    width: int = 1  #: the target's sequences it needs


@dataclass
class Runs:
    """Per prompt, each repeat's accepted length, tokens/s, rows per drafting round, share branched, tokens."""

    by_prompt: dict[int, list[tuple[float, float, float, float, list[int]]]] = field(default_factory=dict)


def settings_for(draft: str, path: str, strategy: str, args: argparse.Namespace, tree_knobs: str) -> list[Setting]:
    """The chain and every tree at each budget, for one draft (a draft model or an EAGLE-3 head)."""
    out = []
    base = {"draft_model": path, "draft_p_min": 0.0, "align": False, "draft_policy": "fixed"}
    for b in args.budgets:
        out.append(Setting(draft, b, "chain", strategy, {**base, "draft_max": b}))
        for w in args.widths:
            if tree_knobs == "tree_width":
                for p in args.p_splits:
                    knobs = {**base, "draft_max": b, "tree_width": w, "p_split": p}
                    out.append(Setting(draft, b, f"tree w{w} p{p:g}", strategy, knobs, w))
            elif tree_knobs == "tree_topk":
                knobs = {**base, "draft_max": b, "tree_topk": w, "tree_depth": b, "tree_nodes": b}
                out.append(Setting(draft, b, f"tree topk{w}", strategy, knobs, _hidden_width(knobs)))
    return out


def _hidden_width(knobs: dict[str, Any]) -> int:
    """The target sequences a hidden-state tree needs (the strategy's own rule)."""
    from specviz.strategies import knobs as k

    return int(k.tree_width_of(knobs)[0])


def run_one(s: Session, prompt: str, max_tokens: int, st: Setting | None) -> tuple[float, float, float, float, list]:
    """One greedy generation: accepted length, tokens/s, rows per drafting round, share branched, tokens."""
    if st is None:
        s.start(prompt, max_tokens, "none")
    else:
        s.start(prompt, max_tokens, st.strategy, **st.knobs)
    s.run()
    t = s.telemetry_dict()
    rows = [e.batch_size for e in s.events if isinstance(e, Verified) and e.batch_size > 1]
    branched = t["tree"]["rounds_with_branches"] / len(rows) if rows else 0.0
    per_round = statistics.fmean(rows) if rows else 1.0
    return t["mean_accepted_length"], t["tokens_per_second"], per_round, branched, list(s.tokens)


def measure(
    s: Session, prompts: list[str], settings: list[Setting], args: argparse.Namespace
) -> tuple[Runs, dict[Setting, Runs]]:
    """Every prompt ``repeats`` times: ``none``, then every setting, back to back."""
    none, runs = Runs(), {st: Runs() for st in settings}
    for st in {st.draft: st for st in settings}.values():  # load each draft and warm its contexts, unmeasured
        run_one(s, prompts[0], 8, st)
    for rep in range(args.repeats):
        for i, prompt in enumerate(prompts):
            none.by_prompt.setdefault(i, []).append(run_one(s, prompt, args.max_tokens, None))
            for st in settings if rep % 2 == 0 else settings[::-1]:  # alternate orders: no setting always first
                runs[st].by_prompt.setdefault(i, []).append(run_one(s, prompt, args.max_tokens, st))
            print(f"repeat {rep + 1}, prompt {i + 1} done", file=sys.stderr)
    return none, runs


def _med(xs) -> float:
    return statistics.median(list(xs))


def summarise(none: Runs, runs: dict[Setting, Runs]) -> list[dict[str, Any]]:
    """One row per setting: medians over repeats, then over prompts, and the ratios to its chain and ``none``."""
    chains = {(st.draft, st.budget): r for st, r in runs.items() if st.label == "chain"}
    none_tps = {i: _med(g[1] for g in got) for i, got in none.by_prompt.items()}
    none_tokens = {i: got[0][4] for i, got in none.by_prompt.items()}
    out = []
    for st, r in runs.items():
        chain = chains[(st.draft, st.budget)]
        tps = {i: _med(g[1] for g in got) for i, got in r.by_prompt.items()}
        chain_tps = {i: _med(g[1] for g in got) for i, got in chain.by_prompt.items()}
        out.append(
            {
                "draft": st.draft,
                "budget": st.budget,
                "setting": st.label,
                "knobs": {k: v for k, v in st.knobs.items() if k != "draft_model"},
                "accepted_length": _med(_med(g[0] for g in got) for got in r.by_prompt.values()),
                "tokens_per_second": _med(tps.values()),
                "vs_chain": _med(tps[i] / chain_tps[i] for i in tps),
                "vs_none": _med(tps[i] / none_tps[i] for i in tps),
                "rows_per_round": _med(_med(g[2] for g in got) for got in r.by_prompt.values()),
                "branched": _med(_med(g[3] for g in got) for got in r.by_prompt.values()),
                "as_none": sum(all(g[4] == none_tokens[i] for g in got) for i, got in r.by_prompt.items()),
            }
        )
    return out


def print_table(rows: list[dict[str, Any]], none_tps: float, n_prompts: int) -> None:
    """The rows as a Markdown table, ``none`` first."""
    head = ["draft", "budget", "setting", "accepted length", "tokens/s", "vs chain", "vs none", "rows/round"]
    print("| " + " | ".join([*head, "branched", "as none"]) + " |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| — | — | none | 1.00 | {none_tps:.1f} | — | 1.00x | 1.00 | — | {n_prompts}/{n_prompts} |")
    for r in rows:
        print(
            f"| {r['draft']} | {r['budget']} | {r['setting']} | {r['accepted_length']:.2f} | "
            f"{r['tokens_per_second']:.1f} | {r['vs_chain']:.2f}x | {r['vs_none']:.2f}x | {r['rows_per_round']:.2f} | "
            f"{r['branched']:.0%} | {r['as_none']}/{n_prompts} |"
        )


def _load(avg: tuple[float, float, float] | None) -> str:
    return "unknown" if avg is None else " / ".join(f"{x:.1f}" for x in avg)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=1, help="prompts per workload kind (code-rewrite, quote, free)")
    ap.add_argument("--budgets", type=_ints, default=[4, 8, 16], help="node budgets (draft_max), comma-separated")
    ap.add_argument("--widths", type=_ints, default=[2, 4], help="tree widths (tree_width; eagle3: tree_topk)")
    ap.add_argument("--p-splits", type=_floats, default=[0.1, 0.3], help="p_split values of the draft model's trees")
    ap.add_argument(
        "--layers", nargs="*", default=["0-16", "0-11"], help="the derived drafts' kept layers (none: skip)"
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--eagle3-head", default=None, metavar="HEAD.gguf", help="also a trained EAGLE-3 head's trees")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    args = ap.parse_args(argv)

    target = default_model_path()
    prompts = [p for kind in KINDS for p in WORKLOADS[kind][: args.prompts]]
    tmp = Path(tempfile.mkdtemp(prefix="specviz-tree-"))
    settings: list[Setting] = []
    for spec in args.layers:
        out = tmp / f"draft-{spec.replace(',', '_')}.gguf"
        path = str(derive_draft(target, spec, out).path)
        settings += settings_for(spec, path, "draft", args, "tree_width")
    eagle3_note = None
    if args.eagle3_head:
        knobs = {k.name for k in strategy_class("eagle3").knobs}
        kind = "tree_topk" if "tree_topk" in knobs else ""
        settings += settings_for("eagle3", args.eagle3_head, "eagle3", args, kind)
        eagle3_note = None if kind else "the eagle3 strategy has no tree knobs here: its chain alone"
    width = max(st.width for st in settings)
    before = load_average()
    with Session(target, n_ctx=2048, n_threads=args.threads, n_seq_max=width) as s:
        none, runs = measure(s, prompts, settings, args)
    after = load_average()
    rows = summarise(none, runs)
    none_tps = _med(_med(g[1] for g in got) for got in none.by_prompt.values())
    if args.json:
        print(json.dumps({"none_tokens_per_second": none_tps, "rows": rows, "load_average": [before, after]}))
        return 0
    print(
        f"draft trees against a chain at the same verify budget: {target.name}, greedy, {args.max_tokens} tokens, "
        f"{len(prompts)} prompts ({', '.join(KINDS)}) x {args.repeats} repeats (medians), threads "
        f"{args.threads or 'default'}, target sequences {width}; load average {_load(before)} before, "
        f"{_load(after)} after"
    )
    if eagle3_note:
        print(eagle3_note)
    print_table(rows, none_tps, len(prompts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
