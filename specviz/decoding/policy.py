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
of a policy that learns nothing from some rounds are :class:`QuietPolicy`'s); ``cost`` is
:class:`~specviz.decoding.cost_policy.CostPolicy`, in a module of its own. After the policy,
:mod:`specviz.decoding.budget` applies the hard caps and verify-tile alignment
(:mod:`specviz.decoding.tiling`).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from .cost_policy import CostPolicy
from .verify_cost import CostPoints, VerifyCostModel

POLICIES = ("fixed", "adaptive", "cost")


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

    def prepare(self, ctx: Any, history: Sequence[int], knobs: Mapping[str, Any]) -> VerifyCostModel | None:
        """Before a round that may draft: measure on the target's context ``ctx`` (holding ``history[:-1]``,
        left as it was) what the policy needs and has not measured yet, and return it (the cost policy: the
        verify cost curve, once; None: nothing measured now)."""
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

    def observe_load(self, cpu_seconds: float, wall_seconds: float, n_threads: int | None) -> None:
        """Learn how much of the machine a round had: the process's ``cpu_seconds`` over its ``wall_seconds``
        with ``n_threads`` asked for (a policy that learns from timings forgets what a burst of outside load
        taught it once the burst passes)."""
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

    def prepare(self, ctx: Any, history: Sequence[int], knobs: Mapping[str, Any]) -> VerifyCostModel | None:
        """Nothing to measure."""
        return None

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

    def observe_load(self, cpu_seconds: float, wall_seconds: float, n_threads: int | None) -> None:
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


def make_policy(name: str, cost: VerifyCostModel | None = None) -> DraftingPolicy:
    """A fresh policy object by name."""
    if name == "adaptive":
        return AdaptivePolicy()
    if name == "cost":
        return CostPolicy(cost)
    return FixedPolicy()
