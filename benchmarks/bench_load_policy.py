"""Benchmark: drafting under load. N requests at once in one batched run (llama-server's ``-np N``), each setting
fixed against the load-aware policy, total tokens/s at each concurrency.

On the embedded Gemma 3 270M, ``--max-tokens`` tokens per request, the requests' prompts taken in turn from the
``quote``, ``code-rewrite`` and ``free`` workloads, greedy; for each concurrency ``p`` in ``--parallel``, a
:class:`~specviz.decoding.batch.BatchRun` with ``p`` slots and ``p × --waves`` requests (the first ``p`` start
together; each later one takes the first free slot, as a server's queue does; they finish when they finish), in
each cache of ``--layouts`` (``split`` over the slots, llama-server's ``-np`` alone; ``unified``, ``-np`` with
``-kvu``), under:

* ``none`` (plain decoding);
* ``ngram-simple`` (``size_n`` 3) with fixed drafts of each ``--draft-max`` length (the fixed policy);
* **load-aware**: ``ngram-simple`` under the ``cost`` policy priced with the batch as laid out (a batch-cost table
  measured once on this machine at the start, at the draft lengths of :func:`table_lengths`:
  :func:`~specviz.decoding.batch_cost.measure_batch_cost`; each
  request's round priced as its share of the batch: :func:`~specviz.decoding.batch_layout.share_round_cost`);
* **scheduled**: ``ngram-simple`` with fixed drafts capped by a draft schedule (vLLM's ``[start, end, k]``) chosen
  per cache layout from a recording of the prompts run alone at the longest draft and the same batch-cost table
  (:func:`~specviz.analysis.load_schedule.schedule_for_load`, what ``specviz advise REC --parallel … --schedule``
  prints), the batch priced as laid out, every slot busy (steady load);
* **burst-scheduled**: the same, the schedule chosen for the run this benchmark makes: ``--waves`` requests a slot
  arriving together, replayed from the recording's requests to the last (``schedule_for_load(..., burst=waves)``,
  ``advise … --schedule --burst W``: the slots that fall idle and the tail priced).

Total tokens/s is every request's generated tokens over the run's wall time (prompts included, as a server's
throughput is); each cell is the median of ``--repeats`` runs, the settings interleaved. A second table prices
every run's decodes as laid out at the batch-cost table's times (:func:`priced_seconds`): tokens per second of
decode, free of a shared machine's noise (the requests' own work aside). The load-aware policy's targets (issue
54), judged in each table against the settings in the same cache: never more than 5% below the best fixed
setting and never more than 5% below ``none`` at any concurrency. It also counts the batched requests whose
greedy tokens differ from the same request run alone, and tells each a near-tie or not
(:func:`~specviz.analysis.equivalence.first_divergence`: at the first token they part, both runs' top two are the
two tokens chosen, the batch shape having moved the logits between them) with the margins there. Last, the
recording the schedules are chosen from, replayed for each run (:func:`replayed_rate`), against the run priced: how
far the model itself is off.

Usage: python benchmarks/bench_load_policy.py [--parallel 1,2,4,8] [--draft-max 2,4,8,16] [--max-tokens 128]
       [--repeats 2] [--waves 1] [--layouts split,unified] [--table-drafts aligned|issue] [--threads N]
       [--model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from specviz import Session
from specviz.analysis.batch_equivalence import ranks_alone
from specviz.analysis.equivalence import first_divergence, greedy_run
from specviz.analysis.load_burst import burst_rate, recorded_requests
from specviz.analysis.load_schedule import drafting_group, effective_length, schedule_for_load
from specviz.analysis.workloads import WORKLOADS
from specviz.backends.llama import LlamaContext
from specviz.decoding.batch import BatchRun, scheduled_length
from specviz.decoding.batch_cost import DRAFT_LENGTHS, measure_batch_cost
from specviz.decoding.batch_layout import layout_seconds
from specviz.decoding.events import BatchStepped
from specviz.decoding.machine_load import load_average
from specviz.decoding.tiling import tile_aligned

#: The load-aware policy's margins (issue 54's targets).
BELOW_BEST, BELOW_NONE = 0.05, 0.05
#: The context of the runs alone (the reference tokens): its size changes the attention's reduction, so a
#: position evaluated again to explain a divergence uses the same.
ALONE_CTX = 2048
#: The settings that follow the load (judged against the others, the fixed ones).
POLICIES = ("load-aware", "scheduled", "burst-scheduled")
#: The caches a run can lay its sequences out in: split over the slots (llama-server's ``-np``) or one they
#: share (``-np`` with ``-kvu``).
LAYOUTS = ("split", "unified")


def table_lengths(setups: dict[str, tuple[str, dict[str, Any]]], which: str) -> list[int]:
    """The draft lengths the batch-cost table measures: ``aligned``, every length a round can use up to the longest
    draft (the ones the verify tile of 4 rows leaves: batches of up to 4 rows and multiples of 4), whose prices the
    policy then reads as measured; ``issue``, issue 54's 0, 2, 4, 8 and 16 (batches of 1, 3, 5, 9 and 17 rows,
    sizes a tiled round never uses, between which a tiled size is overpriced: 8 rows read as 61 ms, measured 49)."""
    if which == "issue":
        return list(DRAFT_LENGTHS)
    longest = max(int(o.get("draft_max", 0)) for _, o in setups.values())
    return [k for k in range(longest + 1) if tile_aligned(k, 4) == k]


def prompts(n: int) -> list[str]:
    """``n`` prompts, taken in turn from the quote, code-rewrite and free workloads."""
    kinds = [WORKLOADS["quote"], WORKLOADS["code-rewrite"], WORKLOADS["free"]]
    return [kinds[i % 3][(i // 3) % len(kinds[i % 3])] for i in range(n)]


def settings(draft_maxes: list[int]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each setting's strategy and options."""
    out: dict[str, tuple[str, dict[str, Any]]] = {"none": ("none", {})}
    for k in draft_maxes:
        out[f"ngram-simple k={k}"] = ("ngram-simple", {"size_n": 3, "draft_max": k, "draft_policy": "fixed"})
    out["load-aware"] = ("ngram-simple", {"size_n": 3, "draft_max": max(draft_maxes), "draft_policy": "cost"})
    out["scheduled"] = ("ngram-simple", {"size_n": 3, "draft_max": max(draft_maxes), "draft_policy": "fixed"})
    out["burst-scheduled"] = out["scheduled"]
    return out


