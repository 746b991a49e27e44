"""Hostile pages for a served inspector: random, malformed, oversized, out-of-order and flooding messages, pages
that never read, connections that come and go — driven over raw websockets (:mod:`specviz.testing.page_client`).

:class:`Hostile` runs a set of *actors* (threads), each misbehaving in its own way, for a bounded time, from a
seeded generator (the same seed sends the same kinds of messages; timing still varies):

* ``fuzz``: inspector messages of declared and undeclared types, with random, wrong-typed, out-of-range and
  oversized fields, heavy ones included (long resets, lane branches, advice, snapshots), as fast as it can;
* ``protocol``: malformed websocket and Bokeh protocol traffic (binary and non-JSON frames, unknown message
  types, events for unknown models, PULL-DOC requests, oversized frames, unmasked frames);
* ``silent``: pages that ask for a lot (hello from scratch, the plotly bundle, recordings, play) and never
  read what they are sent;
* ``churn``: pages opened and dropped without a goodbye;
* ``catchup``: a page that floods ``hello`` from scratch (the whole event log again, each time);
* ``mixed``: one page at a time, each time one of the behaviours above (a single hostile page);
* ``uploads``: snapshot uploads that never complete: a plausible first part, then 512 KiB parts in order,
  and parts of many other ids;
* ``crafted``: a page that downloads a snapshot of its own session, then uploads it again and again with
  the target context's llama.cpp state altered (cell positions out of range or repeated, another sequence
  id, a cell count beyond the context) and the checksum recomputed (not in ``mixed``: it needs a page that
  drives its own session).

Every actor reconnects when the server closes its connection. :attr:`Hostile.sent` counts what went out.
Nothing here imports a UI library.
"""

from __future__ import annotations

import base64
import json
import random
import struct
import threading
import time
from typing import Any, Callable

from ..decoding.snapshot import pack, unpack
from .page_client import OP_BINARY, OP_PING, OP_TEXT, PageClient, PageClientError

ACTORS = ("fuzz", "protocol", "silent", "churn", "uploads", "catchup", "crafted", "mixed")
#: The behaviours a ``mixed`` actor (one page at a time) takes turns with.
MIXED = ("fuzz", "protocol", "silent", "churn", "uploads", "catchup")

