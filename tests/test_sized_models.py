"""specviz.testing.sized_models: a random llama GGUF of any size (the GPU check writes a 1.1B one)."""

from __future__ import annotations

import numpy as np
import pytest

from specviz.backends import LlamaContext, LlamaModel
from specviz.testing.sized_models import LlamaShape, write_random_llama
from specviz.testing.tiny_models import tiny_vocab


def test_large_vocabularies_are_filled_to_the_size_asked():
    tokens, scores, types = tiny_vocab(32000)
    assert len(tokens) == len(scores) == len(types) == 32000
    assert len(set(tokens)) == 32000
    assert tiny_vocab(320)[0] == tiny_vocab(32000)[0][:320]  # a small vocabulary is the start of a large one


def test_the_default_shape_is_a_1b_model():
    s = LlamaShape()
    assert 1.0e9 < s.n_params < 1.2e9


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_a_random_model_loads_with_its_shape_and_decodes_finite_logits(tmp_path, dtype):
    shape = LlamaShape(n_embd=128, n_layer=3, n_head=4, n_head_kv=2, n_ff=256, vocab_size=2000)
    p = write_random_llama(tmp_path / "m.gguf", shape, seed=3, dtype=dtype)
    item = 2 if dtype == "f16" else 4
    assert p.stat().st_size > (shape.n_params - shape.n_layer * 2 * shape.n_embd) * item
    m = LlamaModel(p)
    ctx = LlamaContext(m, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    try:
        assert (m.n_vocab, m.n_layer, m.n_embd) == (2000, 3, 128)
        ctx.eval(m.tokenize("hello world"), 0, rows="last")
        row = ctx.last_row()
        assert np.isfinite(row).all() and row.std() > 0
    finally:
        ctx.close()
        m.close()


def test_greedy_output_of_a_random_model_falls_into_a_loop(tmp_path):
    """The damped output rows make greedy decoding walk a few hot tokens: n-gram drafting can copy."""
    from specviz import Session

    shape = LlamaShape(n_embd=128, n_layer=2, n_head=4, n_head_kv=2, n_ff=256, vocab_size=4000)
    m = LlamaModel(write_random_llama(tmp_path / "m.gguf", shape, seed=0))
    s = Session(m, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        s.start("the quick brown fox", 96, "prompt-lookup", draft_max=8)
        s.run()
        assert len(set(s.tokens[48:])) < 24  # a loop, not 48 distinct tokens
        assert s.telemetry_dict()["accepted"] > 0
    finally:
        s.close()
        m.close()


def test_bad_shapes_and_types_are_refused(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        write_random_llama(tmp_path / "a.gguf", LlamaShape(n_layer=1), dtype="q8_0")
    with pytest.raises(ValueError, match="multiple"):
        write_random_llama(tmp_path / "b.gguf", LlamaShape(n_embd=130, n_head=4))
