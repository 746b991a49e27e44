"""The ``cost`` drafting policy: the draft length that maximises expected tokens per second, from the
target's measured verify cost (:mod:`specviz.decoding.verify_cost`) and acceptance estimated by run position
(its counters: :class:`~specviz.decoding.cost_state.CostCounters`). A
:class:`~specviz.decoding.policy.DraftingPolicy`; :func:`~specviz.decoding.policy.make_policy` makes it by name.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from .cost_state import CostCounters
from .load_watch import LoadWatch
from .tiling import tile_aligned
from .verify_cost import CostPoints, VerifyCostModel, measure_verify_cost


class CostPolicy(CostCounters):
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

    A burst of outside load (a compile, a browser, another job on the cores) slows the rounds and inflates every
    figure learnt from timings: the verify cost curve, the drafter's seconds per token, upkeep, declines and
    resumes (:data:`~specviz.decoding.cost_state.CostCounters.TIMING_FIELDS`), and the choice made from them
    (typically plain rounds, as drafting seems dear). :meth:`observe_load` watches the rounds' CPU share window
    by window (:class:`~specviz.decoding.load_watch.LoadWatch`); when a burst passes, the timings are put back
    as they were at the last quiet window before it and the choice is learnt again from them. A run that began
    under load has no quiet timings: its moving averages start again and the verify cost is measured again
    before the next round. Acceptance is learnt from the text, not timings, and is kept.

    Between probes, with no evidence coming in, the choice stays plain (nothing it is made from moves but
    the verify cost's slow refinement). Asked (:meth:`promise_plain`, for a drafter that pays to stay ready:
    an EAGLE-3 head's layer capture), the policy promises the rounds up to the next probe and keeps them
    plain without weighing them again, so the drafter can stop paying until shortly before the probe.
    """

    name = "cost"
    DECAY = 0.98
    PRIOR = (1.0, 1.0)  # Beta(1, 1) for the pooled acceptance: a fresh session is a coin flip
    SHRINK = 2.0  # weight (in tries) of the neighbouring estimate in each bucket's estimate
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
    MIN_PROPOSAL = 0.02  # the proposal rate assumed at least (a drafter that never proposes costs 49 declines)

    def __init__(self, cost: VerifyCostModel | None = None) -> None:
        super().__init__()  # every counter at its start (CostCounters)
        self.cost = cost
        # the expected-token curve of the last length(), by what it is made of (the run, n and the counts): a
        # round where nothing is copied changes none of them, and the cache saves 10-13 us of such a round's
        # 25-28 us choice (a microbenchmark of draft_max 16 on this project's 2-core host)
        self._curve_for: tuple[tuple | None, tuple[float, ...]] = (None, ())
        #: the machine's load now, window by window (no part of :meth:`state`: it is about the machine, not the text)
        self.watch = LoadWatch()
        #: timings learnt from outside load put back since the policy began (:meth:`observe_load`)
        self.relearnt = 0
        self._quiet_timings: tuple[dict[str, float | int], CostPoints | None] | None = None
        self._remeasure = False

    def prepare(self, ctx: Any, history: Sequence[int], knobs: Mapping[str, Any]) -> VerifyCostModel | None:
        """The verify cost curve, measured now where the policy has none yet (once per session: the session
        gives every later policy the one measured, :func:`make_policy`), or again after a burst of outside load
        that the policy has no quiet curve from (:meth:`observe_load`)."""
        if self.cost is not None and not self._remeasure:
            return None
        self._remeasure = False
        self.cost = measure_verify_cost(ctx, history, knobs)
        return self.cost

    def observe_load(self, cpu_seconds: float, wall_seconds: float, n_threads: int | None) -> None:
        """Learn a round's CPU and wall seconds (see the class docstring): at each quiet window the timings are
        kept aside; when a burst has passed they are put back (:meth:`relearn_timings`)."""
        judged = self.watch.observe(cpu_seconds, wall_seconds, n_threads)
        if judged == "quiet":
            self._quiet_timings = (self.timings(), self.cost_points())
        elif judged == "passed":
            self.relearn_timings()

    def relearn_timings(self) -> None:
        """Forget what was learnt from timings since the last quiet window: put back that window's timings and
        verify cost curve, or without them (the run began under load) start the moving averages again and measure
        the verify cost again before the next round (:meth:`prepare`)."""
        timings, points = self._quiet_timings or (None, None)
        self.restore_timings(timings)
        if points is not None and self.cost is not None:
            self.cost.restore(points)
        else:
            self._remeasure = True
        self.relearnt += 1

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

    def _expected_curve(self, n: int) -> tuple[float, ...]:
        """Expected committed tokens for draft lengths ``0…n`` after the current run (kept for the next
        round, which reuses it while the run and the counts stay as they are)."""
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
        self._curve_for = (key, tuple(curve))
        return self._curve_for[1]

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
            lengths = []
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

    @staticmethod
    def _lengths(draft_min: int, draft_max: int, tile: int) -> list[int]:
        """The draft lengths worth comparing: from ``max(draft_min, 1)`` to ``draft_max``, those the session
        would not round down to suit the tile."""
        return [k for k in range(max(draft_min, 1), draft_max + 1) if tile_aligned(k, tile) == k]

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

    def describe(self) -> dict:
        """What the policy is working from, for telemetry: :meth:`describe_state` of it now."""
        return self.describe_state(self.state(), self.cost_points())

    def state(self) -> dict:
        """Every counter (:meth:`CostCounters.as_dict`)."""
        return self.as_dict()

    def load(self, d: dict) -> None:
        """Restore :meth:`state` (:meth:`CostCounters.checked`: a malformed counter raises TypeError or
        ValueError and changes nothing)."""
        self.load_counters(d)
