"""A stand-alone page that runs the inspector front-end with a scripted host (tests and benchmarks).

The page imports ``inspector.js`` (the module assembled by :mod:`specviz.ui.bundle`) as an ES module and
gives it an anywidget-style model whose ``send`` records messages in ``window.__sent`` and whose custom
messages are delivered with ``window.__deliver(msg)``. Everything is served from memory through
Playwright routing, so the page needs no server and no network.
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import socket
import subprocess
import time
import urllib.request

ORIGIN = "http://specviz.local"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>specviz harness</title>
<link rel="stylesheet" href="/inspector.css">
<style>body{margin:0;padding:16px;background:#fff;width:1240px}</style>
%PLOTLY%
</head><body><div id="host"></div>
<script type="module">
import inspector from "/inspector.js";
const handlers = [];
window.__sent = [];
const model = {
  send(msg) { window.__sent.push(msg); },
  on(name, cb) { if (name === "msg:custom") handlers.push(cb); },
  off(name, cb) { const i = handlers.indexOf(cb); if (i >= 0) handlers.splice(i, 1); },
  get() { return undefined; }, set() {}, save_changes() {},
};
window.__deliver = (msg) => { for (const h of handlers.slice()) h(msg, []); };
window.__cleanup = inspector.render({ model, el: document.getElementById("host") });
window.__ready = true;
</script></body></html>"""


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    """Wait until ``url`` answers (a Panel page starts a session, so allow slow first pages)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=60).read(1)
            return
        except Exception:
            time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer in {timeout}s")


def jupyterlab_args(port: int, token: str, root_dir: str) -> list[str]:
    """``python`` arguments that start a headless JupyterLab server on 127.0.0.1 for browser checks.

    No browser is opened, and the news feed and the update check are off, so the server never tries
    the network.
    """
    return [
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root_dir}",
        "--ServerApp.open_browser=False",
        "--allow-root",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate a server process, killing it if it does not exit within 15 s."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def chromium_path() -> str | None:
    """Debian's chromium, or ``$SPECVIZ_CHROMIUM``; ``None`` when absent."""
    env = os.environ.get("SPECVIZ_CHROMIUM")
    if env and os.path.exists(env):
        return env
    for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.path.exists(p):
            return p
    return shutil.which("chromium")


def launch(playwright, **kwargs):
    """Launch headless chromium from the system (Playwright's own download is never used)."""
    return playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS, **kwargs)


def open_harness(browser, *, preload_plotly: bool = True, viewport=None):
    """A new page running the front-end with a scripted host; returns the page once rendered.

    With ``preload_plotly`` the page loads plotly.js from the plotly package in a script tag;
    otherwise the front-end asks its host for it (``{"type": "plotly"}``), as in JupyterLab.
    """
    from ..ui.core import static_text

    files = {
        "/inspector.js": (static_text("inspector.js").encode(), "text/javascript"),  # the assembled module
        "/inspector.css": (static_text("inspector.css").encode(), "text/css"),
    }
    plotly_tag = ""
    if preload_plotly:
        plotly = importlib.resources.files("plotly") / "package_data" / "plotly.min.js"
        files["/plotly.min.js"] = (plotly.read_bytes(), "text/javascript")
        # the UMD bundle sets module.exports when `module` exists, else a global; give it one
        plotly_tag = (
            '<script>window.module={exports:{}};</script><script src="/plotly.min.js"></script>'
            "<script>window.Plotly=window.module.exports;delete window.module;</script>"
        )
    files["/"] = (_PAGE.replace("%PLOTLY%", plotly_tag).encode(), "text/html")
    page = browser.new_page(viewport=viewport or {"width": 1280, "height": 1000})
    external: list[str] = []

    def handler(route):
        url = route.request.url
        if not url.startswith(ORIGIN):
            external.append(url)
            return route.abort()
        path = url[len(ORIGIN) :].split("?")[0] or "/"
        if path in files:
            body, ctype = files[path]
            return route.fulfill(status=200, body=body, headers={"content-type": ctype})
        return route.fulfill(status=404, body=b"not found")

    page.route("**/*", handler)
    page.external_requests = external
    page.goto(ORIGIN + "/")
    page.wait_for_function("window.__ready === true")
    return page
