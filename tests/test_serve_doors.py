"""The smaller doors of ``specviz serve``, each checked on a live server (tiny model, raw HTTP and websockets):

* with a token, a websocket from another origin is refused (the token cookie alone is not enough);
* Panel's ``/components/<module>/…`` route, which imported any module named in the URL before any token
  check, is off;
* the plotly bundle is a static asset behind the token, cached by the browser (``immutable``, an ETag);
* the presenter token is swapped for a cookie on first use and the URL cleaned of it; the presenter token
  may not equal the access token;
* ``specviz replay`` pages are gated like the others.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys

import pytest
from browser_util import free_port, start, stop, wait_http

from specviz.testing.page_client import PageClient

TOKEN = "doors-token-1234"
PRESENTER = "doors-presenter-5678"


def get(port: int, path: str, headers: dict | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path, headers=headers or {})
    r = conn.getresponse()
    r.read()
    return r


def serve(tiny_model_path, tmp_path, *extra, env=None):
    port = free_port()
    args = ["-m", "specviz.cli", "serve", "--model", str(tiny_model_path), "--port", str(port), "--max-tokens", "60"]
    proc = start([*args, *extra], tmp_path / "serve.log", env=env)
    return proc, port


@pytest.mark.slow
def test_token_mode_refuses_other_origins_components_and_serves_plotly_as_a_cached_asset(tiny_model_path, tmp_path):
    probe = tmp_path / "probe_pkg"
    probe.mkdir()
    marker = tmp_path / "imported"
    (probe / "sv_probe_module.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\nclass X: __css__ = []\n")
    path = os.pathsep.join(p for p in (str(probe), os.environ.get("PYTHONPATH", "")) if p)
    proc, port = serve(tiny_model_path, tmp_path, "--token", TOKEN, env={"PYTHONPATH": path})
    try:
        wait_http(f"http://127.0.0.1:{port}/?token={TOKEN}", proc)
        cookie = f"specviz-token-{port}={TOKEN}"
        # the websocket: the same host passes, another origin does not (even with the cookie)
        page = PageClient(f"http://127.0.0.1:{port}/", cookie=cookie)
        token = page.fetch_page().split('"token":"', 1)[1].split('"', 1)[0]
        assert page.open_socket(token) == 101
        page.close()
        evil = PageClient(f"http://127.0.0.1:{port}/", cookie=cookie, origin=f"http://evil.example:{port}")
        assert evil.open_socket(token) == 403
        # /components imports nothing, with or without the token
        for headers in ({}, {"Cookie": cookie}):
            r = get(port, "/components/sv_probe_module/X/__css__/x.css", headers)
            assert r.status in (403, 404)
        assert not marker.exists(), "the route imported a module named in the URL"
        # the plotly bundle: behind the token, cached by the browser
        assert get(port, "/specviz-assets/plotly.min.js").status == 403
        r = get(port, "/specviz-assets/plotly.min.js", {"Cookie": cookie})
        assert r.status == 200 and "immutable" in r.headers["Cache-Control"] and r.headers["ETag"]
        again = get(port, "/specviz-assets/plotly.min.js", {"Cookie": cookie, "If-None-Match": r.headers["ETag"]})
        assert again.status == 304
        # a page asking for plotly is told where it is, not sent 4.6 MB down its websocket
        page = PageClient(f"http://127.0.0.1:{port}/", cookie=cookie).connect()
        page.send({"type": "plotly"})
        msg = page.wait_for(lambda m: m.get("type") == "plotly", 60)
        assert msg.get("url", "").startswith("specviz-assets/plotly.min.js") and "source" not in msg
        page.close()
    finally:
        stop(proc)


@pytest.mark.slow
def test_the_presenter_token_becomes_a_cookie_and_leaves_the_url(tiny_model_path, tmp_path):
    proc, port = serve(tiny_model_path, tmp_path, "--shared", "--presenter-token", PRESENTER)
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)
        r = get(port, f"/?presenter={PRESENTER}&x=1")
        assert r.status == 302 and r.headers["Location"] == "/?x=1"
        set_cookie = r.headers["Set-Cookie"]
        assert set_cookie.startswith(f"specviz-presenter-{port}={PRESENTER}")
        assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        wrong = get(port, "/?presenter=not-the-token")
        assert wrong.status == 302 and "Set-Cookie" not in wrong.headers, "a wrong token is dropped from the URL"
        presenter = PageClient(f"http://127.0.0.1:{port}/", cookie=set_cookie.split(";")[0]).connect()
        viewer = PageClient(f"http://127.0.0.1:{port}/").connect()
        for p in (presenter, viewer):
            p.send({"type": "hello", "epoch": -1, "have": 0})
        assert presenter.wait_for(lambda m: m.get("type") == "state" and "role" in m, 60)["role"] == "presenter"
        assert viewer.wait_for(lambda m: m.get("type") == "state" and "role" in m, 60)["role"] == "viewer"
        presenter.close()
        viewer.close()
    finally:
        stop(proc)


def test_the_presenter_token_may_not_be_the_access_token(tiny_model_path):
    r = subprocess.run(
        [sys.executable, "-m", "specviz.cli", "serve", "--model", str(tiny_model_path), "--shared"]
        + ["--token", TOKEN, "--presenter-token", TOKEN],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--presenter-token" in r.stderr and "--token" in r.stderr, r.stderr


@pytest.mark.slow
def test_replay_pages_are_gated(tiny_model_path, tmp_path):
    from specviz import Recorder, Session

    s = Session(str(tiny_model_path), n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    rec = tmp_path / "rec.jsonl"
    with Recorder(rec) as recorder:
        s.subscribe(recorder)
        s.start("the cat sat on the mat", max_tokens=30)
        s.run()
    s.close()
    port = free_port()
    proc = start(["-m", "specviz.cli", "replay", str(rec), "--port", str(port)], tmp_path / "replay.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)
        page = PageClient(f"http://127.0.0.1:{port}/").connect()
        for _ in range(150):
            page.send({"type": "schema", "strategy": "none"})
        notice = page.wait_for(lambda m: m.get("type") == "notice" and "too many messages" in m.get("text", ""), 60)
        assert notice["level"] == "error"
        page.close()
    finally:
        stop(proc)
