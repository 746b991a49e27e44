"""A tiny Qwen3.5-style model with one integrated NextN (multi-token prediction) layer, for tests.

llama.cpp's ``qwen35`` architecture (``src/models/qwen35.cpp`` of the vendored llama.cpp) is a *hybrid*
trunk: gated delta-net linear-attention layers (a recurrent state per sequence) interleaved with gated
full-attention layers every ``full_attention_interval`` layers, M-RoPE position sections, and — in the
models trained with multi-token prediction — one NextN block after the trunk
(``qwen35.nextn_predict_layers`` = 1): a full-attention decoder block fed ``eh_proj([enorm(token
embedding), hnorm(trunk hidden state)])``, whose output goes through ``shared_head_norm`` (or the trunk's
``output_norm``) and the shared output head. llama.cpp runs it in an MTP context (``LLAMA_CONTEXT_TYPE_MTP``)
with a plain attention cache, tied to the target context.

:func:`write_tiny_qwen35` writes such a model with random f32 weights and the tiny byte-level vocabulary
(:func:`specviz.testing.tiny_models.tiny_vocab`) in milliseconds; llama.cpp loads and decodes it. As
:func:`~specviz.testing.tiny_models.write_tiny_nextn` does, ``binary=(A, B)`` makes the output head able to
say only A or B (A after B and B after A when ``block_scale`` is small), so the NextN block guesses
between two tokens and drafts are partly accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from .tiny_models import add_tiny_vocab, tiny_vocab

QWEN35_ARCH = "qwen35"


#: the gated delta net: 2 key heads and 4 value heads of width 16 (value width = the inner size), conv kernel 4
_D_STATE, _N_GROUP, _DT_RANK, _D_CONV = 16, 2, 4, 4


def _ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


def _add_keys(
    w: Any, name: str, context_length: int, n_embd: int, n_all: int, n_ff: int, n_head: int, n_head_kv: int
) -> None:
    """The model's metadata keys up to the delta net's (the layer pattern, NextN and the vocabulary aside)."""
    import gguf

    a = QWEN35_ARCH
    head_dim = n_embd // n_head
    w.add_name(name)
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_all)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim // 2)  # partial rotary, as Qwen3.5's
    w.add_key_value(f"{a}.rope.dimension_sections", [2, 1, 1, 0], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{a}.ssm.conv_kernel", _D_CONV)
    w.add_uint32(f"{a}.ssm.inner_size", _D_STATE * _DT_RANK)
    w.add_uint32(f"{a}.ssm.state_size", _D_STATE)
    w.add_uint32(f"{a}.ssm.time_step_rank", _DT_RANK)
    w.add_uint32(f"{a}.ssm.group_count", _N_GROUP)


def _add_delta_net(w: Any, i: int, mat: Callable[..., np.ndarray], n_embd: int, s: float) -> None:
    """Block ``i``'s gated delta-net (linear attention) tensors; ``s`` scales its output projection."""
    key_dim, value_dim = _D_STATE * _N_GROUP, _D_STATE * _DT_RANK
    conv_dim = 2 * key_dim + value_dim
    w.add_tensor(f"blk.{i}.attn_qkv.weight", mat(conv_dim, n_embd))
    w.add_tensor(f"blk.{i}.attn_gate.weight", mat(value_dim, n_embd))
    w.add_tensor(f"blk.{i}.ssm_conv1d.weight", mat(conv_dim, _D_CONV))
    w.add_tensor(f"blk.{i}.ssm_dt.bias", np.zeros(_DT_RANK, dtype=np.float32))
    w.add_tensor(f"blk.{i}.ssm_a", -np.ones(_DT_RANK, dtype=np.float32))
    w.add_tensor(f"blk.{i}.ssm_beta.weight", mat(_DT_RANK, n_embd))
    w.add_tensor(f"blk.{i}.ssm_alpha.weight", mat(_DT_RANK, n_embd))
    w.add_tensor(f"blk.{i}.ssm_norm.weight", _ones(_D_STATE))
    w.add_tensor(f"blk.{i}.ssm_out.weight", mat(n_embd, value_dim, 0.3 * s))


def write_tiny_qwen35(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 320,
    n_embd: int = 64,
    n_layer: int = 4,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    full_attention_interval: int = 2,
    nextn: bool = True,
    shared_head_norm: bool = True,
    block_scale: float = 1.0,
    scale: float = 1.0,
    binary: tuple[int, int] | None = None,
    context_length: int = 2048,
) -> Path:
    """Write a tiny ``qwen35`` GGUF (hybrid trunk of ``n_layer`` blocks, one NextN block unless ``nextn`` is
    False) and return its path. ``full_attention_interval`` (at least 2) spaces the full-attention layers:
    llama.cpp aborts on a qwen35 trunk with no recurrent layer (its hybrid cache then has no state buffer)."""
    import gguf

    if full_attention_interval < 2:
        raise ValueError(f"full_attention_interval={full_attention_interval}: a qwen35 trunk needs recurrent layers")
    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    n_q, n_kv = head_dim * n_head, head_dim * n_head_kv
    n_all = n_layer + (1 if nextn else 0)

    def mat(rows: int, cols: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * s * scale / np.sqrt(cols)).astype(np.float32)

    tokens, scores, types = tiny_vocab(vocab_size)
    w = gguf.GGUFWriter(str(path), QWEN35_ARCH)
    _add_keys(w, f"tiny-qwen35-nextn-s{seed}", context_length, n_embd, n_all, n_ff, n_head, n_head_kv)
    w.add_uint32(f"{QWEN35_ARCH}.full_attention_interval", full_attention_interval)
    if nextn:
        w.add_uint32(f"{QWEN35_ARCH}.nextn_predict_layers", 1)
    w.add_file_type(0)
    add_tiny_vocab(w, tokens, scores, types)

    emb = (rng.standard_normal((vocab_size, n_embd)) * scale).astype(np.float32)
    out = mat(vocab_size, n_embd, 4.0)
    if binary is not None:
        p, q = binary
        out = np.zeros_like(out)
        out[p] = emb[q] - emb[p]
        out[q] = emb[p] - emb[q]
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", _ones(n_embd))
    w.add_tensor("output.weight", out)

    def attention(i: int, out_scale: float) -> None:
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(2 * n_q, n_embd))  # query and its gate
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_q, 0.3 * out_scale))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", _ones(head_dim))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", _ones(head_dim))

    for i in range(n_all):
        trunk = i < n_layer
        s = block_scale if trunk else 1.0
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(n_embd))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", _ones(n_embd))
        if trunk and (i + 1) % full_attention_interval != 0:  # a gated delta-net (linear attention) layer
            _add_delta_net(w, i, mat, n_embd, s)
        else:
            attention(i, s)
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff, 0.3 * s))
        if not trunk:
            w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", mat(n_embd, 2 * n_embd))
            w.add_tensor(f"blk.{i}.nextn.enorm.weight", _ones(n_embd))
            w.add_tensor(f"blk.{i}.nextn.hnorm.weight", _ones(n_embd))
            if shared_head_norm:
                w.add_tensor(f"blk.{i}.nextn.shared_head_norm.weight", _ones(n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
