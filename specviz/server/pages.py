"""The pages of ``specviz serve``: a session per page (the default) or one shared session (presenter mode).

The inspector's front-end is the same module as everywhere (:mod:`specviz.ui.bundle`); what differs is
who its messages reach. :class:`ViewComponent` is a Panel ``JSComponent`` that hands every message its
page sends to a handler, after the page's :class:`~specviz.server.access.MessageGate` (size and rate).

* :func:`per_page_app`: each page (once its front-end speaks) gets a
  :class:`~specviz.server.pool.ManagedSession` from the :class:`~specviz.server.pool.SessionPool` (turns, the
  session cap, parking when idle) behind its own
  :class:`~specviz.ui.core.InspectorCore`; beyond the cap a page is told the server is busy.
* :func:`shared_app`: every page is a view of one :class:`~specviz.server.presenter.SharedInspector`; a page
  opened with the presenter token presents, the others watch.

A page's session (or view) is let go when Bokeh destroys the page's document (its browser went away).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import panel as pn

from ..errors import SpecvizError
from ..ui.core import InspectorCore, static_text
from ..ui.panel_app import OrderedSender, PageComponent
from .access import PRESENTER_ARG, AccessPolicy, MessageGate
from .pool import SessionPool
from .presenter import SharedInspector

_log = logging.getLogger(__name__)

_PAGE_STYLES = {"padding": "12px", "max-width": "1500px", "margin": "0 auto"}


class ViewComponent(PageComponent):
    """The inspector's front-end on one page; the messages it sends go to ``handler`` (set after creation)."""

    _esm = static_text("inspector.js")
    _stylesheets = [static_text("inspector.css")]

    def __init__(self, **params: Any) -> None:
        params.setdefault("sizing_mode", "stretch_width")
        super().__init__(**params)
        self.handler: Callable[[Any], None] = lambda msg: None
        self._sender = OrderedSender(self, pn.state.curdoc)  # the page's document (made for this page)

    def send(self, msg: dict) -> None:
        """Send one message to this page, from any thread, in call order (see :class:`OrderedSender`)."""
        self._sender(msg)

    def _handle_msg(self, data: Any) -> None:
        self.handler(data)


def gated(gate: MessageGate, send: Callable[[dict], None], handle: Callable[[Any], None]) -> Callable[[Any], None]:
    """``handle`` behind ``gate``: a refused message is answered with an error notice (at most one a second)."""

    def admit(msg: Any) -> None:
        reason = gate.check(msg)
        if reason is None:
            handle(msg)
            return
        notice = gate.notice(reason)
        if notice is not None:
            send(notice)

    return admit


def busy_html(text: str) -> str:
    """The "busy" notice shown instead of an inspector when the server has no room for another one."""
    return (
        f'<div class="specviz-busy" data-busy="1" style="font:16px system-ui,sans-serif;padding:32px;'
        f'max-width:640px;margin:40px auto;border:1px solid #d0d7de;border-radius:8px">'
        f'<h2 style="margin-top:0">specviz is busy</h2><p>{text}</p></div>'
    )


def _in_background(fn: Callable[[], None], name: str) -> None:
    def run() -> None:
        try:
            fn()
        except Exception:
            _log.exception("specviz serve: %s failed", name)

    threading.Thread(target=run, name=f"specviz-{name}", daemon=True).start()


def per_page_app(
    pool: SessionPool,
    *,
    prompt: str,
    start_kwargs: dict[str, Any],
    presets: list[dict[str, Any]] | None = None,
    title: str = "specviz inspector",
) -> Callable[[], pn.viewable.Viewable]:
    """The page factory of the default mode: a session per page, started in the background.

    ``start_kwargs`` (``max_tokens``, ``strategy`` and knobs) start each page's session on ``prompt``;
    ``presets`` are the workbench's one-click starting points (draft models by catalog name).
    A page gets its session when its front-end first speaks (a request that never opens the page's
    websocket — a probe, a crawler — takes no place); beyond the cap the page shows "busy" instead.
    """

    def page() -> pn.viewable.Viewable:
        comp = ViewComponent()
        col = pn.Column(comp, sizing_mode="stretch_width", styles=_PAGE_STYLES, name=title)
        held: dict[str, Any] = {}

        def first_then_core(msg: Any) -> None:
            if "core" not in held:
                if held.get("busy"):
                    return
                ms = pool.open()
                if ms is None:
                    held["busy"] = True
                    col[:] = [
                        pn.pane.HTML(
                            busy_html(
                                f"All {pool.max_sessions} sessions of this server are in use. Try again in a minute: a "
                                "session is freed shortly after its page is closed."
                            ),
                            sizing_mode="stretch_width",
                        )
                    ]
                    return
                held["ms"], held["core"] = (
                    ms,
                    InspectorCore(comp.send, ms, prompt=prompt, draft_models=pool.catalog.names, presets=presets),
                )

                def start() -> None:  # the prompt is a decode: it waits for its turn, not in the server's thread
                    try:
                        ms.start(prompt, **start_kwargs)
                    except SpecvizError as e:
                        comp.send({"type": "notice", "level": "error", "text": f"the session could not start: {e}"})

                _in_background(start, "start-session")
            held["core"].handle(msg)

        comp.handler = gated(MessageGate(), comp.send, first_then_core)

        def destroyed(_ctx: Any) -> None:
            if "core" in held:
                core, ms = held["core"], held["ms"]

                def close() -> None:
                    core.close()
                    pool.close(ms)

                _in_background(close, "close-session")

        pn.state.on_session_destroyed(destroyed)
        return col

    return page


def _query_arg(name: str) -> str | None:
    values = pn.state.session_args.get(name) or []
    try:
        return values[0].decode() if values else None
    except (UnicodeDecodeError, AttributeError):
        return None


def shared_app(
    shared: SharedInspector, policy: AccessPolicy, *, max_viewers: int = 100, title: str = "specviz inspector"
) -> Callable[[], pn.viewable.Viewable]:
    """The page factory of presenter mode: every page watches ``shared``; the presenter token presents.

    A page joins the audience when its front-end first speaks (a request that never opens the page's
    websocket is not counted); beyond ``max_viewers`` watching pages a new one shows "busy".
    """

    def page() -> pn.viewable.Viewable:
        role = "presenter" if policy.is_presenter(_query_arg(PRESENTER_ARG)) else "viewer"
        comp = ViewComponent()
        col = pn.Column(
            comp,
            sizing_mode="stretch_width",
            styles=_PAGE_STYLES,
            name=f"{title} ({'presenter' if role == 'presenter' else 'watching'})",
        )
        held: dict[str, Any] = {}

        def first_then_view(msg: Any) -> None:
            if "view" not in held:
                if held.get("busy"):
                    return
                if role == "viewer" and shared.audience()["viewers"] >= max_viewers:
                    held["busy"] = True
                    col[:] = [
                        pn.pane.HTML(
                            busy_html(f"This demo already has {max_viewers} viewers. Try again later."),
                            sizing_mode="stretch_width",
                        )
                    ]
                    return
                held["view"] = shared.attach(comp.send, role)
            shared.handle(held["view"], msg)

        comp.handler = gated(MessageGate(), comp.send, first_then_view)

        def destroyed(_ctx: Any) -> None:
            if "view" in held:
                shared.detach(held["view"])

        pn.state.on_session_destroyed(destroyed)
        return col

    return page
