"""The pages of ``specviz serve`` and ``specviz replay``: a session per page (the default), one shared session
(presenter mode), or a recording.

The inspector's front-end is the same module as everywhere (:mod:`specviz.ui.bundle`); what differs is
who its messages reach. :class:`ViewComponent` is a Panel ``JSComponent`` that hands every message its
page sends to a handler, after the page's :class:`~specviz.server.access.MessageGate` (size, rate and work,
under the gate of the page's client address), and sends the page's messages through a bounded queue
(:class:`~specviz.ui.panel_app.OrderedSender`: a page that stops reading is dropped). Every page's
inspector core runs its heavy messages in the background (:mod:`specviz.ui.tasks`), so Tornado's one IO
loop only ever does light work; the page is told where to fetch the plotly bundle (a static asset,
:mod:`specviz.server.assets`); what it is sent names no server path (:func:`without_paths`).

* :func:`per_page_app`: each page (once its front-end speaks) gets a
  :class:`~specviz.server.pool.ManagedSession` from the :class:`~specviz.server.pool.SessionPool` (turns, the
  session cap, parking when idle) behind its own
  :class:`~specviz.ui.core.InspectorCore`; beyond the cap a page is told the server is busy.
* :func:`shared_app`: every page is a view of one :class:`~specviz.server.presenter.SharedInspector`; a page
  opened with the presenter token (or carrying its cookie) presents, the others watch.
* :func:`replay_app`: every page replays one recording, gated like the others.

A page's session (or view) is let go when Bokeh destroys the page's document (its browser went away), or
when it stopped reading.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable

import panel as pn

from ..decoding.batch_cost import BatchCostTable
from ..decoding.events import Event
from ..errors import SpecvizError
from ..ui.core import InspectorCore, static_text
from ..ui.panel_app import OrderedSender, PageComponent
from .access import PRESENTER_ARG, AccessPolicy, GateRegistry, MessageGate
from .pool import SessionPool
from .presenter import SharedInspector

_log = logging.getLogger(__name__)

_PAGE_STYLES = {"padding": "12px", "max-width": "1500px", "margin": "0 auto"}
#: A page's ``hello`` (which may resend the whole event log) is handled at most this often; a later one waits.
CATCHUP_INTERVAL = 1.0


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

    def room(self) -> bool:
        """Wait until the page has taken most of what was sent to it; False once it was dropped."""
        return self._sender.room()

    def when_dropped(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` if the page stops reading and is dropped (see :class:`OrderedSender`)."""
        self._sender.on_stall = callback

    def _handle_msg(self, data: Any) -> None:
        self.handler(data)


# an absolute POSIX path of two or more parts (not inside a URL or a relative path): shown by its last part
_PATH = re.compile(r"(?<![\w:/.~-])/(?:[\w.+@~-]+/)+([\w.+@~-]*)")


def without_paths(text: str) -> str:
    """``text`` with every absolute path replaced by its file name (what a page is told of server files)."""
    return _PATH.sub(lambda m: m.group(1) or "…", text)


def scrubbed(send: Callable[[dict], None]) -> Callable[[dict], None]:
    """``send`` for a page: the texts that can quote an error (notices, knob errors, a schema's or a state's
    error) name no server path (:func:`without_paths`)."""

    def out(msg: dict) -> None:
        kind = msg.get("type")
        if kind == "notice" and isinstance(msg.get("text"), str):
            msg = {**msg, "text": without_paths(msg["text"])}
        elif kind == "knob_errors":
            errs = msg.get("errors") or {}
            msg = {
                **msg,
                "errors": {k: without_paths(v) if isinstance(v, str) else v for k, v in errs.items()},
                "general": without_paths(msg["general"]) if isinstance(msg.get("general"), str) else msg.get("general"),
            }
        elif kind in ("schema", "state", "upload") and isinstance(msg.get("error"), str):
            msg = {**msg, "error": without_paths(msg["error"])}
        send(msg)

    return out


