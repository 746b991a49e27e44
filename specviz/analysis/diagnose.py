"""Why is acceptance low? Figures and findings computed from a session's events (live or recorded).

Everything here reads events only (:mod:`specviz.decoding.events`), so a recording made anywhere can be diagnosed
without the model: ``specviz diagnose RECORDING.jsonl``. Rewinds are honoured (the events a rewind
dropped are left out, :func:`specviz.analysis.sources.events_of`).

Each examined token and rejection carries the drafter that proposed it (a chain's member), so acceptance
breaks down per drafter (:meth:`~specviz.analysis.diagnosis.Diagnosis.by_drafter`).

Terms. A draft token is *examined* when the target judged it: every token up to and including the first
rejected one of its draft (the tokens after a rejection were never tested, so they count in no rate
here; the telemetry's acceptance rate counts them as not accepted). *Acceptance* is accepted over
examined. A position is inside a copied span when the :data:`COPY_NGRAM` tokens of the output ending
there occur earlier in the prompt or output.

:func:`diagnose` reads the events in three steps: :func:`fold_rounds` keeps each round's draft, verdict
and rejection (and the token history, rewinds applied), :func:`copied_flags` marks the copied positions,
and :func:`add_round` counts each round's examined tokens and its rejection into a
:class:`~specviz.analysis.diagnosis.Diagnosis`, which holds the aggregates, the findings and the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..decoding.events import Accepted, DraftProposed, Event, KnobsChanged, Rejected, Rewound, SessionStarted
from .diagnosis import BREAK_EVEN, Diagnosis, Examined, RejectionRow, token_class
from .sources import EventSource, events_of

__all__ = ["diagnose", "Diagnosis", "Examined", "RejectionRow", "token_class", "COPY_NGRAM"]

#: A position is inside a copied span when the n-gram of this many output tokens ending there occurred before.
COPY_NGRAM = 4


def diagnose(source: EventSource, *, cost: Any = None) -> Diagnosis:
    """The diagnosis of a :class:`~specviz.decoding.session.Session` (its events) or of a list of events (a
    recording: :func:`specviz.read_events`). ``cost`` (a :class:`~specviz.decoding.policy.VerifyCostModel`, by
    default the session's measured one if any) sets the depth break-even: one extra verified token's cost
    over a one-token decode's."""
    events = events_of(source)
    if cost is None:
        cost = getattr(source, "cost_model", None)
    dg = Diagnosis()
    dg.break_even, dg.break_even_source = break_even(cost)
    folded = fold_rounds(events)
    dg.knobs = folded.knobs
    dg.grammar_impossible = 0 if folded.grammar else None
    copied = copied_flags(folded.history)
    for index, rd in folded.rounds.items():
        add_round(dg, index, rd, copied)
    return dg


def break_even(cost: Any) -> tuple[float, str]:
    """The acceptance a deeper draft position must reach to pay, and where it comes from: one extra
    verified token's marginal cost over a one-token decode's, from the verify cost curve ``cost`` (the
    slope between batches of 1 and 9), else :data:`~specviz.analysis.diagnosis.BREAK_EVEN`."""
    if cost is not None:
        try:
            one, nine = float(cost(1)), float(cost(9))
            if one > 0 and nine > one:
                return (nine - one) / 8 / one, "from the measured verify cost"
        except Exception:  # a malformed curve: keep the default
            pass
    return BREAK_EVEN, "default"


@dataclass
class RoundEvents:
    """What one round published that the diagnosis reads, and the strategy it ran under."""

    strategy: str
    draft: DraftProposed | None = None
    accepted: Accepted | None = None
    rejected: Rejected | None = None


@dataclass
class FoldedRounds:
    """The rounds that still hold (in the order they ran), the token history after them, and the knobs
    in force at the end."""

    rounds: dict[int, RoundEvents] = field(default_factory=dict)
    history: list[int] = field(default_factory=list)
    knobs: dict[str, Any] = field(default_factory=dict)
    grammar: bool = False  #: a generation ran under a grammar


def fold_rounds(events: Sequence[Event]) -> FoldedRounds:
    """Each round's draft, verdict and rejection, the prompt plus committed tokens, and the knobs, from
    ``events`` (folded over rewinds already); a ``Rewound`` drops the rounds after it and cuts the
    history to what it kept."""
    out = FoldedRounds()
    strategy = ""
    for ev in events:
        if isinstance(ev, SessionStarted):
            out.history, out.rounds = list(ev.prompt_tokens), {}
            strategy, out.knobs = ev.strategy, dict(ev.knobs)
            out.grammar = out.grammar or ev.grammar is not None
        elif isinstance(ev, KnobsChanged):
            strategy, out.knobs = ev.strategy, dict(ev.knobs)
        elif isinstance(ev, Rewound):
            kept = list(ev.kept_tokens)
            del out.history[ev.position - len(kept) :]
            out.history.extend(kept)
            out.rounds = {i: rd for i, rd in out.rounds.items() if i <= ev.round}
            strategy, out.knobs = ev.strategy, dict(ev.knobs)
        elif isinstance(ev, (DraftProposed, Accepted, Rejected)):
            rd = out.rounds.setdefault(ev.round, RoundEvents(strategy))
            if isinstance(ev, DraftProposed):
                rd.draft = ev
            elif isinstance(ev, Rejected):
                rd.rejected = ev
            else:
                rd.accepted = ev
                del out.history[ev.position :]
                out.history.extend(ev.tokens)
    return out


def copied_flags(history: Sequence[int], n: int = COPY_NGRAM) -> list[bool]:
    """For each history position q: the n-gram ending at q occurred earlier (ending before q)."""
    flags = [False] * len(history)
    seen: set[tuple[int, ...]] = set()
    for q in range(n - 1, len(history)):
        g = tuple(history[q - n + 1 : q + 1])
        flags[q] = g in seen
        seen.add(g)
    return flags


def add_round(dg: Diagnosis, index: int, rd: RoundEvents, copied: Sequence[bool]) -> None:
    """Count round ``index`` into ``dg``: a round without a draft by its reason, a drafting one by its
    examined tokens (:class:`~specviz.analysis.diagnosis.Examined`) and its rejection, if any."""
    d, a, rej = rd.draft, rd.accepted, rd.rejected
    if d is None or a is None:
        return
    dg.rounds += 1
    if not d.tokens:
        if d.reason:
            dg.empty_reasons[d.reason] = dg.empty_reasons.get(d.reason, 0) + 1
        return
    if rd.strategy not in dg.strategies:
        dg.strategies.append(rd.strategy)
    dg.drafting_rounds += 1
    dg.drafted += len(d.tokens)
    n_acc = a.n_accepted
    n_exam = min(len(d.tokens), n_acc + (1 if rej is not None else 0))
    drafter = d.drafter or rd.strategy  # a chain's member (recordings before it was recorded: the strategy)
    for i in range(n_exam):
        q = d.position + i
        piece = d.pieces[i] if i < len(d.pieces) else ""
        prob = d.probs[i] if i < len(d.probs) else None
        cp = copied[q] if q < len(copied) else False
        dg.tokens.append(Examined(index, i, token_class(piece), prob, cp, i < n_acc, rd.strategy, drafter))
        dg.examined += 1
        dg.accepted += int(i < n_acc)
    if rej is not None:
        dg.rejections.append(rejection_row(index, rej, copied, drafter))
        if rej.grammar_forbidden:
            dg.grammar_impossible = (dg.grammar_impossible or 0) + len(rej.tokens)


def rejection_row(index: int, rej: Rejected, copied: Sequence[bool], drafter: str = "") -> RejectionRow:
    """The :class:`~specviz.analysis.diagnosis.RejectionRow` of round ``index``'s rejection."""
    q = rej.position
    return RejectionRow(
        round=index,
        position=q,
        depth=rej.depth,
        drafted=rej.tokens[0] if rej.tokens else -1,
        drafted_piece=rej.pieces[0] if rej.pieces else "",
        draft_prob=rej.draft_probs[0] if rej.draft_probs else None,
        target_prob=rej.draft_token_target_prob,
        target_rank=target_rank(rej),
        margin=rej.target_margin,
        chosen=rej.target_token,
        chosen_piece=rej.target_piece,
        chosen_prob=rej.target_prob,
        token_class=token_class(rej.pieces[0] if rej.pieces else ""),
        copied=copied[q] if q < len(copied) else False,
        drafter=drafter,
        grammar_forbidden=rej.grammar_forbidden,
    )


def target_rank(rej: Rejected) -> int | None:
    """The target's rank of the rejected draft token (1 = its own choice). A recording made before ranks
    were recorded has none: then the target's alternatives tell it when the token is among them."""
    if rej.draft_token_target_rank is not None:
        return rej.draft_token_target_rank
    ids = [alt["token"] if isinstance(alt, dict) else alt[0] for alt in rej.alternatives]
    return ids.index(rej.tokens[0]) + 1 if rej.tokens and rej.tokens[0] in ids else None
