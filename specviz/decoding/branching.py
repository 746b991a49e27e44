"""Sessions made from sessions: a snapshot restored into a new session (``Session.restore``) and a fork that
shares the loaded models (``Session.fork``). Both are a snapshot (:mod:`specviz.decoding.snapshot`)
restored into a session made with the settings it records; the new session is closed again when the
restore is refused.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Protocol, TypeVar

from ..backends.llama import LlamaContext, LlamaModel
from ..models.draft_cache import DraftModelCache
from ..strategies import strategy_class
from .snapshot import read_header, unpack
from .target_setup import CONTEXT_KEYS


class Branchable(Protocol):
    """What this module uses of a session."""

    model: LlamaModel
    ctx: LlamaContext
    draft_models: DraftModelCache
    record_margins: bool

    def restore_into(self, blob: bytes) -> None:
        """Restore a snapshot into this session."""
        ...

    def close(self) -> None:
        """Free the session's contexts and the draft models it loaded."""
        ...


S = TypeVar("S", bound=Branchable)


def snapshot_strategy(blob: Any) -> str:
    """The strategy a snapshot restores, or ``none`` where it cannot be read (restoring then says why)."""
    try:
        name = read_header(unpack(blob)[0]).strategy
        strategy_class(name)
    except Exception:
        return "none"
    return name


def restored(make: Callable[..., S], blob: bytes, model: str | os.PathLike | LlamaModel | None, **kwargs: Any) -> S:
    """A new session (``make(model, **settings)``) continuing where snapshot ``blob`` was taken: ``model``
    defaults to the path recorded in it, the context settings to those it records (``kwargs`` override)."""
    h = read_header(unpack(blob)[0])
    ctx_args: dict[str, Any] = {k: h.ctx[k] for k in CONTEXT_KEYS if k in h.ctx}
    other = make(model if model is not None else h.model, **{**ctx_args, **kwargs})
    try:
        other.restore_into(blob)
    except Exception:
        other.close()
        raise
    return other


def forked(s: S, blob: bytes, make: Callable[[LlamaModel], S]) -> S:
    """A second session (``make(s.model)``) holding ``s``'s snapshot ``blob``, sharing ``s``'s loaded draft
    models and its target memory's saved states (they serve the fork's rewinds too)."""
    other = make(s.model)
    try:
        other.draft_models.close()
        other.draft_models = s.draft_models.share()
        other.restore_into(blob)  # the snapshot carries the measured verify cost curve too
        other.ctx.memory.adopt(s.ctx.memory)
        other.record_margins = s.record_margins
    except Exception:
        other.close()
        raise
    return other
