"""What a batch of sequences costs (specviz.decoding.batch_cost): the measurement runs on a tiny real model and
returns a well-formed table; the derived figures on hand-made tables. No assertion depends on speed."""

from __future__ import annotations

import json

import pytest

from specviz.backends import LlamaContext
from specviz.decoding.batch_cost import DRAFT_LENGTHS, NEARLY_FREE, SEQUENCES, BatchCostTable, measure_batch_cost
from specviz.errors import ContextError, KnobError, SequenceError

TEXT = "the cat sat on the mat and then the dog ran to the door and sat down"


def _table(cost) -> BatchCostTable:
    """A table whose decode of s sequences × (d + 1) rows takes ``cost(s, d)`` seconds."""
    grid = tuple(tuple(float(cost(s, d)) for d in DRAFT_LENGTHS) for s in SEQUENCES)
    return BatchCostTable(SEQUENCES, DRAFT_LENGTHS, grid, grid, 1)


def test_the_measurement_gives_a_well_formed_table(tiny_model):
    ctx = LlamaContext(tiny_model, n_ctx=2048, n_batch=160, n_ubatch=160, n_threads=1, n_seq_max=8)
    table = measure_batch_cost(ctx, tiny_model.tokenize(TEXT), repeats=2)
    assert table.sequences == SEQUENCES and table.draft_lengths == DRAFT_LENGTHS and table.repeats == 2
    for grid in (table.fastest, table.median):
        assert len(grid) == len(SEQUENCES) and all(len(row) == len(DRAFT_LENGTHS) for row in grid)
        assert all(t > 0 for row in grid for t in row)
    assert all(table.fastest[i][j] <= table.median[i][j] for i in range(4) for j in range(5))
    assert table.decodes(1, 0) == 1.0 and table.row_cost(1, 0) is None
    assert table.per_row(8, 16) == table.seconds(8, 16) / 136
    assert 1 <= table.free_batch() <= 136
    d = json.loads(json.dumps(table.to_dict()))
    assert len(d["cells"]) == 20 and d["nearly_free_threshold"] == NEARLY_FREE
    assert set(d["marginal_row_cost"]) == {"1", "2", "4", "8"}
    assert "marginal row" in table.text() and "nearly free" in table.text()
    assert [ctx.seq_len(q) for q in range(8)] == [0] * 8  # the sequences it used are left empty
    ctx.close()


def test_the_grids_always_hold_the_one_row_decode(tiny_model):
    ctx = LlamaContext(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=2)
    table = measure_batch_cost(ctx, tiny_model.tokenize(TEXT), sequences=[2], draft_lengths=[3], repeats=1)
    assert (table.sequences, table.draft_lengths) == ((1, 2), (0, 3))
    ctx.close()


def test_rows_at_a_twentieth_of_a_decode_are_nearly_free_to_the_widest_batch():
    table = _table(lambda s, d: 1.0 + 0.05 * (s * (d + 1) - 1))
    assert table.free_batch() == 8 * 17
    assert all(table.marginal_row_cost(s) == pytest.approx(0.05) for s in SEQUENCES)
    assert table.row_cost(4, 2) == pytest.approx(0.05)


def test_rows_that_cost_a_third_of_a_decode_are_never_nearly_free():
    table = _table(lambda s, d: 1.0 + 0.3 * (s * (d + 1) - 1))
    assert table.free_batch() == 1
    assert "no extra row is nearly free" in table.text()


def test_the_free_batch_ends_where_rows_stop_being_cheap():
    # cheap (0.02 of a decode each) up to 32 rows, then each row costs a whole decode
    table = _table(lambda s, d: 1.0 + 0.02 * min(s * (d + 1) - 1, 31) + max(s * (d + 1) - 32, 0))
    # 2 × 17 = 34 rows: two rows past the cheap ones, 0.079 a row on average; 4 × 9 = 36 costs 0.13 a row
    assert table.free_batch() == 34
    assert table.row_cost(4, 8) == pytest.approx((0.62 + 4) / 35)
    assert table.free_batch(threshold=0.2) == 36


def test_a_grid_the_context_cannot_hold_is_refused_and_changes_nothing(tiny_model):
    ctx = LlamaContext(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=2)
    ctx.eval([1, 2, 3], 0)
    toks = tiny_model.tokenize(TEXT)
    with pytest.raises(SequenceError, match="n_seq_max >= 8"):
        measure_batch_cost(ctx, toks)
    with pytest.raises(ContextError, match="n_batch=64"):
        measure_batch_cost(ctx, toks, sequences=[2], draft_lengths=[40])
    with pytest.raises(KnobError, match="draft_lengths"):
        measure_batch_cost(ctx, toks, sequences=[2], draft_lengths=[-1])
    with pytest.raises(KnobError, match="repeats"):
        measure_batch_cost(ctx, toks, sequences=[2], repeats=0)
    with pytest.raises(KnobError, match="tokens"):
        measure_batch_cost(ctx, [], sequences=[2])
    assert (ctx.seq_len(0), ctx.seq_len(1)) == (3, 0)
    ctx.close()
