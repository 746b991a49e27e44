"""Entry points of ``specviz serve`` and ``specviz replay``: the Panel inspector on a local port.

* :func:`serve` loads the model once and gives every browser page its own session on it.
* :func:`replay` shows a recorded JSON Lines file; no model is loaded.

Both listen on loopback by default and block until interrupted (Ctrl-C).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from .panel_app import DEFAULT_PROMPT


def _serve_panel(factory, *, port: int, address: str, show: bool, title: str) -> Any:
    import panel as pn

    origins = [f"{h}:{port}" for h in ("127.0.0.1", "localhost", address)]
    print(f"specviz inspector: http://{address}:{port}/  (Ctrl-C stops)", flush=True)
    return pn.serve({"/": factory}, port=port, address=address, show=show, title=title,
                    websocket_origin=sorted(set(origins)), start=True, threaded=False)


def derived_drafts_dir() -> Path:
    """Where the examples keep drafts derived from the embedded model (``<cache>/derived``)."""
    from ..models import cache_dir

    return cache_dir() / "derived"


def draft_candidates(model_path: str | os.PathLike, extra: Iterable[str | os.PathLike] = ()) -> list[str]:
    """Draft GGUF paths to offer in the inspector's form: ``extra`` first, then derived drafts of ``model_path``.

    A derived draft is a ``*.gguf`` in :func:`derived_drafts_dir` whose name starts with the target's
    file stem (the naming ``examples/serve_inspector.py`` uses); nothing is loaded or checked here
    (the session checks the vocabulary when the strategy is applied).
    """
    out = [str(p) for p in extra]
    stem = Path(model_path).stem
    d = derived_drafts_dir()
    if d.is_dir():
        out += [str(p) for p in sorted(d.glob(f"{stem}*.gguf")) if str(p) not in out]
    return out


def serve(port: int = 5006, model: str | os.PathLike | None = None, *, address: str = "127.0.0.1",
          prompt: str = DEFAULT_PROMPT, max_tokens: int = 256, strategy: str = "prompt-lookup",
          n_ctx: int = 4096, show: bool = False, draft_models: Iterable[str | os.PathLike] = (),
          presets: list[dict[str, Any]] | None = None, **knobs: Any) -> None:
    """Serve the inspector on ``model`` (default: the embedded Gemma 3 270M) at ``http://address:port/``.

    Each page gets a fresh :class:`~specviz.session.Session` started on ``prompt`` with ``strategy``
    and ``knobs``; the model weights are loaded once and shared. The form offers ``draft_models``
    (and drafts derived from the model found by :func:`draft_candidates`) for the ``draft`` strategy, and
    ``presets`` as one-click starting points.
    """
    from ..backends.llama import LlamaModel
    from ..models import resolve_model
    from ..session import Session
    from .panel_app import inspector_app

    target = resolve_model(model)
    loaded = LlamaModel(target)
    drafts = draft_candidates(target, list(draft_models) + ([knobs["draft_model"]] if knobs.get("draft_model") else []))

    def factory():
        def make_session():
            s = Session(loaded, n_ctx=n_ctx)
            s.start(prompt, max_tokens=max_tokens, strategy=strategy, **knobs)
            return s

        return inspector_app(make_session, prompt=prompt, draft_models=drafts, presets=presets)

    _serve_panel(factory, port=port, address=address, show=show, title="specviz inspector")


def replay(path: str | os.PathLike, port: int = 5006, *, address: str = "127.0.0.1", show: bool = False) -> None:
    """Serve a recorded session (JSON Lines written by :class:`~specviz.recorder.Recorder`); no model."""
    from ..recorder import read_events
    from .panel_app import inspector_app

    events = read_events(path)  # fail now, with the line number, rather than in the browser

    def factory():
        return inspector_app(events=events, title=f"specviz replay: {os.path.basename(str(path))}")

    _serve_panel(factory, port=port, address=address, show=show, title="specviz replay")


def main(argv: list[str] | None = None) -> None:
    """``python -m specviz.ui.server [serve|replay] …`` (the same as the ``specviz`` subcommands)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m specviz.ui.server")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=5006)
    s.add_argument("--model", default=None)
    s.add_argument("--address", default="127.0.0.1")
    s.add_argument("--max-tokens", type=int, default=256)
    s.add_argument("--prompt", default=DEFAULT_PROMPT)
    r = sub.add_parser("replay")
    r.add_argument("file")
    r.add_argument("--port", type=int, default=5006)
    r.add_argument("--address", default="127.0.0.1")
    a = p.parse_args(argv)
    if a.cmd == "serve":
        serve(a.port, a.model, address=a.address, max_tokens=a.max_tokens, prompt=a.prompt)
    else:
        replay(a.file, a.port, address=a.address)


if __name__ == "__main__":
    main()
