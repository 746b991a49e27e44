"""The inspector as an anywidget for JupyterLab (and any other anywidget host).

``Inspector(session)`` shows a live session and its controls; ``Inspector.replay(path)`` shows a
recorded JSON Lines file without a model. The front-end is the ES module assembled from
``widgets/inspector/`` (shipped as ``specviz.static``; see :mod:`specviz.ui.bundle`), the same module
the Panel app uses. All logic lives in
:class:`~specviz.ui.core.InspectorCore`; this class only connects it to the widget's comm.
"""

from __future__ import annotations

import os
from typing import Any

import anywidget

from ..decoding.batch import BatchRun
from ..decoding.batch_cost import BatchCostTable
from ..decoding.events import Event
from ..decoding.recorder import read_events
from .core import InspectorCore, static_text
from .sources import InspectedSession


def _draft_paths(session: InspectedSession | None) -> list[str]:
    path = (session.knobs or {}).get("draft_model") if session is not None else None
    return [str(path)] if path else []


class Inspector(anywidget.AnyWidget):
    """Visual inspector of a :class:`~specviz.decoding.session.Session`: token stream, KV timeline, telemetry.

    ``prompt`` (with ``max_tokens``, ``strategy`` and knobs) starts the session when it has not been
    started yet. ``draft_models`` lists draft GGUF paths offered in the form for the ``draft`` strategy
    (by default the session's current draft model, if any). Rounds run by the buttons, by
    :meth:`step`/:meth:`run`/:meth:`play`, or by calling ``session.step()`` directly all appear: the
    inspector subscribes to the session's events and sends each round once.
    """

    _esm = static_text("inspector.js")
    _css = static_text("inspector.css")

    def __init__(
        self,
        session: InspectedSession | None = None,
        *,
        prompt: str | None = None,
        max_tokens: int = 128,
        strategy: str = "prompt-lookup",
        draft_models: list[str] | None = None,
        presets: list[dict[str, Any]] | None = None,
        _events: list[Event] | None = None,
        _batch_cost: BatchCostTable | None = None,
        _batch: BatchRun | None = None,
        **knobs: Any,
    ) -> None:
        super().__init__()
        if session is not None and prompt is not None and not session.started:
            session.start(prompt, max_tokens=max_tokens, strategy=strategy, **knobs)
        self.core = InspectorCore(
            self.send,
            session,
            events=_events,
            prompt=prompt,
            draft_models=draft_models or _draft_paths(session),
            presets=presets,
            batch_cost=_batch_cost,
            batch=_batch,
        )
        self.on_msg(self._on_msg)

    @classmethod
    def replay(cls, path: str | os.PathLike, *, batch_cost: BatchCostTable | None = None) -> Inspector:
        """An inspector over a recorded session (JSON Lines from :class:`~specviz.decoding.recorder.Recorder`). A
        batched run's recording shows the lanes of its steps; ``batch_cost`` is the table its advice under load
        uses (:mod:`specviz.ui.parallel_advice`; without one Advise measures it on the recorded model)."""
        return cls(None, _events=read_events(path), _batch_cost=batch_cost)

    @classmethod
    def batched(cls, run: BatchRun, *, batch_cost: BatchCostTable | None = None) -> Inspector:
        """An inspector over a live :class:`~specviz.decoding.batch.BatchRun` (requests submitted to it): Step, Run
        and Play (or :meth:`step`, :meth:`run`, :meth:`play`) run its steps; the token stream follows its first
        request, the Verify batch card every slot; ``batch_cost`` as for :meth:`replay`."""
        return cls(None, _batch=run, _batch_cost=batch_cost)

    def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        self.core.handle(content)

    # -- Python API (mirrors the buttons) -------------------------------------------------------------
    @property
    def session(self) -> InspectedSession | None:
        """The session shown (``None`` for a replay)."""
        return self.core.session

    @property
    def log(self) -> list[dict]:
        """Event dictionaries of the current generation, as sent to the front-end."""
        return self.core.log

    def step(self, n: int = 1) -> int:
        """Run ``n`` rounds now; returns how many ran."""
        return self.core.step(n)

    def run(self, n: int) -> None:
        """Run ``n`` rounds in the background (the notebook stays responsive)."""
        self.core.run(n)

    def play(self) -> None:
        """Run to the end in the background; :meth:`pause` stops after the current round."""
        self.core.play()

    def pause(self) -> None:
        """Stop background stepping after the current round."""
        self.core.pause()

    def wait(self, timeout: float | None = None) -> None:
        """Block until background stepping stops."""
        self.core.wait(timeout)

    def reset(self, prompt: str | None = None, max_tokens: int | None = None, **request: Any) -> None:
        """Start again (the same prompt unless one is given). ``request``: what the new-session form passes
        (``temperature``, ``top_k``, ``top_p``, ``seed``, ``stop``, ``chat``, and a live session's deployment:
        ``context`` settings or a whole llama-server command line as ``server_args``; a ``grammar`` (GBNF) or
        a ``json_schema`` (JSON text) every token obeys); see
        :meth:`~specviz.ui.core.InspectorCore.reset`."""
        self.core.reset(prompt, max_tokens, **request)

    def configure(self, strategy: str | None = None, **knobs: Any) -> dict[str, str]:
        """Queue a strategy/knob change for the next round; returns ``{knob: error}`` (empty when accepted)."""
        return self.core.configure_from_form(strategy, knobs)

    # -- the debugging workbench (mirrors its buttons; see specviz.ui.workbench) -------------------------
    def rewind(self, round: int | None = None, *, position: int | None = None) -> None:
        """Rewind the session to right after ``round`` (or to ``position`` tokens); the views follow."""
        self.core.workbench.rewind(round, position=position)

    def branch(self, round: int | None = None) -> InspectedSession:
        """Open a second lane: a fork of the session now (or at ``round``); returns the fork."""
        return self.core.workbench.branch(round)

    def compare(self, strategy: str | None = None, /, run: bool = True, **knobs: Any) -> InspectedSession:
        """Open a second lane from the start with another ``strategy`` / ``knobs`` and run both lanes to
        their end in the background (:meth:`wait`); returns the second lane's session."""
        return self.core.workbench.compare(strategy, run=run, **knobs)

    @property
    def comparison(self) -> dict | None:
        """The last comparison shown (:meth:`specviz.analysis.compare.Comparison.to_dict`), or None."""
        return self.core.workbench.comparison

    def diagnose(self) -> dict:
        """Compute and show the diagnosis (:func:`specviz.analysis.diagnose.diagnose`); returns it as a dictionary."""
        self.core.workbench.handle({"type": "diagnose"})
        return self.core.workbench.diagnosis or {}

    def advise(self) -> dict:
        """Compute and show the advice (:func:`specviz.analysis.advise.advise`); returns it as a dictionary."""
        self.core.workbench.handle({"type": "advise"})
        return self.core.workbench.advice or {}

    def close(self) -> None:  # noqa: D102 - ipywidgets API
        self.core.close()
        super().close()
