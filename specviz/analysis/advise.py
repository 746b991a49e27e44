"""Which draft settings pay on this machine? Expected tokens/s of each setting, from what a session did.

:func:`advise` reads a session's events (live or recorded; rewinds honoured) and a verify-cost curve, and
searches ``draft_max``, ``draft_min`` and ``draft_p_min`` (and the strategy, among those the session
ran) for the highest expected tokens/s. It answers with the setting, its expected speedup over plain
decoding, and the same setting as llama.cpp flags for ``llama-server``.

How a setting is scored — a replay of the recorded rounds, no model needed:

* each round that drafted ``L`` tokens, of which the target accepted ``n``, is replayed under the setting:
  the draft is cut at ``draft_max`` (after verify-tile alignment, as the session's budget does) and at
  the first token whose draft probability is below ``draft_p_min``, then rounded down to suit the verify
  tile as the round rounds a draft shorter than its limit; a cut draft shorter than
  ``max(draft_min, 1)`` is dropped (a plain round). A drafting round commits ``min(n, k) + 1`` tokens and
  costs the verify of ``k + 1`` tokens plus its drafting; a plain round commits 1 token and costs a
  one-token verify (plus what the drafter spent proposing). Greedy acceptance of a prefix does not depend
  on the tokens after it, so the cut rounds are exact; what the replay cannot know is how the following
  rounds would have differed, so it scores the *per-round* mix the session saw;
* expected tokens/s = committed tokens over time, summed over the replayed rounds; the baseline is plain
  decoding, one token per one-token verify;
* the verify cost of a batch of ``b`` tokens comes from the measured curve (``cost``: a
  :class:`~specviz.decoding.policy.VerifyCostModel`, as the ``cost`` policy and ``benchmarks/bench_verify_cost.py``
  measure it), else from the curve recorded in the telemetry, else fitted to the recorded verify times
  (the median per batch size, a straight line through them for sizes never seen);
* drafting time: a model drafter's seconds per drafted token times ``k``; an n-gram drafter's recorded
  seconds per call (they barely depend on ``k``);
* everything else a round costs (reading the logits rows up to the first rejection, events, telemetry)
  is fitted to the recorded rounds as ``a + b * rows read`` (a round's seconds minus its drafting and its
  verify batch's cost); on a small model it is most of a round, on a large one a few percent.

Chains of drafters (``ngram-mod,mtp``): each round records which member drafted, so the advice breaks
acceptance down per drafter (``by_drafter``) and scores, besides the chain as run, every chain made of its
first members (``ngram-mod`` alone): llama.cpp asks the members in a fixed order, so where a later member
drafted, the earlier ones had drafted nothing, and without the later member those rounds are plain —
exact, as the cut rounds are. What a later member would have drafted where an earlier one won is never
recorded, so a later member alone, or another order, is not scored. The advice may so be a chain, with its
``--spec-type A,B`` and each member's flags.

When speculation is advised. A setting's expected speedup comes from a few hundred rounds at most, and
which of them drew a long accepted copy is chance: each group's best setting carries a bootstrap
interval of its speedup over its rounds (:mod:`specviz.analysis.uncertainty`: blocks of consecutive
rounds, a 90% interval, ``speedup_low`` / ``speedup_high``). The advice is the fastest of those settings
whose interval's lower end clears plain decoding (1.0, a one-sided 95% bound); when none does, the advice is
``--spec-type none`` and the fastest setting that beat plain decoding only within the uncertainty is kept
as ``declined``, its gain and interval named in ``reason``. The bound is on the recorded rounds: it does
not cover a verify-cost curve wrong for every round alike, nor other text than the recording's (what a
held-out prompt gets, :func:`predict` estimates from a recording of it, with its own interval).

Limits, stated in every answer: the search does not go beyond the longest draft recorded (nothing is
known about tokens never drafted), nor below the ``draft_p_min`` the session drafted with (tokens below
it were never proposed).

``for_server=True`` advises ``llama-server``: only the settings its flags can express are searched, so that
the expected speedup is that of the flags printed — no verify-tile alignment (the server verifies a draft
of ``k`` tokens in ``k + 1`` rows), no ``draft_min`` for the n-gram types that have none in llama.cpp
(ngram-simple, ngram-map-k, ngram-map-k4v, ngram-cache), ngram-cache's drafts of up to 8 tokens, no
ngram-simple m-gram shorter than its n-gram (llama.cpp's ngram-simple drafts nothing then), and no prompt
lookup (no llama.cpp type) when a llama.cpp type was recorded too.

:func:`predict` scores the advised setting, without searching, on other rounds than those it was learnt
from: what the advice should give on other prompts (a recording of them with the setting that was run),
for checking it where it is measured on those prompts.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..decoding.events import (
    Accepted,
    DraftProposed,
    Event,
    KnobsChanged,
    Rewound,
    SessionStarted,
    TelemetryEvent,
    Verified,
)
from ..decoding.policy import VerifyCostModel
from ..decoding.tiling import aligned_length, tile_aligned
from ..strategies import resolve_strategy, spec_type, strategy_class
from .diagnose import diagnose
from .sources import EventSource, events_of
from .uncertainty import CONFIDENCE, ratio_interval

#: The draft_min values searched (capped by draft_max).
DRAFT_MIN_GRID = (0, 1, 2, 3, 4, 6, 8)
#: The draft_p_min values searched (model drafters; from the recorded draft_p_min up).
P_MIN_GRID = tuple(round(0.1 * i, 1) for i in range(10))
#: llama.cpp's nearest ``--spec-type`` for a strategy it does not have (prompt lookup: ngram-simple).
NEAREST_SPEC_TYPE = {"prompt-lookup": "ngram-simple"}


@dataclass
class _Rounds:
    """The recorded rounds of one strategy, as arrays."""

    strategy: str
    knobs: dict[str, Any]
    length: np.ndarray  # drafted tokens L
    accepted: np.ndarray  # accepted n
    probs: list[list[float | None]]
    draft_seconds: np.ndarray
    has_probs: bool
    drafters: list[str] = field(default_factory=list)  # who drafted each round (a chain's member; "" for none)


@dataclass
class Candidate:
    """One scored setting."""

    strategy: str
    draft_max: int
    draft_min: int
    draft_p_min: float | None
    tokens_per_second: float
    tokens_per_round: float
    speedup: float
    #: the speedup's bootstrap interval over the rounds it was scored on (:mod:`specviz.analysis.uncertainty`;
    #: None where it was not estimated: plain decoding, fewer than two rounds)
    speedup_low: float | None = None
    speedup_high: float | None = None
    #: the rounds the setting was scored on
    rounds: int = 0

    @property
    def shown_to_pay(self) -> bool:
        """Whether the lower end of the speedup's interval clears plain decoding (1.0)."""
        return self.speedup_low is not None and self.speedup_low > 1.0

    def interval_text(self) -> str:
        """``"1.20-1.36x"``, or ``""`` without an interval."""
        if self.speedup_low is None or self.speedup_high is None:
            return ""
        return f"{self.speedup_low:.2f}-{self.speedup_high:.2f}x"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return dict(self.__dict__)


