"""Tests of specviz.models.derive: layer specs and layer-subset drafts that llama.cpp loads."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from specviz.errors import KnobError, ModelFormatError, ModelNotFoundError
from specviz.models.derive import derive_draft, parse_layers
from specviz.testing.tiny_models import tiny_vocab, tiny_weights, write_tiny_llama

gguf = pytest.importorskip("gguf")

# ------------------------------------------------------------------------------------------------
# parse_layers


@pytest.mark.parametrize(
    "spec,want",
    [
        ("0-5,12-17", (0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 17)),
        ("3", (3,)),
        ("0, 2 ,4", (0, 2, 4)),
        ("4-4", (4,)),
        ("7,0-1", (0, 1, 7)),
    ],
)
def test_parse_layers_accepts(spec, want):
    assert parse_layers(spec) == want
    assert parse_layers(spec, 18) == want


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("", "no layers"),
        ("   ", "no layers"),
        ("0-5,", "empty item"),
        ("a-b", "'a-b'"),
        ("5-2", "backwards"),
        ("0-3,2", "listed twice"),
        ("-1", "'-1'"),
        ("0-18", "does not exist"),
        ("1.5", "'1.5'"),
    ],
)
def test_parse_layers_refuses_with_option_and_value(spec, fragment):
    with pytest.raises(KnobError) as ei:
        parse_layers(spec, 18)
    msg = str(ei.value)
    assert "--keep-layers" in msg and repr(spec) in msg and fragment in msg
    assert ei.value.knob == "--keep-layers" and ei.value.value == spec


def test_parse_layers_names_the_given_option():
    with pytest.raises(KnobError, match="--layers"):
        parse_layers("x", option="--layers")


# ------------------------------------------------------------------------------------------------
# derive on tiny fixtures


def test_derive_rewrites_metadata_and_tensors(tmp_path: Path):
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=4, seed=3)
    res = derive_draft(target, [0, 2], tmp_path / "d.gguf")
    assert res.kept == (0, 2) and res.source_layers == 4 and res.arch == "llama"
    assert res.path == tmp_path / "d.gguf" and not (tmp_path / "d.gguf.part").exists()
    a = gguf.GGUFReader(str(target))
    b = gguf.GGUFReader(str(res.path))
    assert b.fields["llama.block_count"].contents() == 2
    assert b.fields["specviz.derived.kept_layers"].contents() == [0, 2]
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
        "llama.embedding_length",
        "llama.context_length",
        "tokenizer.ggml.bos_token_id",
    ):
        assert a.fields[key].contents() == b.fields[key].contents(), key
    src = {t.name: t for t in a.tensors}
    names = {t.name for t in b.tensors}
    assert not any(n.startswith(("blk.2.", "blk.3.")) for n in names)
    for t in b.tensors:
        orig = t.name
        if t.name.startswith("blk.1."):
            orig = "blk.2." + t.name[len("blk.1.") :]
        assert np.array_equal(t.data, src[orig].data), t.name
        assert t.tensor_type == src[orig].tensor_type


def test_derive_subsets_per_layer_arrays_and_copies_quantized_bytes(tmp_path: Path):
    # a model whose head counts are per-layer arrays and whose matrices are quantized (Q8_0)
    from gguf.quants import quantize

    src = tmp_path / "arr.gguf"
    w = gguf.GGUFWriter(str(src), "llama")
    w.add_block_count(3)
    w.add_head_count([4, 5, 6])
    w.add_embedding_length(32)
    w.add_token_list(["a", "b"])
    rng = np.random.default_rng(0)
    for i in range(3):
        m = rng.standard_normal((8, 32)).astype(np.float32) + i
        w.add_tensor(
            f"blk.{i}.attn_q.weight",
            quantize(m, gguf.GGMLQuantizationType.Q8_0),
            raw_dtype=gguf.GGMLQuantizationType.Q8_0,
        )
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.full(32, i, dtype=np.float32))
    w.add_tensor("token_embd.weight", np.zeros((2, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    res = derive_draft(src, "0,2", tmp_path / "out.gguf")
    assert res.subset_keys == ("llama.attention.head_count",)
    a = gguf.GGUFReader(str(src))
    b = gguf.GGUFReader(str(res.path))
    assert b.fields["llama.attention.head_count"].contents() == [4, 6]
    assert b.fields["tokenizer.ggml.tokens"].contents() == ["a", "b"]
    bt = {t.name: t for t in b.tensors}
    at = {t.name: t for t in a.tensors}
    assert bt["blk.1.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert list(bt["blk.1.attn_q.weight"].shape) == list(at["blk.2.attn_q.weight"].shape)
    assert bt["blk.1.attn_q.weight"].data.tobytes() == at["blk.2.attn_q.weight"].data.tobytes()
    assert np.all(bt["blk.1.attn_norm.weight"].data == 2)
    assert bt["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F16


def test_derive_refuses_bad_inputs(tmp_path: Path):
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=4)
    with pytest.raises(ModelNotFoundError):
        derive_draft(tmp_path / "missing.gguf", "0", tmp_path / "d.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ModelFormatError):
        derive_draft(junk, "0", tmp_path / "d.gguf")
    with pytest.raises(KnobError, match="0-3"):
        derive_draft(target, "0-4", tmp_path / "d.gguf")
    with pytest.raises(KnobError):
        derive_draft(target, [2, 0], tmp_path / "d.gguf")
    with pytest.raises(KnobError):
        derive_draft(target, [], tmp_path / "d.gguf")
    with pytest.raises(KnobError):
        derive_draft(target, "0", target)
    assert not (tmp_path / "d.gguf").exists() and not (tmp_path / "d.gguf.part").exists()


def _blocks_only(path: Path, arch: str, n: int) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n)
    for i in range(n):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.full(4, i, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gemma3_gets_an_explicit_sliding_window_pattern(tmp_path: Path, recwarn):
    src = _blocks_only(tmp_path / "g3.gguf", "gemma3", 18)
    res = derive_draft(src, "1-17", tmp_path / "a.gguf")
    # Gemma 3: blocks 5, 11 and 17 are global, the others use the sliding window
    want = [i % 6 != 5 for i in range(1, 18)]
    assert list(res.swa_pattern) == want and res.swa_mismatches == ()
    r = gguf.GGUFReader(str(res.path))
    assert r.fields["gemma3.attention.sliding_window_pattern"].contents() == want
    assert not [w for w in recwarn if "sliding-window" in str(w.message)]


def test_gemma2_swa_mismatch_is_reported(tmp_path: Path):
    src = _blocks_only(tmp_path / "g2.gguf", "gemma2", 8)
    ok = derive_draft(src, "0-3", tmp_path / "a.gguf")
    assert ok.swa_mismatches == () and ok.swa_pattern is None
    with pytest.warns(UserWarning, match="sliding-window"):
        bad = derive_draft(src, "0,2-7", tmp_path / "b.gguf")
    # original 3 (global) becomes 2 (local) and original 2 (local) becomes 1 (global)
    assert (3, 2) in bad.swa_mismatches and (2, 1) in bad.swa_mismatches


# ------------------------------------------------------------------------------------------------
# llama.cpp loads the derived model and computes exactly what a directly written model computes


def _load(path: Path):
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp could not load {path}"
    return model


def _last_logits(model, tokens: list[int]) -> np.ndarray:
    import llama_cpp

    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = 64
    cp.n_batch = 64
    cp.n_threads = 1
    cp.n_threads_batch = 1
    ctx = llama_cpp.llama_init_from_model(model, cp)
    assert ctx
    try:
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        batch = llama_cpp.llama_batch_get_one(arr, len(tokens))
        assert llama_cpp.llama_decode(ctx, batch) == 0
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).copy()
    finally:
        llama_cpp.llama_free(ctx)


@pytest.fixture(scope="module")
def llama_cpp():
    mod = pytest.importorskip("llama_cpp")
    mod.llama_backend_init()
    return mod


def test_derived_tiny_model_loads_and_matches_a_directly_written_one(tmp_path: Path, llama_cpp):
    kw = dict(seed=7, n_layer=4)
    target = write_tiny_llama(tmp_path / "t.gguf", **kw)
    derived = derive_draft(target, "0,2", tmp_path / "d.gguf").path
    weights = tiny_weights(**kw)
    renumbered = {k: v for k, v in weights.items() if not k.startswith("blk.")}
    for new, old in enumerate((0, 2)):
        for k, v in weights.items():
            if k.startswith(f"blk.{old}."):
                renumbered[f"blk.{new}." + k[len(f"blk.{old}.") :]] = v
    direct = write_tiny_llama(tmp_path / "direct.gguf", n_layer=2, layers_from=renumbered)

    tm, dm, xm = _load(target), _load(derived), _load(direct)
    try:
        assert llama_cpp.llama_model_n_layer(dm) == 2
        tv, dv = llama_cpp.llama_model_get_vocab(tm), llama_cpp.llama_model_get_vocab(dm)
        n = llama_cpp.llama_vocab_n_tokens(tv)
        assert n == llama_cpp.llama_vocab_n_tokens(dv) == len(tiny_vocab()[0])
        assert [llama_cpp.llama_vocab_get_text(tv, i) for i in range(n)] == [
            llama_cpp.llama_vocab_get_text(dv, i) for i in range(n)
        ]
        for prompt in ([1, 300, 301, 302], [1, 5, 260, 7, 9, 280]):
            d = _last_logits(dm, prompt)
            x = _last_logits(xm, prompt)
            t = _last_logits(tm, prompt)
            assert np.array_equal(d, x)  # exact, f32 weights
            assert not np.array_equal(d, t)  # dropping layers changed the model
    finally:
        for m in (tm, dm, xm):
            llama_cpp.llama_model_free(m)
