"""A llama-architecture GGUF of realistic size with random weights, for timing on a GPU.

:func:`write_random_llama` writes, by default, a model of about 1.1 billion parameters in f16 (2 GiB):
the shape of a small Llama (width 2048, 16 blocks, grouped-query attention with 8 key/value heads,
feed-forward 8192, a 32k vocabulary), random weights from a fixed seed. Its timings are those of a real
1B model on llama.cpp; its text is not meaningful. As with the tiny fixtures
(:mod:`specviz.testing.tiny_models`), the blocks' output projections are scaled down (``block_scale``), so
the next token depends mostly on the current one, and the output rows of all but ``hot_tokens`` tokens
are damped: greedy decoding then walks a small set of tokens and falls into loops within tens of tokens
(as real models' greedy output often does), and n-gram drafting has something to copy.

The weights are drawn with variance ``1 / fan_in`` (each projection keeps its input's scale), so f16
activations stay far from overflow. Tensors are generated and written one at a time: memory stays at
about one feed-forward matrix beyond what ``gguf`` buffers.

Usage: ``python -m specviz.testing.sized_models OUT.gguf [--layers 16] [--width 2048] ...``
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .tiny_models import add_tiny_vocab, tiny_vocab


@dataclass(frozen=True)
class LlamaShape:
    """The dimensions of a llama-architecture model."""

    n_embd: int = 2048
    n_layer: int = 16
    n_head: int = 32
    n_head_kv: int = 8
    n_ff: int = 8192
    vocab_size: int = 32000
    context_length: int = 4096

    @property
    def n_params(self) -> int:
        """Parameters of the weight matrices and norms (embedding and output counted apart: not tied)."""
        e, kv = self.n_embd, self.n_embd // self.n_head * self.n_head_kv
        block = 2 * e * e + 2 * e * kv + 3 * e * self.n_ff + 2 * e
        return self.n_layer * block + 2 * self.vocab_size * e + e


def _tensor_shapes(shape: LlamaShape) -> list[tuple[str, tuple[int, ...], int]]:
    """(GGUF name, numpy shape, fan-in) of every tensor, in file order; fan-in 0 marks a norm (ones)."""
    e, ff = shape.n_embd, shape.n_ff
    kv = e // shape.n_head * shape.n_head_kv
    out: list[tuple[str, tuple[int, ...], int]] = [
        ("token_embd.weight", (shape.vocab_size, e), 1),
        ("output_norm.weight", (e,), 0),
        ("output.weight", (shape.vocab_size, e), e),
    ]
    for i in range(shape.n_layer):
        out += [
            (f"blk.{i}.attn_norm.weight", (e,), 0),
            (f"blk.{i}.attn_q.weight", (e, e), e),
            (f"blk.{i}.attn_k.weight", (kv, e), e),
            (f"blk.{i}.attn_v.weight", (kv, e), e),
            (f"blk.{i}.attn_output.weight", (e, e), -e),  # negative: an output projection (block_scale)
            (f"blk.{i}.ffn_norm.weight", (e,), 0),
            (f"blk.{i}.ffn_gate.weight", (ff, e), e),
            (f"blk.{i}.ffn_up.weight", (ff, e), e),
            (f"blk.{i}.ffn_down.weight", (e, ff), -ff),
        ]
    return out


def write_random_llama(
    path: str | Path,
    shape: LlamaShape = LlamaShape(),
    *,
    seed: int = 0,
    dtype: str = "f16",
    block_scale: float = 0.1,
    hot_tokens: int = 512,
) -> Path:
    """Write a random llama-architecture GGUF of ``shape`` to ``path`` (``dtype`` ``f16`` or ``f32``;
    norms are f32, as llama.cpp's converters write them) and return the path."""
    import gguf

    if dtype not in ("f16", "f32"):
        raise ValueError(f"dtype must be 'f16' or 'f32', not {dtype!r}")
    if shape.n_embd % shape.n_head or shape.n_head % shape.n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head, and n_head of n_head_kv")
    np_dtype = np.float16 if dtype == "f16" else np.float32
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, scores, types = tiny_vocab(shape.vocab_size)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"random-llama-{shape.n_params / 1e9:.1f}B-s{seed}")
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(shape.n_embd // shape.n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1 if dtype == "f16" else 0)  # LLAMA_FTYPE_MOSTLY_F16 / ALL_F32
    add_tiny_vocab(w, tokens, scores, types)
    specs = _tensor_shapes(shape)
    for name, shp, fan_in in specs:  # declared first (the header lists every tensor), data written below
        dt = np.float32 if fan_in == 0 else np_dtype
        w.add_tensor_info(name, shp, np.dtype(dt), int(np.prod(shp)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, fan_in in specs:
        if fan_in == 0:
            arr = np.ones(shp, dtype=np.float32)
        else:
            std = (block_scale if fan_in < 0 else 1.0) / np.sqrt(abs(fan_in))
            arr = rng.standard_normal(shp, dtype=np.float32)
            arr *= np.float32(std)
            if name == "output.weight" and 0 < hot_tokens < shape.vocab_size:
                arr[hot_tokens:] *= np.float32(0.25)  # their logits rarely win: greedy walks the hot ones
            arr = arr.astype(np_dtype, copy=False)
        w.write_tensor_data(arr)
    w.close()
    return path


def main(argv: list[str] | None = None) -> int:
    """Write a model from the command line and print its size and the time taken."""
    d = LlamaShape()
    ap = argparse.ArgumentParser(prog="python -m specviz.testing.sized_models", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--width", type=int, default=d.n_embd)
    ap.add_argument("--layers", type=int, default=d.n_layer)
    ap.add_argument("--heads", type=int, default=d.n_head)
    ap.add_argument("--kv-heads", type=int, default=d.n_head_kv)
    ap.add_argument("--ff", type=int, default=d.n_ff)
    ap.add_argument("--vocab", type=int, default=d.vocab_size)
    ap.add_argument("--dtype", choices=("f16", "f32"), default="f16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    shape = LlamaShape(a.width, a.layers, a.heads, a.kv_heads, a.ff, a.vocab)
    t0 = time.perf_counter()
    p = write_random_llama(a.out, shape, seed=a.seed, dtype=a.dtype)
    print(
        f"wrote {p}: {shape.n_params / 1e9:.2f}B parameters, {p.stat().st_size / 2**30:.2f} GiB, "
        f"{a.dtype}, in {time.perf_counter() - t0:.1f} s"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
