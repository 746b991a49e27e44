"""Browser cost of appending rounds to the inspector at a large session size, and of its frames.

Feeds a synthetic session (the real event dataclasses, every token kind) into the front-end running in
headless chromium with a scripted host, up to ``--tokens`` generated tokens (default 5,000), then:

* ``append``: the synchronous handling of one ``events`` message (state + token-stream DOM), measured
  in the page with performance.now(), one round at a time;
* ``append+render``: that handling plus the main-thread work of the next frame (rAF callbacks, style,
  layout, paint), one round at a time — a chart redraw is included whenever the scheduler runs one in
  that frame; ``deliver->frame done`` adds the wait for the frame itself (up to one vsync, 16.7 ms);
* ``chart``: one plotly chart redraw (each chart in turn) at that size — the scheduler draws at most one
  per frame, every CHART_GAP ms;
* ``stream frames``: rounds delivered every ``--interval`` ms (default 25 ms, 40 rounds/s — faster than
  the embedded model generates them) for ``--seconds``: the interval between consecutive animation
  frames (16.7 ms when no frame is dropped) and the main-thread work of each frame and of each append
  — the per-frame cost a user sees while Play runs.

Figures are medians over ``--repeat`` runs of the whole measurement (each run in a fresh page).

Usage: python benchmarks/bench_ui_append.py [--tokens 5000] [--rounds 120] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

# After a rAF callback, a MessageChannel task runs once the frame's main-thread rendering (all rAF
# callbacks, style, layout, paint) is done; the rAF timestamp is the frame's start.
_ONE_ROUND = """async (m) => {
    const t0 = performance.now();
    window.__deliver(m);
    const t1 = performance.now();
    const [ts, te] = await new Promise(res => requestAnimationFrame((ts) => {
        const ch = new MessageChannel();
        ch.port1.onmessage = () => res([ts, performance.now()]);
        ch.port2.postMessage(0);
    }));
    return [t1 - t0, (t1 - t0) + Math.max(0, te - Math.max(ts, t1)), te - t0];
}"""

_STREAM = """async ([msgs, interval]) => {
    const frames = [], work = [];
    let last = null, on = true;
    const tick = (ts) => {
        if (last != null) frames.push(ts - last);
        last = ts;
        const ch = new MessageChannel();
        ch.port1.onmessage = () => work.push(performance.now() - ts);
        ch.port2.postMessage(0);
        if (on) requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
    for (const m of msgs) {
        const t0 = performance.now();
        window.__deliver(m);
        work.push(performance.now() - t0);
        await new Promise(r => setTimeout(r, interval));
    }
    await new Promise(r => setTimeout(r, 400));
    on = false;
    return [frames, work];
}"""

_CHARTS = """async () => {
    const api = document.querySelector('.specviz-inspector').__specviz;
    const out = {};
    for (let k = 0; k < 5; k++) for (const key of api.charts) {
        const t0 = performance.now(); api.drawChart(key); (out[key] = out[key] || []).push(performance.now() - t0);
        await new Promise(r => requestAnimationFrame(r));
    }
    return out;
}"""


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def one_run(browser, groups, a):
    from specviz.testing.page_harness import open_harness

    page = open_harness(browser)
    n = i = gen = 0
    batch = []
    while gen < a.tokens:  # warm-up: bring the session to --tokens generated tokens
        g = groups[i]
        batch.append({"type": "events", "epoch": 0, "start": n, "events": g})
        n += len(g)
        i += 1
        gen = next((e["data"]["n_generated"] for e in g if e["kind"] == "telemetry"), gen)
        if len(batch) == 200:
            page.evaluate("ms => ms.forEach(m => window.__deliver(m))", batch)
            batch = []
    page.evaluate("ms => ms.forEach(m => window.__deliver(m))", batch)
    page.wait_for_timeout(1000)
    n_tok = page.evaluate("document.querySelectorAll('.sv-stream .sv-tok').length")
    sync, cost, latency = [], [], []
    for _ in range(a.rounds):
        g = groups[i]
        r = page.evaluate(_ONE_ROUND, {"type": "events", "epoch": 0, "start": n, "events": g})
        n += len(g)
        i += 1
        sync.append(r[0])
        cost.append(r[1])
        latency.append(r[2])
    charts = page.evaluate(_CHARTS)
    msgs = []
    n_stream = int(a.seconds * 1000 / a.interval)
    for g in groups[i : i + n_stream]:
        msgs.append({"type": "events", "epoch": 0, "start": n, "events": g})
        n += len(g)
    i += len(msgs)
    frames, work = page.evaluate(_STREAM, [msgs, a.interval])
    gen_now = page.evaluate("document.querySelector('.sv-stat[data-k=\"generated\"] .sv-stat-v').textContent")
    page.close()
    return {
        "gen": gen_now,
        "tok": n_tok,
        "rounds": i - 1,
        "sync": sync,
        "cost": cost,
        "latency": latency,
        "charts": charts,
        "frames": frames,
        "work": work,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=120, help="rounds timed one at a time after reaching --tokens")
    ap.add_argument("--interval", type=float, default=25.0, help="ms between rounds in the streaming phase")
    ap.add_argument("--seconds", type=float, default=4.0, help="length of the streaming phase")
    ap.add_argument("--repeat", type=int, default=3, help="independent runs (fresh page each); medians reported")
    a = ap.parse_args()

    from playwright.sync_api import sync_playwright

    from specviz.testing.page_harness import chromium_path, launch
    from specviz.testing.synthetic import synthetic_rounds

    if chromium_path() is None:
        sys.exit("chromium not found (apt-get install chromium)")
    n_stream = int(a.seconds * 1000 / a.interval)
    groups = synthetic_rounds(a.tokens + 4 * (a.rounds + n_stream) + 200, seed=0)
    runs = []
    with sync_playwright() as p:
        b = launch(p)
        for _ in range(a.repeat):
            runs.append(one_run(b, groups, a))
        b.close()

    r0 = runs[-1]
    print(
        f"session: {r0['gen']} generated tokens, {r0['tok']} token elements in the stream, {r0['rounds']} rounds"
        f" ({a.repeat} runs)"
    )

    def row(name, per_run):
        med = statistics.median(statistics.median(x) for x in per_run)
        p95 = statistics.median(q(x, 0.95) for x in per_run)
        mx = max(max(x) for x in per_run)
        print(
            f"{name:>22}: median {med:6.2f} ms  p95 {p95:6.2f} ms  max {mx:6.2f} ms"
            f"  (n={sum(len(x) for x in per_run)}; median of the {len(per_run)} run medians)"
        )

    row("append", [r["sync"] for r in runs])
    row("append+render", [r["cost"] for r in runs])
    row("deliver->frame done", [r["latency"] for r in runs])
    for key in runs[0]["charts"]:
        row(f"chart {key}", [r["charts"][key] for r in runs])
    row("stream: frame interval", [r["frames"] for r in runs])
    row("stream: main-thread work", [r["work"] for r in runs])
    long = [sum(1 for f in r["frames"] if f > 1000 / 60 + 1) / max(1, len(r["frames"])) for r in runs]
    print(f"{'frames > 17.7 ms':>22}: {100 * statistics.median(long):.1f}% (median of runs)")
    print("target: append and per-frame cost < 16 ms")


if __name__ == "__main__":
    main()
