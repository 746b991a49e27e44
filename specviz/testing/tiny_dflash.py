"""Tiny DFlash, DSpark and DFlash-2 draft GGUFs (llama.cpp's ``dflash`` architecture) for tests.

A DFlash draft (``src/models/dflash.cpp`` of the vendored llama.cpp) is a small block-diffusion decoder
tied to a target:

* an encoder ``fc`` (then ``enc.output_norm``) turns the inputs of the target layers listed in
  ``dflash.target_layers`` into one row per target position, whose keys and values are *injected* into
  the draft's own cache at that position (no token, no output);
* a block ``[last token, <mask> x n]`` is then decoded in one pass with non-causal attention over the
  injected context and the block itself; the output at each mask position is that position's draft token.

:func:`write_tiny_dflash` writes a random one for a tiny llama target (vocabulary of the same size,
written the same way, so the two share it token for token); the token embeddings and the output head
are borrowed from the target through ``ctx_other`` unless ``own_output`` is set. The options add:

* ``dspark=True`` — DSpark's Markov head (``markov_w1`` / ``markov_w2``: a bias on each block position's
  logits from the previous position's greedy token) and, unless ``confidence_head=False``, its
  confidence head (``conf_proj``, which predicts each position's acceptance); ``sample_from_anchor``
  picks the anchor-first block layout (the default) or the bonus-anchor one;
* ``selector_top_k=K`` — DFlash-2: a selector over the top ``K`` candidates of each block position with
  pairwise transition scores, and the per-block convolutions it needs.

Random weights draft nonsense, losslessly: these fixtures test the plumbing. Names and shapes follow
llama.cpp's loader; numpy shapes are ggml's reversed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .tiny_models import add_tiny_vocab, tiny_vocab

DFLASH_ARCH = "dflash"


def _ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


def _add_keys(
    w: Any,
    name: str,
    *,
    context_length: int,
    n_embd: int,
    n_layer: int,
    n_ff: int,
    n_head: int,
    n_head_kv: int,
    target_layers: Sequence[int],
    block_size: int | None,
    sample_from_anchor: bool | None,
    causal: bool | None,
    confidence_key: bool | None,
    selector: tuple[int, int, int, int],
) -> None:
    """The draft's metadata keys (the vocabulary aside); ``selector``: (top_k, rank, conv kernel, conv group),
    written when top_k is set."""
    import gguf

    w.add_name(name)
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    w.add_key_value(
        f"{DFLASH_ARCH}.target_layers",
        [int(x) for x in target_layers],
        gguf.GGUFValueType.ARRAY,
        gguf.GGUFValueType.INT32,
    )
    if block_size is not None:
        w.add_uint32(f"{DFLASH_ARCH}.block_size", int(block_size))
    if sample_from_anchor is not None:
        w.add_bool(f"{DFLASH_ARCH}.sample_from_anchor", bool(sample_from_anchor))
    if causal is not None:
        w.add_bool(f"{DFLASH_ARCH}.attention.causal", bool(causal))
    if confidence_key is not None:
        w.add_bool(f"{DFLASH_ARCH}.has_confidence_head", bool(confidence_key))
    selector_top_k, selector_rank, conv_kernel, conv_group = selector
    if selector_top_k:
        w.add_uint32(f"{DFLASH_ARCH}.selector_top_k", int(selector_top_k))
        w.add_uint32(f"{DFLASH_ARCH}.selector_rank", int(selector_rank))
        w.add_uint32(f"{DFLASH_ARCH}.conv_kernel_size", int(conv_kernel))
        w.add_uint32(f"{DFLASH_ARCH}.conv_group_size", int(conv_group))


def _add_layer(
    w: Any,
    i: int,
    rng: np.random.Generator,
    mat: Callable[..., np.ndarray],
    n_embd: int,
    n_q: int,
    n_kv: int,
    head_dim: int,
    n_ff: int,
    selector_top_k: int,
    conv_kernel: int,
    conv_group: int,
) -> None:
    """Block ``i``'s tensors (and DFlash-2's per-block convolutions when ``selector_top_k`` is set)."""
    w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(n_embd))
    w.add_tensor(f"blk.{i}.attn_q.weight", mat(n_q, n_embd))
    w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_kv, n_embd))
    w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_kv, n_embd))
    w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_q, 0.5))
    w.add_tensor(f"blk.{i}.attn_q_norm.weight", _ones(head_dim))
    w.add_tensor(f"blk.{i}.attn_k_norm.weight", _ones(head_dim))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", _ones(n_embd))
    w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
    w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff, 0.5))
    if selector_top_k:
        groups = n_embd // conv_group
        proj = 2 * conv_kernel * groups
        for part in ("attn", "ffn"):
            base = (rng.standard_normal((2, conv_kernel, n_embd)) * 0.1).astype(np.float32)
            base[:, 0, :] += 1.0  # tap 0 passes the position itself through
            w.add_tensor(f"blk.{i}.{part}_conv_base", base)
            w.add_tensor(f"blk.{i}.{part}_conv_proj.weight", mat(proj, n_embd, 0.1))


def _add_markov_head(
    w: Any,
    mat: Callable[..., np.ndarray],
    vocab_size: int,
    n_draft_vocab: int,
    n_embd: int,
    markov_scale: float,
    confidence_head: bool,
) -> None:
    """DSpark's Markov head and, with ``confidence_head``, its confidence head."""
    rank = 8
    w.add_tensor("markov_w1.weight", mat(vocab_size, rank))
    w.add_tensor("markov_w2.weight", mat(n_draft_vocab, rank, markov_scale))
    if confidence_head:
        w.add_tensor("conf_proj.weight", mat(1, n_embd + rank))
        w.add_tensor("conf_proj.bias", np.full(1, 1.0, dtype=np.float32))


