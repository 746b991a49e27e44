"""Does one page freeze the others? Another page's ``schema`` round trip while one page floods heavy messages.

A real ``specviz serve`` process (a subprocess, the embedded model unless ``--model``) and two pages spoken to
over raw websockets (:mod:`specviz.testing.page_client`, no browser):

* the *probe* page sends ``{"type": "schema"}`` every ``--probe-every`` seconds and times each answer;
* the *flooder* page, after a quiet baseline window, sends ``--flood`` messages (default ``reset`` with a
  prompt of ``--prompt-tokens`` tokens, 3.5k by default) at ``--rate`` per second for ``--seconds``.

Printed: the probe's round trip (median, 95th percentile, worst) in the baseline window and under the flood;
how the flooder's messages were answered (handled, refused by the gate, refused as "still working"); the
load average over the run (the machine may be shared). ``--flood advise`` floods the advisor instead, and
``--flood branch`` a lane branch (a fork of the whole context).

Usage: python benchmarks/bench_serve_responsiveness.py [--model PATH] [--flood reset|advise|branch]
       [--rate 4] [--seconds 20] [--baseline 8] [--prompt-tokens 3500] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from specviz.testing.page_client import PageClient, PageClientError
from specviz.testing.page_harness import free_port, stop_process, wait_http


def long_prompt(model_path: str, n_tokens: int) -> str:
    """A code-like prompt of about ``n_tokens`` tokens of the model (counted with its tokenizer)."""
    from specviz.backends.llama import LlamaModel

    m = LlamaModel(model_path)
    lines, i = [], 0
    text = ""
    while True:
        lines.append(f"def f{i}(x):\n    return x * {i} + {i % 7}  # step {i}\n")
        i += 1
        if i % 20 == 0:
            text = "".join(lines)
            if len(m.tokenize(text)) >= n_tokens:
                break
    ids = m.tokenize(text)[:n_tokens]
    out = m.detokenize(ids)
    m.close()
    return out


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


class Probe:
    """Times ``schema`` round trips of one page, one at a time."""

    def __init__(self, page: PageClient, every: float) -> None:
        self.page, self.every = page, every
        self.rtts: list[tuple[float, float]] = []  # (when sent, seconds)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._t.start()

    def _run(self) -> None:
        names = ["prompt-lookup", "ngram-simple"]
        i = 0
        while not self._stop.is_set():
            mark = len(self.page.received)
            t0 = time.monotonic()
            strategy = names[i % 2]
            self.page.send({"type": "schema", "strategy": strategy})
            try:
                self.page.wait_for(
                    lambda m, s=strategy: m.get("type") == "schema" and m.get("strategy") == s, 300, since=mark
                )
            except (TimeoutError, PageClientError):  # counted as answered at the give-up time
                pass
            self.rtts.append((t0, time.monotonic() - t0))
            i += 1
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(400)

    def window(self, t0: float, t1: float) -> list[float]:
        return [r for when, r in self.rtts if t0 <= when < t1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="target GGUF (default: the embedded Gemma 3 270M)")
    ap.add_argument("--flood", default="reset", choices=["reset", "advise", "branch"])
    ap.add_argument("--rate", type=float, default=4.0, help="flood messages per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="flood window")
    ap.add_argument("--baseline", type=float, default=8.0, help="quiet window before the flood")
    ap.add_argument("--probe-every", type=float, default=0.25)
    ap.add_argument("--prompt-tokens", type=int, default=3500)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from specviz.models.embedded import resolve_model

    model = str(resolve_model(a.model))
    prompt = long_prompt(model, a.prompt_tokens)
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="specviz-bench-")) / "serve.log"
    args = [sys.executable, "-m", "specviz.cli", "serve", "--model", model, "--port", str(port), "--max-tokens", "64"]
    proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
    load0 = os.getloadavg()
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_http(url, proc, timeout=300)
        probe_page, flood_page = PageClient(url).connect(), PageClient(url).connect()
        for p in (probe_page, flood_page):
            p.send({"type": "hello", "epoch": -1, "have": 0})
            p.wait_for(lambda m: m.get("type") == "state" and m.get("can_step"), 300)
        if a.flood == "branch":  # a lane branch copies the whole context: fill it first
            flood_page.send({"type": "cmd", "cmd": "reset", "prompt": prompt, "max_tokens": 64})
            flood_page.wait_for(lambda m: m.get("type") == "events" and m.get("start") == 0, 300)
        probe = Probe(probe_page, a.probe_every)
        probe.start()
        t0 = time.monotonic()
        time.sleep(a.baseline)
        t1 = time.monotonic()
        mark = len(flood_page.received)
        sent = 0
        while time.monotonic() - t1 < a.seconds:
            if a.flood == "reset":
                flood_page.send({"type": "cmd", "cmd": "reset", "prompt": prompt, "max_tokens": 64})
            elif a.flood == "advise":
                flood_page.send({"type": "advise"})
            else:
                flood_page.send({"type": "lane", "cmd": "branch"})
            sent += 1
            time.sleep(1.0 / a.rate)
        t2 = time.monotonic()
        time.sleep(1.0)
        probe.stop()
        load1 = os.getloadavg()
        answers = flood_page.received[mark:]
        notices = [m["text"] for m in answers if m.get("type") == "notice" and m.get("level") == "error"]
        row = {
            "flood": a.flood,
            "rate": a.rate,
            "flood_sent": sent,
            "prompt_tokens": a.prompt_tokens,
            "baseline_ms": [round(1000 * f(probe.window(t0, t1), p), 1) for f, p in ((q, 0.5), (q, 0.95), (q, 1.0))],
            "flood_ms": [round(1000 * f(probe.window(t1, t2), p), 1) for f, p in ((q, 0.5), (q, 0.95), (q, 1.0))],
            "probes": [len(probe.window(t0, t1)), len(probe.window(t1, t2))],
            "refused_rate_or_work": sum(1 for t in notices if "too many" in t or "share" in t),
            "refused_working": sum(1 for t in notices if "still working" in t or "working on" in t),
            "other_errors": sorted(
                {t[:100] for t in notices if not ("too many" in t or "share" in t or "working" in t)}
            ),
            "load_avg_start": [round(x, 2) for x in load0],
            "load_avg_end": [round(x, 2) for x in load1],
            "server_alive": proc.poll() is None,
        }
        probe_page.close()
        flood_page.close()
    finally:
        stop_process(proc)
    if a.json:
        print(json.dumps(row))
        return 0
    b, f = row["baseline_ms"], row["flood_ms"]
    print(
        f"another page's schema round trip, ms (median / p95 / worst): baseline {b[0]} / {b[1]} / {b[2]} "
        f"({row['probes'][0]} probes); while one page floods {a.flood} at {a.rate:g}/s"
        + (f" with a {a.prompt_tokens}-token prompt" if a.flood == "reset" else "")
        + f": {f[0]} / {f[1]} / {f[2]} ({row['probes'][1]} probes)"
    )
    print(
        f"flood: {sent} sent; refused by the gate {row['refused_rate_or_work']}, refused while working "
        f"{row['refused_working']}; other errors: {row['other_errors'] or 'none'}; server alive: {row['server_alive']}"
    )
    print(f"load average at start {row['load_avg_start']}, at end {row['load_avg_end']}")
    print(f"the probe's median under the flood is {f[0] / max(b[0], 0.01):.1f}x its baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
