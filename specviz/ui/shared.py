"""Presenter mode: one session that every page watches live; only the presenter's pages control it.

``specviz serve --shared`` runs one :class:`~specviz.session.Session` behind one
:class:`~specviz.ui.core.InspectorCore`. :class:`SharedInspector` sits between that core and the pages
(*views*), each of which is a presenter or a viewer:

* what the session does (each round's events, the controls' state) goes to every view, as it happens;
* the answer to a view's own request goes to that view only: a page that joins late says which events
  it holds (``hello``) and only it is sent the recorded rounds it lacks, in chunks (the core's
  catch-up); notices, knob-form errors and schemas go back to the page that asked;
* a viewer's ``cmd`` (step, run, play, pause, reset) and ``configure`` are refused with an error notice
  to that viewer, before the core sees them: nothing changes. Its ``state`` messages say
  ``role: "viewer"`` and allow no control, so its page shows every control disabled.

Every ``state`` message carries ``role`` and ``audience`` (how many pages watch and present).

The presenter's pages are sent every round as it happens. The viewers' broadcasts are batched: they
wait in each viewer's outbox and a sender thread delivers them every ``viewer_interval`` seconds (0.1
by default), consecutive rounds merged into one ``events`` message and only the newest ``state`` kept.
The presenter's session then pays for a viewer a few times a second instead of once a round: the
stepping thread only appends to the outboxes, and the server sends one message per viewer per batch.
A viewer's outbox is its only channel, so what it is sent keeps its order; a reply to a viewer (its
catch-up, a notice) is sent at once with whatever was queued before it.

No UI library is imported here.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from .core import InspectorCore

#: Message types a viewer may send: they ask for something and change nothing.
VIEWER_MESSAGES = ("hello", "schema", "plotly")
#: The roles of a view.
ROLES = ("presenter", "viewer")
#: Message types that describe the session and go to every view (other replies go to the asking view).
BROADCAST_TYPES = ("events", "state")

_ids = itertools.count(1)


@dataclass(eq=False)
class View:
    """One page watching the shared session: how to send to it and its role."""

    send: Callable[[dict], None]
    role: str
    id: int = field(default_factory=lambda: next(_ids))
    #: Messages this view was sent (for the load benchmark and the tests).
    sent: int = 0
    #: Broadcasts waiting for the next batch (viewers only).
    outbox: list[dict] = field(default_factory=list)


def merge_into(outbox: list[dict], msg: dict) -> None:
    """Add a broadcast to a viewer's outbox: an ``events`` message continuing the outbox's newest one (same
    epoch, no gap) is merged into it; a ``state`` replaces any older one (only the newest matters)."""
    if msg.get("type") == "state":
        outbox[:] = [m for m in outbox if m.get("type") != "state"]
        outbox.append(msg)
        return
    if msg.get("type") == "events":
        last = next((m for m in reversed(outbox) if m.get("type") == "events"), None)
        if last is not None and last["epoch"] == msg["epoch"] and last["start"] + len(last["events"]) == msg["start"]:
            last["events"] = last["events"] + msg["events"]
            return
        outbox.append({**msg, "events": list(msg["events"])})
        return
    outbox.append(msg)


class SharedInspector:
    """One session shown to many views (see the module docstring).

    ``session``, ``prompt`` and ``draft_models`` are passed to the :class:`InspectorCore` this wraps.
    """

    def __init__(self, session: Any, *, prompt: str | None = None, draft_models: list[str] | None = None,
                 viewer_interval: float = 0.1) -> None:
        self._views: list[View] = []
        self._views_lock = threading.Lock()
        self._asking = threading.local()  # the view whose message this thread is handling, and its type
        self.viewer_interval = viewer_interval
        self._outbox_lock = threading.RLock()
        self._stop = threading.Event()
        self._sender: threading.Thread | None = None
        self.core = InspectorCore(self._send, session, prompt=prompt, draft_models=draft_models)
        if viewer_interval > 0:
            self._sender = threading.Thread(target=self._send_batches, name="specviz-viewers", daemon=True)
            self._sender.start()

    # -- views ---------------------------------------------------------------------------------------
    def attach(self, send: Callable[[dict], None], role: str) -> View:
        """Add a page; it catches up when its front-end says hello. Every view learns the new audience."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}; got {role!r}")
        view = View(send, role)
        with self._views_lock:
            self._views.append(view)
        self._announce()
        return view

    def detach(self, view: View) -> None:
        """Remove a page (its browser went away)."""
        with self._views_lock:
            if view in self._views:
                self._views.remove(view)
        self._announce()

    @property
    def views(self) -> list[View]:
        """The pages attached now."""
        with self._views_lock:
            return list(self._views)

    def audience(self) -> dict[str, int]:
        """How many pages watch (``viewers``) and present (``presenters``)."""
        views = self.views
        presenters = sum(1 for v in views if v.role == "presenter")
        return {"presenters": presenters, "viewers": len(views) - presenters}

    def _announce(self) -> None:
        """Send every view the current state (with the new audience)."""
        st = self.core.state()
        for v in self.views:
            self._deliver(v, st)

    # -- messages --------------------------------------------------------------------------------------
    def handle(self, view: View, msg: Any) -> None:
        """A message from ``view``. A viewer may only ask (``hello``, ``schema``, ``plotly``): anything else it
        sends is refused with an error notice to it and never reaches the core, so nothing changes."""
        kind = msg.get("type") if isinstance(msg, dict) else None
        if view.role != "presenter" and kind not in VIEWER_MESSAGES:
            what = str(kind)[:40] if isinstance(kind, str) else "a message"
            if kind == "cmd" and isinstance(msg.get("cmd"), str):
                what = msg["cmd"][:40]
            self._deliver(
                view,
                {
                    "type": "notice",
                    "level": "error",
                    "text": f"{what}: refused; this page watches the presenter's session — only "
                    "the presenter can step, play, reset or change knobs",
                },
            )
            self._flush_view(view)
            return
        self._asking.view, self._asking.kind = view, kind
        try:
            self.core.handle(msg)
        finally:
            self._asking.view = self._asking.kind = None
        if view.role != "presenter" and view.outbox:
            self._flush_view(view)  # a viewer's reply does not wait for the next batch

    def _send(self, msg: dict) -> None:
        """The core's send: to the asking view or to every view (see the module docstring)."""
        asking: View | None = getattr(self._asking, "view", None)
        if asking is not None and (self._asking.kind == "hello" or msg.get("type") not in BROADCAST_TYPES):
            if self._asking.kind == "hello" and msg.get("type") == "state" and asking.role != "presenter":
                # the catch-up that follows covers every round broadcast so far: drop the queued ones
                with self._outbox_lock:
                    asking.outbox[:] = [m for m in asking.outbox if m.get("type") not in BROADCAST_TYPES]
            self._deliver(asking, msg)
            return
        for v in self.views:
            self._deliver(v, msg)

    def _deliver(self, view: View, msg: dict) -> None:
        """Send ``msg`` to the presenter at once; queue it in a viewer's outbox (sent in order by batches)."""
        if msg.get("type") == "state":
            msg = {**msg, "role": view.role, "audience": self.audience()}
            if view.role != "presenter":
                msg.update(can_control=False, can_step=False, can_reset=False)
        if view.role == "presenter" or self._sender is None:
            self._send_to(view, msg)
            return
        with self._outbox_lock:
            merge_into(view.outbox, msg)

    def _send_to(self, view: View, msg: dict) -> None:
        view.sent += 1
        try:
            view.send(msg)
        except Exception:  # a page that went away must not stop the others
            self.detach(view)

    def _flush_view(self, view: View) -> None:
        # taken and sent under the lock: two flushes of one view cannot swap its messages
        with self._outbox_lock:
            msgs, view.outbox[:] = view.outbox[:], []
            for m in msgs:
                self._send_to(view, m)

    def flush(self) -> None:
        """Send every viewer what waits in its outbox (the sender thread does this every ``viewer_interval``)."""
        for v in self.views:
            if v.outbox:
                self._flush_view(v)

    def _send_batches(self) -> None:
        while not self._stop.wait(self.viewer_interval):
            try:
                self.flush()
            except Exception:  # keep serving the others
                pass

    def close(self) -> None:
        """Stop the session's stepping and the sender thread, and forget the views."""
        self.core.close()
        self._stop.set()
        if self._sender is not None:
            self._sender.join(5)
        self.flush()
        with self._views_lock:
            self._views.clear()
