"""A bounded load on one ``llama-server``: a fixed list of completion requests sent at once from as many
threads, so that a server started with ``-np N`` serves them in its parallel slots, each slot's rows in the
same decodes as the others'.

Bounded by construction: one request per prompt, each with its own timeout, no retries; a request that fails
fails the load (:class:`~specviz.errors.LlamaServerError` naming every request that failed, raised after all
have returned, so no thread is left behind). The requests leave together (a barrier), so a server with as
many free slots as requests admits them in one pass of its loop or in the next few; which decode each
prompt lands in is the server's business and is not controlled here.

What comes back per request is the server's own :class:`~specviz.analysis.llama_server.Completion` (its
text, token ids, ``timings`` with ``draft_n`` / ``draft_n_accepted``), in the order of the prompts, and the
load's wall-clock seconds (total tokens per second over all slots).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import LlamaServerError
from .llama_server import Completion, LlamaServer, complete

__all__ = ["LoadResult", "complete_concurrently", "run_load"]

#: the most requests one load sends (one thread each): a guard against a mistaken prompt list
MAX_CONCURRENT = 256


@dataclass
class LoadResult:
    """The answers of one load, in the order of the prompts, and how long it took."""

    completions: list[Completion]
    wall_seconds: float  #: from the first request sent to the last answer
    request_seconds: list[float]  #: each request's own wall-clock seconds, sent to answered

    @property
    def tokens_predicted(self) -> int:
        """Tokens generated over every request (``timings.predicted_n`` summed)."""
        return sum(c.predicted_n for c in self.completions)

    @property
    def total_tokens_per_second(self) -> float:
        """Generated tokens of every request over the load's wall-clock seconds (the server's throughput)."""
        return self.tokens_predicted / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def draft_n(self) -> int:
        """Draft tokens verified over every request."""
        return sum(c.draft_n for c in self.completions)

    @property
    def draft_n_accepted(self) -> int:
        """Draft tokens accepted over every request."""
        return sum(c.draft_n_accepted for c in self.completions)


def _budgets(prompts: Sequence[Any], n_predict: int | Sequence[int]) -> list[int]:
    """One token budget per prompt: ``n_predict`` for every prompt, or one each."""
    if isinstance(n_predict, int):
        return [n_predict] * len(prompts)
    budgets = [int(n) for n in n_predict]
    if len(budgets) != len(prompts):
        raise LlamaServerError(
            f"n_predict gives {len(budgets)} budgets for {len(prompts)} prompts; give one each, or one number"
        )
    return budgets


def run_load(
    server: LlamaServer | str,
    prompts: Sequence[str | Sequence[int]],
    n_predict: int | Sequence[int],
    *,
    timeout: float = 600.0,
    **params: Any,
) -> LoadResult:
    """Send one ``POST /completion`` per prompt to ``server`` (a running :class:`LlamaServer` or a base URL),
    all at once from as many threads, and wait for every answer.

    ``n_predict``: one budget for all, or one per prompt; ``timeout``: seconds each request may take;
    ``params``: further fields of every request (greedy unless they set ``temperature``; ``cache_prompt``
    ...). Raises :class:`~specviz.errors.LlamaServerError` when there is nothing to send, too much, or when a
    request fails (after every request has returned, naming each failure)."""
    if not prompts:
        raise LlamaServerError("no prompts to send; give at least one")
    if len(prompts) > MAX_CONCURRENT:
        raise LlamaServerError(f"{len(prompts)} prompts at once is more than {MAX_CONCURRENT}; send fewer")
    budgets = _budgets(prompts, n_predict)
    url = server.url if isinstance(server, LlamaServer) else str(server)
    log = server.log if isinstance(server, LlamaServer) else None
    gate = threading.Barrier(len(prompts))

    def one(i: int) -> tuple[Completion, float]:
        gate.wait(timeout)  # every request leaves together
        t0 = time.perf_counter()
        out = complete(url, prompts[i], budgets[i], timeout=timeout, log=log, **params)
        return out, time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(prompts), thread_name_prefix="specviz-load") as pool:
        futures = [pool.submit(one, i) for i in range(len(prompts))]
        answers: list[tuple[Completion, float] | None] = []
        failures: list[str] = []
        for i, f in enumerate(futures):
            try:
                answers.append(f.result())
            except (LlamaServerError, threading.BrokenBarrierError) as e:
                answers.append(None)
                failures.append(f"request {i}: {e}")
    wall = time.perf_counter() - t0
    if failures:
        raise LlamaServerError(f"{len(failures)} of {len(prompts)} concurrent requests failed: " + "; ".join(failures))
    done = [a for a in answers if a is not None]
    return LoadResult([c for c, _ in done], wall, [s for _, s in done])


def complete_concurrently(
    server: LlamaServer | str,
    prompts: Sequence[str | Sequence[int]],
    n_predict: int | Sequence[int],
    *,
    timeout: float = 600.0,
    **params: Any,
) -> list[Completion]:
    """The completions of ``prompts`` sent at once (see :func:`run_load`), in the order of the prompts."""
    return run_load(server, prompts, n_predict, timeout=timeout, **params).completions
