"""A live batched run as an inspector's source (:class:`BatchSource`): the page's Step, Run and Play (and
``Inspector.step`` / ``run`` / ``play``) run the :class:`~specviz.decoding.batch.BatchRun`'s steps, one step
a round.

The stream is laid out as a batched recording's replay (:mod:`specviz.ui.batch_stream`): the *followed*
request's own events (the smallest request id that ran a round: the first submitted that started) and, after
each step, that step's ``batch_step`` event. The run's requests are submitted before or between steps through
the run itself; nothing on the page configures, resets or rewinds them (the controls other than stepping are
read-only), and the workbench's analyses read the whole run (:meth:`BatchSource.batched_events`: every
request's events in submission order, then the steps, as a recording of it holds them).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..decoding.events import Event
from ..errors import SessionStateError
from .batch_stream import batched_groups, followed_request
from .sources import EventSink, FormResult

if TYPE_CHECKING:
    from ..decoding.batch import BatchRun

__all__ = ["BatchSource"]


class BatchSource:
    """The steps of a live :class:`~specviz.decoding.batch.BatchRun` (see the module docstring)."""

    def __init__(self, run: BatchRun) -> None:
        self._run = run
        self._sink: EventSink | None = None
        self._lock = threading.RLock()
        self._own_sent = 0  # the followed request's events the sink holds
        self._steps_sent = 0  # the run's batch_step events the sink holds

    @property
    def session(self) -> None:
        """None: no one session is the inspector's to control."""
        return None

    @property
    def run(self) -> BatchRun:
        """The batched run shown."""
        return self._run

    def _request_events(self) -> list[list[Event]]:
        """Every request's own events so far, in submission order (finished ones from their results)."""
        run = self._run
        out: dict[int, list[Event]] = {rid: list(res.events) for rid, res in run.results.items()}
        for slot, req in enumerate(run.busy):
            if req is not None and req.id not in out:
                out[req.id] = list(run.slots[slot].events)
        return [out[rid] for rid in sorted(out) if out[rid]]

    def batched_events(self) -> list[Event]:
        """The whole run so far: every request's events in submission order, then the steps."""
        with self._lock:
            return [e for evs in self._request_events() for e in evs] + list(self._run.events)

    def _followed_events(self) -> list[Event]:
        """The followed request's own events so far (none before it ran a round)."""
        run = self._run
        rid = followed_request(run.events)
        if rid is None:
            return []
        if rid in run.results:
            return list(run.results[rid].events)
        slot = next((k for k, req in enumerate(run.busy) if req is not None and req.id == rid), None)
        return list(run.slots[slot].events) if slot is not None else []

    def backlog(self) -> list[Event]:
        """What the run has done so far, laid out as its replay is."""
        with self._lock:
            events = self.batched_events()
            self._own_sent = len(self._followed_events())
            self._steps_sent = len(self._run.events)
            return [e for g in batched_groups(events) for e in g] if self._steps_sent else []

    def attach(self, sink: EventSink) -> Callable[[], None]:
        """Each step's events go to ``sink``, one batch per step."""
        self._sink = sink

        def detach() -> None:
            self._sink = None

        return detach

    def step_round(self) -> bool:
        """One step of the run (False when no request is queued or running); its events to the sink."""
        with self._lock:
            if not self._run.pending:
                return False
            self._run.step()
            own = self._followed_events()
            new = own[self._own_sent :] + list(self._run.events[self._steps_sent :])
            self._own_sent, self._steps_sent = len(own), len(self._run.events)
            if self._sink is not None:
                for ev in new:
                    self._sink.record(ev, flush=False)
                self._sink.flush()
        return True

    def step_refusal(self) -> str | None:
        """Every request has finished."""
        return None if self._run.pending else "every request of the batched run has finished; submit more to it"

    def reset(
        self, log: Sequence[Mapping[str, Any]], prompt: str | None, max_tokens: int | None, **request: Any
    ) -> list[str]:
        """Refused: a batched run's requests are submitted to the run itself."""
        raise SessionStateError("a batched run cannot be reset from the inspector; submit requests to the run")

    def started_on(self, prompt: str) -> None:
        """Nothing: requests are submitted to the run."""

    def configure_refusal(self) -> str | None:
        """A batched run's requests keep the settings they were submitted with."""
        return "a batched run's requests keep the settings they were submitted with"

    def configure(self, strategy: str | None, raw: Mapping[str, Any]) -> FormResult:
        """Refused (see :meth:`configure_refusal`)."""
        text = self.configure_refusal() or ""
        return FormResult({"strategy": text}, text)

    def state_fields(self, log: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The followed request's strategy and knobs; stepping while a request is queued or running."""
        started = next((e for e in log if e["kind"] == "session_started"), None) or {}
        pending = self._run.pending
        n = len(self._run.results)
        return {
            "replay": False,
            "finished": None if pending or not n else f"all {n} requests",
            "can_step": pending,
            "can_reset": False,
            "can_control": False,
            "strategy": started.get("strategy", ""),
            "knobs": started.get("knobs", {}),
            "schema": [],
            "strategies": [started["strategy"]] if started.get("strategy") else [],
        }

    def main_events(self, log: Sequence[Mapping[str, Any]]) -> list[Event]:
        """The followed request's events and the steps, as shown."""
        from ..decoding.events import event_from_dict

        return [event_from_dict(dict(d)) for d in log]
