"""Drafting policies: how long a draft may be this round, shared by every strategy.

* ``fixed``: the configured ``draft_max``.
* ``adaptive`` (the static-shape runner's ``--adaptive-draft-count``): start at ``draft_max``; grow by 2 after a
  fully accepted draft, shrink by 1 otherwise, within ``[max(draft_min, 1), draft_max]``.
* ``cost`` (ours): measure the target's verify cost for batch sizes 1…k+1 once per session, keep an
  acceptance estimate per run position (how many tokens in a row were accepted before), and pick each
  round the length that maximises expected tokens per second (a draft must beat plain decoding by 5%).
  A length of 0 (plain decoding) is allowed when speculation does not pay; the drafter's unverified
  prediction in such a round, or a one-token probe every few rounds, keeps the estimate alive. A drafter
  that keeps a model of its own fed (``eagle3``, ``mtp``) reports that upkeep
  (:meth:`~specviz.strategies.context_drafter.ContextDrafter.take_upkeep`); the policy counts it in what drafting costs.

Each is a :class:`DraftingPolicy` (the protocol the budget and the session type against; the no-op hooks
of a policy that learns nothing from some rounds are :class:`QuietPolicy`'s). After the policy,
:mod:`specviz.decoding.budget` applies the hard caps and verify-tile alignment
(:mod:`specviz.decoding.tiling`).
"""

from __future__ import annotations

import bisect
import math
import time
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from .tiling import tile_aligned, verify_tile

POLICIES = ("fixed", "adaptive", "cost")

#: A verify cost's measured batch sizes and their seconds (:meth:`VerifyCostModel.points`).
CostPoints = tuple[tuple[int, ...], tuple[float, ...]]


@runtime_checkable
class DraftingPolicy(Protocol):
    """What the budget (:func:`specviz.decoding.budget.plan`) and the session ask of a drafting policy:
    a length each round, and what it learns from each round. :func:`make_policy` builds one by name."""

    name: str

    def length(self, draft_min: int, draft_max: int, tile: int = 1) -> tuple[int, float | None]:
        """Draft length for this round and the expected tokens it yields (None when not modelled).

        ``tile`` is the verify tile the session will round the length to afterwards; a policy that
        compares lengths only needs to compare the lengths that survive that rounding.
        """
        ...

    def expected_tokens(self, k: int) -> float | None:
        """Expected committed tokens of a round with a k-token draft (None when not modelled)."""
        ...

    def promise_plain(self) -> int | None:
        """(Asked after :meth:`length` chose 0) How many of the rounds after this one the policy promises to
        keep plain, a promise it then keeps; None when it makes none. For a drafter that pays to stay
        ready to draft (:meth:`~specviz.strategies.context_drafter.ContextDrafter.expect_plain`)."""
        ...

    def use_cost(self, cost: VerifyCostModel) -> None:
        """Give the policy the measured verify cost curve (only the cost policy uses it)."""
        ...

    def observe(self, n_drafted: int, n_accepted: int, draft_seconds: float) -> None:
        """Learn from a verified round; ``n_drafted`` 0: the round asked for a draft and the drafter
        proposed none (``draft_seconds`` is then what asking cost, its upkeep included)."""
        ...

    def observe_verify(self, batch_size: int, seconds: float) -> None:
        """Learn from the time of a real verify batch."""
        ...

    def observe_shadow(self, hit: bool) -> None:
        """Learn from a round without a draft: the drafter's unverified prediction was right (``hit``) or not."""
        ...

    def observe_idle(self) -> None:
        """Learn from a round without a draft and without a prediction."""
        ...

    def observe_upkeep(self, seconds: float, tokens: int, resume_seconds: float = 0.0) -> None:
        """Learn what keeping the drafter's model fed cost this round: ``seconds`` for ``tokens``
        committed positions, and ``resume_seconds`` bringing it back before drafting
        (:class:`~specviz.strategies.base.Upkeep`)."""
        ...

    def state(self) -> dict:
        """JSON-serialisable state for snapshots and rewind checkpoints."""
        ...

    def load(self, d: dict) -> None:
        """Restore :meth:`state`."""
        ...

    def describe(self) -> dict:
        """What the policy is working from, for telemetry (JSON-serialisable)."""
        ...

    def cost_points(self) -> CostPoints | None:
        """The verify cost's measured points as they are now (:meth:`VerifyCostModel.points`; None
        without a cost model)."""
        ...

    @classmethod
    def describe_state(cls, state: dict, points: CostPoints | None = None) -> dict:
        """:meth:`describe` of a policy whose :meth:`state` was ``state`` and :meth:`cost_points`
        ``points``: what a round's telemetry event keeps (both taken that round) and builds when read."""
        ...


