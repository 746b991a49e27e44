"""Advice checked in the server it is for: the same prompts through ``llama-server`` with ``--spec-type none``
and with the advised flags, the predicted speedup beside the measured one.

:func:`check_advice` takes an :class:`~specviz.analysis.advise.Advice` (its ``flags`` are the llama-server
flags it advises), the prompts it was learnt from (:func:`recorded_prompts` reads them from a recording),
and runs two servers built from the vendored llama.cpp (:class:`~specviz.analysis.llama_server.LlamaServer`)
side by side on loopback — one with ``--spec-type none``, one with the advised flags, the same context
settings — sending every prompt to each in turn, ``repeats`` times, alternating which goes first. The
measured speedup is the server's own: generated tokens over generation time (``timings.predicted_n`` /
``predicted_ms``, the prompt excluded), pooled over the prompts, advised over none, the median over the
repeats. The server's ``draft_n`` / ``draft_n_accepted`` are reported beside it.

The predicted speedup is the advice's own, for the rounds it was learnt from — the same prompts when they
are the recording's, as with ``specviz advise --check-server``. Advice learnt on some prompts and checked
on others (``benchmarks/bench_server_advice.py``) takes ``predicted``: the advised setting's expected
speedup on the prompts sent (:func:`~specviz.analysis.advise.predict` on specviz's recording of them,
made before the servers start), so that the measured speedup is compared with a prediction for the same
text; the advice's own figure is reported beside it.

A busy machine moves a repeat's speedup (issue 57: a specviz run of one setting fell from 2.20x to 1.41x
under two busy-loop processes). So after the ``repeats`` asked for, while the per-repeat speedups spread
more than :data:`STABLE_SPREAD` (:func:`speedup_spread`: their interquartile range over their median), the
prompts are sent again, up to ``max_repeats`` (:data:`MAX_REPEATS`); the result says whether the speedups
settled, after how many repeats and how far they spread (:class:`Stability`), and per repeat how much of
the machine the servers had (:class:`RepeatLoad`: the load average at its start and end, and each
server's CPU seconds over its requests' wall seconds and threads, :class:`ServerTime`, worded by
:mod:`specviz.decoding.machine_load`'s rule).
"""

from __future__ import annotations

import os
import shlex
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..backends.context_settings import ContextSettings
from ..decoding.machine_load import cpu_share, is_busy, judged_share, judged_share_text, load_average
from .llama_server import Completion, LlamaServer
from .server_args import parse_server_args


@dataclass
class ServerRun:
    """One setting's requests in the server, pooled over the prompts (one repeat)."""

    label: str
    args: list[str]
    predicted_n: int = 0
    predicted_ms: float = 0.0
    draft_n: int = 0
    draft_n_accepted: int = 0
    completions: list[Completion] = field(default_factory=list, repr=False)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over the server's generation seconds."""
        return 1000.0 * self.predicted_n / self.predicted_ms if self.predicted_ms > 0 else 0.0

    def add(self, c: Completion) -> None:
        """Pool one completion."""
        self.predicted_n += c.predicted_n
        self.predicted_ms += c.predicted_ms
        self.draft_n += c.draft_n
        self.draft_n_accepted += c.draft_n_accepted
        self.completions.append(c)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "label": self.label,
            "args": list(self.args),
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "tokens_per_second": self.tokens_per_second,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
        }


#: The per-repeat speedups count as stable when their interquartile range is at most this share of their
#: median (:func:`speedup_spread`). The check's target is a measured speedup within 10% of the prediction
#: (``benchmarks/bench_server_advice.py``): with the middle half of the repeats inside a band of a tenth of
#: the median, the median sits well inside that target. On a quiet machine (docs/server.md's table, three
#: repeats, one thread per server) seven of eight settings spread 1.5-7% by this measure and one 11%; the
#: load of issue 57 moved a speedup by a third.
STABLE_SPREAD = 0.10
#: The most repeats (``max_repeats``' default, never below ``repeats``): one spoilt repeat falls outside the
#: interquartile range from the fifth on; a machine whose load keeps coming and going is reported as such
#: rather than chased (every repeat sends every prompt to both servers).
MAX_REPEATS = 8


