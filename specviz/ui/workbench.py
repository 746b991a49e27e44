"""The inspector's debugging workbench (host-independent): rewind, branch and compare lanes, diagnosis,
advice, presets, and snapshot / recording files, on top of the inspector core (:class:`WorkbenchHost`).

The core routes the workbench's message types here (:meth:`Workbench.handlers`; their shapes are declared in
``widgets/protocol.json`` and checked before they arrive); what depends on the session's state is checked
here, and a refused message changes nothing (it comes back as an error notice, as the core's own messages
do).

The second lane is a :meth:`~specviz.decoding.session.Session.fork` of the inspector's session: it shares the
loaded models and is closed with the inspector. Its rounds run in the core's one worker, beside the main
lane's (:meth:`WorkbenchHost.start_rounds`).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any, Callable, Protocol

from ..analysis.advise import advise
from ..analysis.compare import Comparison, Lane
from ..analysis.diagnose import diagnose
from ..decoding.batch_cost import BatchCostTable
from ..decoding.events import Event, Finished, Rewound, TelemetryEvent
from ..errors import SpecvizError
from .knob_form import convert_form, parse_knob_text
from .parallel_advice import parallel_part
from .protocol import MessageError, field, show
from .sources import InspectedSession
from .tasks import BYTES_PER_UNIT
from .uploads import Uploads

#: Raw bytes per download part (base64 makes each message about 4/3 of it).
CHUNK_BYTES = 512 * 1024
#: At most this often (seconds) the comparison is recomputed while rounds stream in.
COMPARE_EVERY = 0.5
#: Recorded events an analysis (diagnosis, advice) reads per unit of work charged.
EVENTS_PER_UNIT = 64
#: The most knob values a lane message may carry (its text form is bounded like its object form).
_MAX_LANE_KNOBS = field("lane", "knobs", "configure").max_items or 64


class WorkbenchHost(Protocol):
    """What the workbench needs of its inspector core (:class:`~specviz.ui.core.InspectorCore`)."""

    @property
    def session(self) -> InspectedSession | None:
        """The live session (``None`` for a recording)."""
        ...

    @property
    def running(self) -> bool:
        """True while the core's worker steps."""
        ...

    def emit(self, msg: dict) -> None:
        """Send a message to every view."""
        ...

    def main_events(self) -> list[Event]:
        """The events of the generation shown."""
        ...

    def batched_events(self) -> list[Event] | None:
        """A batched run's whole recording when that is what is shown (None: one generation)."""
        ...

    def pause(self) -> None:
        """Stop the worker after its round."""
        ...

    def wait(self, timeout: float | None = None) -> None:
        """Block until the worker stopped."""
        ...

    def start_rounds(
        self,
        n: int | None,
        *,
        also: Callable[[], bool] | None = None,
        done: Callable[[], None] | None = None,
        name: str = ...,
    ) -> bool:
        """Step rounds in the core's worker (see :meth:`~specviz.ui.core.InspectorCore.start_rounds`)."""
        ...

    def after_rewind(self) -> None:
        """The session was rewound."""
        ...

    def after_start(self, prompt: str) -> None:
        """A generation was started on ``prompt`` (a preset)."""
        ...

    def reload(self) -> None:
        """The session was replaced wholesale (a restore)."""
        ...

    def charge(self, units: int) -> None:
        """What a message cost (tokens decoded or copied, or 16 KiB moved, per unit)."""
        ...

    def in_background(self, name: str, job: Callable[[], None], msg: Any = None) -> None:
        """Run ``job`` as the page message ``name`` would run (off the IO loop for a served page)."""
        ...

    def wait_room(self) -> bool:
        """Wait until the page has taken most of what was sent to it; False when it went away."""
        ...


