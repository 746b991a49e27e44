"""Load of ``specviz serve`` with many browser pages at once, in both modes (headless chromium, loopback).

Each run is a fresh process that builds the server exactly as ``specviz serve`` does
(:func:`specviz.server.app.build_app`, served by Panel in a thread), so the benchmark can count every
session's tokens on the server side, and opens its pages in headless chromium on loopback. Chromium runs
at the lowest CPU priority (every thread of every chromium process under ``SCHED_IDLE``, kept so while it
runs, since chromium sets its own priorities; ``--no-nice`` turns that off): on this 2-core machine the
browsers would otherwise compete with the server for the cores, which an audience's browsers, on their
own machines, do not.

Default mode (a session per page): for each N in ``--pages`` (default 1,4,8,16) the server has
``--max-sessions CAP`` (CAP = ``--cap``, default max(8, N)); N pages are opened and all press Play;
after ``--warmup`` seconds the tokens of every session are counted, and again ``--seconds`` later.
Reported: tokens/s per session (min, median, max), total tokens/s and its ratio to one page's, how many
pages progressed as their pages show it (rounds received), how many were told the server is busy, the
process's peak RSS (server and benchmark driver; chromium is apart), and the UI's append latency
(main-thread time a page spent applying one ``events`` message: median and 95th percentile over all
pages).

Presenter mode: for each V in ``--viewers`` (default 0,30) one session runs; the presenter's page
presses Play and V viewer pages watch. Reported: the presenter session's tokens/s and its ratio to the
run with no viewer, how many viewers progressed, the peak RSS and the pages' append latency. On one
machine the viewers' chromium competes with the server for the cores (even at the lowest priority), so a third
measurement, ``server-only``, runs the presenter's session with the largest V views attached and no
browser at all: each view's send serializes the message as the server does for a page (Bokeh's
serializer), and the session's tokens/s with and without them are compared (alternately, median of 3).

The targets of issue 16 (reported, not asserted): with 8 playing pages, total tokens/s at least 80% of
one page's, every page progressing, memory bounded by the session cap; 30 watching pages cost the
presenter's session under 10% of its tokens/s. Timings need a quiet machine: other work on the cores
moves every figure.

Usage: python benchmarks/bench_serve_load.py [--pages 1,4,8,16] [--viewers 0,30] [--seconds 20]
       [--warmup 4] [--model PATH] [--cap N] [--modes per-page,server-pages,shared,server-only] [--no-nice] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PRESENTER = "bench-presenter-token"
PROMPT = None  # the server's default demo prompt

_START = "(el) => { el.__specviz.appendMs.splice(0); return +(el.dataset.rounds || 0); }"
_END = "(el) => [+(el.dataset.rounds || 0), el.__specviz.appendMs.splice(0)]"
_SEND = "(el, m) => el.__specviz.send(m)"


def rss_mb(pid: int) -> float:
    """Resident memory of a process, in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class RssSampler:
    """The peak RSS of a process, sampled every 0.2 s in a thread."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, rss_mb(pid), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, rss_mb(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._t.join()
        return self.peak


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


class ChromiumAtIdle:
    """Keeps every thread of this process's chromium descendants under ``SCHED_IDLE``, checked every 0.5 s.

    Starting chromium under ``nice -n 19`` is not enough: chromium sets its own processes' priorities (its
    renderers ran at nice 0, its browser and GPU threads at -8 as root), and on Linux a priority belongs to
    one thread. Measured with 8 playing pages: chromium as started, 37% of one page's tokens/s; every
    thread at nice 19, 48%; under SCHED_IDLE (a thread runs only on a core nothing else wants), 62%.
    """

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _pass(self) -> None:
        kids, todo, me = _children(), [os.getpid()], os.getpid()
        while todo:
            pid = todo.pop()
            todo.extend(kids.get(pid, []))
            if pid == me:
                continue
            try:
                if "chrom" not in Path(f"/proc/{pid}/comm").read_text():
                    continue
                for task in Path(f"/proc/{pid}/task").iterdir():
                    tid = int(task.name)
                    if os.sched_getscheduler(tid) != os.SCHED_IDLE:
                        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            except (OSError, ValueError):
                continue  # gone meanwhile

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._pass()

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def niced_chromium() -> str:
    """A wrapper script that starts Debian's chromium under ``nice -n 19`` (until :class:`ChromiumAtIdle`
    has put its threads under SCHED_IDLE, within half a second)."""
    from specviz.testing.page_harness import chromium_path

    path = Path(tempfile.mkdtemp(prefix="specviz-bench-")) / "chromium-nice"
    path.write_text(f'#!/bin/sh\nexec nice -n 19 {chromium_path()} "$@"\n')
    path.chmod(0o755)
    return str(path)


def launch_browser(pw, nice: bool):
    from specviz.testing.page_harness import CHROMIUM_ARGS, chromium_path

    exe = niced_chromium() if nice else chromium_path()
    return pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)


def open_page(browser, url: str):
    """A page of the server; returns (page, root locator or None when it shows "busy")."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url)
    page.wait_for_selector(".specviz-inspector .sv-stream .sv-tok.sv-prompt, .specviz-busy", timeout=300000)
    if page.locator(".specviz-busy").count():
        return page, None
    return page, page.locator(".specviz-inspector")


