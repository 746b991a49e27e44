"""Stop strings: end a generation exactly where plain decoding with the same stop strings ends it.

Plain decoding with stop strings (as llama.cpp's server does it) generates one token at a time and, after
each, looks for a stop string in the generated text; at the first token whose text completes one, it
stops: that token is generated (it is in the cache's history), and the text is cut where the stop string
begins — possibly inside that token, possibly inside an earlier one when the stop string spans several.

A speculative round commits several tokens at once. :class:`StopScanner` finds, among a round's committed
tokens, the first one that completes a stop string; the round then commits up to and including that token
and no further, so the history, the caches and the drafter end exactly where plain decoding's would, and
speculation goes on until then (no fallback to one-token rounds). The text is cut with
:func:`cut_text`, which only needs the history: nothing is kept between rounds.

Only the generated text is searched (the prompt is not), as llama.cpp's server does; the text is the bytes
the tokens render to (special tokens such as BOS and end-of-generation ones are not part of it), so a stop
string can match inside a multi-byte character only where the bytes do.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..errors import KnobError

#: Limits on the stop strings of one generation.
MAX_STOPS = 16
MAX_STOP_CHARS = 256


def check_stops(stop: object) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings (None: none), or :class:`~specviz.errors.KnobError`."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOPS:
        raise KnobError(
            f"stop: expected a list of at most {MAX_STOPS} strings; got {stop!r:.80}", knob="stop", value=stop
        )
    for s in stop:
        if not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS:
            raise KnobError(
                f"stop: each stop string must be text of 1 to {MAX_STOP_CHARS} characters; got {s!r:.80}",
                knob="stop",
                value=s,
            )
    return tuple(stop)


class StopScanner:
    """Finds where stop strings complete in the generated text (see the module docstring).

    ``piece_bytes(token)`` renders a token; ``rendered(token)`` says whether it is part of the text.
    """

    def __init__(
        self, stops: Sequence[str], piece_bytes: Callable[[int], bytes], rendered: Callable[[int], bool]
    ) -> None:
        self.stops = [s.encode("utf-8") for s in stops]
        self.keep = max((len(s) for s in self.stops), default=1) - 1  # bytes of context an occurrence may need
        self._bytes = piece_bytes
        self._rendered = rendered

    def render(self, t: int) -> bytes:
        """The bytes token ``t`` adds to the text (none for a token that is not part of it)."""
        return self._bytes(t) if self._rendered(t) else b""

    def _tail(self, generated: Sequence[int], start: int = 0) -> bytes:
        """The last ``keep`` (or more) bytes of the text of ``generated[start:]``."""
        parts: list[bytes] = []
        n = 0
        i = len(generated) - 1
        while i >= start and n < self.keep:
            b = self.render(generated[i])
            parts.append(b)
            n += len(b)
            i -= 1
        return b"".join(reversed(parts))

    def find(self, generated: Sequence[int], new: Sequence[int], start: int = 0) -> int | None:
        """Index in ``new`` of the first token whose text completes a stop string, given the tokens
        ``generated[start:]`` before them (``start`` skips the prompt without copying); None when none does."""
        if not self.stops or not new:
            return None
        buf = self._tail(generated, start)
        for j, t in enumerate(new):
            before = len(buf)
            buf += self.render(t)
            if len(buf) == before:
                continue
            for s in self.stops:
                if buf.find(s, max(0, before - len(s) + 1)) >= 0:
                    return j
        return None

    def cut(self, generated: Sequence[int]) -> int | None:
        """Byte offset in the text of ``generated`` where the earliest stop string begins (None: none)."""
        text = b"".join(self.render(t) for t in generated)
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None


def cut_text(scanner: StopScanner, generated: Sequence[int]) -> str:
    """The text of ``generated`` up to the earliest stop string (all of it when there is none)."""
    text = b"".join(scanner.render(t) for t in generated)
    at = scanner.cut(generated)
    return (text if at is None else text[:at]).decode("utf-8", "replace")