@dataclass
class Advice:
    """The advised setting, its expected speedup, the llama.cpp flags, and what it was computed from."""

    best: Candidate | None
    baseline_tokens_per_second: float
    per_strategy: dict[str, Candidate] = field(default_factory=dict)
    current: dict[str, Candidate] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    cost_source: str = ""
    overhead: tuple[float, float] = (0.0, 0.0)
    best_label: str = ""  #: the group of rounds (strategy and drafting policy) the best setting came from
    cost_curve: dict[str, Any] = field(default_factory=dict)
    limits: list[str] = field(default_factory=list)
    flags: str = ""
    flag_notes: list[str] = field(default_factory=list)
    by_depth: list[dict[str, Any]] = field(default_factory=list)
    by_confidence: list[dict[str, Any]] = field(default_factory=list)
    knobs: dict[str, Any] = field(default_factory=dict)
    #: acceptance per drafter that proposed drafts (a chain's members), from the diagnosis
    by_drafter: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: searched only what llama-server's flags express (``advise(..., for_server=True)``)
    for_server: bool = False
    #: the fastest setting found, not advised: its speedup beats plain decoding (or the advised setting's)
    #: only within the recording's uncertainty (its interval's lower end does not clear 1.0)
    declined: Candidate | None = None
    declined_label: str = ""
    #: the central share of bootstrap resamples the speedup intervals span (:mod:`specviz.analysis.uncertainty`)
    confidence: float = CONFIDENCE

    @property
    def pays(self) -> bool:
        """Whether the advice is to speculate (a setting other than plain decoding)."""
        return self.best is not None and self.best.strategy != "none"

    @property
    def reason(self) -> str:
        """Why speculation was or was not advised, in words: the rule is that the lower end of the advised
        setting's speedup interval clears plain decoding."""
        if self.best is None:
            return "no drafting round was recorded"
        conf = f"a {self.confidence:.0%} bootstrap interval over"
        d = self.declined
        if not self.pays:
            if d is None:
                return "no setting is expected to beat plain decoding"
            if d.speedup_low is None:
                return (
                    f"the best setting's gain, {d.speedup:.2f}x, rests on {d.rounds} round: too few to tell how "
                    "much rounds vary, so it is not shown to pay"
                )
            return (
                f"the best setting's gain, {d.speedup:.2f}x, is within the recording's uncertainty "
                f"({d.interval_text()}, {conf} its {d.rounds} rounds): its lower end does not clear plain "
                "decoding (1.00x)"
            )
        b = self.best
        out = (
            f"the advised setting's speedup, {b.speedup:.2f}x, is shown to pay: {b.interval_text()}, {conf} "
            f"its {b.rounds} rounds, lies above plain decoding (1.00x)"
        )
        if d is not None:
            out += (
                f"; {self.declined_label} at {d.speedup:.2f}x looks faster but its gain is within the "
                f"recording's uncertainty ({d.interval_text() or 'one round'})"
            )
        return out

    @property
    def text(self) -> str:
        """The advice in a few sentences (what ``specviz advise`` prints first)."""
        if self.best is None:
            return "no drafting round to learn from: run a strategy that drafts, then ask again"
        b = self.best
        if b.strategy == "none":
            if self.declined is not None:
                return (
                    f"speculation is not shown to pay here: {self.reason}; run without it ({self.flags}), or record "
                    "more rounds"
                )
            return (
                f"speculation does not pay here: no setting beats plain decoding "
                f"({self.baseline_tokens_per_second:.1f} tokens/s expected); run without it ({self.flags})"
            )
        pmin = f", draft_p_min {b.draft_p_min:g}" if b.draft_p_min is not None else ""
        cur = self.current.get(self.best_label)
        vs = f" (the setting run: {cur.speedup:.2f}x)" if cur is not None else ""
        iv = f" ({b.interval_text()} at {self.confidence:.0%})" if b.interval_text() else ""
        return (
            f"{b.strategy} with draft_max {b.draft_max}, draft_min {b.draft_min}{pmin}: expected "
            f"{b.tokens_per_second:.1f} tokens/s, {b.speedup:.2f}x plain decoding{iv}{vs}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Everything as one JSON-serialisable dictionary."""
        return {
            "text": self.text,
            "pays": self.pays,
            "reason": self.reason,
            "confidence": self.confidence,
            "best": self.best.to_dict() if self.best else None,
            "best_label": self.best_label,
            "declined": self.declined.to_dict() if self.declined else None,
            "declined_label": self.declined_label,
            "baseline_tokens_per_second": self.baseline_tokens_per_second,
            "per_strategy": {k: v.to_dict() for k, v in self.per_strategy.items()},
            "current": {k: v.to_dict() for k, v in self.current.items()},
            "measured": dict(self.measured),
            "cost_source": self.cost_source,
            "cost_curve": self.cost_curve,
            "limits": list(self.limits),
            "round_overhead": {"seconds": self.overhead[0], "seconds_per_row": self.overhead[1]},
            "llama_cpp_flags": self.flags,
            "flag_notes": list(self.flag_notes),
            "by_depth": self.by_depth,
            "by_confidence": self.by_confidence,
            "by_drafter": self.by_drafter,
            "knobs": self.knobs,
            "for_server": self.for_server,
        }

    def report(self) -> str:
        """A plain-text report."""
        lines = [self.text, f"why: {self.reason}", f"llama-server flags: {self.flags}"]
        lines += [f"  note: {n}" for n in self.flag_notes]
        lines.append(
            f"plain decoding: {self.baseline_tokens_per_second:.1f} tokens/s expected; verify cost {self.cost_source}"
        )
        for name, c in self.per_strategy.items():
            cur = self.current.get(name)
            pmin = f" p_min {c.draft_p_min:g}" if c.draft_p_min is not None else ""
            meas = self.measured.get(name)
            iv = f", {c.interval_text()}" if c.interval_text() else ""
            lines.append(
                f"  {name:<14} best: max {c.draft_max} min {c.draft_min}{pmin} -> {c.tokens_per_second:.1f} "
                f"tok/s ({c.speedup:.2f}x{iv})"
                + (f"; as run: {cur.tokens_per_second:.1f} tok/s expected" if cur else "")
                + (f", {meas:.1f} measured" if meas else "")
            )
        if len(self.by_drafter) > 1:
            lines.append(
                "acceptance by drafter: "
                + ", ".join(
                    f"{k} {v['acceptance']:.0%} of {v['examined']}"
                    for k, v in self.by_drafter.items()
                    if v["acceptance"] is not None
                )
            )
        lines += [f"limit: {x}" for x in self.limits]
        return "\n".join(lines)


# -- inputs ----------------------------------------------------------------------------------------


@dataclass
class Recorded:
    """What a session's events tell the advisor: the rounds of each group (:func:`group_label`), the verify
    seconds per batch size, the last cost curve the telemetry recorded, the measured tokens/s of each group
    (committed tokens over draft and verify seconds), and per round the figures the overhead fit reads
    (rows read, batch size, round seconds, draft seconds) where the telemetry tells them."""

    rounds: dict[str, _Rounds] = field(default_factory=dict)
    verify: dict[int, list[float]] = field(default_factory=dict)
    curve: dict[str, Any] | None = None
    measured: dict[str, float] = field(default_factory=dict)
    overhead: list[tuple[int, int, float, float, float]] = field(default_factory=list)


@dataclass
class _Group:
    """The rounds of one group as they are read: drafted lengths, accepted counts, draft probabilities and
    draft seconds, and the committed tokens and draft + verify seconds for the measured tokens/s."""

    strategy: str
    knobs: dict[str, Any]
    length: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    probs: list[list[float | None]] = field(default_factory=list)
    draft_seconds: list[float] = field(default_factory=list)
    drafters: list[str] = field(default_factory=list)
    committed: float = 0.0
    seconds: float = 0.0

    def rounds(self) -> _Rounds:
        """The group as arrays."""
        return _Rounds(
            self.strategy,
            self.knobs,
            np.array(self.length, dtype=np.int64),
            np.array(self.accepted, dtype=np.int64),
            self.probs,
            np.array(self.draft_seconds, dtype=float),
            any(p is not None for ps in self.probs for p in ps),
            list(self.drafters),
        )


@dataclass
class _RoundInFlight:
    """The round being read: its draft until its verdict, its verify seconds, then the rows it read and its
    batch size until its telemetry."""

    draft: DraftProposed | None = None
    verify_seconds: float | None = None
    rows_read: int | None = None
    batch: int = 1


def collect(events: Sequence[Event]) -> Recorded:
    """Read :class:`Recorded` from ``events`` (folded over rewinds already)."""
    groups: dict[str, _Group] = {}
    out = Recorded()
    strategy, knobs = "", {}
    cur = _RoundInFlight()
    for ev in events:
        if isinstance(ev, (SessionStarted, KnobsChanged, Rewound)):
            strategy, knobs = ev.strategy, dict(ev.knobs)
        elif isinstance(ev, DraftProposed):
            cur = _RoundInFlight(draft=ev)
        elif isinstance(ev, Verified):
            out.verify.setdefault(int(ev.batch_size), []).append(float(ev.seconds))
            cur.verify_seconds = float(ev.seconds)
        elif isinstance(ev, Accepted) and cur.draft is not None:
            d, cur.draft = cur.draft, None
            # rounds are grouped by strategy and drafting policy: a policy's own draft lengths shape what
            # the rounds could show, so the fixed and the cost policy's rounds of one strategy stay apart
            g = groups.setdefault(group_label(strategy, knobs), _Group(strategy, knobs))
            g.knobs = knobs
            g.length.append(len(d.tokens))
            g.accepted.append(int(ev.n_accepted))
            g.probs.append(list(d.probs))
            g.draft_seconds.append(float(d.seconds))
            g.drafters.append((d.drafter or strategy) if d.tokens else "")
            cur.rows_read, cur.batch = int(ev.n_accepted) + 1, len(d.tokens) + 1
            g.committed += len(ev.tokens)
            g.seconds += float(d.seconds) + (cur.verify_seconds or 0.0)
            cur.verify_seconds = None
        elif isinstance(ev, TelemetryEvent):
            _read_telemetry(ev.data or {}, cur, out)
    out.rounds = {name: g.rounds() for name, g in groups.items()}
    out.measured = {name: g.committed / g.seconds for name, g in groups.items() if g.seconds > 0}
    return out


def _read_telemetry(data: dict[str, Any], cur: _RoundInFlight, out: Recorded) -> None:
    """A round's telemetry: the cost policy's curve, and the round's seconds for the overhead fit."""
    pol = data.get("policy") or {}
    if isinstance(pol, dict) and pol.get("verify_cost"):
        out.curve = pol["verify_cost"]
    last = data.get("last_round") or {}
    if "seconds" in last and cur.rows_read is not None:
        rows_read, batch = cur.rows_read, cur.batch
        cur.rows_read, cur.batch = None, 1
        out.overhead.append(
            (
                rows_read,
                batch,
                float(last["seconds"]),
                float(last.get("draft_seconds", 0.0)),
                float(last.get("verify_seconds", 0.0)),
            )
        )


def scaled_to_times(cost: VerifyCostModel, verify: dict[int, list[float]]) -> tuple[VerifyCostModel, float]:
    """``cost`` scaled to the level of the recorded verify times (the median of recorded / curve over every
    recorded verify): the curve's shape comes from the measurement, its level from the rounds themselves,
    which ran under the same load as the figures the advice is compared with. ``(cost, 1.0)`` without
    recorded times. The recorded times include the acceptor's reading of the logits rows, so the scale is
    a little above 1 on an idle machine."""
    ratios = [t / cost(b) for b, ts in verify.items() for t in ts if cost(b) > 0]
    if not ratios:
        return cost, 1.0
    scale = float(statistics.median(ratios))
    return VerifyCostModel(cost.sizes.tolist(), (cost.seconds * scale).tolist()), scale


def group_label(strategy: str, knobs: dict[str, Any]) -> str:
    """The name of a group of rounds: the strategy, and the drafting policy when it is not the fixed one."""
    policy = knobs.get("draft_policy", "fixed")
    return strategy if policy in ("fixed", None) else f"{strategy} ({policy} policy)"


def fit_overhead(rows: list[tuple[int, int, float, float, float]]) -> tuple[float, float]:
    """``(a, b)``: what a round costs besides drafting and its verify (the batch and the reading of its rows),
    as ``a + b * rows read``, fitted to recorded rounds ``(rows read, batch, seconds, draft seconds, verify
    seconds)``; ``(0, 0)`` without them.

    Each round's overhead is its own seconds less its own draft and verify seconds, and the line goes
    through the median overhead of each number of rows read (weighted by how many rounds read it; a
    constant, the median, when the slope would be negative). The round's own verify seconds, not the
    verify-cost curve: a round's verify varies by milliseconds from the curve, and a residual against the
    curve fitted that noise as a per-round cost of up to 4 ms (measured here on the embedded model, where
    the real overhead is a few tenths of a millisecond), which inflated every speedup predicted. Medians: a
    round held up by the machine is one sample, not a slope."""
    if not rows:
        return 0.0, 0.0
    by: dict[int, list[float]] = {}
    for r in rows:
        by.setdefault(int(r[0]), []).append(max(r[2] - r[3] - r[4], 0.0))
    everything = [v for vs in by.values() for v in vs]
    if len(by) < 2:
        return float(np.median(everything)), 0.0
    x = np.array(sorted(by), float)
    y = np.array([np.median(by[int(k)]) for k in x], float)
    w = np.sqrt(np.array([len(by[int(k)]) for k in x], float))
    b, a = np.polyfit(x, y, 1, w=w)
    if b < 0 or a < 0:
        return float(np.median(everything)), 0.0
    return float(a), float(b)


def cost_from_times(verify: dict[int, list[float]]) -> VerifyCostModel | None:
    """A verify-cost curve fitted to recorded verify times: the median per batch size seen, and for the
    sizes in between or beyond, a least-squares line through those medians. None with fewer than two sizes."""
    if len(verify) < 2:
        return None
    sizes = sorted(verify)
    med = [statistics.median(verify[b]) for b in sizes]
    slope, icpt = np.polyfit(np.array(sizes, float), np.array(med, float), 1)
    top = max(max(sizes), 64)
    all_sizes = list(range(1, top + 1))
    secs = [statistics.median(verify[b]) if b in verify else max(float(icpt + slope * b), 1e-9) for b in all_sizes]
    return VerifyCostModel(all_sizes, secs)


# -- scoring ---------------------------------------------------------------------------------------


def _first_below(probs: list[list[float | None]], p_min: float) -> np.ndarray:
    """Per round: index of the first draft token whose probability is below ``p_min`` (its length if none)."""
    out = np.empty(len(probs), dtype=np.int64)
    for i, ps in enumerate(probs):
        j = next((j for j, p in enumerate(ps) if p is not None and p < p_min), len(ps))
        out[i] = j
    return out


def _terms(
    r: _Rounds,
    cost: VerifyCostModel,
    kmax: int,
    kmin: int,
    p_min: float | None,
    tile: int,
    first_below: np.ndarray | None,
    overhead: tuple[float, float] = (0.0, 0.0),
) -> tuple[np.ndarray, np.ndarray]:
    """Per round of ``r`` replayed under one setting (see the module docstring): the tokens it commits and
    the seconds it costs."""
    limit = aligned_length(kmax, tile, kmin)
    k = np.minimum(r.length, limit)
    if p_min is not None and first_below is not None:
        k = np.minimum(k, first_below)
    # what the round does to a draft shorter than its limit, by table (k never exceeds the limit)
    k = np.asarray([aligned_length(j, tile, kmin) for j in range(limit + 1)], dtype=np.int64)[k]
    plain = (k < max(kmin, 1)) | (r.length == 0)
    n_tok = np.where(plain, 1, np.minimum(r.accepted, k) + 1)
    vcost = np.array([cost(int(b)) for b in range(1, int(r.length.max(initial=0)) + 2)])
    verify = np.where(plain, vcost[0], vcost[np.maximum(k, 0)])
    if r.has_probs:  # a model drafter: its seconds per drafted token
        per_tok = r.draft_seconds / np.maximum(r.length, 1)
        draft = np.where(r.length == 0, r.draft_seconds, per_tok * np.maximum(k, 1))
    else:
        draft = r.draft_seconds
    return n_tok.astype(float), verify + draft + overhead[0] + overhead[1] * n_tok


def _score(
    r: _Rounds,
    cost: VerifyCostModel,
    kmax: int,
    kmin: int,
    p_min: float | None,
    tile: int,
    first_below: np.ndarray | None,
    overhead: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float]:
    """(tokens/s, tokens/round) of rounds ``r`` replayed under one setting (see the module docstring)."""
    n_tok, seconds = _terms(r, cost, kmax, kmin, p_min, tile, first_below, overhead)
    total = float(np.sum(seconds))
    return (float(np.sum(n_tok)) / total if total > 0 else 0.0), float(np.mean(n_tok)) if n_tok.size else 0.0


def with_interval(
    c: Candidate,
    r: _Rounds,
    cost: VerifyCostModel,
    tile: int,
    overhead: tuple[float, float],
    base: float,
) -> Candidate:
    """``c`` (a setting scored on rounds ``r``) with the uncertainty of its speedup: the interval of
    :func:`~specviz.analysis.uncertainty.ratio_interval` over ``r``'s rounds replayed under the setting, over
    plain decoding's tokens/s ``base``, and the number of rounds it is from. The interval stays None with
    fewer than two rounds."""
    fb = _first_below(r.probs, c.draft_p_min) if c.draft_p_min else None
    n_tok, seconds = _terms(r, cost, c.draft_max, c.draft_min, c.draft_p_min, tile, fb, overhead)
    iv = ratio_interval(n_tok, seconds)
    c.rounds = int(n_tok.size)
    if iv is not None and base > 0:
        c.speedup_low, c.speedup_high = iv[0] / base, iv[1] / base
    return c


#: n-gram types without a minimum draft length in llama.cpp (``--spec-draft-n-min`` serves model drafts only)
NO_DRAFT_MIN = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "prompt-lookup")
#: llama.cpp's ngram-cache drafts up to this many tokens (hard-coded in common/speculative.cpp)
NGRAM_CACHE_DRAFT = 8