def speedup_spread(speedups: Sequence[float]) -> float | None:
    """How far per-repeat speedups spread: their interquartile range (inclusive quartiles) over their
    median; None under two repeats or with a median of 0 (nothing to compare). For three repeats it is their
    range over twice the median (2.06x, 2.03x, 2.09x: 1.5%)."""
    if len(speedups) < 2:
        return None
    med = statistics.median(speedups)
    if med <= 0:
        return None
    q1, _, q3 = statistics.quantiles(speedups, n=4, method="inclusive")
    return float((q3 - q1) / med)


def needs_more_repeats(
    speedups: Sequence[float], *, repeats: int, max_repeats: int, tolerance: float = STABLE_SPREAD
) -> bool:
    """Whether to send the prompts again: fewer than ``repeats`` done, or below ``max_repeats`` with the
    speedups spread beyond ``tolerance`` (:func:`speedup_spread`; a single repeat has no spread to judge)."""
    if len(speedups) < repeats:
        return True
    if len(speedups) >= max_repeats:
        return False
    spread = speedup_spread(speedups)
    return spread is not None and spread > tolerance


@dataclass(frozen=True)
class Stability:
    """Whether the per-repeat speedups settled: their spread (:func:`speedup_spread`) against the tolerance."""

    n_repeats: int
    spread: float | None  #: interquartile range over the median; None under two repeats
    low: float  #: the lowest per-repeat speedup (0 without repeats)
    high: float  #: the highest
    tolerance: float = STABLE_SPREAD

    @property
    def stable(self) -> bool | None:
        """The spread within the tolerance (None: fewer than two repeats, nothing to judge)."""
        return None if self.spread is None else self.spread <= self.tolerance

    def text(self) -> str:
        """For people: ``"stable after 3 repeats: ..."`` or ``"not stable after 8 repeats: ..."``."""
        n = f"{self.n_repeats} repeat{'s' if self.n_repeats != 1 else ''}"
        if self.spread is None:
            return f"{n}: no spread measured (two repeats or more measure it)"
        span = f"{self.low:.2f}x-{self.high:.2f}x"
        if self.stable:
            return (
                f"stable after {n}: the per-repeat speedups spread {self.spread:.0%} (interquartile range over "
                f"the median, tolerance {self.tolerance:.0%}; {span})"
            )
        return (
            f"not stable after {n}: the per-repeat speedups spread {self.spread:.0%} ({span}; interquartile "
            f"range over the median, tolerance {self.tolerance:.0%}); the machine may have been busy: see the "
            "load average and CPU share per repeat"
        )


def stability(speedups: Sequence[float], tolerance: float = STABLE_SPREAD) -> Stability:
    """The :class:`Stability` of per-repeat speedups."""
    return Stability(
        n_repeats=len(speedups),
        spread=speedup_spread(speedups),
        low=float(min(speedups, default=0.0)),
        high=float(max(speedups, default=0.0)),
        tolerance=tolerance,
    )


@dataclass(frozen=True)
class ServerTime:
    """How much of the machine one server had over its requests of a repeat: its CPU seconds (every
    thread's) over the wall seconds its requests took and the threads it was given. The requests go one at
    a time, so one server computes at a time and the share is the one it had."""

    cpu_seconds: float | None  #: None where its CPU time could not be read (no ``/proc``)
    wall_seconds: float = 0.0
    n_threads: int | None = None

    def _unjudged(self) -> float | None:
        return None if self.cpu_seconds is None else cpu_share(self.cpu_seconds, self.wall_seconds, self.n_threads)

    @property
    def cpu_share(self) -> float | None:
        """The CPU share (:func:`~specviz.decoding.machine_load.cpu_share`), judged only over
        :data:`~specviz.decoding.machine_load.JUDGED_SECONDS` or more (else None)."""
        return judged_share(self._unjudged(), self.wall_seconds)

    def text(self) -> str:
        """``"CPU share 97% of 2 threads"`` (:func:`~specviz.decoding.machine_load.judged_share_text`)."""
        return judged_share_text(self._unjudged(), self.wall_seconds, self.n_threads)

    def plus(self, other: ServerTime) -> ServerTime:
        """Both servers' time pooled (CPU seconds unknown where either's is)."""
        cpu = None if self.cpu_seconds is None or other.cpu_seconds is None else self.cpu_seconds + other.cpu_seconds
        return ServerTime(cpu, self.wall_seconds + other.wall_seconds, self.n_threads or other.n_threads)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "cpu_seconds": self.cpu_seconds,
            "wall_seconds": self.wall_seconds,
            "n_threads": self.n_threads,
            "cpu_share": self.cpu_share,
            "cpu_busy": is_busy(self.cpu_share),
        }


