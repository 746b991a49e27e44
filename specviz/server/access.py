"""Who may open a served inspector, who presents, and how much a page may send.

* :func:`access_policy`: on a loopback address (the default ``127.0.0.1``) nobody needs a token, as
  before; on any other address a token is required — the one given with ``--token``, or a random one
  printed at start, as JupyterLab does. ``--token`` on loopback requires it there too. In presenter mode
  a second, separate token marks the presenter's pages.
* :func:`auth_provider`: the Bokeh/Tornado hook that enforces it. It runs in ``prepare()`` of every
  page, session and websocket request (Bokeh's ``AuthRequestHandler``): a request without the token
  gets 403 before any session is made. The first page opened with ``?token=...`` gets the token as an
  HttpOnly, SameSite=Strict cookie, which its websocket (and later pages) carry.
  A websocket upgrade whose ``Origin`` is not the host it was sent to is refused too (403): with a token,
  pages come from wherever the audience reaches the machine, so the allowlist of origins cannot be
  written in advance, but a page of another site must not talk to this one. A page opened with the
  presenter token gets it as a second cookie (HttpOnly, SameSite=Strict) and is redirected to the same
  URL without it, so the token does not stay in the address bar (a shared screen shows it).
* :class:`MessageGate`: bounds the size of each message a page sends, their rate (a token bucket of
  messages) and the *work* they cost (a second bucket, of units: a token decoded or copied, or 16 KiB
  moved; :meth:`MessageGate.charge`). A message whose work grows with the model or the history (the
  declaration's ``"work": "background"``) is refused while the page's work bucket is empty; each part of
  a snapshot upload is charged its bytes. A refused message is answered with one error notice (at most
  one a second) and never reaches the inspector. :class:`GateRegistry` gives every page a gate whose
  parent is the gate of its client address, so one client's many pages share one allowance (a presenter's
  page excepted: :meth:`GateRegistry.presenter_gate`).

Tokens are compared in constant time (:func:`hmac.compare_digest`). Nothing here imports a UI library
at module level; :func:`auth_provider` imports Bokeh and Tornado when called.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from ..ui.protocol import work_of
from ..ui.tasks import BYTES_PER_UNIT

#: The query argument and the cookie (suffixed with the port) that carry the access token.
TOKEN_ARG = "token"
COOKIE_PREFIX = "specviz-token-"
#: The query argument that carries the presenter token, and the prefix of the cookie it is swapped for.
PRESENTER_ARG = "presenter"
PRESENTER_COOKIE_PREFIX = "specviz-presenter-"
#: Default bounds on what one page sends: bytes per message (as JSON), messages per second and burst.
MAX_MESSAGE_BYTES = 64 * 1024
#: A part of a snapshot upload (the workbench's ``file restore``: 512 KiB of raw bytes in base64) may be this
#: large; it still counts as one message against the rate.
MAX_UPLOAD_PART_BYTES = 768 * 1024
MESSAGES_PER_SECOND = 20.0
MESSAGE_BURST = 60
#: The work a page may cost (units: a token decoded or copied, or 16 KiB moved), on average per second and
#: in a burst: a 3.5k-token reset or a 64 MiB snapshot fits a burst, a page flooding them gets one in ~10 s.
WORK_PER_SECOND = 400.0
WORK_BURST = 8192.0
#: The gate of one client address allows this many times what one page's does (a client may open pages).
ADDRESS_FACTOR = 3.0
#: Client addresses whose gates are kept (the least recently seen are forgotten beyond it).
MAX_ADDRESSES = 4096


def is_loopback(address: str) -> bool:
    """True for an address only this machine can reach (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if address.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    """A fresh random token (48 hex digits)."""
    return secrets.token_hex(24)


@dataclass(frozen=True)
class AccessPolicy:
    """The tokens of a server: ``token`` (``None``: open to anyone who reaches the address) and
    ``presenter_token`` (``None``: no presenter mode)."""

    token: str | None = None
    presenter_token: str | None = None

    @property
    def required(self) -> bool:
        """True when a request must carry the access token."""
        return self.token is not None

    def allows(self, supplied: str | None) -> bool:
        """May a request carrying ``supplied`` (or nothing) open pages?"""
        if self.token is None:
            return True
        return isinstance(supplied, str) and hmac.compare_digest(supplied.encode(), self.token.encode())

    def is_presenter(self, supplied: str | None) -> bool:
        """Does ``supplied`` (the ``presenter`` query argument) mark a presenter's page?"""
        if self.presenter_token is None or not isinstance(supplied, str):
            return False
        return hmac.compare_digest(supplied.encode(), self.presenter_token.encode())

    def presenter_cookie(self, port: int) -> str:
        """The name of the cookie that marks a presenter's browser (the presenter token, swapped on first use)."""
        return PRESENTER_COOKIE_PREFIX + str(port)

    def url(self, base: str, presenter: bool = False) -> str:
        """``base`` with the query arguments a page needs (the access token; the presenter's token)."""
        args = []
        if self.token is not None:
            args.append(f"{TOKEN_ARG}={self.token}")
        if presenter and self.presenter_token is not None:
            args.append(f"{PRESENTER_ARG}={self.presenter_token}")
        return base + ("?" + "&".join(args) if args else "")


def access_policy(
    address: str, token: str | None = None, *, shared: bool = False, presenter_token: str | None = None
) -> AccessPolicy:
    """The policy for a server bound to ``address``: a token when one is given or the address is not
    loopback (a random one when none is given); a presenter token in presenter mode (``shared``)."""
    if token is not None and not token.strip():
        raise ValueError("the token is empty; give a non-empty --token or leave it out")
    if token is None and not is_loopback(address):
        token = new_token()
    if shared and presenter_token is None:
        presenter_token = new_token()
    if shared and token is not None and presenter_token == token:
        raise ValueError("the presenter token equals the access token (every viewer would present); give another one")
    return AccessPolicy(token=token, presenter_token=presenter_token if shared else None)


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether a request's ``Origin`` header names the host it was sent to (no ``Origin``: not a browser's
    cross-site request, allowed)."""
    if not origin:
        return True
    netloc = urllib.parse.urlsplit(origin).netloc.lower()
    return bool(host) and netloc == str(host).lower()


def request_allowed(policy: AccessPolicy, port: int, query_token: str | None, cookie_token: str | None) -> bool:
    """Whether a request carrying ``query_token`` (the ``token`` argument) or ``cookie_token`` may see pages."""
    return (query_token is not None and policy.allows(query_token)) or policy.allows(cookie_token)


def without_query_arg(uri: str, name: str) -> str:
    """``uri`` (a path and query) without the query argument ``name``."""
    parts = urllib.parse.urlsplit(uri)
    kept = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != name]
    return urllib.parse.urlunsplit(("", "", parts.path or "/", urllib.parse.urlencode(kept), ""))


def auth_provider(policy: AccessPolicy, port: int) -> Any:
    """A Bokeh ``AuthProvider`` that answers 403 to every page, session or websocket request without the
    access token (as the ``token`` query argument, or the cookie set by the first page that had it) and to
    a websocket upgrade from another origin; it swaps a presenter token for its cookie (see the module
    docstring). Also used without a token in presenter mode, for the presenter's cookie alone."""
    from bokeh.server.auth_provider import AuthProvider
    from tornado.web import HTTPError

    cookie = COOKIE_PREFIX + str(port)

    async def get_user(handler: Any) -> str:
        request = handler.request
        if request.headers.get("Upgrade", "").lower() == "websocket" and not same_origin(
            request.headers.get("Origin"), request.host
        ):
            raise HTTPError(403, reason="this server's pages are opened from its own address only")
        supplied = handler.get_query_argument(TOKEN_ARG, None)
        if not request_allowed(policy, port, supplied, handler.get_cookie(cookie)):
            raise HTTPError(403, reason="a token is required: open the URL specviz serve printed (?token=...)")
        if supplied is not None and policy.token is not None:
            handler.set_cookie(cookie, supplied, httponly=True, samesite="Strict", path="/")
        presenter = handler.get_query_argument(PRESENTER_ARG, None)
        if presenter is not None and request.method == "GET":
            if policy.is_presenter(presenter):  # the token goes into a cookie, out of the address bar
                handler.set_cookie(policy.presenter_cookie(port), presenter, httponly=True, samesite="Strict", path="/")
            handler.redirect(without_query_arg(request.uri, PRESENTER_ARG))
        return "specviz"

    class TokenAuth(AuthProvider):
        """403 without the access token (see :func:`auth_provider`)."""

        @property
        def get_user_async(self) -> Callable[[Any], Any]:
            return get_user

        @property
        def login_url(self) -> str:
            # Bokeh requires one; it is never used: get_user answers 403 instead of redirecting
            return "/"

    return TokenAuth()


