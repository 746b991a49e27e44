"""Tiny real llama.cpp models of the other memory kinds, for tests and examples (random f32 weights).

Each writer produces, in a few milliseconds, a GGUF that the vendored llama.cpp loads and decodes, with
the tiny byte-level vocabulary of :func:`specviz.testing.tiny_models.tiny_vocab` (so every strategy and
check written for the tiny llama fixtures applies):

* :func:`write_tiny_mamba` — llama.cpp's ``mamba`` architecture: a purely *recurrent* model (one state
  per sequence, no cache of past positions). llama.cpp cannot remove part of its sequence and does not
  offer bounded rollback for it (``llm_arch_supports_rs_rollback`` is false), so speculation on it goes
  through partial-state checkpoints every round.
* :func:`write_tiny_lfm2` — llama.cpp's ``lfm2`` architecture: a *hybrid* of short-convolution layers
  (recurrent state) and attention layers (a KV cache), the kind LFM2 ships. llama.cpp keeps up to
  ``n_rs_seq`` rollback snapshots of its conv state, so drafts up to that bound roll back by partial
  removal and longer ones through a checkpoint. ``sliding_window`` gives its attention layers a window.
* :func:`write_tiny_gemma3_swa` — llama.cpp's ``gemma3`` architecture (the embedded model's) with a
  small sliding window on every layer but the last of each ``pattern``: the fixture for the ring-sized
  sliding-window cache (``swa_full = False``).

They are real llama.cpp models, not mocks; their weights are random, so only the mechanics (lengths,
rollbacks, exact greedy equality) are meaningful, not the text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .tiny_models import add_tiny_vocab, tiny_vocab

__all__ = ["write_tiny_mamba", "write_tiny_lfm2", "write_tiny_gemma3_swa"]


def _vocab(w, vocab_size: int) -> None:
    """The tiny SentencePiece-style vocabulary and its special ids (as the tiny llama fixtures have)."""
    tokens, scores, types = tiny_vocab(vocab_size)
    add_tiny_vocab(w, tokens, scores, types)


def _finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class _Init:
    """Seeded f32 initialisers (numpy row-major shapes: llama.cpp's ``{ne0, ne1}`` is ``(ne1, ne0)``)."""

    def __init__(self, seed: int, scale: float) -> None:
        self.rng = np.random.default_rng(seed)
        self.scale = scale

    def mat(self, *shape: int, s: float = 0.3) -> np.ndarray:
        # scaled by the fan-in so activations stay of order one through a few layers
        return (self.rng.standard_normal(shape) * s * self.scale / np.sqrt(shape[-1] / 16)).astype(np.float32)

    @staticmethod
    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)