@dataclass(frozen=True)
class RepeatLoad:
    """How much of the machine the servers had over one repeat: the load average at its start and end, and
    each server's :class:`ServerTime` (``none``, ``advised``): a repeat whose speedup strays from the others'
    shows which server had less of the machine."""

    load_start: tuple[float, float, float] | None
    load_end: tuple[float, float, float] | None
    by_server: dict[str, ServerTime]

    @property
    def total(self) -> ServerTime:
        """Both servers pooled."""
        out = ServerTime(0.0)
        for t in self.by_server.values():
            out = out.plus(t)
        return out

    @property
    def cpu_share(self) -> float | None:
        """Both servers' CPU share pooled, judged (:attr:`ServerTime.cpu_share`)."""
        return self.total.cpu_share

    def text(self) -> str:
        """``"load average 0.61 at the start, 0.80 at the end; none: CPU share 97% of 2 threads; advised: CPU
        share 52% of 2 threads: the machine was busy"``."""
        parts = []
        if self.load_start is not None and self.load_end is not None:
            parts.append(f"load average {self.load_start[0]:.2f} at the start, {self.load_end[0]:.2f} at the end")
        parts += [f"{name}: {t.text()}" for name, t in self.by_server.items()]
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: the load average, both servers pooled, and ``by_server``."""
        return {
            "load_average": {
                "start": None if self.load_start is None else list(self.load_start),
                "end": None if self.load_end is None else list(self.load_end),
            },
            **self.total.to_dict(),
            "by_server": {name: t.to_dict() for name, t in self.by_server.items()},
        }


def process_cpu_seconds(pid: int | None) -> float | None:
    """A process's CPU seconds so far, every thread's, user and system (``/proc/PID/stat``'s utime and
    stime); None where it cannot be read (no ``/proc``, the process gone, no pid)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, AttributeError):
        return None


def repeat_speedup(none: ServerRun, advised: ServerRun) -> float:
    """One repeat's measured speedup: the advised server's pooled tokens/s over the plain one's (0 when the
    plain server generated nothing)."""
    return advised.tokens_per_second / none.tokens_per_second if none.tokens_per_second else 0.0