def _add_selector(w: Any, mat: Callable[..., np.ndarray], vocab_size: int, n_embd: int, selector_rank: int) -> None:
    """DFlash-2's selector over each block position's top candidates."""
    w.add_tensor("selector_hidden.weight", mat(selector_rank, n_embd))
    w.add_tensor("selector_predecessor.weight", mat(vocab_size, selector_rank))
    w.add_tensor("selector_successor.weight", mat(vocab_size, selector_rank))


def write_tiny_dflash(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 320,
    target_layers: Sequence[int] = (0, 1),
    n_embd: int = 64,
    n_layer: int = 1,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    block_size: int | None = 8,
    mask_token_id: int | None = None,
    dspark: bool = False,
    confidence_head: bool = True,
    confidence_key: bool | None = None,
    sample_from_anchor: bool | None = None,
    selector_top_k: int = 0,
    selector_rank: int = 8,
    conv_kernel: int = 3,
    conv_group: int = 16,
    own_embeddings: bool = False,
    own_output: bool = False,
    d2t: Sequence[int] | None = None,
    causal: bool | None = None,
    scale: float = 1.0,
    markov_scale: float = 0.5,
    context_length: int = 2048,
    output_weight: np.ndarray | None = None,
) -> Path:
    """Write a tiny random ``dflash`` draft GGUF and return its path (see the module docstring).

    ``mask_token_id`` defaults to the vocabulary's last id (a negative id writes none: llama.cpp then has no
    mask token). ``block_size=None`` leaves ``dflash.block_size`` out (llama.cpp then assumes 16).
    ``confidence_key`` writes ``dflash.has_confidence_head`` (default: only for DSpark, as the head).
    ``d2t`` gives a reduced draft vocabulary (target ids; needs ``own_output``). ``output_weight``
    (``[n_draft_vocab, n_embd]``) replaces the random output head (``own_output`` only); ``markov_scale``
    scales DSpark's Markov bias.
    """
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    n_q, n_kv = head_dim * n_head, head_dim * n_head_kv
    n_inp = len(target_layers) * n_embd  # llama.cpp sizes the encoder by the draft's own width
    n_draft_vocab = len(d2t) if d2t is not None else vocab_size

    def mat(rows: int, cols: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * s * scale / np.sqrt(cols)).astype(np.float32)

    tokens, scores, types = tiny_vocab(vocab_size)
    w = gguf.GGUFWriter(str(path), DFLASH_ARCH)
    if confidence_key is None:
        confidence_key = dspark and confidence_head if dspark else None
    _add_keys(
        w,
        f"tiny-dflash-s{seed}",
        context_length=context_length,
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        target_layers=target_layers,
        block_size=block_size,
        sample_from_anchor=sample_from_anchor,
        causal=causal,
        confidence_key=confidence_key,
        selector=(selector_top_k, selector_rank, conv_kernel, conv_group),
    )
    add_tiny_vocab(w, tokens, scores, types)
    if mask_token_id is None:
        mask_token_id = vocab_size - 1
    if mask_token_id >= 0:
        w.add_uint32("tokenizer.ggml.mask_token_id", int(mask_token_id))

    if own_embeddings:
        w.add_tensor("token_embd.weight", mat(vocab_size, n_embd, np.sqrt(n_embd)))
    w.add_tensor("fc.weight", mat(n_embd, n_inp))
    w.add_tensor("enc.output_norm.weight", _ones(n_embd))
    w.add_tensor("output_norm.weight", _ones(n_embd))
    if own_output:
        out = output_weight if output_weight is not None else mat(n_draft_vocab, n_embd, 4.0)
        w.add_tensor("output.weight", np.ascontiguousarray(out, dtype=np.float32))
    if d2t is not None:
        w.add_tensor("d2t", np.asarray(d2t, dtype=np.int64))
    for i in range(n_layer):
        _add_layer(w, i, rng, mat, n_embd, n_q, n_kv, head_dim, n_ff, selector_top_k, conv_kernel, conv_group)
    if dspark:
        _add_markov_head(w, mat, vocab_size, n_draft_vocab, n_embd, markov_scale, confidence_head)
    if selector_top_k:
        _add_selector(w, mat, vocab_size, n_embd, selector_rank)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
