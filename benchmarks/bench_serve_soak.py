"""Soak of ``specviz serve`` in presenter mode: 30 viewers and one hostile page for 10 minutes (embedded model).

A real server process (``specviz serve --shared``) and simulated browsers over raw websockets
(:mod:`specviz.testing.page_client`; this process runs them at a lower CPU priority than the server):

1. *solo*: the presenter's page plays (and starts again whenever the generation ends) for ``--solo``
   seconds with nobody watching: the presenter's tokens/s, counted from the rounds its page is shown;
2. *loaded*: ``--viewers`` viewer pages watch and one hostile page (:class:`specviz.testing.hostile.Hostile`,
   the ``mixed`` actor: one page at a time that floods, fuzzes, breaks the protocol, stops reading, uploads
   without end, floods catch-ups) runs for ``--minutes`` minutes; the presenter's tokens/s over the whole
   phase, each viewer's lag behind the presenter (when a viewer is shown the rounds the presenter was shown),
   the server's RSS every 10 s;
3. *solo* again (the machine may have changed meanwhile: the loaded figure is compared with the mean of
   both solo ones).

Printed: the tokens/s (solo, loaded, ratio), how many viewers progressed and their lag (median, p95, worst),
the RSS over time (one line a minute) and its growth from the end of the first loaded minute to the end,
and the load average at the start, in the middle and at the end (the machine may be shared). Targets
(issue 22): loaded tokens/s at least 90% of solo; RSS growth over the soak under 50 MB.

Usage: python benchmarks/bench_serve_soak.py [--minutes 10] [--viewers 30] [--solo 60] [--model PATH]
       [--max-tokens 3000] [--seed 22] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specviz.testing.hostile import Hostile, Player
from specviz.testing.page_harness import free_port, stop_process, wait_http

PRESENTER = "soak-presenter-token"


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def tokens_per_second(player: Player, seconds: float) -> float:
    """The presenter's tokens/s over the next ``seconds``, as its page is shown them."""
    k0, t0 = player.tokens_seen(), time.monotonic()
    time.sleep(seconds)
    return (player.tokens_seen() - k0) / (time.monotonic() - t0)


def lags(presenter: Player, viewers: list[Player], since: float) -> list[float]:
    """Seconds each viewer was shown a batch of rounds after the presenter was shown the same rounds."""
    first = {(e, n): t for e, n, t in presenter.arrivals}
    out = []
    for v in viewers:
        for e, n, t in v.arrivals:
            t_p = first.get((e, n))
            if t_p is not None and t_p >= since:
                out.append(t - t_p)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="the loaded phase (default 10)")
    ap.add_argument("--viewers", type=int, default=30)
    ap.add_argument("--solo", type=float, default=60.0, help="seconds of each solo phase")
    ap.add_argument("--model", default=None, help="target GGUF (default: the embedded Gemma 3 270M)")
    ap.add_argument("--max-tokens", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from specviz.models.embedded import resolve_model

    model = str(resolve_model(a.model))
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="specviz-soak-")) / "serve.log"
    cmd = [sys.executable, "-m", "specviz.cli", "serve", "--model", model, "--port", str(port), "--shared"]
    cmd += ["--presenter-token", PRESENTER, "--max-tokens", str(a.max_tokens), "--max-viewers", str(a.viewers + 50)]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    os.nice(10)  # the simulated browsers: the server (started above) keeps its priority
    url = f"http://127.0.0.1:{port}/"
    loads = [os.getloadavg()]
    rss: list[tuple[float, float]] = []
    viewers: list[Player] = []
    hostile = None
    try:
        wait_http(url, proc, timeout=300)
        presenter = Player(url, query=f"presenter={PRESENTER}").start()
        time.sleep(10)  # warm up: the first rounds, the first restart
        solo1 = tokens_per_second(presenter, a.solo)
        viewers = [Player(url, control=False).start() for _ in range(a.viewers)]
        hostile = Hostile(url, seconds=a.minutes * 60, actors=("mixed",), seed=a.seed).start()
        t0 = time.monotonic()
        k0 = presenter.tokens_seen()
        seen0 = [v.seen() for v in viewers]
        while time.monotonic() - t0 < a.minutes * 60:
            rss.append((time.monotonic() - t0, rss_mb(proc.pid)))
            if len(rss) == max(1, int(a.minutes * 3)):
                loads.append(os.getloadavg())
            time.sleep(10)
            if proc.poll() is not None:
                break
        loaded = (presenter.tokens_seen() - k0) / (time.monotonic() - t0)
        rss.append((time.monotonic() - t0, rss_mb(proc.pid)))
        hostile.stop()
        lag = lags(presenter, viewers, t0)
        progressing = sum(1 for v, s in zip(viewers, seen0) if v.seen() > s)
        for v in viewers:
            v.close()
        time.sleep(5)
        solo2 = tokens_per_second(presenter, a.solo)
        loads.append(os.getloadavg())
        alive = proc.poll() is None
        presenter.close()
    finally:
        if hostile is not None:
            hostile.stop()
        stop_process(proc)
    solo = (solo1 + solo2) / 2
    after_first = [r for t, r in rss if t >= 60] or [r for _, r in rss]
    row = {
        "minutes": a.minutes,
        "viewers": a.viewers,
        "solo_tps": [round(solo1, 2), round(solo2, 2)],
        "loaded_tps": round(loaded, 2),
        "ratio": round(loaded / solo, 3) if solo else None,
        "viewers_progressing": progressing,
        "lag_s": [round(q(lag, 0.5), 3), round(q(lag, 0.95), 3), round(max(lag, default=float("nan")), 3)],
        "lag_samples": len(lag),
        "rss_mb": [(round(t), round(r, 1)) for t, r in rss],
        "rss_growth_mb": round(after_first[-1] - after_first[0], 1) if after_first else None,
        "load_avg": [[round(x, 2) for x in la] for la in loads],
        "hostile_sent": dict(hostile.sent) if hostile is not None else {},
        "hostile_connects": dict(hostile.connects) if hostile is not None else {},
        "server_alive": alive,
    }
    if a.json:
        print(json.dumps(row))
        return 0
    print(
        f"presenter mode, {a.viewers} viewers and one hostile page for {a.minutes:g} min (embedded model unless "
        "--model; simulated browsers)"
    )
    print(
        f"presenter tokens/s: solo {solo1:.1f} before, {solo2:.1f} after; loaded {loaded:.1f} "
        f"({row['ratio']:.0%} of the solo mean; target >= 90%)"
    )
    print(
        f"viewers progressing: {progressing} of {a.viewers}; lag behind the presenter's page, s "
        f"(median / p95 / worst of {len(lag)}): {row['lag_s'][0]} / {row['lag_s'][1]} / {row['lag_s'][2]}"
    )
    print("server RSS, MB (minute: value):", ", ".join(f"{int(t // 60)}: {r:.0f}" for t, r in rss if int(t) % 60 < 10))
    print(f"RSS growth from the end of the first minute to the end: {row['rss_growth_mb']} MB (target < 50)")
    print(f"hostile page: {row['hostile_sent']} sent, {row['hostile_connects']} connections")
    print("load average (1/5/15 min) at start, middle, end:", row["load_avg"], "; server alive:", alive)
    print("statistics of the lag:", f"mean {statistics.fmean(lag):.3f} s" if lag else "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