@dataclass
class ServerCheck:
    """The predicted speedup and the server's measured one, with the server's own counters."""

    predicted_speedup: float
    advised_flags: str
    context_args: list[str]
    repeats: list[tuple[ServerRun, ServerRun]]  #: (none, advised) per repeat
    n_prompts: int
    advice_text: str = ""
    #: the advice's own prediction, for the rounds it was learnt from (``predicted_speedup`` when not given)
    advice_speedup: float | None = None
    #: what may make the server's text differ from the recording's, in words (see :func:`check_advice`)
    notes: list[str] = field(default_factory=list)
    #: how much of the machine the servers had, per repeat (empty when not measured)
    loads: list[RepeatLoad] = field(default_factory=list)
    #: the repeats asked for and the most allowed (see :func:`needs_more_repeats`); None when not given
    requested_repeats: int | None = None
    max_repeats: int | None = None
    tolerance: float = STABLE_SPREAD

    @property
    def speedups(self) -> list[float]:
        """Measured speedup per repeat (advised over none, pooled tokens/s)."""
        return [repeat_speedup(n, a) for n, a in self.repeats]

    @property
    def stability(self) -> Stability:
        """Whether the per-repeat speedups settled within :attr:`tolerance`, after how many repeats."""
        return stability(self.speedups, self.tolerance)

    @property
    def measured_speedup(self) -> float:
        """The median of :attr:`speedups`."""
        return float(statistics.median(self.speedups)) if self.repeats else 0.0

    @property
    def error(self) -> float:
        """Measured over predicted, minus one (0.05: the server ran 5% faster than predicted)."""
        return self.measured_speedup / self.predicted_speedup - 1.0 if self.predicted_speedup else 0.0

    def _median(self, which: int, attr: str) -> float:
        return float(statistics.median(getattr(r[which], attr) for r in self.repeats)) if self.repeats else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """The two settings side by side: predicted and measured speedup, the server's tokens/s and counters
        (medians over the repeats)."""
        out = []
        for i, (label, flags, pred) in enumerate(
            (("none", "--spec-type none", 1.0), ("advised", self.advised_flags, self.predicted_speedup))
        ):
            drafted = self._median(i, "draft_n")
            acc = self._median(i, "draft_n_accepted")
            out.append(
                {
                    "setting": label,
                    "flags": flags,
                    "predicted_speedup": pred,
                    "measured_speedup": 1.0 if i == 0 else self.measured_speedup,
                    "server_tokens_per_second": self._median(i, "tokens_per_second"),
                    "predicted_n": self._median(i, "predicted_n"),
                    "draft_n": drafted,
                    "draft_n_accepted": acc,
                    "acceptance": acc / drafted if drafted else 0.0,
                }
            )
        return out

    def report(self) -> str:
        """Predicted and measured side by side, as text."""
        lines = [
            f"advice checked in llama-server: {self.n_prompts} prompts, {len(self.repeats)} repeats, "
            f"context {' '.join(self.context_args)}",
        ]
        if self.advice_text:
            lines.append(f"advice: {self.advice_text}")
        if self.advice_speedup is not None and self.advice_speedup != self.predicted_speedup:
            lines.append(
                f"predicted for these prompts: {self.predicted_speedup:.2f}x (the advice's own, for the prompts it "
                f"was learnt from: {self.advice_speedup:.2f}x)"
            )
        head = (
            f"{'setting':<10} {'predicted':>9} {'measured':>9} {'server t/s':>10} {'tokens':>7} {'draft_n':>8} "
            f"{'accepted':>8} {'acceptance':>10}"
        )
        lines.append(head)
        for r in self.rows():
            lines.append(
                f"{r['setting']:<10} {r['predicted_speedup']:>8.2f}x {r['measured_speedup']:>8.2f}x "
                f"{r['server_tokens_per_second']:>10.1f} {r['predicted_n']:>7.0f} {r['draft_n']:>8.0f} "
                f"{r['draft_n_accepted']:>8.0f} {r['acceptance']:>10.1%}"
            )
        lines.append(f"advised flags: {self.advised_flags}")
        lines.append(
            f"measured {self.measured_speedup:.2f}x vs predicted {self.predicted_speedup:.2f}x "
            f"({self.error:+.1%}); per repeat: " + ", ".join(f"{x:.2f}x" for x in self.speedups)
        )
        lines.append(self.stability.text())
        lines += [f"repeat {i}: {x:.2f}x; {ld.text()}" for i, (x, ld) in enumerate(zip(self.speedups, self.loads), 1)]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "predicted_speedup": self.predicted_speedup,
            "advice_speedup": self.predicted_speedup if self.advice_speedup is None else self.advice_speedup,
            "measured_speedup": self.measured_speedup,
            "error": self.error,
            "speedups": self.speedups,
            "n_repeats": len(self.repeats),
            "requested_repeats": self.requested_repeats,
            "max_repeats": self.max_repeats,
            "stable": self.stability.stable,
            "spread": self.stability.spread,
            "tolerance": self.tolerance,
            "stability": self.stability.text(),
            "repeat_load": [ld.to_dict() for ld in self.loads],
            "advised_flags": self.advised_flags,
            "context_args": list(self.context_args),
            "n_prompts": self.n_prompts,
            "rows": self.rows(),
            "repeats": [[n.to_dict(), a.to_dict()] for n, a in self.repeats],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class RecordedPrompt:
    """A prompt of a recording: its token ids and the generation length it ran with."""

    tokens: tuple[int, ...]
    max_tokens: int


def recorded_prompts(events: Sequence[Any]) -> tuple[list[RecordedPrompt], dict[str, Any]]:
    """The distinct prompts of a recording's ``session_started`` events (in order), and the context the
    recording ran with (``model``, ``n_ctx``, ``n_batch``, ``n_ubatch`` and ``prefill`` of the first)."""
    seen: set[tuple[int, ...]] = set()
    out: list[RecordedPrompt] = []
    ctx: dict[str, Any] = {}
    for ev in events:
        if getattr(ev, "kind", "") != "session_started":
            continue
        if not ctx:
            ctx = {"model": ev.model, "n_ctx": ev.n_ctx, "n_batch": ev.n_batch, "n_ubatch": ev.n_ubatch}
            ctx["prefill"] = getattr(ev, "prefill", "all-but-last")
        key = tuple(int(t) for t in ev.prompt_tokens)
        if key and key not in seen:
            seen.add(key)
            out.append(RecordedPrompt(key, int(ev.max_tokens)))
    return out, ctx


