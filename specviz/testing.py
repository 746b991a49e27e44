"""Tiny real llama.cpp models for tests and examples, written with the ``gguf`` package.

:func:`write_tiny_llama` writes a llama-architecture GGUF (f32, fixed seed, a byte-level SentencePiece
style vocabulary) in a few milliseconds. llama.cpp loads it like any other model; it is not a mock.
Greedy decoding of such a model quickly falls into loops, which makes it a good fixture for n-gram
drafting. Two models written with the same ``vocab_size`` share a vocabulary (usable as a target and
a draft); ``layers_from`` lets a draft reuse the target's embedding and output weights so that the two
agree often.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: Printable pieces that extend the 259 base tokens (3 specials + 256 bytes) up to ``vocab_size``.
_EXTRA_PIECES = [
    "▁the", "▁a", "▁of", "▁and", "▁to", "▁in", "▁is", "▁it", "▁that", "▁for", "▁on", "▁with", "▁as",
    "▁was", "▁be", "▁by", "▁at", "▁this", "▁or", "▁from", "er", "in", "on", "an", "re", "at", "en",
    "ed", "es", "or", "ing", "ion", "▁s", "▁c", "▁p", "▁d", "▁m", "▁b", "▁f", "▁w", "▁h", "▁t",
    "▁def", "▁return", "▁if", "▁else", "▁for", "▁class", "▁self", "()", "):", "▁=", "▁==", "▁+",
    "▁print", "▁import", "▁None", "▁True", "▁False", "▁while", "▁not", "▁x", "▁y", "▁i", "▁n",
]


def tiny_vocab(vocab_size: int = 320) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a byte-fallback SentencePiece vocabulary of ``vocab_size``."""
    if vocab_size < 259:
        raise ValueError("vocab_size must be at least 259 (3 special tokens and 256 byte tokens)")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    letters = [f"▁{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz")
    extra: list[str] = []
    for p in _EXTRA_PIECES + letters + [f"▁{d}" for d in "0123456789"] + [f"x{i}" for i in range(4096)]:
        if p not in extra:
            extra.append(p)
        if len(tokens) + len(extra) >= vocab_size:
            break
    for i, p in enumerate(extra):
        tokens.append(p)
        types.append(1)
        scores.append(-float(i + 1))
    return tokens, scores, types


def write_tiny_llama(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 320,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    context_length: int = 2048,
    scale: float = 1.0,
    block_scale: float = 1.0,
    layers_from: dict | None = None,
    token_overrides: dict[int, str] | None = None,
    eos_token_id: int = 2,
    chat_template: str | None = None,
) -> Path:
    """Write a tiny llama-architecture GGUF to ``path`` and return the path.

    ``layers_from`` (the dict returned by :func:`tiny_weights`) makes the model reuse another model's
    embedding, output and first ``n_layer`` blocks: a draft that agrees with its target often.
    ``token_overrides`` (token id -> text) replaces the text of some tokens, to build a vocabulary
    that differs from the default one of the same size. ``chat_template`` is stored as the model's
    ``tokenizer.chat_template`` (for the chat-template path of sweeps).
    """
    import gguf

    path = Path(path)
    weights = layers_from if layers_from is not None else tiny_weights(
        seed=seed, vocab_size=vocab_size, n_embd=n_embd, n_layer=n_layer, n_head_kv=n_head_kv,
        n_head=n_head, n_ff=n_ff, scale=scale, block_scale=block_scale)
    tokens, scores, types = tiny_vocab(vocab_size)
    for tok_id, text in (token_overrides or {}).items():
        tokens[tok_id] = text
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"tiny-llama-s{seed}-l{n_layer}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)  # all f32
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(eos_token_id)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", weights["token_embd.weight"])
    w.add_tensor("output_norm.weight", weights["output_norm.weight"])
    w.add_tensor("output.weight", weights["output.weight"])
    for i in range(n_layer):
        for name in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                     "ffn_up", "ffn_down"):
            w.add_tensor(f"blk.{i}.{name}.weight", weights[f"blk.{i}.{name}.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_weights(*, seed: int = 0, vocab_size: int = 320, n_embd: int = 64, n_layer: int = 2,
                 n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128, scale: float = 1.0,
                 block_scale: float = 1.0) -> dict:
    """The f32 tensors of a tiny llama model, by GGUF tensor name (numpy row-major shapes).

    ``block_scale`` scales the attention and feed-forward output projections: small values make the
    next token depend mostly on the current one, so greedy decoding falls into loops quickly.
    """
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    n_kv = head_dim * n_head_kv

    def mat(rows: int, cols: int, s: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * s * scale).astype(np.float32)

    t: dict[str, np.ndarray] = {
        "token_embd.weight": mat(vocab_size, n_embd, 1.0),
        "output_norm.weight": np.ones(n_embd, dtype=np.float32),
        "output.weight": mat(vocab_size, n_embd, 0.5),
    }
    for i in range(n_layer):
        t[f"blk.{i}.attn_norm.weight"] = np.ones(n_embd, dtype=np.float32)
        t[f"blk.{i}.attn_q.weight"] = mat(n_embd, n_embd, 0.3)
        t[f"blk.{i}.attn_k.weight"] = mat(n_kv, n_embd, 0.3)
        t[f"blk.{i}.attn_v.weight"] = mat(n_kv, n_embd, 0.3)
        t[f"blk.{i}.attn_output.weight"] = mat(n_embd, n_embd, 0.1 * block_scale)
        t[f"blk.{i}.ffn_norm.weight"] = np.ones(n_embd, dtype=np.float32)
        t[f"blk.{i}.ffn_gate.weight"] = mat(n_ff, n_embd, 0.2)
        t[f"blk.{i}.ffn_up.weight"] = mat(n_ff, n_embd, 0.2)
        t[f"blk.{i}.ffn_down.weight"] = mat(n_embd, n_ff, 0.1 * block_scale)
    return t
