"""A generation under a grammar: the grammar's state after the committed tokens, and a verify batch's rows
constrained by the state the path before each row leaves.

llama-server verifies a draft with the request's own sampler, grammar included
(``common_sampler_sample_and_accept_n``): row ``i`` is sampled under the grammar's state after the committed
text and the draft's first ``i`` tokens. :class:`ConstrainedRows` does the same in front of the one acceptor
(:func:`specviz.decoding.acceptor.accept`): it hands the acceptor each row it asks for, in order, with the
grammar's forbidden tokens at −∞, advancing a copy of the generation's state along the draft as the acceptor
accepts it. The acceptor's rules do not change; a draft token the grammar forbids has probability 0 there
and is rejected at that row.

Greedy rows are read as llama.cpp's ``common_sampler`` reads them: the row's own first maximum is asked about
alone (one candidate, microseconds); when the grammar allows it, it is the first maximum of the masked row
too (masking only lowers other entries to −∞), and the row is left as the model gave it: its reported
probabilities are the model's before the grammar. Only a row whose own choice the grammar forbids is masked
over the whole vocabulary (tens of milliseconds on a 262k vocabulary); its probabilities are then those of
the masked row. Sampled rows are always masked: the constrained distribution needs the allowed tokens' whole
mass.

:class:`GrammarState` is what a :class:`~specviz.decoding.generation.Generation` keeps: the grammar's text
and llama.cpp's state after the tokens generated so far. llama.cpp's grammar state cannot be serialised, so
a rewind and a restored snapshot (a fork is one) rebuild it by replaying the generated tokens from the
start (:meth:`GrammarState.rewound`): microseconds a token.

As it advances past committed tokens, :class:`GrammarState` marks those the grammar forced (the only token
it allowed there), and it gives the ``grammar`` drafter the forced continuation
(:meth:`GrammarState.forced_continuation`): both through :mod:`specviz.decoding.forced`, without the whole
vocabulary. :meth:`ConstrainedRows.forbids` says whether the grammar forbade a rejected draft token (its own
rejection cause in the events and the diagnosis).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..backends.grammar import GrammarSampler
from ..errors import GrammarError
from .forced import VocabIndex, forced_bytes, forced_token, tokens_of, vocab_index
from .rowscan import RowSource, ScoredRow

__all__ = ["ConstrainedRows", "FORCED_BYTES_PER_TOKEN", "GrammarState"]

#: How many bytes of forced text :meth:`GrammarState.forced_continuation` reads per token it may draft (a
#: token of structured output is rarely longer).
FORCED_BYTES_PER_TOKEN = 8


class GrammarState:
    """A generation's grammar (GBNF ``gbnf`` on ``model``'s vocabulary) in the state the generated tokens
    ``generated`` leave (each must be allowed in turn: a token that is not raises
    :class:`~specviz.errors.GrammarError`)."""

    def __init__(self, model: Any, gbnf: str, generated: Sequence[int] = ()) -> None:
        self.model = model
        self.gbnf = gbnf
        self.sampler = GrammarSampler(model.vocab, model.n_vocab, gbnf)
        self.n_tokens = 0
        vocab_index(model)  # built here, once per model (about a second on 262k tokens), not inside a round
        self.advance(generated)

    def advance(self, tokens: Sequence[int], *, mark: bool = False) -> list[int]:
        """Advance past committed ``tokens`` (never an end-of-generation token: the round cuts before it); with
        ``mark``, return the indexes in ``tokens`` of those the grammar forced (the only token it allowed
        there, :func:`~specviz.decoding.forced.forced_token`), else an empty list."""
        forced: list[int] = []
        for i, t in enumerate(tokens):
            if mark and forced_token(self.sampler, self.index) == int(t):
                forced.append(i)
            self.sampler.accept(int(t))
            self.n_tokens += 1
        return forced

    @property
    def index(self) -> VocabIndex:
        """The model's vocabulary arranged for the forced-token tests (built on first use, once per model)."""
        return vocab_index(self.model)

    def forced(self) -> int | None:
        """The one token the grammar allows next, or None when it allows none or several."""
        return forced_token(self.sampler, self.index)

    def forced_continuation(self, n_max: int) -> list[int]:
        """Up to ``n_max`` tokens writing the text every continuation the grammar allows from here starts with
        (:func:`~specviz.decoding.forced.forced_bytes`, longest tokens first); this state is left as it was.

        A last token that ends the forced text is left out where the grammar would let the target write a
        longer token in its place (after a key's closing quote, ``":`` as well as ``"``): the target's
        choice there is not forced, and a model writes the longer token more often than not."""
        if n_max <= 0:
            return []
        walker = self.sampler.clone()
        try:
            text = forced_bytes(walker, self.index, FORCED_BYTES_PER_TOKEN * n_max)
        finally:
            walker.close()
        tokens = tokens_of(text, self.index)
        if not tokens or len(tokens) > n_max:
            return tokens[:n_max]
        walker = self.sampler.clone()
        try:
            for t in tokens[:-1]:
                walker.accept(t)
            longer = self.index.children(self.model.piece_bytes(tokens[-1]))[0]
            extended = len(longer) > 0 and bool(walker.allowed(longer).any())
        finally:
            walker.close()
        return tokens[:-1] if extended else tokens

    def rewound(self, generated: Sequence[int]) -> GrammarState:
        """A new state for the generated tokens ``generated`` (a rewind's or a restore's), replayed from the
        grammar's start; this one is left as it was."""
        return GrammarState(self.model, self.gbnf, generated)

    def rows(self, draft: Sequence[int], rows: RowSource, greedy: bool) -> ConstrainedRows:
        """The verify batch's ``rows`` (the pending token's row first, then one per draft token) constrained
        for the acceptor (see the module docstring)."""
        row = rows if callable(rows) else rows.__getitem__
        return ConstrainedRows(self.sampler, draft, row, greedy)

    def state(self) -> dict[str, Any]:
        """What identifies this state: the grammar and how many tokens it has accepted."""
        return {"gbnf": self.gbnf, "n_tokens": self.n_tokens}

    def close(self) -> None:
        """Free llama.cpp's sampler."""
        self.sampler.close()


