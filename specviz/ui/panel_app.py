"""The inspector in a Panel app, through Panel's ``JSComponent`` (no React, nothing from the network).

Panel's ``AnyWidgetComponent`` is a ``ReactComponent`` that imports React from a CDN at run time unless
compiled with node; ``JSComponent`` needs neither, so it runs the same module as the JupyterLab widget
(assembled from ``widgets/inspector/`` by :mod:`specviz.ui.bundle`). The front-end tells the two hosts
apart by their model API (``send_msg`` vs ``send``); the Python side is the same
:class:`~specviz.ui.core.InspectorCore`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import panel as pn
from panel.custom import JSComponent

from ..events import Event
from .core import InspectorCore, static_text

#: The demo prompt: code that repeats itself, which n-gram drafting turns into long accepted runs.
DEFAULT_PROMPT = (
    "def fibonacci(n):\n"
    "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    "    if n < 2:\n"
    "        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    "\n"
    "\n"
    "def factorial(n):\n"
)


def send_in_order(component: JSComponent, doc: Any, msg: dict) -> None:
    """Send ``msg`` to ``component``'s page from any thread, after every message sent before it.

    Panel sends at once from the server's thread but schedules a send from any other thread on the
    server's loop, so a reply computed in the server's thread before a round ran in the Play thread
    could reach the page after that round's messages (a stale ``state``: buttons left disabled, a
    finished run shown as running). Every send is scheduled on the page's document instead, in call order.
    """
    if doc is None or doc.session_context is None:  # not served (a notebook, a test): nothing to order
        component._send_msg(msg)
        return
    try:
        doc.add_next_tick_callback(partial(component._send_msg, msg))
    except Exception:  # the page's document is gone: nothing to send to
        pass


class InspectorComponent(JSComponent):
    """The inspector as a Panel component: ``InspectorComponent(session=...)`` or ``(events=[...])``."""

    _esm = static_text("inspector.js")
    _stylesheets = [static_text("inspector.css")]

    def __init__(self, session: Any = None, *, events: list[Event] | None = None, prompt: str | None = None,
                 draft_models: list[str] | None = None, **params: Any) -> None:
        params.setdefault("sizing_mode", "stretch_width")
        super().__init__(**params)
        doc = pn.state.curdoc
        self.core = InspectorCore(lambda m: send_in_order(self, doc, m), session, events=events, prompt=prompt,
                                  draft_models=draft_models)

    def _handle_msg(self, data: Any) -> None:
        self.core.handle(data)


def inspector_app(session_factory: Callable[[], Any] | None = None, *, events: list[Event] | None = None,
                  prompt: str | None = None, title: str = "specviz inspector",
                  draft_models: list[str] | None = None) -> pn.viewable.Viewable:
    """One page of the app: a live session made by ``session_factory()``, or recorded ``events``.

    ``draft_models`` are the draft GGUF paths the form offers for the ``draft`` strategy.
    """
    if events is not None:
        comp = InspectorComponent(events=events)
    else:
        session = session_factory() if session_factory is not None else None
        comp = InspectorComponent(session, prompt=prompt, draft_models=draft_models)
    return pn.Column(comp, sizing_mode="stretch_width", styles={"padding": "12px", "max-width": "1500px",
                                                                   "margin": "0 auto"}, name=title)
