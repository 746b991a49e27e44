"""What one round teaches: the drafting policy's observations and the telemetry counters, from its
:class:`~specviz.decoding.round.RoundResult` (the session calls :func:`learn` after every round).

The drafter's upkeep (feeding its own model, :class:`~specviz.strategies.base.Upkeep`) is learnt apart
from its draft steps: the part of it spent inside the draft call is taken off the draft's seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .policy import DraftingPolicy
from .round import RoundResult
from .telemetry import Telemetry

if TYPE_CHECKING:
    from ..strategies.base import Upkeep


def learn(res: RoundResult, policy: DraftingPolicy, telemetry: Telemetry, upkeep: Upkeep | None) -> None:
    """Feed round ``res`` (and the drafter's ``upkeep`` of it, None without) to ``policy`` and ``telemetry``."""
    if not res.prefilled:  # a prefilled round's row came with the prompt: its seconds are no verify's
        policy.observe_verify(res.batch_size, res.verify_seconds)
    draft_seconds = res.draft_seconds
    if upkeep is not None:
        policy.observe_upkeep(upkeep.seconds, upkeep.tokens, upkeep.in_draft)
        draft_seconds = max(0.0, draft_seconds - upkeep.in_draft)
    if res.draft:
        policy.observe(len(res.draft), res.n_accepted, draft_seconds)
    elif res.shadow is not None and res.committed:
        policy.observe_shadow(res.shadow == res.committed[0])
    elif res.budget.limit > 0:  # asked for a draft, got none: what asking cost, upkeep included
        policy.observe(0, 0, draft_seconds + (upkeep.seconds if upkeep is not None else 0.0))
    else:
        policy.observe_idle()
    # last: when a burst has just passed, the timings go back to the last quiet window's (this round's are
    # forgotten with the burst's)
    policy.observe_load(res.cpu_seconds, res.round_seconds, res.n_threads)
    telemetry.record_round(
        n_drafted=len(res.draft),
        n_accepted=res.n_accepted,
        n_committed=len(res.committed),
        draft_seconds=res.draft_seconds,
        verify_seconds=res.verify_seconds,
        round_seconds=res.round_seconds,
        draft_probs=res.draft_probs,
        expected_tokens=res.budget.expected,
        drafter=res.drafter,
        cpu_seconds=res.cpu_seconds,
        n_threads=res.n_threads,
    )
    telemetry.record_grammar(len(res.forced), len(res.draft) - res.verdict.n_accepted if res.grammar_forbidden else 0)
    telemetry.record_memory(res.checkpoint, res.rollback, res.draft_memory)
    if res.tree is not None:
        telemetry.record_tree(res.tree.width, len(res.tree))