class ConstrainedRows:
    """A verify batch's rows, each constrained by the grammar's state the path before it leaves (see the
    module docstring), read in order as the acceptor reads them. ``dead`` is the first row where the grammar
    allows no token (None: none so far)."""

    __slots__ = ("_state", "_draft", "_row", "_greedy", "_at", "_seen", "dead")

    def __init__(
        self, state: GrammarSampler, draft: Sequence[int], row: Callable[[int], np.ndarray], greedy: bool
    ) -> None:
        self._state = state  # the generation's own state until row 1 is asked for, then a copy walked along the draft
        self._draft = draft
        self._row = row
        self._greedy = greedy
        self._at = 0
        self._seen: set[int] = set()
        self.dead: int | None = None

    def __call__(self, i: int) -> np.ndarray:
        row = self._row(i)
        if i in self._seen:
            return row
        if i < self._at:
            raise GrammarError(f"grammar: verify row {i} was asked for after row {self._at}", reason="row order")
        if i > self._at:
            if self._at == 0:
                self._state = self._state.clone()
            for j in range(self._at, i):  # the acceptor accepted these draft tokens to reach row i
                self._state.accept(int(self._draft[j]))
            self._at = i
        self._seen.add(i)
        if self._greedy and self._state.allows(ScoredRow(row, normaliser=True).best):
            return row  # the row's own choice is allowed: it is the masked row's choice too
        if not self._state.mask(row) and self.dead is None:
            self.dead = i
        return row

    def forbids(self, token: int) -> bool:
        """Whether the grammar forbids ``token`` at the last row read (where the acceptor stopped: a rejected
        draft token the grammar forbids there could never have been accepted)."""
        return not self._state.allows(int(token))

    def close(self) -> None:
        """Free the copy of the grammar's state walked along the draft (the generation's own is kept)."""
        if self._at > 0:
            self._state.close()

    def check(self, rows_read: int, position: int) -> None:
        """Raise :class:`~specviz.errors.GrammarError` when the acceptor's last row (``rows_read − 1``) is one
        where the grammar allows no token: history position ``position`` plus that row has no continuation."""
        if self.dead is not None and self.dead == rows_read - 1:
            at = position + self.dead
            raise GrammarError(
                f"grammar: no token of the vocabulary is allowed at position {at}; the generation cannot go on "
                "under this grammar (rewind, or start again with a grammar the model's vocabulary can complete)",
                reason="no allowed token",
                position=at,
            )
