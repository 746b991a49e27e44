"""Several requests at once on one model, as llama-server's slots (``-np N``): one target context holding N
sequences, each request a :class:`~specviz.decoding.session.Session` of its own on its sequence
(:class:`~specviz.backends.sequence_context.SequenceContext`: its own drafter, history, sampler, stops,
grammar and telemetry), and every round one ``llama_decode`` holding each busy sequence's pending token and
draft.

A :meth:`BatchRun.step` is llama-server's update loop in miniature:

1. **admit** — queued requests take the free slots (in submission order) and their prompts are evaluated,
   each on its own sequence (:meth:`~specviz.decoding.session.Session.start`);
2. **draft** — every busy session runs the first half of its round
   (:meth:`~specviz.decoding.session.Session.begin_step`: configuration, budget, draft);
3. **verify** — one decode of every busy sequence's batch
   (:meth:`~specviz.backends.llama.LlamaContext.eval_sequences`);
4. **accept** — every session runs the second half on its own sequence's rows
   (:meth:`~specviz.decoding.session.Session.finish_step`: accept, commit, roll back its tail, learn, events);
5. **finish** — a finished request's result is kept and its slot freed (continuous batching: requests start
   and finish at different steps).

A request refused when it starts, or whose round fails, ends with its error (:attr:`BatchResult.error`) and the
others run on. Only strategies that keep to their own state can share the target context: the hidden-state
drafters (EAGLE-3, MTP, DFlash) read the target's layers during its decode, which holds every sequence's
tokens here, and are refused at :meth:`BatchRun.submit` (:class:`~specviz.errors.BatchError`). The memory
kinds that cannot cut one sequence alone are refused when the run opens
(:class:`~specviz.errors.SequenceError`, from the shared context).

The figures of the run: :attr:`BatchRun.decodes` (the target's generation decodes, prompts aside) and
:attr:`BatchRun.sequences_per_decode` (busy sequences per such decode, summed), as the server's
``n_busy_slots_per_decode``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

from ..backends.llama import LlamaContext, LlamaModel
from ..backends.sequence_context import SequenceContext
from ..backends.sequences import SequenceTokens
from ..errors import BatchError, ContextError, SpecvizError
from ..models.embedded import resolve_model
from ..strategies import resolve_strategy, strategy_class
from .batch_cost import BatchCostTable
from .batch_layout import share_round_cost
from .cost_policy import CostPolicy
from .events import Accepted, BatchStepped, Event, Round
from .round import StepBegun, verified_rows
from .session import Session
from .target_setup import check_prefill, context_args, gpu_layers

__all__ = ["BatchRequest", "BatchResult", "BatchRun", "check_parallel"]


def check_parallel(n_parallel: Any) -> int:
    """``n_parallel`` (llama-server's ``-np``) when it is an integer of at least 1; :class:`BatchError` naming
    it otherwise."""
    if isinstance(n_parallel, bool) or not isinstance(n_parallel, int) or n_parallel < 1:
        raise BatchError(
            f"parallel (-np) must be an integer of at least 1 (the requests run at once), got {n_parallel!r}"
        )
    return n_parallel


def check_batchable(strategy: str) -> str:
    """``strategy``'s canonical name when it can run batched; :class:`BatchError` naming it otherwise (a
    drafter that reads the target's layers, or a chain holding one)."""
    name = resolve_strategy(strategy)
    members = name.split(",")
    readers = [m for m in members if strategy_class(m).reads_target]
    if readers:
        raise BatchError(
            f"strategy {name!r} cannot run batched: {', '.join(readers)} read the target's layers during its "
            "decode, which holds every request's tokens in a batched run; run it with parallel 1, or choose a "
            "strategy that keeps to its own state (the n-gram strategies, prompt-lookup, draft, none)"
        )
    return name


#: A draft schedule as vLLM spells it: ``(start, end, k)`` — while ``start`` to ``end`` sequences are busy, drafts
#: of at most ``k`` tokens.
Schedule = tuple[tuple[int, int, int], ...]


def check_schedule(schedule: Any) -> Schedule:
    """``schedule`` as :data:`Schedule`: ``(start, end, k)`` triples of integers, ``1 <= start <= end``, ``k >= 0``,
    ranges not overlapping; :class:`BatchError` naming the entry otherwise."""
    out: list[tuple[int, int, int]] = []
    for entry in schedule or ():
        ok = isinstance(entry, (tuple, list)) and len(entry) == 3
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in entry)
        if not ok or not 1 <= entry[0] <= entry[1] or entry[2] < 0:
            raise BatchError(
                f"draft schedule entry {entry!r}: expected [start, end, k] with 1 <= start <= end (busy sequences) "
                "and k >= 0 (the longest draft while that many are busy), as vLLM's schedule"
            )
        out.append((entry[0], entry[1], entry[2]))
    out.sort()
    for a, b in zip(out, out[1:]):
        if b[0] <= a[1]:
            raise BatchError(f"draft schedule entries {list(a)} and {list(b)} overlap: each busy count has one k")
    return tuple(out)


