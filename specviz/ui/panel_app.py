"""The inspector in a Panel app, through Panel's ``JSComponent`` (no React, nothing from the network).

Panel's ``AnyWidgetComponent`` is a ``ReactComponent`` that imports React from a CDN at run time unless
compiled with node; ``JSComponent`` needs neither, so it runs the same module as the JupyterLab widget
(assembled from ``widgets/inspector/`` by :mod:`specviz.ui.bundle`). The front-end tells the two hosts
apart by their model API (``send_msg`` vs ``send``); the Python side is the same
:class:`~specviz.ui.core.InspectorCore`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

import panel as pn
from panel.custom import JSComponent
from panel.io.state import set_curdoc
from tornado.ioloop import IOLoop

from ..events import Event
from .core import InspectorCore, static_text

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


class OrderedSender:
    """Sends messages to one component's page from any thread, in the order they were sent.

    Panel sends at once from the server's thread but has another thread add a callback to the page's
    Bokeh document, and Bokeh's documents are not thread-safe: a callback added while the server's thread
    holds the document (handling a message from the page) can be lost or run late. The page then misses
    a message, or gets a ``state`` saying a run is going after the one saying it ended, and its buttons
    stay disabled. Here every message joins one queue; whichever thread finds the queue idle asks the
    server's loop (``IOLoop.add_callback``, the one thread-safe way in) to run :meth:`_drain`, which sends
    the queue's head first, in the page's document, until the queue is empty. Only the server's thread
    touches the document, and the queue's order is the page's order.

    Nothing is sent before the page's websocket is open: until then Panel defers a message to the
    document's next tick, while a message sent once the page is connected goes out at once, so an early
    ``state`` could reach the page after a later one and leave its buttons disabled. The queue waits
    (polled every 50 ms, at most :attr:`CONNECT_TIMEOUT` seconds, then dropped: the page never came).
    """

    #: Seconds to wait for the page's websocket before its queued messages are dropped.
    CONNECT_TIMEOUT = 120.0

    def __init__(self, component: JSComponent, doc: Any) -> None:
        self._component = component
        self._doc = doc
        # a served page is made in the server's thread: its loop is the current one
        self._loop = IOLoop.current() if doc is not None and doc.session_context is not None else None
        self._queue: deque[dict] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._since = time.monotonic()

    def __call__(self, msg: dict) -> None:
        if self._loop is None:  # not served (a notebook, a test): nothing to order
            self._component._send_msg(msg)
            return
        with self._lock:
            self._queue.append(msg)
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.add_callback(self._drain)

    def _connected(self) -> bool:
        connected = getattr(pn.state, "_connected", None)  # Panel's record of the pages whose websocket is open
        return connected is None or bool(connected.get(self._doc))

    def _drain(self) -> None:
        assert self._loop is not None
        if not self._connected():
            if time.monotonic() - self._since < self.CONNECT_TIMEOUT:
                self._loop.call_later(0.05, self._drain)
            else:
                with self._lock:
                    self._queue.clear()
                    self._scheduled = False
            return
        with set_curdoc(self._doc):
            while True:
                with self._lock:
                    if not self._queue:
                        self._scheduled = False
                        return
                    msg = self._queue.popleft()
                try:
                    self._component._send_msg(msg)
                except Exception:  # the page went away: drop what it would have been sent
                    with self._lock:
                        self._queue.clear()
                        self._scheduled = False
                    return


class InspectorComponent(JSComponent):
    """The inspector as a Panel component: ``InspectorComponent(session=...)`` or ``(events=[...])``."""

    _esm = static_text("inspector.js")
    _stylesheets = [static_text("inspector.css")]

    def __init__(
        self,
        session: Any = None,
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
    session_factory: Callable[[], Any] | None = None,
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
