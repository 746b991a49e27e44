"""A deployment's request log run through specviz sessions: request after request, or N at a time.

:func:`run_requests` starts every logged chat request (:mod:`specviz.sweep.request_log`) on one session,
one after the other: its messages through the chat template (the model's own, or the built-in one named by
``chat_template``), its own ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop`` and
grammar where it names them (else the defaults given). :func:`run_requests_batched` runs the same requests
N at a time on a :class:`~specviz.decoding.batch.BatchRun` (llama-server's ``-np N`` slots: every step one
decode of every busy slot's verify batch; a queued request takes the first free slot). With ``server_loop``
each request runs through llama-server's generation loop (:class:`~specviz.analysis.server_repro.ServerLoop`)
and is counted as the server counts it. ``specviz run --requests`` (``-np N``) and ``specviz replay`` of a
request log use them.

A request its session refuses (a bad value in its line) or whose rounds fail ends with its error
(:attr:`RequestRun.error`) and the others run on. Each request keeps its telemetry's CPU seconds and threads,
so that its CPU share is judged (:mod:`specviz.decoding.machine_load`) over its own rounds, and its
generation decodes (:func:`generation_decodes`: the rounds that evaluated a verify batch); with a recorder,
every request is recorded in submission order, one ``session_started`` each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..decoding.events import DraftProposed, SessionStarted
from ..decoding.machine_load import cpu_share, judged_share, judged_share_text
from ..errors import SpecvizError
from .server_repro import ServerLoop

if TYPE_CHECKING:
    from ..decoding.batch import BatchResult, BatchRun
    from ..decoding.events import Event

#: request options -> Session.start arguments
_OPTIONS = ("temperature", "top_p", "top_k", "seed", "stop", "grammar")


@dataclass
class RequestRun:
    """One request's outcome."""

    id: str
    prompt_tokens: int
    tokens: list[int]
    text: str
    drafted: int
    accepted: int
    seconds: float
    finish: str | None
    server_counts: dict[str, Any] | None = field(default=None)
    #: the process's CPU seconds over the request's rounds and the threads they ran with (its telemetry's)
    cpu_seconds: float = 0.0
    n_threads: int | None = None
    slot: int = 0  #: the slot (sequence) it ran on: 0 one at a time
    decodes: int = 0  #: its generation decodes (:func:`generation_decodes`)
    error: str | None = None  #: why it ended early (``finish`` is then ``error``)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over the decode seconds."""
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance(self) -> float:
        """Accepted over drafted tokens (0 without drafts)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def cpu_share(self) -> float | None:
        """The request's CPU share (:func:`~specviz.decoding.machine_load.cpu_share` of its rounds), None where
        its rounds took less than :data:`~specviz.decoding.machine_load.JUDGED_SECONDS` (too short to judge)
        or the threads are not known."""
        return judged_share(cpu_share(self.cpu_seconds, self.seconds, self.n_threads), self.seconds)

    def cpu_text(self) -> str:
        """The request's CPU share for people (:func:`~specviz.decoding.machine_load.judged_share_text`)."""
        return judged_share_text(
            cpu_share(self.cpu_seconds, self.seconds, self.n_threads), self.seconds, self.n_threads
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        d = dict(self.__dict__)
        d["tokens_per_second"] = self.tokens_per_second
        d["acceptance"] = self.acceptance
        d["cpu_share"] = self.cpu_share
        return d


def pooled_cpu_share(runs: Sequence[RequestRun]) -> tuple[float | None, str]:
    """The requests' CPU share pooled (their CPU seconds over their seconds and threads), judged as one
    request's is (None under :data:`~specviz.decoding.machine_load.JUDGED_SECONDS` in all), and its words."""
    seconds = sum(r.seconds for r in runs)
    threads = next((r.n_threads for r in runs if r.n_threads), None)
    share = cpu_share(sum(r.cpu_seconds for r in runs), seconds, threads)
    return judged_share(share, seconds), judged_share_text(share, seconds, threads)


def request_start_args(request: Any, *, max_tokens: int, sampling: dict[str, Any] | None = None) -> tuple[int, dict]:
    """The generation length and the :meth:`~specviz.Session.start` keyword arguments of one request (its
    own options first, then ``sampling``)."""
    n = int(request.options.get("max_tokens") or max_tokens)
    kwargs: dict[str, Any] = dict(sampling or {})
    for key in _OPTIONS:
        if key in request.options:
            kwargs[key] = request.options[key]
    if kwargs.get("temperature", 0) == 0:
        kwargs.pop("seed", None)  # greedy: no generator to seed
    return n, kwargs


def generation_decodes(events: Sequence[Event]) -> int:
    """The target's generation decodes a request's rounds made: every round that evaluated a verify batch
    (a round after a whole-prompt prefill reads the prompt's last row and evaluates nothing: its draft's cap
    is ``prompt``). A batched run counts one decode per step for all its busy slots together; run alone,
    each of these is a decode of one sequence."""
    n, prefilled = 0, False
    for e in events:
        if isinstance(e, DraftProposed):
            prefilled = e.cap == "prompt"
        elif e.kind == "verified" and not prefilled:
            n += 1
    return n


def chat_start_args(
    r: Any, max_tokens: int, sampling: dict[str, Any] | None, chat_template: str | None
) -> tuple[int, dict]:
    """The generation length and :meth:`~specviz.Session.start` arguments of logged chat request ``r``
    (:func:`request_start_args`), its messages and the template among them."""
    n, kwargs = request_start_args(r, max_tokens=max_tokens, sampling=sampling)
    if chat_template:
        kwargs["chat_template"] = chat_template
    kwargs["messages"] = r.message_dicts()
    return n, kwargs


def _request_run(rid: str, telemetry: dict[str, Any], events: Sequence[Event], **fields: Any) -> RequestRun:
    """A :class:`RequestRun` from a request's telemetry and events (``fields``: its tokens, text, finish …)."""
    t = telemetry
    return RequestRun(
        id=rid,
        drafted=int(t.get("drafted") or 0),
        accepted=int(t.get("accepted") or 0),
        seconds=float(t.get("seconds") or 0.0),
        cpu_seconds=float(t.get("cpu_seconds") or 0.0),
        n_threads=t.get("n_threads"),
        decodes=generation_decodes(events),
        **fields,
    )


def run_requests(
    session: Any,
    requests: Sequence[Any],
    strategy: str,
    knobs: dict[str, Any],
    *,
    max_tokens: int = 128,
    sampling: dict[str, Any] | None = None,
    chat_template: str | None = None,
    server_loop: bool = False,
    progress: Callable[[RequestRun], None] | None = None,
) -> list[RequestRun]:
    """Every request of ``requests`` through ``session``, one after the other, with ``strategy`` and
    ``knobs`` (see the module docstring); ``progress`` is called with each finished request."""
    out: list[RequestRun] = []
    for r in requests:
        n, kwargs = chat_start_args(r, max_tokens, sampling, chat_template)
        counts, started, error = None, False, None
        try:
            if server_loop:
                loop = ServerLoop(strategy, knobs, n)
                session.start(None, n, loop.start_strategy, **kwargs, **loop.start_knobs)
                started = True
                while session.finished is None:
                    loop.before_round(session)
                    if not loop.count(session.step().events):
                        break
                counts = loop.counts()
            else:
                session.start(None, n, strategy, **kwargs, **knobs)
                started = True
                session.run()
        except SpecvizError as e:  # this request ends with its error (a refused start changed nothing)
            error = e
        if started:
            res = _request_run(
                r.id,
                session.telemetry_dict(),
                session.events,
                prompt_tokens=int(session.n_prompt),
                tokens=list(session.tokens),
                text=session.text,
                finish="error" if error is not None else session.finished,
                server_counts=counts,
                error=None if error is None else str(error),
            )
        else:
            res = _failed(r.id, error)
        out.append(res)
        if progress is not None:
            progress(res)
    return out


def _failed(rid: str, error: BaseException | None, slot: int = 0) -> RequestRun:
    """A request refused before its generation began."""
    return RequestRun(rid, 0, [], "", 0, 0, 0.0, "error", slot=slot, error=str(error))


def run_requests_batched(
    batch: BatchRun,
    requests: Sequence[Any],
    strategy: str,
    knobs: dict[str, Any],
    *,
    max_tokens: int = 128,
    sampling: dict[str, Any] | None = None,
    chat_template: str | None = None,
    server_loop: bool = False,
    progress: Callable[[RequestRun], None] | None = None,
    record: Callable[[Event], None] | None = None,
) -> list[RequestRun]:
    """Every request of ``requests`` through ``batch``, its slots' count at a time (see the module
    docstring); ``progress`` is called with each request as it finishes (requests finish out of order), the
    result is in submission order. ``record`` gets every request's events, request after request, in
    submission order once all have finished, then the run's ``batch_step`` events of these requests' steps (the
    lanes the inspector draws: :mod:`specviz.ui.batch_stream`). A strategy that cannot run batched is refused
    before anything is queued (:class:`~specviz.errors.BatchError`)."""
    from ..decoding.batch import check_batchable

    check_batchable(strategy)
    first_step = len(batch.events)
    loops: dict[int, ServerLoop] = {}
    ids: dict[int, str] = {}
    for r in requests:
        n, kwargs = chat_start_args(r, max_tokens, sampling, chat_template)
        if server_loop:
            loop = ServerLoop(strategy, knobs, n)
            rid = batch.submit(None, n, loop.start_strategy, **kwargs, **loop.start_knobs)
            loops[rid] = loop
        else:
            rid = batch.submit(None, n, strategy, **kwargs, **knobs)
        ids[rid] = r.id
    done: dict[int, RequestRun] = {}
    while batch.pending:
        for slot, req in enumerate(batch.busy):  # between steps every busy session is between rounds
            if req is not None and req.id in loops:
                loops[req.id].before_round(batch.slots[slot])
        for rid, rnd in batch.step():
            if rid in loops:
                loops[rid].count(rnd.events)
        for rid, res in batch.results.items():
            if rid in ids and rid not in done:
                done[rid] = _batched_run(ids[rid], res, loops.get(rid))
                if progress is not None:
                    progress(done[rid])
    if record is not None:
        for rid in ids:
            for e in batch.results[rid].events:
                record(e)
        for e in batch.events[first_step:]:
            record(e)
    return [done[rid] for rid in ids]


def _batched_run(rid: str, res: BatchResult, loop: ServerLoop | None) -> RequestRun:
    """A :class:`RequestRun` from a batched request's result (its own session's telemetry and events)."""
    if not res.events:  # refused when it started: nothing ran
        return _failed(rid, res.error, res.slot)
    started = next((e for e in res.events if isinstance(e, SessionStarted)), None)
    return _request_run(
        rid,
        res.telemetry,
        res.events,
        prompt_tokens=len(started.prompt_tokens) if started is not None else 0,
        tokens=list(res.tokens),
        text=res.text,
        finish=res.finished,
        server_counts=loop.counts() if loop is not None else None,
        slot=res.slot,
        error=None if res.error is None else str(res.error),
    )
