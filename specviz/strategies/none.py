"""``none``: no speculation; every round verifies just the last token (plain decoding)."""

from __future__ import annotations

from .base import Drafter


class NoDrafter(Drafter):
    """Plain one-token decoding through the same verify path as every other strategy."""

    name = "none"
    knobs = ()
    drafts = False
