"""The events of one round, built from its :class:`~specviz.decoding.round.RoundResult`.

In order: ``DraftProposed`` → ``Verified`` → ``Accepted`` → ``Rejected`` (when a draft token was refused)
→ ``KVRollback`` (target, then the drafter's context). The session appends ``TelemetryEvent`` (and
``Finished``). Token texts travel with the ids, so a front-end or a replay never needs the model.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .events import Accepted, Alternative, DraftProposed, Event, KVRollback, Rejected, Verified
from .round import RoundResult


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
        ),
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
        alternatives = tuple(Alternative(int(t), pieces([int(t)])[0], float(p)).to_dict() for t, p in v.alternatives)
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
        out.append(KVRollback(i, context="target", from_pos=r.kv_peak, to_pos=r.kv_after))
    for f, t in r.draft_rollbacks:
        out.append(KVRollback(i, context="draft", from_pos=f, to_pos=t))
    return out
