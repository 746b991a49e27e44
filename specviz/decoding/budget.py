"""The draft-length budget of a round: the policy's choice, the hard caps, then verify-tile alignment.

In order:

1. the drafting policy (:mod:`specviz.decoding.policy`) picks a length up to ``draft_max`` (``fixed`` always
   ``draft_max``; ``adaptive`` and ``cost`` shorter when that pays);
2. hard caps lower it: the remaining generation budget (the round commits at most ``limit + 1`` tokens),
   the free context (the verify batch ``[pending] + draft`` must fit below ``n_ctx``), ``n_batch`` (one
   verify is one ``llama_decode``), — with ``align`` — ``n_ubatch`` (one verify is one forward), and the
   target's memory (``ring``: a ring-sized sliding-window cache keeps a rejection recoverable only for a
   verify of one micro-batch, :func:`specviz.backends.memory.ring_draft_limit`; the draft is shortened
   rather than checkpointed, since a checkpoint of the ring would copy every ring cell each round);
3. with ``align``, verify-tile alignment rounds a verify batch longer than ``verify_tile`` rows down to a
   multiple of it (:func:`~specviz.decoding.tiling.aligned_length`), as the static-shape
   runner's ``oneForwardDraftBudget`` does with the engine's tile width. llama.cpp's CPU kernels for quantised
   weights multiply four batch rows at a time; leftover rows take a one-row path that reads every
   weight again, so a verify of 17 rows costs more than one of 16. A draft that comes back shorter than
   the limit is rounded down by the same rule in the round (:func:`~specviz.decoding.round.run_round`).

The result names the cap that lowered the limit below the request, so the inspector can say why a draft
was short.

Departure from llama.cpp's ``speculative-simple``: it caps a draft at ``n_ctx - n_past - 2`` (one spare
position); we use the exact bound ``n_ctx - n_past - 1`` (the batch's last position is ``n_ctx - 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .policy import DraftingPolicy
from .tiling import aligned_length, verify_tile


@dataclass(frozen=True)
class Caps:
    """The hard limits of one round, in draft tokens' terms (before subtracting anything).

    ``remaining`` is how many tokens the generation may still commit; ``free_ctx`` how many positions
    are left after the committed history (``n_ctx - len(history)``); ``n_batch`` and ``n_ubatch`` are
    the target context's batch sizes; ``memory`` the longest draft the target's memory can roll back
    after (None: any); ``load`` the longest draft a batched run's draft schedule allows at its current number
    of busy sequences (:mod:`specviz.decoding.batch`; None: any).
    """

    remaining: int
    free_ctx: int
    n_batch: int
    n_ubatch: int
    memory: int | None = None
    load: int | None = None


@dataclass(frozen=True)
class Budget:
    """The draft length a round may use: ``limit``, the configured ``requested`` length, the ``cap``
    that lowered it (``policy``, ``budget``, ``context``, ``batch``, ``ubatch``, ``ring``, ``load``, ``tile``;
    ``prompt`` for the first round after a whole-prompt prefill, which reads the prompt's row and cannot draft) or
    None, and
    the policy's ``expected`` committed tokens for that length (cost policy only)."""

    requested: int
    limit: int
    cap: str | None
    expected: float | None

    @property
    def policy_plain(self) -> bool:
        """Whether the policy itself chose plain decoding this round (no cap did)."""
        return self.limit == 0 and self.cap == "policy"


def plan(knobs: Mapping[str, Any], policy: DraftingPolicy, caps: Caps, *, drafts: bool = True) -> Budget:
    """The budget of the next round for a strategy's ``knobs`` (see the module docstring for the order).

    ``drafts`` is False for a strategy that never drafts (``none``): the budget is then 0.
    """
    if not drafts:
        return Budget(0, 0, None, None)
    requested = int(knobs.get("draft_max", 0))
    draft_min = int(knobs.get("draft_min", 0))
    align = bool(knobs.get("align", True))
    tile = verify_tile(knobs)
    chosen, expected = policy.length(draft_min, requested, tile)
    limit, cap = chosen, ("policy" if chosen < requested else None)
    hard = [("budget", caps.remaining - 1), ("context", caps.free_ctx), ("batch", caps.n_batch - 1)]
    if align:
        hard.append(("ubatch", caps.n_ubatch - 1))
    if caps.memory is not None:
        hard.append(("ring", caps.memory))
    if caps.load is not None:
        hard.append(("load", caps.load))
    for name, value in hard:
        if value < limit:
            limit, cap = max(value, 0), name
    aligned = aligned_length(limit, tile, draft_min)
    if aligned < limit:
        limit, cap = aligned, "tile"
    if expected is not None and limit < chosen:
        expected = policy.expected_tokens(limit)
    return Budget(requested, limit, cap, expected)
