"""Benchmark: specviz against llama.cpp's own speculative tool, ``llama-speculative-simple``, side by side.

Both run the embedded Gemma 3 270M on the grounded workload prompts (``specviz/analysis/workloads.py``:
``code-rewrite``, ``quote``, ``summarise``), greedily, with the same strategy and draft sizes
(llama.cpp's ``--spec-ngram-*`` options; :data:`STRATEGIES`), the same threads, context and batch sizes,
and the same prompt text byte for byte (the tool gets it with ``-p --no-escape``: ``-f`` would drop a
trailing newline and escapes would be processed). The tool is built by ``make llama-tools`` from the
llama.cpp that llama-cpp-python vendors, with the same CPU flags.

Decode tokens/s, prompt processing excluded on both sides:

* llama.cpp: the tool's own "decoded N tokens in T seconds" (its whole generation loop);
* specviz: the tokens generated over the wall time of ``Session.run()`` (every round with everything
  specviz does around it: drafting, the acceptor, events, telemetry), in three configurations:
  ``same batches`` (verify-tile alignment off, the ``fixed`` policy: the batches the tool verifies),
  ``tile`` (alignment on, the default: verify batches rounded down to the CPU kernels' four-row tile)
  and ``cost`` (alignment on and the ``cost`` policy).

Within a repeat, every prompt runs ``none`` first and then, per strategy, the tool and the three specviz
configurations back to back, so each ratio compares runs taken moments apart. Per prompt the median over
repeats is taken, then the median over the kind's prompts. A second table gives, for every workload kind
(``free`` included), each prompt's ``cost``-policy speedup over its partner ``none`` run: the cost policy
should keep every prompt at 0.95x ``none`` or above.

``--eagle3-head HEAD.gguf`` adds specviz's ``eagle3`` with that head and the ``cost`` policy (other knobs
at their defaults, as ``specviz train-eagle3``'s evaluation runs it) to the second table, on every kind
(llama.cpp's tool has no EAGLE-3 drafting for this model pair). The second table's ``same as none``
column counts the runs whose tokens are exactly ``none``'s. ``--sides cost`` runs only the cost policy on
the grounded kinds too (neither the tool nor the fixed-policy runs; the first table is then left out).
``--clock cpu`` divides specviz's tokens by the process's CPU time instead of the wall time: on a loaded
machine, with ``--threads 1``, what each run computes, unaffected by waiting for a core.

``--lengths 4,8,12,16`` asks how far any choice of draft length could take specviz against the tool: each
strategy also runs with the ``fixed`` policy and tile alignment at each of those ``draft_max`` values (for
as many tokens as the tool decoded, right after it), and a third table gives each length's ratio to the
tool, the best of them, the cost policy's ratio and its share of that best. A length policy that knows
in advance how every round ends can still beat the best single length (shorter drafts where the draft
will be rejected), so the best fixed length is a yardstick, not a bound.

The second table's ``priced`` column is the lowest prompt's speedup with every verify batch priced by one
verify-cost curve instead of timed: the curve the cost policy measured in the warm-up (seconds for each
batch size, the same for every run), each run's batches (counted from its ``Verified`` events) summed
with it, and the cost run's tokens per priced second set against its ``none`` partner's. It leaves out
everything but the target's verify batches (drafting, specviz's own time, a noisy neighbour), so it
shows whether the policy's choice of batches pays on this machine; on a virtual machine whose identical
runs differ by 5-15% in wall time, that is what can tell a lost prompt from a noisy one. It is 1.00x
exactly when the cost run verified the batches ``none`` did (the policy drafted nothing).

How the runs end: the tool stops once it has generated at least ``-n`` tokens, often a whole accepted
draft more (145 for ``-n 128`` with 16-token drafts), and its last round's draft is not cut to the budget;
specviz stops at exactly ``max_tokens``. So each specviz configuration that the first table compares with
the tool runs again, right after the tool, for as many tokens as the tool decoded in that repeat (the
``tokens`` column, the median): both sides then decode the same tokens and, for ``same batches``, verify
the same batches to the last (measured on a model whose rounds take 3 ms: 128 tokens in 72 rounds against
the tool's 145 in 73, a 13% difference in tokens per round that was never specviz's speed). The second
table keeps ``max_tokens`` on both of its sides. The ``same output`` column counts the runs whose specviz
text (same batches) is the start of the tool's.

Timings on a shared machine are noisy: publish figures measured on a quiet one.

Usage: python benchmarks/bench_native.py [--repeats 3] [--max-tokens 128] [--threads 2]
           [--kinds code-rewrite,quote,summarise,free] [--strategies ngram-simple,...] [--prompts 0,1]
           [--model GGUF] [--n-gpu-layers N] [--eagle3-head HEAD.gguf] [--sides native,same,tile,cost]
           [--clock wall|cpu] [--lengths 4,8,12,16] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from specviz import Session
from specviz.analysis.native import run_tool
from specviz.analysis.workloads import WORKLOADS
from specviz.backends import LlamaModel
from specviz.decoding.verify_cost import VerifyCostModel
from specviz.models.embedded import default_model_path

#: Each strategy with the same knobs on both sides; every draft is at most 16 tokens (ngram-cache: 8).
STRATEGIES: dict[str, dict[str, Any]] = {
    "ngram-simple": {"size_n": 12, "size_m": 16},
    "ngram-map-k": {"size_n": 12, "size_m": 16},
    "ngram-map-k4v": {"size_n": 12, "size_m": 16},
    "ngram-mod": {"n_match": 24, "n_min": 12, "n_max": 16},
    "ngram-cache": {},
}
DRAFT_MAX = 16  # specviz's own cap: no smaller than any draft above, so it never cuts one
GROUNDED = ("code-rewrite", "quote", "summarise")
CONFIGS: dict[str, dict[str, Any]] = {
    "same": {"align": False, "draft_policy": "fixed"},
    "tile": {"align": True, "draft_policy": "fixed"},
    "cost": {"align": True, "draft_policy": "cost"},
}
#: The key suffix of a specviz run that decodes as many tokens as the tool's run of the same repeat.
VS_TOOL = "@tool"
N_CTX = 4096
N_BATCH = 2048  # the tool needs the whole prompt in one batch (its default)
N_UBATCH = 512


def _tools_dir_module():
    path = Path(__file__).resolve().parent.parent / "tools" / "llama_tools.py"
    spec = importlib.util.spec_from_file_location("llama_tools", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_specviz(session: Session, prompt: str, strategy: str, knobs: dict[str, Any], max_tokens: int) -> dict:
    """One specviz generation: decode tokens/s over the wall time of run() (and over its CPU time)."""
    session.start(prompt, max_tokens, strategy, **knobs)
    t0, c0 = time.perf_counter(), time.process_time()
    rounds = session.run()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    # the verify batches' sizes, for the priced speedup: read from the rounds run() returns, after the
    # timing (a listener would run inside it)
    batches: dict[str, int] = {}
    for rnd in rounds:
        for ev in rnd.of_kind("verified"):
            batches[str(ev.batch_size)] = batches.get(str(ev.batch_size), 0) + 1
    t = session.telemetry_dict()
    n = len(session.tokens)
    return {
        "tokens": n,
        "seconds": seconds,
        "tps": n / seconds if seconds > 0 else 0.0,
        "cpu_tps": n / cpu if cpu > 0 else 0.0,
        "drafted": t["drafted"],
        "accepted": t["accepted"],
        "rounds": t["rounds"],
        "longest_draft": sum(1 for x in t["per_position_tries"] if x),  # depth i is tried by every longer draft
        "batches": batches,
        "ids": list(session.tokens),
    }


def run_native(
    tool: Path, model_path: Path, prompt: str, strategy: str, max_tokens: int, threads: int, ngl: int = 0
) -> dict:
    """One llama-speculative-simple generation (``ngl`` layers on the GPU, as specviz's model)."""
    r = run_tool(
        tool,
        model_path,
        prompt,
        strategy,
        STRATEGIES[strategy],
        n_predict=max_tokens,
        threads=threads,
        n_ctx=N_CTX,
        n_batch=N_BATCH,
        n_ubatch=N_UBATCH,
        extra=["-ngl", str(ngl)],  # explicit: llama.cpp's tools offload everything by default on a GPU build
    )
    return {
        "tokens": r.n_predict,
        "seconds": r.decode_seconds,
        "tps": r.decode_tokens_per_second,
        "drafted": r.n_drafted,
        "accepted": r.n_accept,
        "output": r.output,
    }


def native_table(args, model, model_path, kinds, strategies, prompts, runs, ratio, tps) -> list[dict[str, Any]]:
    """Print the comparison with llama-speculative-simple on the grounded kinds; returns its rows."""
    print(
        f"\nspecviz vs llama-speculative-simple: {model_path.name}, n_gpu_layers={args.n_gpu_layers}, "
        f"{args.threads} threads, {args.max_tokens} "
        f"tokens, draft sizes {DRAFT_MAX} (ngram-cache 8); median over {args.repeats} repeats per prompt, then "
        "over prompts"
    )
    print(
        "| workload | strategy | tokens | llama.cpp t/s | same batches t/s | ratio | tile t/s | ratio | cost t/s "
        "| ratio | same output |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    table: list[dict[str, Any]] = []
    for kind in [k for k in kinds if k in GROUNDED]:
        for strat in strategies:
            ps = prompts[kind]
            row: dict[str, Any] = {
                "kind": kind,
                "strategy": strat,
                "native_tps": med([tps(kind, p, (strat, "native")) for p in ps]),
            }
            for side in CONFIGS:
                row[f"{side}_tps"] = med([tps(kind, p, (strat, side + VS_TOOL)) for p in ps])
                row[f"{side}_ratio"] = med([ratio(kind, p, strat, side + VS_TOOL, (strat, "native")) for p in ps])
            row["tokens"] = med([float(r["tokens"]) for p in ps for r in runs[kind][p][(strat, "native")]])
            same = total = 0
            for p in ps:
                for nat, sv in zip(runs[kind][p][(strat, "native")], runs[kind][p][(strat, "same" + VS_TOOL)]):
                    text = b"".join(model.piece_bytes(t) for t in model.tokenize(WORKLOADS[kind][p]) + sv["ids"])
                    same += nat["output"].startswith(b"\n\n" + text)
                    total += 1
            row["same_output"] = f"{same}/{total}"
            table.append(row)
            print(
                f"| {kind} | {strat} | {row['tokens']:.0f} | {row['native_tps']:.1f} | {row['same_tps']:.1f} "
                f"| {row['same_ratio']:.2f}× "
                f"| {row['tile_tps']:.1f} | {row['tile_ratio']:.2f}× | {row['cost_tps']:.1f} | "
                f"{row['cost_ratio']:.2f}× | {row['same_output']} |"
            )

    return table


def length_side(n: int) -> str:
    """The key of a fixed-policy run with drafts cut to ``n`` tokens, decoding as many tokens as the tool."""
    return f"fixed-{n}{VS_TOOL}"


def lengths_table(kinds, strategies, prompts, lengths, ratio) -> list[dict[str, Any]]:
    """Print each draft length's ratio to the tool (fixed policy, tile alignment), the best of them and
    the cost policy against it, on the grounded kinds; returns its rows."""
    print(
        "\ndraft length against llama-speculative-simple: specviz's fixed policy with tile alignment, drafts cut "
        "to each length, the same tokens as the tool; median over repeats per prompt, then over prompts"
    )
    heads = " | ".join(f"{n}" for n in lengths)
    print(f"| workload | strategy | {heads} | best | cost policy | cost / best |")
    print("|---|---|" + "---:|" * (len(lengths) + 3))
    rows: list[dict[str, Any]] = []
    for kind in [k for k in kinds if k in GROUNDED]:
        ps = prompts[kind]
        for strat in strategies:
            tool = (strat, "native")
            by_length = {n: med([ratio(kind, p, strat, length_side(n), tool) for p in ps]) for n in lengths}
            best = max(by_length, key=lambda n: by_length[n])
            cost = med([ratio(kind, p, strat, "cost" + VS_TOOL, tool) for p in ps])
            ratios = {str(n): r for n, r in by_length.items()}  # as JSON keeps them
            row = {"kind": kind, "strategy": strat, "ratios": ratios, "best": best, "cost_ratio": cost}
            rows.append(row)
            cells = " | ".join(f"{by_length[n]:.2f}×" for n in lengths)
            share = cost / by_length[best] if by_length[best] > 0 else float("nan")
            print(f"| {kind} | {strat} | {cells} | {by_length[best]:.2f}× ({best}) | {cost:.2f}× | {share:.2f} |")
    return rows


def priced_seconds(batches: dict[str, int], prices: VerifyCostModel) -> float:
    """A run's verify batches (size -> count, as :func:`run_specviz` counts them) priced by ``prices``."""
    return sum(prices(int(b)) * n for b, n in batches.items())


def priced_speedup(runs: list[dict], partners: list[dict], prices: VerifyCostModel) -> float:
    """Median over repeats of each run's tokens per priced second (:func:`priced_seconds`) over its
    partner's (the same repeat's ``none`` run)."""
    out = []
    for x, y in zip(runs, partners):
        px, py = priced_seconds(x["batches"], prices), priced_seconds(y["batches"], prices)
        if px > 0 and py > 0:
            out.append((x["tokens"] / px) / (y["tokens"] / py))
    return med(out)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--kinds",
        default=",".join(WORKLOADS),
        help="workload kinds (the native table uses the grounded ones among them)",
    )
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--prompts", default="", help="prompt indices per kind (default: all)")
    ap.add_argument("--model", default="", help="a GGUF to run instead of the embedded Gemma 3 270M")
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="layers on the GPU, both sides (a GPU build)")
    ap.add_argument("--eagle3-head", default="", help="also run eagle3 with this head and the cost policy")
    ap.add_argument(
        "--sides",
        default="native,same,tile,cost",
        help="what runs on the grounded kinds: the tool (native) and specviz's configurations (same, tile, cost)",
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="tokens/s over wall time, or over the process's CPU time (a loaded machine; not with the tool)",
    )
    ap.add_argument(
        "--lengths",
        default="",
        help="also run the fixed policy with tile alignment at each of these draft lengths against the tool",
    )
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON as well")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    strategies = [s for s in args.strategies.split(",") if s]
    grounded_sides = [x for x in args.sides.split(",") if x]
    for x in grounded_sides:
        if x != "native" and x not in CONFIGS:
            ap.error(f"--sides: unknown side {x!r}; choose from native, {', '.join(CONFIGS)}")
    if "cost" not in grounded_sides:
        ap.error("--sides must include cost (the second table compares it with none)")
    full_table = set(grounded_sides) == {"native", *CONFIGS}
    if args.clock == "cpu" and "native" in grounded_sides and strategies:
        ap.error("--clock cpu times specviz's own process: give --sides without native")
    metric = "tps" if args.clock == "wall" else "cpu_tps"
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x]
    except ValueError:
        ap.error(f"--lengths: {args.lengths!r} is not a comma-separated list of draft lengths, e.g. 4,8,12,16")
    if any(not 1 <= n <= DRAFT_MAX for n in lengths):
        ap.error(f"--lengths: each draft length must be from 1 to {DRAFT_MAX} (the drafts' cap), got {args.lengths}")
    if lengths and not full_table:
        ap.error("--lengths compares draft lengths with the tool: leave --sides at native,same,tile,cost")
    eagle3 = {"draft_model": args.eagle3_head, **CONFIGS["cost"]} if args.eagle3_head else None
    if not strategies and eagle3 is None:
        ap.error("nothing to run: give --strategies or --eagle3-head")
    for k in kinds:
        if k not in WORKLOADS:
            ap.error(f"--kinds: unknown kind {k!r}; choose from {', '.join(WORKLOADS)}")
    for s in strategies:
        if s not in STRATEGIES:
            ap.error(f"--strategies: {s!r} is not one of llama.cpp's draftless types {', '.join(STRATEGIES)}")
    tools = _tools_dir_module()
    tool = tools.tool_path("llama-speculative-simple")
    if tool is None and "native" in grounded_sides and strategies:
        print(f"llama-speculative-simple is not built in {tools.tools_dir()}: run `make llama-tools`", file=sys.stderr)
        return 2

    model_path = Path(args.model) if args.model else default_model_path()
    model = LlamaModel(model_path, n_gpu_layers=args.n_gpu_layers)
    session = Session(model, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_UBATCH, n_threads=args.threads)
    prompts = {
        k: [i for i in range(len(WORKLOADS[k])) if not args.prompts or str(i) in args.prompts.split(",")] for k in kinds
    }

    # warm-up, untimed: page the model in on both sides; the cost policy measures the verify cost once
    warm = WORKLOADS[kinds[0]][prompts[kinds[0]][0]]
    if strategies:
        if "native" in grounded_sides:
            run_native(tool, model_path, warm, strategies[0], 16, args.threads, args.n_gpu_layers)
        for cfg in CONFIGS.values():
            run_specviz(session, warm, strategies[0], dict(STRATEGIES[strategies[0]], draft_max=DRAFT_MAX, **cfg), 16)
    if eagle3 is not None:
        run_specviz(session, warm, "eagle3", eagle3, 16)
    # the curve the warm-up's cost run measured, as it stood then: one price list for every run
    prices = VerifyCostModel(*session.cost_model.points()) if session.cost_model is not None else None

    # runs[kind][prompt][(strategy, side)] -> list of results over repeats; side: native, same, tile, cost
    runs: dict[str, dict[int, dict[tuple[str, str], list[dict]]]] = {k: {p: {} for p in prompts[k]} for k in kinds}
    for rep in range(args.repeats):
        for kind in kinds:
            for p in prompts[kind]:
                prompt = WORKLOADS[kind][p]
                cell = runs[kind][p]
                cell.setdefault(("none", "none"), []).append(run_specviz(session, prompt, "none", {}, args.max_tokens))
                if eagle3 is not None:
                    cell.setdefault(("eagle3", "cost"), []).append(
                        run_specviz(session, prompt, "eagle3", eagle3, args.max_tokens)
                    )
                for strat in strategies:
                    sides = ["cost"] if kind not in GROUNDED else grounded_sides
                    n_tool = None  # the tokens the tool decoded in this repeat: its comparisons decode as many
                    for side in sorted(sides, key=lambda x: x != "native"):  # the tool first
                        if side == "native":
                            res = run_native(
                                tool, model_path, prompt, strat, args.max_tokens, args.threads, args.n_gpu_layers
                            )
                            n_tool = res["tokens"]
                            cell.setdefault((strat, side), []).append(res)
                            continue
                        knobs = dict(STRATEGIES[strat], draft_max=DRAFT_MAX, **CONFIGS[side])
                        res = run_specviz(session, prompt, strat, knobs, args.max_tokens)
                        cell.setdefault((strat, side), []).append(res)
                        if n_tool is not None:
                            same_n = n_tool == args.max_tokens
                            vs = res if same_n else run_specviz(session, prompt, strat, knobs, n_tool)
                            cell.setdefault((strat, side + VS_TOOL), []).append(vs)
                    if n_tool is not None:
                        for n in lengths:
                            knobs = dict(STRATEGIES[strat], **CONFIGS["tile"], draft_max=n)
                            res = run_specviz(session, prompt, strat, knobs, n_tool)
                            cell.setdefault((strat, length_side(n)), []).append(res)
            print(f"repeat {rep + 1}/{args.repeats}: {kind} done", file=sys.stderr, flush=True)

    def ratio(kind: str, p: int, strat: str, side: str, base: tuple[str, str]) -> float:
        """Median over repeats of a run's tokens/s over its partner's (same repeat, same prompt)."""
        a, b = runs[kind][p][(strat, side)], runs[kind][p][base]
        return med([x[metric] / y[metric] for x, y in zip(a, b) if y[metric] > 0])

    def tps(kind: str, p: int, key: tuple[str, str]) -> float:
        return med([x[metric] for x in runs[kind][p][key]])

    def priced(kind: str, p: int, strat: str) -> float:
        assert prices is not None
        return priced_speedup(runs[kind][p][(strat, "cost")], runs[kind][p][("none", "none")], prices)

    table: list[dict[str, Any]] = []
    length_rows: list[dict[str, Any]] = []
    if full_table:
        table = native_table(args, model, model_path, kinds, strategies, prompts, runs, ratio, tps)
        if lengths:
            length_rows = lengths_table(kinds, strategies, prompts, lengths, ratio)
    else:
        print(f"(--sides {args.sides}: the comparison with llama-speculative-simple is left out)")

    clock = "" if args.clock == "wall" else " (tokens over the process's CPU time)"
    print(f"\ncost policy vs none, per prompt: paired speedup{clock}, median over {args.repeats} repeats")
    n_cols = max(len(prompts[k]) for k in kinds)
    print(
        "| workload | strategy | " + " | ".join(f"#{i}" for i in range(n_cols)) + " | lowest | priced | same as none |"
    )
    print("|---|---|" + "---:|" * (n_cols + 3))
    per_prompt: list[dict[str, Any]] = []
    rows = [*strategies, *(["eagle3"] if eagle3 is not None else [])]
    for kind in kinds:
        ps = prompts[kind]
        cells = [f"{tps(kind, p, ('none', 'none')):.1f} t/s" for p in ps]
        print(f"| {kind} | none | " + " | ".join(cells) + " | | | |")
        for strat in rows:
            rs = {p: ratio(kind, p, strat, "cost", ("none", "none")) for p in ps}
            pairs = [
                (x, y) for p in ps for x, y in zip(runs[kind][p][(strat, "cost")], runs[kind][p][("none", "none")])
            ]
            same = sum(x["ids"] == y["ids"] for x, y in pairs)
            by_price = {p: priced(kind, p, strat) for p in ps} if prices is not None else {}
            per_prompt.append(
                {"kind": kind, "strategy": strat, "speedups": rs, "priced": by_price, "same_as_none": same}
            )
            low = min(rs.values())
            flag = " (below 0.95×)" if low < 0.95 else ""
            low_priced = f"{min(by_price.values()):.2f}×" if by_price else "–"
            print(
                f"| {kind} | {strat} | "
                + " | ".join(f"{rs[p]:.2f}×" for p in ps)
                + f" | {low:.2f}×{flag} | {low_priced} | {same}/{len(pairs)} |"
            )

    if args.json:
        raw = {
            k: {
                str(p): {
                    f"{s}/{side}": [{key: v for key, v in r.items() if key not in ("ids", "output")} for r in rs]
                    for (s, side), rs in cell.items()
                }
                for p, cell in kp.items()
            }
            for k, kp in runs.items()
        }
        out = {
            "table": table,
            "lengths": length_rows,
            "cost_vs_none": per_prompt,
            "prices": {"sizes": prices.sizes.tolist(), "seconds": prices.seconds.tolist()} if prices else None,
            "runs": raw,
        }
        print(json.dumps(out, indent=1))
    session.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