def server_grid(strategy: str, longest: int, knobs: dict[str, Any] | None = None) -> tuple[list[int], tuple[int, ...]]:
    """The ``draft_max`` and ``draft_min`` values llama-server's flags can express for ``strategy`` (drafts
    recorded up to ``longest`` tokens, under ``knobs``).

    An n-gram type's ``draft_max`` is its m-gram size in the server (``--spec-ngram-simple-size-m``), not a
    cap on a longer draft: llama.cpp's ngram-simple drafts nothing at all when fewer than ``size_n``
    tokens would be copied (``common_ngram_simple_draft``), so an m-gram shorter than ``size_n`` never
    drafts, and those values are left out (a recorded draft cut to them would be scored as drafting)."""
    kmaxes = list(range(1, longest + 1))
    if strategy == "ngram-cache":
        kmaxes = [min(NGRAM_CACHE_DRAFT, longest)]
    size_n = (knobs or {}).get("size_n")
    if strategy == "ngram-simple" and isinstance(size_n, int):  # a recording's knobs hold it
        kmaxes = [k for k in kmaxes if k >= size_n]
    return kmaxes, ((0,) if strategy in NO_DRAFT_MIN else DRAFT_MIN_GRID)


def _search(
    r: _Rounds,
    cost: VerifyCostModel,
    base: float,
    tile: int,
    overhead: tuple[float, float] = (0.0, 0.0),
    for_server: bool = False,
) -> Candidate | None:
    if not r.length.size or r.length.max() == 0:
        return None
    kmaxes, kmins = (
        server_grid(r.strategy, int(r.length.max()), r.knobs)
        if for_server
        else (list(range(1, int(r.length.max()) + 1)), DRAFT_MIN_GRID)
    )
    recorded_pmin = float(r.knobs.get("draft_p_min", 0.0) or 0.0) if r.has_probs else None
    pmins: list[float | None] = (
        [p for p in P_MIN_GRID if p >= recorded_pmin - 1e-9] if recorded_pmin is not None else [None]
    )
    best: Candidate | None = None
    for p in pmins:
        fb = _first_below(r.probs, p) if p is not None and p > 0 else None
        for kmax in kmaxes:
            if tile_aligned(kmax, tile) != kmax:
                continue  # the session would round it down: the shorter one is scored already
            for kmin in kmins:
                if kmin > kmax:
                    break
                tps, tpr = _score(r, cost, kmax, kmin, p, tile, fb, overhead)
                if best is None or tps > best.tokens_per_second * (1 + 1e-9):
                    best = Candidate(r.strategy, kmax, kmin, p, tps, tpr, tps / base if base else 0.0)
    return best


