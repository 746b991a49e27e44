"""Benchmark: advice that a busy machine cannot fool. One setting recorded on a quiet machine and under two kinds of
outside load, each recording advised afterwards on the quiet machine; the advice from a busy recording should
say the machine was busy and come within 15% of the quiet recording's.

On the embedded Gemma 3 270M, one prompt (default: the third ``code-rewrite`` workload prompt, a code edit),
``ngram-simple`` with ``size_n`` 3, greedy, ``--max-tokens`` tokens:

1. **quiet**: ``none`` and ``ngram-simple`` run ``--repeats`` times, interleaved: the measured speedup; the
   ``ngram-simple`` run's events are the quiet recording;
2. **steady**: recorded while ``--loops`` busy-loop processes (default 2, one per core here) hold the cores;
3. **bursts**: recorded while ``--burst-loops`` processes (default 4) spin in bursts, ``--burst-on`` seconds on
   and as long off, in step (a build or a test run that comes and goes);
4. with every load process gone, each recording is advised twice: as recorded (:func:`advise` on its own
   timings) and with the verify cost measured afresh on this machine (``specviz advise FILE --fresh``:
   :func:`~specviz.analysis.advise_fresh.measure_recorded`, ``fresh=True``).

It prints, per recording: tokens/s as run, the run's CPU share, the advisor's load verdict, the best setting's
speedup as recorded and fresh (advised, or declined where it is within the recording's uncertainty: the decision
is printed beside it), and the fresh figure against the quiet recording's fresh figure ("within 15%" or not).
The load processes are bounded (each exits by itself after ``--load-seconds``) and killed when their run ends.
The load average before each phase is printed: a "quiet" phase on a machine that was not quiet is named as such.

Usage: python benchmarks/bench_busy_advice.py [--kind code-rewrite] [--prompt 2] [--max-tokens 96]
       [--repeats 3] [--loops 2] [--burst-loops 4] [--burst-on 0.5] [--model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from specviz import Session
from specviz.analysis.advise import advise
from specviz.analysis.advise_fresh import measure_recorded
from specviz.analysis.workloads import WORKLOADS
from specviz.decoding.machine_load import cpu_share, load_average
from specviz.testing.outside_load import busy_loops

#: The busy-advice target: the advice from a busy recording within this of the quiet recording's.
WITHIN = 0.15
KNOBS = {"size_n": 3}


def one_run(s: Session, prompt: str, max_tokens: int, strategy: str) -> tuple[list, float, float | None]:
    """One greedy generation: its events, tokens/s (generated over decode seconds) and pooled CPU share."""
    s.start(prompt, max_tokens, strategy, **(KNOBS if strategy == "ngram-simple" else {}))
    s.run()
    t = s.telemetry_dict()
    rate = t["n_generated"] / t["seconds"] if t["seconds"] else 0.0
    return list(s.events), rate, cpu_share(t["cpu_seconds"], t["seconds"], t.get("n_threads"))


def advice_figures(events: list, model: str | None) -> dict[str, Any]:
    """The recording advised as recorded and with a fresh verify-cost measurement."""
    out: dict[str, Any] = {}
    for how in ("as_recorded", "fresh"):
        cost = measure_recorded(events, model) if how == "fresh" else None
        adv = advise(events, cost=cost, fresh=cost is not None)
        # the best setting found, whether advised or declined as within the recording's uncertainty: the figure
        # the two recordings are compared by (the decision is reported beside it)
        best = adv.best if adv.best is not None and adv.best.strategy != "none" else adv.declined or adv.best
        out[how] = {
            "setting": best.strategy if best else None,
            "draft_max": best.draft_max if best else None,
            "speedup": best.speedup if best else None,
            "advised": adv.pays,
            "flags": adv.flags,
            "text": adv.text,
            "verdict": adv.load.verdict if adv.load else None,
            "load": adv.load.headline() if adv.load else "",
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="code-rewrite", choices=list(WORKLOADS))
    ap.add_argument("--prompt", type=int, default=2, help="which prompt of the kind")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loops", type=int, default=2, help="busy loops of the steady load")
    ap.add_argument("--burst-loops", type=int, default=4, help="busy loops of the bursts")
    ap.add_argument("--burst-on", type=float, default=0.5, help="seconds each burst lasts (and each pause)")
    ap.add_argument("--load-seconds", type=float, default=120.0, help="the most a load process lives")
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    prompt = WORKLOADS[a.kind][a.prompt]
    s = Session(a.model, n_ctx=4096)
    model = str(s.model.path)
    one_run(s, prompt, 8, "none")  # warm up
    quiet_load = load_average()
    rates: dict[str, list[float]] = {"none": [], "ngram-simple": []}
    recordings: dict[str, dict[str, Any]] = {}
    for r in range(a.repeats):
        for strategy in ("none", "ngram-simple") if r % 2 == 0 else ("ngram-simple", "none"):
            events, rate, share = one_run(s, prompt, a.max_tokens, strategy)
            rates[strategy].append(rate)
            if strategy == "ngram-simple" and "quiet" not in recordings:
                recordings["quiet"] = {"events": events, "tokens_per_second": rate, "cpu_share": share}
    loads = {"steady": (a.loops, None), "bursts": (a.burst_loops, a.burst_on)}
    for name, (n, on) in loads.items():
        with busy_loops(n, a.load_seconds, on):
            events, rate, share = one_run(s, prompt, a.max_tokens, "ngram-simple")
        recordings[name] = {"events": events, "tokens_per_second": rate, "cpu_share": share}
    s.close()
    time.sleep(2.0)  # the load processes' cores settle
    advise_load = load_average()
    for rec in recordings.values():
        rec.update(advice_figures(rec.pop("events"), a.model or model))
    quiet_fresh = recordings["quiet"]["fresh"]["speedup"]
    for rec in recordings.values():
        sp = rec["fresh"]["speedup"]
        rec["fresh_vs_quiet"] = sp / quiet_fresh - 1.0 if sp and quiet_fresh else None
    measured = statistics.median(rates["ngram-simple"]) / statistics.median(rates["none"])
    out = {
        "model": model,
        "prompt": f"{a.kind}[{a.prompt}]",
        "max_tokens": a.max_tokens,
        "quiet_measured_speedup": measured,
        "quiet_tokens_per_second": {k: statistics.median(v) for k, v in rates.items()},
        "load_average": {"quiet_phase": quiet_load, "advice_phase": advise_load},
        "loads": {k: {"loops": n, "burst_on_seconds": on} for k, (n, on) in loads.items()},
        "recordings": recordings,
    }
    if a.json:
        print(json.dumps(out))
        return 0
    report(out)
    return 0


def report(out: dict[str, Any]) -> None:
    """The figures as text."""
    la = out["load_average"]
    print(f"bench_busy_advice — {out['prompt']}, ngram-simple size_n 3, {out['max_tokens']} tokens")
    print(
        f"load average (1 min): {la['quiet_phase'][0] if la['quiet_phase'] else float('nan'):.2f} before the quiet "
        f"runs, {la['advice_phase'][0] if la['advice_phase'] else float('nan'):.2f} before the advice"
    )
    q = out["quiet_tokens_per_second"]
    print(
        f"quiet, measured: none {q['none']:.1f} t/s, ngram-simple {q['ngram-simple']:.1f} t/s: "
        f"{out['quiet_measured_speedup']:.2f}x"
    )
    head = (
        f"{'recording':<9} {'t/s':>6} {'CPU':>5} {'verdict':<12} {'as recorded':>11} {'fresh':>6} {'vs quiet':>9} "
        f"{'decision':>9}"
    )
    print(head)
    for name, rec in out["recordings"].items():
        ar, fr = rec["as_recorded"], rec["fresh"]
        share = rec["cpu_share"]
        vs = rec["fresh_vs_quiet"]

        def x(v: float | None) -> str:
            return "—" if v is None else f"{v:.2f}x"

        print(
            f"{name:<9} {rec['tokens_per_second']:>6.1f} {'—' if share is None else f'{share:.0%}':>5} "
            f"{fr['verdict'] or '—':<12} {x(ar['speedup']):>11} {x(fr['speedup']):>6} "
            f"{'—' if vs is None else f'{vs:+.1%}':>9} {'advised' if fr['advised'] else 'declined':>9}"
            + ("" if vs is None or name == "quiet" else ("  within 15%" if abs(vs) <= WITHIN else "  NOT within 15%"))
        )
    if out["recordings"]["quiet"]["fresh"]["verdict"] not in (None, "quiet"):
        print("note: the quiet recording was not quiet (see its verdict below): the comparison means little")
    for name, rec in out["recordings"].items():
        print(f"{name}: {rec['fresh']['load'] or 'no load found'}")
        print(f"  advice (fresh): {rec['fresh']['text']}")


if __name__ == "__main__":
    sys.exit(main())
