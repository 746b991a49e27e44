"""The events of one round, built from its :class:`~specviz.decoding.round.RoundResult`.

In order: ``DraftProposed`` → ``MemoryCheckpoint`` (the drafter's context, then the target's, when their
memory needed one) → ``Verified`` → ``Accepted`` → ``Rejected`` (when a draft token was refused) →
``KVRollback`` (target, then the drafter's context; each says which path it took and what it cost). The
session appends ``TelemetryEvent`` (and ``Finished``, :func:`finished_event`). The session's other events
are built here too: ``SessionStarted`` (:func:`started_event`) and ``KnobsChanged`` (:func:`knobs_changed_event`).
Token texts travel with the ids, so a front-end or a replay never needs the model.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..backends.llama import Capacity, LlamaModel
from ..backends.memory import Cut, Mark
from ..strategies import strategy_class
from .events import (
    Accepted,
    Alternative,
    DraftProposed,
    Event,
    Finished,
    KnobsChanged,
    KVRollback,
    MemoryCheckpoint,
    Rejected,
    SessionStarted,
    Verified,
)
from .generation import Generation
from .machine_load import load_average
from .round import RoundResult
from .stops import StopScanner


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


def _tree_data(r: RoundResult, pieces: Callable[[Sequence[int]], list[str]]) -> dict | None:
    """``DraftProposed.tree``: the round's draft tree as plain data with its token texts (None for a chain)."""
    if r.tree is None:
        return None
    return {**r.tree.to_dict(), "pieces": pieces(r.tree.tokens)}


def _tree_choices(r: RoundResult, pieces: Callable[[Sequence[int]], list[str]]) -> tuple:
    """``Verified.tree_choices``: the target's choice and alternatives at each row read along a tree's path."""
    out = []
    for c in r.tree_choices:
        alts = [(int(t), float(p)) for t, p in c.alternatives]
        texts = pieces([c.token, *(t for t, _ in alts)])
        out.append(
            {
                "token": int(c.token),
                "piece": texts[0],
                "prob": float(c.prob),
                "alternatives": [[t, s, p] for (t, p), s in zip(alts, texts[1:])],
            }
        )
    return tuple(out)


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
            alternatives=tuple(tuple(a) for a in r.draft_alternatives),
            tree=_tree_data(r, pieces),
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
            round_seconds=r.round_seconds,
            cpu_seconds=r.cpu_seconds,
            n_threads=r.n_threads,
            tree_choices=_tree_choices(r, pieces),
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
            forced=tuple(r.forced),
            tree_path=tuple(r.tree_path),
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
                grammar_forbidden=r.grammar_forbidden,
            )
        )
    if r.kv_peak > r.kv_after:
        out.append(_rollback_event(i, "target", r.kv_peak, r.kv_after, r.rollback))
    for f, t in r.draft_rollbacks:
        cut = next((c for c in draft_cuts if (c.from_pos, c.to_pos) == (f, t)), None)
        out.append(_rollback_event(i, "draft", f, t, cut))
    return out


def started_event(
    g: Generation,
    model: LlamaModel,
    cap: Capacity,
    messages: Sequence[dict[str, str]],
    chat_template: str | None,
    prefill: str,
) -> SessionStarted:
    """The ``SessionStarted`` of generation ``g`` on ``model`` with a context of capacity ``cap``, for a chat
    request's ``messages`` (none: a prompt) and a session whose prompt layout is ``prefill``."""
    ids, sampling = g.history[: g.n_prompt], g.sampling
    needs_model = strategy_class(g.strategy).needs_model
    return SessionStarted(
        0,
        model=str(model.path),
        draft_model=str(g.knobs.get("draft_model")) if needs_model else None,
        strategy=g.strategy,
        knobs=dict(g.knobs),
        prompt_tokens=tuple(ids),
        prompt_pieces=tuple(model.pieces(ids)),
        max_tokens=g.max_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        seed=g.seed,
        n_ctx=cap.n_ctx,
        n_batch=cap.n_batch,
        n_ubatch=cap.n_ubatch,
        n_swa=cap.n_swa,
        n_vocab=model.n_vocab,
        stop=g.stop,
        grammar=g.grammar.gbnf if g.grammar is not None else None,
        messages=tuple(messages),
        chat_template=(chat_template or "model") if messages else None,
        prefill=prefill,
        load_average=load_average(),
    )


def knobs_changed_event(
    i: int, strategy: str, knobs: dict[str, Any], previous: tuple[str, dict[str, Any]], schema: list[dict[str, Any]]
) -> KnobsChanged:
    """The ``KnobsChanged`` of a configuration applied at the boundary after round ``i``."""
    return KnobsChanged(
        i,
        strategy=strategy,
        knobs=dict(knobs),
        previous_strategy=previous[0],
        previous_knobs=previous[1],
        schema=tuple(schema),
    )


def finished_event(i: int, reason: str, tokens: Sequence[int], scanner: StopScanner | None) -> Finished:
    """The ``Finished`` of a generation that ended after round ``i`` with ``tokens`` generated; a ``stop``
    finish names the stop string found (``scanner``: the generation's stop scanner)."""
    message = None
    if reason == "stop" and scanner is not None:
        at = scanner.cut(tokens)
        text = b"".join(scanner.render(t) for t in tokens)
        found = (s for s in scanner.stops if at is not None and text.startswith(s, at))
        message = next((f"stop string {s.decode('utf-8')!r}" for s in found), None)
    return Finished(i, reason=reason, n_generated=len(tokens), message=message, load_average=load_average())
