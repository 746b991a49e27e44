"""The hooks of a drafter that owns a llama.cpp context of its own (``draft``, ``eagle3``, ``mtp``,
``dflash``, ``dspark``, and a chain holding one of them).

Such a drafter keeps a context in step with the committed tokens, so the round, the rewind, the snapshot
and the telemetry ask it more than :class:`~specviz.strategies.base.Drafter`'s begin / draft / accept /
state / load_state: how many positions its context holds, to bring it in step after a round, its bytes
for a snapshot, its memory figures and what feeding it cost. Those hooks live on :class:`ContextDrafter`,
which declares ``has_context``; a caller holding any drafter asks :func:`context_hooks` for them and skips
them when it answers None (the drafter owns no context). Every defaulted hook here reports "nothing":
a subclass overrides what its context has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from .base import Drafter, Upkeep

if TYPE_CHECKING:
    from ..backends.llama import LlamaContext, LlamaModel
    from ..backends.memory import Cut, Mark


class ContextDrafter(Drafter):
    """A drafter with a llama.cpp context of its own: the hooks that context needs, on top of the
    :class:`~specviz.strategies.base.Drafter` interface."""

    has_context: ClassVar[bool] = True

    @classmethod
    def check_models(cls, config: dict[str, Any], target_ctx: LlamaContext, model: LlamaModel | None) -> None:
        """(``needs_model``) Refuse a model pair this strategy cannot run — the target context and the loaded
        draft model (None when ``draft_model`` is empty) — with a
        :class:`~specviz.errors.StrategyUnavailableError` saying why. Called when the strategy is configured
        (``start``, ``configure``, a restore), before anything changes, so nothing fails mid-run."""

    def kv_length(self) -> int | None:
        """Positions the drafter's own context holds."""
        return None

    def sync(self, history: Sequence[int]) -> list[tuple[int, int]]:
        """Bring the drafter's context in step with the committed ``history`` after a round; returns the
        rollbacks of that context since the last call, as ``(from, to)`` positions."""
        return []

    def context_state(self) -> bytes:
        """The drafter's context as bytes, for snapshots."""
        return b""

    def load_context_state(self, blob: bytes) -> None:
        """Restore :meth:`context_state`."""

    def memory_context(self) -> LlamaContext | None:
        """The drafter's own :class:`~specviz.backends.llama.LlamaContext`, whose memory figures the
        telemetry reports (None: the drafter has none of that type)."""
        return None

    def memory_log(self) -> list[Mark | Cut]:
        """The checkpoints and cuts of the drafter's context since the last call that were more than a tail
        removal (recurrent and hybrid draft models), oldest first."""
        return []

    def take_upkeep(self) -> Upkeep | None:
        """What feeding the drafter's own model cost since the last call (the counters start again); None
        for a drafter that keeps nothing in step."""
        return None

    def extra_telemetry(self) -> dict[str, Any]:
        """Strategy-specific figures merged into the session's telemetry (none by default)."""
        return {}

    def expect_plain(self, rounds: int | None) -> None:
        """(``pause_when_plain`` drafters; before :meth:`draft`) The policy's promise for this round: the next
        ``rounds`` rounds after it ask for no draft (``None``: no promise, any round may ask). A hint for
        what to keep ready; a drafter must still draft correctly whenever it is asked. Ignored by default."""


def context_hooks(drafter: Drafter | None) -> ContextDrafter | None:
    """``drafter``'s context hooks: the drafter itself when it declares ``has_context``, else None (no
    drafter, or one without a context). Refuses, as :func:`context_class` does, a drafter that declares
    ``has_context`` without deriving from :class:`ContextDrafter`."""
    if drafter is None or not drafter.has_context:
        return None
    if not isinstance(drafter, ContextDrafter):
        raise TypeError(_not_a_context_drafter(type(drafter)))
    return drafter


def context_class(cls: type[Drafter]) -> type[ContextDrafter] | None:
    """:func:`context_hooks` for a drafter class (for its class-level hook, :meth:`ContextDrafter.check_models`).

    A class that declares ``has_context`` without deriving from :class:`ContextDrafter` is refused with a
    :class:`TypeError`: its context would never be brought in step, saved or measured."""
    if not cls.has_context:
        return None
    if not issubclass(cls, ContextDrafter):
        raise TypeError(_not_a_context_drafter(cls))
    return cls


def _not_a_context_drafter(cls: type) -> str:
    return (
        f"drafter {cls.__name__} declares has_context but is not a ContextDrafter; derive it from "
        "specviz.strategies.context_drafter.ContextDrafter"
    )
