"""Entry points of ``specviz serve`` and ``specviz replay``: the Panel inspector on a local port.

* :func:`serve` loads the model once. By default every browser page gets its own session on it, the
  sessions take turns to decode (:mod:`specviz.server.scheduler`), at most ``max_sessions`` are open and
  idle ones are parked (:mod:`specviz.server.pool`). With ``shared=True`` (presenter mode) one session
  runs and every page watches it; only pages opened with the presenter token control it
  (:mod:`specviz.server.presenter`).
* :func:`replay` shows a recorded JSON Lines file; no model is loaded.

Both listen on loopback by default, where no token is needed; on any other address every request
needs the token printed at start (:mod:`specviz.server.access`). Both block until interrupted (Ctrl-C).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..ui.panel_app import DEFAULT_PROMPT
from .access import AccessPolicy, access_policy, auth_provider

if TYPE_CHECKING:
    from ..decoding.batch_cost import BatchCostTable

#: The largest websocket message a page may send (Tornado closes the connection beyond it); the inspector's
#: own messages are far smaller and are bounded again, one by one, by :class:`~specviz.server.access.MessageGate`.
MAX_WEBSOCKET_BYTES = 1 << 20
#: How often Bokeh looks for pages whose browser went away, and how long it waits before letting them go.
CHECK_UNUSED_MS = 3000
UNUSED_LIFETIME_MS = 15000
#: Tornado pings every page's websocket this often and closes it when no answer came within the timeout: a
#: page that stopped reading (its socket full) never answers, and its connection is closed (seconds).
PING_INTERVAL = 10
PING_TIMEOUT = 30


def _display_host(address: str) -> str:
    """The host to print in a URL: this machine's name for a wildcard address."""
    if address in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return f"[{address}]" if ":" in address else address


def _serve_panel(
    factory,
    *,
    port: int,
    address: str,
    show: bool,
    title: str,
    policy: AccessPolicy,
    lines: Iterable[str] = (),
    threaded: bool = False,
) -> Any:
    """Serve ``factory`` with Panel: blocks until interrupted, or (``threaded``) returns the server's thread."""
    import panel as pn

    from .assets import asset_routes

    opts: dict[str, Any] = {}
    if policy.required or policy.presenter_token is not None:
        opts["auth_provider"] = auth_provider(policy, port)  # the token, the presenter's cookie, same origin
    if policy.required:
        # pages come from wherever the audience reaches this machine, so Bokeh's allowlist takes any host on
        # the port; the auth provider then refuses a websocket whose Origin is not the host it was sent to
        origins = [f"*:{port}"]
    else:
        origins = sorted({f"{h}:{port}" for h in ("127.0.0.1", "localhost", address)})
    for line in lines:
        print(line, flush=True)
    return pn.serve(
        {"/": factory},
        port=port,
        address=address,
        show=show,
        title=title,
        websocket_origin=origins,
        start=True,
        threaded=threaded,
        websocket_max_message_size=MAX_WEBSOCKET_BYTES,
        check_unused_sessions_milliseconds=CHECK_UNUSED_MS,
        unused_session_lifetime_milliseconds=UNUSED_LIFETIME_MS,
        websocket_ping_interval=PING_INTERVAL,
        websocket_ping_timeout=PING_TIMEOUT,
        extra_patterns=asset_routes(policy, port),
        **opts,
    )


def derived_drafts_dir() -> Path:
    """Where the examples keep drafts derived from the embedded model (``<cache>/derived``)."""
    from ..models.embedded import cache_dir

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


@dataclass
class ServedApp:
    """What :func:`build_app` made: the page factory, the lines to print, the access policy, and the pool
    (default mode) or the shared inspector (presenter mode) behind the pages."""

    factory: Callable[[], Any]
    lines: list[str]
    policy: AccessPolicy
    pool: Any = None
    shared: Any = None