def context_args(settings: ContextSettings) -> list[str]:
    """The context settings of both servers: the recording's sizes, one slot (requests come one at a time),
    and full-size sliding-window caches (``--swa-full``), as specviz's sessions keep by default. Measured on
    the embedded Gemma 3: against the server's ring-sized cache a session's greedy text parts at near-ties
    whatever cache the session keeps; with ``--swa-full`` and the server's prompt layout
    (``prefill="whole"``) it is the server's, token for token."""
    return [*settings.server_args(), "-np", "1", "--swa-full"]


def check_advice(
    advice: Any,
    prompts: Sequence[RecordedPrompt | Sequence[int] | str],
    model: str | os.PathLike,
    *,
    settings: ContextSettings | None = None,
    max_tokens: int | None = None,
    repeats: int = 3,
    max_repeats: int | None = None,
    tolerance: float = STABLE_SPREAD,
    binary: str | os.PathLike | None = None,
    extra_args: Sequence[str] = (),
    progress: Any = None,
    predicted: float | None = None,
    recorded_prefill: str | None = None,
) -> ServerCheck:
    """Run ``prompts`` through llama-server with ``--spec-type none`` and with ``advice.flags`` (see the
    module docstring) and return the predicted and measured speedups.

    ``prompts`` are recorded prompts (their own ``max_tokens`` unless ``max_tokens`` is given), token ids
    or text; ``settings`` the context both servers get (default: specviz's defaults, every CPU core);
    ``extra_args`` further llama-server flags for both (checked with
    :func:`~specviz.analysis.server_args.parse_server_args`: a flag that changes the drafts is refused);
    ``predicted`` the advised setting's expected speedup on ``prompts`` when the advice was learnt on others
    (default: the advice's own); ``recorded_prefill`` how the recording evaluated its prompts (its
    ``session_started`` events' ``prefill``): other than the server's ``whole``, a note says the texts can
    part; ``max_repeats`` the most repeats while the speedups spread beyond ``tolerance`` (default
    :data:`MAX_REPEATS`, at least ``repeats``; see :func:`measure_repeats`)."""
    from ..errors import LlamaServerError

    if advice.best is None:
        raise LlamaServerError(f"nothing to check: {advice.text}")
    if predicted is not None and not predicted > 0:
        raise LlamaServerError(f"predicted must be a speedup above 0 (got {predicted!r}): see advise.predict")
    if repeats < 1 or (max_repeats is not None and max_repeats < repeats):
        raise LlamaServerError(f"repeats {repeats} and max_repeats {max_repeats}: pass 1 <= repeats <= max_repeats")
    max_repeats = max(repeats, MAX_REPEATS) if max_repeats is None else max_repeats
    flags = advice.flags or "--spec-type none"
    advised_args = shlex.split(flags)
    parse_server_args(advised_args)  # the advised flags are flags specviz knows
    extra = [str(a) for a in extra_args]
    if any(a.startswith("--spec") or a in ("-md", "--model-draft") for a in extra):
        raise LlamaServerError("extra server arguments must not change the speculative settings: leave out --spec-*")
    settings = settings or ContextSettings.make(n_threads=os.cpu_count() or 1)
    ctx = [*context_args(settings), *extra]
    jobs: list[tuple[list[int] | str, int]] = []
    for p in prompts:
        if isinstance(p, RecordedPrompt):
            jobs.append((list(p.tokens), int(max_tokens or p.max_tokens)))
        elif isinstance(p, str):
            jobs.append((p, int(max_tokens or 128)))
        else:
            jobs.append(([int(t) for t in p], int(max_tokens or 128)))
    if not jobs:
        raise LlamaServerError("no prompt to check the advice on")
    with (
        LlamaServer(model, [*ctx, "--spec-type", "none"], binary=binary) as plain,
        LlamaServer(model, [*ctx, *advised_args], binary=binary) as advised,
    ):
        repeats_out, loads = measure_repeats(
            plain,
            advised,
            jobs,
            repeats=repeats,
            max_repeats=max_repeats,
            tolerance=tolerance,
            n_threads=settings.n_threads,
            progress=progress,
        )
    return ServerCheck(
        predicted_speedup=float(advice.best.speedup if predicted is None else predicted),
        advised_flags=flags,
        context_args=ctx,
        repeats=repeats_out,
        n_prompts=len(jobs),
        advice_text=advice.text,
        advice_speedup=float(advice.best.speedup),
        notes=prefill_notes(recorded_prefill),
        loads=loads,
        requested_repeats=repeats,
        max_repeats=max_repeats,
        tolerance=tolerance,
    )


