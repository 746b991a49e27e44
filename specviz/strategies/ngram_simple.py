"""``ngram-simple``: llama.cpp's simplest self-speculation.

Look up the last ``size_n`` tokens (the lookup n-gram) in the earlier history, searching backwards
for the most recent occurrence, and draft the ``size_m`` tokens (the m-gram) that followed it. The
search runs at most every ``check_rate`` tokens of history. As upstream, there is no draft until the
history holds more than ``size_n + size_m + 1`` tokens, and a match followed by fewer than ``size_n``
tokens is not used.

Restoring: the check-rate position is what ``begin`` cannot rebuild from the history; it is saved by
:meth:`~Drafter.state` (so a snapshot or a rewind with ``check_rate`` above 1 drafts as the running
session did).
"""

from __future__ import annotations

from typing import Any, Sequence

from .base import Draft, PeekingDrafter
from .history import find_ngram
from .knobs import ngram_size_knobs


class NgramSimpleDrafter(PeekingDrafter):
    """Most-recent n-gram match, m-gram draft, optional check rate."""

    name = "ngram-simple"
    state_format = "ngram-simple/1"
    knobs = ngram_size_knobs("ngram-simple", min_hits=False)

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self._last_check = 0

    def _begin(self, history: Sequence[int]) -> None:
        self._last_check = 0

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        arr = self.tokens
        n, m = self.config["size_n"], self.config["size_m"]
        # upstream's cur_len excludes the newest (sampled) token, which we hold as history[-1]
        cur_len = arr.shape[0] - 1
        if self._last_check + self.config["check_rate"] > cur_len > self._last_check:
            return Draft(reason="check-rate")
        if cur_len <= n + m + 1:
            return Draft(reason="short-history")
        self._last_check = cur_len
        pattern = arr[arr.shape[0] - n :]
        # matches must start at 1..cur_len-n-1 (upstream skips index 0 and the current position)
        pos = find_ngram(arr[:cur_len], pattern, cur_len - n, last=True)
        if pos <= 0:
            return Draft(reason="no-match")
        copy = min(m, cur_len - (pos + n))
        if copy < n:
            return Draft(reason="no-match")
        return Draft(tokens=arr[pos + n : pos + n + copy].tolist())

    def _export_state(self) -> dict[str, Any]:
        return {"last_check": self._last_check}

    def _import_state(self, d: dict[str, Any]) -> None:
        last = d["last_check"]
        if not isinstance(last, int) or isinstance(last, bool) or not 0 <= last <= self.tokens.shape[0]:
            raise ValueError(f"check position {last!r} does not fit a history of {self.tokens.shape[0]} tokens")
        self._last_check = last

    def peek(self, history: Sequence[int]) -> int | None:
        """The first token a draft would propose now; the check-rate position is left as it was."""
        self.mirror.sync(history)
        last_check = self._last_check  # the only state a draft changes
        try:
            d = self._draft(history, 1)
        finally:
            self._last_check = last_check
        return d.tokens[0] if d.tokens else None
