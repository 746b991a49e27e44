"""Where an inspector's rounds come from: a live session (:class:`LiveSource`) or a recording
(:class:`ReplaySource`), behind one small interface (:class:`Source`) that
:class:`~specviz.ui.core.InspectorCore` drives without knowing which it has.

:class:`InspectedSession` says what the inspector needs of a session; :class:`~specviz.decoding.session.Session`
and the server's :class:`~specviz.server.pool.ManagedSession` both have it.

No UI library is imported here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from ..decoding.events import Event, SessionStarted, event_from_dict
from ..errors import KnobError, SessionStateError, SpecvizError, StrategyError
from ..strategies import strategy_names, strategy_schema
from .batch_stream import batched_groups, is_batched
from .deployment import offers_settings, read_deployment, settings_state, start_with
from .knob_form import convert_form


@runtime_checkable
class InspectedSession(Protocol):
    """What the inspector and its workbench need of a session (see :class:`~specviz.decoding.session.Session`)."""

    @property
    def events(self) -> Sequence[Event]:
        """The current generation's events."""
        ...

    @property
    def started(self) -> bool:
        """True once a generation has started."""
        ...

    @property
    def finished(self) -> str | None:
        """Why the generation finished, or ``None``."""
        ...

    @property
    def strategy(self) -> str:
        """The current strategy."""
        ...

    @property
    def knobs(self) -> dict[str, Any]:
        """The current knobs."""
        ...

    @property
    def round_index(self) -> int:
        """Rounds run in this generation."""
        ...

    @property
    def history(self) -> list[int]:
        """Prompt and generated token ids."""
        ...

    @property
    def cost_model(self) -> Any:
        """The verify-cost curve the cost policy measured (``None`` until then)."""
        ...

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every future event; returns the unsubscriber."""
        ...

    def schema(self, strategy: str | None = None) -> list[dict[str, Any]]:
        """Knob descriptions of the strategy (the current one by default)."""
        ...

    def start(self, prompt: Any, max_tokens: int = 128, strategy: str = "prompt-lookup", **kwargs: Any) -> Any:
        """Begin a new generation (refused: nothing changes)."""
        ...

    def configure(self, strategy: str | None = None, **knobs: Any) -> dict[str, Any]:
        """Queue a strategy/knob change for the next round (refused: nothing changes)."""
        ...

    def step(self) -> Any:
        """Run one round."""
        ...

    def rewind(self, round: int | None = None, *, position: int | None = None) -> Any:
        """Go back to right after ``round`` (or to ``position`` tokens)."""
        ...

    def fork(self) -> InspectedSession:
        """A second, independent session at this point."""
        ...

    def snapshot(self) -> bytes:
        """The whole session state as bytes."""
        ...

    def restore_into(self, blob: bytes) -> None:
        """Replace the generation with a snapshot's."""
        ...

    def verify_cost(self) -> Any:
        """The verify-cost curve for the advisor (measured on the session's context when it has none)."""
        ...

    def close(self) -> None:
        """Free what the session holds."""
        ...


if TYPE_CHECKING:  # mypy checks here that a Session is an InspectedSession (the server's ManagedSession is
    # checked where the server hands one to the inspector)
    from ..decoding.session import Session

    def _a_session_is_inspected(s: Session) -> InspectedSession:
        return s


class EventSink(Protocol):
    """Where a source puts its events (the inspector core): ``record`` one, ``flush`` what is not sent yet."""

    def record(self, ev: Event, flush: bool = True) -> None:
        """Add ``ev`` to the log; with ``flush``, an event that closes a batch sends the batch."""
        ...

    def flush(self) -> None:
        """Send the events not sent yet."""
        ...


@dataclass(frozen=True)
class FormResult:
    """The outcome of a knob form: ``errors`` beside the fields (none: accepted), the ``general`` note, and the
    change now queued (``pending``, a short text; ``None`` for none)."""

    errors: dict[str, str]
    general: str | None
    pending: str | None = None


