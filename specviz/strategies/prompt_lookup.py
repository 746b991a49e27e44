"""``prompt-lookup``: draft the tokens that followed an earlier occurrence of the latest n-gram.

As in the static-shape runner's ``--prompt-lookup`` (docs/strategies.md), and prompt lookup decoding
generally: try n-gram sizes from ``max_ngram`` down to ``min_ngram``; for the first size whose trailing
n-gram occurs earlier in the history, draft the tokens that followed its earliest occurrence.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..decoding.knob_schema import Knob
from ..errors import KnobError
from .base import Draft, PeekingDrafter
from .history import find_ngram


def _check_ngram_sizes(config: dict[str, Any]) -> None:
    """Cross-knob rule: ``min_ngram`` ≤ ``max_ngram``."""
    if config["min_ngram"] > config["max_ngram"]:
        raise KnobError(
            f"knob 'min_ngram': {config['min_ngram']} is larger than max_ngram={config['max_ngram']}; "
            "set min_ngram <= max_ngram",
            knob="min_ngram",
            value=config["min_ngram"],
        )


class PromptLookupDrafter(PeekingDrafter):
    """Prompt lookup decoding with a min/max n-gram size."""

    name = "prompt-lookup"
    knob_rules = (_check_ngram_sizes,)
    knobs = (
        Knob(
            "max_ngram",
            int,
            3,
            "largest n-gram size to look up (tried first)",
            lo=1,
            hi=64,
            aliases=("--prompt-lookup",),
        ),
        Knob(
            "min_ngram", int, 1, "smallest n-gram size to look up", lo=1, hi=64, aliases=("--prompt-lookup-min-ngram",)
        ),
    )

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        arr = self.tokens
        L = arr.shape[0]
        for n in range(min(self.config["max_ngram"], L - 1), self.config["min_ngram"] - 1, -1):
            pattern = arr[L - n :]
            # an occurrence must end before the trailing n-gram starts continuing: start + n < L
            pos = find_ngram(arr, pattern, L - n, last=False)
            if pos >= 0:
                start = pos + n
                return Draft(tokens=arr[start : min(start + n_max, L)].tolist())
        return Draft(reason="no-match")

    def peek(self, history: Sequence[int]) -> int | None:
        """The first token a draft would propose now (prompt lookup keeps no state besides the mirror)."""
        self.mirror.sync(history)
        d = self._draft(history, 1)
        return d.tokens[0] if d.tokens else None