def advise(
    source: EventSource,
    *more: EventSource,
    cost: VerifyCostModel | None = None,
    scale_to_rounds: bool = False,
    for_server: bool = False,
) -> Advice:
    """The advised setting for a :class:`~specviz.decoding.session.Session` or a list of events (see the module
    docstring); ``more`` sessions or recordings (another lane, another run) add their rounds, each folded
    over its own rewinds. ``cost`` is the measured verify-cost curve; without it, the session's measured
    one, the one recorded in the telemetry, or one fitted to the recorded verify times is used.

    ``scale_to_rounds``: scale the curve to the level of the rounds' own verify times
    (:func:`scaled_to_times`) — for a curve measured on the same machine just after the run, whose load
    may have changed meanwhile; not for a curve measured elsewhere on purpose.

    ``for_server``: search only what llama-server's flags express (see the module docstring).

    Rounds are grouped by strategy and drafting policy (``per_strategy`` / ``current`` are keyed
    ``"prompt-lookup"`` or ``"prompt-lookup (cost policy)"``)."""
    if cost is None:
        cost = getattr(source, "cost_model", None)
    first = events_of(source)
    rec = collect(first + [e for m in more for e in events_of(m)])
    terms = round_costs(rec, cost, scale_to_rounds)
    dg = diagnose(first)
    if terms is None:
        adv = Advice(None, 0.0, cost_source="none: fewer than two verify batch sizes were recorded")
        adv.limits.append(
            "the verify cost of batches longer than one token is unknown: measure it "
            "(benchmarks/bench_verify_cost.py, or the cost policy) or record a drafting session"
        )
        return adv
    curve, source_name, overhead, base = terms
    adv = Advice(
        None,
        base,
        cost_source=source_name,
        overhead=overhead,
        cost_curve=curve.to_dict(),
        by_depth=dg.by_depth(),
        by_confidence=dg.by_confidence(),
        knobs=dict(dg.knobs),
        measured=rec.measured,
        by_drafter=dg.by_drafter(),
        for_server=for_server,
    )
    groups = {name: r for name, r in rec.rounds.items() if name != "none"}
    if for_server and any(r.strategy != "prompt-lookup" for r in groups.values()):
        for name in [n for n, r in groups.items() if r.strategy == "prompt-lookup"]:
            del groups[name]
            adv.limits.append(f"{name}: left out (llama-server has no prompt-lookup type; a llama.cpp type ran too)")
    for name, r in groups.items():
        score_group(adv, name, r, curve, overhead, for_server=for_server)
        for label, prefix in chain_prefixes(name, r):
            score_group(adv, label, prefix, curve, overhead, for_server=for_server)
    if for_server:
        adv.limits.append(
            "searched for llama-server: no verify-tile alignment, no draft_min for the n-gram types without one, "
            "ngram-cache at 8 tokens"
        )
    if adv.per_strategy:
        choose_best(adv, rec.rounds)
    return adv


