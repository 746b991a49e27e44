"""The sessions of a served inspector: taking turns, capped in number, parked when idle, naming no paths.

:class:`ManagedSession` stands in for a :class:`~specviz.decoding.session.Session` wherever the inspector expects
one (:class:`~specviz.ui.core.InspectorCore` drives it unchanged) and adds what a server with many pages
needs:

* every round, and every ``start`` (its prompt is a decode), runs inside a turn of the process's
  :class:`~specviz.server.scheduler.RoundScheduler`, so one llama.cpp decode runs at a time;
* :meth:`ManagedSession.release` parks an idle session: its state goes into a snapshot
  (:meth:`Session.snapshot`) and its llama.cpp contexts are freed; the next action restores it into a
  fresh context (:meth:`Session.restore_into`) and the page sees nothing but the pause;
* a page picks draft models by name from the server's :class:`~specviz.server.catalog.DraftCatalog`, never
  by path, and the events it is sent name the models by file name, not by path;
* an unusable draft model is reported as what is wrong with it, never with the file's bytes (the full
  message goes to the server's log).

:class:`SessionPool` holds the managed sessions of the pages: at most ``max_sessions`` at once, and a
thread that parks the ones idle for longer than ``idle_timeout`` seconds.

No UI library is imported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from ..decoding.events import Event, KnobsChanged, SessionStarted, TelemetryEvent, event_from_dict
from ..decoding.snapshot import unpack, with_knobs_mapped
from ..errors import (
    KnobError,
    ModelError,
    ModelFormatError,
    ModelNotFoundError,
    SnapshotError,
    VocabularyMismatchError,
)
from ..models.draft_cache import DraftModelCache
from .catalog import DraftCatalog
from .scheduler import RoundScheduler

_log = logging.getLogger(__name__)


class SharedDraftModels(DraftModelCache):
    """One cache of loaded draft models for every session of the process (each file is mapped once).

    Sessions close their own cache when they close; this one outlives them (:meth:`close` does nothing,
    :meth:`close_all` frees the models when the server stops).
    """

    def __init__(self, target: Any) -> None:
        super().__init__(target)
        self._lock = threading.Lock()

    def get(self, path: Any) -> Any:
        """The draft model at ``path`` (loaded and checked once; see :class:`DraftModelCache`)."""
        with self._lock:
            return super().get(path)

    def close(self) -> None:
        """Nothing: the models stay loaded for the other sessions."""

    def close_all(self) -> None:
        """Free every loaded draft model."""
        with self._lock:
            super().close()


def safe_model_error(err: ModelError, name: object) -> KnobError:
    """What a page is told about a draft model that cannot be used: what is wrong, never the file's bytes."""
    if isinstance(err, VocabularyMismatchError):
        what = "does not share the target's vocabulary"
    elif isinstance(err, ModelNotFoundError):
        what = "is missing on the server"
    elif isinstance(err, ModelFormatError):
        what = "is not a usable GGUF file"
    else:
        what = "could not be loaded"
    _log.warning("specviz serve: draft model %r refused: %s", name, err)
    return KnobError(
        f"knob 'draft_model': the draft model {name!r} {what}; pick another one (the server's log says more)",
        knob="draft_model",
        value=None,
    )