class Workbench:
    """The workbench of one inspector core (see the module docstring).

    ``presets`` are named starting points offered as buttons: dictionaries with ``name``, ``title``,
    ``prompt``, ``strategy``, ``knobs`` and optionally ``max_tokens``, ``temperature``, ``seed``, ``stop``.
    """

    def __init__(
        self,
        core: WorkbenchHost,
        presets: list[dict[str, Any]] | None = None,
        *,
        batch_cost: BatchCostTable | None = None,
    ) -> None:
        self.core = core
        #: The batch-cost table of the advice under load (given, or measured on the first Advise of a batched run).
        self.batch_cost = batch_cost
        self.presets = [dict(p) for p in (presets or [])]
        self.lane: InspectedSession | None = None  # the second lane's session (a fork)
        self.comparison: dict[str, Any] | None = None
        self.diagnosis: dict[str, Any] | None = None
        self.advice: dict[str, Any] | None = None
        #: The snapshot uploads of the page (bounded: :mod:`specviz.ui.uploads`).
        self.uploads = Uploads()
        self._last_compare = 0.0
        self._lock = threading.RLock()
        self._unsubscribe: Callable[[], None] | None = None
        if core.session is not None:
            self._unsubscribe = core.session.subscribe(self._on_main_event)

    # -- plumbing ------------------------------------------------------------------------------------
    def handlers(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        """The page messages the workbench handles, by type (their fields already checked)."""
        return {
            "rewind": self._rewind_message,
            "lane": self._lane_message,
            "diagnose": lambda msg: self._refresh_diagnosis(force=True),
            "advise": lambda msg: self._advise_message(),
            "preset": self._preset_message,
            "file": self._file_message,
        }

    def handle(self, msg: dict[str, Any]) -> None:
        """Dispatch one workbench message (its fields already checked against the declaration)."""
        self.handlers()[msg["type"]](msg)

    def _send(self, msg: dict[str, Any]) -> None:
        self.core.emit(msg)

    def hello(self) -> None:
        """A view appeared: send it what the workbench shows."""
        if self.presets:
            self._send({"type": "presets", "presets": self._preset_list()})
        if self.comparison is not None:
            self._send({"type": "comparison", "data": self.comparison, "lane": self._lane_state()})
        if self.diagnosis is not None:
            self._send({"type": "diagnosis", "data": self.diagnosis})
        if self.advice is not None:
            self._send({"type": "advice", "data": self.advice})

    def _live(self, what: str) -> InspectedSession:
        s = self.core.session
        if s is None:
            raise MessageError(f"{what}: a recording cannot be {what}; open the inspector on a live session")
        if not s.started:
            raise MessageError(f"{what}: no generation has started; Reset starts one")
        return s

    def _idle(self, what: str) -> None:
        if self.core.running:
            raise MessageError(f"{what}: rounds are running; Pause first (or wait for the run to end)")

    def _on_main_event(self, ev: Event) -> None:
        if isinstance(ev, Finished):
            self._refresh_diagnosis()
        if self.lane is not None and isinstance(ev, (TelemetryEvent, Finished, Rewound)):
            now = time.monotonic()
            if not isinstance(ev, TelemetryEvent) or now - self._last_compare >= COMPARE_EVERY:
                self._last_compare = now
                self._send_comparison()

    # -- rewind --------------------------------------------------------------------------------------
    def _rewind_message(self, msg: dict[str, Any]) -> None:
        r, p = msg.get("round"), msg.get("position")
        s = self._live("rewound")
        self._idle("rewind")
        self.core.charge(len(s.history))  # the drafter is rebuilt on the cut history
        try:
            s.rewind(r, position=p) if r is not None else s.rewind(position=p)
        except SpecvizError as e:
            raise MessageError(f"rewind: {e}") from e
        self.core.after_rewind()

    def rewind(self, round: int | None = None, *, position: int | None = None) -> None:
        """Rewind the inspector's session (Python API; the views follow)."""
        self.core.pause()
        self.core.wait()
        s = self.core.session
        if s is None:
            raise SpecvizError("a recording cannot be rewound; open the inspector on a live session")
        s.rewind(round, position=position)
        self.core.after_rewind()

    # -- lanes ---------------------------------------------------------------------------------------
    def _lane_state(self) -> dict[str, Any]:
        b = self.lane
        if b is None:
            return {"open": False}
        return {
            "open": True,
            "strategy": b.strategy,
            "knobs": dict(b.knobs),
            "finished": b.finished,
            "rounds": b.round_index,
            "running": self.core.running,
        }

    def _send_comparison(self) -> None:
        if self.lane is None:
            self.comparison = None
            self._send({"type": "comparison", "data": None, "lane": {"open": False}})
            return
        a = Lane.from_events(self.core.main_events(), "A")
        c = Comparison(a, Lane.from_events(list(self.lane.events), "B"))
        self.comparison = c.to_dict()
        self._send({"type": "comparison", "data": self.comparison, "lane": self._lane_state()})

    @staticmethod
    def _knobs_field(msg: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        knobs = msg.get("knobs") or {}
        if isinstance(knobs, str):
            knobs = parse_knob_text(knobs)
            if len(knobs) > _MAX_LANE_KNOBS:
                raise MessageError(f"lane: 'knobs' must be at most {_MAX_LANE_KNOBS} knob values")
        return msg.get("strategy") or None, knobs

    def _lane_message(self, msg: dict[str, Any]) -> None:
        cmd = msg["cmd"]
        if cmd == "close":
            self.close_lane()
            return
        s = self._live("branched")
        self._idle(f"lane {cmd}")
        try:
            if cmd == "branch":
                self.branch(msg.get("round"))
            elif cmd == "compare":
                strategy, knobs = self._knobs_field(msg)
                self.compare(strategy, **convert_form(strategy or s.strategy, knobs).raise_first())
            else:
                lane = self.lane
                if lane is None:
                    raise MessageError("no second lane; Branch or Compare opens one")
                if cmd == "configure":
                    strategy, knobs = self._knobs_field(msg)
                    lane.configure(strategy, **convert_form(strategy or lane.strategy, knobs).raise_first())
                    self._send_comparison()
                else:  # step, run
                    self._run_both(1 if cmd == "step" else None)
        except SpecvizError as e:  # the session's refusals and the lane's own, said as the lane command's
            raise MessageError(f"lane {cmd}: {e}") from e

    def branch(self, round: int | None = None) -> InspectedSession:
        """Open the second lane: a fork of the session now (or at ``round``, by rewinding the fork)."""
        self.core.charge(len(self._main().history))  # the fork copies every cache
        fork = self._main().fork()
        try:
            if round is not None:
                fork.rewind(round)
        except Exception:
            fork.close()
            raise
        self._adopt_lane(fork)
        self._send_comparison()
        return fork

    def compare(self, strategy: str | None = None, /, run: bool = True, **knobs: Any) -> InspectedSession:
        """Open the second lane from the start (round 0) with ``strategy`` and ``knobs`` and, with ``run``,
        run both lanes to their end in the background (the core's ``wait`` blocks until done)."""
        self.core.charge(len(self._main().history))  # the fork copies every cache
        fork = self._main().fork()
        try:
            fork.rewind(0)
            fork.configure(strategy, **knobs)
        except Exception:
            fork.close()
            raise
        self._adopt_lane(fork)
        self._send_comparison()
        if run:
            self._run_both(None)
        return fork

    def _main(self) -> InspectedSession:
        s = self.core.session
        if s is None:
            raise SpecvizError("a recording cannot be branched; open the inspector on a live session")
        return s

    def _adopt_lane(self, fork: InspectedSession) -> None:
        old, self.lane = self.lane, fork
        if old is not None:
            old.close()

    def close_lane(self) -> None:
        """Close the second lane."""
        self.core.pause()
        self.core.wait()
        if self.lane is not None:
            self.lane.close()
            self.lane = None
        self._send_comparison()

    def _step_lane(self) -> bool:
        """One round of the second lane; False when it has none to run."""
        b = self.lane
        if b is None or b.finished is not None:
            return False
        b.step()
        return True

    def _run_both(self, n: int | None) -> None:
        """Step the main lane and the second one alternately (``n`` rounds each, None: to their end) in the
        core's worker, so the toolbar shows it running and Pause stops it."""
        lanes = "specviz-workbench-lanes"
        if not self.core.start_rounds(n, also=self._step_lane, done=self._send_comparison, name=lanes):
            raise MessageError("lane: rounds are running; Pause first")

    # -- diagnosis and advice --------------------------------------------------------------------------
    def _refresh_diagnosis(self, force: bool = False) -> None:
        try:
            cost = getattr(self.core.session, "cost_model", None)
            events = self.core.main_events()
            if force:  # a page asked: the analysis grows with the events
                self.core.charge(1 + len(events) // EVENTS_PER_UNIT)
            self.diagnosis = diagnose(events, cost=cost).to_dict()
        except Exception as e:  # a diagnosis must never break the session's own flow
            if force:
                raise MessageError(f"diagnose: {type(e).__name__}: {e}") from e
            return
        self._send({"type": "diagnosis", "data": self.diagnosis})

    def _advise_message(self) -> None:
        cost = None
        s = self.core.session
        if s is not None and s.started:
            self._idle("advise")
            measured = s.cost_model is None
            cost = s.verify_cost()
            if measured and cost is not None:  # every batch size timed twice, and a warm-up
                self.core.charge(1 + 2 * sum(cost.sizes))
        batched = self.core.batched_events()
        # a batched run is advised on every request's rounds, as `specviz advise FILE` reads its recording
        main = batched if batched is not None else self.core.main_events()
        lanes = [main] + ([list(self.lane.events)] if self.lane is not None else [])
        self.core.charge(1 + sum(len(x) for x in lanes) // EVENTS_PER_UNIT)
        # a live session's curve is measured on this machine (now or earlier in the session): fresh, as in
        # `specviz run --json`, so recorded times slower than it beyond noise are scored with it
        advice = advise(
            *lanes, cost=cost, scale_to_rounds=cost is not None, fresh=cost is not None
        ).to_dict()  # both lanes' rounds, each folded on its own
        if batched is not None:  # and under load: speedup against concurrency (specviz.ui.parallel_advice)
            part, self.batch_cost = parallel_part(batched, self.batch_cost, charge=self.core.charge)
            advice.update(part)
        self.advice = advice
        self._send({"type": "advice", "data": self.advice})

    # -- presets -------------------------------------------------------------------------------------
    def _preset_list(self) -> list[dict[str, Any]]:
        return [
            {"name": p["name"], "title": p.get("title", p["name"]), "description": p.get("description", "")}
            for p in self.presets
        ]

    def _preset_message(self, msg: dict[str, Any]) -> None:
        name = msg["name"]
        preset = next((p for p in self.presets if p["name"] == name), None)
        if preset is None:
            names = ", ".join(p["name"] for p in self.presets) or "none"
            raise MessageError(f"preset: unknown preset {show(name)}; known presets: {names}")
        self._live("preset")
        self._idle("preset")
        self.apply_preset(preset)

    def apply_preset(self, preset: dict[str, Any]) -> None:
        """Start the session on a preset (prompt, strategy, knobs, sampling), replacing the generation."""
        s = self._main()
        kwargs = {k: preset[k] for k in ("temperature", "top_k", "top_p", "seed", "stop") if k in preset}
        try:
            s.start(
                preset["prompt"],
                int(preset.get("max_tokens", 128)),
                preset.get("strategy", "prompt-lookup"),
                **kwargs,
                **dict(preset.get("knobs") or {}),
            )
        except SpecvizError as e:
            raise MessageError(f"preset {preset['name']}: {e}") from e
        finally:
            self.core.charge(len(s.history) if s.started else 1)  # the prompt was decoded
        self.core.after_start(preset["prompt"])

    # -- files ---------------------------------------------------------------------------------------
    def _download(self, name: str, mime: str, data: bytes) -> None:
        """Send ``data`` as download parts, each once the page has taken most of the previous ones."""
        file_id = f"{int(time.time() * 1000)}"
        count = max(1, -(-len(data) // CHUNK_BYTES))
        self.core.charge(1 + len(data) // BYTES_PER_UNIT)
        for i in range(count):
            if i and not self.core.wait_room():  # the page stopped taking them (or went away): stop sending
                return
            part = base64.b64encode(data[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES]).decode()
            self._send(
                {
                    "type": "download",
                    "id": file_id,
                    "name": name,
                    "mime": mime,
                    "index": i,
                    "count": count,
                    "data": part,
                }
            )

    def _file_message(self, msg: dict[str, Any]) -> None:
        cmd = msg["cmd"]
        if cmd == "record":
            text = "".join(
                json.dumps(e.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n"
                for e in self.core.main_events()
            )
            self._download("specviz-recording.jsonl", "application/jsonl", text.encode())
            return
        s = self._live("saved" if cmd == "snapshot" else "restored")
        self._idle(f"file {cmd}")
        if cmd == "snapshot":
            try:
                blob = s.snapshot()
            except SpecvizError as e:
                raise MessageError(f"snapshot: {e}") from e
            self._download("specviz-snapshot.bin", "application/octet-stream", blob)
            return
        self._restore_part(s, msg)

    def _restore_part(self, s: InspectedSession, msg: dict[str, Any]) -> None:
        """Keep one part of an upload and acknowledge it (the page then sends the next); the last one starts
        the restore (background work of a served page)."""
        fid, count = msg["id"], msg["count"]
        try:
            nxt, blob = self.uploads.add(fid, msg["index"], count, msg["data"])
        except MessageError as e:  # the page stops sending this upload
            self._send({"type": "upload", "id": fid, "next": msg["index"], "count": count, "error": str(e)})
            raise
        self._send({"type": "upload", "id": fid, "next": nxt, "count": count})
        if blob is not None:
            self.core.in_background("file restore", lambda: self._restore_blob(s, blob), {"type": "file", "id": fid})

    def _restore_blob(self, s: InspectedSession, blob: bytes) -> None:
        self._idle("file restore")
        self.core.charge(1 + len(blob) // BYTES_PER_UNIT)
        try:
            s.restore_into(blob)
        except SpecvizError as e:
            raise MessageError(f"restore: {e}") from e
        self.reload_views()

    def reload_views(self) -> None:
        """After the session was replaced wholesale (a restore): a new epoch holding its events."""
        self.core.reload()
        self._refresh_diagnosis()

    def close(self) -> None:
        """Close the second lane and stop listening to the session."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.uploads.close()
        if self.lane is not None:
            self.lane.close()
            self.lane = None