class QuietPolicy:
    """The hooks of a policy that learns nothing from a round: every ``observe`` does nothing, no cost
    curve is used, no expectation is modelled and there is no state. Policies override what they use."""

    name = "quiet"

    def expected_tokens(self, k: int) -> float | None:
        """None: not modelled."""
        return None

    def promise_plain(self) -> int | None:
        """None: no promise (the length may change any round)."""
        return None

    def use_cost(self, cost: VerifyCostModel) -> None:
        """Ignored."""

    def observe(self, n_drafted: int, n_accepted: int, draft_seconds: float) -> None:
        """Ignored."""

    def observe_verify(self, batch_size: int, seconds: float) -> None:
        """Ignored."""

    def observe_shadow(self, hit: bool) -> None:
        """Ignored."""

    def observe_idle(self) -> None:
        """Ignored."""

    def observe_upkeep(self, seconds: float, tokens: int, resume_seconds: float = 0.0) -> None:
        """Ignored."""

    def state(self) -> dict:
        """No state."""
        return {}

    def load(self, d: dict) -> None:
        """Nothing to restore."""

    def cost_points(self) -> CostPoints | None:
        """None: no cost model."""
        return None

    @classmethod
    def describe_state(cls, state: dict, points: CostPoints | None = None) -> dict:
        """The policy's name."""
        return {"name": cls.name}

    def describe(self) -> dict:
        """What the policy is working from, for telemetry: :meth:`describe_state` of it now."""
        return self.describe_state(self.state(), self.cost_points())


class FixedPolicy(QuietPolicy):
    """Always the configured maximum."""

    name = "fixed"

    def length(self, draft_min: int, draft_max: int, tile: int = 1) -> tuple[int, float | None]:
        """``draft_max``, with no expectation."""
        return draft_max, None


class AdaptivePolicy(QuietPolicy):
    """+2 after a fully accepted draft, −1 otherwise, within the bounds."""

    name = "adaptive"

    def __init__(self) -> None:
        self.current: int | None = None

    def length(self, draft_min: int, draft_max: int, tile: int = 1) -> tuple[int, float | None]:
        lo = max(draft_min, 1)
        if self.current is None:
            self.current = draft_max
        self.current = min(max(self.current, lo), draft_max)
        return self.current, None

    def observe(self, n_drafted: int, n_accepted: int, draft_seconds: float) -> None:
        if n_drafted == 0 or self.current is None:
            return
        self.current += 2 if n_accepted == n_drafted else -1

    def state(self) -> dict:
        return {"current": self.current}

    @classmethod
    def describe_state(cls, state: dict, points: CostPoints | None = None) -> dict:
        """The name and the current length."""
        return {"name": cls.name, "current": state["current"]}

    def load(self, d: dict) -> None:
        self.current = d.get("current")