class ManagedSession:
    """A :class:`~specviz.decoding.session.Session` made by ``make_session()`` that takes turns, parks when idle
    and names no server paths (see the module docstring). It has the session's API.

    ``scheduler`` (optional) grants the turns; ``catalog`` lists the draft models a page may pick;
    ``drafts`` is the process's :class:`SharedDraftModels` (optional); ``clock`` measures idleness.
    """

    def __init__(
        self,
        make_session: Callable[[], Any],
        *,
        scheduler: RoundScheduler | None = None,
        catalog: DraftCatalog | None = None,
        drafts: SharedDraftModels | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make_session
        self._scheduler = scheduler
        self.catalog = catalog if catalog is not None else DraftCatalog()
        self._drafts = drafts
        self._clock = clock
        self._lock = threading.RLock()
        self._subscribers: list[Callable[[Event], None]] = []
        self._parked: bytes | None = None
        self._deferred: list[tuple[str | None, dict[str, Any]]] = []  # configure() calls made while parked
        self._cancel_deferred = False
        #: True while the session is parked (no llama.cpp context); the next action restores it.
        self.released = False
        self.closed = False
        #: How often the session was parked and brought back.
        self.releases = 0
        self.restores = 0
        self._inner = self._new_inner()
        self._model_name = Path(str(self._inner.model.path)).name
        #: The events of the current generation, as pages are sent them (paths replaced by names).
        self.events: list[Event] = [self._redact(e) for e in self._inner.events]
        self.last_active = clock()

    # -- the wrapped session -------------------------------------------------------------------------
    def _new_inner(self) -> Any:
        s = self._make()
        if self._drafts is not None:
            s.draft_models.close()
            s.draft_models = self._drafts
        s.subscribe(self._forward)
        return s

    def _forward(self, ev: Event) -> None:
        ev = self._redact(ev)
        if ev.kind == "session_started":
            self.events = []
        self.events.append(ev)
        for cb in list(self._subscribers):
            cb(ev)

    def _redact(self, ev: Event) -> Event:
        """The event as a page sees it: the target by file name, draft models by catalog name."""
        if isinstance(ev, SessionStarted):
            return dataclasses.replace(
                ev,
                model=self._model_name if hasattr(self, "_model_name") else "",
                draft_model=self.catalog.name_for(ev.draft_model) if ev.draft_model else None,
                knobs=self._names(ev.knobs),
            )
        if isinstance(ev, KnobsChanged):
            return dataclasses.replace(ev, knobs=self._names(ev.knobs), previous_knobs=self._names(ev.previous_knobs))
        if isinstance(ev, TelemetryEvent) and "draft_model" in ev.data:
            return dataclasses.replace(ev, data=self._names(ev.data))
        return ev

    def _names(self, knobs: dict) -> dict:
        if not knobs or "draft_model" not in knobs:
            return knobs
        return {**knobs, "draft_model": self.catalog.name_for(knobs["draft_model"])}

    def _paths(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """A page's knob values with its draft-model choice turned into the catalogued path (or refused)."""
        if "draft_model" not in knobs:
            return knobs
        return {**knobs, "draft_model": self.catalog.path_for(knobs["draft_model"])}

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        if self._scheduler is None:
            yield
        else:
            with self._scheduler.turn(self):
                yield

    @contextlib.contextmanager
    def _llama_work(self) -> Iterator[None]:
        """Hold a turn and then the lock (always in this order, so two callers cannot wait on each other) and
        bring a parked session back: the only way anything here reaches a llama.cpp context. The idle clock
        is reset on entry (a call waiting for its turn is not idle), after a restore and on exit."""
        self._touch()
        with self._turn(), self._lock:
            self._touch()
            self._ensure_live()
            try:
                yield
            finally:
                self._touch()

    def _touch(self) -> None:
        self.last_active = self._clock()

    def _ensure_live(self) -> None:
        """Bring a parked session back (called with the lock held)."""
        if self.closed:
            raise ModelError("this page's session was closed by the server; reload the page")
        if not self.released:
            return
        new = self._new_inner()
        try:
            if self._parked is not None:
                new.restore_into(self._parked)
            for strategy, knobs in self._deferred:
                new.configure(strategy, **knobs)
            if self._cancel_deferred:
                new.cancel()
        except Exception:
            new.close()
            raise
        self._inner, self._parked, self._deferred, self._cancel_deferred = new, None, [], False
        self.released = False
        self.restores += 1
        self._touch()  # a restore can take a while: the idle clock starts after it

    # -- the session's API ---------------------------------------------------------------------------
    def start(self, prompt: Any, max_tokens: int = 128, strategy: str = "prompt-lookup", **kwargs: Any) -> Any:
        """:meth:`Session.start` in a turn (the prompt is a decode); ``draft_model`` is a catalog name."""
        kwargs = self._paths(kwargs)
        self._touch()
        with self._turn(), self._lock:
            if self.released:  # a new generation replaces the parked one: no need to restore it
                self._parked, self._deferred, self._cancel_deferred = None, [], False
            with self._llama_work():
                try:
                    return self._inner.start(prompt, max_tokens, strategy, **kwargs)
                except ModelError as e:
                    raise safe_model_error(e, self.catalog.name_for(kwargs.get("draft_model"))) from None

    def step(self) -> Any:
        """:meth:`Session.step` (one round) in a turn, restoring a parked session first."""
        with self._llama_work():
            try:
                return self._inner.step()
            except ModelError as e:
                raise safe_model_error(e, self.catalog.name_for(self._inner.knobs.get("draft_model"))) from None

    def run(self, max_rounds: int | None = None) -> list[Any]:
        """Step until the generation finishes (or ``max_rounds`` rounds), one turn per round."""
        rounds: list[Any] = []
        while self.finished is None and (max_rounds is None or len(rounds) < max_rounds):
            rounds.append(self.step())
        return rounds

    def configure(self, strategy: str | None = None, **knobs: Any) -> dict[str, Any]:
        """:meth:`Session.configure` (no decode, no turn); ``draft_model`` is a catalog name."""
        knobs = self._paths(knobs)
        with self._lock:
            self._touch()
            try:
                cfg = self._inner.configure(strategy, **knobs)  # a parked session still validates
            except ModelError as e:
                raise safe_model_error(e, self.catalog.name_for(knobs.get("draft_model"))) from None
            if self.released:
                self._deferred.append((strategy, knobs))
            return self._names(cfg)

    def cancel(self) -> None:
        """:meth:`Session.cancel`."""
        with self._lock:
            self._touch()
            self._inner.cancel()
            if self.released:
                self._cancel_deferred = True

    def snapshot(self) -> bytes:
        """:meth:`Session.snapshot` as a page may have it (a parked session is restored first): the target
        by file name and draft models by catalog name, no server path (:meth:`restore_into` maps them back)."""
        with self._llama_work():
            blob = self._inner.snapshot()
        # the recorded events and the rewind checkpoints name models too
        return with_knobs_mapped(
            blob, self._names, lambda e: self._redact(event_from_dict(e)).to_dict(), model=self._model_name
        )

    def restore_into(self, blob: bytes) -> None:
        """:meth:`Session.restore_into` for a snapshot a page brought: its draft models must be named as
        :meth:`snapshot` names them (catalog names); a path, or any name not on offer, is refused with
        :class:`~specviz.errors.SnapshotError` before anything is opened."""
        try:  # a rewind reconfigures with the checkpoints' knobs: they are mapped too
            blob = with_knobs_mapped(blob, self._paths)
        except KnobError as e:
            raise SnapshotError(f"the snapshot is refused: {e}") from None
        with self._llama_work():
            try:
                self._inner.restore_into(blob)
            except ModelError as e:
                knobs = unpack(blob)[0].get("knobs")
                name = self.catalog.name_for(knobs.get("draft_model") if isinstance(knobs, dict) else None)
                raise SnapshotError(f"the snapshot is refused: {safe_model_error(e, name)}") from None
            # the restored generation's events replace this one's (a restore publishes no events of its own)
            self.events = [self._redact(e) for e in self._inner.events]

    def fork(self) -> ManagedSession:
        """:meth:`Session.fork` (the workbench's second lane) as a managed session too: its rounds take
        turns with every other session's and its events name no server path. It is the page's own, so
        the pool neither counts nor parks it; the workbench closes it with the lane."""
        with self._llama_work():  # copying the caches is llama.cpp work
            child = self._inner.fork()
        return ManagedSession(
            lambda: child, scheduler=self._scheduler, catalog=self.catalog, drafts=self._drafts, clock=self._clock
        )

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every future event (as pages see them); returns the unsubscriber."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    # state read without waking a parked session (its Python attributes outlive its contexts)
    @property
    def started(self) -> bool:
        """True once a generation has started."""
        return bool(self._inner.started)

    @property
    def finished(self) -> str | None:
        """Why the generation finished, or ``None``."""
        return self._inner.finished

    @property
    def strategy(self) -> str:
        """The current strategy."""
        return self._inner.strategy

    @property
    def knobs(self) -> dict[str, Any]:
        """The current knobs (a draft model by its catalog name)."""
        return self._names(dict(self._inner.knobs))

    @property
    def tokens(self) -> list[int]:
        """Generated token ids."""
        return self._inner.tokens

    @property
    def history(self) -> list[int]:
        """Prompt and generated token ids."""
        return self._inner.history

    @property
    def round_index(self) -> int:
        """Rounds run in this generation."""
        return self._inner.round_index

    @property
    def model(self) -> Any:
        """The loaded target model."""
        return self._inner.model

    @property
    def pending(self) -> tuple[str, dict[str, Any]] | None:
        """The configuration queued for the next round boundary (a draft model by its catalog name)."""
        p = self._inner.generation.pending
        return (p[0], self._names(dict(p[1]))) if p else None

    @property
    def max_tokens(self) -> int:
        """The generation's token budget."""
        return self._inner.max_tokens

    @property
    def settings(self) -> Any:
        """The target context's settings (plain data: readable while parked; no llama.cpp call)."""
        return self._inner.settings

    def schema(self, strategy: str | None = None) -> list[dict[str, Any]]:
        """Knob descriptions (see :meth:`Session.schema`)."""
        return self._inner.schema(strategy)

    @staticmethod
    def strategies() -> list[str]:
        """Every strategy name."""
        from ..strategies import strategy_names

        return strategy_names()

    def telemetry_dict(self) -> dict[str, Any]:
        """Telemetry as a dictionary (a draft model by its catalog name)."""
        return self._names(self._inner.telemetry_dict())

    @property
    def cost_model(self) -> Any:
        """The verify-cost curve the cost policy measured (``None`` until then); read without waking."""
        return self._inner.cost_model

    def verify_cost(self) -> Any:
        """:meth:`Session.verify_cost` (the advisor's measurement decodes on the context) in a turn."""
        with self._llama_work():
            return self._inner.verify_cost()

    def rewind(self, round: int | None = None, *, position: int | None = None) -> Any:
        """:meth:`Session.rewind` in a turn (cutting the caches and rebuilding the drafter is llama.cpp work)."""
        with self._llama_work():
            return self._inner.rewind(round, position=position)

    # Nothing else of the wrapped session is handed out: its llama.cpp contexts (``ctx``, the drafter's) must
    # never be reached outside a turn and the lock, where the reaper could free them mid-call.

    # -- parking -------------------------------------------------------------------------------------
    def idle_seconds(self, now: float | None = None) -> float:
        """Seconds since the last action."""
        return (self._clock() if now is None else now) - self.last_active

    def release(self, idle_for: float | None = None) -> bool:
        """Park the session: snapshot its state and free its llama.cpp contexts, in a turn and with the lock.
        False when it is busy (a call holds the lock), already parked or closed, or — with ``idle_for`` —
        when it was used in the last ``idle_for`` seconds (checked again once the lock is held: an action that
        began after the reaper looked keeps its session); nothing changes then."""
        with self._turn():
            if not self._lock.acquire(blocking=False):
                return False
            try:
                return self._park(idle_for)
            finally:
                self._lock.release()

    def _park(self, idle_for: float | None) -> bool:
        """Park now (called with the turn and the lock held)."""
        if self.released or self.closed:
            return False
        if idle_for is not None and self.idle_seconds() <= idle_for:
            return False
        inner = self._inner
        self._parked = inner.snapshot() if inner.started and inner.drafter is not None else None
        inner.close()
        self.released = True
        self.releases += 1
        return True

    def close(self) -> None:
        """Free the session for good (its page went away)."""
        with self._lock:
            if not self.closed and not self.released:
                self._inner.close()
            self.closed = True
            self._parked = None
            self._subscribers.clear()


class SessionPool:
    """The managed sessions of the pages: at most ``max_sessions`` at once; those idle longer than
    ``idle_timeout`` seconds are parked by a background thread (:meth:`start_reaper`)."""

    def __init__(
        self,
        make_session: Callable[[], Any],
        *,
        max_sessions: int = 8,
        idle_timeout: float = 300.0,
        scheduler: RoundScheduler | None = None,
        catalog: DraftCatalog | None = None,
        drafts: SharedDraftModels | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1; got {max_sessions}")
        self._make = make_session
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.scheduler = scheduler if scheduler is not None else RoundScheduler()
        self.catalog = catalog if catalog is not None else DraftCatalog()
        self.drafts = drafts
        self._clock = clock
        self._lock = threading.Lock()
        self.sessions: list[ManagedSession] = []
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        #: Pages turned away because every session was in use.
        self.refused = 0

    def open(self) -> ManagedSession | None:
        """A new managed session, or ``None`` when ``max_sessions`` are open (the page shows "busy")."""
        with self._lock:
            if len(self.sessions) >= self.max_sessions:
                self.refused += 1
                return None
            ms = ManagedSession(
                self._make, scheduler=self.scheduler, catalog=self.catalog, drafts=self.drafts, clock=self._clock
            )
            self.sessions.append(ms)
            return ms

    def close(self, ms: ManagedSession) -> None:
        """Close a page's session and free its place."""
        ms.close()
        with self._lock:
            if ms in self.sessions:
                self.sessions.remove(ms)

    @property
    def live(self) -> int:
        """Sessions holding a llama.cpp context now (open and not parked)."""
        with self._lock:
            return sum(1 for s in self.sessions if not s.released)

    def release_idle(self, now: float | None = None) -> int:
        """Park every session idle for longer than ``idle_timeout``; returns how many were parked."""
        now = self._clock() if now is None else now
        with self._lock:
            idle = [s for s in self.sessions if not s.released and s.idle_seconds(now) > self.idle_timeout]
        return sum(1 for s in idle if s.release(idle_for=self.idle_timeout))

    def start_reaper(self, interval: float | None = None) -> None:
        """Park idle sessions in a background thread, every ``interval`` seconds (default: a quarter of
        ``idle_timeout``, at most 5 s)."""
        if self._reaper is not None:
            return
        period = interval if interval is not None else max(0.05, min(5.0, self.idle_timeout / 4))

        def loop() -> None:
            while not self._stop.wait(period):
                try:
                    self.release_idle()
                except Exception:  # keep parking the others; say what went wrong
                    _log.exception("specviz serve: parking an idle session failed")

        self._reaper = threading.Thread(target=loop, name="specviz-session-reaper", daemon=True)
        self._reaper.start()

    def close_all(self) -> None:
        """Stop the reaper and close every session."""
        self._stop.set()
        with self._lock:
            sessions, self.sessions = self.sessions, []
        for s in sessions:
            s.close()
