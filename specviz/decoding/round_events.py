"""The events of one round, built from its :class:`~specviz.decoding.round.RoundResult`.

In order: ``DraftProposed`` → ``MemoryCheckpoint`` (the drafter's context, then the target's, when their
memory needed one) → ``Verified`` → ``Accepted`` → ``Rejected`` (when a draft token was refused) →
``KVRollback`` (target, then the drafter's context; each says which path it took and what it cost). The
session appends ``TelemetryEvent`` (and
``Finished``). Token texts travel with the ids, so a front-end or a replay never needs the model.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..backends.memory import Cut, Mark
from .events import Accepted, Alternative, DraftProposed, Event, KVRollback, MemoryCheckpoint, Rejected, Verified
from .round import RoundResult


def _checkpoint_event(i: int, context: str, m: Mark) -> MemoryCheckpoint:
    return MemoryCheckpoint(
        i, context=context, position=m.n, nbytes=m.nbytes, seconds=m.seconds, reused=m.reused, reason=m.reason
    )


def _rollback_event(i: int, context: str, from_pos: int, to_pos: int, cut: Cut | None) -> KVRollback:
    if cut is None:
        return KVRollback(i, context=context, from_pos=from_pos, to_pos=to_pos)
    return KVRollback(
        i,
        context=context,
        from_pos=from_pos,
        to_pos=to_pos,
        path=cut.path,
        seconds=cut.seconds,
        nbytes=cut.nbytes,
        mark_pos=cut.mark_pos,
        reapplied=cut.reapplied,
    )


def round_events(r: RoundResult, pieces: Callable[[Sequence[int]], list[str]], *, policy: str) -> list[Event]:
    """The events describing round ``r``; ``pieces(ids)`` renders token texts, ``policy`` names the
    drafting policy in force."""
    i = r.index
    v = r.verdict
    b = r.budget
    out: list[Event] = [
        DraftProposed(
            i,
            tokens=tuple(r.draft),
            pieces=tuple(pieces(r.draft)),
            probs=tuple(r.draft_probs),
            seconds=r.draft_seconds,
            requested=b.requested,
            limit=b.limit,
            cap=b.cap,
            reason=r.draft_reason,
            position=r.position,
            policy=policy,
            expected_tokens=b.expected,
            drafter=r.drafter,
            block=r.block,
        ),
    ]
    draft_cuts = [x for x in r.draft_memory if isinstance(x, Cut)]
    out.extend(_checkpoint_event(i, "draft", m) for m in r.draft_memory if isinstance(m, Mark))
    if r.checkpoint is not None:
        out.append(_checkpoint_event(i, "target", r.checkpoint))
    out += [
        Verified(
            i,
            tokens=tuple(v.tokens),
            pieces=tuple(pieces(v.tokens)),
            probs=tuple(v.probs),
            seconds=r.verify_seconds,
            batch_size=r.batch_size,
            kv_before=r.kv_before,
            kv_peak=r.kv_peak,
            draft_kv_before=r.draft_kv_before,
            draft_kv_peak=r.draft_kv_peak,
        ),
    ]
    committed = r.committed
    has_final = len(committed) > r.n_accepted  # False when an accepted token ended the generation
    final = v.final_token
    final_piece = pieces([final])[0]
    kind = "plain" if not r.draft else ("bonus" if v.bonus else "correction")
    out.append(
        Accepted(
            i,
            tokens=tuple(committed),
            pieces=tuple(pieces(committed)),
            n_accepted=r.n_accepted,
            draft_probs=tuple(r.draft_probs[: r.n_accepted]),
            target_probs=tuple(v.probs[: len(committed)]),
            bonus_token=final if has_final else None,
            bonus_piece=final_piece if has_final else None,
            bonus_prob=v.probs[v.n_accepted] if has_final else None,
            bonus_kind=kind if has_final else None,
            position=r.position,
        )
    )
    if v.n_accepted < len(r.draft):
        rejected = r.draft[v.n_accepted :]
        texts = pieces([int(t) for t, _ in v.alternatives])  # one call for the five
        alternatives = tuple(Alternative.as_dict(int(t), s, float(p)) for (t, p), s in zip(v.alternatives, texts))
        out.append(
            Rejected(
                i,
                depth=v.n_accepted,
                tokens=tuple(rejected),
                pieces=tuple(pieces(rejected)),
                draft_probs=tuple(r.draft_probs[v.n_accepted :]),
                target_token=final,
                target_piece=final_piece,
                target_prob=v.probs[v.n_accepted],
                draft_token_target_prob=v.rejected_prob,
                alternatives=alternatives,
                position=r.position + v.n_accepted,
                draft_token_target_rank=v.rejected_rank,
                target_margin=v.margin,
            )
        )
    if r.kv_peak > r.kv_after:
        out.append(_rollback_event(i, "target", r.kv_peak, r.kv_after, r.rollback))
    for f, t in r.draft_rollbacks:
        cut = next((c for c in draft_cuts if (c.from_pos, c.to_pos) == (f, t)), None)
        out.append(_rollback_event(i, "draft", f, t, cut))
    return out