def round_costs(
    rec: Recorded, cost: VerifyCostModel | None, scale_to_rounds: bool = False
) -> tuple[VerifyCostModel, str, tuple[float, float], float] | None:
    """What a round of ``rec`` costs, as the advice scores it: the verify-cost curve (:func:`verify_cost`, scaled
    to the rounds' own verify times with ``scale_to_rounds``), where it comes from, the fitted overhead of a
    round (:func:`fit_overhead`) and plain decoding's tokens/s under them; None without a curve."""
    curve, source_name = verify_cost(cost, rec)
    if curve is None:
        return None
    if scale_to_rounds and source_name != "fitted to the recorded verify times":
        curve, scale = scaled_to_times(curve, rec.verify)
        if abs(scale - 1.0) > 0.05:
            source_name += f", scaled by {scale:.2f} to the rounds' own verify times"
    overhead = fit_overhead(rec.overhead)
    return curve, source_name, overhead, 1.0 / (curve(1) + overhead[0] + overhead[1])


def predict(
    advice: Advice,
    source: EventSource,
    *more: EventSource,
    cost: VerifyCostModel | None = None,
    scale_to_rounds: bool = False,
) -> Candidate | None:
    """The advised setting (``advice.best``) scored on other rounds: its expected tokens/s and speedup on the
    prompts ``source`` (and ``more``) ran, where ``advice``'s own figure is for the rounds it was learnt from.

    The rounds are read, costed (:func:`round_costs`, with ``cost`` and ``scale_to_rounds`` as in
    :func:`advise`) and replayed under the advised setting exactly as :func:`advise` scores a setting —
    the same group of rounds (strategy and drafting policy, or the chain's first members), the same cuts,
    no tile alignment when the advice was made ``for_server`` — but nothing is searched: the setting is
    the advice's. So advice learnt on some prompts gets a prediction for others (those a server is then
    measured on, :func:`~specviz.analysis.check_server.check_advice`) before they are measured, from a
    recording of them alone. Plain decoding scores ``1.0``. None when the advice has no setting, the rounds
    give no verify-cost curve, or they hold no round of the advised setting's group. The prediction carries
    its own bootstrap interval over the new rounds (``speedup_low`` / ``speedup_high``)."""
    b = advice.best
    if b is None:
        return None
    if cost is None:
        cost = getattr(source, "cost_model", None)
    rec = collect(events_of(source) + [e for m in more for e in events_of(m)])
    terms = round_costs(rec, cost, scale_to_rounds)
    if terms is None:
        return None
    curve, _, overhead, base = terms
    if b.strategy == "none":
        return Candidate("none", 0, 0, None, base, 1.0, 1.0)
    groups = dict(rec.rounds)
    for name, rounds in rec.rounds.items():
        groups.update(chain_prefixes(name, rounds))
    r = groups.get(advice.best_label)
    if r is None or not r.length.size:
        return None
    tile = 1 if advice.for_server else recorded_tile(r.knobs)
    fb = _first_below(r.probs, b.draft_p_min) if b.draft_p_min else None
    tps, tpr = _score(r, curve, b.draft_max, b.draft_min, b.draft_p_min, tile, fb, overhead)
    c = Candidate(b.strategy, b.draft_max, b.draft_min, b.draft_p_min, tps, tpr, tps / base if base else 0.0)
    return with_interval(c, r, curve, tile, overhead, base)


