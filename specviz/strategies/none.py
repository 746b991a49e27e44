"""``none``: no speculation; every round verifies just the last token (plain decoding)."""

from __future__ import annotations

from typing import Sequence

from .base import Draft, Drafter


class NoDrafter(Drafter):
    """Plain one-token decoding through the same verify path as every other strategy."""

    name = "none"
    knobs = ()

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        return Draft(reason="none")