def record_alone(session: Any, setting: tuple[str, dict], n: int, max_tokens: int) -> list[Any]:
    """The events of the first ``n`` prompts run alone, one after another, with ``setting`` (as ``specviz run
    --record`` writes them): the recording a draft schedule is chosen from."""
    strategy, options = setting
    events: list[Any] = []
    for text in dict.fromkeys(prompts(n)):
        session.start(text, max_tokens, strategy, **options)
        session.run()
        events.extend(session.events)
    return events


def priced_seconds(steps: list[Any], p: int, table: Any, unified: bool) -> float:
    """The run's decodes priced as laid out (:func:`~specviz.decoding.batch_layout.layout_seconds`): what the
    decodes would have taken at the batch-cost table's times, free of the machine's noise."""
    total = 0.0
    for e in steps:
        rows = [0] * p
        for lane in e.lanes:
            rows[lane["slot"]] = lane["rows"]
        total += layout_seconds(table, rows, unified) if any(rows) else 0.0
    return total


def replayed_rate(
    recording: list[Any],
    recorded: list[str],
    setting: tuple[str, dict],
    p: int,
    waves: int,
    table: Any,
    unified: bool,
    schedule: Any,
) -> float:
    """What the burst replay (:func:`~specviz.analysis.load_burst.burst_rate`) of the prompts recorded alone predicts
    for the run of ``setting`` with ``p`` slots (``recorded``: the prompts of ``recording`` in order): the run's own
    queue of prompts, each draft capped as the run caps it
    (a fixed length, or ``schedule`` by busy count), priced at the table without the requests' own work (as
    :func:`priced_seconds` prices the run). Beside the priced run it shows how far the replay the schedules are chosen
    from is off, request texts and drafting alike."""
    label, rounds = drafting_group(recording)
    requests = recorded_requests(recording, label)
    order = {text: i for i, text in enumerate(recorded)}
    strategy, options = setting
    fixed = int(options.get("draft_max", 0)) if strategy != "none" else 0
    caps = [fixed if schedule is None else min(fixed, scheduled_length(schedule, b) or 0) for b in range(1, p + 1)]
    by_busy = [effective_length(k, rounds.knobs) for k in caps]
    queue = [order[text] for text in prompts(p * waves)]
    return burst_rate(requests, [queue], p, by_busy, table, unified=unified, lane=0.0)


