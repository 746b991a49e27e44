"""A verify batch priced as llama.cpp lays it out (specviz.decoding.batch_layout): the micro-batches of a split
and of a unified cache, their seconds from a hand-made batch-cost table, and one request's share of the batch,
all worked by hand. No model, no timing."""

from __future__ import annotations

import pytest

from specviz.decoding.batch_cost import BatchCostTable
from specviz.decoding.batch_layout import MIN_SHARE, cell_seconds, layout_seconds, micro_batches, share_round_cost

SEQS, DRAFTS = (1, 2, 4, 8), (0, 2, 4, 8, 16)


def _table(cost) -> BatchCostTable:
    """A table whose decode of s sequences × (d + 1) rows takes ``cost(s, d)`` seconds."""
    grid = tuple(tuple(float(cost(s, d)) for d in DRAFTS) for s in SEQS)
    return BatchCostTable(SEQS, DRAFTS, grid, grid, 1)


#: Every decode costs 10 for its graph and 1 a row.
LINEAR = _table(lambda s, d: 10.0 + s * (d + 1))


def test_a_split_cache_takes_equal_runs_of_consecutive_sequences():
    assert micro_batches([5, 5, 5, 5], unified=False) == [(4, 5)]
    # the shortest first for all, then the drafters that are left, which run on without a gap
    assert micro_batches([5, 1, 1, 1], unified=False) == [(4, 1), (1, 4)]
    assert micro_batches([5, 5, 1, 1], unified=False) == [(4, 1), (2, 4)]
    # every second sequence drafting: each drafter's tail is a micro-batch of its own
    assert micro_batches([5, 1, 5, 1], unified=False) == [(4, 1), (1, 4), (1, 4)]
    # an idle slot between busy ones breaks the run even when every draft is alike
    assert micro_batches([1, 0, 1, 1], unified=False) == [(1, 1), (2, 1)]
    assert micro_batches([3, 9], unified=False) == [(2, 3), (1, 6)]


def test_a_split_micro_batch_holds_at_most_n_ubatch_tokens():
    assert micro_batches([8, 8], unified=False, n_ubatch=8) == [(2, 4), (2, 4)]
    assert micro_batches([3], unified=False, n_ubatch=2) == [(1, 2), (1, 1)]


def test_a_unified_cache_takes_the_batch_in_one_micro_batch_whatever_the_drafts():
    assert micro_batches([5, 1, 5, 1], unified=True) == [(4, 12)]
    assert micro_batches([1, 0, 1], unified=True) == [(2, 2)]
    assert micro_batches([300, 300], unified=True) == [(2, 512), (2, 88)]


def test_a_cell_between_measured_draft_lengths_and_sequence_counts_is_a_straight_line():
    assert cell_seconds(LINEAR, 1, 1) == pytest.approx(11.0)
    assert cell_seconds(LINEAR, 4, 5) == pytest.approx(10.0 + 4 * 5)  # d = 4 measured
    assert cell_seconds(LINEAR, 4, 4) == pytest.approx(10.0 + 4 * 4)  # d = 3: between 2 and 4
    assert cell_seconds(LINEAR, 3, 4) == pytest.approx(10.0 + 3 * 4)  # between 2 and 4 sequences
    assert cell_seconds(LINEAR, 2, 33) == pytest.approx(10.0 + 2 * 33)  # beyond d = 16: the last segment's


def test_uneven_drafts_in_a_split_cache_cost_a_graph_each_and_in_a_unified_one_their_rows():
    # split: 4 × 1 row (14), then the drafter's 4 rows alone (14)
    assert layout_seconds(LINEAR, [5, 1, 1, 1], unified=False) == pytest.approx(14.0 + 14.0)
    # every second drafting: 14 + 14 + 14
    assert layout_seconds(LINEAR, [5, 1, 5, 1], unified=False) == pytest.approx(42.0)
    # unified: one graph of 12 rows, priced as 4 sequences at 3 rows each
    assert layout_seconds(LINEAR, [5, 1, 5, 1], unified=True) == pytest.approx(22.0)
    # alike drafts: one graph either way
    assert layout_seconds(LINEAR, [5, 5, 5, 5], unified=False) == pytest.approx(30.0)
    assert layout_seconds(LINEAR, [5, 5, 5, 5], unified=True) == pytest.approx(30.0)


def test_alone_a_request_s_share_is_the_table_s_own_curve_and_its_lane():
    curve = share_round_cost(LINEAR, {0: 1}, 0, 0.0, 0.5, unified=False, largest=5)
    assert curve.curve(5) == pytest.approx([11.5, 12.5, 13.5, 14.5, 15.5])


def test_in_a_split_batch_the_share_makes_a_draft_as_long_as_the_others_cheapest():
    # the other three sequences each add 5 rows and are expected to commit 3 tokens each; no lane
    rows = {0: 1, 1: 5, 2: 5, 3: 5}
    curve = share_round_cost(LINEAR, rows, 0, 9.0, 0.0, unified=False, largest=5)
    # slot 0 at one row: 4 × 1 (14), then slots 1-3 × 4 (22): 36 s for 10 tokens, 3.6 a token
    base = 36.0
    assert curve(1) == pytest.approx(3.6)
    # at 3 rows: 4 × 3 (22) then 3 × 2 (16) = 38 s; at 4 rows: 4 × 4 (26) then 3 × 1 (13) = 39 s
    assert curve(3) == pytest.approx(3.6 + 38.0 - base)
    assert curve(4) == pytest.approx(3.6 + 39.0 - base)
    # at 5 rows, one graph of 4 × 5 (30 s): cheaper than staying plain, so priced at the floor
    assert curve(5) == pytest.approx(3.6 * MIN_SHARE)


def test_in_a_unified_batch_the_share_adds_the_draft_s_rows_at_the_batch_s_rate():
    rows = {0: 1, 1: 1, 2: 1, 3: 1}
    curve = share_round_cost(LINEAR, rows, 2, 3.0, 1.0, unified=True, largest=9)
    # slot 2 at one row: 14 s of decode and 4 × 1 s of lanes for 4 tokens: 4.5 s a token; each draft row adds 1 s
    assert curve.curve(9) == pytest.approx([4.5 + b for b in range(9)])


def test_an_idle_slot_between_busy_ones_is_priced_as_the_split_it_causes():
    # slot 1 idle: slots 0 and 2 are separate graphs (11 + 11); slot 2 drafting 4 makes it 11 + 15
    curve = share_round_cost(LINEAR, {0: 1, 2: 1}, 2, 1.0, 0.0, unified=False, largest=5)
    assert curve(1) == pytest.approx(22.0 / 2)
    assert curve(5) == pytest.approx(11.0 + 4.0)
