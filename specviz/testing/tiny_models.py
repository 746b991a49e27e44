"""Tiny real llama.cpp models for tests and examples, written with the ``gguf`` package.

:func:`write_tiny_llama` writes a llama-architecture GGUF (f32, fixed seed, a byte-level SentencePiece
style vocabulary) in a few milliseconds. llama.cpp loads it like any other model; it is not a mock.
Greedy decoding of such a model quickly falls into loops, which makes it a good fixture for n-gram
drafting. Two models written with the same ``vocab_size`` share a vocabulary (usable as a target and
a draft); ``layers_from`` lets a draft reuse the target's embedding and output weights so that the two
agree often.

:func:`write_tiny_eagle3` writes a random EAGLE-3 head for such a target (llama.cpp's ``eagle3``
architecture, a reduced draft vocabulary in ``d2t``) and :func:`write_tiny_nextn` a tiny ``glm4moe``
model with one NextN (multi-token prediction) layer, both in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: Printable pieces that extend the 259 base tokens (3 specials + 256 bytes) up to ``vocab_size``.
_EXTRA_PIECES = [
    "▁the",
    "▁a",
    "▁of",
    "▁and",
    "▁to",
    "▁in",
    "▁is",
    "▁it",
    "▁that",
    "▁for",
    "▁on",
    "▁with",
    "▁as",
    "▁was",
    "▁be",
    "▁by",
    "▁at",
    "▁this",
    "▁or",
    "▁from",
    "er",
    "in",
    "on",
    "an",
    "re",
    "at",
    "en",
    "ed",
    "es",
    "or",
    "ing",
    "ion",
    "▁s",
    "▁c",
    "▁p",
    "▁d",
    "▁m",
    "▁b",
    "▁f",
    "▁w",
    "▁h",
    "▁t",
    "▁def",
    "▁return",
    "▁if",
    "▁else",
    "▁for",
    "▁class",
    "▁self",
    "()",
    "):",
    "▁=",
    "▁==",
    "▁+",
    "▁print",
    "▁import",
    "▁None",
    "▁True",
    "▁False",
    "▁while",
    "▁not",
    "▁x",
    "▁y",
    "▁i",
    "▁n",
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
    seen: set[str] = set()
    # synthetic pieces x0, x1 ... fill any size (the vocabulary of a realistically sized test model)
    for p in _EXTRA_PIECES + letters + [f"▁{d}" for d in "0123456789"] + [f"x{i}" for i in range(vocab_size)]:
        if p not in seen:
            seen.add(p)
            extra.append(p)
        if len(tokens) + len(extra) >= vocab_size:
            break
    for i, p in enumerate(extra):
        tokens.append(p)
        types.append(1)
        scores.append(-float(i + 1))
    return tokens, scores, types


def add_tiny_vocab(w, tokens: list[str], scores: list[float], types: list[int], eos_token_id: int = 2) -> None:
    """Write a :func:`tiny_vocab` vocabulary into a GGUF writer ``w``: a SentencePiece-style (``llama``)
    tokenizer with BOS 1, EOS ``eos_token_id`` and UNK 0, BOS added to every prompt (every tiny fixture
    uses it)."""
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(eos_token_id)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


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
    ``tokenizer.chat_template`` (its own chat template: the chat requests of sessions and sweeps).
    """
    import gguf

    path = Path(path)
    weights = (
        layers_from
        if layers_from is not None
        else tiny_weights(
            seed=seed,
            vocab_size=vocab_size,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head_kv=n_head_kv,
            n_head=n_head,
            n_ff=n_ff,
            scale=scale,
            block_scale=block_scale,
        )
    )
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
    add_tiny_vocab(w, tokens, scores, types, eos_token_id)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", weights["token_embd.weight"])
    w.add_tensor("output_norm.weight", weights["output_norm.weight"])
    w.add_tensor("output.weight", weights["output.weight"])
    for i in range(n_layer):
        for name in (
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ):
            w.add_tensor(f"blk.{i}.{name}.weight", weights[f"blk.{i}.{name}.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_weights(
    *,
    seed: int = 0,
    vocab_size: int = 320,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    scale: float = 1.0,
    block_scale: float = 1.0,
) -> dict:
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


def write_tiny_eagle3(
    path: str | Path,
    target: str | Path,
    *,
    seed: int = 0,
    n_draft_vocab: int | None = None,
    target_layers: tuple[int, int, int] | None = None,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    own_embeddings: bool = False,
    norm_before_fc: bool = False,
    scale: float = 1.0,
    d2t: tuple[int, ...] | None = None,
) -> Path:
    """Write a tiny random EAGLE-3 head for the tiny llama ``target`` (f32, fixed seed) and return the path.

    The head is as wide as the target and borrows its token embeddings unless ``own_embeddings``.
    ``n_draft_vocab`` (default: half the target's vocabulary) picks a reduced draft vocabulary: every
    other target id from 0, written as ``d2t`` (or pass ``d2t`` itself). ``target_layers`` defaults to
    the converter's ``[2, N/2, N-3]`` clamped to the target's depth.
    """
    from ..backends.gguf_check import check_gguf
    from ..models.eagle3_gguf import Eagle3HeadConfig, default_target_layers, random_eagle3_weights, write_eagle3_head

    info = check_gguf(target)
    arch = info.architecture
    n_layer = int(info.metadata[f"{arch}.block_count"])
    n_embd = int(info.metadata[f"{arch}.embedding_length"])
    n_vocab = int(info.metadata["tokenizer.ggml.tokens"])
    if d2t is None:
        k = n_draft_vocab if n_draft_vocab is not None else n_vocab // 2
        d2t = tuple(range(0, n_vocab, 2))[:k] if k <= (n_vocab + 1) // 2 else tuple(range(k))
    cfg = Eagle3HeadConfig(
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        target_hidden=n_embd,
        target_layers=target_layers or default_target_layers(n_layer),
        d2t=tuple(d2t),
        n_vocab=n_vocab,
        own_embeddings=own_embeddings,
        norm_before_fc=norm_before_fc,
        rms_eps=1e-5,
        context_length=int(info.metadata.get(f"{arch}.context_length", 2048)),
    )
    return write_eagle3_head(
        path, target, cfg, random_eagle3_weights(cfg, seed=seed, scale=scale), name=f"tiny-eagle3-s{seed}"
    )


def write_tiny_nextn(
    path: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 320,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_expert: int = 2,
    n_ff_exp: int = 32,
    context_length: int = 2048,
    scale: float = 1.0,
    nextn: bool = True,
    block_scale: float = 1.0,
    binary: tuple[int, int] | None = None,
) -> Path:
    """Write a tiny ``glm4moe`` GGUF with one NextN (multi-token prediction) layer; return the path.

    The trunk has ``n_layer`` dense blocks (``leading_dense_block_count`` covers them all, so no trunk
    block needs experts); the NextN block after them is a mixture-of-experts block as llama.cpp's
    glm4moe MTP graph requires (``n_expert`` routed experts, one used, one shared expert), with the
    ``nextn.eh_proj``, ``nextn.enorm``, ``nextn.hnorm`` and ``nextn.shared_head_norm`` tensors. The
    vocabulary is the tiny llama one. ``nextn=False`` writes the same trunk without the NextN block.
    ``block_scale`` scales the trunk blocks' output projections. ``binary=(A, B)`` makes the output head
    able to say only A or B (A after B and B after A when ``block_scale`` is small): the NextN block,
    which shares that head, then guesses between two tokens, so drafts are partly accepted.
    """
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    n_q, n_kv = head_dim * n_head, head_dim * n_head_kv

    def mat(*shape: int, s: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * s * scale / np.sqrt(shape[-1] / 16)).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    n_all = n_layer + (1 if nextn else 0)
    tokens, scores, types = tiny_vocab(vocab_size)
    w = gguf.GGUFWriter(str(path), "glm4moe")
    w.add_name(f"tiny-glm4moe-nextn-s{seed}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_all)
    w.add_feed_forward_length(n_ff)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(1)
    w.add_expert_shared_count(1)
    w.add_leading_dense_block_count(n_layer)
    w.add_expert_weights_scale(1.0)
    w.add_expert_weights_norm(True)
    if nextn:
        w.add_nextn_predict_layers(1)
    w.add_file_type(0)
    add_tiny_vocab(w, tokens, scores, types)
    emb = mat(vocab_size, n_embd, s=1.0)
    out = mat(vocab_size, n_embd, s=0.5)
    if binary is not None:
        a, b = binary
        out = np.zeros_like(out)
        out[a] = emb[b] - emb[a]
        out[b] = emb[a] - emb[b]
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", ones(n_embd))
    w.add_tensor("output.weight", out)
    for i in range(n_all):
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(n_q, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_q, s=0.1 * (block_scale if i < n_layer else 1)))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", ones(n_embd))
        if i < n_layer:
            w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd, s=0.2))
            w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd, s=0.2))
            w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff, s=0.1 * block_scale))
            continue
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", mat(n_expert, n_embd))
        w.add_tensor(f"blk.{i}.exp_probs_b.bias", np.zeros(n_expert, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", mat(n_expert, n_ff_exp, n_embd, s=0.2))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", mat(n_expert, n_ff_exp, n_embd, s=0.2))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", mat(n_expert, n_embd, n_ff_exp, s=0.1))
        w.add_tensor(f"blk.{i}.ffn_gate_shexp.weight", mat(n_ff_exp, n_embd, s=0.2))
        w.add_tensor(f"blk.{i}.ffn_up_shexp.weight", mat(n_ff_exp, n_embd, s=0.2))
        w.add_tensor(f"blk.{i}.ffn_down_shexp.weight", mat(n_embd, n_ff_exp, s=0.1))
        w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", mat(n_embd, 2 * n_embd))
        w.add_tensor(f"blk.{i}.nextn.enorm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.nextn.hnorm.weight", ones(n_embd))
        w.add_tensor(f"blk.{i}.nextn.shared_head_norm.weight", ones(n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
