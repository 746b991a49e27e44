"""The inspector's host-independent logic: event log, message protocol, controls, Play thread.

Both hosts (the anywidget :class:`~specviz.ui.inspector.Inspector` in JupyterLab and the Panel
component in :mod:`specviz.ui.panel_app`) wrap one :class:`InspectorCore`, give it a ``send``
function for custom messages and feed it the messages the front-end sends back.

Only new events travel. The core keeps the events of the current generation (an *epoch*: a new
``SessionStarted`` opens the next one) in :attr:`InspectorCore.log`. Each round's events are sent as one
``{"type": "events", "epoch", "start", "events"}`` message where ``start`` is the index of the first
event in the log. A view says which events it holds (``hello`` with ``epoch`` and ``have``) when it
appears, and gets only the events after those; a view that sees a gap in ``start`` asks again the same
way. The whole history is sent only to a view that holds none of it (a new view, or a page reload).

No UI library is imported here, so the core is tested without a browser.
"""

from __future__ import annotations

import importlib.resources
import threading
from typing import Any, Callable, Iterable

from ..errors import KnobError, SessionStateError, SpecvizError, StrategyError
from ..events import Event
from ..strategies import strategy_names, strategy_schema

#: Events per message when a view catches up on a backlog.
CHUNK = 2000
#: Event kinds that close a batch: everything up to them is sent at once.
_FLUSH_KINDS = frozenset({"telemetry", "finished", "session_started"})

_PLOTLY_SOURCE: str | None = None
#: The name under which the hosts ask :func:`static_text` for the assembled front-end module.
INSPECTOR_JS = "inspector.js"


def plotly_source() -> str:
    """The plotly.js bundle shipped inside the ``plotly`` Python package (read once, cached)."""
    global _PLOTLY_SOURCE
    if _PLOTLY_SOURCE is None:
        try:
            _PLOTLY_SOURCE = (importlib.resources.files("plotly") / "package_data" / "plotly.min.js").read_text(
                encoding="utf-8")
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


def group_rounds(events: Iterable[Event]) -> list[list[Event]]:
    """Events split at round boundaries, in order (group 0 holds the start and round-0 changes)."""
    groups: list[list[Event]] = []
    cur: list[Event] = []
    idx = None
    for ev in events:
        if cur and (ev.round != idx or ev.kind == "session_started"):
            groups.append(cur)
            cur = []
        idx = ev.round
        cur.append(ev)
    if cur:
        groups.append(cur)
    return groups