def measure_repeats(
    plain: Any,
    advised: Any,
    jobs: Sequence[tuple[list[int] | str, int]],
    *,
    repeats: int,
    max_repeats: int,
    tolerance: float = STABLE_SPREAD,
    n_threads: int | None = None,
    progress: Any = None,
) -> tuple[list[tuple[ServerRun, ServerRun]], list[RepeatLoad]]:
    """Every job (a prompt and its generation length) sent to the ``plain`` (``--spec-type none``) and the
    ``advised`` server in turn, alternating which goes first, ``repeats`` times and then again while
    :func:`needs_more_repeats` says so; per repeat the two servers' pooled runs and a :class:`RepeatLoad`
    (``n_threads``: the threads each server was given). A server is anything with ``args``, ``proc`` (its
    process, with a ``pid``, or None) and ``complete`` as :class:`~specviz.analysis.llama_server.LlamaServer`."""
    servers = {"none": plain, "advised": advised}
    out: list[tuple[ServerRun, ServerRun]] = []
    loads: list[RepeatLoad] = []
    while needs_more_repeats(
        [repeat_speedup(n, a) for n, a in out], repeats=repeats, max_repeats=max_repeats, tolerance=tolerance
    ):
        r = len(out)
        runs = {"none": ServerRun("none", plain.args), "advised": ServerRun("advised", advised.args)}
        start = load_average()
        cpu: dict[str, float | None] = {"none": 0.0, "advised": 0.0}
        wall = {"none": 0.0, "advised": 0.0}
        for j, (prompt, n) in enumerate(jobs):
            order = ("none", "advised") if (r + j) % 2 == 0 else ("advised", "none")
            for name in order:
                server = servers[name]
                pid = server.proc.pid if server.proc is not None else None
                before, t0 = process_cpu_seconds(pid), time.perf_counter()
                # cache_prompt off: every request evaluates its prompt, as the first one did
                runs[name].add(server.complete(prompt, n, cache_prompt=False))
                wall[name] += time.perf_counter() - t0
                after, so_far = process_cpu_seconds(pid), cpu[name]
                cpu[name] = None if before is None or after is None or so_far is None else so_far + after - before
        times = {name: ServerTime(cpu[name], wall[name], n_threads) for name in ("none", "advised")}
        loads.append(RepeatLoad(start, load_average(), times))
        out.append((runs["none"], runs["advised"]))
        if progress is not None:
            n_, a_ = runs["none"], runs["advised"]
            why = f"/{repeats}" if r < repeats else f" (up to {max_repeats}: the speedups spread over {tolerance:.0%})"
            progress(
                f"repeat {r + 1}{why}: none {n_.tokens_per_second:.1f} t/s, advised {a_.tokens_per_second:.1f} t/s; "
                f"{loads[-1].text()}"
            )
    return out, loads


def prefill_notes(recorded_prefill: str | None) -> list[str]:
    """What a recording's prompt layout means for a comparison with llama-server, in words (none for the
    server's own layout, or when it is not known)."""
    if recorded_prefill in (None, "whole"):
        return []
    return [
        f"the recording evaluated its prompts {recorded_prefill!r} (the last prompt token in the first round's "
        "batch, as speculative-simple); llama-server evaluates the whole prompt, and where llama.cpp's kernels "
        "are not batch-invariant (quantized models on the CPU) the texts can part at a near-tie, and the drafts "
        "with them: record with `specviz run --server-args \"...\"` (prefill 'whole') to compare the same text"
    ]