class VerifyCostModel:
    """Measured seconds to verify a batch of b tokens, b = 1…n, interpolated between measured sizes.

    The cost policy reads it every round (a curve of up to ``draft_max + 1`` sizes) and blends a real
    verify time into it every round, so both are plain-Python work on a table of every whole batch size
    up to the largest measured one (the measured sizes, and the interpolations between them), kept up to
    date by :meth:`update` (numpy's ``interp`` and ``searchsorted`` cost more per call than the whole
    lookup). :attr:`sizes` and :attr:`seconds` are the measured points, as arrays.
    """

    def __init__(self, sizes: Sequence[float], seconds: Sequence[float]) -> None:
        self._sizes = [float(b) for b in sizes]
        self._seconds = [float(t) for t in seconds]
        self._rebuild()

    @property
    def sizes(self) -> np.ndarray:
        """The measured batch sizes, ascending (a copy)."""
        return np.asarray(self._sizes, dtype=float)

    @property
    def seconds(self) -> np.ndarray:
        """The seconds of each measured size (a copy)."""
        return np.asarray(self._seconds, dtype=float)

    def _interp(self, b: float) -> float:
        """Between measured sizes: the straight line through the two around ``b`` (below the first: the
        first's seconds, as ``np.interp`` clamps)."""
        xs, ys = self._sizes, self._seconds
        if b <= xs[0]:
            return ys[0]
        j = bisect.bisect_right(xs, b) - 1
        if xs[j] == b or j == len(xs) - 1:
            return ys[j]
        return ys[j] + (b - xs[j]) * (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])

    def _rebuild(self) -> None:
        # every whole batch size up to the largest measured one: item b - 1
        self._table = [self._interp(b) for b in range(1, int(self._sizes[-1]) + 1)]
        self._at = {b: i for i, b in enumerate(self._sizes)}
        self._size_ints = tuple(int(b) for b in self._sizes)

    def __call__(self, b: int) -> float:
        """Estimated verify seconds for a batch of ``b`` tokens."""
        if isinstance(b, int) and 1 <= b <= len(self._table):
            return self._table[b - 1]
        if b <= self._sizes[-1]:
            return self._interp(b)
        return self._extend(b)

    def _extend(self, b: int) -> float:
        # beyond the last measurement: extend the last segment's slope (flat after a single measurement)
        s1, t1 = self._sizes[-1], self._seconds[-1]
        if len(self._sizes) < 2:
            return t1
        s0, t0 = self._sizes[-2], self._seconds[-2]
        return t1 + (b - s1) * (t1 - t0) / max(s1 - s0, 1)

    def curve(self, n: int) -> list[float]:
        """Estimated verify seconds for batches of 1 … ``n`` tokens (item ``b − 1``), each as :meth:`__call__`
        gives it: one slice of the table for all of a round's draft lengths instead of one look-up each."""
        out = self._table[: max(n, 0)]
        return out + [self._extend(b) for b in range(len(out) + 1, n + 1)]

    def to_dict(self) -> dict:
        """Plain form (for telemetry and snapshots)."""
        return {"sizes": list(self._size_ints), "seconds": list(self._seconds)}

    def points(self) -> CostPoints:
        """The measured sizes and their seconds as they are now, unchanged by later updates: what a
        round's telemetry keeps (``VerifyCostModel(*points)`` is this model as of then)."""
        return self._size_ints, tuple(self._seconds)

    def update(self, b: int, seconds: float, weight: float = 0.2) -> None:
        """Blend a real verify time for a batch of ``b`` tokens into the model (moving average)."""
        i = self._at.get(b)
        if i is None:  # a size not measured yet: a new point (rare), the table made again
            i = bisect.bisect_left(self._sizes, b)
            self._sizes.insert(i, float(b))
            self._seconds.insert(i, float(seconds))
            self._rebuild()
            return
        self._seconds[i] += weight * (seconds - self._seconds[i])
        # the table changes from the measured size before to the one after (just b where every size is measured)
        lo = int(self._sizes[i - 1]) + 1 if i > 0 else 1
        hi = int(self._sizes[i + 1]) - 1 if i + 1 < len(self._sizes) else len(self._table)
        for x in range(lo, hi + 1):
            self._table[x - 1] = self._interp(x)

    @classmethod
    def measure(
        cls, evaluate: Callable[[int], None], max_batch: int, repeats: int = 2, tile: int = 1
    ) -> "VerifyCostModel":
        """Time ``evaluate(b)`` (one verify-shaped batch of b tokens) for every batch size a round can use.

        With a verify tile those are the sizes up to the tile and its multiples; without one, every size
        up to 32 and a geometric spread beyond (a batch of hundreds of drafted tokens is rare, and timing
        each would take minutes). Each size is timed ``repeats`` times, interleaved, keeping the fastest.
        """
        usable = [b for b in range(1, max_batch + 1) if tile_aligned(b - 1, tile) == b - 1]
        spread = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024}
        sizes = sorted(b for b in usable if b <= 32 or b in spread or b == usable[-1])
        evaluate(1)  # warm up
        best = [float("inf")] * len(sizes)
        for _ in range(repeats):
            for i, b in enumerate(sizes):
                t = time.perf_counter()
                evaluate(b)
                best[i] = min(best[i], time.perf_counter() - t)
        return cls(sizes, best)