class Gated:
    """``handle`` behind ``gate``: a refused message is answered with an error notice (at most one a second), a
    refused upload part with an ``upload`` message asking for it again later, and a ``hello`` that comes less
    than :data:`CATCHUP_INTERVAL` seconds after the previous one waits for its turn (the newest one wins)."""

    def __init__(
        self,
        gate: MessageGate,
        send: Callable[[dict], None],
        handle: Callable[[Any], None],
        *,
        interval: float = CATCHUP_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gate, self.send, self.handle, self.interval, self._clock = gate, send, handle, interval, clock
        self._lock = threading.Lock()
        self._last_hello = -1e18
        self._waiting: Any = None
        self._timer: threading.Timer | None = None

    def __call__(self, msg: Any) -> None:
        reason = self.gate.check(msg)
        if reason is not None:
            self._refused(msg, reason)
            return
        if isinstance(msg, dict) and msg.get("type") == "hello" and self._hello_later(msg):
            return
        self.handle(msg)

    def _refused(self, msg: Any, reason: str) -> None:
        part = isinstance(msg, dict) and msg.get("type") == "file" and msg.get("cmd") == "restore"
        if part and isinstance(msg.get("id"), str) and all(isinstance(msg.get(k), int) for k in ("index", "count")):
            wait = max(0.25, self.gate.retry_after())
            self.send(
                {
                    "type": "upload",
                    "id": msg["id"][:64],
                    "next": max(0, msg["index"]),
                    "count": max(1, msg["count"]),
                    "retry_ms": int(wait * 1000),
                }
            )
            return
        notice = self.gate.notice(reason)
        if notice is not None:
            self.send(notice)

    def _hello_later(self, msg: dict) -> bool:
        """Whether ``msg`` (a hello) must wait; if so it is kept (replacing one kept before) and handled later."""
        with self._lock:
            now = self._clock()
            wait = self._last_hello + self.interval - now
            if wait <= 0 and self._timer is None:
                self._last_hello = now
                return False
            self._waiting = msg
            if self._timer is None:
                self._timer = threading.Timer(max(0.0, wait), self._deliver)
                self._timer.daemon = True
                self._timer.start()
            return True

    def _deliver(self) -> None:
        with self._lock:
            msg, self._waiting, self._timer = self._waiting, None, None
            self._last_hello = self._clock()
        if msg is not None:
            try:
                self.handle(msg)
            except Exception:
                _log.exception("specviz serve: a page's delayed hello failed")

    def cancel(self) -> None:
        """Forget a waiting hello (the page went away)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._waiting = None, None


def gated(gate: MessageGate, send: Callable[[dict], None], handle: Callable[[Any], None]) -> Callable[[Any], None]:
    """``handle`` behind ``gate`` (see :class:`Gated`)."""
    return Gated(gate, send, handle)


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


def client_address() -> str | None:
    """The address of the client whose page is being made (``None`` outside a served page)."""
    ctx = pn.state.curdoc.session_context if pn.state.curdoc is not None else None
    request = getattr(ctx, "request", None) if ctx is not None else None
    try:
        return getattr(request, "remote_ip", None) if request is not None else None
    except Exception:  # Bokeh's request proxy raises for what it does not carry
        return None


def per_page_app(
    pool: SessionPool,
    *,
    prompt: str,
    start_kwargs: dict[str, Any],
    presets: list[dict[str, Any]] | None = None,
    title: str = "specviz inspector",
    gates: GateRegistry | None = None,
    plotly_url: str | None = None,
) -> Callable[[], pn.viewable.Viewable]:
    """The page factory of the default mode: a session per page, started in the background.

    ``start_kwargs`` (``max_tokens``, ``strategy`` and knobs) start each page's session on ``prompt``;
    ``presets`` are the workbench's one-click starting points (draft models by catalog name); ``gates``
    the server's gates by client address; ``plotly_url`` where pages fetch the plotly bundle.
    A page gets its session when its front-end first speaks (a request that never opens the page's
    websocket — a probe, a crawler — takes no place); beyond the cap the page shows "busy" instead.
    """
    registry = gates if gates is not None else GateRegistry()

    def page() -> pn.viewable.Viewable:
        comp = ViewComponent()
        col = pn.Column(comp, sizing_mode="stretch_width", styles=_PAGE_STYLES, name=title)
        held: dict[str, Any] = {}
        gate = registry.page_gate(client_address())
        send = scrubbed(comp.send)

        def first_then_core(msg: Any) -> None:
            if "core" not in held:
                if held.get("busy") or held.get("gone"):
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
                    InspectorCore(
                        send,
                        ms,
                        prompt=prompt,
                        draft_models=pool.catalog.names,
                        presets=presets,
                        background=True,
                        charge=gate.charge,
                        send_room=comp.room,
                        plotly_url=plotly_url,
                    ),
                )

                def start() -> None:  # the prompt is a decode: it waits for its turn, not in the server's thread
                    try:
                        ms.start(prompt, **start_kwargs)
                    except SpecvizError as e:
                        send({"type": "notice", "level": "error", "text": f"the session could not start: {e}"})

                _in_background(start, "start-session")
            held["core"].handle(msg)

        front = Gated(gate, send, first_then_core)
        comp.handler = front

        def let_go() -> None:
            front.cancel()
            if "core" in held and not held.get("gone"):
                held["gone"] = True
                core, ms = held["core"], held["ms"]

                def close() -> None:
                    core.close()
                    pool.close(ms)

                _in_background(close, "close-session")
            held["gone"] = True

        comp.when_dropped(let_go)
        pn.state.on_session_destroyed(lambda _ctx: let_go())
        return col

    return page


def _query_arg(name: str) -> str | None:
    values = pn.state.session_args.get(name) or []
    try:
        return values[0].decode() if values else None
    except (UnicodeDecodeError, AttributeError):
        return None


def _cookie(name: str) -> str | None:
    try:
        value = (pn.state.cookies or {}).get(name)
    except Exception:  # outside a served page
        return None
    return value if isinstance(value, str) else None


def page_role(policy: AccessPolicy, port: int | None) -> str:
    """``presenter`` for a page carrying the presenter token (its cookie, or the query argument it was swapped
    for), else ``viewer``."""
    supplied = _cookie(policy.presenter_cookie(port)) if port is not None else None
    if supplied is None:
        supplied = _query_arg(PRESENTER_ARG)
    return "presenter" if policy.is_presenter(supplied) else "viewer"


def shared_app(
    shared: SharedInspector,
    policy: AccessPolicy,
    *,
    max_viewers: int = 100,
    title: str = "specviz inspector",
    gates: GateRegistry | None = None,
    port: int | None = None,
) -> Callable[[], pn.viewable.Viewable]:
    """The page factory of presenter mode: every page watches ``shared``; the presenter token presents.

    A page joins the audience when its front-end first speaks (a request that never opens the page's
    websocket is not counted); beyond ``max_viewers`` watching pages a new one shows "busy". ``port``
    names the presenter's cookie (see :mod:`specviz.server.access`).
    """
    registry = gates if gates is not None else GateRegistry()

    def page() -> pn.viewable.Viewable:
        role = page_role(policy, port)
        comp = ViewComponent()
        col = pn.Column(
            comp,
            sizing_mode="stretch_width",
            styles=_PAGE_STYLES,
            name=f"{title} ({'presenter' if role == 'presenter' else 'watching'})",
        )
        held: dict[str, Any] = {}
        gate = registry.presenter_gate() if role == "presenter" else registry.page_gate(client_address())
        send = scrubbed(comp.send)

        def first_then_view(msg: Any) -> None:
            if "view" not in held:
                if held.get("busy") or held.get("gone"):
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
                held["view"] = shared.attach(send, role, room=comp.room, charge=gate.charge)
            shared.handle(held["view"], msg)

        front = Gated(gate, send, first_then_view)
        comp.handler = front

        def let_go() -> None:
            front.cancel()
            held["gone"] = True
            view = held.pop("view", None)
            if view is not None:
                shared.detach(view)

        comp.when_dropped(let_go)
        pn.state.on_session_destroyed(lambda _ctx: let_go())
        return col

    return page


def replay_app(
    events: list[Event],
    *,
    title: str,
    gates: GateRegistry | None = None,
    plotly_url: str | None = None,
    batch_cost: BatchCostTable | None = None,
) -> Callable[[], pn.viewable.Viewable]:
    """The page factory of ``specviz replay``: every page replays ``events``, behind its gate like any page;
    ``batch_cost``: the table a batched recording's advice under load uses (else measured on Advise)."""
    registry = gates if gates is not None else GateRegistry()

    def page() -> pn.viewable.Viewable:
        comp = ViewComponent()
        gate = registry.page_gate(client_address())
        send = scrubbed(comp.send)
        core = InspectorCore(
            send,
            events=events,
            background=True,
            charge=gate.charge,
            send_room=comp.room,
            plotly_url=plotly_url,
            batch_cost=batch_cost,
        )
        front = Gated(gate, send, core.handle)
        comp.handler = front

        def let_go() -> None:
            front.cancel()
            _in_background(core.close, "close-replay")

        comp.when_dropped(let_go)
        pn.state.on_session_destroyed(lambda _ctx: let_go())
        return pn.Column(comp, sizing_mode="stretch_width", styles=_PAGE_STYLES, name=title)

    return page
