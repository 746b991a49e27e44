"""Presenter mode: one session that every page watches live; only the presenter's pages control it.

``specviz serve --shared`` runs one :class:`~specviz.decoding.session.Session` behind one
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
wait in one outbox, consecutive rounds merged into one ``events`` message and only the newest
``state`` kept, and a sender thread delivers them every ``viewer_interval`` seconds (0.1 by default)
as one ``packed`` message (``{"type": "packed", "json": "[...]"}``, the messages serialized once for
all viewers; the front-end unpacks it). The presenter's session then pays for a viewer a few times a
second instead of once a round, and the stepping thread only appends to the outbox. A reply to a
viewer (its catch-up, a notice) is sent after whatever was queued before it, so a page never gets an
older ``state`` after a newer one.

No UI library is imported here.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..ui.core import InspectorCore
from ..ui.sources import InspectedSession

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
    #: Waits until the page has taken most of what it was sent (False: it went away); None: never waits.
    room: Callable[[], bool] | None = None
    #: Told the work this view's own requests cost (its page's gate); None: nobody counts.
    charge: Callable[[int], None] | None = None


#: The view whose message is being handled in this context, and the message's type (a background job runs in
#: a copy of its submitter's context, so its replies still go to the page that asked).
_ASKING: contextvars.ContextVar[tuple[View, str | None] | None] = contextvars.ContextVar("specviz_asking", default=None)


def merge_into(outbox: list[dict], msg: dict) -> None:
    """Add a broadcast to the viewers' outbox: an ``events`` message continuing the outbox's newest one (same
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

    def __init__(
        self,
        session: InspectedSession,
        *,
        prompt: str | None = None,
        draft_models: list[str] | None = None,
        presets: list[dict[str, Any]] | None = None,
        viewer_interval: float = 0.1,
        background: bool = False,
        plotly_url: str | None = None,
    ) -> None:
        self._views: list[View] = []
        self._views_lock = threading.Lock()
        self.viewer_interval = viewer_interval
        self._box_lock = threading.RLock()
        self._viewer_box: list[dict] = []  # broadcasts waiting for the viewers' next batch
        self._stop = threading.Event()
        self._sender: threading.Thread | None = None
        self.core = InspectorCore(
            self._send,
            session,
            prompt=prompt,
            draft_models=draft_models,
            presets=presets,
            background=background,
            charge=self._charge_asking,
            send_room=self._room_of_asking,
            plotly_url=plotly_url,
        )
        if viewer_interval > 0:
            self._sender = threading.Thread(target=self._send_batches, name="specviz-viewers", daemon=True)
            self._sender.start()

    # -- views ---------------------------------------------------------------------------------------
    def attach(
        self,
        send: Callable[[dict], None],
        role: str,
        *,
        room: Callable[[], bool] | None = None,
        charge: Callable[[int], None] | None = None,
    ) -> View:
        """Add a page; it catches up when its front-end says hello. Every view learns the new audience.
        ``room`` and ``charge`` are the page's flow control and gate (see :class:`View`)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}; got {role!r}")
        view = View(send, role, room=room, charge=charge)
        with self._views_lock:
            self._views.append(view)
        self._broadcast(self.core.state())
        return view

    def detach(self, view: View) -> None:
        """Remove a page (its browser went away)."""
        with self._views_lock:
            if view not in self._views:
                return
            self._views.remove(view)
        self._broadcast(self.core.state())

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

    def pending(self) -> list[dict]:
        """The broadcasts waiting for the viewers' next batch."""
        with self._box_lock:
            return list(self._viewer_box)

    # -- messages --------------------------------------------------------------------------------------
    def handle(self, view: View, msg: Any) -> None:
        """A message from ``view``. A viewer may only ask (``hello``, ``schema``, ``plotly``): anything else it
        sends is refused with an error notice to it and never reaches the core, so nothing changes."""
        kind = msg.get("type") if isinstance(msg, dict) else None
        if view.role != "presenter" and kind not in VIEWER_MESSAGES:
            what = str(kind)[:40] if isinstance(kind, str) else "a message"
            if kind == "cmd" and isinstance(msg.get("cmd"), str):
                what = msg["cmd"][:40]
            text = (
                f"{what}: refused; this page watches the presenter's session — only the presenter can step, "
                "play, reset or change knobs"
            )
            self._reply(view, {"type": "notice", "level": "error", "text": text}, None)
            return
        token = _ASKING.set((view, kind))
        try:
            self.core.handle(msg)
        finally:
            _ASKING.reset(token)

    def _send(self, msg: dict) -> None:
        """The core's send: to the asking view or to every view (see the module docstring)."""
        asking = _ASKING.get()
        if asking is not None and (asking[1] == "hello" or msg.get("type") not in BROADCAST_TYPES):
            self._reply(asking[0], msg, asking[1])
            return
        self._broadcast(msg)

    def _charge_asking(self, units: int) -> None:
        """The core's charge: the work of a request goes to the page that asked (its gate)."""
        asking = _ASKING.get()
        if asking is not None and asking[0].charge is not None:
            asking[0].charge(units)

    def _room_of_asking(self) -> bool:
        """The core's flow control: a reply of many parts (a download) waits for the page that asked."""
        asking = _ASKING.get()
        room = asking[0].room if asking is not None else None
        return room() if room is not None else True

    def _for(self, role: str, msg: dict) -> dict:
        """``msg`` as a view of ``role`` gets it: a ``state`` says the role and the audience, and a viewer's
        allows no control."""
        if msg.get("type") != "state":
            return msg
        out = {**msg, "role": role, "audience": self.audience()}
        if role != "presenter":
            out.update(can_control=False, can_step=False, can_reset=False)
        return out

    def _broadcast(self, msg: dict) -> None:
        views = self.views
        for v in views:
            if v.role == "presenter":
                self._send_to(v, self._for("presenter", msg))
        as_viewer = self._for("viewer", msg)
        if self._sender is None:
            for v in views:
                if v.role != "presenter":
                    self._send_to(v, as_viewer)
            return
        with self._box_lock:
            merge_into(self._viewer_box, as_viewer)

    def _reply(self, view: View, msg: dict, kind: str | None) -> None:
        """A message for ``view`` alone; for a viewer, after every broadcast queued before it."""
        msg = self._for(view.role, msg)
        if view.role == "presenter" or self._sender is None:
            self._send_to(view, msg)
            return
        with self._box_lock:
            # what was broadcast before goes first (a stale state must not arrive after this reply); a
            # page catching up with a hello is sent every round so far by the reply itself
            self._flush_viewers(skip=view if kind == "hello" else None)
            self._send_to(view, msg)

    def _send_to(self, view: View, msg: dict) -> None:
        view.sent += 1
        try:
            view.send(msg)
        except Exception:  # a page that went away must not stop the others
            threading.Thread(target=self.detach, args=(view,), daemon=True).start()

    def _flush_viewers(self, skip: View | None = None) -> None:
        """Send the queued broadcasts to every viewer as one ``packed`` message, serialized once for all
        (called with the lock held, so two flushes cannot swap a viewer's messages)."""
        if not self._viewer_box:
            return
        msgs, self._viewer_box[:] = self._viewer_box[:], []
        packed = {"type": "packed", "json": json.dumps(msgs, separators=(",", ":"))}
        for v in self.views:
            if v.role != "presenter" and v is not skip:
                self._send_to(v, packed)

    def flush(self) -> None:
        """Send the viewers what waits for them (the sender thread does this every ``viewer_interval``)."""
        with self._box_lock:
            self._flush_viewers()

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
