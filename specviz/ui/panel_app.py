"""The inspector in a Panel app, through Panel's ``JSComponent`` (no React, nothing from the network).

Panel's ``AnyWidgetComponent`` is a ``ReactComponent`` that imports React from a CDN at run time unless
compiled with node; ``JSComponent`` needs neither, so it runs the same module as the JupyterLab widget
(assembled from ``widgets/inspector/`` by :mod:`specviz.ui.bundle`). The front-end tells the two hosts
apart by their model API (``send_msg`` vs ``send``); the Python side is the same
:class:`~specviz.ui.core.InspectorCore`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Callable

import panel as pn
from panel.custom import JSComponent
from panel.models.esm import ESMEvent
from tornado.ioloop import IOLoop

from ..decoding.events import Event
from .core import InspectorCore, static_text
from .sources import InspectedSession

_log = logging.getLogger(__name__)

#: The demo prompt: code that repeats itself, which n-gram drafting turns into long accepted runs.
DEFAULT_PROMPT = (
    "def fibonacci(n):\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    if n < 2:\n"
    "        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    "\n"
    "\n"
    "def factorial(n):\n"
)


class PageComponent(JSComponent):
    """A Panel component that runs the inspector's front-end and can send to its pages (:class:`OrderedSender`).

    Panel's ``JSComponent`` keeps both things this needs to itself: sending a message to the page
    (``_send_msg``) and the Bokeh models that show the component on each page (``_models``). This subclass
    is where they are read, so nothing else reaches into Panel's private members.
    """

    def send_now(self, msg: dict) -> None:
        """Send ``msg`` to every page showing the component, from the calling thread (Panel's own path)."""
        self._send_msg(msg)

    def models_on(self, doc: Any) -> list[Any]:
        """The component's Bokeh models on the page of ``doc`` (Panel's ``_send_event`` walks the same mapping)."""
        return [model for model, _ in list(self._models.values()) if model.document is doc]


class OrderedSender:
    """Sends messages to one component's page from any thread, in the order they were sent, none lost.

    Two things in Panel 1.9.4 lose or reorder a served page's messages, and a page that misses the last
    ``state`` of a burst keeps its Step button disabled (nothing else comes until the user acts):

    * Bokeh's documents are not thread-safe: a message sent from a session's thread while the server's
      thread holds the document can be lost or run late.
    * Panel's own write queue (``panel.io.document``): a message sent while an earlier write is still in
      flight is queued with a new dispatch task, and when the earlier dispatch finishes first it clears the
      queue's busy flag, so the new task finds nothing to do and the message stays queued until some later
      message happens to flush it. (Seen here about once in ten first pages of ``specviz serve``.)

    So every message joins one queue here and goes out through Bokeh's own path for another thread:
    ``Document.add_next_tick_callback`` (thread-safe), whose callback runs in the server's thread with the
    document locked; there each message becomes the same ``ESMEvent`` Panel's ``_send_msg`` makes, and
    Bokeh writes the patches of one callback, in order, before the next callback gets the document.

    Nothing is sent before the page's websocket is open (Bokeh would have no connection to write to): the
    queue waits (polled every 50 ms on the server's loop, at most :attr:`CONNECT_TIMEOUT` seconds, then
    dropped: the page never came).

    The queue is bounded. Bokeh writes one callback's messages before the next callback gets the document,
    so a page that stops reading (its socket full) stops the queue from draining: once more than
    :attr:`MAX_QUEUED_BYTES` (estimated) or :attr:`MAX_QUEUED` messages wait, or the queue has not drained
    for :attr:`STALL_SECONDS`, the page is *dropped*: its queue is emptied, nothing more is queued for it, a
    line goes to the log and ``on_stall()`` runs (the server lets the page's session go; the websocket's
    ping timeout closes the connection). A sender that moves a lot (a download) paces itself with
    :meth:`room`.
    """

    #: Seconds to wait for the page's websocket before its queued messages are dropped.
    CONNECT_TIMEOUT = 120.0
    #: Bounds of one page's queue before it counts as not reading (see above).
    MAX_QUEUED_BYTES = 24 << 20
    MAX_QUEUED = 20000
    STALL_SECONDS = 45.0

    def __init__(self, component: PageComponent, doc: Any, on_stall: Callable[[], None] | None = None) -> None:
        self._component = component
        self._doc = doc
        # a served page is made in the server's thread: its loop is the current one
        self._loop = IOLoop.current() if doc is not None and doc.session_context is not None else None
        self._queue: deque[tuple[dict, int]] = deque()
        self._queued_bytes = 0
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._scheduled = False
        self._since = time.monotonic()
        self._drained = time.monotonic()
        self._open = False  # the page's websocket was seen open (a page still connecting is not stalled)
        self.on_stall = on_stall
        #: True once the page was dropped for not reading; nothing is queued for it any more.
        self.dropped = False

    @staticmethod
    def estimate(msg: dict) -> int:
        """About how many bytes ``msg`` takes on the wire (cheap: the big fields' lengths, not a serialization)."""
        kind = msg.get("type")
        if kind == "packed":
            return len(msg.get("json") or "") + 64
        if kind == "download":
            return len(msg.get("data") or "") + 256
        if kind == "events":
            return 64 + 400 * len(msg.get("events") or ())
        return 1024

    def __call__(self, msg: dict) -> None:
        if self._loop is None:  # not served (a notebook, a test): nothing to order
            self._component.send_now(msg)
            return
        size = self.estimate(msg)
        with self._lock:
            if self.dropped:
                return
            self._queue.append((msg, size))
            self._queued_bytes += size
            stalled = self._stalled_reason()
            if stalled is None:
                if self._scheduled:
                    return
                self._scheduled = True
        if stalled is not None:
            self._drop_stalled(stalled)
            return
        self._loop.add_callback(self._when_connected)

    def _stalled_reason(self) -> str | None:
        """Why the page counts as not reading (called with the lock held), or ``None``."""
        if self._queued_bytes > self.MAX_QUEUED_BYTES or len(self._queue) > self.MAX_QUEUED:
            return f"{len(self._queue)} messages (about {self._queued_bytes >> 20} MiB) wait for it"
        if self._open and self._scheduled and time.monotonic() - self._drained > self.STALL_SECONDS:
            return f"nothing was delivered to it for {time.monotonic() - self._drained:.0f} s"
        return None

    def _drop_stalled(self, why: str) -> None:
        with self._lock:
            if self.dropped:
                return
            self.dropped = True
            self._queue.clear()
            self._queued_bytes = 0
            self._room.notify_all()
        _log.warning("specviz serve: dropped a page that stopped reading (%s)", why)
        if self.on_stall is not None:
            try:
                self.on_stall()
            except Exception:
                _log.exception("specviz serve: letting a dropped page go failed")

    def room(self, timeout: float = 60.0) -> bool:
        """Wait until the page has taken most of what waits for it (at most ``timeout`` seconds); False when
        the page was dropped or never drained meanwhile (a sender of many big messages stops then)."""
        if self._loop is None:
            return True
        deadline = time.monotonic() + timeout
        with self._room:
            while not self.dropped and self._queued_bytes > self.MAX_QUEUED_BYTES // 4:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._room.wait(min(left, 0.5))
            return not self.dropped

    def _connected(self) -> bool:
        connected = getattr(pn.state, "_connected", None)  # Panel's record of the pages whose websocket is open
        return connected is None or bool(connected.get(self._doc))

    def _drop(self) -> None:
        with self._lock:
            self._queue.clear()
            self._queued_bytes = 0
            self._scheduled = False
            self._room.notify_all()

    def _when_connected(self) -> None:
        """On the server's loop: hand the queue to the document's next tick once the page is connected."""
        assert self._loop is not None
        if not self._connected():
            if time.monotonic() - self._since < self.CONNECT_TIMEOUT:
                self._loop.call_later(0.05, self._when_connected)
            else:
                self._drop()
            return
        if not self._open:
            with self._lock:
                self._open, self._drained = True, time.monotonic()
        try:
            self._doc.add_next_tick_callback(self._drain)
        except Exception:  # the page's document is gone: nothing to send to
            self._drop()

    def _drain(self) -> None:
        """In the document's next tick (server thread, document locked): send everything queued, in order."""
        with self._lock:
            msgs = [m for m, _ in self._queue]
            self._queue.clear()
            self._queued_bytes = 0
            self._scheduled = False
            self._drained = time.monotonic()
            self._room.notify_all()
        models = self._component.models_on(self._doc)
        try:
            for msg in msgs:
                for model in models:
                    self._doc.callbacks.send_event(ESMEvent(model=model, data=msg))
        except Exception:  # the page went away: drop what it would have been sent
            self._drop()


class InspectorComponent(PageComponent):
    """The inspector as a Panel component: ``InspectorComponent(session=...)`` or ``(events=[...])``."""

    _esm = static_text("inspector.js")
    _stylesheets = [static_text("inspector.css")]

    def __init__(
        self,
        session: InspectedSession | None = None,
        *,
        events: list[Event] | None = None,
        prompt: str | None = None,
        draft_models: list[str] | None = None,
        presets: list[dict[str, Any]] | None = None,
        **params: Any,
    ) -> None:
        params.setdefault("sizing_mode", "stretch_width")
        super().__init__(**params)
        self.core = InspectorCore(
            OrderedSender(self, pn.state.curdoc),
            session,
            events=events,
            prompt=prompt,
            draft_models=draft_models,
            presets=presets,
        )

    def _handle_msg(self, data: Any) -> None:
        self.core.handle(data)


def inspector_app(
    session_factory: Callable[[], InspectedSession] | None = None,
    *,
    events: list[Event] | None = None,
    prompt: str | None = None,
    title: str = "specviz inspector",
    draft_models: list[str] | None = None,
    presets: list[dict[str, Any]] | None = None,
) -> pn.viewable.Viewable:
    """One page of the app: a live session made by ``session_factory()``, or recorded ``events``.

    ``draft_models`` are the draft GGUF paths the form offers for the ``draft`` strategy; ``presets`` the
    starting points offered as buttons (see :class:`~specviz.ui.workbench.Workbench`).
    """
    if events is not None:
        comp = InspectorComponent(events=events)
    else:
        session = session_factory() if session_factory is not None else None
        comp = InspectorComponent(session, prompt=prompt, draft_models=draft_models, presets=presets)
    return pn.Column(
        comp,
        sizing_mode="stretch_width",
        styles={"padding": "12px", "max-width": "1500px", "margin": "0 auto"},
        name=title,
    )