def write_tiny_mamba(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 320,
    n_embd: int = 64,
    n_layer: int = 2,
    d_state: int = 16,
    d_conv: int = 4,
    dt_rank: int = 4,
    context_length: int = 2048,
    scale: float = 1.0,
    block_scale: float = 1.0,
) -> Path:
    """Write a tiny ``mamba`` (Mamba-1, recurrent) GGUF to ``path`` and return the path.

    llama.cpp supports only an inner width of twice ``n_embd``; ``d_state``, ``d_conv`` and ``dt_rank``
    are the selective-scan state size, the convolution width and the time-step rank. ``block_scale``
    scales the blocks' output projections: small values make the next token depend mostly on the
    current one, so greedy decoding falls into loops (drafts that are often, not always, accepted).
    """
    import gguf

    path = Path(path)
    d_inner = 2 * n_embd
    init = _Init(seed, scale)
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_name(f"tiny-mamba-s{seed}-l{n_layer}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    _vocab(w, vocab_size)
    w.add_tensor("token_embd.weight", init.mat(vocab_size, n_embd, s=1.0 * np.sqrt(n_embd / 16)))
    w.add_tensor("output_norm.weight", init.ones(n_embd))
    w.add_tensor("output.weight", init.mat(vocab_size, n_embd, s=0.5))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", init.ones(n_embd))
        w.add_tensor(f"blk.{i}.ssm_in.weight", init.mat(2 * d_inner, n_embd))
        w.add_tensor(f"blk.{i}.ssm_conv1d.weight", init.mat(d_inner, d_conv, s=0.5))
        w.add_tensor(f"blk.{i}.ssm_conv1d.bias", np.zeros(d_inner, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ssm_x.weight", init.mat(dt_rank + 2 * d_state, d_inner))
        w.add_tensor(f"blk.{i}.ssm_dt.weight", init.mat(d_inner, dt_rank))
        w.add_tensor(f"blk.{i}.ssm_dt.bias", np.full(d_inner, -2.0, dtype=np.float32))
        # A = -exp(A_log) as the converter stores it: negative, so the state decays
        a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))
        w.add_tensor(f"blk.{i}.ssm_a", a)
        w.add_tensor(f"blk.{i}.ssm_d", init.ones(d_inner))
        w.add_tensor(f"blk.{i}.ssm_out.weight", init.mat(n_embd, d_inner, s=0.1 * block_scale))
    _finish(w)
    return path


def write_tiny_lfm2(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 320,
    n_embd: int = 64,
    layers: str = "cac",
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    l_cache: int = 3,
    sliding_window: int = 0,
    context_length: int = 2048,
    scale: float = 1.0,
    block_scale: float = 1.0,
) -> Path:
    """Write a tiny ``lfm2`` (hybrid: short convolutions and attention) GGUF to ``path``; return the path.

    ``layers`` spells the blocks in order: ``c`` a short-convolution block (recurrent state of
    ``l_cache - 1`` columns), ``a`` an attention block. ``sliding_window`` > 0 gives the attention blocks
    that window (llama.cpp's hybrid sliding-window memory). ``block_scale`` scales the blocks' output
    projections (small: greedy decoding loops, as with :func:`write_tiny_mamba`).
    """
    import gguf

    if not layers or set(layers) - {"a", "c"}:
        raise ValueError(f"layers must spell blocks with 'a' (attention) and 'c' (convolution); got {layers!r}")
    path = Path(path)
    init = _Init(seed, scale)
    head_dim = n_embd // n_head
    n_kv = head_dim * n_head_kv
    w = gguf.GGUFWriter(str(path), "lfm2")
    w.add_name(f"tiny-lfm2-s{seed}-{layers}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(len(layers))
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv([n_head_kv if b == "a" else 0 for b in layers])
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(l_cache)
    if sliding_window > 0:
        w.add_sliding_window(sliding_window)
    w.add_file_type(0)
    _vocab(w, vocab_size)
    w.add_tensor("token_embd.weight", init.mat(vocab_size, n_embd, s=1.0 * np.sqrt(n_embd / 16)))
    w.add_tensor("token_embd_norm.weight", init.ones(n_embd))  # llama.cpp's name for LFM2's output norm
    w.add_tensor("output.weight", init.mat(vocab_size, n_embd, s=0.5))
    for i, b in enumerate(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", init.ones(n_embd))
        if b == "a":
            w.add_tensor(f"blk.{i}.attn_q.weight", init.mat(n_embd, n_embd))
            w.add_tensor(f"blk.{i}.attn_k.weight", init.mat(n_kv, n_embd))
            w.add_tensor(f"blk.{i}.attn_v.weight", init.mat(n_kv, n_embd))
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", init.ones(head_dim))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", init.ones(head_dim))
            w.add_tensor(f"blk.{i}.attn_output.weight", init.mat(n_embd, n_embd, s=0.1 * block_scale))
        else:
            w.add_tensor(f"blk.{i}.shortconv.conv.weight", init.mat(n_embd, l_cache, s=0.5))
            w.add_tensor(f"blk.{i}.shortconv.in_proj.weight", init.mat(3 * n_embd, n_embd))
            w.add_tensor(f"blk.{i}.shortconv.out_proj.weight", init.mat(n_embd, n_embd, s=0.1 * block_scale))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", init.ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", init.mat(n_ff, n_embd, s=0.2))
        w.add_tensor(f"blk.{i}.ffn_up.weight", init.mat(n_ff, n_embd, s=0.2))
        w.add_tensor(f"blk.{i}.ffn_down.weight", init.mat(n_embd, n_ff, s=0.1 * block_scale))
    _finish(w)
    return path


def write_tiny_gemma3_swa(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 320,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    sliding_window: int = 16,
    pattern: int = 2,
    context_length: int = 2048,
    scale: float = 1.0,
) -> Path:
    """Write a tiny ``gemma3`` GGUF whose layers attend through a sliding window of ``sliding_window``
    positions, except the last of every ``pattern`` layers (full attention), as Gemma 3's 5:1 pattern
    does with ``pattern=6``; return the path. ``sliding_window=0`` writes it without a window."""
    import gguf

    path = Path(path)
    init = _Init(seed, scale)
    head_dim = n_embd // n_head
    n_q, n_kv = head_dim * n_head, head_dim * n_head_kv
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_name(f"tiny-gemma3-swa{sliding_window}-s{seed}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    if sliding_window > 0:
        w.add_sliding_window(sliding_window)
        w.add_sliding_window_pattern(pattern)
    w.add_file_type(0)
    _vocab(w, vocab_size)
    # gemma3 scales the embeddings by sqrt(n_embd): keep the residual stream of order one
    w.add_tensor("token_embd.weight", init.mat(vocab_size, n_embd, s=1.0 / np.sqrt(n_embd) * np.sqrt(n_embd / 16)))
    # the converter stores Gemma's (1 + w) norm weights already added up: ones are the neutral norm
    w.add_tensor("output_norm.weight", init.ones(n_embd))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", init.ones(n_embd))
        w.add_tensor(f"blk.{i}.attn_q.weight", init.mat(n_q, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", init.mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", init.mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", init.ones(head_dim))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", init.ones(head_dim))
        w.add_tensor(f"blk.{i}.attn_output.weight", init.mat(n_embd, n_q, s=0.1))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", init.ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", init.ones(n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", init.mat(n_ff, n_embd, s=0.2))
        w.add_tensor(f"blk.{i}.ffn_up.weight", init.mat(n_ff, n_embd, s=0.2))
        w.add_tensor(f"blk.{i}.ffn_down.weight", init.mat(n_embd, n_ff, s=0.1))
        w.add_tensor(f"blk.{i}.post_ffw_norm.weight", init.ones(n_embd))
    _finish(w)
    return path