def one_run(
    model: Any,
    p: int,
    setting: tuple[str, dict],
    a: argparse.Namespace,
    table: Any,
    unified: bool,
    schedule: Any = None,
) -> tuple[float, list, float]:
    """One batched run of ``p`` requests (``unified``: in one cache the sequences share, llama-server's ``-kvu``;
    ``schedule``: the draft schedule, vLLM's form):
    total tokens/s, each request's tokens and top-two margins, and tokens per second of decode at the table's
    prices."""
    strategy, options = setting
    priced = table if options.get("draft_policy") == "cost" else None
    run_args: dict[str, Any] = dict(n_ctx=p * 1024, n_threads=a.threads, batch_cost=priced, kv_unified=unified)
    run_args.update(record_margins=True, draft_schedule=schedule)
    with BatchRun(model, n_parallel=p, **run_args) as b:
        for text in prompts(p * a.waves):
            b.submit(text, a.max_tokens, strategy, **options)
        t0 = time.perf_counter()
        results = b.run()
        wall = time.perf_counter() - t0
        steps = [e for e in b.events if isinstance(e, BatchStepped)]
    made = sum(len(r.tokens) for r in results)
    return made / wall, [(r.tokens, r.margins) for r in results], made / priced_seconds(steps, p, table, unified)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", default="1,2,4,8")
    ap.add_argument("--draft-max", default="2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--table-drafts", choices=("aligned", "issue"), default="aligned", help="see table_lengths")
    ap.add_argument("--waves", type=int, default=1, help="requests per slot, queued (continuous batching)")
    ap.add_argument("--layouts", default="split,unified", help="split (-np alone) and/or unified (-np with -kvu)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    parallels = [int(x) for x in a.parallel.split(",")]
    draft_maxes = [int(x) for x in a.draft_max.split(",")]
    setups = settings(draft_maxes)
    layouts = [x.strip() for x in a.layouts.split(",") if x.strip()]
    if not layouts or any(x not in LAYOUTS for x in layouts):
        ap.error(f"--layouts: split and/or unified, got {a.layouts!r}")
    alone_args: dict[str, Any] = dict(n_ctx=ALONE_CTX, n_threads=a.threads)  # a row evaluated alone again too
    with Session(a.model, **alone_args) as s:
        model = s.model
        alone = {}
        for text in set(prompts(max(parallels) * a.waves)):
            tokens, margins, _ = greedy_run(s, text, a.max_tokens, "none", {})
            alone[text] = (tokens, margins, list(s.prompt_tokens))
        ctx = LlamaContext(model, n_ctx=max(parallels) * 512, n_seq_max=max(parallels), n_threads=a.threads)
        try:
            seqs, lengths = sorted({1, *parallels}), table_lengths(setups, a.table_drafts)
            table = measure_batch_cost(
                ctx, model.tokenize(WORKLOADS["quote"][0]), sequences=seqs, draft_lengths=lengths
            )
        finally:
            ctx.close()
        recording = record_alone(s, setups["scheduled"], max(parallels) * a.waves, a.max_tokens)
        recorded = list(dict.fromkeys(prompts(max(parallels) * a.waves)))  # record_alone's order
        candidates = sorted({*lengths, *draft_maxes})
        schedules = {
            (name, lay): schedule_for_load(
                recording, table, max(parallels), candidates, unified=lay == "unified", burst=burst
            )
            for name, burst in (("scheduled", None), ("burst-scheduled", a.waves))
            for lay in layouts
        }
        for (name, lay), sched in schedules.items():
            print(f"  {name}, {lay} cache: {sched.schedule}", file=sys.stderr, flush=True)
        load_start = load_average()
        rows = [(p, lay) for p in parallels for lay in layouts]
        cells: dict[tuple[int, str], dict[str, list[float]]] = {row: {name: [] for name in setups} for row in rows}
        priced: dict[tuple[int, str], dict[str, list[float]]] = {row: {name: [] for name in setups} for row in rows}
        parted: list[dict[str, Any]] = []
        replays: list[dict[str, Any]] = []
        n_requests = 0
        for r in range(a.repeats):
            for p, lay in rows:
                names = list(setups) if r % 2 == 0 else list(reversed(setups))
                for name in names:
                    sched = schedules[(name, lay)].schedule if (name, lay) in schedules else None
                    rate, tokens, at_table = one_run(model, p, setups[name], a, table, lay == "unified", sched)
                    cells[(p, lay)][name].append(rate)
                    priced[(p, lay)][name].append(at_table)
                    if r == 0 and name != "load-aware":
                        sched = schedules[(name, lay)].schedule if (name, lay) in schedules else None
                        predicted = replayed_rate(
                            recording, recorded, setups[name], p, a.waves, table, lay == "unified", sched
                        )
                        replays.append(dict(parallel=p, layout=lay, setting=name, replayed=predicted, priced=at_table))
                    print(f"  {p} at once, {lay}, {name}: {rate:.1f} tokens/s", file=sys.stderr, flush=True)
                    for i, ((got, got_m), text) in enumerate(zip(tokens, prompts(p * a.waves))):
                        n_requests += 1
                        div = first_divergence(*alone[text][:2], got, got_m)
                        if div is not None:
                            parted.append(divergence_row(div, p, lay, name, i, text))
                            if not div.same_pair and None not in (div.token_a, div.token_b):
                                ref, _, prompt_ids = alone[text]
                                chosen = {"alone": div.token_a, "batched": div.token_b}
                                ranks = ranks_alone(model, prompt_ids + ref[: div.index], chosen, **alone_args)
                                parted[-1]["ranks_alone"] = ranks
    out = report_data(cells, rows, setups, a, parted, load_start, table)
    out["batched_requests"] = n_requests
    out["priced"] = [verdict(p, lay, priced[(p, lay)]) for p, lay in rows]
    out["replayed"] = replays
    out["schedules"] = {f"{name}, {lay}": sched.to_dict() for (name, lay), sched in schedules.items()}
    if a.json:
        print(json.dumps(out))
    else:
        report(out)
    return 0


def verdict(p: int, lay: str, cell: dict[str, list[float]]) -> dict[str, Any]:
    """One concurrency and cache's medians, the best fixed setting and each load-following policy's verdict."""
    med = {name: statistics.median(v) for name, v in cell.items()}
    fixed = {k: v for k, v in med.items() if k not in POLICIES}
    best = max(fixed, key=lambda k: fixed[k])
    judged = {}
    for name in POLICIES:
        got = med[name]
        judged[name] = {
            "vs_best": got / fixed[best] - 1.0,
            "vs_none": got / med["none"] - 1.0,
            "meets": got >= (1 - BELOW_BEST) * fixed[best] and got >= (1 - BELOW_NONE) * med["none"],
        }
    return {"parallel": p, "layout": lay, "tokens_per_second": med, "best_fixed": best, "policies": judged}


def divergence_row(div: Any, p: int, lay: str, name: str, request: int, prompt: str) -> dict[str, Any]:
    """A batched request that parted from the same request alone: where, whether at a near-tie, the margins."""
    return {
        "parallel": p,
        "layout": lay,
        "setting": name,
        "request": request,
        "prompt": prompt[:40],
        "index": div.index,
        "near_tie": div.same_pair,
        "margin_alone": div.margin_a[0] if div.margin_a else None,
        "margin_batched": div.margin_b[0] if div.margin_b else None,
    }


def report_data(cells, runs, setups, a, parted, load_start, table) -> dict[str, Any]:
    """The medians per cell and the targets' verdicts (each layout's policy against that layout's settings)."""
    rows = [verdict(p, lay, cells[(p, lay)]) for p, lay in runs]
    return {
        "max_tokens": a.max_tokens,
        "repeats": a.repeats,
        "waves": a.waves,
        "settings": list(setups),
        "rows": rows,
        "greedy_mismatches": len(parted),
        "parted": parted,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "batch_cost": table.to_dict(),
    }


def table_text(rows: list[dict[str, Any]], names: list[str]) -> list[str]:
    """Rows of verdicts (:func:`verdict`) as text lines: each setting's tokens/s, then each policy against the best
    fixed setting and ``none``, and the targets' verdict."""
    head = "".join(f"{n + ' vs best':>24}{'vs none':>9}  target" for n in POLICIES)
    out = [f"{'p':>3} {'cache':>8}" + "".join(f"{n:>18}" for n in names) + head]
    for r in rows:
        t = r["tokens_per_second"]
        judged = "".join(
            f"{j['vs_best']:>+24.1%}{j['vs_none']:>+9.1%}  {'met   ' if j['meets'] else 'MISSED'}"
            for j in (r["policies"][n] for n in POLICIES)
        )
        out.append(f"{r['parallel']:>3} {r['layout']:>8}" + "".join(f"{t[n]:>18.1f}" for n in names) + judged)
    return out


def report(out: dict[str, Any]) -> None:
    """The tables as text: measured, then at the batch-cost table's prices."""
    names = out["settings"]
    la = out["load_average_start"], out["load_average_end"]
    print(
        f"bench_load_policy — {out['max_tokens']} tokens a request, {out['waves']} per slot, median of "
        f"{out['repeats']}, total tokens/s; "
        f"load average {la[0][0] if la[0] else float('nan'):.2f} -> {la[1][0] if la[1] else float('nan'):.2f}"
    )
    print("\n".join(table_text(out["rows"], names)))
    print("tokens per second of decode, the decodes priced as laid out at the batch-cost table's times (no noise):")
    print("\n".join(table_text(out["priced"], names)))
    for which, sched in out["schedules"].items():
        print(f"draft schedule, {which} cache (busy sequences start-end: k): {sched['draft_schedule']}")
    replay_lines(out["replayed"])
    parted = out["parted"]
    ties = [d for d in parted if d["near_tie"]]
    print(
        f"batched requests whose greedy tokens differ from the request run alone: {len(parted)} of "
        f"{out['batched_requests']}; at a near-tie (both runs' top two are the two tokens chosen): {len(ties)}"
    )
    places = {(d["prompt"], d["index"]): max(d["margin_alone"], d["margin_batched"]) for d in ties}
    if places:
        margins = sorted(places.values())
        print(
            f"  at {len(places)} distinct places (prompt, token) in {len({k[0] for k in places})} prompts; the top-two "
            f"margin there (logits, the larger of the two runs'): median {statistics.median(margins):.3f}, "
            f"largest {margins[-1]:.3f}"
        )
    for d in parted:
        if not d["near_tie"]:
            r = d.get("ranks_alone", {})
            where = ", ".join(f"the {k} token rank {n}, {g:.3f} logits below the top" for k, (n, g) in r.items())
            print(
                f"  outside each other's top two: {d['prompt']!r} token {d['index']} ({d['parallel']} at once, "
                f"{d['layout']}, {d['setting']}); that row evaluated alone again: {where or 'one run had stopped'}"
            )


def replay_lines(replays: list[dict[str, Any]]) -> None:
    """The burst replay of the recording against each run priced (the first repeat's): the median error and the
    runs it is more than 5% off."""
    if not replays:
        return
    errors = [r["replayed"] / r["priced"] - 1.0 for r in replays]
    off = [(r, e) for r, e in zip(replays, errors) if abs(e) > 0.05]
    print(
        f"the recording replayed (load_burst) against each run priced: median error "
        f"{statistics.median(abs(e) for e in errors):.1%}; {len(off)} of {len(replays)} runs more than 5% off:"
    )
    for r, e in off:
        print(
            f"  {r['parallel']} {r['layout']} {r['setting']}: replayed {r['replayed']:.1f}, "
            f"priced {r['priced']:.1f} ({e:+.1%})"
        )


if __name__ == "__main__":
    sys.exit(main())
