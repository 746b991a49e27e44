"""A served inspector's page without a browser: Bokeh's websocket protocol spoken over a plain socket.

``specviz serve`` pages are Panel documents; a browser's page opens the document's websocket, pulls the
document, says it is ready and then sends the inspector's messages as Bokeh ``data_event`` events on the
inspector's component (what bokehjs does for the front-end's ``send_msg``). :class:`PageClient` does the
same with a few hundred lines of Python, so the tests and benchmarks can drive many pages — honest ones
and hostile ones — against a live server at no browser's cost:

* :meth:`PageClient.send` sends one inspector message as a page would; :meth:`PageClient.send_frame` and
  :meth:`PageClient.send_bokeh` send anything at all (malformed frames, protocol messages, events);
* a reader thread collects what the server sends the page (:attr:`PageClient.received`, decoded from
  Bokeh's encoding into plain dictionaries); with ``read=False`` nothing is ever read from the socket
  (a page that stopped reading: the server's writes back up);
* the websocket framing (RFC 6455, client side: masked frames, fragments, ping and close) is written
  here, so a test controls every byte it sends.

Nothing here imports a UI library; only the standard library is used.
"""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import os
import re
import socket
import struct
import threading
import time
import urllib.parse
from typing import Any, Callable

#: Websocket opcodes (RFC 6455).
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
#: The most bytes one received message may have (the pulled document is about 1 MB).
MAX_RECEIVED = 64 << 20
_TOKEN = re.compile(r'"token":\s*"([^"]+)"')
_ESM = re.compile(r'"name":\s*"panel\.models\.esm\.ReactiveESM",\s*"id":\s*"([^"]+)"')


class PageClientError(Exception):
    """The server refused or broke the page's connection (the message says how)."""


