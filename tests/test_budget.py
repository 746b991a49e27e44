"""The draft-length budget: policy first, then the hard caps in order, then verify-tile alignment."""

from __future__ import annotations

import pytest

from specviz.decoding.budget import Caps, plan
from specviz.decoding.policy import FixedPolicy
from specviz.decoding.tiling import aligned_length, tile_aligned, verify_tile

KNOBS = {"draft_max": 16, "draft_min": 0, "align": True, "verify_tile": 4}
ROOMY = Caps(remaining=1000, free_ctx=1000, n_batch=512, n_ubatch=512)


class Wants(FixedPolicy):
    """A policy that asks for a fixed length with a made-up expectation."""

    def __init__(self, k: int) -> None:
        self.k = k

    def length(self, draft_min, draft_max, tile=1):
        return self.k, 1.0 + self.k

    def expected_tokens(self, k):
        return 1.0 + k


def test_no_caps_leaves_the_request_but_aligns_the_batch():
    b = plan(KNOBS, FixedPolicy(), ROOMY)
    assert (b.requested, b.limit, b.cap) == (16, 15, "tile")  # a batch of 16 rows, not 17
    b = plan({**KNOBS, "draft_max": 15}, FixedPolicy(), ROOMY)
    assert (b.limit, b.cap) == (15, None)


def test_a_strategy_that_never_drafts_gets_nothing():
    assert plan(KNOBS, FixedPolicy(), ROOMY, drafts=False).limit == 0


@pytest.mark.parametrize(
    "caps,limit,cap",
    [
        (Caps(remaining=8, free_ctx=1000, n_batch=512, n_ubatch=512), 7, "budget"),  # commits at most limit + 1
        (Caps(remaining=5, free_ctx=1000, n_batch=512, n_ubatch=512), 3, "tile"),  # 4 -> a batch of 5 -> 4 rows
        (Caps(remaining=1, free_ctx=1000, n_batch=512, n_ubatch=512), 0, "budget"),
        (Caps(remaining=1000, free_ctx=7, n_batch=512, n_ubatch=512), 7, "context"),
        (Caps(remaining=1000, free_ctx=1000, n_batch=8, n_ubatch=8), 7, "batch"),  # 7 + pending = one batch of 8
        (Caps(remaining=1000, free_ctx=1000, n_batch=512, n_ubatch=10), 7, "tile"),  # ubatch 9 -> tile 7
        (Caps(remaining=1000, free_ctx=1000, n_batch=512, n_ubatch=13), 11, "tile"),
    ],
)
def test_hard_caps_lower_the_limit_and_are_named(caps, limit, cap):
    b = plan(KNOBS, FixedPolicy(), caps)
    assert (b.limit, b.cap) == (limit, cap)


def test_ubatch_cap_only_with_alignment():
    caps = Caps(remaining=1000, free_ctx=1000, n_batch=512, n_ubatch=9)
    assert plan(KNOBS, FixedPolicy(), caps).cap in ("ubatch", "tile")
    b = plan({**KNOBS, "align": False}, FixedPolicy(), caps)
    assert (b.limit, b.cap) == (16, None)


def test_tile_never_rounds_below_draft_min():
    caps = Caps(remaining=1000, free_ctx=6, n_batch=512, n_ubatch=512)
    b = plan({**KNOBS, "draft_min": 5}, FixedPolicy(), caps)
    assert (b.limit, b.cap) == (6, "context")  # rounding 6 down to 3 would drop a valid draft


def test_policy_cap_and_expected_tokens_follow_the_final_limit():
    b = plan(KNOBS, Wants(10), ROOMY)
    assert (b.limit, b.cap, b.expected) == (7, "tile", 8.0)
    b = plan(KNOBS, Wants(3), ROOMY)
    assert (b.limit, b.cap, b.expected) == (3, "policy", 4.0)


def test_tile_aligned_and_verify_tile():
    assert [tile_aligned(k, 4) for k in (0, 1, 2, 3, 4, 6, 7, 8, 15, 16)] == [0, 1, 2, 3, 3, 3, 7, 7, 15, 15]
    assert tile_aligned(16, 1) == 16
    assert verify_tile({"align": False, "verify_tile": 4}) == 1
    assert verify_tile({"align": True, "verify_tile": 8}) == 8


def test_aligned_length_keeps_a_draft_that_rounding_would_drop():
    # hand-worked: 6 tokens are a batch of 7 rows, rounded to 4 rows (3 tokens); 10 -> 8 rows (7 tokens)
    assert [aligned_length(k, 4) for k in (0, 1, 3, 4, 6, 7, 10, 11)] == [0, 1, 3, 3, 3, 7, 7, 11]
    # with draft_min 4 a 3-token draft would be dropped, so 6 stays 6; 10 -> 7 is still long enough
    assert [aligned_length(k, 4, 4) for k in (4, 6, 10)] == [4, 6, 7]
    assert aligned_length(6, 1) == 6  # no tile, no rounding


class Halves:
    """A drafting policy written from scratch (no base class): the budget asks only what the protocol says."""

    name = "halves"

    def length(self, draft_min, draft_max, tile=1):
        return max(draft_min, draft_max // 2), None

    def expected_tokens(self, k):
        return None

    def promise_plain(self):
        return None

    def prepare(self, ctx, history, knobs):
        return None

    def observe(self, n_drafted, n_accepted, draft_seconds):
        pass

    def observe_verify(self, batch_size, seconds):
        pass

    def observe_shadow(self, hit):
        pass

    def observe_idle(self):
        pass

    def observe_upkeep(self, seconds, tokens, resume_seconds=0.0):
        pass

    def observe_load(self, cpu_seconds, wall_seconds, n_threads):
        pass

    def state(self):
        return {}

    def load(self, d):
        pass

    def cost_points(self):
        return None

    @classmethod
    def describe_state(cls, state, points=None):
        return {"name": cls.name}

    def describe(self):
        return self.describe_state(self.state())


def test_any_drafting_policy_plans_a_budget():
    from specviz.decoding.policy import DraftingPolicy

    assert isinstance(Halves(), DraftingPolicy)
    b = plan({**KNOBS, "draft_max": 14}, Halves(), ROOMY)
    assert (b.requested, b.limit, b.cap) == (14, 7, "policy")  # a batch of 8 rows suits the tile
