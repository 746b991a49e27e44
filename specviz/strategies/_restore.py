"""Saving and restoring the part of a drafter's state that the token history alone cannot recreate.

Some draftless strategies keep state that depends on *how* the history was produced, not only on the
tokens: llama.cpp's n-gram map counts look-ups per key and remembers the accepted length of the last
draft per value; ngram-mod adds new n-grams to its pool in chunks of 32 and resets the pool after a
streak of poorly accepted drafts. A drafter restored with :meth:`Drafter.begin` alone would draft
differently from the original, so these drafters also offer :meth:`state_dict` (JSON-serialisable) and
:meth:`load_state_dict`.

The state belongs to the history the drafter had seen when it was saved (its length is stored as
``n_history``) and applies to that history or any extension of it: a drafter's state changes only in
``begin``/``draft``/``accept``, so tokens committed after the last call (for example after a round with
an empty draft, where no ``accept`` follows) do not matter. Order of calls on restore does not matter
either: ``load_state_dict`` applies the state at once when the drafter already mirrors at least
``n_history`` tokens, and keeps it until the next ``draft``/``accept`` so that a following ``begin`` on a
history of at least that length applies it again (a ``begin`` on a shorter history discards it).
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

from ..errors import SnapshotError


class RestorableState:
    """Mixin for drafters with a :class:`~specviz.strategies.history.TokenMirror` at ``self._mirror``.

    Subclasses set ``_state_format`` and implement ``_export_state()`` (a JSON-serialisable dict) and
    ``_import_state(d)`` (apply it; the mirror holds the history the state belongs to).
    """

    _state_format: str = ""

    def _init_restore(self) -> None:
        self._pending_state: dict[str, Any] | None = None

    # -- public ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state :meth:`begin` cannot rebuild from the history, as plain JSON-serialisable data."""
        d = self._export_state()
        d["format"] = self._state_format
        d["n_history"] = int(self._mirror.array.shape[0])  # type: ignore[attr-defined]
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (before or after ``begin`` on the restored history)."""
        if not isinstance(d, dict) or d.get("format") != self._state_format or "n_history" not in d:
            raise SnapshotError(
                f"drafter state is not a {self._state_format!r} state (got format "
                f"{d.get('format') if isinstance(d, dict) else type(d).__name__!r}); "
                "restore it into the strategy that saved it")
        self._pending_state = copy.deepcopy(d)
        if int(self._mirror.array.shape[0]) >= int(d["n_history"]):  # type: ignore[attr-defined]
            self._apply_pending()

    # -- for subclasses -------------------------------------------------------------------------
    def _after_begin(self, history: Sequence[int]) -> None:
        """Call at the end of ``_begin``: apply a pending loaded state that belongs to this history."""
        if self._pending_state is not None:
            if len(history) >= int(self._pending_state["n_history"]):
                self._apply_pending()
            else:
                self._pending_state = None

    def _settle(self) -> None:
        """Call at the start of ``_draft``/``_accept``: a pending state can no longer apply."""
        self._pending_state = None

    def _apply_pending(self) -> None:
        d = self._pending_state
        assert d is not None
        try:
            self._import_state(d)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise SnapshotError(f"drafter state for {self._state_format!r} is malformed: {exc}; "
                                "restore a snapshot written by this version") from exc

    def _export_state(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _import_state(self, d: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
