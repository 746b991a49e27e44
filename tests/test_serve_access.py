"""Access control of ``specviz serve``: tokens (403 without), message size and rate bounds, option checks.

The HTTP tests start real servers on the tiny model. The non-loopback path is exercised for real: the
server binds the wildcard address ``0.0.0.0`` (so it makes and prints a token, as it would on a LAN) and
the test connects through ``127.0.0.1``; ``--token`` on loopback is checked too.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from browser_util import free_port, start, stop, wait_http

from specviz.server.access import AccessPolicy, MessageGate, access_policy, is_loopback


def status(url: str, cookie: str | None = None) -> tuple[int, str | None]:
    """(HTTP status, Set-Cookie) of a GET."""
    req = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Set-Cookie")
    except urllib.error.HTTPError as e:
        return e.code, None


def websocket_status(port: int, cookie: str | None = None) -> int:
    """The status line of a websocket upgrade request to Bokeh's /ws (101 when let through)."""
    lines = [
        "GET /ws HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Connection: Upgrade",
        "Upgrade: websocket",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Protocol: bokeh, x",
        f"Origin: http://127.0.0.1:{port}",
    ]
    if cookie:
        lines.append(f"Cookie: {cookie}")
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = s.recv(4096).decode("latin-1")
    return int(head.split()[1])


def wait_log(log, pattern: str, proc, timeout: float = 90) -> re.Match:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, log.read_text())
        if m:
            return m
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()}")
        time.sleep(0.2)
    raise TimeoutError(f"{pattern!r} never appeared in {log.read_text()}")


@pytest.mark.parametrize("mode", ["per-page", "shared"])
@pytest.mark.slow
def test_off_loopback_every_request_needs_the_printed_token(tiny_model_path, tmp_path, mode):
    port = free_port()
    log = tmp_path / "serve.log"
    args = [
        "-m",
        "specviz.cli",
        "serve",
        "--model",
        str(tiny_model_path),
        "--port",
        str(port),
        "--address",
        "0.0.0.0",
        "--max-tokens",
        "50",
    ] + (["--shared"] if mode == "shared" else [])
    proc = start(args, log)
    try:
        token = wait_log(log, r"\?token=([0-9a-f]{48})", proc).group(1)
        assert "every request needs the token" in log.read_text()
        base = f"http://127.0.0.1:{port}/"
        wait_http(base + f"?token={token}", proc)
        assert status(base)[0] == 403
        assert status(base + "?token=wrong")[0] == 403
        assert status(base + "?token=" + token[:-1])[0] == 403
        assert websocket_status(port) == 403, "the websocket needs the token too"
        code, set_cookie = status(base + f"?token={token}")
        assert code == 200 and set_cookie and "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        cookie = set_cookie.split(";")[0]
        assert status(base, cookie=cookie)[0] == 200, "the cookie lets later pages in"
        assert websocket_status(port, cookie=cookie) != 403, "and their websocket"
        assert status(base, cookie=cookie.split("=")[0] + "=nope")[0] == 403
        if mode == "shared":
            presenter = re.search(r"presenter: \S+\?token=[0-9a-f]+&presenter=([0-9a-f]{48})", log.read_text())
            assert presenter and presenter.group(1) != token
            assert status(base + f"?presenter={presenter.group(1)}")[0] == 403, (
                "the presenter token alone is not access"
            )
    finally:
        stop(proc)