_TYPES = [
    "hello",
    "cmd",
    "configure",
    "schema",
    "plotly",
    "rewind",
    "lane",
    "diagnose",
    "advise",
    "preset",
    "file",
    "explode",
    "",
    "state",
    "events",
]
_VARIANTS = {
    "cmd": ["step", "run", "play", "pause", "reset", "jump", ""],
    "lane": ["branch", "compare", "configure", "step", "run", "close", "fly"],
    "file": ["snapshot", "record", "restore", "delete"],
}
_FIELDS = [
    "epoch",
    "have",
    "n",
    "prompt",
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "stop",
    "chat",
    "strategy",
    "knobs",
    "round",
    "position",
    "name",
    "id",
    "count",
    "index",
    "data",
    "draft_model",
]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value of any kind: wrong types, extreme numbers, long text, nesting."""
    pick = rng.randrange(12 if depth < 3 else 8)
    if pick == 0:
        return rng.choice([0, 1, -1, 2**31, -(2**63), 2**70, 7])
    if pick == 1:
        return rng.choice([0.5, -1e308, 1e308, 3.0, float("inf")])
    if pick == 2:
        return rng.choice([True, False, None])
    if pick == 3:
        return "".join(rng.choice("ab/.\\'\"<>{}\u00e9\u4e2d\n") for _ in range(rng.randrange(40)))
    if pick == 4:
        return "x" * rng.choice([100, 5000, 70_000])
    if pick == 5:
        return rng.choice(["prompt-lookup", "draft", "none", "../../etc/passwd", "/etc/hostname", "0"])
    if pick == 6:
        return rng.randrange(-5, 5000)
    if pick == 7:
        return ""
    if pick < 10:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {rng.choice(_FIELDS + ["__proto__", "type"]): random_value(rng, depth + 1) for _ in range(rng.randrange(6))}


def random_message(rng: random.Random) -> Any:
    """An inspector message of a declared or undeclared type with random fields (sometimes not an object)."""
    if rng.random() < 0.05:
        return random_value(rng)
    kind = rng.choice(_TYPES)
    msg: dict[str, Any] = {"type": kind}
    if kind in _VARIANTS:
        msg["cmd"] = rng.choice(_VARIANTS[kind])
    for _ in range(rng.randrange(5)):
        msg[rng.choice(_FIELDS)] = random_value(rng)
    return msg


def heavy_message(rng: random.Random) -> dict[str, Any]:
    """A well-formed message whose work grows with the model or the history."""
    return rng.choice(
        [
            {"type": "cmd", "cmd": "reset", "prompt": "the cat sat on the mat " * rng.randrange(1, 200)},
            {"type": "lane", "cmd": "branch"},
            {"type": "lane", "cmd": "compare", "strategy": "ngram-simple"},
            {"type": "advise"},
            {"type": "diagnose"},
            {"type": "file", "cmd": "snapshot"},
            {"type": "file", "cmd": "record"},
            {"type": "rewind", "round": rng.randrange(0, 50)},
            {"type": "hello", "epoch": -1, "have": 0},
            {"type": "cmd", "cmd": "play"},
        ]
    )


class Hostile:
    """Hostile actors against the server at ``url`` for ``seconds`` (see the module docstring).

    ``actors`` names which to run (each once; repeat a name to run it more than once); ``query`` and
    ``cookie`` are what every page is opened with; ``seed`` seeds the generator of each actor.
    """

    def __init__(
        self,
        url: str,
        *,
        seconds: float,
        actors: tuple[str, ...] = ACTORS,
        seed: int = 0,
        query: str = "",
        cookie: str | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        unknown = [a for a in actors if a not in ACTORS]
        if unknown:
            raise ValueError(f"unknown actors {unknown}; known: {ACTORS}")
        self.url, self.seconds, self.actors, self.seed = url, seconds, actors, seed
        self.query, self.cookie = query, cookie
        self.on_error = on_error
        self.sent: dict[str, int] = {a: 0 for a in ACTORS}
        self.connects: dict[str, int] = {a: 0 for a in ACTORS}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._quiet_pages: list[PageClient] = []

    def _page(self, name: str, *, read: bool = True) -> PageClient:
        page = PageClient(self.url, query=self.query, cookie=self.cookie, read=read, timeout=30)
        page.connect()
        with self._lock:
            self.connects[name] += 1
        return page

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.sent[name] += n

    def start(self) -> Hostile:
        """Start every actor (each in its own thread)."""
        self._deadline = time.monotonic() + self.seconds
        for i, name in enumerate(self.actors):
            rng = random.Random(self.seed * 1000 + i)
            t = threading.Thread(target=self._loop, args=(name, rng), name=f"hostile-{name}", daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._deadline

    def _loop(self, name: str, rng: random.Random) -> None:
        act = getattr(self, "_" + name)
        while self._running():
            try:
                act(rng)
            except (OSError, PageClientError, TimeoutError, ValueError) as e:
                if self.on_error is not None:
                    self.on_error(f"{name}: {type(e).__name__}: {e}")
                self._stop.wait(0.05)

    # -- the actors ------------------------------------------------------------------------------------
    def _fuzz(self, rng: random.Random) -> None:
        page = self._page("fuzz")
        try:
            page.send({"type": "hello", "epoch": -1, "have": 0})
            for _ in range(400):
                if not self._running():
                    break
                page.send(heavy_message(rng) if rng.random() < 0.3 else random_message(rng))
                self._count("fuzz")
                if page.closed_reason is not None:
                    break
        finally:
            page.close()

    def _protocol(self, rng: random.Random) -> None:
        page = self._page("protocol")
        try:
            for _ in range(30):
                if not self._running() or page.closed_reason is not None:
                    break
                pick = rng.randrange(9)
                if pick == 0:
                    page.send_frame(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))), OP_BINARY)
                elif pick == 1:
                    page.send_frame(b"{not json", OP_TEXT)
                elif pick == 2:
                    page.send_bokeh(rng.choice(["NOPE", "PUSH-DOC", "ACK", "OK"]), {"doc": random_value(rng)})
                elif pick == 3:
                    page.send_bokeh("PULL-DOC-REQ", {})
                elif pick == 4:
                    events = [{"kind": "MessageSent", "msg_type": "bokeh_event", "msg_data": random_value(rng)}]
                    page.send_bokeh("PATCH-DOC", {"events": events})
                elif pick == 5:  # an inspector message for a model the document does not hold
                    entries = [["model", {"id": "p" + str(rng.randrange(10**6))}], ["data", {"type": "hello"}]]
                    rep = {"type": "event", "name": "data_event", "values": {"type": "map", "entries": entries}}
                    event = {"kind": "MessageSent", "msg_type": "bokeh_event", "msg_data": rep}
                    page.send_bokeh("PATCH-DOC", {"events": [event]})
                elif pick == 6:
                    page.send_frame(b"x" * rng.choice([500_000, 1_100_000]), OP_TEXT)  # near and over the limit
                elif pick == 7:
                    page.send_frame(b"ping", OP_PING)
                else:
                    page.send_frame(json.dumps({"msgid": "1", "msgtype": "PATCH-DOC"}).encode(), OP_TEXT, mask=False)
                self._count("protocol")
        finally:
            page.close()

    def _silent(self, rng: random.Random) -> None:
        page = self._page("silent", read=False)
        with self._lock:
            self._quiet_pages.append(page)
        page.send({"type": "hello", "epoch": -1, "have": 0})
        page.send({"type": "cmd", "cmd": "play"})
        self._count("silent", 2)
        end = time.monotonic() + rng.uniform(5, 20)
        while self._running() and time.monotonic() < end:
            page.send({"type": "hello", "epoch": rng.choice([-1, 0, 5]), "have": 0})  # catch-ups, never read
            page.send({"type": "plotly"})  # the bundle, never read
            if rng.random() < 0.2:
                page.send({"type": "file", "cmd": "record"})
            self._count("silent", 2)
            self._stop.wait(0.1)
        page.close()

    def _catchup(self, rng: random.Random) -> None:
        page = self._page("catchup")
        try:
            for _ in range(300):
                if not self._running() or page.closed_reason is not None:
                    break
                page.send({"type": "hello", "epoch": rng.choice([-1, 10**6]), "have": 0})
                self._count("catchup")
                self._stop.wait(0.01)
        finally:
            page.close()

    def _mixed(self, rng: random.Random) -> None:
        name = rng.choice(MIXED)
        getattr(self, "_" + name)(rng)

    def _churn(self, rng: random.Random) -> None:
        page = self._page("churn")
        page.send({"type": "hello", "epoch": -1, "have": 0})
        self._count("churn")
        self._stop.wait(rng.uniform(0.0, 0.5))
        page.close()

    _PART = base64.b64encode(bytes(range(256)) * 2048).decode()  # 512 KiB of raw bytes

    def _uploads(self, rng: random.Random) -> None:
        page = self._page("uploads")
        try:
            head = base64.b64encode(b"SPECVIZ-SNAPSHOT-1\n" + (64).to_bytes(8, "little") + b"{}" * 100).decode()
            fid, index = f"h{rng.randrange(10**9)}", 0
            end = time.monotonic() + rng.uniform(10, 30)
            while self._running() and page.closed_reason is None and time.monotonic() < end:
                if rng.random() < 0.8:  # one long upload, in order, that never ends
                    data = head if index == 0 else self._PART
                    msg = {"type": "file", "cmd": "restore", "id": fid, "index": index, "count": 2049, "data": data}
                    index += 1
                else:  # parts of other uploads
                    count = rng.choice([2, 50, 2049])
                    other = rng.randrange(count)
                    msg = {"type": "file", "cmd": "restore", "id": f"h{rng.randrange(10**9)}", "index": other,
                           "count": count, "data": self._PART if rng.random() < 0.5 else "AAAA"}  # fmt: skip
                page.send(msg)
                self._count("uploads")
                self._stop.wait(0.02)
        finally:
            page.close()

    def _crafted(self, rng: random.Random) -> None:
        page = self._page("crafted")
        try:
            page.send({"type": "hello", "epoch": -1, "have": 0})
            page.wait_for(lambda m: m.get("type") == "state" and m.get("can_step") and not m.get("working"), 60)
            page.send({"type": "cmd", "cmd": "step"})
            ev = page.wait_for(
                lambda m: m.get("type") == "events" and any(e.get("kind") == "telemetry" for e in m["events"]), 60
            )
            page.wait_for(_idle, 60, since=page.received.index(ev))  # the step's round is over
            mark = len(page.received)
            page.send({"type": "file", "cmd": "snapshot"})
            header, blobs = unpack(download(page, mark))
            header.pop("blobs", None)
            for _ in range(30):
                if not self._running() or page.closed_reason is not None:
                    break
                target = crafted_state(blobs["target"], rng)
                blob = pack(header, [("target", target), *[(k, v) for k, v in blobs.items() if k != "target"]])
                upload(page, f"c{rng.randrange(10**9)}", blob)
                self._count("crafted")
                self._stop.wait(0.1)
        finally:
            page.close()

    # -- ending ----------------------------------------------------------------------------------------
    def join(self) -> None:
        """Wait for the actors to end (at their deadline) and close what is still open."""
        for t in self._threads:
            t.join(self.seconds + 60)
        self.stop()

    def stop(self) -> None:
        """Stop now."""
        self._stop.set()
        with self._lock:
            pages, self._quiet_pages = self._quiet_pages, []
        for p in pages:
            p.close()


def _idle(m: dict) -> bool:
    return m.get("type") == "state" and not m.get("running") and not m.get("working")


def download(page: PageClient, since: int, timeout: float = 60) -> bytes:
    """The file of the first download a page was sent from message ``since`` on, once all its parts arrived."""
    first = page.wait_for(lambda m: m.get("type") == "download", timeout, since=since)
    fid, count = first["id"], first["count"]
    page.wait_for(
        lambda m: m.get("type") == "download" and m.get("id") == fid and m.get("index") == count - 1,
        timeout,
        since=since,
    )
    parts = {m["index"]: m["data"] for m in page.received[since:] if m.get("type") == "download" and m["id"] == fid}
    return b"".join(base64.b64decode(parts[i]) for i in range(count))


def upload(page: PageClient, fid: str, blob: bytes, timeout: float = 240, part_bytes: int = 512 * 1024) -> dict:
    """Send ``blob`` as a snapshot upload the way the front-end does (one part, then the part the server's
    ``upload`` answer names, after its ``retry_ms``); the last answer (with ``error`` when refused)."""
    parts = [blob[i : i + part_bytes] for i in range(0, len(blob), part_bytes)] or [b""]
    deadline = time.monotonic() + timeout
    nxt = 0
    while True:
        mark = len(page.received)
        data = base64.b64encode(parts[nxt]).decode()
        page.send({"type": "file", "cmd": "restore", "id": fid, "index": nxt, "count": len(parts), "data": data})
        ack = page.wait_for(
            lambda m: m.get("type") == "upload" and m.get("id") == fid,
            max(1.0, deadline - time.monotonic()),
            since=mark,
        )
        if ack.get("error") or ack["next"] >= len(parts):
            return ack
        time.sleep(ack.get("retry_ms", 0) / 1000)
        nxt = ack["next"]


def crafted_state(state: bytes, rng: random.Random) -> bytes:
    """A llama.cpp state (a plain cache's) with one cell, or the cell count, altered."""
    at = 4 + struct.unpack_from("<I", state, 0)[0] + 4  # after the architecture name and the stream count
    n = struct.unpack_from("<I", state, at)[0]
    out = bytearray(state)
    if n == 0 or rng.random() < 0.2:
        struct.pack_into("<I", out, at, rng.choice([n + 1, 1 << 20, 2**32 - 1]))
        return bytes(out)
    cell = at + 4 + 12 * rng.randrange(n)
    if rng.random() < 0.7:
        struct.pack_into("<i", out, cell, rng.choice([-1, 0, n, 10**6, 2**31 - 1, -(2**31)]))
    else:
        struct.pack_into("<i", out, cell + 8, rng.choice([1, -1, 7]))
    return bytes(out)


class Player:
    """An honest page: it plays its session, starts it again when it finishes (sending a refused command
    again, as a person would), and counts the rounds it is shown (one ``telemetry`` event per round)."""

    def __init__(self, url: str, *, query: str = "", cookie: str | None = None, control: bool = True) -> None:
        self.rounds = 0
        self.tokens = 0
        self.resets = 0
        #: ``(epoch, events held after it, arrival time)`` of every events message (for viewers' lag).
        self.arrivals: list[tuple[int, int, float]] = []
        self._lock = threading.Lock()
        self._restarting = False
        self.control = control
        self.page = PageClient(url, query=query, cookie=cookie, on_message=self._on_message)

    def _on_message(self, msg: dict) -> None:
        if msg.get("type") == "events":
            events = [e for e in msg.get("events") or [] if isinstance(e, dict)]
            n = sum(1 for e in events if e.get("kind") == "telemetry")
            k = sum(len(e.get("tokens") or ()) for e in events if e.get("kind") == "accepted")
            with self._lock:
                self.rounds += n
                self.tokens += k
                if isinstance(msg.get("epoch"), int) and isinstance(msg.get("start"), int):
                    self.arrivals.append((msg["epoch"], msg["start"] + len(events), time.monotonic()))
        elif self.control and msg.get("type") == "state" and msg.get("finished") and not msg.get("working"):
            with self._lock:
                if self._restarting:
                    return
                self._restarting = True
                self.resets += 1
            threading.Thread(target=self._again, daemon=True).start()

    def _again(self) -> None:
        # as a person at the page would, send again what was refused (its gate was empty, or the page was
        # still working): a command lost to a refusal must not stop the page for good
        try:
            deadline = time.monotonic() + 180
            for cmd, done in (("reset", self._ready), ("play", self._playing)):
                while time.monotonic() < deadline:
                    mark = len(self.page.received)
                    self.page.send({"type": "cmd", "cmd": cmd})
                    try:
                        self.page.wait_for(done, 10, since=mark)
                        break
                    except TimeoutError:
                        continue
        except (OSError, PageClientError):
            pass
        finally:
            with self._lock:
                self._restarting = False

    @staticmethod
    def _ready(m: dict) -> bool:
        return m.get("type") == "state" and bool(m.get("can_step")) and not m.get("working")

    @staticmethod
    def _playing(m: dict) -> bool:
        return m.get("type") == "state" and bool(m.get("running") or m.get("finished"))

    def start(self) -> Player:
        """Open the page and press Play (a viewer only says hello)."""
        self.page.connect()
        self.page.send({"type": "hello", "epoch": -1, "have": 0})
        if self.control:
            self.page.wait_for(lambda m: m.get("type") == "state" and m.get("can_step"), 120)
            self.page.send({"type": "cmd", "cmd": "play"})
        return self

    def seen(self) -> int:
        """Rounds shown so far."""
        with self._lock:
            return self.rounds

    def tokens_seen(self) -> int:
        """Tokens committed in the rounds shown so far."""
        with self._lock:
            return self.tokens

    def close(self) -> None:
        """Close the page."""
        self.page.close()
