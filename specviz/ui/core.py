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

Nothing a view sends is trusted. :meth:`InspectorCore.handle` checks every message (its type, its fields'
types and ranges, and whether it makes sense now: a command while a Run/Play worker is stepping, a step
after the generation finished, a reconfiguration of a recording …). A message it refuses changes
nothing, neither in the session nor in the log, and is answered with a ``notice`` of level ``error``
that the page shows; refused knob-form values come back as ``knob_errors`` beside their fields, and an
unknown strategy in a ``schema`` request as a ``schema`` message with an ``error``. No exception
escapes :meth:`~InspectorCore.handle`.

No UI library is imported here, so the core is tested without a browser.
"""

from __future__ import annotations

import importlib.resources
import logging
import threading
from typing import Any, Callable, Iterable

from ..decoding.events import Event
from ..errors import KnobError, SessionStateError, SpecvizError, StrategyError
from ..strategies import strategy_names, strategy_schema
from .workbench import MESSAGE_TYPES as WORKBENCH_TYPES
from .workbench import Workbench

#: Events per message when a view catches up on a backlog.
CHUNK = 2000
#: Event kinds that close a batch: everything up to them is sent at once.
_FLUSH_KINDS = frozenset({"telemetry", "finished", "session_started", "rewound"})
#: The most rounds one ``run`` command may ask for (the Run field's maximum).
MAX_RUN = 100_000
#: The longest generation a ``reset`` command may ask for.
MAX_TOKENS = 1_000_000
#: Bounds on a ``configure`` message: knobs per message, and characters in a knob name or text value.
MAX_KNOBS = 64
MAX_TEXT = 4096
#: The message types a view may send (the workbench's too, see :mod:`specviz.ui.workbench`), and the commands
#: of a ``cmd`` message.
MESSAGE_TYPES = ("hello", "cmd", "configure", "schema", "plotly") + WORKBENCH_TYPES
COMMANDS = ("step", "run", "play", "pause", "reset")

_log = logging.getLogger(__name__)


class MessageError(SpecvizError):
    """A message from a view was refused: malformed, out of range, or out of order. Nothing changed."""


def _show(value: Any, limit: int = 60) -> str:
    """A short repr for error texts (a huge value must not flood the page)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _int_field(msg: dict, name: str, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """``msg[name]`` as an int in ``[lo, hi]``, or :class:`MessageError` naming the field and the range."""
    value = msg.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            return value
    if lo is None and hi is None:
        expected = "an integer"
    else:
        expected = f"an integer in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
    got = "nothing" if name not in msg else _show(value)
    raise MessageError(f"{where}: {name!r} must be {expected}; got {got}")


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
    """Drives a :class:`~specviz.decoding.session.Session` (or replays recorded events) for one inspector.

    ``send(msg)`` delivers a JSON-serialisable message to every view of the host widget. Exactly one of
    ``session`` and ``events`` is given: a live session, or the recorded events of a replay.
    ``draft_models`` lists draft GGUF paths the form offers for the ``draft`` strategy's ``draft_model``.
    """

    def __init__(
        self,
        send: Callable[[dict], None],
        session: Any = None,
        *,
        events: list[Event] | None = None,
        prompt: str | None = None,
        draft_models: Iterable[str] | None = None,
        presets: list[dict[str, Any]] | None = None,
    ) -> None:
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
        self._state_lock = threading.RLock()  # see _send_state
        self._state_seq = 0  # the last seq taken
        self._sent_seq = 0  # the seq of the last state sent
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
        #: Rewind, branch and compare lanes, diagnosis, advice, presets and files (:mod:`specviz.ui.workbench`).
        self.workbench = Workbench(self, presets)

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
                schema = [
                    {
                        "name": k,
                        "type": type(v).__name__,
                        "default": v,
                        "help": "",
                        "lo": None,
                        "hi": None,
                        "choices": [],
                        "flag": "",
                    }
                    for k, v in knobs.items()
                ]
            at_end = self._pos >= len(self._groups)
            return {
                "type": "state",
                "replay": True,
                "running": self.running,
                "finished": fin if at_end else None,
                "can_step": not at_end,
                "can_reset": True,
                "can_control": False,
                "strategy": strategy,
                "knobs": knobs,
                "schema": schema,
                "strategies": [strategy] if strategy else [],
                "pending": None,
                "epoch": self.epoch,
                "error": self._error,
            }
        s = self.session
        is_started = bool(getattr(s, "started", False))
        return {
            "type": "state",
            "replay": False,
            "running": self.running,
            "finished": s.finished,
            "can_step": is_started and s.finished is None,
            "can_reset": is_started or bool(self._prompt_text),
            "can_control": True,
            "strategy": s.strategy if is_started else "",
            "knobs": dict(s.knobs),
            "schema": s.schema() if is_started else [],
            "strategies": strategy_names(),
            "pending": self._pending,
            "prompt": self._prompt(),
            "epoch": self.epoch,
            "error": self._error,
            "draft_models": list(self.draft_models),
        }

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
            self._emit({**st, "seq": seq})

    def _prompt(self) -> str:
        if self._prompt_text is not None:
            return self._prompt_text
        started = next((e for e in self.log if e["kind"] == "session_started"), None)
        return "".join(started["prompt_pieces"]) if started else ""

    # -- messages from the front-end -----------------------------------------------------------------
    def handle(self, msg: Any) -> None:
        """Dispatch one message a view sent; a refused message changes nothing and is answered with an error.

        No exception escapes: the message's reason for refusal (or, for a failure nobody foresaw, the
        exception) goes to the page as a ``notice`` of level ``error``.
        """
        try:
            self._dispatch(msg)
        except MessageError as e:
            self._notice("error", str(e))
        except Exception as e:  # keep the widget alive and say what happened
            _log.exception("specviz inspector: a message from the page failed: %s", _show(msg, 200))
            self._notice("error", f"the message {_show(msg)} failed: {type(e).__name__}: {e}")

    def _notice(self, level: str, text: str) -> None:
        self._emit({"type": "notice", "level": level, "text": text})

    def _dispatch(self, msg: Any) -> None:
        if not isinstance(msg, dict):
            raise MessageError(f"ignored a message that is not an object: {_show(msg)}")
        t = msg.get("type")
        if t == "hello":
            self._hello(msg)
        elif t == "cmd":
            self._command(msg)
        elif t == "configure":
            self._configure_message(msg)
        elif t == "schema":
            strategy = msg.get("strategy")
            if not isinstance(strategy, str):
                raise MessageError(f"schema: 'strategy' must be a strategy name; got {_show(strategy)}")
            self._schema(strategy)
        elif t in WORKBENCH_TYPES:
            self.workbench.handle(msg)
        elif t == "plotly":
            try:
                self._emit({"type": "plotly", "source": plotly_source()})
            except SpecvizError as e:
                self._notice("error", str(e))
        else:
            raise MessageError(f"ignored a message of unknown type {_show(t)}; known types: {', '.join(MESSAGE_TYPES)}")

    def _hello(self, msg: dict) -> None:
        epoch = _int_field(msg, "epoch", "hello")
        have = _int_field(msg, "have", "hello", lo=0)
        with self._lock:
            if epoch == self.epoch and have > self._unsent:
                raise MessageError(
                    f"hello: the page says it holds {have} events of epoch {epoch}, but only "
                    f"{self._unsent} were sent; reload the page"
                )
            start = have if epoch == self.epoch else 0  # a view of another epoch gets this one from its start
            self._send_state(force=True)
            for first in range(start, self._unsent, CHUNK):
                end = min(first + CHUNK, self._unsent)
                self._emit({"type": "events", "epoch": self.epoch, "start": first, "events": self.log[first:end]})
        self.workbench.hello()

    def _schema(self, strategy: str) -> None:
        try:
            knobs = strategy_schema(strategy).to_list()
            self._emit({"type": "schema", "strategy": strategy, "knobs": knobs})
        except SpecvizError as e:
            self._emit({"type": "schema", "strategy": strategy, "knobs": [], "error": str(e)})

    def _command(self, msg: dict) -> None:
        cmd = msg.get("cmd")
        if not isinstance(cmd, str) or cmd not in COMMANDS:
            raise MessageError(f"cmd: unknown command {_show(cmd)}; known commands: {', '.join(COMMANDS)}")
        if cmd == "pause":  # always allowed: stops a worker after its round, does nothing otherwise
            self.pause()
            return
        # every field is checked before anything happens
        n = _int_field(msg, "n", "run", lo=1, hi=MAX_RUN) if cmd == "run" and msg.get("n") is not None else 1
        prompt, max_tokens, request = self._reset_fields(msg) if cmd == "reset" else (None, None, {})
        if self.running:
            raise MessageError(f"{cmd}: rounds are running; Pause first (or wait for the run to end)")
        if cmd == "reset":
            try:
                self.reset(prompt, max_tokens, **request)
            except SpecvizError as e:
                raise MessageError(f"reset: {e}") from e
            return
        self._check_can_step(cmd)
        if not self._start_worker(n if cmd == "run" else 1 if cmd == "step" else None):
            raise MessageError(f"{cmd}: rounds are running; Pause first (or wait for the run to end)")

    @staticmethod
    def _reset_fields(msg: dict) -> tuple[str | None, int | None, dict[str, Any]]:
        prompt = msg.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise MessageError(f"reset: 'prompt' must be text; got {_show(prompt)}")
        max_tokens = msg.get("max_tokens")
        if max_tokens is not None:
            max_tokens = _int_field(msg, "max_tokens", "reset", lo=1, hi=MAX_TOKENS)
        # the sampling settings and the request's form (ranges are checked by Session.start)
        request: dict[str, Any] = {}
        for name, kind in (("temperature", "number"), ("top_p", "number"), ("top_k", "int"), ("seed", "int")):
            v = msg.get(name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind == "int" and not isinstance(v, int)):
                raise MessageError(
                    f"reset: {name!r} must be {'an integer' if kind == 'int' else 'a number'}; got {_show(v)}"
                )
            request[name] = v
        stop = msg.get("stop")
        if stop is not None:
            if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop) or len(stop) > 16:
                raise MessageError(f"reset: 'stop' must be a list of at most 16 texts; got {_show(stop)}")
            request["stop"] = stop
        chat = msg.get("chat")
        if chat is not None:
            if not isinstance(chat, bool):
                raise MessageError(f"reset: 'chat' must be true or false; got {_show(chat)}")
            request["chat"] = chat
        return prompt, max_tokens, request

    def _check_can_step(self, cmd: str) -> None:
        """Refuse a step/run/play that would do nothing: no session yet, or nothing left to run."""
        if self.replay:
            if self._pos >= len(self._groups):
                raise MessageError(f"{cmd}: the recording is at its end; Reset rewinds it")
            return
        s = self.session
        if not getattr(s, "started", False):
            raise MessageError(f"{cmd}: no generation has started; Reset starts one with the prompt")
        if s.finished is not None:
            raise MessageError(f"{cmd}: the generation has finished ({s.finished}); Reset starts it again")

    def _configure_message(self, msg: dict) -> None:
        strategy = msg.get("strategy")
        if strategy is not None and not isinstance(strategy, str):
            raise MessageError(f"configure: 'strategy' must be a strategy name; got {_show(strategy)}")
        knobs = msg.get("knobs")
        if knobs is None:
            knobs = {}
        if not isinstance(knobs, dict):
            raise MessageError(f"configure: 'knobs' must be an object of knob values; got {_show(knobs)}")
        if len(knobs) > MAX_KNOBS:
            raise MessageError(f"configure: {len(knobs)} knobs in one message; a strategy has far fewer")
        for name, value in knobs.items():
            if len(name) > MAX_TEXT or (isinstance(value, str) and len(value) > MAX_TEXT):
                raise MessageError(f"configure: knob {_show(name)} or its value is longer than {MAX_TEXT} characters")
        if not self.replay and not getattr(self.session, "started", False):
            raise MessageError("configure: no generation has started yet; Reset starts one, then change its knobs")
        self.configure_from_form(strategy, knobs)  # refused values come back as knob_errors beside the fields

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

    def _start_worker(self, n: int | None) -> bool:
        """Step ``n`` rounds (``None``: to the end) in a background thread; False when one already runs."""
        with self._lock:
            if self.running:
                return False
            self._stop.clear()
            self._worker = threading.Thread(target=self._work, args=(n,), name="specviz-inspector-play", daemon=True)
            self._worker.start()
            self._send_state()
            return True

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
    ) -> None:
        """Start the generation again (same prompt unless ``prompt`` is given); rewinds a replay.

        The sampling settings (``temperature``, ``top_k``, ``top_p``, ``seed``), the stop strings and
        ``chat`` (send the prompt as a user message through the model's chat template) default to the
        current generation's."""
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
        st = started or {}
        kwargs: dict[str, Any] = {k: st[k] for k in ("temperature", "top_k", "top_p", "seed") if k in st}
        kwargs.update(
            {
                k: v
                for k, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("seed", seed))
                if v is not None
            }
        )
        kwargs["stop"] = list(st.get("stop") or []) if stop is None else [x for x in stop if x]
        was_chat = bool(st.get("messages"))
        if chat if chat is not None else was_chat:
            if src is not prompt and was_chat:  # the same request again
                kwargs["messages"] = [dict(m) for m in st["messages"]]
                if st.get("chat_template") not in (None, "model"):
                    kwargs["chat_template"] = st["chat_template"]
            else:
                text = prompt if isinstance(prompt, str) and prompt else self._prompt()
                kwargs["messages"] = [{"role": "user", "content": text}]
            src = None
        mt = max_tokens or st.get("max_tokens") or 128
        strategy = s.strategy if getattr(s, "started", False) else st.get("strategy", "prompt-lookup")
        knobs = dict(s.knobs) if getattr(s, "started", False) else {}
        s.start(src, max_tokens=int(mt), strategy=strategy, **kwargs, **knobs)  # refused: nothing changed
        if isinstance(src, str):
            self._prompt_text = src
        self._pending = None
        self._error = None
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
        self.workbench.close()
