"""``grammar``: drafts the text the generation's grammar forces.

Under a grammar or a JSON schema many characters are forced: a key's name once its opening quote is out,
the quote and colon after it, a closing bracket. From the grammar's state after the committed tokens the
drafter reads the text every continuation the grammar allows starts with
(:meth:`~specviz.decoding.constrained.GrammarState.forced_continuation`: a few grammar passes over the
vocabulary's few hundred shortest texts, never the whole vocabulary) and drafts it written in the
vocabulary's tokens, longest first. A token the grammar forces (the only one it allows) is always accepted
under greedy decoding; a token that writes forced text is accepted as the target's constrained choice
accepts it (the target may write the same text in other tokens). Without a grammar, or where the next
character is not forced, it proposes nothing (reason ``not-forced``; ``no-grammar``), so in a chain
(``--spec-type grammar,ngram-mod``) it goes first and the other members draft the free text.

The drafter reads the generation's grammar state, never the session: the session gives it a way to read
the current state when it builds the drafter (:func:`give_grammar`, the one place that hook is set), and
the state it reads is the one the round advances with the committed tokens. It keeps nothing of its own,
so it runs batched (each request's session gives it its own generation's state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from .base import Draft, Drafter
from .chain import ChainDrafter

if TYPE_CHECKING:
    from ..decoding.constrained import GrammarState

#: Reads the generation's grammar state now (None: the generation has no grammar).
GrammarSource = Callable[[], "GrammarState | None"]


class GrammarDrafter(Drafter):
    """Drafts the forced continuation of the generation's grammar (see the module docstring)."""

    name = "grammar"
    state_format = "grammar/1"
    knobs = ()

    def __init__(self) -> None:
        super().__init__()
        self.source: GrammarSource | None = None

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        state = self.source() if self.source is not None else None
        if state is None:
            return Draft(reason="no-grammar")
        tokens = state.forced_continuation(n_max)
        return Draft(tokens=tokens, reason=None if tokens else "not-forced")


def give_grammar(drafter: Drafter, source: GrammarSource) -> None:
    """Let ``drafter`` (or, in a chain, its ``grammar`` member) read the generation's grammar state through
    ``source``; a drafter without a grammar member is left as it is."""
    members = drafter.drafters if isinstance(drafter, ChainDrafter) else [drafter]
    for d in members:
        if isinstance(d, GrammarDrafter):
            d.source = source