def wait_enabled(page, sel: str):
    from playwright.sync_api import expect

    expect(page.locator(sel)).to_be_enabled(timeout=300000)


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def window(count_tokens, roots, seconds: float):
    """Tokens each session made over ``seconds`` (counted on the server), the rounds each page received,
    and the pages' append times.

    The window is bracketed by the server-side counts only: reading the pages (which can be slow when
    many pages share the cores) happens inside it, never before its start.
    """
    n0 = count_tokens()
    t0 = time.monotonic()
    r0 = [r.evaluate(_START) for r in roots]  # rounds so far; clears the append times
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    n1 = count_tokens()
    dt = time.monotonic() - t0
    ends = [r.evaluate(_END) for r in roots]
    tps = [(n1.get(k, 0) - n0.get(k, 0)) / dt for k in n1]
    return tps, [e[0] - a for a, e in zip(r0, ends)], [ms for e in ends for ms in e[1]], dt


def run_one(args, mode: str, n: int) -> dict:
    """One run in this process: build the server, open the pages, play, measure."""
    from playwright.sync_api import sync_playwright

    from specviz.server.app import _serve_panel, build_app
    from specviz.testing.page_harness import free_port

    port = free_port()
    shared = mode == "shared"
    cap = args.cap or max(8, n)
    opts: dict = {"max_tokens": args.max_tokens}
    if shared:
        opts.update(shared=True, presenter_token=PRESENTER, max_viewers=max(100, n))
    else:
        opts.update(max_sessions=cap)
    app = build_app(port, args.model, **opts)
    server = _serve_panel(
        app.factory, port=port, address="127.0.0.1", show=False, title="bench", policy=app.policy, threaded=True
    )
    url = f"http://127.0.0.1:{port}/"
    rss = RssSampler(os.getpid())
    idler = None if args.no_nice else ChromiumAtIdle()
    idle_mb = rss.peak
    try:
        with sync_playwright() as pw:
            browser = launch_browser(pw, nice=not args.no_nice)
            if shared:
                presenter, proot = open_page(browser, url + f"?presenter={PRESENTER}")
                wait_enabled(presenter, ".sv-step")
                pages = [open_page(browser, url) for _ in range(n)]
                roots = [proot] + [r for _, r in pages if r is not None]
                busy = sum(1 for _, r in pages if r is None)
                proot.evaluate(_SEND, {"type": "cmd", "cmd": "play"})
                session = app.shared.core.session
                count = lambda: {0: len(session.tokens)}  # noqa: E731
            else:
                pages = [open_page(browser, url) for _ in range(n)]
                roots = [r for _, r in pages if r is not None]
                busy = sum(1 for _, r in pages if r is None)
                for p, r in pages:
                    if r is not None:
                        wait_enabled(p, ".sv-play")
                for r in roots:
                    r.evaluate(_SEND, {"type": "cmd", "cmd": "play"})
                count = lambda: {id(s): len(s.tokens) for s in list(app.pool.sessions)}  # noqa: E731
            time.sleep(args.warmup)
            tps, rounds_seen, appends, dt = window(count, roots, args.seconds)
            sessions = [app.shared.core.session] if shared else list(app.pool.sessions)
            finished = sum(1 for x in sessions if x.finished)  # a session that ended inside the window
            for r in roots[:1] if shared else roots:
                r.evaluate(_SEND, {"type": "cmd", "cmd": "pause"})
            browser.close()
    finally:
        peak = rss.stop()
        if idler is not None:
            idler.stop()
        server.stop()
        if app.pool is not None:
            app.pool.close_all()
        if app.shared is not None:
            app.shared.close()
    row = {
        "mode": mode,
        "pages": n,
        "seconds": round(dt, 2),
        "busy": busy,
        "rss_idle_mb": round(idle_mb, 1),
        "rss_peak_mb": round(peak, 1),
        "append_ms_median": round(q(appends, 0.5), 2),
        "append_ms_p95": round(q(appends, 0.95), 2),
        "appends": len(appends),
        "finished_in_window": finished,
    }
    if shared:
        row.update(
            presenter_tps=round(tps[0], 2),
            viewers_progressing=sum(1 for x in rounds_seen[1:] if x > 0),
            presenter_page_rounds=rounds_seen[0],
        )
    else:
        row.update(
            cap=cap,
            tps_sessions=[round(t, 2) for t in tps],
            tps_total=round(sum(tps), 2),
            progressing=sum(1 for x in rounds_seen if x > 0),
            pages_live=len(roots),
        )
    return row