def parse_schedule(text: str) -> Schedule:
    """A schedule written ``1-2:16,3-8:0`` (``start-end:k``, or ``n:k`` for one busy count), as :func:`check_schedule`
    returns it; :class:`BatchError` naming the entry and the expected form otherwise."""
    out: list[tuple[int, int, int]] = []
    for item in str(text).split(","):
        span, sep, k = item.strip().partition(":")
        start, dash, end = span.partition("-")
        try:
            if not sep:
                raise ValueError
            out.append((int(start), int(end) if dash else int(start), int(k)))
        except ValueError:
            raise BatchError(
                f"draft schedule {text!r}: entry {item.strip()!r} is not start-end:k; expected e.g. 1-2:16,3-8:0 "
                "(while start to end sequences are busy, drafts of at most k tokens)"
            ) from None
    return check_schedule(out)


def scheduled_length(schedule: Schedule, busy: int) -> int | None:
    """The longest draft ``schedule`` allows while ``busy`` sequences are busy (None: no entry covers it)."""
    return next((k for start, end, k in schedule if start <= busy <= end), None)


@dataclass
class BatchRequest:
    """One request of a batched run: what :meth:`Session.start` takes (``prompt``, ``max_tokens``, ``strategy``
    and ``options``: sampling, stops, grammar, knobs), with the id :meth:`BatchRun.submit` gave it."""

    id: int
    prompt: str | list[int] | None
    max_tokens: int
    strategy: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class BatchResult:
    """A finished request: its ``tokens`` and ``text``, why it ended (``finished``: ``eos``, ``stop``,
    ``max_tokens`` …, or ``error`` with :attr:`error` set), its ``events`` and ``telemetry`` (its own
    session's), the ``slot`` (sequence) it ran on and the steps it started and ended at."""

    id: int
    slot: int
    tokens: list[int]
    text: str
    finished: str
    events: list[Event]
    telemetry: dict[str, Any]
    started_step: int
    ended_step: int
    error: SpecvizError | None = None
    #: the target's top-two ``(margin, first, second)`` at each token, where the run records them
    #: (``BatchRun(record_margins=True)``), for :func:`~specviz.analysis.equivalence.first_divergence`
    margins: list[tuple[float, int, int]] = field(default_factory=list)


def lane_of(slot: int, request: int, begun: StepBegun, rnd: Round) -> dict[str, Any]:
    """One request's part of a step, for :class:`~specviz.decoding.events.BatchStepped`'s ``lanes``."""
    p = begun.pending
    assert p is not None
    accepted = next((e for e in rnd.events if isinstance(e, Accepted)), None)
    return {
        "slot": slot,
        "request": request,
        "round": p.index,
        "position": p.position,
        "rows": 0 if p.prefilled else len(p.batch),
        "drafted": len(p.tokens),
        "accepted": accepted.n_accepted if accepted is not None else 0,
        "committed": len(rnd.new_tokens),
        "finished": rnd.finished,
    }


