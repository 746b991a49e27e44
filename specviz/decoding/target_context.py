"""A new target context for a strategy that reads the target's layers, where the old one's taps are fixed.

On llama.cpp's Vulkan backend a context that has computed a graph must not have its layer taps switched
(:func:`~specviz.backends.capture.taps_fixed`), and making an EAGLE-3 head next to such a context corrupts
the heap at a later verify batch too (with either capture path; that second crash may well have been the
one of a batch that asks for no logits, :func:`~specviz.backends.context_base.keeps_an_output_row`, found
later and not told apart since); a context that has evaluated nothing takes
both as the CPU backend does. So wherever a session builds a drafter that reads the target's layers
(``reads_target``: EAGLE-3, DFlash, a chain with one of them) on a context that has computed, it first
gives itself a new target context of the same settings: a new generation (``Session.start``), a switch
between rounds (``Session.configure``), a restored snapshot (``Session.restore_into``) and a rewind to a
round of such a strategy (:mod:`specviz.decoding.rewind`). Each of them:

1. ``old, fresh = s.ctx, replace_for(s, strategy)``: ``fresh`` is None where the current context serves
   (always on the CPU backend), else it is already ``s.ctx``;
2. builds the drafter, and fills the new context (:func:`refill`) unless a prompt or a snapshot does;
3. on a failure calls :func:`put_back` (the old context, untouched, is the session's again); on success
   closes the old context once the old drafter (which may hold it) is closed.

The session's three (start, configure, restore) are :func:`swap_target`, a ``with`` block around step 2.

Deliberate departure from upstream, whose drafters switch the taps of the running context.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator, Protocol, Sequence

from ..backends.capture import taps_fixed
from ..backends.llama import LlamaContext, LlamaModel
from ..backends.memory import Cut
from ..strategies import strategy_class


class TargetHolder(Protocol):
    """What this module uses of a session: its target model, the settings of its context, and the context."""

    ctx: LlamaContext

    @property
    def model(self) -> LlamaModel:
        """The target model."""
        ...

    @property
    def context_args(self) -> dict[str, Any]:
        """The settings the target's context was created with."""
        ...


def replace_for(s: TargetHolder, strategy: str) -> LlamaContext | None:
    """A new, empty target context made ``s``'s, where ``strategy`` reads the target's layers and the current
    context's taps are fixed; None (nothing changed) otherwise. Creating it may refuse
    (:class:`~specviz.errors.ContextError`): then nothing has changed either."""
    if not strategy_class(strategy).reads_target or not taps_fixed(s.ctx):
        return None
    fresh = LlamaContext(s.model, **s.context_args)
    s.ctx = fresh
    return fresh


def put_back(s: TargetHolder, old: LlamaContext, fresh: LlamaContext | None) -> None:
    """Undo :func:`replace_for` after a refusal: ``old`` is ``s``'s context again and ``fresh`` is freed."""
    if fresh is not None:
        s.ctx = old
        fresh.close()


def refill(fresh: LlamaContext, old: LlamaContext, tokens: Sequence[int], *, keep_last: bool = False) -> Cut:
    """Evaluate ``tokens`` into the new, empty ``fresh`` (``keep_last``: with the last one's row, as after a
    whole-prompt prefill), with ``old``'s saved states (recurrent memory's rewind points, valid for the same
    model and tokens). Returns the cut it amounts to (``reprefill``: every kept token evaluated again, from
    ``old``'s length)."""
    t0 = time.perf_counter()
    fresh.memory.adopt(old.memory)
    fresh.memory.forget(above=len(tokens))  # states past the kept tokens continue from nothing here
    if tokens:
        fresh.eval_prompt(list(tokens), 0, keep_last=keep_last)
    return Cut("reprefill", old.kv_len(), len(tokens), time.perf_counter() - t0, reapplied=len(tokens))


@contextmanager
def swap_target(s: TargetHolder, strategy: str) -> Iterator[tuple[LlamaContext, LlamaContext | None]]:
    """Steps 1 and 3 of the module docstring around a ``with`` block (step 2), which gets ``(old, fresh)``:
    the block builds the new drafter and closes the old one (which may hold ``old``); a failure in it puts
    ``old`` back untouched and re-raises, success closes ``old`` where ``fresh`` replaced it."""
    old, fresh = s.ctx, replace_for(s, strategy)
    try:
        yield old, fresh
    except BaseException:
        put_back(s, old, fresh)
        raise
    if fresh is not None:
        old.close()
