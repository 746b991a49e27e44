"""Write EAGLE-3 draft heads as GGUF files that llama.cpp's ``eagle3`` architecture loads.

An EAGLE-3 head (llama.cpp ``src/models/eagle3.cpp``, vendored by llama-cpp-python 0.3.36) is one
decoder block that drafts from the target's own hidden states:

* an encoder, ``fc``: the inputs of three target layers, concatenated (3 x target hidden), projected
  to the head's width (optionally RMS-normed first, ``norm_before_fc``);
* one decoder block whose attention reads ``[rmsnorm(token embedding), rmsnorm(g)]`` (2 x width),
  where ``g`` is the encoder output (first step) or the block's own pre-norm output (later steps);
* ``output_norm`` and an ``output`` head over a *reduced draft vocabulary*, and ``d2t``: for each
  draft id the absolute target token id (int64), which llama.cpp scatters back into a full-vocabulary
  logits row (other entries are -inf).

Token embeddings are borrowed from the target when the head has none (its width must then equal the
target's). The head carries the target's tokenizer, copied byte for byte from the target GGUF, so
llama.cpp sees the same vocabulary in both files.

:func:`write_eagle3_head` writes given weights; :func:`random_eagle3_weights` makes random ones of a
given shape (for plumbing tests and cost benchmarks — a random head drafts nonsense, losslessly).
Names and shapes follow llama.cpp's loader exactly; numpy shapes are ggml's reversed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..errors import KnobError, ModelFormatError, ModelNotFoundError
from .gguf_raw import RawValue, raw_writer_class

__all__ = [
    "EAGLE3_ARCH",
    "Eagle3HeadConfig",
    "coverage_d2t",
    "default_target_layers",
    "eagle3_tensor_shapes",
    "random_eagle3_weights",
    "write_eagle3_head",
]

EAGLE3_ARCH = "eagle3"


def default_target_layers(n_layer: int) -> tuple[int, int, int]:
    """The three target layers whose *inputs* feed the head: the official converter's ``[2, N/2, N-3]``,
    clamped into ``[0, N-1]`` for very shallow targets (the tiny test models)."""
    if n_layer < 1:
        raise KnobError(
            f"target_layers: a target with {n_layer} layers has no layer to read", knob="target_layers", value=n_layer
        )
    raw = (2, n_layer // 2, n_layer - 3)
    return tuple(min(max(x, 0), n_layer - 1) for x in raw)  # type: ignore[return-value]


@dataclass(frozen=True)
class Eagle3HeadConfig:
    """The shape of an EAGLE-3 head.

    ``target_layers``: the three target layers whose inputs are captured (each in ``[0, n_layer)``).
    ``d2t``: absolute target id of each draft id (its length is the draft vocabulary size).
    ``own_embeddings``: write a ``token_embd`` of the target's vocabulary; otherwise the head borrows
    the target's at run time (then ``n_embd`` must equal ``target_hidden``).
    """

    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    target_hidden: int
    target_layers: tuple[int, int, int]
    d2t: tuple[int, ...]
    n_vocab: int
    own_embeddings: bool = False
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    rms_eps: float = 1e-6
    rope_freq_base: float = 10000.0
    context_length: int = 8192

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.n_embd // self.n_head

    @property
    def n_draft_vocab(self) -> int:
        """Size of the reduced draft vocabulary."""
        return len(self.d2t)

    def check(self) -> None:
        """Refuse shapes llama.cpp's loader or graph would reject (or abort on)."""

        def bad(name: str, value: object, why: str) -> KnobError:
            return KnobError(f"EAGLE-3 head {name}={value!r}: {why}", knob=name, value=value)

        for name in ("n_embd", "n_head", "n_head_kv", "n_ff", "target_hidden", "n_vocab"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise bad(name, v, "expected a positive integer")
        if self.n_embd % self.n_head:
            raise bad("n_head", self.n_head, f"must divide n_embd={self.n_embd}")
        if self.n_head % self.n_head_kv:
            raise bad("n_head_kv", self.n_head_kv, f"must divide n_head={self.n_head}")
        if self.head_dim % 2:
            raise bad("n_head", self.n_head, f"gives an odd head width {self.head_dim} (RoPE needs an even one)")
        if len(self.target_layers) != 3:
            raise bad("target_layers", self.target_layers, "llama.cpp's eagle3 needs exactly 3 layers")
        if any(int(x) < 0 for x in self.target_layers):
            raise bad("target_layers", self.target_layers, "layer indices must be >= 0")
        if not self.d2t:
            raise bad("d2t", "()", "the draft vocabulary is empty")
        d = np.asarray(self.d2t, dtype=np.int64)
        if d.min() < 0 or d.max() >= self.n_vocab:
            raise bad("d2t", f"[{d.min()}..{d.max()}]", f"target ids must lie in [0, {self.n_vocab - 1}]")
        if len(np.unique(d)) != len(d):
            raise bad("d2t", f"{len(d)} ids", "a target id is listed twice")
        if not self.own_embeddings and self.n_embd != self.target_hidden:
            raise bad(
                "n_embd",
                self.n_embd,
                f"a head that borrows the target's embeddings must be as wide as the "
                f"target ({self.target_hidden}); pass own_embeddings=True otherwise",
            )


def eagle3_tensor_shapes(cfg: Eagle3HeadConfig) -> dict[str, tuple[int, ...]]:
    """Every float tensor of a head of shape ``cfg`` with its numpy shape (``d2t`` excluded)."""
    e, hd = cfg.n_embd, cfg.head_dim
    n_q, n_kv = hd * cfg.n_head, hd * cfg.n_head_kv
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (e, 3 * cfg.target_hidden),
        "output_norm.weight": (e,),
        "output.weight": (cfg.n_draft_vocab, e),
        "blk.0.attn_norm.weight": (e,),
        "blk.0.attn_norm_2.weight": (e,),
        "blk.0.attn_q.weight": (n_q, 2 * e),
        "blk.0.attn_k.weight": (n_kv, 2 * e),
        "blk.0.attn_v.weight": (n_kv, 2 * e),
        "blk.0.attn_output.weight": (e, n_q),
        "blk.0.ffn_norm.weight": (e,),
        "blk.0.ffn_gate.weight": (cfg.n_ff, e),
        "blk.0.ffn_up.weight": (cfg.n_ff, e),
        "blk.0.ffn_down.weight": (e, cfg.n_ff),
    }
    if cfg.norm_before_fc:
        shapes["enc.output_norm.weight"] = (3 * cfg.target_hidden,)
    if cfg.own_embeddings:
        shapes["token_embd.weight"] = (cfg.n_vocab, e)
    return shapes