def run_server_only(args, viewers: int, rounds: int = 25, repeats: int = 3) -> dict:
    """Presenter mode without browsers: the presenter's session runs ``rounds`` rounds with 0 and with
    ``viewers`` views attached, alternately, ``repeats`` times. Each view's send does what the server does
    per page up to the websocket (Bokeh's serializer on the message); tokens/s are the session's."""
    from bokeh.core.serialization import Serializer

    from specviz.backends.llama import LlamaModel
    from specviz.decoding.session import Session
    from specviz.models.embedded import resolve_model
    from specviz.server.pool import ManagedSession
    from specviz.server.presenter import SharedInspector
    from specviz.ui.panel_app import DEFAULT_PROMPT

    model = LlamaModel(resolve_model(args.model))
    spent = [0.0]

    def send(msg):
        t = time.perf_counter()
        json.dumps(Serializer().encode({"type": "event", "data": msg}))
        spent[0] += time.perf_counter() - t

    def once(n: int) -> tuple[float, float]:
        ms = ManagedSession(lambda: Session(model, n_ctx=4096))
        ms.start(DEFAULT_PROMPT, max_tokens=args.max_tokens, strategy="prompt-lookup")
        sh = SharedInspector(ms, prompt=DEFAULT_PROMPT)
        pv = sh.attach(send, "presenter")
        for _ in range(n):
            sh.handle(sh.attach(send, "viewer"), {"type": "hello", "epoch": -1, "have": 0})
        spent[0] = 0.0
        t0, k0 = time.perf_counter(), len(ms.tokens)
        sh.handle(pv, {"type": "cmd", "cmd": "run", "n": rounds})
        sh.core.wait(3600)
        dt = time.perf_counter() - t0
        out = ((len(ms.tokens) - k0) / dt, spent[0] / dt)
        sh.close()
        ms.close()
        return out

    base, loaded, share = [], [], []
    for _ in range(repeats):
        base.append(once(0)[0])
        tps, cpu = once(viewers)
        loaded.append(tps)
        share.append(cpu)
    return {
        "mode": "server-only",
        "pages": viewers,
        "tps_no_viewer": round(statistics.median(base), 2),
        "tps_viewers": round(statistics.median(loaded), 2),
        "send_share": round(statistics.median(share), 4),
        "rounds": rounds,
        "repeats": repeats,
    }