class CostPolicy(QuietPolicy):
    """Pick the draft length that maximises expected tokens per second.

    Acceptance comes in runs: while the model copies a span it tends to copy on, and once it departs
    from the span it tends to stay away for a while. So acceptance is estimated per *run position* —
    how many draft tokens in a row the target has accepted just before this one, across rounds (the
    token at depth i of a draft that follows a run of r sits at run position r + i). Positions are
    grouped in buckets 0, 1, 2–3, 4–7, 8–15, 16–31 and 32+; each bucket's estimate is its ratio of
    accepted to tried tokens, decayed so recent rounds weigh more, and shrunk towards the bucket below
    it (bucket 0 towards the acceptance pooled over all). A bucket never tried yet takes the estimate
    of the bucket below, which lets the policy explore longer drafts when the short ones all pass.

    Expected tokens for length k: ``1 + Σ_{j≤k} Π_{i≤j} a(r + i)``; expected time: the measured verify
    cost of ``k+1`` tokens plus the drafter's measured seconds per drafted token times k plus its *upkeep*
    (feeding its own model, measured per committed token in rounds that asked for a draft) times the
    expected tokens, plus what the rounds cost that asked for a draft and got none (a drafter below its
    ``draft_p_min``, an n-gram without a match): with a proposal rate p (the share of asking rounds that
    got a draft, a moving average), each draft comes with ``(1 - p) / p`` of them on average, each costing
    its measured draft time and upkeep for nothing. A plain round costs the verify of one token plus what
    the drafter still spends in a round the policy keeps plain (measured; about nothing for a drafter
    that pauses its feeding then, like ``eagle3``, the whole upkeep for one that does not). A draft is
    chosen only when its expected tokens per second beat plain decoding's by :attr:`MARGIN` (5%).

    A round kept plain teaches the policy nothing about acceptance, unless the drafter can say, without side
    effects, which token it would have proposed (:meth:`~specviz.strategies.base.PeekingDrafter.peek`): the
    session then reports whether the target produced that token (:meth:`observe_shadow`), a free try at the current run
    position. Without such evidence for ``PROBE_EVERY`` rounds, a one-token probe is drafted; each probe
    the target rejects (or the drafter declines) doubles that interval, up to ``PROBE_MAX`` (16: at 64, a
    span that became copyable was missed for most of a 128-token generation), and an accepted draft or
    probe brings it back to ``PROBE_EVERY``: where there is nothing to copy, probes cost a round in
    sixteen, not one in eight. A probe also costs the drafter: bringing a paused model back (its measured
    resume) and a draft step or a declined ask. The interval is at least as many plain rounds as keep
    that cost within :attr:`PROBE_SHARE` (1%) of their time, at most ``PROBE_FLOOR_MAX`` (64) rounds; for
    the n-gram strategies, which pay almost nothing to be asked, that floor stays below ``PROBE_EVERY``.

    Between probes, with no evidence coming in, the choice stays plain (nothing it is made from moves but
    the verify cost's slow refinement). Asked (:meth:`promise_plain`, for a drafter that pays to stay ready:
    an EAGLE-3 head's layer capture), the policy promises the rounds up to the next probe and keeps them
    plain without weighing them again, so the drafter can stop paying until shortly before the probe.
    """

    name = "cost"
    DECAY = 0.98
    PRIOR = (1.0, 1.0)  # Beta(1, 1) for the pooled acceptance: a fresh session is a coin flip
    SHRINK = 2.0  # weight (in tries) of the neighbouring estimate in each bucket's estimate
    PROBE_EVERY = 8
    PROBE_MAX = 16
    # The drafter's cost of a probe, at most this share of the plain rounds between probes. 1%, not more: a
    # drafter that never pays still costs a few per cent besides its probes (an EAGLE-3 head: the armed
    # capture before each probe, the first rounds' feeding, its Python), and the policy must stay within 5%
    # of `none` all told. At 2% the trained head's never-drafting generations were 0.95-0.97x `none`, at 1%
    # 0.96-1.04x (docs/performance.md); the price is a copyable span found up to 64 rounds late, not 43.
    PROBE_SHARE = 0.01
    PROBE_FLOOR_MAX = 64
    # A draft must promise this much more than plain decoding (tokens per second): the estimates come from
    # few tries, and on a CPU a two-row verify costs about twice one row (the output layer over the whole
    # vocabulary), so a draft that only breaks even on paper loses whenever the estimate was high. Measured
    # on `summarise` prompts with nothing to copy: such drafts took ngram-cache to 0.92x `none`.
    MARGIN = 1.05
    BUCKETS = 7  # run positions 0, 1, 2-3, 4-7, 8-15, 16-31, 32+
    MIN_PROPOSAL = 0.02  # the proposal rate assumed at least (a drafter that never proposes costs 49 declines)

    def __init__(self, cost: VerifyCostModel | None = None) -> None:
        self.cost = cost
        self.tries = [0.0] * self.BUCKETS
        self.hits = [0.0] * self.BUCKETS
        self.run = 0  # draft tokens accepted in a row up to now
        self.draft_tok_seconds = 0.0
        self.draft_calls = 0
        self.shadow_tries = 0
        self.shadow_hits = 0
        self.rounds_since_evidence = 0
        self.probe_every = self.PROBE_EVERY  # plain rounds before the next probe (doubles after a rejected one)
        self.probing = False  # the last length() was a probe whose verdict has not come back
        self.upkeep_tok_seconds = 0.0  # feeding the drafter's model per committed token, rounds with a draft asked
        self.upkeep_calls = 0
        self.plain_upkeep_seconds = 0.0  # what the drafter spends in a round kept plain
        self.plain_upkeep_calls = 0
        self.last_length: int | None = None  # the length the last length() chose (None before the first)
        self.quiet = 0  # plain rounds still promised (promise_plain): length() keeps them plain unweighed
        self.asked = 0  # rounds that asked the drafter for a draft and heard back
        self.proposal_rate = 1.0  # the share of them that got a draft (moving average)
        self.declines = 0
        self.decline_seconds = 0.0  # what asking cost in a round that got no draft (moving average)
        self.resumes = 0
        self.resume_seconds = 0.0  # bringing a paused drafter's model back before a draft (moving average)
        self._lengths_for: tuple[tuple[int, int, int] | None, tuple[int, ...]] = (None, ())
        # the expected-token curve of the last length(), by what it is made of (the run, n and the counts):
        # a round where nothing is copied changes none of them, and recomputing it was most of its choice
        self._curve_for: tuple[tuple | None, list[float]] = (None, [])

    def use_cost(self, cost: VerifyCostModel) -> None:
        """Adopt the measured verify cost curve."""
        self.cost = cost

    @classmethod
    def bucket(cls, position: int) -> int:
        """The bucket of a run position: 0, 1, 2–3, 4–7, 8–15, 16–31, 32+ → 0…6."""
        return min(int(position).bit_length(), cls.BUCKETS - 1)

    def bucket_estimates(self) -> list[float]:
        """Estimated acceptance per run-position bucket (see the class docstring)."""
        return self._estimates(self.tries, self.hits)

    @classmethod
    def _estimates(cls, tries: Sequence[float], hits: Sequence[float]) -> list[float]:
        a, b = cls.PRIOR
        below = (sum(hits) + a) / (sum(tries) + a + b)
        out = []
        for h, t in zip(hits, tries):
            if t > 0:
                below = (h + cls.SHRINK * below) / (t + cls.SHRINK)
            out.append(below)
        return out

    def acceptance(self, depth: int, run: int | None = None) -> float:
        """Estimated probability that the draft token at ``depth`` (0-based) is accepted, given the ones
        before it, for a draft that follows a run of ``run`` accepted tokens (default: the current run)."""
        r = self.run if run is None else run
        return self.bucket_estimates()[self.bucket(r + depth)]

    def _expected_curve(self, n: int) -> list[float]:
        """Expected committed tokens for draft lengths ``0…n`` after the current run (a list the caller
        must not change: it is kept for the next round)."""
        key = (self.run, n, tuple(self.tries), tuple(self.hits))
        if self._curve_for[0] == key:
            return self._curve_for[1]
        est = self.bucket_estimates()
        bucket = self.bucket
        curve, e, p = [1.0], 1.0, 1.0
        for position in range(self.run, self.run + n):
            p *= est[bucket(position)]
            e += p
            curve.append(e)
        self._curve_for = (key, curve)
        return curve

    def expected_tokens(self, k: int) -> float:
        """Expected committed tokens of a round with a k-token draft (bonus or correction included)."""
        return self._expected_curve(k)[k]

    def length(self, draft_min: int, draft_max: int, tile: int = 1) -> tuple[int, float | None]:
        if self.cost is None:
            return draft_max, None
        if self.quiet > 0:  # a promised plain round: what the plain branch below records, nothing weighed
            self.quiet -= 1
            self.rounds_since_evidence += 1
            self.probing = False
            self.last_length = 0
            return 0, 1.0
        curve = self._expected_curve(draft_max)
        verify = self.cost.curve(draft_max + 1)
        plain_rate = curve[0] / (verify[0] + self.plain_upkeep_seconds)
        p = max(self.proposal_rate, self.MIN_PROPOSAL)
        declined = (1.0 - p) / p * self.decline_seconds  # the rounds that ask and get nothing, per draft
        best_k, best_rate = 0, plain_rate * self.MARGIN
        per_draft, per_token = self.draft_tok_seconds, self.upkeep_tok_seconds
        lengths = self._lengths(draft_min, draft_max, tile)
        # no length can beat plain decoding when even the most tokens over the cheapest verify cannot (the
        # usual round where nothing is being copied): the lengths need not be tried one by one
        if lengths and curve[lengths[-1]] <= best_rate * min(verify[lengths[0] : lengths[-1] + 1]):
            lengths = ()
        for k in lengths:
            t = verify[k] + per_draft * k + per_token * curve[k] + declined
            rate = curve[k] / t
            if rate > best_rate:
                best_k, best_rate = k, rate
        self.probing = False
        if best_k == 0:
            self.rounds_since_evidence += 1
            # the floor (a few divisions) only once the interval is due: most plain rounds are not
            due = self.rounds_since_evidence >= self.probe_every
            if due and self.rounds_since_evidence >= self.probe_floor():
                self.rounds_since_evidence = 0
                best_k = max(draft_min, 1)
                self.probing = True
        self.last_length = best_k
        return best_k, curve[best_k]

    def promise_plain(self) -> int | None:
        """The plain rounds after this one up to the next probe (see the class docstring), promised: the next
        that many :meth:`length` calls return 0. None when this round was not plain, was a probe, or there is
        no cost model yet. Asked again during a promise, it returns what is left of it."""
        if self.cost is None or self.last_length != 0 or self.probing:
            return None
        if self.quiet == 0:
            due = max(self.probe_every, self.probe_floor())  # the probe comes when rounds_since_evidence reaches it
            self.quiet = max(0, due - self.rounds_since_evidence - 1)
        return self.quiet

    def _lengths(self, draft_min: int, draft_max: int, tile: int) -> tuple[int, ...]:
        """The draft lengths worth comparing: from ``max(draft_min, 1)`` to ``draft_max``, those the session
        would not round down to suit the tile (kept for the next round, which nearly always asks the same)."""
        key = (draft_min, draft_max, tile)
        if self._lengths_for[0] != key:
            ks = tuple(k for k in range(max(draft_min, 1), draft_max + 1) if tile_aligned(k, tile) == k)
            self._lengths_for = (key, ks)
        return self._lengths_for[1]

    def observe_verify(self, batch_size: int, seconds: float) -> None:
        """Refine the measured cost curve with a real verify of ``batch_size`` tokens."""
        if self.cost is not None:
            self.cost.update(batch_size, seconds)

    def _record(self, n_drafted: int, n_accepted: int) -> None:
        self.rounds_since_evidence = 0
        if n_accepted > 0:
            self.probe_every = self.PROBE_EVERY
        elif self.probing:
            self.probe_every = min(2 * self.probe_every, self.PROBE_MAX)
        self.probing = False
        self.tries = [x * self.DECAY for x in self.tries]
        self.hits = [x * self.DECAY for x in self.hits]
        for i in range(min(n_drafted, n_accepted + 1)):  # depths after the first rejection were never tested
            b = self.bucket(self.run + i)
            self.tries[b] += 1.0
            if i < n_accepted:
                self.hits[b] += 1.0
        self.run = self.run + n_accepted if n_accepted == n_drafted else 0

    def _asked(self, proposed: bool) -> None:
        self.asked += 1
        self.proposal_rate += (float(proposed) - self.proposal_rate) / min(self.asked, 20)

    def observe(self, n_drafted: int, n_accepted: int, draft_seconds: float) -> None:
        """Learn from a verified draft, or (``n_drafted`` 0) from a round that asked for one and got none:
        its cost, and a probe so declined backs the probes off as a rejected one does."""
        if n_drafted == 0:
            self._asked(False)
            self.declines += 1
            self.decline_seconds += (draft_seconds - self.decline_seconds) / min(self.declines, 20)
            if self.probing:
                self.probe_every = min(2 * self.probe_every, self.PROBE_MAX)
                self.probing = False
            self.observe_idle()
            return
        self._asked(True)
        self.draft_calls += 1
        per_tok = draft_seconds / n_drafted
        self.draft_tok_seconds += (per_tok - self.draft_tok_seconds) / min(self.draft_calls, 20)
        self._record(n_drafted, n_accepted)

    def observe_shadow(self, hit: bool) -> None:
        """Learn from a round without a draft whose first token the drafter had predicted (``hit``) or not."""
        self.shadow_tries += 1
        self.shadow_hits += int(bool(hit))
        self._record(1, int(bool(hit)))

    def observe_idle(self) -> None:
        """A round without a draft and without a prediction: the run of accepted tokens is broken."""
        self.run = 0

    def probe_floor(self) -> int:
        """The fewest plain rounds between probes that keep a probe's cost to the drafter (a resume, and a
        draft step or a declined ask, whichever is dearer) within :attr:`PROBE_SHARE` of their time."""
        return self._floor(
            self.decline_seconds, self.draft_tok_seconds, self.upkeep_tok_seconds, self.resume_seconds, self.cost
        )

    @classmethod
    def _floor(
        cls, decline: float, draft_tok: float, upkeep_tok: float, resume: float, cost: VerifyCostModel | None
    ) -> int:
        """:meth:`probe_floor` of a declined ask's, a draft step's, its feeding's and a resume's seconds."""
        if cost is None:
            return 0
        rounds = (resume + max(decline, draft_tok + upkeep_tok)) / (cls.PROBE_SHARE * cost(1))
        return math.ceil(min(rounds, cls.PROBE_FLOOR_MAX))

    def observe_upkeep(self, seconds: float, tokens: int, resume_seconds: float = 0.0) -> None:
        """Learn the drafter's upkeep of this round, by what :meth:`length` chose for it: a round kept
        plain teaches what a plain round still costs the drafter; a round that asked for a draft, what
        feeding costs per committed token (moving averages over the last 20 such rounds), and what
        bringing a paused model back costs when it had to."""
        if resume_seconds > 0:
            self.resumes += 1
            self.resume_seconds += (resume_seconds - self.resume_seconds) / min(self.resumes, 20)
        if self.last_length is None:
            return
        if self.last_length == 0:
            self.plain_upkeep_calls += 1
            self.plain_upkeep_seconds += (seconds - self.plain_upkeep_seconds) / min(self.plain_upkeep_calls, 20)
        elif tokens > 0:
            self.upkeep_calls += 1
            per_tok = seconds / tokens
            self.upkeep_tok_seconds += (per_tok - self.upkeep_tok_seconds) / min(self.upkeep_calls, 20)

    #: Labels of the run-position buckets, for telemetry.
    BUCKET_LABELS = ("0", "1", "2-3", "4-7", "8-15", "16-31", "32+")

    def cost_points(self) -> CostPoints | None:
        """The verify cost's points now (None before it is measured)."""
        return self.cost.points() if self.cost is not None else None

    @classmethod
    def describe_state(cls, state: dict, points: CostPoints | None = None) -> dict:
        """The run so far, acceptance by run position, plain-round predictions and the verify cost."""
        cost = VerifyCostModel(*points) if points is not None else None
        return {
            "name": cls.name,
            "run": state["run"],
            "acceptance_by_run_position": dict(zip(cls.BUCKET_LABELS, cls._estimates(state["tries"], state["hits"]))),
            "tries_by_run_position": dict(zip(cls.BUCKET_LABELS, state["tries"])),
            "shadow_tries": state["shadow_tries"],
            "shadow_hits": state["shadow_hits"],
            "probe_every": state["probe_every"],
            "draft_seconds_per_token": state["draft_tok_seconds"],
            "upkeep_seconds_per_token": state["upkeep_tok_seconds"],
            "plain_round_upkeep_seconds": state["plain_upkeep_seconds"],
            "proposal_rate": state["proposal_rate"],
            "declined_round_seconds": state["decline_seconds"],
            "resume_seconds": state["resume_seconds"],
            "promised_plain_rounds": state.get("quiet", 0),
            "probe_floor": cls._floor(
                state["decline_seconds"],
                state["draft_tok_seconds"],
                state["upkeep_tok_seconds"],
                state["resume_seconds"],
                cost,
            ),
            "verify_cost": cost.to_dict() if cost is not None else None,
        }

    def state(self) -> dict:
        return {
            "tries": list(self.tries),
            "hits": list(self.hits),
            "run": self.run,
            "draft_tok_seconds": self.draft_tok_seconds,
            "draft_calls": self.draft_calls,
            "shadow_tries": self.shadow_tries,
            "shadow_hits": self.shadow_hits,
            "rounds_since_evidence": self.rounds_since_evidence,
            "probe_every": self.probe_every,
            "probing": self.probing,
            "upkeep_tok_seconds": self.upkeep_tok_seconds,
            "upkeep_calls": self.upkeep_calls,
            "plain_upkeep_seconds": self.plain_upkeep_seconds,
            "plain_upkeep_calls": self.plain_upkeep_calls,
            "last_length": self.last_length,
            "asked": self.asked,
            "proposal_rate": self.proposal_rate,
            "declines": self.declines,
            "decline_seconds": self.decline_seconds,
            "resumes": self.resumes,
            "resume_seconds": self.resume_seconds,
            "quiet": self.quiet,
        }

    def load(self, d: dict) -> None:
        tries, hits = d.get("tries"), d.get("hits")
        ok = all(
            isinstance(x, list) and len(x) == self.BUCKETS and all(isinstance(v, (int, float)) for v in x)
            for x in (tries, hits)
        )
        if ok and isinstance(tries, list) and isinstance(hits, list):  # else (an older policy's state): afresh
            self.tries, self.hits = [float(v) for v in tries], [float(v) for v in hits]
            self.run = int(d.get("run", 0))
        self.draft_tok_seconds = float(d.get("draft_tok_seconds", 0.0))
        self.draft_calls = int(d.get("draft_calls", 0))
        self.shadow_tries = int(d.get("shadow_tries", 0))
        self.shadow_hits = int(d.get("shadow_hits", 0))
        self.rounds_since_evidence = int(d.get("rounds_since_evidence", 0))
        self.probe_every = min(max(int(d.get("probe_every", self.PROBE_EVERY)), self.PROBE_EVERY), self.PROBE_MAX)
        self.probing = bool(d.get("probing", False))
        self.upkeep_tok_seconds = float(d.get("upkeep_tok_seconds", 0.0))
        self.upkeep_calls = int(d.get("upkeep_calls", 0))
        self.plain_upkeep_seconds = float(d.get("plain_upkeep_seconds", 0.0))
        self.plain_upkeep_calls = int(d.get("plain_upkeep_calls", 0))
        last = d.get("last_length")
        self.last_length = int(last) if isinstance(last, int) else None
        self.asked = int(d.get("asked", 0))
        self.proposal_rate = min(max(float(d.get("proposal_rate", 1.0)), 0.0), 1.0)
        self.declines = int(d.get("declines", 0))
        self.decline_seconds = float(d.get("decline_seconds", 0.0))
        self.resumes = int(d.get("resumes", 0))
        self.resume_seconds = float(d.get("resume_seconds", 0.0))
        self.quiet = max(0, int(d.get("quiet", 0)))