def random_eagle3_weights(cfg: Eagle3HeadConfig, *, seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Random f32 tensors of a head of shape ``cfg``, by GGUF tensor name (numpy shapes).

    Matrices are drawn with variance ``scale**2 / fan_in``; norms are ones.
    """
    cfg.check()
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shp in eagle3_tensor_shapes(cfg).items():
        if len(shp) == 1:
            out[name] = np.ones(shp, dtype=np.float32)
        else:
            out[name] = (rng.standard_normal(shp, dtype=np.float32) * (scale / np.sqrt(shp[1]))).astype(np.float32)
    return out


def _tokenizer_values(target: Path) -> tuple[int, list[tuple[str, int, int | None, bytes, int]]]:
    """(vocabulary size, [(key, value type, array item type, stored value bytes, item count)]) of every
    ``tokenizer.*`` key of the target GGUF, read with specviz's own scanner (the ``gguf`` package's reader
    needs tens of seconds for a 262144-token vocabulary)."""
    import struct

    from ..backends.gguf_check import check_gguf

    info = check_gguf(target)
    tok = info.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tok, int):
        raise ModelFormatError(
            f"{str(target)!r} has no tokenizer (tokenizer.ggml.tokens); an EAGLE-3 head needs the target's vocabulary"
        )
    out = []
    with open(target, "rb") as f:
        for key, (vtype, start, end) in info.spans.items():
            if not key.startswith("tokenizer."):
                continue
            f.seek(start)
            raw = f.read(end - start)
            sub, count = None, 1
            if vtype == 9:  # array: item type (u32) and count (u64) lead the stored value
                sub, count = struct.unpack("<IQ", raw[:12])
            out.append((key, vtype, sub, raw, count))
    return tok, out


#: Storage types of a head's matrices -> llama.cpp file type id.
_DTYPES = {"f32": 0, "f16": 1, "q8_0": 7}


def _add_matrix(w: object, name: str, a: np.ndarray, dtype: str) -> None:
    """Add one tensor: vectors (norms) as f32, matrices in ``dtype``."""
    from gguf import GGMLQuantizationType, quants

    if a.ndim < 2 or dtype == "f32":
        w.add_tensor(name, a)  # type: ignore[attr-defined]
    elif dtype == "f16":
        w.add_tensor(name, a.astype(np.float16))  # type: ignore[attr-defined]
    else:
        if a.shape[-1] % 32:
            w.add_tensor(name, a.astype(np.float16))  # type: ignore[attr-defined]  # Q8_0 needs rows of 32k
            return
        q = quants.quantize(a, GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=GGMLQuantizationType.Q8_0)  # type: ignore[attr-defined]


def write_eagle3_head(
    path: str | Path,
    target: str | Path,
    cfg: Eagle3HeadConfig,
    weights: Mapping[str, np.ndarray],
    *,
    name: str = "specviz eagle3 head",
    extra_metadata: Mapping[str, object] | None = None,
    dtype: str = "f32",
) -> Path:
    """Write an EAGLE-3 head GGUF to ``path`` with the tokenizer of the ``target`` GGUF.

    ``weights`` maps GGUF tensor names to numpy arrays of the shapes :func:`random_eagle3_weights`
    produces. ``dtype`` is the storage of the matrices: ``f32``, ``f16`` or ``q8_0`` (norms stay f32, as
    llama.cpp's converters keep them). On a CPU a one-token step reads every weight once, so a smaller
    type makes the head's step proportionally cheaper. The file is written next to ``path`` and
    renamed, so a failure leaves nothing half-written. ``extra_metadata`` adds ``specviz.*`` keys.

    With ``f16`` and no norm before ``fc``, ``fc`` stays f32 (deliberate; llama.cpp's converters would
    write it f16): llama.cpp's CPU product of an f16 matrix rounds its input to f16 first, and the raw layer
    inputs of some targets leave f16's range (Gemma 3 270M's reach 1e5, f16 ends at 65504), which turned
    every logit of such a head into a non-finite value. Q8_0 scales each block of the input, so it is safe.
    """
    from gguf import GGUFValueType

    cfg.check()
    if dtype not in _DTYPES:
        raise KnobError(
            f"dtype {dtype!r} is not allowed; choose one of {', '.join(_DTYPES)}", knob="dtype", value=dtype
        )
    path, target = Path(path), Path(target)
    if not target.is_file():
        raise ModelNotFoundError(f"target model {str(target)!r} does not exist; pass the target's .gguf file")
    shapes = eagle3_tensor_shapes(cfg)
    missing = sorted(set(shapes) - set(weights))
    if missing:
        raise KnobError(
            f"EAGLE-3 head weights: missing tensor(s) {', '.join(missing)}", knob="weights", value=missing[0]
        )
    for k, shp in shapes.items():
        if tuple(np.shape(weights[k])) != shp:
            raise KnobError(
                f"EAGLE-3 head weights: {k} has shape {tuple(np.shape(weights[k]))}, expected {shp}",
                knob="weights",
                value=k,
            )
    n_vocab_target, tok_values = _tokenizer_values(target)
    if n_vocab_target != cfg.n_vocab:
        raise KnobError(
            f"EAGLE-3 head n_vocab={cfg.n_vocab} but the target's vocabulary has {n_vocab_target} tokens",
            knob="n_vocab",
            value=cfg.n_vocab,
        )

    part = Path(str(path) + ".part")
    w = raw_writer_class()(str(part), EAGLE3_ARCH)
    try:
        w.add_name(name)
        w.add_context_length(cfg.context_length)
        w.add_embedding_length(cfg.n_embd)
        w.add_block_count(1)
        w.add_feed_forward_length(cfg.n_ff)
        w.add_head_count(cfg.n_head)
        w.add_head_count_kv(cfg.n_head_kv)
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_rope_freq_base(cfg.rope_freq_base)
        w.add_layer_norm_rms_eps(cfg.rms_eps)
        w.add_file_type(_DTYPES[dtype])
        w.add_key_value(
            f"{EAGLE3_ARCH}.target_layers",
            [int(x) for x in cfg.target_layers],
            GGUFValueType.ARRAY,
            GGUFValueType.INT32,
        )
        w.add_key_value(f"{EAGLE3_ARCH}.target_hidden_size", int(cfg.target_hidden), GGUFValueType.UINT32)
        w.add_key_value(f"{EAGLE3_ARCH}.norm_before_residual", bool(cfg.norm_before_residual), GGUFValueType.BOOL)
        w.add_key_value(f"{EAGLE3_ARCH}.norm_before_fc", bool(cfg.norm_before_fc), GGUFValueType.BOOL)
        for key, value in (extra_metadata or {}).items():
            vt = (
                GGUFValueType.STRING
                if isinstance(value, str)
                else GGUFValueType.FLOAT32
                if isinstance(value, float)
                else GGUFValueType.INT64
            )
            w.add_key_value(f"specviz.{key}", value, vt)
        for key, vtype, sub, raw, count in tok_values:  # stored bytes: exact, and fast for 262k vocabularies
            w.add_key_value(
                key,
                RawValue(raw, max(1, count)),
                GGUFValueType(vtype),
                GGUFValueType(sub) if sub is not None else None,
            )
        for k in shapes:
            raw_input = k == "fc.weight" and dtype == "f16" and not cfg.norm_before_fc
            _add_matrix(w, k, np.ascontiguousarray(weights[k], dtype=np.float32), "f32" if raw_input else dtype)
        w.add_tensor("d2t", np.asarray(cfg.d2t, dtype=np.int64))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        part.replace(path)
    except BaseException:
        try:
            w.close()
        except Exception:
            pass
        part.unlink(missing_ok=True)
        raise
    return path


def coverage_d2t(token_counts: Sequence[int] | np.ndarray, n_draft: int) -> tuple[int, ...]:
    """The ``n_draft`` most frequent target ids (ties by id), ascending: a draft vocabulary for ``d2t``."""
    counts = np.asarray(token_counts, dtype=np.int64)
    n_draft = min(int(n_draft), len(counts))
    order = np.lexsort((np.arange(len(counts)), -counts))[:n_draft]
    return tuple(int(x) for x in np.sort(order))