def _page_presets(catalog: Any, presets: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The presets as the pages get them: a preset's draft model by its catalog name, as every draft goes to
    the pages (never a path); None without presets."""
    return [
        {**p, "knobs": {**p["knobs"], "draft_model": catalog.name_for(str(p["knobs"]["draft_model"]))}}
        if (p.get("knobs") or {}).get("draft_model")
        else p
        for p in (presets or [])
    ] or None


@dataclass
class _Pages:
    """What every page of an app is built from: the session factory, the drafts on offer and loaded, the
    access policy, the base URL and port, and the first session's prompt, start arguments and presets."""

    make_session: Callable[[], Any]
    catalog: Any
    drafts: Any
    policy: AccessPolicy
    base: str
    port: int
    prompt: str
    start_kwargs: dict[str, Any]
    presets: list[dict[str, Any]] | None


def _presenter_app(p: _Pages, max_viewers: int) -> ServedApp:
    """Presenter mode: one session, started now, that every page watches."""
    from .access import GateRegistry
    from .assets import plotly_url
    from .pages import shared_app
    from .pool import ManagedSession
    from .presenter import SharedInspector

    session = ManagedSession(p.make_session, catalog=p.catalog, drafts=p.drafts)
    session.start(p.prompt, **p.start_kwargs)
    inspector = SharedInspector(
        session,
        prompt=p.prompt,
        draft_models=p.catalog.names,
        presets=p.presets,
        background=True,
        plotly_url=plotly_url(),
    )
    return ServedApp(
        shared_app(inspector, p.policy, max_viewers=max_viewers, gates=GateRegistry(), port=p.port),
        [
            "specviz inspector, presenter mode: one session, every page watches (Ctrl-C stops)",
            f"  audience:  {p.policy.url(p.base)}",
            f"  presenter: {p.policy.url(p.base, presenter=True)}   (keep this one to yourself)",
        ],
        p.policy,
        shared=inspector,
    )


def _per_page_app(p: _Pages, max_sessions: int, idle_timeout: float) -> ServedApp:
    """The default mode: a session per page, from a pool that parks idle ones and takes rounds in turn."""
    from .access import GateRegistry
    from .assets import plotly_url
    from .pages import per_page_app
    from .pool import SessionPool
    from .scheduler import RoundScheduler

    pool = SessionPool(
        p.make_session,
        max_sessions=max_sessions,
        idle_timeout=idle_timeout,
        scheduler=RoundScheduler(),
        catalog=p.catalog,
        drafts=p.drafts,
    )
    pool.start_reaper()
    return ServedApp(
        per_page_app(
            pool,
            prompt=p.prompt,
            start_kwargs=p.start_kwargs,
            presets=p.presets,
            gates=GateRegistry(),
            plotly_url=plotly_url(),
        ),
        [f"specviz inspector: {p.policy.url(p.base)}  (Ctrl-C stops; a session per page, at most {max_sessions})"],
        p.policy,
        pool=pool,
    )


def build_app(
    port: int = 5006,
    model: str | os.PathLike | None = None,
    *,
    address: str = "127.0.0.1",
    prompt: str = DEFAULT_PROMPT,
    max_tokens: int = 256,
    strategy: str = "prompt-lookup",
    n_ctx: int = 4096,
    draft_models: Iterable[str | os.PathLike] = (),
    shared: bool = False,
    token: str | None = None,
    presenter_token: str | None = None,
    max_sessions: int = 8,
    idle_timeout: float = 300.0,
    max_viewers: int = 100,
    presets: list[dict[str, Any]] | None = None,
    settings: Any = None,
    n_gpu_layers: int = 0,
    **knobs: Any,
) -> ServedApp:
    """Load the model and build the pages :func:`serve` serves (see there for the arguments); serves nothing.

    ``settings`` (a :class:`~specviz.backends.context_settings.ContextSettings`; ``None``: the defaults with
    ``n_ctx``) are the context settings of every page's session: the server's, not a page's to change."""
    from ..backends.llama import LlamaModel
    from ..decoding.session import Session
    from ..models.embedded import resolve_model
    from .catalog import DraftCatalog
    from .pool import SharedDraftModels

    policy = access_policy(address, token, shared=shared, presenter_token=presenter_token)
    target = resolve_model(model)
    loaded = LlamaModel(target, n_gpu_layers=n_gpu_layers)
    catalog = DraftCatalog(
        draft_candidates(target, list(draft_models) + ([knobs["draft_model"]] if knobs.get("draft_model") else []))
    )
    if knobs.get("draft_model"):
        knobs["draft_model"] = catalog.name_for(str(knobs["draft_model"]))
    page_presets = _page_presets(catalog, presets)
    drafts = SharedDraftModels(loaded)

    ctx_settings = settings.to_dict() if settings is not None else {"n_ctx": n_ctx}
    ctx_settings.update(tree_sequences(loaded, ctx_settings))

    def make_session() -> Session:
        return Session(loaded, **ctx_settings)  # a parked session comes back with the same cache layout

    base = f"http://{_display_host(address)}:{port}/"
    start_kwargs = {"max_tokens": max_tokens, "strategy": strategy, **knobs}
    pages = _Pages(make_session, catalog, drafts, policy, base, port, prompt, start_kwargs, page_presets)
    if shared:
        app = _presenter_app(pages, max_viewers)
    else:
        app = _per_page_app(pages, max_sessions, idle_timeout)
    if settings is not None and settings.changed():
        app.lines.append(f"  every session's context: {settings.describe()}")
    if policy.required:
        app.lines.append("  every request needs the token above (open the URL as printed)")
    return app


#: The most branches a page's draft tree may have (``tree_width``): each page's target context holds as many
#: sequences in one unified cache, which costs no memory over one (the cache's size is its ``n_ctx``).
SERVED_TREE_WIDTH = 4


def tree_sequences(model: Any, ctx_settings: dict[str, Any]) -> dict[str, Any]:
    """The sequences a served session's target holds: :data:`SERVED_TREE_WIDTH`, so a page can draft a tree,
    where the model's memory can hold one (none for recurrent or hybrid memory, or a ring-sized window)."""
    from ..backends.memory import memory_kind, tree_refusal

    kind = memory_kind(model, bool(ctx_settings.get("swa_full", True)))
    return {"n_seq_max": SERVED_TREE_WIDTH} if tree_refusal(kind) is None else {}


def serve(
    port: int = 5006,
    model: str | os.PathLike | None = None,
    *,
    address: str = "127.0.0.1",
    show: bool = False,
    **options: Any,
) -> None:
    """Serve the inspector on ``model`` (default: the embedded Gemma 3 270M) at ``http://address:port/``.

    ``options``: ``prompt``, ``max_tokens``, ``strategy``, ``n_ctx`` (or ``settings``: every context setting, a
    :class:`~specviz.backends.context_settings.ContextSettings`), ``n_gpu_layers`` (the model's layers on a GPU
    build's devices, as :class:`~specviz.Session` takes it), ``draft_models``, ``presets`` (one-click
    starting points of the workbench), ``shared``, ``token``,
    ``presenter_token``, ``max_sessions``, ``idle_timeout``, ``max_viewers`` and knobs.

    The model weights are loaded once and shared. By default each page gets its own session started on
    ``prompt`` with ``strategy`` and the knobs; the sessions decode one round at a time in turn, at most
    ``max_sessions`` pages (default 8) have one (the others are told the server is busy), and a session
    idle for ``idle_timeout`` seconds (default 300) gives its llama.cpp context back until its page acts
    again. With ``shared`` one session runs and every page (up to ``max_viewers``) watches it; pages
    opened with the presenter token (``presenter_token``, or a random one printed at start) control it.

    The form offers ``draft_models`` (and drafts derived from the model found by
    :func:`draft_candidates`) by name for the ``draft`` strategy; a page can pick nothing else. Off
    loopback (or with ``token``) every request needs the access token, printed at start.
    """
    app = build_app(port, model, address=address, **options)
    _serve_panel(
        app.factory,
        port=port,
        address=address,
        show=show,
        title="specviz inspector",
        policy=app.policy,
        lines=app.lines,
    )


def replay(
    path: str | os.PathLike,
    port: int = 5006,
    *,
    address: str = "127.0.0.1",
    show: bool = False,
    token: str | None = None,
    batch_cost: BatchCostTable | None = None,
) -> None:
    """Serve a recorded session (JSON Lines written by :class:`~specviz.decoding.recorder.Recorder`); no model.

    Off loopback (or with ``token``) every request needs the access token, printed at start. ``batch_cost``: the
    table a batched recording's advice under load uses (:mod:`specviz.ui.parallel_advice`).
    """
    from ..decoding.recorder import read_events
    from .access import GateRegistry
    from .assets import plotly_url
    from .pages import replay_app

    events = read_events(path)  # fail now, with the line number, rather than in the browser
    policy = access_policy(address, token)
    factory = replay_app(
        events,
        title=f"specviz replay: {os.path.basename(str(path))}",
        gates=GateRegistry(),
        plotly_url=plotly_url(),
        batch_cost=batch_cost,
    )

    base = f"http://{_display_host(address)}:{port}/"
    _serve_panel(
        factory,
        port=port,
        address=address,
        show=show,
        title="specviz replay",
        policy=policy,
        lines=[f"specviz replay: {policy.url(base)}  (Ctrl-C stops)"],
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m specviz.server.app [serve|replay] …`` (the same as the ``specviz`` subcommands)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m specviz.server.app")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=5006)
    s.add_argument("--model", default=None)
    s.add_argument("--address", default="127.0.0.1")
    s.add_argument("--max-tokens", type=int, default=256)
    s.add_argument("--prompt", default=DEFAULT_PROMPT)
    s.add_argument("--shared", action="store_true")
    s.add_argument("--token", default=None)
    s.add_argument("--max-sessions", type=int, default=8)
    r = sub.add_parser("replay")
    r.add_argument("file")
    r.add_argument("--port", type=int, default=5006)
    r.add_argument("--address", default="127.0.0.1")
    r.add_argument("--token", default=None)
    r.add_argument("--batch-cost", default=None)
    a = p.parse_args(argv)
    if a.cmd == "serve":
        serve(
            a.port,
            a.model,
            address=a.address,
            max_tokens=a.max_tokens,
            prompt=a.prompt,
            shared=a.shared,
            token=a.token,
            max_sessions=a.max_sessions,
        )
    else:
        from ..ui.parallel_advice import read_batch_cost

        replay(a.file, a.port, address=a.address, token=a.token, batch_cost=read_batch_cost(a.batch_cost))


if __name__ == "__main__":
    main()
