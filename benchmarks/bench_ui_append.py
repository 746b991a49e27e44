"""Browser time to append one round to the inspector at a large session size.

Feeds a synthetic session (the real event dataclasses, every token kind) into the front-end running in
headless chromium with a scripted host, up to ``--tokens`` generated tokens (default 5,000), then times
appending further rounds one at a time:

* ``append``: the synchronous handling of one ``events`` message (state + token-stream DOM), measured
  in the page with performance.now();
* ``append+frame``: from delivering the message to the next painted frame (two requestAnimationFrame);
* ``charts``: one redraw of the five plotly charts (throttled to at most one per 120 ms while streaming).

Usage: python benchmarks/bench_ui_append.py [--tokens 5000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=200, help="rounds timed after reaching --tokens")
    a = ap.parse_args()

    from playwright.sync_api import sync_playwright

    from specviz.ui.harness import chromium_path, launch, open_harness
    from specviz.ui.synthetic import synthetic_rounds

    if chromium_path() is None:
        sys.exit("chromium not found (apt-get install chromium)")
    groups = synthetic_rounds(a.tokens + 4 * a.rounds + 100, seed=0)
    with sync_playwright() as p:
        b = launch(p)
        page = open_harness(b)
        n = 0
        i = 0
        gen = 0
        batch = []
        # warm-up: bring the session to --tokens generated tokens
        while gen < a.tokens:
            g = groups[i]
            batch.append({"type": "events", "epoch": 0, "start": n, "events": g})
            n += len(g)
            i += 1
            gen = next((e["data"]["n_generated"] for e in g if e["kind"] == "telemetry"), gen)
            if len(batch) == 200:
                page.evaluate("ms => ms.forEach(m => window.__deliver(m))", batch)
                batch = []
        page.evaluate("ms => ms.forEach(m => window.__deliver(m))", batch)
        page.wait_for_timeout(500)
        n_tok = page.evaluate("document.querySelectorAll('.sv-stream .sv-tok').length")
        sync, frame, charts = [], [], []
        for _ in range(a.rounds):
            g = groups[i]
            msg = {"type": "events", "epoch": 0, "start": n, "events": g}
            n += len(g)
            i += 1
            r = page.evaluate("""async (m) => {
                const t0 = performance.now();
                window.__deliver(m);
                const t1 = performance.now();
                await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
                return [t1 - t0, performance.now() - t0];
            }""", msg)
            sync.append(r[0])
            frame.append(r[1])
        for _ in range(20):
            charts.append(page.evaluate("""() => {
                const root = document.querySelector('.specviz-inspector');
                const t0 = performance.now(); root.__specviz.drawCharts(false); return performance.now() - t0; }"""))
        gen_now = page.evaluate("document.querySelector('.sv-stat[data-k=\"generated\"] .sv-stat-v').textContent")
        b.close()

    def q(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    print(f"session: {gen_now} generated tokens, {n_tok} token elements in the stream, {i - 1} rounds")
    for name, xs in (("append", sync), ("append+frame", frame), ("charts", charts)):
        print(f"{name:>13}: median {statistics.median(xs):6.2f} ms  p95 {q(xs, 0.95):6.2f} ms  max {max(xs):6.2f} ms"
              f"  (n={len(xs)})")
    print("target: append < 16 ms")


if __name__ == "__main__":
    main()