class Source(Protocol):
    """The rounds an inspector shows, live or recorded (see the module docstring)."""

    @property
    def session(self) -> InspectedSession | None:
        """The live session (``None`` for a recording)."""
        ...

    def backlog(self) -> list[Event]:
        """The events shown when the inspector opens (already sent to no view)."""
        ...

    def attach(self, sink: EventSink) -> Callable[[], None]:
        """From now on, new events go to ``sink``; returns the function that stops it."""
        ...

    def step_round(self) -> bool:
        """One round now; False when there is none to run. A :class:`~specviz.errors.SpecvizError` raised is
        the round's failure, shown to the page."""
        ...

    def step_refusal(self) -> str | None:
        """Why a step would do nothing now (``None``: it would run a round)."""
        ...

    def reset(
        self, log: Sequence[Mapping[str, Any]], prompt: str | None, max_tokens: int | None, **request: Any
    ) -> list[str]:
        """Start again (a new generation, or the recording from its start); refused: nothing changes. Returns
        the warnings for the page (a llama-server line's flags that are not honoured)."""
        ...

    def started_on(self, prompt: str) -> None:
        """A generation was started on ``prompt`` outside :meth:`reset` (a preset): Reset repeats it."""
        ...

    def configure_refusal(self) -> str | None:
        """Why a knob form cannot be taken now (``None``: it can)."""
        ...

    def configure(self, strategy: str | None, raw: Mapping[str, Any]) -> FormResult:
        """Validate form values knob by knob and queue them (a refused form changes nothing)."""
        ...

    def state_fields(self, log: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The fields of the page's ``state`` that the source decides (``log``: the events shown)."""
        ...

    def main_events(self, log: Sequence[Mapping[str, Any]]) -> list[Event]:
        """The events of the generation shown (for diagnosis, comparison and recordings)."""
        ...

    def batched_events(self) -> list[Event] | None:
        """A batched run's whole recording (every request's events and the steps), or None for one generation."""
        ...


def _first_started(log: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return next((e for e in log if e["kind"] == "session_started"), None)


def reset_grammar(
    grammar: str | None, json_schema: str | None, line_grammar: str | None, started: Mapping[str, Any]
) -> dict[str, str]:
    """The grammar keyword of a Reset's :meth:`~specviz.Session.start`: a ``json_schema`` given (not blank)
    stands instead of the grammar; else a ``grammar`` given; else a llama-server line's (``line_grammar``);
    else, where the page left ``grammar`` out (``None``; a form's blank field is ``''``: none), the shown
    generation's (``started``'s, as its other settings are kept). Checked by :meth:`~specviz.Session.start`
    (a grammar llama.cpp cannot parse, a schema its converter cannot convert: refused, nothing changed)."""
    if json_schema is not None and json_schema.strip():
        return {"json_schema": json_schema}
    if grammar is not None and grammar.strip():
        return {"grammar": grammar}
    if line_grammar is not None:
        return {"grammar": line_grammar}
    if grammar is None and started.get("grammar"):
        return {"grammar": started["grammar"]}
    return {}


class LiveSource:
    """The rounds of a live session. ``prompt`` starts it on Reset when it has not started; ``draft_models``
    are the draft GGUF paths the form offers for the ``draft`` strategy's ``draft_model``."""

    def __init__(
        self, session: InspectedSession, *, prompt: str | None = None, draft_models: Iterable[str] | None = None
    ) -> None:
        self._session = session
        #: The prompt Reset starts with (``None``: the shown generation's).
        self.prompt_text = prompt
        #: Draft GGUF paths offered in the form's ``draft_model`` field (free text is accepted too).
        self.draft_models: list[str] = [str(p) for p in (draft_models or [])]

    @property
    def session(self) -> InspectedSession:
        """The session shown."""
        return self._session

    def backlog(self) -> list[Event]:
        """The session's events so far."""
        return list(self._session.events)

    def attach(self, sink: EventSink) -> Callable[[], None]:
        """Subscribe ``sink`` to the session: every round's events, however the round was run."""
        return self._session.subscribe(sink.record)

    def step_round(self) -> bool:
        """:meth:`Session.step`, unless there is nothing to run (then False, as when the session refuses)."""
        s = self._session
        if not s.started or s.finished is not None:
            return False
        try:
            s.step()
        except SessionStateError:
            return False
        return True

    def step_refusal(self) -> str | None:
        """No generation yet, or it has finished."""
        s = self._session
        if not s.started:
            return "no generation has started; Reset starts one with the prompt"
        if s.finished is not None:
            return f"the generation has finished ({s.finished}); Reset starts it again"
        return None

    def prompt(self, log: Sequence[Mapping[str, Any]]) -> str:
        """The prompt shown: the one given, else the shown generation's."""
        if self.prompt_text is not None:
            return self.prompt_text
        started = _first_started(log)
        return "".join(started["prompt_pieces"]) if started else ""

    def reset(
        self, log: Sequence[Mapping[str, Any]], prompt: str | None, max_tokens: int | None, **request: Any
    ) -> list[str]:
        """Start the generation again (the same prompt unless ``prompt`` is given). The sampling settings
        (``temperature``, ``top_k``, ``top_p``, ``seed``), the stop strings and ``chat`` (send the prompt as a
        user message through the model's chat template) default to the shown generation's; the grammar is
        :func:`reset_grammar`'s (a ``json_schema`` or ``grammar`` given, else the line's, else the shown one's).

        The deployment (:mod:`specviz.ui.deployment`): ``context`` (``flash_attn``, ``cache_type_k``,
        ``cache_type_v``, ``n_ctx``, ``n_batch``, ``n_ubatch``, ``n_threads``; a blank one keeps its setting)
        or ``server_args`` (a whole llama-server command line: its strategy, knobs and settings, its sampling
        where the form gives none) creates the context anew first. Returns the line's flags not honoured."""
        s = self._session
        started = _first_started(log)
        if prompt is None or prompt == "" or prompt == self.prompt(log):
            if started is not None:
                src: Any = list(started["prompt_tokens"])
            elif self.prompt_text:
                src = self.prompt_text
            else:
                raise SessionStateError("nothing to reset: give a prompt")
        else:
            src = prompt
        st = started or {}
        kwargs: dict[str, Any] = {k: st[k] for k in ("temperature", "top_k", "top_p", "seed") if k in st}
        kwargs.update({k: request[k] for k in ("temperature", "top_k", "top_p", "seed") if request.get(k) is not None})
        stop = request.get("stop")
        kwargs["stop"] = list(st.get("stop") or []) if stop is None else [x for x in stop if x]
        was_chat = bool(st.get("messages"))
        chat = request.get("chat")
        if chat if chat is not None else was_chat:
            if src is not prompt and was_chat:  # the same request again
                kwargs["messages"] = [dict(m) for m in st["messages"]]
                if st.get("chat_template") not in (None, "model"):
                    kwargs["chat_template"] = st["chat_template"]
            else:
                text = prompt if isinstance(prompt, str) and prompt else self.prompt(log)
                kwargs["messages"] = [{"role": "user", "content": text}]
            src = None
        mt = max_tokens or st.get("max_tokens") or 128
        strategy = s.strategy if s.started else st.get("strategy", "prompt-lookup")
        knobs = dict(s.knobs) if s.started else {}
        deployment = read_deployment(s, request.get("context"), request.get("server_args"))
        if deployment.strategy is not None:
            strategy, knobs = deployment.strategy, dict(deployment.knobs or {})
        # a line's sampling stands where the form gives none (as llama-server's flags are a request's defaults)
        kwargs.update({k: v for k, v in deployment.sampling.items() if request.get(k) is None})
        if deployment.chat_template and "messages" in kwargs and "chat_template" not in kwargs:
            kwargs["chat_template"] = deployment.chat_template
        mt = max_tokens or deployment.n_predict or mt
        kwargs.update(reset_grammar(request.get("grammar"), request.get("json_schema"), deployment.grammar, st))
        start = dict(prompt=src, max_tokens=int(mt), strategy=strategy, **kwargs, **knobs)
        if deployment.context and offers_settings(s):
            start_with(s, deployment.context, start)  # the context made anew (refused: nothing changed)
        else:
            s.start(**start)  # refused: nothing changed
        if isinstance(src, str):
            self.prompt_text = src
        return list(deployment.warnings)

    def started_on(self, prompt: str) -> None:
        """Reset starts ``prompt`` from now on."""
        self.prompt_text = prompt

    def configure_refusal(self) -> str | None:
        """Knobs change a generation: none has started yet."""
        if not self._session.started:
            return "no generation has started yet; Reset starts one, then change its knobs"
        return None

    def configure(self, strategy: str | None, raw: Mapping[str, Any]) -> FormResult:
        """Convert the form (:func:`~specviz.ui.knob_form.convert_form`) and queue it on the session."""
        s = self._session
        strategy = strategy or s.strategy
        try:
            form = convert_form(str(strategy), raw)
        except StrategyError as e:
            return FormResult({"strategy": str(e)}, "nothing changed")
        errors = dict(form.errors)
        if not errors:
            try:
                s.configure(strategy=strategy, **form.values)
            except KnobError as e:
                errors[e.knob if e.knob in form.knobs else "strategy"] = str(e)
        if errors:
            return FormResult(errors, "nothing changed: " + "; ".join(errors.values()))
        changed = {k: v for k, v in form.values.items() if s.knobs.get(k) != v}
        desc = ", ".join(f"{k}={v}" for k, v in changed.items())
        parts = ([strategy] if strategy != s.strategy else []) + ([desc] if desc else [])
        return FormResult({}, None if parts else "no change", " ".join(parts) or None)

    def state_fields(self, log: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The session's strategy, knobs and schema, what may be done, the prompt and the drafts offered."""
        s = self._session
        is_started = s.started
        return {
            "replay": False,
            "finished": s.finished,
            "can_step": is_started and s.finished is None,
            "can_reset": is_started or bool(self.prompt_text),
            "can_control": True,
            "strategy": s.strategy if is_started else "",
            "knobs": dict(s.knobs),
            "schema": s.schema() if is_started else [],
            "strategies": strategy_names(),
            "prompt": self.prompt(log),
            "draft_models": list(self.draft_models),
            **(settings_state(s) if offers_settings(s) else {}),
        }

    def main_events(self, log: Sequence[Mapping[str, Any]]) -> list[Event]:
        """The session's own events."""
        return list(self._session.events)

    def batched_events(self) -> None:
        """None: a live session is one generation."""
        return None


def group_rounds(events: Iterable[Event]) -> list[list[Event]]:
    """Events split at round boundaries, in order (group 0 holds the start and round-0 changes)."""
    groups: list[list[Event]] = []
    cur: list[Event] = []
    idx = None
    for ev in events:
        if cur and (ev.round != idx or isinstance(ev, SessionStarted)):
            groups.append(cur)
            cur = []
        idx = ev.round
        cur.append(ev)
    if cur:
        groups.append(cur)
    return groups


def _schema_of(strategy: str, knobs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A recorded strategy's knob descriptions; for a strategy this version does not know, one plain entry
    per recorded knob."""
    try:
        return strategy_schema(strategy).to_list() if strategy else []
    except SpecvizError:
        return [
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


class ReplaySource:
    """The rounds of a recording: shown whole at first; Reset rewinds it, Step/Run/Play walk it again. A batched
    run's recording (one holding ``batch_step`` events) is walked step by step, laid out by
    :func:`~specviz.ui.batch_stream.batched_groups`."""

    def __init__(self, events: Iterable[Event]) -> None:
        recording = list(events)
        # a batched run is shown as one request's rounds beside the lanes of every step (ui/batch_stream.py)
        self._batched = recording if is_batched(recording) else None
        self._groups = batched_groups(recording) if self._batched is not None else group_rounds(recording)
        self._pos = len(self._groups)
        self._sink: EventSink | None = None
        self._lock = threading.RLock()

    @property
    def session(self) -> None:
        """None: a recording has no session."""
        return None

    @property
    def position(self) -> int:
        """How many rounds of the recording (group 0: the start) are shown."""
        return self._pos

    def backlog(self) -> list[Event]:
        """The whole recording."""
        return [ev for g in self._groups for ev in g]

    def attach(self, sink: EventSink) -> Callable[[], None]:
        """Steps put their round's events into ``sink``, each round sent as one batch."""
        self._sink = sink

        def detach() -> None:
            self._sink = None

        return detach

    def step_round(self) -> bool:
        """Show the next recorded round (one events message)."""
        with self._lock:
            if self._pos >= len(self._groups) or self._sink is None:
                return False
            for ev in self._groups[self._pos]:
                self._sink.record(ev, flush=False)
            self._pos += 1
            self._sink.flush()
        return True

    def step_refusal(self) -> str | None:
        """At the recording's end."""
        if self._pos >= len(self._groups):
            return "the recording is at its end; Reset rewinds it"
        return None

    def reset(
        self, log: Sequence[Mapping[str, Any]], prompt: str | None, max_tokens: int | None, **request: Any
    ) -> list[str]:
        """Rewind to the recording's start (whatever the prompt and settings); no warnings."""
        with self._lock:
            self._pos = 0
            self.step_round()
        return []

    def started_on(self, prompt: str) -> None:
        """Nothing: a recording is never started anew."""

    def configure_refusal(self) -> str | None:
        """A form is answered (with its refusal beside the fields, by :meth:`configure`)."""
        return None

    def configure(self, strategy: str | None, raw: Mapping[str, Any]) -> FormResult:
        """Refused: a recording cannot be reconfigured."""
        text = "a recorded session cannot be reconfigured"
        return FormResult({"strategy": text}, text)

    def state_fields(self, log: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The recorded strategy and knobs (the latest change shown); nothing to control; stepping until the end."""
        started = _first_started(log)
        fin = next((e["reason"] for e in log if e["kind"] == "finished"), None)
        last_knobs = [e for e in log if e["kind"] == "knobs_changed"]
        strategy = last_knobs[-1]["strategy"] if last_knobs else (started or {}).get("strategy", "")
        knobs = last_knobs[-1]["knobs"] if last_knobs else (started or {}).get("knobs", {})
        at_end = self._pos >= len(self._groups)
        return {
            "replay": True,
            "finished": fin if at_end else None,
            "can_step": not at_end,
            "can_reset": True,
            "can_control": False,
            "strategy": strategy,
            "knobs": knobs,
            "schema": _schema_of(strategy, knobs),
            "strategies": [strategy] if strategy else [],
        }

    def main_events(self, log: Sequence[Mapping[str, Any]]) -> list[Event]:
        """The events shown, read back from the log."""
        return [event_from_dict(dict(d)) for d in log]

    def batched_events(self) -> list[Event] | None:
        """The whole recording when it holds a batched run's steps (the stream shows one request of it)."""
        return list(self._batched) if self._batched is not None else None
