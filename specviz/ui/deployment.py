"""The new-session form's deployment settings: a live session's context settings (``-fa``, ``-ctk``, ``-ctv``,
``-c``, ``-b``, ``-ub``, ``-t``) chosen in fields, or a whole ``llama-server`` command line, read into what
a Reset starts.

A page changes the context only of a session it owns (a :class:`~specviz.decoding.session.Session`): the
pages of ``specviz serve`` share one server's contexts, parked and restored with the server's settings, so
theirs are offered no deployment settings and a Reset that names some is refused.

A command line is read by :func:`~specviz.analysis.server_args.parse_server_args`, as ``specviz run
--server-args`` reads it: its strategy and knobs, its context settings (those ``run --server-args`` gives a
session: :attr:`~specviz.analysis.server_args.ServerConfig.settings`), its sampling and its grammar (where the
form gives none). Every flag specviz cannot honour comes back as a
warning for the page to show; a ``-m`` naming another model than the session's is refused.

No UI library is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TypeGuard

from ..analysis.server_args import ServerConfig, parse_server_args
from ..backends.context_settings import FLASH_ATTN, ContextSettings, cache_types_for, head_sizes
from ..decoding.session import Session
from ..errors import KnobError, SessionStateError

#: the longest llama-server command line a page may send
MAX_SERVER_ARGS = 4000


def offers_settings(session: Any) -> TypeGuard[Session]:
    """Whether a page may change ``session``'s context settings (it owns the session's contexts)."""
    return isinstance(session, Session)


def settings_state(session: Session) -> dict[str, Any]:
    """The ``state`` fields the form's deployment settings are built from: the context's ``settings`` and
    the ``setting_choices`` (the flash-attention modes, the KV cache types the model's head sizes allow)."""
    info = session.model.info
    return {
        "settings": session.settings.to_dict(),
        "setting_choices": {
            "flash_attn": list(FLASH_ATTN),
            "cache_types": cache_types_for(*head_sizes(info.metadata, info.architecture)),
        },
    }


@dataclass
class Deployment:
    """What a Reset's deployment fields ask for: the ``context`` settings to create the context with (empty:
    keep it), and, from a llama-server line, the ``strategy`` and ``knobs`` (``None``: keep the session's),
    the line's ``sampling`` and ``chat_template`` defaults, its ``grammar`` (checked GBNF of its ``--grammar``,
    ``--grammar-file``, ``-j`` or ``-jf``; ``None``: none), its ``n_predict``, and its ``warnings``."""

    context: dict[str, Any] = field(default_factory=dict)
    strategy: str | None = None
    knobs: dict[str, Any] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    grammar: str | None = None
    n_predict: int | None = None
    warnings: list[str] = field(default_factory=list)


def read_deployment(session: Any, context: Mapping[str, Any] | None, server_args: str | None) -> Deployment:
    """The deployment a Reset asks for: the chosen ``context`` fields (a blank one keeps its setting) or a
    ``server_args`` line (not both). Checks what needs no new context; a refusal raises a typed error."""
    chosen = {k: v for k, v in (context or {}).items() if v not in (None, "")}
    line = (server_args or "").strip()
    if not chosen and not line:
        return Deployment()
    if not offers_settings(session):
        raise SessionStateError(
            "this page's session runs with the server's context settings; they cannot be changed from the page"
        )
    if not line:
        return Deployment(context=chosen)
    if chosen:
        raise KnobError(
            "server_args: give the deployment's settings either in the fields or in the llama-server line, not both",
            knob="server_args",
        )
    if len(line) > MAX_SERVER_ARGS:
        raise KnobError(f"server_args: the line is longer than {MAX_SERVER_ARGS} characters", knob="server_args")
    cfg = parse_server_args(line)
    own = Path(str(session.model.path))
    if cfg.model is not None and Path(cfg.model).resolve() != own.resolve():
        raise KnobError(
            f"server_args: -m {cfg.model} is not this session's model ({own.name}); leave -m out, or open the "
            "inspector on that model",
            knob="server_args",
            value=cfg.model,
        )
    sampling = {k: v for k, v in cfg.sampling.items() if k != "seed"}
    return Deployment(
        context=cfg.settings.to_dict(),
        strategy=cfg.strategy,
        knobs=dict(cfg.knobs),
        sampling=sampling,
        chat_template=cfg.chat_template,
        grammar=cfg.grammar,
        n_predict=cfg.n_predict,
        # the layout's note first: a page shows the newest notice on top, where the line's own flags belong
        warnings=layout_warnings(session)
        + placement_warnings(session, cfg)
        + [f"llama-server option {w}" for w in cfg.warnings_one_at_a_time("a page")],
    )


def placement_warnings(session: Session, cfg: ServerConfig) -> list[str]:
    """Where a line's ``-ngl`` (or llama-server's default, ``auto``) asks for another placement than the page's
    model was loaded with: the model stays where it is (a page never reloads its model)."""
    want, have = cfg.gpu_layers(), session.model.n_gpu_layers
    if want == have:
        return []
    asked = f"-ngl {cfg.gpu_layers_text}" if cfg.gpu_layers_given else "llama-server's default -ngl auto"
    return [
        f"the line's {asked} puts {want} layers on the GPU, the page's model was loaded with -ngl {have} and stays "
        f"so; open the inspector with -ngl {want} to match the server"
    ]


def layout_warnings(session: Session) -> list[str]:
    """What a page's own session keeps of itself under a llama-server line: its prompt layout (the page's
    session was made before the line came) and its sliding-window cache, which can make its greedy text
    part from the server's at a near-tie (see :class:`~specviz.Session`'s ``prefill``)."""
    if session.prefill == "whole":
        return []
    return [
        "the page's session evaluates prompts as speculative-simple does (the last prompt token in the first "
        "round's batch), llama-server the whole prompt: on a quantized model the texts can part at a near-tie; "
        'specviz run --server-args "..." reproduces the server\'s layout'
    ]


def start_with(session: Session, context: Mapping[str, Any], start: Mapping[str, Any]) -> None:
    """Create the context anew with ``context`` and start the generation ``start`` describes (the keyword
    arguments of :meth:`~specviz.Session.start`). Everything is checked first — the settings, then the
    start against a context of the new size — so a refusal leaves the session as it was; a start that still
    fails after the new context was made gets the old settings back (the shown generation ended then)."""
    args = dict(start)
    new = ContextSettings.make(session.settings, **context)  # refused: nothing changed
    session.check_start(n_ctx=new.n_ctx, **args)  # refused: nothing changed
    old = {k: session.context_args.get(k) for k in context}
    session.set_context_settings(**context)
    try:
        session.start(**args)
    except Exception:
        session.set_context_settings(**old)
        raise