@pytest.mark.slow
def test_a_token_given_on_loopback_is_required_there_too(tiny_model_path, tmp_path):
    port = free_port()
    proc = start(
        [
            "-m",
            "specviz.cli",
            "serve",
            "--model",
            str(tiny_model_path),
            "--port",
            str(port),
            "--token",
            "demo-token-123",
            "--max-tokens",
            "50",
        ],
        tmp_path / "serve.log",
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/?token=demo-token-123", proc)
        assert status(f"http://127.0.0.1:{port}/")[0] == 403
        assert status(f"http://127.0.0.1:{port}/?token=demo-token-12")[0] == 403
        assert status(f"http://127.0.0.1:{port}/?token=demo-token-123")[0] == 200
        assert "?token=demo-token-123" in (tmp_path / "serve.log").read_text()
    finally:
        stop(proc)


def test_which_addresses_need_a_token():
    for a in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(a) and not access_policy(a).required, a
    for a in ("0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "example.org", ""):
        p = access_policy(a)
        assert p.required and len(p.token) == 48, a
    assert access_policy("0.0.0.0").token != access_policy("0.0.0.0").token
    p = access_policy("127.0.0.1", "given-token")
    assert p.required and p.allows("given-token") and not p.allows("given-toke") and not p.allows(None)
    assert AccessPolicy().allows(None) and AccessPolicy().allows("anything")
    sh = access_policy("127.0.0.1", shared=True)
    assert sh.presenter_token and not sh.required
    assert sh.is_presenter(sh.presenter_token) and not sh.is_presenter("x") and not sh.is_presenter(None)
    assert not access_policy("127.0.0.1").is_presenter("")
    assert sh.url("http://h:1/", presenter=True) == f"http://h:1/?presenter={sh.presenter_token}"
    assert p.url("http://h:1/") == "http://h:1/?token=given-token"
    with pytest.raises(ValueError):
        access_policy("127.0.0.1", "  ")


def test_the_message_gate_bounds_size_and_rate():
    now = [0.0]
    gate = MessageGate(max_bytes=100, rate=2.0, burst=4, clock=lambda: now[0])
    assert gate.check({"type": "cmd", "cmd": "step"}) is None
    reason = gate.check({"type": "configure", "knobs": {"x": "y" * 200}})
    assert reason and "limit is 100" in reason
    assert gate.check({"not": {"json": object()}}) is not None  # not JSON at all: refused as oversized
    big = MessageGate(max_bytes=100, max_part_bytes=1000, rate=2.0, burst=4, clock=lambda: now[0])
    part = {"type": "file", "cmd": "restore", "id": "u1", "index": 0, "count": 1, "data": "A" * 800}
    assert big.check(part) is None  # a snapshot upload's part may be larger than other messages
    assert "limit is 1000" in big.check({**part, "data": "A" * 1000})
    assert "limit is 100" in big.check({"type": "configure", "knobs": {"x": "A" * 800}})
    assert gate.check({"type": "hello"}) is None  # 4 taken: 1 left in the bucket
    assert gate.check({"type": "hello"}) is not None and "too many messages" in gate.check({"type": "hello"})
    assert gate.refused == 4
    now[0] += 1.0  # two more a second
    assert gate.check({"type": "hello"}) is None and gate.check({"type": "hello"}) is None
    assert gate.check({"type": "hello"}) is not None
    # one notice a second at most, however many are refused
    assert gate.notice("r") == {"type": "notice", "level": "error", "text": "r"}
    assert gate.notice("r") is None
    now[0] += 1.5
    assert gate.notice("r") is not None


def test_the_gate_in_front_of_a_page_refuses_without_reaching_the_inspector():
    from specviz.server.pages import gated

    handled, sent = [], []
    admit = gated(MessageGate(max_bytes=50, rate=1.0, burst=2, clock=lambda: 0.0), sent.append, handled.append)
    admit({"type": "hello"})
    admit({"type": "cmd", "cmd": "reset", "prompt": "p" * 100})
    admit({"type": "hello"})
    admit({"type": "hello"})
    assert handled == [{"type": "hello"}]
    assert len(sent) == 1 and sent[0]["level"] == "error"  # one notice for the two refusals


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--token", "short"], "--token"),
        (["--token", "has space in it"], "--token"),
        (["--token", "quote'\"<script>"], "--token"),
        (["--max-sessions", "0"], "--max-sessions"),
        (["--max-sessions", "many"], "--max-sessions"),
        (["--max-viewers", "0"], "--max-viewers"),
        (["--idle-timeout", "0"], "--idle-timeout"),
        (["--idle-timeout", "soon"], "--idle-timeout"),
        (["--presenter-token", "abcdefgh1234"], "--presenter-token"),
        (["--shared", "--presenter-token", "x"], "--presenter-token"),
        (["-fa", "off", "-ctv", "q8_0"], "-ctv"),
        (["-ctk", "q8_0"], "-ctk"),  # the tiny model's 16-wide heads split q8_0's blocks of 32
        (["-c", "lots"], "--n-ctx"),
        (["-b", "64", "-ub", "128"], "-ub"),
    ],
)
@pytest.mark.slow
def test_serve_options_are_checked_before_any_model_loads(tiny_model_path, args, flag):
    """A bad option exits with status 2 and names the option (nothing is served)."""
    r = subprocess.run(
        [sys.executable, "-m", "specviz.cli", "serve", "--model", str(tiny_model_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and flag in r.stderr, r.stderr