def verify_cost(cost: VerifyCostModel | None, rec: Recorded) -> tuple[VerifyCostModel | None, str]:
    """The verify-cost curve the advice uses and where it comes from: ``cost`` (measured), else the curve
    recorded in the telemetry, else one fitted to the recorded verify times (None with fewer than two
    batch sizes)."""
    if cost is not None:
        return cost, "measured"
    if rec.curve:
        return VerifyCostModel(rec.curve["sizes"], rec.curve["seconds"]), "recorded in the telemetry"
    return cost_from_times(rec.verify), "fitted to the recorded verify times"


def recorded_tile(knobs: dict[str, Any]) -> int:
    """The verify tile the rounds' drafts were aligned to (1 when they ran without alignment)."""
    return int(knobs.get("verify_tile", 1)) if knobs.get("align", True) else 1


def score_group(
    adv: Advice,
    name: str,
    r: _Rounds,
    cost: VerifyCostModel,
    overhead: tuple[float, float],
    *,
    for_server: bool = False,
) -> None:
    """Add group ``name``'s best setting (``adv.per_strategy``), the setting it ran with scored the same way
    (``adv.current``) and the limits of its search to ``adv``; nothing for a group that never drafted.
    ``for_server``: only what llama-server's flags express (:func:`server_grid`, no tile alignment)."""
    base = adv.baseline_tokens_per_second
    run_tile = recorded_tile(r.knobs)
    tile = 1 if for_server else run_tile
    c = _search(r, cost, base, tile, overhead, for_server=for_server)
    if c is None:
        return
    adv.per_strategy[name] = with_interval(c, r, cost, tile, overhead, base)
    kmax, kmin = int(r.knobs.get("draft_max", int(r.length.max()))), int(r.knobs.get("draft_min", 0))
    p = float(r.knobs["draft_p_min"]) if r.has_probs and "draft_p_min" in r.knobs else None
    tps, tpr = _score(r, cost, kmax, kmin, p, run_tile, _first_below(r.probs, p) if p else None, overhead)
    adv.current[name] = Candidate(r.strategy, kmax, kmin, p, tps, tpr, tps / base)
    longest = int(r.length.max())
    adv.limits.append(
        f"{name}: draft_max searched up to {longest}, the longest draft recorded"
        + (f"; draft_p_min from {p:g}, the value it drafted with" if p is not None else "")
    )