def json_size(value: Any, limit: int) -> int:
    """About how many bytes ``value`` takes as JSON — exact enough to bound messages, and cheap: a long text
    counts its length without being serialized, and the count stops once it passes ``limit`` (then
    ``limit + 1``; so does anything that is not JSON)."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2 if v.isascii() else len(json.dumps(v))
        elif isinstance(v, dict):
            total += 2 + len(v)
            for k, x in v.items():
                if not isinstance(k, str):
                    return limit + 1
                stack.append(k)
                stack.append(x)
        elif isinstance(v, (list, tuple)):
            total += 2 + len(v)
            stack.extend(v)
        elif v is None or isinstance(v, (bool, int, float)):
            total += len(json.dumps(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else 5
        else:
            return limit + 1
        if total > limit:
            return limit + 1
    return total


class MessageGate:
    """Admits a page's messages within a size, a rate and a work allowance: at most ``max_bytes`` per message
    (as JSON; ``max_part_bytes`` for a part of a snapshot upload), ``rate`` messages a second on average with
    bursts of ``burst`` (a token bucket), and ``work_rate`` units of work a second with bursts of
    ``work_burst`` (a second bucket, spent by :meth:`charge`; a background message is refused while it is
    empty). ``parent`` (the gate of the page's client address) must admit every message too and is charged
    the same work."""

    def __init__(
        self,
        *,
        max_bytes: int = MAX_MESSAGE_BYTES,
        max_part_bytes: int = MAX_UPLOAD_PART_BYTES,
        rate: float = MESSAGES_PER_SECOND,
        burst: int = MESSAGE_BURST,
        work_rate: float = WORK_PER_SECOND,
        work_burst: float = WORK_BURST,
        parent: MessageGate | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes, self.max_part_bytes, self.rate, self.burst = max_bytes, max_part_bytes, rate, burst
        self.work_rate, self.work_burst = work_rate, work_burst
        self.parent = parent
        self._clock = clock
        self._lock = threading.Lock()  # charged from background work while the IO loop checks
        self._tokens = float(burst)
        self._work = float(work_burst)
        self._last = clock()
        self._last_notice = -1e18
        #: Messages refused so far, and the work charged so far (units).
        self.refused = 0
        self.charged = 0.0

    def _refill(self) -> None:
        now = self._clock()
        dt = max(0.0, now - self._last)
        self._tokens = min(float(self.burst), self._tokens + dt * self.rate)
        self._work = min(self.work_burst, self._work + dt * self.work_rate)
        self._last = now

    @property
    def work_left(self) -> float:
        """The work allowance left now (units; negative after a costly message, until it refills)."""
        with self._lock:
            self._refill()
            return self._work

    def charge(self, units: float) -> None:
        """Spend ``units`` of work (a token decoded or copied, or 16 KiB moved, each); the parent too."""
        with self._lock:
            self._refill()
            self._work -= units
            self.charged += units
        if self.parent is not None:
            self.parent.charge(units)

    def _work_wait(self) -> float:
        """Seconds until the work bucket is positive again (0: it is), here or in the parent."""
        with self._lock:
            self._refill()
            own = 0.0 if self._work > 0 else (1.0 - self._work) / self.work_rate
        return max(own, self.parent.retry_after() if self.parent is not None else 0.0)

    def check(self, msg: Any) -> str | None:
        """``None`` when ``msg`` may pass (an upload part is then charged its bytes); otherwise why it is
        refused (a message for the page)."""
        reason, units = self.admit(msg)
        if reason is None and units:
            self.charge(units)
        return reason

    def admit(self, msg: Any) -> tuple[str | None, int]:
        """Like :meth:`check` (the message counted against the rate, here and in the parent), but charging
        nothing: the refusal (or ``None``) and the work ``msg`` costs on arrival (an upload part's bytes)."""
        with self._lock:
            self._refill()
            if self._tokens < 1.0:
                self.refused += 1
                return (
                    f"too many messages from this page (more than {self.rate:g} a second); this one was ignored "
                    "and nothing changed"
                ), 0
            self._tokens -= 1.0
        upload_part = isinstance(msg, dict) and msg.get("type") == "file" and msg.get("cmd") == "restore"
        limit = self.max_part_bytes if upload_part else self.max_bytes
        size = json_size(msg, limit)
        if size > limit:
            self.refused += 1
            return (
                f"a message from this page was too large and was ignored (the limit is {limit} bytes); nothing changed",
                0,
            )
        if upload_part or self._background(msg):
            wait = self._work_wait()
            if wait > 0:
                self.refused += 1
                return (
                    f"this page has used its share of the server's work for now (tokens decoded, bytes moved); "
                    f"this message was ignored and nothing changed; try again in {wait:.0f} s"
                ), 0
        units = 1 + (size * 3 // 4) // BYTES_PER_UNIT if upload_part else 0
        if self.parent is not None:
            return self.parent.admit(msg)[0], units
        return None, units

    @staticmethod
    def _background(msg: Any) -> bool:
        """Whether the declaration says ``msg``'s work grows with the model or the history."""
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            return False
        try:
            return work_of(msg)[0] == "background"
        except Exception:  # an unknown type or variant: the inspector refuses it, at no cost
            return False

    def retry_after(self) -> float:
        """Seconds until a message costing work could pass (0: now)."""
        return self._work_wait()

    def notice(self, reason: str) -> dict | None:
        """The error notice for a refusal, or ``None`` when one was sent less than a second ago."""
        now = self._clock()
        if now - self._last_notice < 1.0:
            return None
        self._last_notice = now
        return {"type": "notice", "level": "error", "text": reason}


class GateRegistry:
    """The gates of a server's client addresses; :meth:`page_gate` gives a page its own gate under its address's.

    An address's gate allows ``factor`` times a page's rate, burst and work. At most ``max_addresses`` are
    kept (the least recently seen are forgotten).
    """

    def __init__(
        self,
        *,
        factor: float = ADDRESS_FACTOR,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
        **page_limits: Any,
    ) -> None:
        self.factor, self.max_addresses, self._clock = factor, max_addresses, clock
        self.page_limits = page_limits
        self._gates: OrderedDict[str, MessageGate] = OrderedDict()
        self._lock = threading.Lock()

    def address_gate(self, address: str | None) -> MessageGate:
        """The gate of one client address (made on first use)."""
        key = address or "?"
        with self._lock:
            gate = self._gates.get(key)
            if gate is None:
                lim = self.page_limits
                gate = MessageGate(
                    max_bytes=lim.get("max_bytes", MAX_MESSAGE_BYTES),
                    max_part_bytes=lim.get("max_part_bytes", MAX_UPLOAD_PART_BYTES),
                    rate=lim.get("rate", MESSAGES_PER_SECOND) * self.factor,
                    burst=int(lim.get("burst", MESSAGE_BURST) * self.factor),
                    work_rate=lim.get("work_rate", WORK_PER_SECOND) * self.factor,
                    work_burst=lim.get("work_burst", WORK_BURST) * self.factor,
                    clock=self._clock,
                )
                self._gates[key] = gate
                while len(self._gates) > self.max_addresses:
                    self._gates.popitem(last=False)
            else:
                self._gates.move_to_end(key)
            return gate

    def page_gate(self, address: str | None) -> MessageGate:
        """A new page's gate, under its address's."""
        return MessageGate(parent=self.address_gate(address), clock=self._clock, **self.page_limits)

    def presenter_gate(self) -> MessageGate:
        """A presenter page's gate: a page's bounds, under no address's. The presenter token is its owner's
        alone, while the audience may share the presenter's address (a venue's NAT, or this machine): under
        the address's gate, a hostile viewer's traffic would starve the talk."""
        return MessageGate(clock=self._clock, **self.page_limits)