def run_server_pages(args, pages: int) -> dict:
    """The default mode without browsers: ``pages`` sessions in a pool with the round scheduler, each behind
    an inspector core whose send serializes as the server does for a page (Bokeh's serializer), all playing;
    every session's tokens are counted over ``--seconds`` after ``--warmup``. This isolates the scheduler's
    throughput from the browsers', which on one machine compete for the same two cores."""
    from bokeh.core.serialization import Serializer

    from specviz.backends.llama import LlamaModel
    from specviz.decoding.session import Session
    from specviz.models.embedded import resolve_model
    from specviz.server.pool import SessionPool
    from specviz.server.scheduler import RoundScheduler
    from specviz.ui.core import InspectorCore
    from specviz.ui.panel_app import DEFAULT_PROMPT

    model = LlamaModel(resolve_model(args.model))

    def send(msg):
        json.dumps(Serializer().encode({"type": "event", "data": msg}))

    pool = SessionPool(lambda: Session(model, n_ctx=4096), max_sessions=max(8, pages), scheduler=RoundScheduler())
    sessions = [pool.open() for _ in range(pages)]
    cores = []
    for ms in sessions:
        ms.start(DEFAULT_PROMPT, max_tokens=args.max_tokens, strategy="prompt-lookup")
        cores.append(InspectorCore(send, ms, prompt=DEFAULT_PROMPT))
    for c in cores:
        c.handle({"type": "cmd", "cmd": "play"})
    time.sleep(args.warmup)
    k0 = [len(ms.tokens) for ms in sessions]
    t0 = time.perf_counter()
    time.sleep(args.seconds)
    k1 = [len(ms.tokens) for ms in sessions]
    dt = time.perf_counter() - t0
    for c in cores:
        c.handle({"type": "cmd", "cmd": "pause"})
    for c in cores:
        c.wait(60)
    pool.close_all()
    tps = [(b - a) / dt for a, b in zip(k0, k1)]
    return {
        "mode": "server-pages",
        "pages": pages,
        "seconds": round(dt, 2),
        "tps_sessions": [round(x, 2) for x in tps],
        "tps_total": round(sum(tps), 2),
        "progressing": sum(1 for x in tps if x > 0),
        "rss_peak_mb": round(rss_mb(os.getpid()), 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", default="1,4,8,16", help="page counts for the default mode")
    ap.add_argument("--viewers", default="0,30", help="viewer counts for presenter mode")
    ap.add_argument("--modes", default="per-page,server-pages,shared,server-only")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per run")
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds of Play before the window")
    ap.add_argument("--model", default=None, help="target GGUF (default: the embedded Gemma 3 270M)")
    ap.add_argument("--max-tokens", type=int, default=3500)
    ap.add_argument("--cap", type=int, default=0, help="--max-sessions (default max(8, pages))")
    ap.add_argument("--no-nice", action="store_true", help="run chromium at normal priority")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # MODE:N, one run in this process
    a = ap.parse_args(argv)
    if a.one:
        mode, n = a.one.split(":")
        one = {"server-only": run_server_only, "server-pages": run_server_pages}.get(mode)
        print(json.dumps(one(a, int(n)) if one else run_one(a, mode, int(n))))
        return 0
    forward = [x for x in (argv if argv is not None else sys.argv[1:]) if x != "--json"]
    runs = []
    if "per-page" in a.modes.split(","):
        runs += [("per-page", int(x)) for x in a.pages.split(",") if x]
    if "server-pages" in a.modes.split(","):
        runs += [("server-pages", int(x)) for x in a.pages.split(",") if x]
    if "shared" in a.modes.split(","):
        runs += [("shared", int(x)) for x in a.viewers.split(",") if x]
    if "server-only" in a.modes.split(","):
        runs += [("server-only", max(int(x) for x in a.viewers.split(",") if x))]
    rows = []
    for mode, n in runs:  # each run in a fresh process: its memory figures are its own
        out = subprocess.run(
            [sys.executable, __file__, *forward, "--one", f"{mode}:{n}"], capture_output=True, text=True
        )
        if out.returncode != 0:
            print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"the run {mode}:{n} failed")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(rows))
        return 0
    print_tables(rows, a)
    return 0