def chain_prefixes(label: str, r: _Rounds) -> list[tuple[str, _Rounds]]:
    """For the rounds of a chain: the rounds of each chain of its first members (see the module docstring),
    labelled ``"ngram-mod (of ngram-mod,mtp)"``; a later member's rounds become plain (no draft), their
    drafting time the chain's median time of a round nobody drafted in."""
    members = r.strategy.split(",")
    if len(members) < 2:
        return []
    drafters = np.array(r.drafters or [""] * r.length.size)
    idle = r.draft_seconds[drafters == ""]
    idle_seconds = float(np.median(idle)) if idle.size else 0.0
    out = []
    for k in range(1, len(members)):
        keep = np.isin(drafters, members[:k])
        name = ",".join(members[:k])
        out.append(
            (
                label.replace(r.strategy, f"{name} (of {r.strategy})", 1),
                _Rounds(
                    name,
                    _prefix_knobs(r.strategy, name, r.knobs),
                    np.where(keep, r.length, 0),
                    np.where(keep, r.accepted, 0),
                    [ps if kp else [] for ps, kp in zip(r.probs, keep)],
                    np.where(keep, r.draft_seconds, idle_seconds),
                    any(p is not None for ps, kp in zip(r.probs, keep) if kp for p in ps),
                    [d if kp else "" for d, kp in zip(r.drafters, keep)],
                ),
            )
        )
    return out


def _knob_names(strategy: str) -> dict[str, dict[str, str]]:
    """Per member of ``strategy`` (itself when it is no chain): its knob name -> the strategy's."""
    cls = strategy_class(strategy)
    return getattr(cls, "member_knobs", {strategy: {k.name: k.name for k in cls.knobs}})


