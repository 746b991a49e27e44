"""Tests of specviz.models.vocab: draft/target vocabulary compatibility on tiny llama.cpp models."""

from __future__ import annotations

from pathlib import Path

import pytest

from specviz.errors import ModelError, VocabularyMismatchError
from specviz.models.vocab import check_vocab_compatible, spread_ids, vocab_differences, vocab_summary
from specviz.testing.tiny_models import write_tiny_llama

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def lc():
    mod = pytest.importorskip("llama_cpp")
    mod.llama_backend_init()
    return mod


@pytest.fixture
def load(lc):
    models = []

    def _load(path: Path):
        m = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
        assert m, f"llama.cpp could not load {path}"
        models.append(m)
        return m

    yield _load
    for m in models:
        lc.llama_model_free(m)


def test_spread_ids_cover_edges_and_middle():
    ids = spread_ids(262144, 512)
    assert ids[:64] == list(range(64)) and ids[-64:] == list(range(262144 - 64, 262144))
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    assert any(100000 < i < 150000 for i in ids)
    assert spread_ids(10) == list(range(10)) and spread_ids(0) == []


def test_same_vocabulary_different_weights_is_compatible(tmp_path: Path, load):
    t = load(write_tiny_llama(tmp_path / "t.gguf", seed=1, n_layer=2))
    d = load(write_tiny_llama(tmp_path / "d.gguf", seed=2, n_layer=1, n_embd=32, n_ff=64))
    check_vocab_compatible(t, d)  # no error
    assert vocab_differences(t, d) == []
    s = vocab_summary(t)
    assert s.n_tokens == 320 and s.special["bos"] == 1 and s.special["eos"] == 2
    assert s.flags["add_bos"] is True


def test_different_sizes_are_refused_with_what_differs(tmp_path: Path, load):
    t = load(write_tiny_llama(tmp_path / "t.gguf", vocab_size=320))
    d = load(write_tiny_llama(tmp_path / "d.gguf", vocab_size=400))
    with pytest.raises(VocabularyMismatchError) as ei:
        check_vocab_compatible(t, d)
    err = ei.value
    assert isinstance(err, ModelError)
    msg = str(err)
    assert "n_tokens: target 320, draft 400" in msg
    assert "derive-draft" in msg  # says what to do
    kinds = {x.kind for x in err.differences}
    assert "size" in kinds
    # the shared ids have the same text: only the size differs
    assert "text" not in kinds


def test_changed_token_text_is_refused_naming_the_ids(tmp_path: Path, load):
    t = load(write_tiny_llama(tmp_path / "t.gguf"))
    # ids 0-63, the evenly spaced ones and the last 64 are compared; 300 is among the last 64 of 320
    d = load(write_tiny_llama(tmp_path / "d.gguf", token_overrides={300: "▁changed", 1: "<bos>"}))
    with pytest.raises(VocabularyMismatchError) as ei:
        check_vocab_compatible(t, d)
    msg = str(ei.value)
    assert "token 300" in msg and "▁changed" in msg
    assert "token 1" in msg and "<bos>" in msg
    assert "text differs for 2 of the compared ids" in msg
    assert {x.what for x in ei.value.differences} == {"token 1", "token 300"}


def test_changed_special_token_id_is_refused(tmp_path: Path, load, lc):
    import gguf

    from specviz.testing.tiny_models import tiny_vocab, tiny_weights

    path = tmp_path / "eos.gguf"
    weights = tiny_weights()
    tokens, scores, types = tiny_vocab(320)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)  # differs from the fixture's 2
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for name, arr in weights.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    t = load(write_tiny_llama(tmp_path / "t.gguf"))
    d = load(path)
    with pytest.raises(VocabularyMismatchError) as ei:
        check_vocab_compatible(t, d)
    assert "special token eos: target id 2, draft id 0" in str(ei.value)


def test_many_text_differences_are_summarised(tmp_path: Path, load):
    t = load(write_tiny_llama(tmp_path / "t.gguf"))
    d = load(write_tiny_llama(tmp_path / "d.gguf", token_overrides={i: f"zz{i}" for i in range(270, 320)}))
    with pytest.raises(VocabularyMismatchError) as ei:
        check_vocab_compatible(t, d, max_listed=3)
    msg = str(ei.value)
    assert "text differs for 50 of the compared ids" in msg and "(and 47 more)" in msg
