"""Rewind: back to the state right after an earlier round.

The session keeps one :class:`~specviz.decoding.generation.Checkpoint` per round
(:meth:`~specviz.decoding.generation.Generation.capture`): what the round left behind that the token history
alone does not determine — the telemetry counters, the drafting policy's state, the random generator's
state, the drafter's saved state (:meth:`~specviz.strategies.base.Drafter.state`) and counters, the
strategy and knobs in force, and how many events stood. A checkpoint holds no cache: the caches are cut.

:func:`rewind` goes back to a checkpoint:

* the history is cut to the checkpoint's length (or to ``position``);
* the target's cache is cut to ``len(history) - 1`` positions (the newest token stays pending, as after
  every round); the positions before it are the very ones the original rounds computed, so continuing
  from there repeats the original continuation exactly. Memory that cannot drop a tail (recurrent and
  hybrid models) restores the newest saved state at or before that position and re-applies the tokens
  after it (:meth:`~specviz.backends.memory.ContextMemory.cut`); those positions are then computed in
  one batch instead of round by round (equal to about 1e-6 on the f32 test models). A ring-sized
  sliding-window cache that no longer holds the keys the restarted forward needs refuses the rewind
  with :class:`~specviz.errors.RingCoverageError`, and nothing changes;
* the drafter is rebuilt: ``begin`` on the cut history (the ``draft`` strategy's context is cut to the
  common prefix there; ``eagle3`` and ``mtp``, whose context holds pairs built from the target's hidden
  states, rebuild it at their next draft by re-evaluating the committed positions once — llama.cpp's
  kernels give those states to about 1e-6 on the f32 test models, so the drafts repeat there), then
  ``load_state`` of the checkpoint's state; the strategy and knobs of the checkpoint come back (a
  different drafter is built when they differ);
* the telemetry, the policy, the generator and the drafter's counters come back from the checkpoint;
* a grammar's state (:mod:`specviz.decoding.constrained`) is rebuilt by replaying the kept generated tokens
  (llama.cpp's grammar state cannot be saved);
* the events after the checkpoint are dropped and a :class:`~specviz.decoding.events.Rewound` event is published;
* a queued configuration is discarded (it was queued for a round that no longer comes next).

A rewind to a ``position`` inside a round keeps the first tokens that round committed; everything else
is as after the round before it (its telemetry, policy, drafter state). So the telemetry does not count
those kept tokens, and the next round is numbered as the one they came from.

What a rewind does not bring back, on purpose: the measured verify-cost curve (a measurement of the
machine, not of the generation), a draft model's cumulative seconds in ``extra_telemetry``, and for
``ngram-mod`` the count of pool adds onto occupied slots (it only decides whether ``begin`` clears a
pool that is a quarter full).

:func:`rewind` works on the session's parts (:class:`~specviz.decoding.generation.SessionParts`); the
session takes its lock, publishes the event and clears a cancellation. ``Session.fork`` (a second session
at the same point) is a snapshot restored into a new session that shares the loaded models.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

from ..errors import RewindError, RingCoverageError, SessionStateError
from ..strategies.context_drafter import context_hooks
from .events import Event, Rewound
from .generation import Checkpoint, Generation, SessionParts
from .policy import make_policy
from .target_context import put_back, refill, replace_for
from .telemetry import Telemetry

__all__ = ["rewind", "effective_events"]


def _target(g: Generation, round: int | None, position: int | None) -> tuple[Checkpoint, int]:
    """The checkpoint to go back to and the history length to keep, or :class:`RewindError`."""
    if not g.started:
        raise SessionStateError("nothing to rewind: call start() first")
    if (round is None) == (position is None):
        raise RewindError("rewind: give exactly one of round=N or position=P")
    cks = g.checkpoints
    if round is not None:
        if isinstance(round, bool) or not isinstance(round, int):
            raise RewindError(f"rewind: round must be an integer; got {round!r}")
        first = cks[0].round if cks else g.round_index
        if not first <= round <= g.round_index:
            raise RewindError(
                f"rewind: round {round} is outside the committed rounds [{first}, {g.round_index}]; nothing changed"
            )
        ck = next((c for c in cks if c.round == round), None)
        if ck is None:
            raise RewindError(
                f"rewind: no checkpoint of round {round} (the session was restored from a snapshot "
                "taken after it); nothing changed"
            )
        return ck, ck.n_history
    if isinstance(position, bool) or not isinstance(position, int):
        raise RewindError(f"rewind: position must be an integer; got {position!r}")
    lo = cks[0].n_history if cks else len(g.history)
    if not lo <= position <= len(g.history):
        raise RewindError(
            f"rewind: position {position} is outside the committed range [{lo}, {len(g.history)}] "
            "(history positions after the prompt); nothing changed"
        )
    ck = [c for c in cks if c.n_history <= position][-1]
    return ck, position


def rewind(s: SessionParts, round: int | None = None, position: int | None = None) -> Rewound:
    """Take session ``s`` back to the state right after ``round`` (or to ``position`` tokens of history)
    and return the :class:`~specviz.decoding.events.Rewound` event to publish; see the module docstring.

    A round or position outside the committed range raises :class:`~specviz.errors.RewindError` (a
    session that has not started: :class:`~specviz.errors.SessionStateError`) and changes nothing.
    """
    g = s.generation
    ck, keep = _target(g, round, position)
    if not s.ctx.memory.covers(max(keep - 1, 0)):
        raise RingCoverageError(
            f"rewind: the sliding-window ring no longer holds the keys position {keep - 1} needs (it "
            f"holds positions {s.ctx.memory.pos_min()}..{s.ctx.kv_len() - 1}, window "
            f"{s.ctx.memory.info.n_swa}); nothing changed. A session with swa_full=True can go back further"
        )
    from_round, from_position = g.round_index, len(g.history)
    kv_before = s.ctx.kv_len()
    hooks = context_hooks(s.drafter)
    draft_kv_before = hooks.kv_length() if hooks is not None else None
    history = g.history[:keep]
    # the grammar's state replayed over the kept generated tokens (llama.cpp's cannot be saved), before any change
    grammar = g.grammar.rewound(history[g.n_prompt :]) if g.grammar is not None else None
    # the drafter first: building one (another strategy) may fail, and then nothing has changed yet
    drafter = s.drafter
    assert drafter is not None
    own = {k.name for k in type(drafter).knobs}
    old_ctx, fresh = s.ctx, None
    if ck.strategy != g.strategy or any(g.knobs.get(k) != ck.knobs.get(k) for k in own):
        # a strategy that reads the target's layers may need a context that has computed nothing
        fresh = replace_for(s, ck.strategy)
        try:
            drafter = s.build_drafter(ck.strategy, ck.knobs, g.sampling)
        except BaseException:
            put_back(s, old_ctx, fresh)
            raise
    try:
        if fresh is not None:  # the kept positions evaluated again into the new context
            cut = refill(fresh, old_ctx, history[: max(keep - 1, 0)])
        else:
            cut = s.ctx.memory.cut(max(keep - 1, 0), g.history)
    except BaseException:
        if drafter is not s.drafter:
            drafter.close()
        put_back(s, old_ctx, fresh)
        raise
    g.history = history
    g.grammar = grammar  # (the old state is freed when collected)
    drafter.begin(history)
    if ck.drafter_state is not None and drafter.state_format:
        drafter.load_state(copy.deepcopy(ck.drafter_state))
    for k, v in ck.drafter_stats.items():
        if hasattr(drafter.stats, k):
            setattr(drafter.stats, k, v)
    if drafter is not s.drafter:
        if s.drafter is not None:
            s.drafter.close()
        s.drafter = drafter
    if fresh is not None:
        old_ctx.close()
    g.strategy, g.knobs = ck.strategy, dict(ck.knobs)
    g.telemetry = Telemetry.from_state(copy.deepcopy(ck.telemetry))
    g.policy = make_policy(ck.knobs.get("draft_policy", "fixed"), s.cost_model)
    g.policy.load(copy.deepcopy(ck.policy))
    s.rng.bit_generator.state = copy.deepcopy(ck.rng)
    g.round_index = ck.round
    g.finished = ck.finished if keep == ck.n_history else None
    g.pending = None
    g.last_result = None
    del g.checkpoints[g.checkpoints.index(ck) + 1 :]
    del g.events[ck.n_events :]
    kept = history[ck.n_history :]
    rollbacks: list[dict[str, Any]] = []
    kv_after = s.ctx.kv_len()
    if kv_before > kv_after:
        rollbacks.append(
            {
                "context": "target",
                "from_pos": kv_before,
                "to_pos": kv_after,
                "path": cut.path,
                "seconds": cut.seconds,
                "nbytes": cut.nbytes,
                "mark_pos": cut.mark_pos,
                "reapplied": cut.reapplied,
            }
        )
    hooks = context_hooks(drafter)
    if draft_kv_before is not None and hooks is not None:
        after = hooks.kv_length()
        if after is not None and draft_kv_before > after:
            rollbacks.append({"context": "draft", "from_pos": draft_kv_before, "to_pos": after})
    return Rewound(
        ck.round,
        position=keep,
        from_round=from_round,
        from_position=from_position,
        n_events=len(g.events),
        kept_tokens=tuple(kept),
        kept_pieces=tuple(s.model.pieces(kept)),
        strategy=g.strategy,
        knobs=dict(g.knobs),
        finished=g.finished,
        telemetry=s.telemetry_dict(),
        kv_rollbacks=tuple(rollbacks),
    )


def effective_events(events: Sequence[Event]) -> list[Event]:
    """The events that still describe a session after its rewinds: each :class:`~specviz.decoding.events.Rewound`
    cuts the list to its ``n_events`` (it stays in the list, as in ``Session.events``). A recording of a
    session (every event as published) gives the session's own list."""
    out: list[Event] = []
    for ev in events:
        if isinstance(ev, Rewound):
            del out[ev.n_events :]
        out.append(ev)
    return out
