"""The inspector's host-independent logic: event log, page messages, controls, the one Play/Run worker.

Both hosts (the anywidget :class:`~specviz.ui.inspector.Inspector` in JupyterLab and the Panel
component in :mod:`specviz.ui.panel_app`) wrap one :class:`InspectorCore`, give it a ``send``
function for custom messages and feed it the messages the front-end sends back. The messages' shapes are
declared once, in ``widgets/protocol.json`` (:mod:`specviz.ui.protocol`). The rounds come from a
:class:`~specviz.ui.sources.Source`: a live session or a recording.

Only new events travel. The core keeps the events of the current generation (an *epoch*: a new
``SessionStarted`` opens the next one) in :attr:`InspectorCore.log`. Each round's events are sent as one
``events`` message whose ``start`` is the index of its first event in the log. A view says which events it
holds (``hello``) when it appears, and gets only the events after those; a view that sees a gap in
``start`` asks again the same way. The whole history is sent only to a view that holds none of it (a new
view, or a page reload).

Nothing a view sends is trusted. :meth:`InspectorCore.handle` checks every message against the declaration
(its type, its fields' types and ranges) and whether it makes sense now (a command while the worker is
stepping, a step after the generation finished, a reconfiguration of a recording …). A message it refuses
changes nothing, neither in the session nor in the log, and is answered with a ``notice`` of level
``error`` that the page shows; refused knob-form values come back as ``knob_errors`` beside their fields,
and an unknown strategy in a ``schema`` request as a ``schema`` message with an ``error``. No exception
escapes :meth:`~InspectorCore.handle`.

No UI library is imported here, so the core is tested without a browser.
"""

from __future__ import annotations

import importlib.resources
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..decoding.batch_cost import BatchCostTable
from ..decoding.events import Event
from ..errors import SpecvizError
from ..strategies import strategy_schema
from .batch_source import BatchSource
from .protocol import MessageError, message_types, show, validate_incoming, work_of
from .sources import InspectedSession, LiveSource, ReplaySource, Source
from .tasks import BYTES_PER_UNIT, BackgroundWork
from .workbench import Workbench

if TYPE_CHECKING:
    from ..decoding.batch import BatchRun

#: Events per message when a view catches up on a backlog.
CHUNK = 2000
#: About how many bytes one event takes on the wire (what a catch-up is charged per event resent).
EVENT_BYTES = 400
#: Event kinds that close a batch: everything up to them is sent at once.
_FLUSH_KINDS = frozenset({"telemetry", "finished", "session_started", "rewound", "batch_step"})
#: The most characters in a knob name or text value of a ``configure`` message.
MAX_TEXT = 4096
#: The fields of a ``reset`` command passed on to :meth:`InspectorCore.reset` by name.
_RESET_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "stop",
    "chat",
    "context",
    "server_args",
    "grammar",
    "json_schema",
)

_log = logging.getLogger(__name__)

_PLOTLY_SOURCE: str | None = None
#: The name under which the hosts ask :func:`static_text` for the assembled front-end module.
INSPECTOR_JS = "inspector.js"


def plotly_source() -> str:
    """The plotly.js bundle shipped inside the ``plotly`` Python package (read once, cached)."""
    global _PLOTLY_SOURCE
    if _PLOTLY_SOURCE is None:
        try:
            _PLOTLY_SOURCE = (importlib.resources.files("plotly") / "package_data" / "plotly.min.js").read_text(
                encoding="utf-8"
            )
        except (ModuleNotFoundError, FileNotFoundError) as e:  # pragma: no cover - depends on the install
            raise SpecvizError("the inspector's charts need the 'plotly' package: pip install 'specviz[ui]'") from e
    return _PLOTLY_SOURCE


def static_text(name: str) -> str:
    """A front-end file shipped in ``specviz.static`` (the ``widgets/`` folder of the source tree).

    ``inspector.js`` is the one ES module both hosts load: it is assembled from the source modules in
    ``widgets/inspector/`` (see :mod:`specviz.ui.bundle`), not read from a file.
    """
    if name == INSPECTOR_JS:
        from .bundle import inspector_module

        return inspector_module()
    return (importlib.resources.files("specviz.static") / name).read_text(encoding="utf-8")