def _prefix_knobs(chain: str, prefix: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """The chain's ``knobs`` as the knobs of ``prefix`` (its first members): the session's knobs as they
    are, each member's under the name it has in ``prefix``."""
    full, part = _knob_names(chain), _knob_names(prefix)
    members_knobs = {x for names in full.values() for x in names.values()}
    out = {n: v for n, v in knobs.items() if n not in members_knobs}
    for m, names in part.items():
        for mine, there in names.items():
            if full[m][mine] in knobs:
                out[there] = knobs[full[m][mine]]
    return out


def choose_best(adv: Advice, rounds: dict[str, _Rounds]) -> None:
    """The advice and its llama.cpp flags: of the groups' best settings whose speedup is shown to pay (the
    lower end of its interval above 1.0, :attr:`Candidate.shown_to_pay`), the one with the highest expected
    tokens/s; else plain decoding, with the fastest setting that beats plain decoding only within the
    recording's uncertainty kept as ``adv.declined``."""
    base = adv.baseline_tokens_per_second
    paying = {k: c for k, c in adv.per_strategy.items() if c.shown_to_pay}
    fastest = max(adv.per_strategy.items(), key=lambda kv: kv[1].tokens_per_second)
    if paying:
        label, best = max(paying.items(), key=lambda kv: kv[1].tokens_per_second)
        adv.best, adv.best_label = best, label
        if fastest[0] != label:
            adv.declined, adv.declined_label = fastest[1], fastest[0]
    else:
        label, best = fastest
        adv.best, adv.best_label = Candidate("none", 0, 0, None, base, 1.0, 1.0), "none"
        if best.speedup > 1.0:
            adv.declined, adv.declined_label = best, label
    group = rounds.get(label) or next((r for r in rounds.values() if best.strategy in r.strategy), None)
    adv.flags, adv.flag_notes = llama_flags(adv.best, group.knobs if group and adv.best.strategy != "none" else {})


# -- llama.cpp flags -------------------------------------------------------------------------------


def llama_flags(c: Candidate, knobs: dict[str, Any]) -> tuple[str, list[str]]:
    """The setting ``c`` (with the strategy's other ``knobs``) as ``llama-server`` flags of the llama.cpp
    that llama-cpp-python 0.3.36 vendors, and notes on what does not carry over. A chain is one
    ``--spec-type`` list and each member's flags (llama.cpp has one set of draft-model flags)."""
    s = resolve_strategy(c.strategy)
    if s == "none":
        return "--spec-type none", []
    members = s.split(",")
    names = _knob_names(s)
    types = [spec_type(m) or NEAREST_SPEC_TYPE.get(m, m) for m in members]
    parts, notes = [f"--spec-type {','.join(types)}"], []
    for m in members:
        own = {mine: knobs[chain] for mine, chain in names.get(m, {}).items() if chain in knobs}
        own.update({k: v for k, v in knobs.items() if k in ("draft_policy", "draft_model")})
        p, n = _member_flags(m, c, own)
        parts += [x for x in p if x not in parts]
        notes += [x for x in n if x not in notes]
    return " ".join(parts), notes


def _member_flags(s: str, c: Candidate, knobs: dict[str, Any]) -> tuple[list[str], list[str]]:
    """One strategy's flags (without ``--spec-type``) for the setting ``c``, and notes."""
    t = spec_type(s) or NEAREST_SPEC_TYPE.get(s, s)
    notes: list[str] = []
    parts: list[str] = []
    if s in ("draft", "eagle3", "mtp", "dflash", "dspark"):
        if knobs.get("draft_model"):
            parts.append(f"-md {knobs['draft_model']}")
        parts.append(f"--spec-draft-n-max {c.draft_max}")
        parts.append(f"--spec-draft-n-min {c.draft_min}")
        if c.draft_p_min is not None:
            parts.append(f"--spec-draft-p-min {c.draft_p_min:g}")
    elif s in ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "prompt-lookup"):
        size_n = knobs.get("max_ngram", 3) if s == "prompt-lookup" else knobs.get("size_n", 12)
        parts.append(f"--spec-{t}-size-n {size_n}")
        parts.append(f"--spec-{t}-size-m {c.draft_max}")
        if s in ("ngram-map-k", "ngram-map-k4v") and knobs.get("min_hits") is not None:
            parts.append(f"--spec-{t}-min-hits {knobs['min_hits']}")
        notes.append(f"llama.cpp's {t} drafts size_m tokens: draft_max {c.draft_max} becomes --spec-{t}-size-m")
        if s == "prompt-lookup":
            notes.append(
                "llama.cpp has no prompt-lookup type; ngram-simple is the nearest (it matches one n-gram "
                f"size, {size_n}, where prompt lookup tries {knobs.get('max_ngram', 3)} down to "
                f"{knobs.get('min_ngram', 1)})"
            )
        if c.draft_min > 1:
            notes.append(f"llama.cpp's {t} has no minimum draft length (draft_min {c.draft_min} does not carry over)")
        if t == "ngram-simple" and c.draft_max < int(size_n):
            notes.append(
                f"llama.cpp's ngram-simple drafts nothing when its m-gram is shorter than its n-gram (size_m "
                f"{c.draft_max} < size_n {size_n}): in llama-server these flags do not speculate; advise for the "
                "server (--for-server) to search only what it drafts"
            )
    elif s == "ngram-mod":
        parts.append(f"--spec-ngram-mod-n-match {knobs.get('n_match', 24)}")
        parts.append(f"--spec-ngram-mod-n-min {max(c.draft_min, 1)}")
        parts.append(f"--spec-ngram-mod-n-max {c.draft_max}")
    elif s == "ngram-cache":
        if c.draft_max != 8:
            notes.append(
                f"llama.cpp's ngram-cache drafts up to 8 tokens (hard-coded); draft_max {c.draft_max} "
                "does not carry over"
            )
    if knobs.get("draft_policy", "fixed") != "fixed":
        notes.append(f"draft_policy {knobs['draft_policy']} has no llama.cpp counterpart")
    return parts, notes


def session_cost(s: Any) -> VerifyCostModel | None:
    """The session's verify-cost curve for the advisor (:meth:`~specviz.decoding.session.Session.verify_cost`: the
    one the cost policy measured, or measured now on the session's own context with the cache left as it was;
    None when the context has no room, and the advisor then fits the recorded verify times instead). The
    session measures it holding its own lock (a served session, in its scheduler turn too)."""
    return s.verify_cost()
