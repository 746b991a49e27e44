"""Drafting policies: how long a draft may be this round, shared by every strategy.

* ``fixed``: the configured ``draft_max``.
* ``adaptive`` (the runner PR's ``--adaptive-draft-count``): start at ``draft_max``; grow by 2 after a
  fully accepted draft, shrink by 1 otherwise, within ``[max(draft_min, 1), draft_max]``.
* ``cost`` (ours): measure the target's verify cost for batch sizes 1…k+1 once per session, keep a
  per-position acceptance estimate, and pick each round the length that maximises expected tokens per
  second. A length of 0 (plain decoding) is allowed when speculation does not pay; a one-token probe
  every few rounds keeps the estimate alive.

After the policy, the session applies its hard caps (remaining budget, free context, n_batch) and —
when ``align`` is on — verify-tile alignment: the draft plus the pending token must fit in one
micro-batch (n_ubatch), so that one verify is one forward of the target, and a batch longer than
``verify_tile`` rows is rounded down to a multiple of it (:func:`tile_aligned`). On a CPU, llama.cpp's
kernels for repacked quantised weights multiply four batch rows at a time; the rows left over take a
one-row path that reads every weight again, so a verify of 17 rows costs more than one of 16.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

POLICIES = ("fixed", "adaptive", "cost")


def tile_aligned(k: int, tile: int) -> int:
    """The longest draft ``<= k`` whose verify batch (the draft plus the pending token) suits the tile.

    Batches of up to ``tile`` rows are left alone; longer ones are rounded down to a multiple of
    ``tile``. ``tile_aligned(16, 4) == 15`` (a batch of 16), ``tile_aligned(2, 4) == 2``.
    """
    if tile <= 1 or k + 1 <= tile or (k + 1) % tile == 0:
        return k
    return (k + 1) // tile * tile - 1


class FixedPolicy:
    """Always the configured maximum."""

    name = "fixed"

    def length(self, draft_min: int, draft_max: int, tile: int = 1) -> tuple[int, float | None]:
        """Draft length for this round and the expected tokens it yields (None when not modelled).

        ``tile`` is the verify tile the session will round the length to afterwards; a policy that
        compares lengths only needs to compare the lengths that survive that rounding.
        """
        return draft_max, None

    def observe(self, n_drafted: int, n_accepted: int, draft_seconds: float) -> None:
        """Learn from a verified round."""

    def observe_verify(self, batch_size: int, seconds: float) -> None:
        """Learn from the time of a real verify batch."""

    def state(self) -> dict:
        """JSON-serialisable state for snapshots."""
        return {}

    def load(self, d: dict) -> None:
        """Restore :meth:`state`."""


class AdaptivePolicy(FixedPolicy):
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

    def load(self, d: dict) -> None:
        self.current = d.get("current")


class VerifyCostModel:
    """Measured seconds to verify a batch of b tokens, b = 1…n, interpolated between measured sizes."""

    def __init__(self, sizes: Sequence[int], seconds: Sequence[float]) -> None:
        self.sizes = np.asarray(sizes, dtype=float)
        self.seconds = np.asarray(seconds, dtype=float)

    def __call__(self, b: int) -> float:
        """Estimated verify seconds for a batch of ``b`` tokens."""
        if b <= self.sizes[-1]:
            return float(np.interp(b, self.sizes, self.seconds))
        # beyond the last measurement: extend the last segment's slope
        s0, s1 = self.sizes[-2], self.sizes[-1]
        t0, t1 = self.seconds[-2], self.seconds[-1]
        return float(t1 + (b - s1) * (t1 - t0) / max(s1 - s0, 1))

    def to_dict(self) -> dict:
        """Plain form (for telemetry and snapshots)."""
        return {"sizes": self.sizes.astype(int).tolist(), "seconds": self.seconds.tolist()}

    def update(self, b: int, seconds: float, weight: float = 0.2) -> None:
        """Blend a real verify time for a batch of ``b`` tokens into the model (moving average)."""
        i = int(np.searchsorted(self.sizes, b))
        if i < len(self.sizes) and self.sizes[i] == b:
            self.seconds[i] += weight * (seconds - self.seconds[i])
        else:
            self.sizes = np.insert(self.sizes, i, float(b))
            self.seconds = np.insert(self.seconds, i, seconds)

    @classmethod
    def measure(cls, evaluate: Callable[[int], None], max_batch: int, repeats: int = 2,
                tile: int = 1) -> "VerifyCostModel":
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


class CostPolicy(FixedPolicy):
    """Pick the draft length that maximises expected tokens per second.

    Acceptance at draft depth i is estimated as the ratio of accepted to tried tokens at that depth
    (conditional on the previous depths being accepted), decayed so recent rounds weigh more. The
    estimates are kept apart for two regimes, because acceptance comes in runs: after a fully accepted
    draft the model is usually still copying, after a rejection it usually is not. Each depth's ratio
    is shrunk towards its regime's pooled acceptance, and that towards the acceptance pooled over both.
    Expected tokens for length k: ``1 + Σ_{j≤k} Π_{i≤j} a_i``; expected time: the measured verify cost
    of ``k+1`` tokens plus the drafter's measured seconds per drafted token times k.
    """

    name = "cost"
    DECAY = 0.98
    PRIOR = (1.0, 1.0)  # Beta(1, 1) for the pooled acceptance: a fresh session is a coin flip
    SHRINK = 2.0  # weight (in tries) of the pooled acceptance in each depth's estimate
    PROBE_EVERY = 8
    AFTER_REJECTION, AFTER_FULL = 0, 1

    def __init__(self, cost: VerifyCostModel | None = None) -> None:
        self.cost = cost
        self.tries: list[list[float]] = [[], []]  # per regime, per depth
        self.hits: list[list[float]] = [[], []]
        self.regime = self.AFTER_REJECTION
        self.draft_tok_seconds = 0.0
        self.draft_calls = 0
        self.rounds_since_draft = 0

    def acceptance(self, depth: int, regime: int | None = None) -> float:
        """Estimated probability that the token at ``depth`` (0-based) is accepted given the ones before.

        ``regime`` defaults to the current one (after a fully accepted draft, or not). Depths never
        tried yet are expected to behave like the ones seen so far, which lets the policy explore longer
        drafts when the short ones are all accepted.
        """
        return self._acceptances(depth + 1, regime)[depth]

    def _acceptances(self, n: int, regime: int | None = None) -> list[float]:
        """:meth:`acceptance` for depths ``0…n-1`` (the pooled rates computed once)."""
        r = self.regime if regime is None else regime
        a, b = self.PRIOR
        overall = (sum(map(sum, self.hits)) + a) / (sum(map(sum, self.tries)) + a + b)
        tries, hits = self.tries[r], self.hits[r]
        pooled = (sum(hits) + self.SHRINK * overall) / (sum(tries) + self.SHRINK)
        seen = min(n, len(tries))
        out = [(hits[i] + self.SHRINK * pooled) / (tries[i] + self.SHRINK) for i in range(seen)]
        return out + [pooled] * (n - seen)

    def _expected_curve(self, n: int) -> list[float]:
        """Expected committed tokens for draft lengths ``0…n``."""
        curve, e, p = [1.0], 1.0, 1.0
        for acc in self._acceptances(n):
            p *= acc
            e += p
            curve.append(e)
        return curve

    def expected_tokens(self, k: int) -> float:
        """Expected committed tokens of a round with a k-token draft (bonus or correction included)."""
        return self._expected_curve(k)[k]

    def length(self, draft_min: int, draft_max: int, tile: int = 1) -> tuple[int, float | None]:
        if self.cost is None:
            return draft_max, None
        curve = self._expected_curve(draft_max)
        best_k, best_rate = 0, curve[0] / self.cost(1)
        for k in range(max(draft_min, 1), draft_max + 1):
            if tile_aligned(k, tile) != k:
                continue  # the session would round it down anyway
            t = self.cost(k + 1) + self.draft_tok_seconds * k
            rate = curve[k] / t
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            self.rounds_since_draft += 1
            if self.rounds_since_draft >= self.PROBE_EVERY:
                self.rounds_since_draft = 0
                best_k = max(draft_min, 1)
        return best_k, curve[best_k]

    def observe_verify(self, batch_size: int, seconds: float) -> None:
        """Refine the measured cost curve with a real verify of ``batch_size`` tokens."""
        if self.cost is not None:
            self.cost.update(batch_size, seconds)

    def observe(self, n_drafted: int, n_accepted: int, draft_seconds: float) -> None:
        if n_drafted == 0:
            return
        self.rounds_since_draft = 0
        self.draft_calls += 1
        per_tok = draft_seconds / n_drafted
        self.draft_tok_seconds += (per_tok - self.draft_tok_seconds) / min(self.draft_calls, 20)
        self.tries = [[x * self.DECAY for x in row] for row in self.tries]
        self.hits = [[x * self.DECAY for x in row] for row in self.hits]
        tries, hits = self.tries[self.regime], self.hits[self.regime]
        tried = min(n_drafted, n_accepted + 1)  # depths after the first rejection were never tested
        while len(tries) < tried:
            tries.append(0.0)
            hits.append(0.0)
        for i in range(tried):
            tries[i] += 1.0
            if i < n_accepted:
                hits[i] += 1.0
        self.regime = self.AFTER_FULL if n_accepted == n_drafted else self.AFTER_REJECTION

    def state(self) -> dict:
        return {"tries": self.tries, "hits": self.hits, "regime": self.regime,
                "draft_tok_seconds": self.draft_tok_seconds, "draft_calls": self.draft_calls,
                "rounds_since_draft": self.rounds_since_draft}

    def load(self, d: dict) -> None:
        self.tries = [list(row) for row in d.get("tries", [[], []])]
        self.hits = [list(row) for row in d.get("hits", [[], []])]
        self.regime = int(d.get("regime", self.AFTER_REJECTION))
        self.draft_tok_seconds = float(d.get("draft_tok_seconds", 0.0))
        self.draft_calls = int(d.get("draft_calls", 0))
        self.rounds_since_draft = int(d.get("rounds_since_draft", 0))


def make_policy(name: str, cost: VerifyCostModel | None = None) -> FixedPolicy:
    """A fresh policy object by name."""
    if name == "adaptive":
        return AdaptivePolicy()
    if name == "cost":
        return CostPolicy(cost)
    return FixedPolicy()
