"""Advice under load checked in the server it is for: for each concurrency ``N``, two llama-servers with ``-np N``
(``--spec-type none``, and the setting advised at ``N``: :class:`~specviz.analysis.advise_parallel.ParallelAdvice`),
each sent ``N`` requests at once (:func:`~specviz.analysis.server_load.run_load`), the predicted speedup beside the
measured one.

The requests are the recording's prompts, each sent as often as every other, ``N`` at a time (a load of ``N``
requests sent at once, then the next, until every prompt went the same number of times). The measured speedup
is the server's own: each request's generated tokens over its generation time (``timings.predicted_n`` /
``predicted_ms``, the prompt excluded), pooled over the requests, advised over none; ``repeats`` times,
alternating which server goes first, the median kept. Each server's context is the recording's per request:
``-c`` the recorded context times ``N`` (llama-server splits it over its slots), full-size sliding-window caches
(``--swa-full``), as specviz's sessions keep.
"""

from __future__ import annotations

import math
import os
import shlex
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..backends.context_settings import ContextSettings
from ..errors import LlamaServerError
from .check_server import RecordedPrompt
from .llama_server import LlamaServer
from .server_args import parse_server_args
from .server_load import LoadResult, run_load

__all__ = ["ParallelCheck", "check_parallel", "generation_rate"]


def generation_rate(load: LoadResult) -> float:
    """The server's generation rate per request, pooled over a load's requests: their generated tokens over
    their generation milliseconds (the prompts excluded), in tokens per second."""
    ms = sum(c.predicted_ms for c in load.completions)
    return 1000.0 * load.tokens_predicted / ms if ms > 0 else 0.0


def pooled(loads: Sequence[LoadResult]) -> LoadResult:
    """Several loads of one server as one: their completions together, their wall seconds summed."""
    return LoadResult(
        [c for x in loads for c in x.completions],
        sum(x.wall_seconds for x in loads),
        [t for x in loads for t in x.request_seconds],
    )


@dataclass
class ParallelCheck:
    """The check at each concurrency: ``rows`` with ``parallel``, ``setting``, ``flags``, ``predicted_speedup``,
    ``measured_speedup`` (the median over the repeats), ``speedups`` (per repeat), ``error`` (measured over
    predicted, minus one), both servers' tokens/s per request and in total, and draft counts."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    repeats: int = 0
    context_args: list[str] = field(default_factory=list)

    def report(self) -> str:
        """Predicted and measured side by side, as text."""
        out = [
            f"advice under load checked in llama-server ({self.repeats} repeats; each N: -np N, N requests at once, "
            f"context {' '.join(self.context_args)} per request)",
            f"{'parallel':>8}  {'setting':<28} {'predicted':>9} {'measured':>9} {'error':>7}  per repeat",
        ]
        for r in self.rows:
            out.append(
                f"{r['parallel']:>8}  {r['setting']:<28} {r['predicted_speedup']:>8.2f}x "
                f"{r['measured_speedup']:>8.2f}x {r['error']:>+7.1%}  " + ", ".join(f"{x:.2f}x" for x in r["speedups"])
            )
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``checked`` (the rows), ``repeats``, ``context_args``."""
        return {"checked": list(self.rows), "repeats": self.repeats, "context_args": list(self.context_args)}


def check_parallel(
    advice: Any,
    prompts: Sequence[RecordedPrompt],
    model: str | os.PathLike,
    parallels: Sequence[int],
    *,
    settings: ContextSettings | None = None,
    max_tokens: int | None = None,
    repeats: int = 3,
    binary: str | os.PathLike | None = None,
    extra_args: Sequence[str] = (),
    progress: Any = None,
) -> ParallelCheck:
    """Measure ``advice`` (a :class:`~specviz.analysis.advise_parallel.ParallelAdvice`) at each of ``parallels``
    in llama-server (see the module docstring); ``settings``: one request's context (default: specviz's, every
    core); ``extra_args``: further flags for both servers (a speculative flag among them is refused)."""
    if not prompts:
        raise LlamaServerError("no prompt to check the advice on")
    extra = [str(a) for a in extra_args]
    if any(a.startswith("--spec") or a in ("-md", "--model-draft", "-np", "--parallel") for a in extra):
        raise LlamaServerError("extra server arguments must not change the speculative settings or the slots")
    settings = settings or ContextSettings.make(n_threads=os.cpu_count() or 1)
    rows = {r["parallel"]: r for r in advice.rows}
    out = ParallelCheck(repeats=repeats, context_args=[*settings.server_args(), "--swa-full", *extra])
    for p in parallels:
        if p not in rows:
            raise LlamaServerError(f"the advice holds no row for {p} requests at once (it has {sorted(rows)})")
        row = rows[p]
        advised = shlex.split(row["flags"])
        parse_server_args(advised)  # flags specviz knows
        ctx = [*ContextSettings.make(**{**settings.to_dict(), "n_ctx": settings.n_ctx * p}).server_args()]
        ctx += ["-np", str(p), "--swa-full", *extra]
        # every prompt sent as often as every other, N at a time: lcm(prompts, N) requests in loads of N
        n = len(prompts) * p // math.gcd(len(prompts), p)
        jobs = [list(prompts[i % len(prompts)].tokens) for i in range(n)]
        budgets = [int(max_tokens or prompts[i % len(prompts)].max_tokens) for i in range(n)]
        out.rows.append(_measure(p, row, model, ctx, advised, jobs, budgets, repeats, binary, progress))
    return out


def _measure(
    p: int,
    row: dict[str, Any],
    model: str | os.PathLike,
    ctx: list[str],
    advised: list[str],
    jobs: list[list[int]],
    budgets: list[int],
    repeats: int,
    binary: str | os.PathLike | None,
    progress: Any,
) -> dict[str, Any]:
    """One concurrency's two servers, ``repeats`` loads each, alternating which goes first."""
    loads: dict[str, list[LoadResult]] = {"none": [], "advised": []}
    with (
        LlamaServer(model, [*ctx, "--spec-type", "none"], binary=binary) as plain,
        LlamaServer(model, [*ctx, *advised], binary=binary) as adv,
    ):
        servers = {"none": plain, "advised": adv}
        for r in range(repeats):
            for name in ("none", "advised") if r % 2 == 0 else ("advised", "none"):
                # cache_prompt off: every request evaluates its prompt, as the first one did
                parts = [
                    run_load(servers[name], jobs[i : i + p], budgets[i : i + p], cache_prompt=False)
                    for i in range(0, len(jobs), p)
                ]
                loads[name].append(pooled(parts))
            if progress is not None:
                progress(f"parallel {p}, repeat {r + 1}/{repeats}")
    speedups = [
        generation_rate(a) / generation_rate(n) if generation_rate(n) else 0.0
        for n, a in zip(loads["none"], loads["advised"])
    ]
    measured = float(statistics.median(speedups))
    predicted = float(row["predicted_speedup"])
    last = loads["advised"][-1]
    return {
        "parallel": p,
        "setting": row["setting"],
        "flags": row["flags"],
        "predicted_speedup": predicted,
        "measured_speedup": measured,
        "speedups": speedups,
        "error": measured / predicted - 1.0 if predicted else 0.0,
        "tokens_per_second": {k: statistics.median(generation_rate(x) for x in v) for k, v in loads.items()},
        "total_tokens_per_second": {
            k: statistics.median(x.total_tokens_per_second for x in v) for k, v in loads.items()
        },
        "draft_n": last.draft_n,
        "draft_n_accepted": last.draft_n_accepted,
    }
