"""One speculative round, as llama.cpp's ``examples/speculative-simple`` runs it: five calls.

1. **draft** — the drafter proposes up to the budget's limit after the history;
2. **verify** — the target scores ``[pending token] + draft`` in one batch (one ``llama_decode``);
3. **accept** — :func:`specviz.decoding.acceptor.accept` keeps the longest acceptable prefix plus one token of the
   target's (under a grammar, on rows constrained by it: :mod:`specviz.decoding.constrained`);
4. **commit** — the committed tokens join the history (cut at an end-of-generation token);
5. **roll back** — the target's cache loses the rejected tail, the drafter's context is brought in step,
   and the drafter hears how many of its tokens were accepted.

Memory that cannot drop any tail (recurrent and hybrid models, :mod:`specviz.backends.memory`) takes a
partial-state checkpoint before the verify when the draft could need it, as llama.cpp's server does; the
roll-back step then restores it and re-applies the accepted tokens. Either way it is one call,
:meth:`~specviz.backends.memory.ContextMemory.cut`.

The newest committed token is *pending*: it is not in the target's cache yet and is the first row of the
next batch, so after every round the cache holds exactly ``len(history) - 1`` positions. The one exception
is a generation's first round after a whole-prompt prefill (``prefilled``, llama-server's layout, see
:class:`~specviz.Session`): the prompt's last token was evaluated with the prompt, so the round drafts
nothing, evaluates nothing and reads the prompt batch's last row; it ends with the same invariant.

A round has two halves around its verify decode: :func:`begin_round` (the draft, and the checkpoint before the
verify) and :func:`finish_round` (accept, commit, roll back, on the batch's rows). :func:`run_round` runs both
with the decode between them; a batched run puts several sequences' verify batches in one decode between their
halves. :func:`run_round` returns a plain :class:`RoundResult`; events, telemetry and the policy's learning are
built from it by the caller (the session), never inside the round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..backends.llama import LlamaContext
from ..backends.memory import Cut, Mark
from ..errors import ContextError, GrammarError
from ..strategies.base import Draft, Drafter, peeker
from ..strategies.context_drafter import context_hooks
from .acceptor import Verdict, accept
from .budget import Budget
from .constrained import GrammarState
from .draft_tree import DraftTree
from .events import Event, Round
from .rowscan import ContextRows, RowSource, top_two
from .sampling import SamplingParams
from .tempered import Dist
from .tiling import aligned_length
from .tree_acceptor import RowChoice, TreeVerdict, accept_tree, branch_rows


@dataclass
class RoundResult:
    """Everything one round did, as plain data.

    ``position`` is the history length before the round (the index of the first committed token);
    ``draft`` the tokens verified (empty when the drafter proposed nothing or fewer than ``draft_min``;
    a proposal shorter than the budget's limit is cut to suit the verify tile, ``draft_reason`` ``tile``);
    ``committed`` what the history gained (the verdict's tokens, cut before an end-of-generation token,
    in which case ``finish`` is ``"eos"``); ``n_accepted`` the accepted draft tokens among them.
    ``kv_before`` / ``kv_peak`` / ``kv_after`` are the target cache's length before the verify batch,
    right after it and after the rollback; ``draft_kv_before`` / ``draft_kv_peak`` the drafter's
    context around drafting (None without one) and ``draft_rollbacks`` its rollbacks as ``(from, to)``.
    ``shadow`` is the drafter's side-effect-free prediction in a round the policy kept plain (None
    otherwise); ``prefilled`` marks the first round of a whole-prompt prefill (its row came from the
    prompt's batch: ``verify_seconds`` is the row's reading only); ``margins`` the target's top-two logit
    margin at each committed position when asked.
    ``checkpoint`` is the partial-state checkpoint taken before the verify (None when removal sufficed)
    and ``rollback`` what dropping the rejected tail did (None when nothing was rejected);
    ``draft_memory`` the checkpoints and cuts of the drafter's own context that were more than a removal.
    ``drafter`` names the strategy that proposed the draft (a chained drafter's member, else the
    drafter's own name); ``block`` describes a block draft (positions drafted in parallel, see
    :class:`~specviz.strategies.base.Draft`), ``None`` for a draft made token by token; ``draft_alternatives``
    the drafter's top candidates at each position of ``draft`` (empty for a drafter without a distribution).
    Under a grammar, ``forced`` holds the indexes in ``committed`` of the tokens the grammar forced (the only
    token it allowed there) and ``grammar_forbidden`` whether it forbade the first rejected draft token
    (None: no grammar, or nothing rejected).
    A round that verified a draft tree (:mod:`specviz.decoding.draft_tree`) has it in ``tree``; ``draft`` and
    ``draft_probs`` then hold the kept branch (the one through the accepted nodes, ``tree_path``),
    ``batch_size`` counts every node, and ``tree_choices`` holds the target's choice at each row read along the
    path (:class:`~specviz.decoding.tree_acceptor.TreeVerdict`'s ``choices``).
    ``round_seconds`` is the round's wall time and ``cpu_seconds`` the process's CPU time over the same span
    (every thread's, llama.cpp's included: ``time.process_time``); ``n_threads`` the threads the target's
    context was given (:func:`~specviz.decoding.telemetry.cpu_share` relates the three).
    """

    index: int
    position: int
    budget: Budget
    draft: list[int]
    draft_probs: list[float | None]
    draft_reason: str | None
    draft_seconds: float
    verdict: Verdict
    committed: list[int]
    n_accepted: int
    finish: str | None
    batch_size: int
    verify_seconds: float
    kv_before: int
    kv_peak: int
    kv_after: int
    round_seconds: float
    cpu_seconds: float
    n_threads: int | None = None
    draft_kv_before: int | None = None
    draft_kv_peak: int | None = None
    draft_rollbacks: list[tuple[int, int]] = field(default_factory=list)
    shadow: int | None = None
    margins: list[tuple[float, int, int]] = field(default_factory=list)
    checkpoint: Mark | None = None
    rollback: Cut | None = None
    draft_memory: list[Mark | Cut] = field(default_factory=list)
    drafter: str = ""
    block: dict | None = None
    draft_alternatives: list[list[int]] = field(default_factory=list)
    prefilled: bool = False
    forced: list[int] = field(default_factory=list)
    grammar_forbidden: bool | None = None
    tree: DraftTree | None = None
    tree_path: list[int] = field(default_factory=list)
    tree_choices: list[RowChoice] = field(default_factory=list)


def run_round(
    index: int,
    ctx: LlamaContext,
    drafter: Drafter,
    history: list[int],
    budget: Budget,
    *,
    params: SamplingParams,
    rng: np.random.Generator,
    is_eog: Callable[[int], bool],
    draft_min: int = 0,
    tile: int = 1,
    record_margins: bool = False,
    stop: Callable[[list[int]], int | None] | None = None,
    prefilled: bool = False,
    grammar: GrammarState | None = None,
) -> RoundResult:
    """Run one round on ``ctx`` with ``drafter`` and extend ``history`` (the full token history, whose
    last token is pending) by what it commits. See the module docstring for the five steps.

    ``stop(committed)`` (stop strings, :mod:`specviz.decoding.stops`) returns the index of the first committed token
    that completes a stop string, or None; the round then commits up to and including it (``finish`` is
    ``"stop"``), so the caches and the drafter end where plain decoding with the same stop strings ends.

    ``prefilled``: the cache already holds the pending token and the last evaluated batch kept its row
    (a whole-prompt prefill): the round drafts nothing and evaluates nothing, it reads that row.

    ``grammar``: the generation's grammar state (None: no grammar, and no extra work). Each row the acceptor
    reads is constrained by the state the path before it leaves (:mod:`specviz.decoding.constrained`), and
    the state advances with the committed tokens. A row where the grammar allows no token raises
    :class:`~specviz.errors.GrammarError` naming the position, with nothing committed and the target's cache
    as before the round.

    ``tile`` is the verify tile in force (:func:`~specviz.decoding.tiling.verify_tile`): the budget's limit
    already suits it, and a draft that comes back shorter is cut to its longest prefix that does too.

    A verify batch llama.cpp refuses raises :class:`~specviz.errors.ContextError` with the target's
    cache left as before the round.
    """
    pending = begin_round(
        index,
        ctx,
        drafter,
        history,
        budget,
        draft_min=draft_min,
        tile=tile,
        prefilled=prefilled,
        chains_only=grammar is not None,
    )
    rows, row, verify_started = verify_alone(ctx, pending, history)
    return finish_round(
        pending,
        ctx,
        drafter,
        history,
        rows,
        row,
        verify_started,
        params=params,
        rng=rng,
        is_eog=is_eog,
        record_margins=record_margins,
        stop=stop,
        grammar=grammar,
    )


def verify_alone(
    ctx: LlamaContext, pending: PendingRound, history: list[int]
) -> tuple[RowSource, Callable[[int], np.ndarray], float]:
    """Step 2 for one sequence: one decode of ``pending``'s batch on ``ctx`` (after a whole-prompt prefill none:
    the prompt batch kept the pending token's row). Returns the rows for the acceptor, the row reader and when
    the verify began. A batch llama.cpp refuses raises :class:`~specviz.errors.ContextError` with the cache cut
    back to where it was before the round."""
    t1 = time.perf_counter()
    tree = pending.drafted.tree
    if tree is not None:
        # every branch is a sequence: the prefix's cells are shared with each, then one decode of every node
        ctx.share_prefix(tree.width)
        try:
            ctx.eval_tree(tree.batch_layout(pending.pending_token, pending.n_past))
        except ContextError:
            ctx.keep_branch(0, pending.n_past)
            raise
    elif not pending.prefilled:
        try:
            ctx.eval(pending.batch, pending.n_past, rows="all")
        except ContextError:
            ctx.memory.cut(pending.n_past, history)
            raise
    rows, row = verified_rows(ctx, pending)
    return rows, row, t1


def verified_rows(ctx: LlamaContext, pending: PendingRound) -> tuple[RowSource, Callable[[int], np.ndarray]]:
    """The rows of ``pending``'s verify batch on ``ctx`` once evaluated, for the acceptor and one by one: the
    context's rows, which the row reader may read in one call; after a whole-prompt prefill the one row, the
    prompt batch's last, which that call (reading rows by batch index) would not find."""
    if pending.prefilled:
        row = _prefill_row(ctx)
        return row, row
    return ContextRows(ctx), ctx.row


@dataclass
class StepBegun:
    """A session's step after its first half (:meth:`~specviz.decoding.session.Session.begin_step`): the events
    published so far (``out``), and either the round in progress (``pending``, its batch to evaluate) or, where the
    step ended before a round, the step's outcome (``done``, a :class:`~specviz.decoding.events.Round`)."""

    out: list[Event]
    pending: PendingRound | None
    done: Round | None = None


@dataclass
class PendingRound:
    """A round between its two halves (:func:`begin_round`, :func:`finish_round`): the draft made and the verify
    batch ready (``batch``: the pending token and the draft, for the target's cache from ``n_past`` on), the
    checkpoint taken where the memory needed one. Whoever evaluates the batch — :func:`run_round` alone, or a
    batched run with other sequences' batches in the same decode — hands its rows to :func:`finish_round`."""

    index: int
    position: int
    n_past: int
    pending_token: int
    budget: Budget
    drafted: _Drafted
    checkpoint: Mark | None
    prefilled: bool
    t_round: float
    cpu_round: float

    @property
    def tokens(self) -> list[int]:
        """The draft to verify."""
        return self.drafted.tokens

    @property
    def batch(self) -> list[int]:
        """The verify batch: the pending token, then the draft."""
        return [self.pending_token, *self.drafted.tokens]


def begin_round(
    index: int,
    ctx: LlamaContext,
    drafter: Drafter,
    history: list[int],
    budget: Budget,
    *,
    draft_min: int = 0,
    tile: int = 1,
    prefilled: bool = False,
    chains_only: bool = False,
) -> PendingRound:
    """Steps 1 and the start of 2: draft (none after a whole-prompt prefill: llama-server samples its first token
    undrafted), and the checkpoint before the verify where the memory needs one (``ctx.memory``).
    ``chains_only`` (a generation under a grammar, whose rows are constrained along one path): a draft tree is
    verified as its main line, branch 0, a chain the drafter proposed as any chain (its first child at each
    node is the draft's best, or a draw from the draft distribution)."""
    t_round, cpu_round = time.perf_counter(), time.process_time()
    # 1. draft
    d = _draft(drafter, history, budget, draft_min, tile, prefilled, chains_only)
    # 2. verify: a checkpoint first where the memory needs one; the batch is evaluated by the caller
    checkpoint = ctx.memory.checkpoint_for(len(d.tree) if d.tree is not None else len(d.tokens))
    return PendingRound(
        index=index,
        position=len(history),
        n_past=len(history) - 1,
        pending_token=history[-1],
        budget=budget,
        drafted=d,
        checkpoint=checkpoint,
        prefilled=prefilled,
        t_round=t_round,
        cpu_round=cpu_round,
    )


def finish_round(
    pending: PendingRound,
    ctx: LlamaContext,
    drafter: Drafter,
    history: list[int],
    rows: RowSource,
    row: Callable[[int], np.ndarray],
    verify_started: float,
    *,
    params: SamplingParams,
    rng: np.random.Generator,
    is_eog: Callable[[int], bool],
    record_margins: bool = False,
    stop: Callable[[list[int]], int | None] | None = None,
    grammar: GrammarState | None = None,
) -> RoundResult:
    """Steps 3 to 5 of ``pending``, whose verify batch has been evaluated (``rows``: its rows for the acceptor,
    ``row(i)`` one of them; ``verify_started``: when the verify began, ``time.perf_counter``): accept, commit,
    roll back (``ctx.memory``: the memory of the sequence the batch was evaluated on)."""
    d, tokens, n_past, position = pending.drafted, pending.tokens, pending.n_past, pending.position
    # 3. accept
    forbidden: bool | None = None
    kept: TreeVerdict | None = None
    if d.tree is not None:  # grammars are refused with trees at configure
        kept = accept_tree(d.tree, rows, params, rng)
        nodes = d.tree.branches[kept.branch]
        tokens = [d.tree.tokens[i] for i in nodes]
        verdict = kept.verdict
        row = branch_rows(row, d.tree, kept.branch)
    elif grammar is None:
        verdict = accept(tokens, rows, params, rng, d.dists)
    else:  # where no token is allowed it raises, the cache cut back first (a prefilled round evaluated nothing)
        checked = pending.prefilled or ctx
        verdict, forbidden = _accept_constrained(
            grammar, tokens, rows, params, rng, d.dists, position, checked, history
        )
    verify_seconds = time.perf_counter() - verify_started
    margins = [top_two(row(i)) for i in range(len(verdict.tokens))] if record_margins else []

    # 4. commit, cut at the first end-of-generation token (or after a stop string)
    committed, finish = _commit(list(verdict.tokens), is_eog, stop)
    n_accepted = min(verdict.n_accepted, len(committed))
    history.extend(committed)
    forced = grammar.advance(committed, mark=True) if grammar is not None else []

    # 5. roll back: keep the accepted prefix, the pending token stays out of the cache
    n_rows = 1 + (len(d.tree) if d.tree is not None else len(tokens))
    kv_peak = n_past + n_rows
    kv_after = len(history) - 1
    if kept is not None:  # every other branch's cells go too, and the kept one becomes sequence 0 again
        rollback: Cut | None = ctx.keep_branch(kept.branch, kv_after)
    else:
        rollback = ctx.memory.cut(kv_after, history) if kv_peak > kv_after else None
    hooks = context_hooks(drafter)
    draft_rollbacks = hooks.sync(history) if hooks is not None else []
    if tokens:  # only verified drafts are reported back (a dropped draft was never tested)
        drafter.accept(n_accepted, history)
    draft_memory = hooks.memory_log() if hooks is not None else []

    return RoundResult(
        index=pending.index,
        position=position,
        budget=pending.budget,
        draft=tokens,
        draft_probs=d.probs if kept is None else [d.tree.probs[i] for i in nodes],  # type: ignore[union-attr]
        draft_reason=d.reason,
        draft_seconds=d.seconds,
        verdict=verdict,
        committed=committed,
        n_accepted=n_accepted,
        finish=finish,
        batch_size=n_rows,
        verify_seconds=verify_seconds,
        kv_before=n_past,
        kv_peak=kv_peak,
        kv_after=kv_after,
        round_seconds=time.perf_counter() - pending.t_round,
        cpu_seconds=time.process_time() - pending.cpu_round,
        n_threads=ctx.n_threads,
        draft_kv_before=d.kv_before,
        draft_kv_peak=d.kv_peak,
        draft_rollbacks=draft_rollbacks,
        shadow=d.shadow,
        margins=margins,
        checkpoint=pending.checkpoint,
        rollback=rollback,
        draft_memory=draft_memory,
        drafter=d.drafter,
        block=d.block,
        draft_alternatives=d.alternatives,
        prefilled=pending.prefilled,
        forced=forced,
        grammar_forbidden=forbidden,
        tree=d.tree,
        tree_path=list(kept.path) if kept is not None else [],
        tree_choices=list(kept.choices) if kept is not None else [],
    )


def _accept_constrained(
    grammar: GrammarState,
    tokens: list[int],
    rows: RowSource,
    params: SamplingParams,
    rng: np.random.Generator,
    dists: list[Dist] | None,
    position: int,
    ctx: LlamaContext | bool,
    history: list[int],
) -> tuple[Verdict, bool | None]:
    """Step 3 under a grammar: the acceptor on rows constrained by the grammar's state along the draft, and
    whether the grammar forbade the first rejected draft token (None: none rejected). Where
    the row that decided the round's last token allows no token at all, the target's cache (``ctx``; True
    after a whole-prompt prefill, when the round evaluated nothing) loses the verify batch and
    :class:`~specviz.errors.GrammarError` is raised."""
    constrained = grammar.rows(tokens, rows, params.greedy)
    try:
        verdict = accept(tokens, constrained, params, rng, dists)
        try:
            constrained.check(verdict.rows_read, position)
        except GrammarError:
            if not isinstance(ctx, bool):
                ctx.memory.cut(position - 1, history)
            raise
        rejected = verdict.n_accepted < len(tokens)
        return verdict, (constrained.forbids(tokens[verdict.n_accepted]) if rejected else None)
    finally:
        constrained.close()


def _prefill_row(ctx: LlamaContext) -> Callable[[int], np.ndarray]:
    """Row 0 of a round after a whole-prompt prefill: the prompt batch's last row (the only one it kept)."""

    def row(i: int) -> np.ndarray:
        if i != 0:
            raise ContextError(f"a prefilled round has one row; row {i} was asked for")
        return ctx.last_row()

    return row


@dataclass
class _Drafted:
    """Step 1's outcome: the draft to verify and what the round reports of its making."""

    tokens: list[int]
    probs: list[float | None]
    reason: str | None
    dists: list[Dist] | None
    seconds: float
    kv_before: int | None
    kv_peak: int | None
    shadow: int | None
    drafter: str
    block: dict | None
    alternatives: list[list[int]]
    tree: DraftTree | None = None


def _draft(
    drafter: Drafter,
    history: list[int],
    budget: Budget,
    draft_min: int,
    tile: int,
    prefilled: bool,
    chains_only: bool = False,
) -> _Drafted:
    """Step 1: the drafter's proposal, cut to suit the verify tile and dropped below ``draft_min``; in a round
    the policy kept plain, the drafter's side-effect-free prediction (``shadow``, free evidence for the policy)."""
    hooks = context_hooks(drafter)
    kv_before = hooks.kv_length() if hooks is not None else None
    t0 = time.perf_counter()
    proposal = Draft([]) if prefilled else drafter.draft(history, budget.limit)
    seconds = time.perf_counter() - t0
    kv_peak = hooks.kv_length() if hooks is not None else None
    tokens = [int(t) for t in proposal.tokens]
    reason = proposal.reason if len(tokens) < budget.limit else None
    # a proposal shorter than the limit (the drafter stopped early) is rounded down as the limit was: its
    # leftover rows would cost more than the tokens they could add (on the embedded model, a 7-row verify
    # 56 ms, 8 rows 49). The drafter hears only how many were accepted, as when llama-server truncates a
    # draft to its n_draft_max after drafting.
    tree = None if chains_only else proposal.tree
    if tree is not None:  # a tree's rows are its nodes: not cut to a tile (a cut could split a level)
        if len(tree) < draft_min:
            tokens, reason, tree = [], "below-min", None
    else:
        keep = aligned_length(len(tokens), tile, draft_min)
        if keep < len(tokens):
            tokens, reason = tokens[:keep], "tile"
        if tokens and len(tokens) < draft_min:  # llama.cpp drops a draft shorter than --spec-draft-n-min
            tokens, reason = [], "below-min"
    probs: list[float | None] = (
        list(proposal.probs[: len(tokens)]) if proposal.probs is not None else [None] * len(tokens)
    )
    shadow = None
    peeking = peeker(drafter)
    if budget.policy_plain and peeking is not None and not prefilled:
        shadow = peeking.peek(history)
    dists = proposal.dists if tokens else None
    name = proposal.drafter or drafter.name
    alternatives = [list(a) for a in (proposal.alternatives or [])[: len(tokens)]]
    return _Drafted(
        tokens, probs, reason, dists, seconds, kv_before, kv_peak, shadow, name, proposal.block, alternatives, tree
    )


def _commit(
    tokens: list[int], is_eog: Callable[[int], bool], stop: Callable[[list[int]], int | None] | None
) -> tuple[list[int], str | None]:
    """Step 4: the verdict's ``tokens`` cut before the first end-of-generation token (finish ``eos``) and
    after the first that completes a stop string (``stop``), with the finish reason (None: neither)."""
    finish = None
    for j, t in enumerate(tokens):
        if is_eog(t):
            tokens, finish = tokens[:j], "eos"
            break
    if stop is not None and tokens:
        cut = stop(tokens)
        if cut is not None:
            tokens, finish = tokens[: cut + 1], "stop"
    return tokens, finish