class BatchRun:
    """N requests at once on one model (see the module docstring).

    ``model``: a GGUF path, a loaded :class:`~specviz.backends.llama.LlamaModel`, or None for the embedded
    model; ``n_parallel``: the slots (llama-server's ``-np``); the context settings as
    :class:`~specviz.decoding.session.Session` takes them, ``n_ctx`` being the whole cache, split over the slots
    as llama-server splits ``-c`` (each slot holds ``n_ctx_seq`` positions) unless ``kv_unified``. Everything is
    checked before the model loads.

    ``record_margins``: each result keeps the target's top-two margin at each of its tokens
    (:attr:`BatchResult.margins`), so that a batched request that parts from the same request run alone can be
    told a near-tie (:func:`~specviz.analysis.equivalence.first_divergence`) from a bug.

    Load-aware drafting: ``draft_schedule`` (vLLM's ``[start, end, k]`` form) caps every request's draft at ``k``
    while ``start`` to ``end`` sequences are busy (the budget's ``load`` cap); ``batch_cost`` (a
    :class:`~specviz.decoding.batch_cost.BatchCostTable` of this machine) prices the whole batch for requests
    under the ``cost`` drafting policy: before each request drafts, its verify-cost curve becomes its share of the
    batch as llama.cpp will lay it out (:func:`~specviz.decoding.batch_layout.share_round_cost`: the other busy
    sequences at the rows they add this step, or added last step, and the tokens they are expected to commit), so
    a draft is chosen only where the tokens it adds per second it adds beat the batch's own rate. In a split cache
    a draft whose length no other sequence shares costs a micro-batch of its own, so the lengths the requests choose
    tend to agree, and fall as the batch fills.
    """

    def __init__(
        self,
        model: str | os.PathLike | LlamaModel | None = None,
        *,
        n_parallel: int,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        swa_full: bool = True,
        flash_attn: str = "auto",
        cache_type_k: str = "f16",
        cache_type_v: str = "f16",
        prefill: str = "all-but-last",
        kv_unified: bool = False,
        n_gpu_layers: int | None = None,
        draft_schedule: Any = None,
        batch_cost: BatchCostTable | None = None,
        record_margins: bool = False,
    ) -> None:
        n = check_parallel(n_parallel)
        self.draft_schedule = check_schedule(draft_schedule)
        self.batch_cost = batch_cost
        check_prefill(prefill)
        settings: dict[str, Any] = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads)
        settings.update(swa_full=swa_full, n_rs_seq=None, flash_attn=flash_attn, cache_type_k=cache_type_k)
        settings["cache_type_v"] = cache_type_v
        args = context_args(**settings)
        ngl = gpu_layers(n_gpu_layers, model)
        self.model = model if isinstance(model, LlamaModel) else LlamaModel(resolve_model(model), n_gpu_layers=ngl)
        self.ctx = LlamaContext(self.model, n_seq_max=n, kv_unified=kv_unified, **args)
        # a SequenceContext answers every call a session makes of its context, for its own sequence
        self.slots = [
            Session(self.model, context=cast(LlamaContext, SequenceContext(self.ctx, i)), prefill=prefill, **settings)
            for i in range(n)
        ]
        self.busy: list[BatchRequest | None] = [None] * n
        self.queue: deque[BatchRequest] = deque()
        self.results: dict[int, BatchResult] = {}
        self.steps = 0
        self.decodes = 0  #: the target's generation decodes (prompt evaluation aside)
        self.sequences_per_decode = 0  #: busy sequences in those decodes, summed
        #: the run's own events: a :class:`~specviz.decoding.events.BatchStepped` per step (each request's
        #: events are its session's, in its :class:`BatchResult`)
        self.events: list[Event] = []
        self._started: dict[int, int] = {}
        self._next_id = 0
        self._lane_seconds = 0.0  # a request's own work in a round besides the decode (a moving average)
        self._rows: dict[int, int] = {}  # rows each slot's sequence added to the last decode it was in
        self.kv_unified = kv_unified
        for session in self.slots:
            session.record_margins = record_margins
        self._margins: dict[int, list[tuple[float, int, int]]] = {}  # per slot, its request's so far

    @property
    def n_parallel(self) -> int:
        """The slots (sequences) of the run."""
        return len(self.slots)

    @property
    def mean_sequences_per_decode(self) -> float:
        """Busy sequences per generation decode, on average (0 before the first)."""
        return self.sequences_per_decode / self.decodes if self.decodes else 0.0

    def submit(
        self, prompt: str | list[int] | None = None, max_tokens: int = 128, strategy: str = "none", **options: Any
    ) -> int:
        """Queue a request (the arguments of :meth:`Session.start`) and return its id; it starts when a slot is
        free. A strategy that cannot run batched is refused here (:class:`~specviz.errors.BatchError`, nothing
        queued); anything else :meth:`Session.start` refuses ends the request with that error when it starts."""
        name = check_batchable(strategy)
        req = BatchRequest(self._next_id, prompt, max_tokens, name, dict(options))
        self._next_id += 1
        self.queue.append(req)
        return req.id

    @property
    def pending(self) -> bool:
        """Whether a request is queued or running."""
        return bool(self.queue) or any(r is not None for r in self.busy)

    def run(self) -> list[BatchResult]:
        """Step until every request has finished; the results in submission order."""
        while self.pending:
            self.step()
        return [self.results[i] for i in sorted(self.results)]

    def step(self) -> list[tuple[int, Round]]:
        """One step (see the module docstring): ``(request id, round)`` for every request that ran a round."""
        self.steps += 1
        self._admit()
        busy = sum(1 for r in self.busy if r is not None)
        cap = scheduled_length(self.draft_schedule, busy)
        # rows each busy sequence adds: this step's once drafted, else its last step's (a new request: one)
        rows = {slot: max(1, self._rows.get(slot, 1)) for slot, r in enumerate(self.busy) if r is not None}
        begun: list[tuple[int, StepBegun]] = []
        for slot, req in enumerate(self.busy):
            if req is None:
                continue
            self._price(slot, rows)
            try:
                b = self.slots[slot].begin_step(cap)
            except SpecvizError as e:
                self._end(slot, e)
                rows.pop(slot, None)
                continue
            if b.pending is None:  # the generation ended before a round (cancelled, context full)
                self._end(slot)
                rows.pop(slot, None)
                continue
            rows[slot] = self._rows[slot] = 0 if b.pending.prefilled else len(b.pending.batch)
            begun.append((slot, b))
        return self._verify_and_finish(begun)

    def _verify_and_finish(self, begun: list[tuple[int, StepBegun]]) -> list[tuple[int, Round]]:
        """Steps 3 to 5: one decode of every busy sequence's batch, then each session's second half."""
        parts = [
            SequenceTokens(slot, b.pending.batch, b.pending.n_past, "all")
            for slot, b in begun
            if b.pending is not None and not b.pending.prefilled
        ]
        t0 = time.perf_counter()
        if parts:
            try:
                batch = self.ctx.eval_sequences(parts)
            except ContextError as e:  # nothing was verified: every sequence of the batch ends with the error
                for slot, b in begun:
                    if b.pending is not None and not b.pending.prefilled:
                        self.slots[slot].ctx.memory.cut(b.pending.n_past, self.slots[slot].history)
                        self._end(slot, e)
                begun = [(slot, b) for slot, b in begun if b.pending is not None and b.pending.prefilled]
                parts = []
            else:
                self.decodes += 1
                self.sequences_per_decode += len(parts)
                for slot, _ in begun:
                    view = cast(SequenceContext, self.slots[slot].ctx)
                    if slot in batch.sequences:
                        view.rows_of(batch)
        decode_seconds = time.perf_counter() - t0 if parts else 0.0
        out: list[tuple[int, Round]] = []
        lanes: list[dict[str, Any]] = []
        for slot, b in begun:
            s, req = self.slots[slot], self.busy[slot]
            assert b.pending is not None and req is not None
            rows, row = verified_rows(s.ctx, b.pending)
            t_own = time.perf_counter()
            try:
                # each session's verify: the shared decode and its own acceptance (not the others')
                rnd = s.finish_step(b, rows, row, t_own - decode_seconds)
            except SpecvizError as e:
                self._end(slot, e)
                continue
            self._learn_lane(b, time.perf_counter() - t_own)
            res = s.generation.last_result
            if s.record_margins and res is not None:
                self._margins.setdefault(slot, []).extend(res.margins[: len(res.committed)])
            out.append((req.id, rnd))
            lanes.append(lane_of(slot, req.id, b, rnd))
            if rnd.finished is not None:
                self._end(slot)
        self.events.append(BatchStepped(self.steps, self.n_parallel, decode_seconds, len(self.queue), tuple(lanes)))
        return out

    def _price(self, slot: int, rows: dict[int, int]) -> None:
        """A request under the cost policy prices its round within the batch as llama.cpp will lay it out, the
        other busy sequences adding ``rows`` (with :attr:`batch_cost`; see the class docstring)."""
        policy = self.slots[slot].generation.policy
        if self.batch_cost is None or not isinstance(policy, CostPolicy):
            return
        others = sum(self._expected(j) for j in rows if j != slot)
        largest = int(self.slots[slot].generation.knobs.get("draft_max", 16)) + 1
        policy.cost = share_round_cost(
            self.batch_cost, rows, slot, others, self._lane_seconds, unified=self.kv_unified, largest=largest
        )

    def _expected(self, slot: int) -> float:
        """Tokens the request on ``slot`` is expected to commit this step: its cost policy's expectation at the
        length it last chose, or one (a plain round's) under another policy."""
        policy = self.slots[slot].generation.policy
        if isinstance(policy, CostPolicy) and policy.cost is not None:
            return policy.expected_tokens(policy.last_length or 0)
        return 1.0

    def _learn_lane(self, begun: StepBegun, rnd_seconds: float) -> None:
        """Fold a request's own work this round (drafting, reading its rows, bookkeeping: what it spent outside
        the shared decode) into the moving average the batch pricing uses."""
        p = begun.pending
        if p is not None:
            own = p.drafted.seconds + rnd_seconds
            self._lane_seconds += (own - self._lane_seconds) / 10

    def _admit(self) -> None:
        """Queued requests into free slots, their prompts evaluated on their sequences."""
        for slot, req in enumerate(self.busy):
            while req is None and self.queue:
                nxt = self.queue.popleft()
                try:
                    self.slots[slot].start(nxt.prompt, nxt.max_tokens, nxt.strategy, **nxt.options)
                except SpecvizError as e:  # refused, nothing changed: the request ends with its error
                    self.busy[slot] = nxt
                    self._started[nxt.id] = self.steps
                    self._end(slot, e, started=False)
                    continue
                self.busy[slot] = req = nxt
                self._started[nxt.id] = self.steps

    def _end(self, slot: int, error: SpecvizError | None = None, *, started: bool = True) -> None:
        """Keep slot ``slot``'s request's result (``started``: its generation began, so what it made so far is
        its) and free the slot, its sequence's cache dropped."""
        req, s = self.busy[slot], self.slots[slot]
        assert req is not None
        self.results[req.id] = BatchResult(
            id=req.id,
            slot=slot,
            tokens=list(s.tokens) if started else [],
            text=s.text if started else "",
            finished="error" if error is not None else str(s.finished),
            events=list(s.events) if started else [],
            telemetry=s.telemetry_dict() if started else {},
            started_step=self._started.get(req.id, self.steps),
            ended_step=self.steps,
            error=error,
            margins=self._margins.pop(slot, []),
        )
        self.busy[slot] = None
        self._rows.pop(slot, None)
        s.ctx.clear()

    def close(self) -> None:
        """Free the sessions' drafters and the shared context."""
        for s in self.slots:
            s.close()
        self.ctx.close()

    def __enter__(self) -> BatchRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
