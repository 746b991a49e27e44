"""The inspector's debugging workbench (host-independent): rewind, branch and compare lanes, diagnosis,
advice, presets, and snapshot / recording files, on top of :class:`~specviz.ui.core.InspectorCore`.

The core routes the workbench's message types here (:data:`MESSAGE_TYPES`); every field is checked and a
refused message changes nothing (it comes back as an error notice, as the core's own messages do).

JS → Py
    ``rewind {round}`` or ``{position}``; ``lane {cmd, ...}`` with ``cmd`` one of ``branch`` (a second lane
    from the session's current point, or from ``round``), ``compare`` (a second lane from the start with
    ``strategy`` and ``knobs``, then both run to their end), ``configure`` (``strategy``, ``knobs``: the
    second lane's next rounds), ``step`` (one round of each lane), ``run`` (both to their end) and
    ``close``; ``diagnose {}``; ``advise {}``; ``preset {name}``; ``file {cmd}`` with ``cmd`` one of
    ``snapshot`` and ``record`` (downloads), ``restore`` (an uploaded snapshot, in ``chunks`` parts: ``id``,
    ``index``, ``count``, ``data`` base64).
Py → JS
    ``comparison {data, lane}`` (:meth:`specviz.analysis.compare.Comparison.to_dict` and the second lane's
    state), ``diagnosis {data}``, ``advice {data}``, ``presets {presets}``, ``download {id, name, mime,
    index, count, data}`` (base64 parts of a file to save).

The second lane is a :meth:`~specviz.decoding.session.Session.fork` of the inspector's session: it shares the
loaded models and is closed with the inspector.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from ..decoding.events import Event, event_from_dict
from ..errors import SpecvizError

if TYPE_CHECKING:
    from .core import InspectorCore

#: Message types the workbench handles.
MESSAGE_TYPES = ("rewind", "lane", "diagnose", "advise", "preset", "file")
LANE_COMMANDS = ("branch", "compare", "configure", "step", "run", "close")
FILE_COMMANDS = ("snapshot", "record", "restore")
#: Raw bytes per download / upload part (base64 makes each message about 4/3 of it).
CHUNK_BYTES = 512 * 1024
#: The largest snapshot an upload may bring.
MAX_UPLOAD = 1 << 30
#: At most this often (seconds) the comparison is recomputed while rounds stream in.
COMPARE_EVERY = 0.5


def _message_error(text: str) -> Exception:
    from .core import MessageError

    return MessageError(text)


class Workbench:
    """The workbench of one :class:`~specviz.ui.core.InspectorCore` (see the module docstring).

    ``presets`` are named starting points offered as buttons: dictionaries with ``name``, ``title``,
    ``prompt``, ``strategy``, ``knobs`` and optionally ``max_tokens``, ``temperature``, ``seed``, ``stop``.
    """

    def __init__(self, core: InspectorCore, presets: list[dict[str, Any]] | None = None) -> None:
        self.core = core
        self.presets = [dict(p) for p in (presets or [])]
        self.lane: Any = None  # the second lane's session (a fork)
        self.comparison: dict[str, Any] | None = None
        self.diagnosis: dict[str, Any] | None = None
        self.advice: dict[str, Any] | None = None
        self._uploads: dict[str, list[str | None]] = {}
        self._last_compare = 0.0
        self._lock = threading.RLock()
        self._unsubscribe = None
        if core.session is not None:
            self._unsubscribe = core.session.subscribe(self._on_main_event)

    # -- plumbing ------------------------------------------------------------------------------------
    def _send(self, msg: dict[str, Any]) -> None:
        self.core._emit(msg)

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

    def _events(self) -> list[Event]:
        """The main lane's events: the session's, or the replayed recording's."""
        if self.core.session is not None:
            return list(self.core.session.events)
        return [event_from_dict(d) for d in self.core.log]

    def _live(self, what: str) -> Any:
        s = self.core.session
        if s is None or self.core.replay:
            raise _message_error(f"{what}: a recording cannot be {what}; open the inspector on a live session")
        if not getattr(s, "started", False):
            raise _message_error(f"{what}: no generation has started; Reset starts one")
        return s

    def _idle(self, what: str) -> None:
        if self.core.running:
            raise _message_error(f"{what}: rounds are running; Pause first (or wait for the run to end)")

    def _on_main_event(self, ev: Event) -> None:
        if ev.kind == "finished":
            self._refresh_diagnosis()
        if self.lane is not None and ev.kind in ("telemetry", "finished", "rewound"):
            now = time.monotonic()
            if ev.kind != "telemetry" or now - self._last_compare >= COMPARE_EVERY:
                self._last_compare = now
                self._send_comparison()

    def handle(self, msg: dict[str, Any]) -> None:
        """Dispatch one workbench message (already known to be a dict of one of :data:`MESSAGE_TYPES`)."""
        t = msg["type"]
        if t == "rewind":
            self._rewind_message(msg)
        elif t == "lane":
            self._lane_message(msg)
        elif t == "diagnose":
            self._refresh_diagnosis(force=True)
        elif t == "advise":
            self._advise_message()
        elif t == "preset":
            self._preset_message(msg)
        elif t == "file":
            self._file_message(msg)

    # -- rewind --------------------------------------------------------------------------------------
    def _rewind_message(self, msg: dict[str, Any]) -> None:
        from .core import _int_field

        has_r, has_p = msg.get("round") is not None, msg.get("position") is not None
        if has_r == has_p:
            raise _message_error("rewind: give exactly one of 'round' and 'position'")
        r = _int_field(msg, "round", "rewind", lo=0) if has_r else None
        p = _int_field(msg, "position", "rewind", lo=0) if has_p else None
        s = self._live("rewound")
        self._idle("rewind")
        try:
            s.rewind(r, position=p) if r is not None else s.rewind(position=p)
        except SpecvizError as e:
            raise _message_error(f"rewind: {e}") from e
        self.core._pending = None
        self.core._flush()
        self.core._send_state()

    def rewind(self, round: int | None = None, *, position: int | None = None) -> None:
        """Rewind the inspector's session (Python API; the views follow)."""
        self.core.pause()
        self.core.wait()
        self.core.session.rewind(round, position=position)
        self.core._pending = None
        self.core._flush()
        self.core._send_state()

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
        from ..analysis.compare import Comparison, Lane

        if self.lane is None:
            self.comparison = None
            self._send({"type": "comparison", "data": None, "lane": {"open": False}})
            return
        c = Comparison(Lane.from_events(self._events(), "A"), Lane.from_events(list(self.lane.events), "B"))
        self.comparison = c.to_dict()
        self._send({"type": "comparison", "data": self.comparison, "lane": self._lane_state()})

    def _knobs_field(self, msg: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        strategy = msg.get("strategy")
        if strategy is not None and not isinstance(strategy, str):
            raise _message_error(f"lane: 'strategy' must be a strategy name; got {strategy!r:.60}")
        knobs = msg.get("knobs") or {}
        if isinstance(knobs, str):
            knobs = parse_knob_text(knobs)
        if not isinstance(knobs, dict) or len(knobs) > 64:
            raise _message_error("lane: 'knobs' must be an object of knob values (or 'name=value, ...' text)")
        return strategy or None, knobs

    def _lane_message(self, msg: dict[str, Any]) -> None:
        from .core import _int_field

        cmd = msg.get("cmd")
        if not isinstance(cmd, str) or cmd not in LANE_COMMANDS:
            raise _message_error(f"lane: unknown command {cmd!r:.40}; known commands: {', '.join(LANE_COMMANDS)}")
        if cmd == "close":
            self.close_lane()
            return
        self._live("branched")
        self._idle(f"lane {cmd}")
        try:
            if cmd == "branch":
                r = _int_field(msg, "round", "lane branch", lo=0) if msg.get("round") is not None else None
                self.branch(r)
            elif cmd == "compare":
                strategy, knobs = self._knobs_field(msg)
                self.compare(strategy, **_convert(strategy or self.core.session.strategy, knobs))
            elif cmd == "configure":
                if self.lane is None:
                    raise _message_error("lane configure: no second lane; Branch or Compare opens one")
                strategy, knobs = self._knobs_field(msg)
                self.lane.configure(strategy, **_convert(strategy or self.lane.strategy, knobs))
                self._send_comparison()
            elif cmd == "step":
                if self.lane is None:
                    raise _message_error("lane step: no second lane; Branch or Compare opens one")
                self._run_both(1)
            elif cmd == "run":
                if self.lane is None:
                    raise _message_error("lane run: no second lane; Branch or Compare opens one")
                self._run_both(None)
        except SpecvizError as e:
            raise _message_error(f"lane {cmd}: {e}") from e

    def branch(self, round: int | None = None) -> Any:
        """Open the second lane: a fork of the session now (or at ``round``, by rewinding the fork)."""
        s = self.core.session
        fork = s.fork()
        try:
            if round is not None:
                fork.rewind(round)
        except Exception:
            fork.close()
            raise
        self._adopt_lane(fork)
        self._send_comparison()
        return fork

    def compare(self, strategy: str | None = None, /, run: bool = True, **knobs: Any) -> Any:
        """Open the second lane from the start (round 0) with ``strategy`` and ``knobs`` and, with ``run``,
        run both lanes to their end in the background (:meth:`wait` blocks until done)."""
        s = self.core.session
        fork = s.fork()
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

    def _adopt_lane(self, fork: Any) -> None:
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

    def _run_both(self, n: int | None) -> None:
        """Step the main lane and the second one alternately (``n`` rounds each, None: to their end) in the
        core's worker slot, so the toolbar shows it running and Pause stops it."""
        core = self.core

        def work() -> None:
            i = 0
            try:
                while (n is None or i < n) and not core._stop.is_set():
                    moved = core._step_once()
                    b = self.lane
                    if b is not None and b.finished is None:
                        b.step()
                        moved = True
                    if not moved:
                        break
                    i += 1
            except Exception as e:  # keep the widget alive and say what happened
                core._error = f"{type(e).__name__}: {e}"
            finally:
                core._worker = None
                self._send_comparison()
                core._send_state()

        with core._lock:
            if core.running:
                raise _message_error("lane: rounds are running; Pause first")
            core._stop.clear()
            core._worker = threading.Thread(target=work, name="specviz-workbench-lanes", daemon=True)
            core._worker.start()
            core._send_state()

    # -- diagnosis and advice --------------------------------------------------------------------------
    def _refresh_diagnosis(self, force: bool = False) -> None:
        from ..analysis.diagnose import diagnose

        try:
            self.diagnosis = diagnose(self._events(), cost=getattr(self.core.session, "cost_model", None)).to_dict()
        except Exception as e:  # a diagnosis must never break the session's own flow
            if force:
                raise _message_error(f"diagnose: {type(e).__name__}: {e}") from e
            return
        self._send({"type": "diagnosis", "data": self.diagnosis})

    def _advise_message(self) -> None:
        from ..analysis.advise import advise

        cost = None
        s = self.core.session
        if s is not None and not self.core.replay and getattr(s, "started", False):
            self._idle("advise")
            from ..cli.workbench import session_cost

            cost = session_cost(s)
        lanes = [self._events()] + ([list(self.lane.events)] if self.lane is not None else [])
        self.advice = advise(
            *lanes, cost=cost, scale_to_rounds=cost is not None
        ).to_dict()  # both lanes' rounds, each folded on its own
        self._send({"type": "advice", "data": self.advice})

    # -- presets -------------------------------------------------------------------------------------
    def _preset_list(self) -> list[dict[str, Any]]:
        return [
            {"name": p["name"], "title": p.get("title", p["name"]), "description": p.get("description", "")}
            for p in self.presets
        ]

    def _preset_message(self, msg: dict[str, Any]) -> None:
        name = msg.get("name")
        preset = next((p for p in self.presets if p["name"] == name), None) if isinstance(name, str) else None
        if preset is None:
            names = ", ".join(p["name"] for p in self.presets) or "none"
            raise _message_error(f"preset: unknown preset {name!r:.60}; known presets: {names}")
        self._live("preset")
        self._idle("preset")
        self.apply_preset(preset)

    def apply_preset(self, preset: dict[str, Any]) -> None:
        """Start the session on a preset (prompt, strategy, knobs, sampling), replacing the generation."""
        s = self.core.session
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
            raise _message_error(f"preset {preset['name']}: {e}") from e
        self.core._prompt_text = preset["prompt"]
        self.core._pending = None
        self.core._error = None
        self.core._flush()
        self.core._send_state()

    # -- files ---------------------------------------------------------------------------------------
    def _download(self, name: str, mime: str, data: bytes) -> None:
        file_id = f"{int(time.time() * 1000)}"
        count = max(1, -(-len(data) // CHUNK_BYTES))
        for i in range(count):
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
        cmd = msg.get("cmd")
        if not isinstance(cmd, str) or cmd not in FILE_COMMANDS:
            raise _message_error(f"file: unknown command {cmd!r:.40}; known commands: {', '.join(FILE_COMMANDS)}")
        if cmd == "record":
            text = "".join(
                json.dumps(e.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n" for e in self._events()
            )
            self._download("specviz-recording.jsonl", "application/jsonl", text.encode())
            return
        s = self._live("saved" if cmd == "snapshot" else "restored")
        self._idle(f"file {cmd}")
        if cmd == "snapshot":
            try:
                blob = s.snapshot()
            except SpecvizError as e:
                raise _message_error(f"snapshot: {e}") from e
            self._download("specviz-snapshot.bin", "application/octet-stream", blob)
            return
        self._restore_part(msg)

    def _restore_part(self, msg: dict[str, Any]) -> None:
        from .core import _int_field

        fid = msg.get("id")
        if not isinstance(fid, str) or not fid or len(fid) > 64:
            raise _message_error("file restore: 'id' must be a short text naming the upload")
        count = _int_field(msg, "count", "file restore", lo=1, hi=MAX_UPLOAD // CHUNK_BYTES + 1)
        index = _int_field(msg, "index", "file restore", lo=0, hi=count - 1)
        data = msg.get("data")
        if not isinstance(data, str) or len(data) > CHUNK_BYTES * 2:
            raise _message_error("file restore: 'data' must be a base64 part of at most 1 MiB")
        parts = self._uploads.setdefault(fid, [None] * count)
        if len(parts) != count:
            self._uploads.pop(fid, None)
            raise _message_error("file restore: the parts of one upload disagree on their count")
        parts[index] = data
        if any(p is None for p in parts):
            return
        del self._uploads[fid]
        try:
            blob = b"".join(base64.b64decode(p or "", validate=True) for p in parts)
        except ValueError as e:
            raise _message_error(f"file restore: the upload is not base64 ({e})") from e
        try:
            self.core.session.restore_into(blob)
        except SpecvizError as e:
            raise _message_error(f"restore: {e}") from e
        self.reload_views()

    def reload_views(self) -> None:
        """After the session was replaced wholesale (a restore): a new epoch holding its events."""
        core = self.core
        with core._lock:
            core.epoch += 1
            core.log = [e.to_dict() for e in core.session.events]
            core._unsent = 0
            core._pending = None
            core._flush()
            core._send_state(force=True)
        self._refresh_diagnosis()

    def close(self) -> None:
        """Close the second lane and stop listening to the session."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self.lane is not None:
            self.lane.close()
            self.lane = None


def _convert(strategy: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """Form values (text) converted by the strategy's knob declarations; an unknown knob or a bad value
    raises :class:`~specviz.errors.KnobError` naming it (nothing changes)."""
    from ..errors import KnobError
    from ..strategies import strategy_schema

    by_name = {k.name: k for k in strategy_schema(strategy).knobs}
    out = {}
    for name, value in knobs.items():
        knob = by_name.get(name)
        if knob is None:
            raise KnobError(f"unknown knob {name!r} for strategy {strategy!r}", knob=name, value=value)
        out[name] = knob.convert(value)
    return out


def parse_knob_text(text: str) -> dict[str, str]:
    """``"draft_max=8, draft_policy=cost"`` as ``{"draft_max": "8", "draft_policy": "cost"}`` (the values are
    converted and checked by the strategy's schema when applied)."""
    out: dict[str, str] = {}
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise _message_error(f"knobs: {part!r:.40} is not name=value")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out
