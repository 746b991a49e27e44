"""Hostile pages against a live ``specviz serve`` (tiny model), while two honest pages play.

For a bounded time, :class:`specviz.testing.hostile.Hostile` sends raw websocket traffic from several
misbehaving pages at once — random and malformed message types, fields, sizes and orders, heavy messages,
floods, malformed Bokeh protocol, pages that never read, pages opened and dropped, uploads that never end,
snapshots of a page's own session with their llama.cpp state crafted —
while two :class:`~specviz.testing.hostile.Player` pages play their sessions (and start them again when
they finish). The server runs with a short ``--idle-timeout``, so parking and restoring happen meanwhile.

Checked: the process stays alive; both honest pages keep making rounds (in the second half of the hostile
window too) and still get answers afterwards; the server's resident memory stays bounded (no steady
growth between the first and the second half). No figure depends on the machine's speed beyond "some
rounds were made".
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from browser_util import free_port, start, stop, wait_http

from specviz.testing.hostile import Hostile, Player

#: Seconds of hostile traffic (the test takes about this plus 20 s).
SECONDS = float(os.environ.get("SPECVIZ_HOSTILE_SECONDS", "40"))
ACTORS = ("fuzz", "fuzz", "protocol", "silent", "silent", "churn", "uploads", "catchup", "crafted")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Sampler:
    def __init__(self, pid: int) -> None:
        self.pid, self.samples = pid, []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.samples.append((time.monotonic(), rss_mb(self.pid)))
            except OSError:
                return

    def peak(self, t0: float, t1: float) -> float:
        return max((r for t, r in self.samples if t0 <= t < t1), default=0.0)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)


@pytest.mark.slow
def test_hostile_pages_crash_nothing_freeze_no_honest_page_and_grow_nothing(tiny_model_path, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    args = ["-m", "specviz.cli", "serve", "--model", str(tiny_model_path), "--port", str(port)]
    proc = start([*args, "--max-tokens", "3000", "--idle-timeout", "2", "--max-sessions", "12"], log)
    sampler = None
    players: list[Player] = []
    errors: list[str] = []
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_http(url, proc)
        players = [Player(url).start(), Player(url).start()]
        sampler = Sampler(proc.pid)
        time.sleep(3)
        base = rss_mb(proc.pid)
        t0 = time.monotonic()
        hostile = Hostile(url, seconds=SECONDS, actors=ACTORS, seed=22, on_error=errors.append).start()
        time.sleep(SECONDS / 2)
        mid = [p.seen() for p in players]
        t_mid = time.monotonic()
        hostile.join()
        t1 = time.monotonic()
        end = [p.seen() for p in players]
        assert proc.poll() is None, f"the server died (exit status {proc.returncode}): {log.read_text()[-3000:]}"
        assert all(e > m for m, e in zip(mid, end)), f"an honest page stopped making rounds: {mid} -> {end}"
        for p in players:  # and still gets answers
            mark = len(p.page.received)
            p.page.send({"type": "schema", "strategy": "ngram-simple"})
            p.page.wait_for(lambda m: m.get("type") == "schema", 60, since=mark)
        first, second = sampler.peak(t0, t_mid), sampler.peak(t_mid, t1)
        assert max(first, second) - base < 600, f"RSS grew from {base:.0f} MB to {max(first, second):.0f} MB"
        assert second - first < 150, f"RSS kept growing: first half peak {first:.0f} MB, second half {second:.0f} MB"
        assert sum(hostile.sent.values()) > 100 and hostile.connects["churn"] > 3, (hostile.sent, hostile.connects)
        assert hostile.sent["crafted"] > 0, f"no crafted snapshot was sent: {errors[-5:]}"
        text = log.read_text()
        assert "GGML_ASSERT" not in text and "Segmentation" not in text
    finally:
        if sampler is not None:
            sampler.stop()
        for p in players:
            p.close()
        stop(proc)
