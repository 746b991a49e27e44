"""A draft schedule by load: the longest draft that raises a batched run's total tokens/s at each number of busy
sequences, derived from a recording and a batch-cost table (``specviz advise REC --parallel 1,2,4,8 --schedule``).

The result is vLLM's ``[start, end, k]`` form, which :class:`~specviz.decoding.batch.BatchRun`'s
``draft_schedule`` (and ``specviz run -np N --draft-schedule``) takes: while ``start`` to ``end`` sequences are busy,
every request drafts at most ``k`` tokens.

The model, per busy count ``p`` and candidate length ``k``:

- **The rounds.** One drafting group of the recording (:func:`~specviz.analysis.advise_rounds.collect`; the group
  with drafted rounds and the most rounds): round ``i`` drafted ``L_i`` tokens and ``n_i`` of them were accepted.
  Acceptance is a prefix (as the n-gram strategies' and every chain's): capped at ``k``, the same round drafts
  ``min(L_i, k)`` and accepts ``min(n_i, k)``, verifying ``1 + min(L_i, k)`` rows; where that whole chunk was
  accepted and the recorded round accepted more, the next rounds copy on until its ``n_i + 1`` tokens are committed
  (:func:`capped_rounds`; at ``k = 0``, ``n_i + 1`` plain rounds of one row and one token). Capping each round
  alone would undercount the rounds a short cap spends copying a long span: on the embedded model at 8 requests at
  once, 2.72 tokens a round at ``k = 8`` where a batched run committed 3.26.
- **A step.** Every slot is busy: ``p`` rounds drawn at random (with replacement) from the rounds at that cap, one
  for each of the slots ``0 … p − 1`` (independent draws are already in random slot order). The step takes the decode of
  their rows **as llama.cpp lays the batch out**
  (:func:`~specviz.decoding.batch_layout.layout_seconds`: one graph in a unified cache; in a split cache one
  micro-batch per run of equal rows over consecutive slots, so uneven drafts cost extra graphs) plus every
  request's own work besides the decode, ``p`` × the *lane seconds*
  (:func:`~specviz.analysis.advise_parallel.lane_seconds`: the recording's median round less its verify).
- **The rate.** ``samples`` such steps, seeded (:class:`numpy.random.Generator`); predicted total tokens/s is their
  tokens over their seconds (a ratio of sums: what a run of those steps makes). Every ``k`` at one ``p`` is priced
  on the same draws (common random numbers: each draw a quantile of that cap's rounds, in recorded order), so
  the comparison between lengths carries little sampling noise of its own. The best ``k`` has the most tokens/s
  (a tie: the shorter).

Assumptions: each request's rounds are independent draws from the recording (no run of copying rounds that
lasts); every slot is busy (a server under steady load); a capped draft accepts its uncapped draft's prefix. What
uneven drafts cost in a split cache is what the layout prices; nothing else about the cache is modelled.

**Requests that arrive together** (``burst``; ``advise --schedule --burst W``) are priced otherwise: a burst of
``W`` requests per slot replayed from the recording's own requests, their rounds in order
(:mod:`.load_burst`), so that the slots that fall idle as requests finish and the run's tail with few requests are
priced too (:func:`burst_schedule`). Under steady load the time spent in that tail is small; in a burst on a split
cache it can decide between drafting and plain decoding at the top busy counts (docs/load.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..decoding.batch_cost import BatchCostTable
from ..decoding.batch_layout import layout_seconds
from ..decoding.tiling import aligned_length, verify_tile
from ..errors import KnobError, RecordingError
from .advise_parallel import MAX_PARALLEL, lane_seconds
from .advise_rounds import Rounds, collect
from .load_burst import Request, burst_rate, capped_step, draw_bursts, recorded_requests
from .sources import events_of

__all__ = ["LADDER", "LoadSchedule", "burst_schedule", "candidate_lengths", "capped_rounds", "schedule_for_load"]

#: The draft lengths ``specviz advise --schedule`` weighs below the recording's longest draft (which it always
#: weighs): the lengths llama-server users set, each a verify of a tile-friendly size or one row over.
LADDER = (1, 2, 3, 4, 8, 12, 16)
#: Steps drawn per busy count under steady load: at 400 the choice flipped between lengths within a per cent of
#: each other.
STEADY_SAMPLES = 2000
#: Bursts drawn per slot count for requests that arrive together (each one a whole run of the burst's requests).
BURST_SAMPLES = 64


@dataclass
class LoadSchedule:
    """The longest draft per busy count (see the module docstring). ``rows``: per busy count ``p`` in
    ``1 … busy_max`` its ``busy``, the ``draft_max`` chosen, ``tokens_per_second`` (candidate ``k`` → predicted
    total tokens/s) and ``vs_none`` (the chosen length's tokens/s over plain decoding's, ``k = 0``);
    ``schedule``: ``(start, end, k)`` triples covering ``1 … busy_max``, consecutive busy counts with one ``k``
    merged (what :func:`~specviz.decoding.batch.check_schedule` takes)."""

    busy_max: int
    unified: bool
    lane_seconds: float
    draft_lengths: tuple[int, ...]
    group: str
    samples: int
    seed: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    schedule: list[tuple[int, int, int]] = field(default_factory=list)
    #: requests per slot arriving together (:func:`burst_schedule`); None: steady load
    burst: int | None = None

    @property
    def flag(self) -> str:
        """The schedule as ``specviz run``'s ``--draft-schedule`` value: ``1-2:16,3-8:0``."""
        return ",".join(f"{a}-{b}:{k}" for a, b, k in self.schedule)

    def text(self) -> str:
        """The schedule for people: per busy count each length's predicted total tokens/s, the choice and its
        gain over plain decoding; then the schedule as the run flag and vLLM's form."""
        cache = "unified cache (-kvu)" if self.unified else "split cache (-np without -kvu)"
        head = "".join(f"{f'k={k}':>9}" for k in self.draft_lengths)
        out = [
            f"draft length by load, {self.group} rounds, {cache}: predicted total tokens/s",
            f"{'busy':>4}{head}  {'best':>5} {'vs none':>8}",
        ]
        for r in self.rows:
            cells = "".join(f"{r['tokens_per_second'][k]:>9.1f}" for k in self.draft_lengths)
            out.append(f"{r['busy']:>4}{cells}  {r['draft_max']:>5} {r['vs_none']:>7.2f}x")
        out.append(f"specviz run ... -np {self.busy_max} --draft-schedule {self.flag}")
        out.append(f"vLLM form: {[list(t) for t in self.schedule]}")
        if self.burst is None:
            how = f"{self.samples} steps of every slot busy per busy count, rounds drawn from the recording"
        else:
            how = (
                f"{self.samples} bursts per slot count of {self.burst} request(s) a slot arriving together, drawn "
                "from the recording's requests and run to the last; busy count p priced by a burst on p slots"
            )
        out.append(
            f"({how}, each draft capped at k; a step: the decode as llama.cpp lays it out plus busy x "
            f"{self.lane_seconds * 1e3:.2f} ms of each request's own work)"
        )
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``draft_schedule`` (``[start, end, k]`` lists), ``flag``, ``rows`` (tokens/s keyed by the
        length as text), ``unified``, ``lane_seconds``, ``busy_max``, ``draft_lengths``, ``group``, ``samples``,
        ``seed``, ``burst`` (requests per slot arriving together; None: steady load)."""
        return {
            "draft_schedule": [list(t) for t in self.schedule],
            "flag": self.flag,
            "rows": [
                {**r, "tokens_per_second": {str(k): v for k, v in r["tokens_per_second"].items()}} for r in self.rows
            ],
            "unified": self.unified,
            "lane_seconds": self.lane_seconds,
            "busy_max": self.busy_max,
            "draft_lengths": list(self.draft_lengths),
            "group": self.group,
            "samples": self.samples,
            "seed": self.seed,
            "burst": self.burst,
        }


def drafting_group(events: Any) -> tuple[str, Rounds]:
    """The recording's drafting group: among the groups with a drafted round, the one with the most rounds;
    :class:`~specviz.errors.RecordingError` when nothing was drafted."""
    groups = {label: r for label, r in collect(events_of(events)).rounds.items() if int(r.length.sum()) > 0}
    if not groups:
        raise RecordingError(
            "the recording holds no drafted round: record a run with a drafting strategy, e.g. "
            "specviz run --strategy ngram-simple --record FILE.jsonl"
        )
    label = max(groups, key=lambda g: len(groups[g].length))
    return label, groups[label]


def candidate_lengths(events: Any) -> list[int]:
    """The draft lengths ``advise --schedule`` weighs: the recording's longest draft and the lengths of
    :data:`LADDER` below it (a cap above the longest draft changes no round), each as a round runs it
    (:func:`effective_length`)."""
    _, r = drafting_group(events)
    longest = int(r.length.max())
    return sorted({effective_length(k, r.knobs) for k in LADDER if k < longest} | {longest})


def effective_length(k: int, knobs: dict[str, Any]) -> int:
    """The draft length a cap of ``k`` runs as under the recorded ``knobs``: rounded down to the verify tile as every
    round's limit is (:func:`~specviz.decoding.tiling.aligned_length`; a cap of 4 with the tile of 4 drafts 3, a
    batch of 4 rows), so a schedule never names a length its rounds do not draft and the replay caps at what runs."""
    return aligned_length(k, verify_tile(knobs), int(knobs.get("draft_min", 0))) if k > 0 else 0


def schedule_for_load(
    events: Any,
    table: BatchCostTable,
    busy_max: int,
    draft_lengths: Sequence[int],
    *,
    unified: bool,
    lane_seconds: float | None = None,
    samples: int | None = None,
    seed: int = 0,
    burst: int | None = None,
) -> LoadSchedule:
    """The draft length per busy count ``1 … busy_max`` for the rounds of ``events`` (a recording or a session's
    events), priced on ``table`` as llama.cpp lays the batch out in a ``unified`` cache or a split one; weighs
    ``0`` (plain decoding) and each of ``draft_lengths`` as a round runs it (:func:`effective_length`: 4, 8 and 16
    are 3, 7 and 15 with the verify tile of 4). ``lane_seconds``: each request's own seconds in a step
    besides the decode (default: the recording's, :func:`~specviz.analysis.advise_parallel.lane_seconds`).

    ``burst`` None: under steady load (every slot busy), ``samples`` steps per busy count (default 2000) drawn with
    ``numpy.random.default_rng(seed)``; see the module docstring. ``burst`` ``W``: for requests that arrive
    together, ``W`` per slot (:func:`burst_schedule`), ``samples`` bursts per slot count (default 64).

    :class:`~specviz.errors.RecordingError` for a recording without a drafted round;
    :class:`~specviz.errors.KnobError` for a busy count, length, sample count, burst or lane seconds out of
    range."""
    busy_max = _int_at_least("busy_max", busy_max, 1, MAX_PARALLEL)
    if burst is not None:
        burst = _int_at_least("burst", burst, 1, 1000)
    default = BURST_SAMPLES if burst is not None else STEADY_SAMPLES
    samples = _int_at_least("samples", default if samples is None else samples, 1, 10**6)
    given = [_int_at_least("draft_lengths", k, 0, 1 << 16) for k in draft_lengths]
    label, rounds = drafting_group(events)
    ks = sorted({0} | {effective_length(k, rounds.knobs) for k in given})
    lane = _lane(events, lane_seconds)
    out = LoadSchedule(busy_max, bool(unified), lane, tuple(ks), label, samples, seed, burst=burst)
    rng = np.random.default_rng(seed)
    if burst is not None:
        requests = recorded_requests(events, label)
        out.rows = burst_schedule(
            requests, table, busy_max, ks, burst, samples=samples, unified=out.unified, lane=lane, rng=rng
        )
    else:
        out.rows = _steady_rows(rounds, table, busy_max, ks, samples=samples, unified=out.unified, lane=lane, rng=rng)
    out.schedule = merge_runs([r["draft_max"] for r in out.rows])
    return out


def _steady_rows(
    rounds: Rounds,
    table: BatchCostTable,
    busy_max: int,
    ks: list[int],
    *,
    samples: int,
    unified: bool,
    lane: float,
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    """The rows under steady load (the module docstring's model)."""
    length, accepted = rounds.length.astype(np.int64), rounds.accepted.astype(np.int64)
    capped = {k: capped_rounds(length, accepted, k) for k in ks}
    rows = []
    for p in range(1, busy_max + 1):
        # one draw per step and slot, shared by every k: a quantile of that length's rounds
        draws = rng.random(size=(samples, p))
        rates = {}
        for k, (verified, tokens) in capped.items():
            picks = np.minimum((draws * len(verified)).astype(np.int64), len(verified) - 1)
            rates[k] = _rate(table, verified[picks], tokens[picks], unified, lane)
        best = _best(rates)
        rows.append(
            {"busy": p, "draft_max": best, "tokens_per_second": rates, "vs_none": _ratio(rates[best], rates[0])}
        )
    return rows


def burst_schedule(
    requests: Sequence[Request],
    table: BatchCostTable,
    busy_max: int,
    ks: Sequence[int],
    burst: int,
    *,
    samples: int,
    unified: bool,
    lane: float,
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    """The rows for requests that arrive together (:mod:`.load_burst`): busy count ``p``'s length is the one under
    which ``burst × p`` requests queued on ``p`` slots make the most total tokens/s, the lengths at ``1 … p − 1``
    already chosen the same way. A burst on ``p`` slots passes through every busy count below ``p`` as its requests
    finish and never above it, so each length is chosen for the run that reaches it first, with the tail it leaves
    priced by the lengths below. Per ``p``, ``samples`` bursts drawn from ``requests``
    (:func:`~specviz.analysis.load_burst.draw_bursts`) are shared by every length (common random numbers). A row's
    ``tokens_per_second[k]``: those bursts' total tokens/s with ``k`` at ``p``; its ``vs_none``: the chosen
    lengths' over plain decoding's at every busy count."""
    chosen: list[int] = []
    rows = []
    for p in range(1, busy_max + 1):
        queues = draw_bursts(len(requests), samples, burst * p, rng)

        def rate(by_busy: list[int], p: int = p, queues: list[list[int]] = queues) -> float:
            return burst_rate(requests, queues, p, by_busy, table, unified=unified, lane=lane)

        rates = {k: rate([*chosen, k]) for k in ks}
        best = _best(rates)
        chosen.append(best)
        rows.append(
            {"busy": p, "draft_max": best, "tokens_per_second": rates, "vs_none": _ratio(rates[best], rate([0] * p))}
        )
    return rows


def _best(rates: dict[int, float]) -> int:
    """The length with the most tokens/s; a tie keeps the shorter."""
    best = 0
    for k in sorted(rates):
        if rates[k] > rates[best]:
            best = k
    return best


def _ratio(got: float, plain: float) -> float:
    """``got`` over plain decoding's tokens/s (1 where plain made none)."""
    return got / plain if plain > 0 else 1.0


def merge_runs(by_busy: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(start, end, k)`` triples for the lengths ``by_busy`` (busy count 1 first), consecutive equal lengths
    merged."""
    out: list[tuple[int, int, int]] = []
    for p, k in enumerate(by_busy, start=1):
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], p, k)
        else:
            out.append((p, p, k))
    return out


def capped_rounds(length: np.ndarray, accepted: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The rounds the recorded ones take with every draft capped at ``k``: each round's rows and committed tokens.

    Each recorded round plays :func:`~specviz.analysis.load_burst.capped_step` until it is done: one round where the
    cap changes nothing or the draft was refused within the chunk, several where a cap below a span the recorded
    round copied spends more rounds copying it (which capping each round alone would leave out); together they commit
    the recorded round's ``n + 1`` tokens (at ``k = 0``, ``n + 1`` plain rounds)."""
    rows: list[int] = []
    tokens: list[int] = []
    for drafted, ok in zip(length.tolist(), accepted.tolist()):
        rest: tuple[int, int] | None = (drafted, ok)
        while rest is not None:
            r, t, rest = capped_step(*rest, k)
            rows.append(r)
            tokens.append(t)
    return np.asarray(rows, dtype=np.int64), np.asarray(tokens, dtype=np.int64)


def _rate(table: BatchCostTable, rows: np.ndarray, tokens: np.ndarray, unified: bool, lane: float) -> float:
    """Total tokens/s of the steps whose slots verify ``rows`` and commit ``tokens`` (one array row per step): their
    tokens over their seconds."""
    busy = rows.shape[1]
    seconds = sum(layout_seconds(table, step.tolist(), unified) for step in rows) + rows.shape[0] * busy * lane
    return float(tokens.sum()) / seconds if seconds > 0 else 0.0


def _lane(events: Any, given: float | None) -> float:
    """The lane seconds given (checked) or the recording's."""
    if given is None:
        return lane_seconds(collect(events_of(events)))
    if isinstance(given, bool) or not isinstance(given, (int, float)) or not given >= 0:
        raise KnobError(f"lane_seconds must be seconds >= 0, got {given!r}", knob="lane_seconds", value=given)
    return float(given)


def _int_at_least(name: str, value: Any, least: int, most: int) -> int:
    """``value`` as an integer in ``least … most``; :class:`~specviz.errors.KnobError` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not least <= int(value) <= most:
        raise KnobError(f"{name} must be integers {least}..{most}, got {value!r}", knob=name, value=value)
    return int(value)
