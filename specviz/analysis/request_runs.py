"""A deployment's request log run through a specviz session, request after request.

:func:`run_requests` starts every logged chat request (:mod:`specviz.sweep.request_log`) on one session:
its messages through the chat template, its own ``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
``seed`` and ``stop`` where it names them (else the defaults given). With ``server_loop`` each request
runs through llama-server's generation loop (:func:`~specviz.analysis.server_repro.run_like_the_server`) and
is counted as the server counts it. ``specviz run --requests`` and ``specviz replay`` of a request log use
it; a recorder subscribed to the session records every request, one ``session_started`` each. Each
request keeps its telemetry's CPU seconds and threads, so that its CPU share is judged
(:mod:`specviz.decoding.machine_load`) over its own rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..decoding.machine_load import cpu_share, judged_share, judged_share_text
from .server_repro import run_like_the_server

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
    """Every request of ``requests`` through ``session`` with ``strategy`` and ``knobs`` (see the module
    docstring); ``progress`` is called with each finished request."""
    out: list[RequestRun] = []
    for r in requests:
        n, kwargs = request_start_args(r, max_tokens=max_tokens, sampling=sampling)
        if chat_template:
            kwargs["chat_template"] = chat_template
        counts = None
        if server_loop:
            run = run_like_the_server(session, None, n, strategy, knobs, messages=r.message_dicts(), **kwargs)
            counts = {k: getattr(run, k) for k in ("draft_n", "draft_n_accepted", "verify_steps", "accepted_per_pos")}
        else:
            session.start(None, n, strategy, messages=r.message_dicts(), **kwargs, **knobs)
            session.run()
        t = session.telemetry_dict()
        res = RequestRun(
            id=r.id,
            prompt_tokens=int(session.n_prompt),
            tokens=list(session.tokens),
            text=session.text,
            drafted=int(t["drafted"]),
            accepted=int(t["accepted"]),
            seconds=float(t["seconds"]),
            finish=session.finished,
            server_counts=counts,
            cpu_seconds=float(t.get("cpu_seconds") or 0.0),
            n_threads=t.get("n_threads"),
        )
        out.append(res)
        if progress is not None:
            progress(res)
    return out