def encode(value: Any) -> Any:
    """A JSON value in Bokeh's wire encoding as bokehjs writes it: every object becomes a ``map``."""
    if isinstance(value, dict):
        return {"type": "map", "entries": [[k, encode(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    """Bokeh's wire encoding back to plain JSON values (maps to dictionaries, sets to lists)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "map":
            return {decode(k): decode(v) for k, v in value.get("entries", [])}
        if kind == "set":
            return [decode(v) for v in value.get("entries", [])]
        return {k: decode(v) for k, v in value.items()}
    return value


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise PageClientError("the server closed the connection")
        out += chunk
    return bytes(out)


def frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    """One websocket frame as a client sends it (masked unless ``mask`` is False, which a server refuses)."""
    head = bytearray([(0x80 if fin else 0) | opcode])
    n = len(payload)
    bit = 0x80 if mask else 0
    if n < 126:
        head.append(bit | n)
    elif n < 1 << 16:
        head += bytes([bit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([bit | 127]) + struct.pack(">Q", n)
    if not mask:
        return bytes(head) + payload
    key = os.urandom(4)
    body = bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if n < 4096 else _mask_fast(payload, key)
    return bytes(head) + key + body


def _mask_fast(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(k, "little")).to_bytes(n, "little")


class PageClient:
    """One page of a served inspector at ``url`` (see the module docstring).

    ``query`` is added to the page's URL (``token=…``, ``presenter=…``); ``cookie`` is sent with every
    request; ``origin`` is the websocket's ``Origin`` header (default: the server's own). ``read=False``
    never reads from the socket once connected. ``on_message`` is called (in the reader thread) with every
    inspector message the page receives.
    """

    def __init__(
        self,
        url: str,
        *,
        query: str = "",
        cookie: str | None = None,
        origin: str | None = None,
        read: bool = True,
        timeout: float = 60.0,
        on_message: Callable[[dict], None] | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path or "/"
        self.query = query
        self.cookie = cookie
        self.origin = origin if origin is not None else f"http://{self.host}:{self.port}"
        self.read = read
        self.timeout = timeout
        self.on_message = on_message
        self.sock: socket.socket | None = None
        self.model_id: str | None = None
        #: Inspector messages received so far (plain dictionaries), in order.
        self.received: list[dict] = []
        #: Bokeh protocol messages received so far, by type (ACK, PATCH-DOC, OK, ERROR …).
        self.protocol_counts: dict[str, int] = {}
        #: Why the connection ended (``None`` while it is open).
        self.closed_reason: str | None = None
        self.bytes_received = 0
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self.set_cookie: str | None = None

    # -- connecting ----------------------------------------------------------------------------------
    def fetch_page(self) -> str:
        """GET the page (its HTML carries the Bokeh session token), following redirects and keeping the cookies
        they set (the presenter token becomes a cookie that way); raises on an HTTP error."""
        target = self.path + (f"?{self.query}" if self.query else "")
        for _ in range(4):
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.request("GET", target, headers={"Cookie": self.cookie} if self.cookie else {})
                r = conn.getresponse()
                body = r.read()
                for header in r.headers.get_all("Set-Cookie") or []:
                    self.set_cookie = header
                    pair = header.split(";", 1)[0].strip()
                    kept = [c for c in (self.cookie or "").split("; ") if c and c.split("=")[0] != pair.split("=")[0]]
                    self.cookie = "; ".join([*kept, pair])
            finally:
                conn.close()
            if r.status in (301, 302, 303, 307, 308) and r.headers.get("Location"):
                target = urllib.parse.urljoin(target, r.headers["Location"])
                continue
            if r.status != 200:
                raise PageClientError(f"the page answered HTTP {r.status}")
            return body.decode("utf-8", "replace")
        raise PageClientError("the page redirected too often")

    def open_socket(self, token: str, *, protocols: str | None = None) -> int:
        """The websocket upgrade with the session ``token``; returns the HTTP status (101 when opened)."""
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            "GET /ws HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Sec-WebSocket-Version: 13",
            f"Sec-WebSocket-Key: {key}",
            f"Sec-WebSocket-Protocol: {protocols if protocols is not None else 'bokeh, ' + token}",
            f"Origin: {self.origin}",
        ]
        if self.cookie:
            lines.append(f"Cookie: {self.cookie}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(1)
            if not chunk:
                break
            head += chunk
        status = int(head.split()[1]) if len(head.split()) > 1 else 0
        if status != 101:
            sock.close()
            return status
        self.sock = sock
        return status

    def connect(self, *, ready: bool = True) -> PageClient:
        """Open the page as a browser does: the page, the websocket, the document, ``document_ready``."""
        html = self.fetch_page()
        m = _TOKEN.search(html)
        if m is None:
            raise PageClientError("the page carries no Bokeh session token")
        status = self.open_socket(m.group(1))
        if status != 101:
            raise PageClientError(f"the websocket upgrade answered HTTP {status}")
        kind, _ = self._read_message()
        if kind != "ACK":
            raise PageClientError(f"expected ACK, got {kind}")
        self.send_bokeh("PULL-DOC-REQ", {})
        while True:
            kind, raw = self._read_message()
            if kind == "PULL-DOC-REPLY":
                break
        mm = _ESM.search(raw)
        if mm is None:
            raise PageClientError("the document holds no inspector component")
        self.model_id = mm.group(1)
        if ready:
            self.send_event("document_ready", {})
        assert self.sock is not None
        self.sock.settimeout(None)  # from now on a page waits as long as the server takes
        if self.read:
            self._reader = threading.Thread(target=self._read_loop, name="page-client-reader", daemon=True)
            self._reader.start()
        return self

    # -- sending ---------------------------------------------------------------------------------------
    def send_frame(self, data: bytes, opcode: int = OP_TEXT, *, fin: bool = True, mask: bool = True) -> None:
        """One raw websocket frame."""
        if self.sock is None:
            raise PageClientError("not connected")
        with self._send_lock:
            self.sock.sendall(frame(opcode, data, fin=fin, mask=mask))

    def send_bokeh(self, msgtype: str, content: Any, *, metadata: Any = None) -> None:
        """One Bokeh protocol message (header, metadata and content frames)."""
        header = json.dumps({"msgid": f"c{next(self._ids)}", "msgtype": msgtype})
        parts = [header, json.dumps(metadata or {}), json.dumps(content)]
        if self.sock is None:
            raise PageClientError("not connected")
        with self._send_lock:
            self.sock.sendall(b"".join(frame(OP_TEXT, p.encode()) for p in parts))

    def send_event(self, name: str, values: dict) -> None:
        """A Bokeh event (a ``MessageSent`` patch), as bokehjs sends the ones a page triggers."""
        rep = {"type": "event", "name": name, "values": encode(values)}
        self.send_bokeh("PATCH-DOC", {"events": [{"kind": "MessageSent", "msg_type": "bokeh_event", "msg_data": rep}]})

    def send(self, msg: Any) -> None:
        """One inspector message, as the front-end's ``send_msg`` sends it."""
        rep = {
            "type": "event",
            "name": "data_event",
            "values": {"type": "map", "entries": [["model", {"id": self.model_id}], ["data", encode(msg)]]},
        }
        self.send_bokeh("PATCH-DOC", {"events": [{"kind": "MessageSent", "msg_type": "bokeh_event", "msg_data": rep}]})

    # -- receiving -------------------------------------------------------------------------------------
    def _read_frame(self) -> tuple[bool, int, bytes]:
        assert self.sock is not None
        b0, b1 = _recv_exact(self.sock, 2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack(">H", _recv_exact(self.sock, 2))
        elif n == 127:
            (n,) = struct.unpack(">Q", _recv_exact(self.sock, 8))
        if n > MAX_RECEIVED:
            raise PageClientError(f"a frame of {n} bytes")
        key = _recv_exact(self.sock, 4) if b1 & 0x80 else None
        data = _recv_exact(self.sock, n)
        if key is not None:
            data = _mask_fast(data, key)
        return bool(b0 & 0x80), b0 & 0x0F, data

    def _read_ws_message(self) -> bytes:
        parts: list[bytes] = []
        while True:
            fin, op, data = self._read_frame()
            if op == OP_PING:
                self.send_frame(data, OP_PONG)
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                code = struct.unpack(">H", data[:2])[0] if len(data) >= 2 else None
                raise PageClientError(f"closed by the server (code {code}: {data[2:].decode('utf-8', 'replace')})")
            parts.append(data)
            self.bytes_received += len(data)
            if fin:
                return b"".join(parts)

    def _read_message(self) -> tuple[str, str]:
        """One Bokeh message: its type and its content's raw JSON (buffers are read and dropped)."""
        header = json.loads(self._read_ws_message())
        self._read_ws_message()  # metadata
        content = self._read_ws_message().decode("utf-8", "replace")
        for _ in range(int(header.get("num_buffers", 0)) * 2):
            self._read_ws_message()
        kind = str(header.get("msgtype"))
        self.protocol_counts[kind] = self.protocol_counts.get(kind, 0) + 1
        return kind, content

    def _read_loop(self) -> None:
        try:
            while True:
                kind, raw = self._read_message()
                if kind != "PATCH-DOC":
                    continue
                for ev in json.loads(raw).get("events", []):
                    data = self._inspector_message(ev)
                    if data is None:
                        continue
                    for m in data["msgs"]:
                        with self._cond:
                            self.received.append(m)
                            self._cond.notify_all()
                        if self.on_message is not None:
                            self.on_message(m)
        except (OSError, ValueError, PageClientError) as e:
            with self._cond:
                self.closed_reason = str(e) or type(e).__name__
                self._cond.notify_all()

    @staticmethod
    def _inspector_message(ev: dict) -> dict | None:
        if ev.get("kind") != "MessageSent" or ev.get("msg_type") != "bokeh_event":
            return None
        rep = ev.get("msg_data") or {}
        if rep.get("name") != "esm_event":
            return None
        values = decode(rep.get("values"))
        msg = values.get("data") if isinstance(values, dict) else None
        if not isinstance(msg, dict):
            return None
        if msg.get("type") == "packed":  # a viewers' batch: the messages serialized once for all
            return {"msgs": json.loads(msg["json"])}
        return {"msgs": [msg]}

    def wait_for(self, pred: Callable[[dict], Any], timeout: float = 60.0, *, since: int = 0) -> dict:
        """The first message from index ``since`` on for which ``pred`` holds (waits up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for m in self.received[since:]:
                    if pred(m):
                        return m
                since = max(since, len(self.received))
                left = deadline - time.monotonic()
                if self.closed_reason is not None:
                    raise PageClientError(f"the connection ended: {self.closed_reason}")
                if left <= 0:
                    raise TimeoutError(f"no such message in {timeout:g} s")
                self._cond.wait(min(left, 0.5))

    def states(self) -> list[dict]:
        """The ``state`` messages received so far."""
        return [m for m in list(self.received) if m.get("type") == "state"]

    def close(self) -> None:
        """Close the socket (a page that goes away without a closing handshake)."""
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