class InspectorCore:
    """Drives a live session (or replays recorded events) for one inspector.

    ``send(msg)`` delivers a JSON-serialisable message to every view of the host widget. Exactly one of
    ``session`` (an :class:`~specviz.ui.sources.InspectedSession`) and ``events`` is given: a live session, or
    the recorded events of a replay. ``prompt`` starts a session that has not started on Reset;
    ``draft_models`` lists draft GGUF paths the form offers for the ``draft`` strategy's ``draft_model``;
    ``presets`` are the workbench's starting points. Instead of either, ``batch`` shows a live batched run
    (:class:`~specviz.ui.batch_source.BatchSource`: Step, Run and Play run its steps). ``batch_cost``: a
    batch-cost table the advice under load of a batched run uses (:mod:`specviz.ui.parallel_advice`; without
    one it is measured on Advise).

    A served page's core is made with ``background=True``: the messages the declaration marks
    ``"work": "background"`` then run one at a time off the calling thread (:mod:`specviz.ui.tasks`), the
    ``state`` says which one runs (``working``) and other commands are refused meanwhile. ``charge(units)``
    is told the work each message cost (a token decoded or copied, or 16 KiB moved, is one unit: see
    :meth:`charge`); the server's message gate spends it. ``send_room()`` waits until the page has taken
    most of what was sent to it (False: it went away); a download paces its parts with it. With
    ``plotly_url`` the page is told where to fetch the plotly bundle (a static, cached asset) instead of
    being sent it. Without them (a notebook) every message is handled at once in the calling thread and the
    bundle travels in a message.
    """

    def __init__(
        self,
        send: Callable[[dict], None],
        session: InspectedSession | None = None,
        *,
        events: list[Event] | None = None,
        prompt: str | None = None,
        draft_models: Iterable[str] | None = None,
        presets: list[dict[str, Any]] | None = None,
        background: bool = False,
        charge: Callable[[int], None] | None = None,
        send_room: Callable[[], bool] | None = None,
        plotly_url: str | None = None,
        batch_cost: BatchCostTable | None = None,
        batch: BatchRun | None = None,
    ) -> None:
        if sum(x is not None for x in (session, events, batch)) != 1:
            raise ValueError("give a session, recorded events or a batched run")
        #: Where the rounds come from: a live session, a recording or a live batched run.
        self.source: Source
        if session is not None:
            self.source = LiveSource(session, prompt=prompt, draft_models=draft_models)
        elif batch is not None:
            self.source = BatchSource(batch)
        else:
            self.source = ReplaySource(events or [])
        self._send = send
        self._lock = threading.RLock()
        self.epoch = 0
        self.log: list[dict] = []
        self._unsent = 0  # index in log of the first event not yet sent
        self.messages_sent = 0
        self._worker: threading.Thread | None = None
        self._state_lock = threading.RLock()  # see _send_state
        self._state_seq = 0  # the last seq taken
        self._sent_seq = 0  # the seq of the last state sent
        self._stop = threading.Event()
        self._pending: str | None = None
        self._error: str | None = None
        self._last_state: dict | None = None
        self._charge = charge
        self._send_room = send_room
        self.plotly_url = plotly_url
        self._background: BackgroundWork | None = BackgroundWork(self._send_state) if background else None
        for ev in self.source.backlog():
            self.record(ev, flush=False)
        self._unsent = len(self.log)
        self._detach: Callable[[], None] | None = self.source.attach(self)
        #: Rewind, branch and compare lanes, diagnosis, advice, presets and files (:mod:`specviz.ui.workbench`).
        self.workbench = Workbench(self, presets, batch_cost=batch_cost)
        self._handlers: dict[str, Callable[[dict], None]] = {
            "hello": self._hello,
            "cmd": self._command,
            "configure": self._configure_message,
            "schema": self._schema_message,
            "plotly": self._plotly_message,
            **self.workbench.handlers(),
        }
        if set(self._handlers) != set(message_types()):  # the declaration and the handlers must agree
            declared, handled = sorted(message_types()), sorted(self._handlers)
            raise RuntimeError(f"the page protocol declares {declared} but the inspector handles {handled}")

    @property
    def session(self) -> InspectedSession | None:
        """The live session shown (``None`` for a recording)."""
        return self.source.session

    @property
    def pending(self) -> str | None:
        """The knob change queued for the next round, as the form shows it (``None``: none)."""
        return self._pending

    # -- event log -----------------------------------------------------------------------------------
    def record(self, ev: Event, flush: bool = True) -> None:
        """Add one of the source's events to the log; with ``flush``, an event that closes a batch (a round's
        telemetry, the finish, a new start, a rewind) sends every event not sent yet."""
        d = ev.to_dict()
        with self._lock:
            if d["kind"] == "session_started":
                if self.log:
                    self.epoch += 1
                self.log = []
                self._unsent = 0
            if d["kind"] == "knobs_changed":
                self._pending = None
            self.log.append(d)
            if flush and d["kind"] in _FLUSH_KINDS:
                self.flush()

    def flush(self) -> None:
        """Send the events not sent yet (one ``events`` message) and then the state, if it changed."""
        with self._lock:
            if self._unsent >= len(self.log):
                return
            start = self._unsent
            events = self.log[start:]
            self._unsent = len(self.log)
            self.emit({"type": "events", "epoch": self.epoch, "start": start, "events": events})
            self._send_state()

    def emit(self, msg: dict) -> None:
        """Send one message to every view."""
        self.messages_sent += 1
        self._send(msg)

    def main_events(self) -> list[Event]:
        """The events of the generation shown (the session's, or the replayed recording's)."""
        return self.source.main_events(self.log)

    def batched_events(self) -> list[Event] | None:
        """A batched run's whole recording when that is what the view shows (None: one generation)."""
        return self.source.batched_events()

    # -- state ---------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """True while the Run/Play worker is stepping."""
        w = self._worker
        return w is not None and w.is_alive()

    def state(self) -> dict:
        """What the controls show: running, finished, strategy, knobs, schema, pending change …"""
        return {
            "type": "state",
            **self.source.state_fields(self.log),
            "running": self.running,
            "pending": self._pending,
            "epoch": self.epoch,
            "error": self._error,
            "working": self.working,
        }

    @property
    def working(self) -> str | None:
        """The page message running in the background now (``None``: none)."""
        return self._background.working if self._background is not None else None

    def _send_state(self, force: bool = False) -> None:
        # A Run's worker may end (and send "not running") while the thread that started it is still sending
        # "running". So every state carries a rising ``seq``, taken before the state is read: states go out in
        # seq order, one read earlier than a state already sent is dropped, and the page keeps only the newest
        # (a guard for hosts that could deliver out of order; served pages get theirs in order, OrderedSender).
        # No lock of ours is held while the session is read (a round holds the session's lock and sends from
        # inside it).
        with self._state_lock:
            self._state_seq += 1
            seq = self._state_seq
        st = self.state()
        with self._state_lock:
            if seq < self._sent_seq:
                return
            # a state equal to the page's is not sent, but it is the newest read: older reads are now stale
            self._sent_seq = seq
            if not force and st == self._last_state:
                return
            self._last_state = st
            self.emit({**st, "seq": seq})

    # -- what the workbench changes outside the rounds ----------------------------------------------
    def after_rewind(self) -> None:
        """The session was rewound: its queued knob change is gone; the views get the rewind and the state."""
        self._pending = None
        self.flush()
        self._send_state()

    def after_start(self, prompt: str) -> None:
        """A generation was started on ``prompt`` outside :meth:`reset` (a preset): Reset now repeats it."""
        self.source.started_on(prompt)
        self._pending = None
        self._error = None
        self.flush()
        self._send_state()

    def reload(self) -> None:
        """The session was replaced wholesale (a restored snapshot): a new epoch holding its events."""
        with self._lock:
            self.epoch += 1
            self.log = [e.to_dict() for e in self.source.backlog()]
            self._unsent = 0
            self._pending = None
            self.flush()
            self._send_state(force=True)

    # -- messages from the front-end -----------------------------------------------------------------
    def handle(self, msg: Any) -> None:
        """Dispatch one message a view sent; a refused message changes nothing and is answered with an error.

        No exception escapes: the message's reason for refusal (or, for a failure nobody foresaw, the
        exception) goes to the page as a ``notice`` of level ``error``.
        """
        try:
            checked = validate_incoming(msg)
            work, name = work_of(checked)
            if self._background is None or work == "always":
                self._handlers[checked["type"]](checked)
            elif work == "background":
                self.in_background(name, lambda: self._handlers[checked["type"]](checked), msg)
            else:
                self._refuse_while_working(name)
                self._handlers[checked["type"]](checked)
        except MessageError as e:
            self._notice("error", str(e))
        except Exception as e:  # keep the widget alive and say what happened
            self._failed(msg, e)

    def _failed(self, msg: Any, e: Exception) -> None:
        _log.exception("specviz inspector: a message from the page failed: %s", show(msg, 200))
        self._notice("error", f"the message {show(msg)} failed: {type(e).__name__}: {e}")

    def _refuse_while_working(self, name: str) -> None:
        current = self.working
        if current is not None:
            raise MessageError(
                f"{name}: the page is still working on {current}; this one was ignored and nothing changed "
                "(try again when it is done)"
            )

    def in_background(self, name: str, job: Callable[[], None], msg: Any = None) -> None:
        """Run ``job`` (the handling of page message ``name``) off the calling thread when this core does
        background work, else now. Refused with :class:`MessageError` while other background work runs.
        The job's refusals and failures reach the page as notices, as :meth:`handle`'s do."""
        if self._background is None:
            job()
            return
        self._refuse_while_working(name)

        def guarded() -> None:
            try:
                job()
            except MessageError as e:
                self._notice("error", str(e))
            except Exception as e:  # keep the widget alive and say what happened
                self._failed(msg if msg is not None else name, e)

        if not self._background.submit(name, guarded):
            self._refuse_while_working(name)

    def wait_work(self, timeout: float | None = None) -> bool:
        """Block until the background work running now (if any) has finished; False on ``timeout``."""
        return self._background.wait(timeout) if self._background is not None else True

    def wait_room(self) -> bool:
        """Wait until the page has taken most of what was sent to it (see ``send_room``); False when it is gone."""
        return self._send_room() if self._send_room is not None else True

    def charge(self, units: int) -> None:
        """Tell the host what a message cost: one unit per token decoded or copied, or per 16 KiB moved
        (:data:`~specviz.ui.tasks.BYTES_PER_UNIT`). A served page's gate spends these; elsewhere nothing happens."""
        if self._charge is not None and units > 0:
            self._charge(int(units))

    def _notice(self, level: str, text: str) -> None:
        self.emit({"type": "notice", "level": level, "text": text})

    def _plotly_message(self, msg: dict) -> None:
        if self.plotly_url is not None:  # a served page fetches it once, from the browser's cache after that
            self.emit({"type": "plotly", "url": self.plotly_url})
            return
        try:
            self.emit({"type": "plotly", "source": plotly_source()})
        except SpecvizError as e:
            self._notice("error", str(e))

    def _hello(self, msg: dict) -> None:
        epoch, have = msg["epoch"], msg["have"]
        with self._lock:
            if epoch == self.epoch and have > self._unsent:
                raise MessageError(
                    f"hello: the page says it holds {have} events of epoch {epoch}, but only "
                    f"{self._unsent} were sent; reload the page"
                )
            start = have if epoch == self.epoch else 0  # a view of another epoch gets this one from its start
            self._send_state(force=True)
            self.charge((self._unsent - start) * EVENT_BYTES // BYTES_PER_UNIT)  # a catch-up moves bytes
            for first in range(start, self._unsent, CHUNK):
                end = min(first + CHUNK, self._unsent)
                self.emit({"type": "events", "epoch": self.epoch, "start": first, "events": self.log[first:end]})
        self.workbench.hello()

    def _schema_message(self, msg: dict) -> None:
        strategy = msg["strategy"]
        try:
            knobs = strategy_schema(strategy).to_list()
            self.emit({"type": "schema", "strategy": strategy, "knobs": knobs})
        except SpecvizError as e:
            self.emit({"type": "schema", "strategy": strategy, "knobs": [], "error": str(e)})

    def _command(self, msg: dict) -> None:
        cmd = msg["cmd"]
        if cmd == "pause":  # always allowed: stops the worker after its round, does nothing otherwise
            self.pause()
            return
        if self.running:
            raise MessageError(f"{cmd}: rounds are running; Pause first (or wait for the run to end)")
        if cmd == "reset":
            request = {k: msg.get(k) for k in _RESET_FIELDS}
            try:
                self.reset(msg.get("prompt"), msg.get("max_tokens"), **request)
            except SpecvizError as e:
                raise MessageError(f"reset: {e}") from e
            finally:
                self.charge(len(self.session.history) if self.session is not None and self.session.started else 1)
            return
        refusal = self.source.step_refusal()  # a step/run/play that would do nothing
        if refusal is not None:
            raise MessageError(f"{cmd}: {refusal}")
        n = (msg.get("n") or 1) if cmd == "run" else 1 if cmd == "step" else None
        if not self.start_rounds(n):
            raise MessageError(f"{cmd}: rounds are running; Pause first (or wait for the run to end)")

    def _configure_message(self, msg: dict) -> None:
        knobs = msg.get("knobs") or {}
        for name, value in knobs.items():
            if len(name) > MAX_TEXT or (isinstance(value, str) and len(value) > MAX_TEXT):
                raise MessageError(f"configure: knob {show(name)} or its value is longer than {MAX_TEXT} characters")
        refusal = self.source.configure_refusal()
        if refusal is not None:
            raise MessageError(f"configure: {refusal}")
        self.configure_from_form(msg.get("strategy"), knobs)  # refused values come back as knob_errors

    # -- controls (also the Python API of the inspector) ---------------------------------------------
    def step(self, n: int = 1) -> int:
        """Run ``n`` rounds now (in the calling thread); returns how many ran."""
        ran = 0
        for _ in range(n):
            if not self._step_once():
                break
            ran += 1
        self._send_state()
        return ran

    def _step_once(self) -> bool:
        try:
            moved = self.source.step_round()
        except SpecvizError as e:
            self._error = str(e)
            return False
        finally:
            self.flush()
        if moved:
            self._error = None
        return moved

    def start_rounds(
        self,
        n: int | None,
        *,
        also: Callable[[], bool] | None = None,
        done: Callable[[], None] | None = None,
        name: str = "specviz-inspector-play",
    ) -> bool:
        """Step ``n`` rounds (``None``: to the end) in the core's one background worker; False when it already
        runs. ``also()`` runs after each round of the main lane and says whether it moved something (the
        workbench's second lane); the worker stops when neither moved. ``done()`` runs when the worker stops.
        The toolbar shows the worker running and Pause stops it, whoever started it."""
        with self._lock:
            if self.running:
                return False
            self._stop.clear()
            self._worker = threading.Thread(target=self._work, args=(n, also, done), name=name, daemon=True)
            self._worker.start()
            self._send_state()
            return True

    def _work(self, n: int | None, also: Callable[[], bool] | None, done: Callable[[], None] | None) -> None:
        i = 0
        try:
            while (n is None or i < n) and not self._stop.is_set():
                moved = self._step_once()
                if also is not None and also():
                    moved = True
                if not moved:
                    break
                i += 1
        except Exception as e:  # keep the widget alive and say what happened
            self._error = f"{type(e).__name__}: {e}"
        finally:
            self._worker = None
            try:
                if done is not None:
                    done()
            finally:
                self._send_state()

    def play(self) -> None:
        """Step in a background thread until finished or paused."""
        self.start_rounds(None)

    def run(self, n: int) -> None:
        """Step ``n`` rounds in a background thread."""
        self.start_rounds(n)

    def pause(self) -> None:
        """Stop the background stepping after the current round (returns at once)."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the background stepping has stopped."""
        w = self._worker
        if w is not None:
            w.join(timeout)

    def reset(
        self,
        prompt: str | None = None,
        max_tokens: int | None = None,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: list[str] | None = None,
        chat: bool | None = None,
        context: dict[str, Any] | None = None,
        server_args: str | None = None,
        grammar: str | None = None,
        json_schema: str | None = None,
    ) -> None:
        """Start the generation again (same prompt unless ``prompt`` is given); rewinds a replay.

        The sampling settings (``temperature``, ``top_k``, ``top_p``, ``seed``), the stop strings and
        ``chat`` (send the prompt as a user message through the model's chat template) default to the
        current generation's. A live session's deployment (:mod:`specviz.ui.deployment`): ``context`` (its
        context settings ``flash_attn``, ``cache_type_k``, ``cache_type_v``, ``n_ctx``, ``n_batch``,
        ``n_ubatch``, ``n_threads``) or ``server_args`` (a whole llama-server command line) creates the
        context anew first; each of the line's flags that is not honoured is shown as a warning. ``grammar``
        (GBNF; ``''``: none) or ``json_schema`` (JSON text) constrains the new generation through llama.cpp's
        grammar sampler; left out, the line's grammar, else the current generation's, stays
        (:func:`~specviz.ui.sources.reset_grammar`). A grammar llama.cpp cannot parse is refused with its
        reason and line, nothing changed."""
        self.pause()
        self.wait()
        request: dict[str, Any] = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop)
        request.update(chat=chat, context=context, server_args=server_args, grammar=grammar, json_schema=json_schema)
        warnings = self.source.reset(list(self.log), prompt, max_tokens, **request)
        self._pending = None
        self._error = None
        self.flush()
        self._send_state()
        for w in warnings:
            self._notice("warning", w)

    def configure_from_form(self, strategy: Any, raw: dict) -> dict[str, str]:
        """Validate form values (strings from the inputs) knob by knob and queue them on the session.

        Returns ``{knob: message}`` for every refused value (empty on success). A refused form changes
        nothing; the errors are sent to the views to show beside their fields.
        """
        result = self.source.configure(strategy, raw)
        if not result.errors:
            self._pending = result.pending
        self.emit({"type": "knob_errors", "errors": result.errors, "general": result.general})
        if not result.errors:
            self._send_state()
        return dict(result.errors)

    def close(self) -> None:
        """Stop stepping (and wait a little for background work) and stop listening to the source."""
        self.pause()
        self.wait(5)
        self.wait_work(5)
        if self._detach is not None:
            self._detach()
            self._detach = None
        self.workbench.close()
