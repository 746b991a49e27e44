"""Who may open a served inspector, who presents, and how much a page may send.

* :func:`access_policy`: on a loopback address (the default ``127.0.0.1``) nobody needs a token, as
  before; on any other address a token is required — the one given with ``--token``, or a random one
  printed at start, as JupyterLab does. ``--token`` on loopback requires it there too. In presenter mode
  a second, separate token marks the presenter's pages.
* :func:`auth_provider`: the Bokeh/Tornado hook that enforces it. It runs in ``prepare()`` of every
  page, session and websocket request (Bokeh's ``AuthRequestHandler``): a request without the token
  gets 403 before any session is made. The first page opened with ``?token=...`` gets the token as an
  HttpOnly, SameSite=Strict cookie, which its websocket (and later pages) carry.
* :class:`MessageGate`: bounds the size of each message a page sends and their rate (a token bucket);
  a refused message is answered with one error notice (at most one a second) and never reaches the
  inspector.

Tokens are compared in constant time (:func:`hmac.compare_digest`). Nothing here imports a UI library
at module level; :func:`auth_provider` imports Bokeh and Tornado when called.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

#: The query argument and the cookie (suffixed with the port) that carry the access token.
TOKEN_ARG = "token"
COOKIE_PREFIX = "specviz-token-"
#: The query argument that carries the presenter token.
PRESENTER_ARG = "presenter"
#: Default bounds on what one page sends: bytes per message (as JSON), messages per second and burst.
MAX_MESSAGE_BYTES = 64 * 1024
#: A part of a snapshot upload (the workbench's ``file restore``: 512 KiB of raw bytes in base64) may be this
#: large; it still counts as one message against the rate.
MAX_UPLOAD_PART_BYTES = 768 * 1024
MESSAGES_PER_SECOND = 20.0
MESSAGE_BURST = 60


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
    return AccessPolicy(token=token, presenter_token=presenter_token if shared else None)


def auth_provider(policy: AccessPolicy, port: int) -> Any:
    """A Bokeh ``AuthProvider`` that answers 403 to every page, session or websocket request without the
    access token (as the ``token`` query argument, or the cookie set by the first page that had it)."""
    from bokeh.server.auth_provider import AuthProvider
    from tornado.web import HTTPError

    cookie = COOKIE_PREFIX + str(port)

    async def get_user(handler: Any) -> str:
        supplied = handler.get_query_argument(TOKEN_ARG, None)
        if supplied is not None and policy.allows(supplied):
            handler.set_cookie(cookie, supplied, httponly=True, samesite="Strict", path="/")
            return "specviz"
        if policy.allows(handler.get_cookie(cookie)):
            return "specviz"
        raise HTTPError(403, reason="a token is required: open the URL specviz serve printed (?token=...)")

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


class MessageGate:
    """Admits a page's messages within a size and a rate: at most ``max_bytes`` per message (as JSON;
    ``max_part_bytes`` for a part of a snapshot upload) and ``rate`` messages a second on average with bursts
    of ``burst`` (a token bucket)."""

    def __init__(
        self,
        *,
        max_bytes: int = MAX_MESSAGE_BYTES,
        max_part_bytes: int = MAX_UPLOAD_PART_BYTES,
        rate: float = MESSAGES_PER_SECOND,
        burst: int = MESSAGE_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes, self.max_part_bytes, self.rate, self.burst = max_bytes, max_part_bytes, rate, burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._last_notice = -1e18
        #: Messages refused so far.
        self.refused = 0

    def check(self, msg: Any) -> str | None:
        """``None`` when ``msg`` may pass; otherwise why it is refused (a message for the page)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1.0:
            self.refused += 1
            return (
                f"too many messages from this page (more than {self.rate:g} a second); this one was ignored "
                "and nothing changed"
            )
        self._tokens -= 1.0
        try:
            size = len(json.dumps(msg, separators=(",", ":")))
        except (TypeError, ValueError):
            size = self.max_bytes + 1
        upload_part = isinstance(msg, dict) and msg.get("type") == "file" and msg.get("cmd") == "restore"
        limit = self.max_part_bytes if upload_part else self.max_bytes
        if size > limit:
            self.refused += 1
            return f"a message of {size} bytes from this page was ignored (the limit is {limit}); nothing changed"

        return None

    def notice(self, reason: str) -> dict | None:
        """The error notice for a refusal, or ``None`` when one was sent less than a second ago."""
        now = self._clock()
        if now - self._last_notice < 1.0:
            return None
        self._last_notice = now
        return {"type": "notice", "level": "error", "text": reason}