class InspectorCore:
    """Drives a :class:`~specviz.session.Session` (or replays recorded events) for one inspector.

    ``send(msg)`` delivers a JSON-serialisable message to every view of the host widget. Exactly one of
    ``session`` and ``events`` is given: a live session, or the recorded events of a replay.
    ``draft_models`` lists draft GGUF paths the form offers for the ``draft`` strategy's ``draft_model``.
    """

    def __init__(self, send: Callable[[dict], None], session: Any = None, *, events: list[Event] | None = None,
                 prompt: str | None = None, draft_models: Iterable[str] | None = None) -> None:
        if (session is None) == (events is None):
            raise ValueError("give either a session or recorded events")
        self._send = send
        self.session = session
        self.replay = events is not None
        self._lock = threading.RLock()
        self.epoch = 0
        self.log: list[dict] = []
        self._unsent = 0  # index in log of the first event not yet sent
        self.messages_sent = 0
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        self._pending: str | None = None
        self._error: str | None = None
        self._last_state: dict | None = None
        self._prompt_text = prompt
        #: Draft GGUF paths offered in the form's ``draft_model`` field (free text is accepted too).
        self.draft_models: list[str] = [str(p) for p in (draft_models or [])]
        self._unsubscribe: Callable[[], None] | None = None
        if self.replay:
            self._groups = group_rounds(events or [])
            self._pos = 0
            # show the whole recording; Reset rewinds, Step/Run/Play walk it again
            for g in self._groups:
                for ev in g:
                    self._on_event(ev, flush=False)
            self._pos = len(self._groups)
            self._unsent = len(self.log)
        else:
            for ev in list(session.events):
                self._on_event(ev, flush=False)
            self._unsent = len(self.log)
            self._unsubscribe = session.subscribe(self._on_event)

    # -- event log -----------------------------------------------------------------------------------
    def _on_event(self, ev: Event, flush: bool = True) -> None:
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
                self._flush()

    def _flush(self) -> None:
        with self._lock:
            if self._unsent >= len(self.log):
                return
            start = self._unsent
            events = self.log[start:]
            self._unsent = len(self.log)
            self._emit({"type": "events", "epoch": self.epoch, "start": start, "events": events})
            self._send_state()

    def _emit(self, msg: dict) -> None:
        self.messages_sent += 1
        self._send(msg)

    # -- state ---------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """True while a Run/Play worker is stepping."""
        w = self._worker
        return w is not None and w.is_alive()

    def state(self) -> dict:
        """What the controls show: running, finished, strategy, knobs, schema, pending change …"""
        if self.replay:
            started = next((e for e in self.log if e["kind"] == "session_started"), None)
            fin = next((e["reason"] for e in self.log if e["kind"] == "finished"), None)
            last_knobs = [e for e in self.log if e["kind"] == "knobs_changed"]
            strategy = last_knobs[-1]["strategy"] if last_knobs else (started or {}).get("strategy", "")
            knobs = last_knobs[-1]["knobs"] if last_knobs else (started or {}).get("knobs", {})
            try:
                schema = strategy_schema(strategy).to_list() if strategy else []
            except SpecvizError:
                schema = [{"name": k, "type": type(v).__name__, "default": v, "help": "", "lo": None, "hi": None,
                           "choices": [], "flag": ""} for k, v in knobs.items()]
            at_end = self._pos >= len(self._groups)
            return {"type": "state", "replay": True, "running": self.running, "finished": fin if at_end else None,
                    "can_step": not at_end, "can_reset": True, "can_control": False, "strategy": strategy,
                    "knobs": knobs, "schema": schema, "strategies": [strategy] if strategy else [],
                    "pending": None, "epoch": self.epoch, "error": self._error}
        s = self.session
        started = bool(getattr(s, "started", False))
        return {"type": "state", "replay": False, "running": self.running, "finished": s.finished,
                "can_step": started and s.finished is None, "can_reset": started or bool(self._prompt_text),
                "can_control": True, "strategy": s.strategy if started else "", "knobs": dict(s.knobs),
                "schema": s.schema() if started else [], "strategies": strategy_names(),
                "pending": self._pending, "prompt": self._prompt(), "epoch": self.epoch, "error": self._error,
                "draft_models": list(self.draft_models)}

    def _send_state(self, force: bool = False) -> None:
        st = self.state()
        if force or st != self._last_state:
            self._last_state = st
            self._emit(st)

    def _prompt(self) -> str:
        if self._prompt_text is not None:
            return self._prompt_text
        started = next((e for e in self.log if e["kind"] == "session_started"), None)
        return "".join(started["prompt_pieces"]) if started else ""

    # -- messages from the front-end -----------------------------------------------------------------
    def handle(self, msg: Any) -> None:
        """Dispatch one message a view sent."""
        if not isinstance(msg, dict):
            return
        t = msg.get("type")
        if t == "hello":
            self._hello(msg)
        elif t == "cmd":
            self._command(msg)
        elif t == "configure":
            self.configure_from_form(msg.get("strategy"), msg.get("knobs") or {})
        elif t == "schema":
            self._schema(msg.get("strategy"))
        elif t == "plotly":
            try:
                self._emit({"type": "plotly", "source": plotly_source()})
            except SpecvizError as e:
                self._emit({"type": "notice", "level": "error", "text": str(e)})

    def _hello(self, msg: dict) -> None:
        with self._lock:
            have = msg.get("have") if msg.get("epoch") == self.epoch else 0
            if not isinstance(have, int) or have < 0 or have > self._unsent:
                have = 0
            self._send_state(force=True)
            for start in range(have, self._unsent, CHUNK):
                end = min(start + CHUNK, self._unsent)
                self._emit({"type": "events", "epoch": self.epoch, "start": start, "events": self.log[start:end]})

    def _schema(self, strategy: Any) -> None:
        try:
            knobs = strategy_schema(str(strategy)).to_list()
            self._emit({"type": "schema", "strategy": strategy, "knobs": knobs})
        except SpecvizError as e:
            self._emit({"type": "schema", "strategy": strategy, "knobs": [], "error": str(e)})

    def _command(self, msg: dict) -> None:
        cmd = msg.get("cmd")
        if cmd == "pause":
            self.pause()
            return
        if self.running:
            return
        if cmd == "step":
            self._start_worker(1)
        elif cmd == "run":
            n = msg.get("n")
            self._start_worker(n if isinstance(n, int) and n > 0 else 1)
        elif cmd == "play":
            self._start_worker(None)
        elif cmd == "reset":
            try:
                self.reset(msg.get("prompt"), msg.get("max_tokens"))
            except SpecvizError as e:
                self._error = str(e)
                self._send_state()

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
        if self.replay:
            with self._lock:
                if self._pos >= len(self._groups):
                    return False
                for ev in self._groups[self._pos]:
                    self._on_event(ev, flush=False)
                self._pos += 1
                self._flush()
            return True
        s = self.session
        if not getattr(s, "started", False) or s.finished is not None:
            return False
        try:
            s.step()
        except SessionStateError:
            return False
        except SpecvizError as e:
            self._error = str(e)
            return False
        finally:
            self._flush()
        self._error = None
        return True

    def _start_worker(self, n: int | None) -> None:
        with self._lock:
            if self.running:
                return
            self._stop.clear()
            self._worker = threading.Thread(target=self._work, args=(n,), name="specviz-inspector-play", daemon=True)
            self._worker.start()
            self._send_state()

    def _work(self, n: int | None) -> None:
        i = 0
        try:
            while (n is None or i < n) and not self._stop.is_set():
                if not self._step_once():
                    break
                i += 1
        except Exception as e:  # keep the widget alive and say what happened
            self._error = f"{type(e).__name__}: {e}"
        finally:
            self._worker = None
            self._send_state()

    def play(self) -> None:
        """Step in a background thread until finished or paused."""
        self._start_worker(None)

    def run(self, n: int) -> None:
        """Step ``n`` rounds in a background thread."""
        self._start_worker(n)

    def pause(self) -> None:
        """Stop the background stepping after the current round (returns at once)."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the background stepping has stopped."""
        w = self._worker
        if w is not None:
            w.join(timeout)

    def reset(self, prompt: str | None = None, max_tokens: int | None = None) -> None:
        """Start the generation again (same prompt unless ``prompt`` is given); rewinds a replay."""
        self.pause()
        self.wait()
        if self.replay:
            with self._lock:
                self._pos = 0
                self._step_once()
            self._send_state()
            return
        s = self.session
        started = next((e for e in self.log if e["kind"] == "session_started"), None)
        if prompt is None or prompt == "" or prompt == self._prompt():
            if started is not None:
                src: Any = list(started["prompt_tokens"])
            elif self._prompt_text:
                src = self._prompt_text
            else:
                raise SessionStateError("nothing to reset: give a prompt")
        else:
            src = prompt
            self._prompt_text = prompt
        kwargs: dict[str, Any] = {}
        if started is not None:
            kwargs = {"temperature": started.get("temperature", 0.0), "seed": started.get("seed")}
        mt = max_tokens or (started or {}).get("max_tokens") or 128
        strategy = s.strategy if getattr(s, "started", False) else (started or {}).get("strategy", "prompt-lookup")
        knobs = dict(s.knobs) if getattr(s, "started", False) else {}
        self._pending = None
        self._error = None
        s.start(src, max_tokens=int(mt), strategy=strategy, **kwargs, **knobs)
        self._flush()
        self._send_state()

    def configure_from_form(self, strategy: Any, raw: dict) -> dict[str, str]:
        """Validate form values (strings from the inputs) knob by knob and queue them on the session.

        Returns ``{knob: message}`` for every refused value (empty on success). A refused form changes
        nothing; the errors are sent to the views to show beside their fields.
        """
        errors: dict[str, str] = {}
        general = None
        if self.replay:
            errors["strategy"] = "a recorded session cannot be reconfigured"
            self._emit({"type": "knob_errors", "errors": errors, "general": errors["strategy"]})
            return errors
        strategy = strategy or self.session.strategy
        try:
            schema = strategy_schema(str(strategy))
        except StrategyError as e:
            errors["strategy"] = str(e)
            self._emit({"type": "knob_errors", "errors": errors, "general": "nothing changed"})
            return errors
        by_name = {k.name: k for k in schema.knobs}
        values: dict[str, Any] = {}
        for name, value in raw.items():
            knob = by_name.get(name)
            if knob is None:
                errors[name] = f"unknown knob {name!r} for strategy {strategy!r}"
                continue
            if isinstance(value, str) and value.strip() == "" and knob.type is not str:
                errors[name] = f"knob {name!r}: a value is required; expected {knob.describe_range()}"
                continue
            try:
                values[name] = knob.convert(value)
            except KnobError as e:
                errors[name] = str(e)
        if not errors:
            try:
                self.session.configure(strategy=strategy, **values)
            except KnobError as e:
                errors[e.knob if e.knob in by_name else "strategy"] = str(e)
        if errors:
            general = "nothing changed: " + "; ".join(errors.values())
            self._emit({"type": "knob_errors", "errors": errors, "general": general})
            return errors
        changed = {k: v for k, v in values.items() if self.session.knobs.get(k) != v}
        desc = ", ".join(f"{k}={v}" for k, v in changed.items())
        parts = ([strategy] if strategy != self.session.strategy else []) + ([desc] if desc else [])
        self._pending = " ".join(parts) or None
        self._emit({"type": "knob_errors", "errors": {}, "general": None if parts else "no change"})
        self._send_state()
        return {}

    def close(self) -> None:
        """Stop stepping and unsubscribe from the session."""
        self.pause()
        self.wait(5)
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
