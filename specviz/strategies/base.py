"""The drafter interface every strategy implements.

In the spirit of llama.cpp's ``common_speculative`` (begin / draft / accept per implementation):

* :meth:`Drafter.begin` is called with the whole token history when a session starts, when the
  strategy is switched in, and after a restore. Request-local state is rebuilt from that history, so
  a restored session drafts exactly as the original would.
* :meth:`Drafter.draft` proposes up to ``n_max`` tokens to follow ``history`` (the full history, prompt
  included, whose last token is the newest committed one).
* :meth:`Drafter.accept` reports how many of the last proposal's tokens the target accepted, and the
  tokens committed this round (already appended to ``history``).
* :meth:`Drafter.peek` (optional) tells, without side effects, the first token :meth:`draft` would
  propose now; the ``cost`` policy learns from it in rounds where it chose not to draft.

Each class declares ``name`` and ``knobs`` (a tuple of :class:`~specviz.config.Knob`); the session's
shared draft-length knobs are added by the registry. A drafter never imports a UI library.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from ..config import Knob


@dataclass
class Draft:
    """A proposal: ``tokens``, the drafter's probability per token (or ``None``) and why it is short.

    ``reason`` is a short code (``no-match``, ``check-rate``, ``p-min`` …) when the drafter proposed
    fewer tokens than it was allowed, else ``None``.
    """

    tokens: list[int] = field(default_factory=list)
    probs: list[float | None] | None = None
    reason: str | None = None
    dists: Any = None  # per-token full draft distributions (model drafts under sampling), else None


@dataclass
class DrafterStats:
    """Per-strategy statistics as llama.cpp prints them."""

    calls: int = 0  # draft() calls
    drafts_generated: int = 0  # calls that produced a non-empty draft
    drafts_accepted: int = 0  # drafts with at least one token accepted
    tokens_generated: int = 0  # draft tokens proposed
    tokens_accepted: int = 0  # draft tokens accepted
    begin_seconds: float = 0.0
    draft_seconds: float = 0.0
    accept_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary form."""
        return dict(self.__dict__)


class Drafter:
    """Base class of every strategy. Subclasses override :meth:`_begin`, :meth:`_draft`, :meth:`_accept`.

    The public :meth:`begin`/:meth:`draft`/:meth:`accept` wrappers keep :attr:`stats`.
    """

    name: ClassVar[str] = ""
    knobs: ClassVar[tuple[Knob, ...]] = ()
    needs_model: ClassVar[bool] = False

    def __init__(self, **knobs: Any) -> None:
        self.config: dict[str, Any] = {k.name: knobs.get(k.name, k.default) for k in self.knobs}
        self.stats = DrafterStats()

    # -- public wrappers -------------------------------------------------------------------------
    def begin(self, history: Sequence[int]) -> None:
        """(Re)build request-local state from the full token history."""
        t = time.perf_counter()
        self._begin(history)
        self.stats.begin_seconds += time.perf_counter() - t

    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        """Propose up to ``n_max`` tokens following ``history``."""
        t = time.perf_counter()
        d = self._draft(history, n_max) if n_max > 0 else Draft(reason="limit")
        if len(d.tokens) > n_max:
            d.tokens = d.tokens[:n_max]
            if d.probs is not None:
                d.probs = d.probs[:n_max]
        self.stats.draft_seconds += time.perf_counter() - t
        self.stats.calls += 1
        if d.tokens:
            self.stats.drafts_generated += 1
            self.stats.tokens_generated += len(d.tokens)
        return d

    def accept(self, n_accepted: int, history: Sequence[int]) -> None:
        """Report that ``n_accepted`` tokens of the last draft were accepted."""
        t = time.perf_counter()
        self._accept(n_accepted, history)
        self.stats.accept_seconds += time.perf_counter() - t
        if n_accepted > 0:
            self.stats.drafts_accepted += 1
            self.stats.tokens_accepted += n_accepted

    def peek(self, history: Sequence[int]) -> int | None:
        """The first token :meth:`draft` would propose after ``history``, leaving every state and statistic
        unchanged; ``None`` when there is none or the strategy cannot tell without side effects."""
        return self._peek(history)

    @staticmethod
    def check(config: dict[str, Any]) -> None:
        """Cross-knob rules on a complete, type-checked config; raise KnobError to refuse it."""

    def reconfigure(self, **knobs: Any) -> None:
        """Apply already-validated knob values. Default: update config and rebuild nothing."""
        self.config.update({k: v for k, v in knobs.items() if k in self.config})

    # -- to override -----------------------------------------------------------------------------
    def _begin(self, history: Sequence[int]) -> None:
        pass

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        return Draft(reason="none")

    def _accept(self, n_accepted: int, history: Sequence[int]) -> None:
        pass

    def _peek(self, history: Sequence[int]) -> int | None:
        return None

    def after_round(self, history: Sequence[int]) -> None:
        """Called after every round (drafted or not) with the committed history."""

    def take_rollbacks(self) -> list[tuple[int, int]]:
        """KV rollbacks of the drafter's own context since the last call, as (from, to) positions."""
        return []

    def close(self) -> None:
        """Release resources (model-backed drafters free their context)."""