def print_tables(rows, a) -> None:
    srv = [r for r in rows if r["mode"] == "server-pages"]
    if srv:
        one = next((r["tps_total"] for r in srv if r["pages"] == 1), None)
        print(
            f"default mode, server side only (no browsers): a session per simulated page, all playing; {a.seconds:g} s"
        )
        print(" pages  total tok/s  vs 1 page  per session min/median/max  progressing  RSS peak MB")
        for r in srv:
            t = sorted(r["tps_sessions"])
            vs = f"{r['tps_total'] / one:.0%}" if one else "-"
            print(
                f"{r['pages']:>6} {r['tps_total']:>12.1f} {vs:>10}   {t[0]:>6.1f} / {statistics.median(t):>5.1f} / "
                f"{t[-1]:>5.1f}   {r['progressing']:>5} of {r['pages']:<4} {r['rss_peak_mb']:>10.0f}"
            )
    for r in (r for r in rows if r["mode"] == "server-only"):
        print(
            f"presenter mode, server side only (no browsers; {r['rounds']} rounds, median of {r['repeats']}): "
            f"{r['tps_no_viewer']:.1f} tok/s with no viewer, {r['tps_viewers']:.1f} with {r['pages']} "
            f"({r['tps_viewers'] / r['tps_no_viewer']:.0%}); sending to the pages took {r['send_share']:.1%} "
            "of the wall time"
        )
    per = [r for r in rows if r["mode"] == "per-page"]
    if per:
        one = next((r["tps_total"] for r in per if r["pages"] == 1), None)
        print(
            f"default mode: a session per page, all playing; tokens counted on the server over {a.seconds:g} s "
            f"after {a.warmup:g} s of Play"
        )
        print(
            " pages   cap  busy  total tok/s  vs 1 page  per session min/median/max  progressing  "
            "RSS idle/peak MB  append ms med/p95"
        )
        for r in per:
            ratio = f"{r['tps_total'] / one:8.0%}" if one else "       -"
            tp = r["tps_sessions"] or [0.0]
            print(
                f"{r['pages']:6d} {r['cap']:5d} {r['busy']:5d} {r['tps_total']:12.1f} {ratio}   "
                f"{min(tp):8.1f} / {statistics.median(tp):5.1f} / {max(tp):5.1f}   "
                f"{r['progressing']:4d} of {r['pages_live']:<3d}  {r['rss_idle_mb']:7.0f} / {r['rss_peak_mb']:5.0f}"
                f"     {r['append_ms_median']:6.2f} / {r['append_ms_p95']:.2f}"
            )
    sh = [r for r in rows if r["mode"] == "shared"]
    if sh:
        base = next((r["presenter_tps"] for r in sh if r["pages"] == 0), None)
        print(f"presenter mode: one session, the presenter plays, viewers watch; {a.seconds:g} s window")
        print(" viewers  presenter tok/s  vs no viewer  viewers progressing  RSS idle/peak MB  append ms med/p95")
        for r in sh:
            ratio = f"{r['presenter_tps'] / base:10.0%}" if base else "         -"
            print(
                f"{r['pages']:8d} {r['presenter_tps']:16.1f}  {ratio}   {r['viewers_progressing']:6d} of "
                f"{r['pages']:<6d}    {r['rss_idle_mb']:7.0f} / {r['rss_peak_mb']:5.0f}    "
                f"{r['append_ms_median']:6.2f} / {r['append_ms_p95']:.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())