def measure_verify_cost(ctx: Any, history: Sequence[int], knobs: dict, repeats: int = 2) -> VerifyCostModel:
    """Time verify batches of every size a round can use on ``ctx`` (a
    :class:`~specviz.backends.llama.LlamaContext` holding ``history[:-1]``), once per session, and leave
    the cache unchanged. Sizes reach ``draft_max + 1`` within the batch (with ``align``: micro-batch) and
    context limits; each is timed ``repeats`` times (:meth:`VerifyCostModel.measure`)."""
    n_past = len(history) - 1
    cap = ctx.capacity
    max_b = min(
        cap.n_ubatch if knobs.get("align", True) else cap.n_batch,
        int(knobs.get("draft_max", 16)) + 1,
        cap.n_ctx - n_past,
    )
    filler = history[-1]
    # memory that cannot drop a tail (recurrent, hybrid) measures from a checkpoint, as rounds do
    ctx.memory.checkpoint_for(max(max_b, 2) - 1)

    def evaluate(b: int) -> None:
        ctx.eval([filler] * b, n_past, rows="all")
        ctx.memory.cut(n_past, history)

    return VerifyCostModel.measure(evaluate, max(max_b, 2), repeats=repeats, tile=verify_tile(knobs))


def make_policy(name: str, cost: VerifyCostModel | None = None) -> DraftingPolicy:
    """A fresh policy object by name."""
    if name == "adaptive":
        return AdaptivePolicy()
    if name == "cost":
        return CostPolicy(cost)
    return FixedPolicy()
