"""The EAGLE-3 head as a torch module: exactly the graph of llama.cpp's ``eagle3`` architecture.

The forward pass follows ``src/models/eagle3.cpp`` of the llama.cpp that llama-cpp-python 0.3.36
vendors, operation for operation, so that a head trained here drafts in llama.cpp as it did in training
(``tests/test_train_parity.py`` runs the same inputs through both and compares the logits):

* encoder: ``g = fc(x)`` where ``x`` is the three target layers' inputs concatenated in the head's
  ``target_layers`` order, RMS-normed first with ``enc.output_norm`` when ``norm_before_fc``;
* one decoder block over the pair ``(token, g)``: ``e = rmsnorm(embd[token]) * attn_norm`` (the target's
  own token embeddings, unscaled, frozen), ``n = rmsnorm(g) * attn_norm_2``, attention input
  ``[e, n]`` (the embedding first), queries/keys/values from that 2 x width input, RoPE of llama.cpp's
  ``NORM`` kind (consecutive pairs rotated, base ``rope_freq_base``), causal softmax attention with
  scale ``1/sqrt(head width)`` and grouped key/value heads, ``attn_output``;
* residual: ``r = attn + (n if norm_before_residual else g)``; feed-forward ``down(silu(gate(f)) * up(f))``
  on ``f = rmsnorm(r) * ffn_norm``; the pre-norm output ``h = ffn + r`` (what llama.cpp hands back as the
  next step's ``g``);
* logits: ``output(rmsnorm(h) * output_norm)`` over the reduced draft vocabulary (``d2t`` maps draft id
  ``i`` to target id ``d2t[i]``; llama.cpp scatters them into a full row of ``-inf``).

Training-time test (EAGLE-3's "TTT"): :meth:`Eagle3Head.forward_steps` unrolls ``steps`` drafting steps for
every position at once. Step 0 at anchor position ``P`` is the true pair ``(t[P+1], g[P])``; step ``j``
is the pair ``(t[P+j+1], h[j-1])`` at position ``P+j``, whose attention sees the true pairs ``0..P`` and
the chain's own steps ``1..j`` — exactly what llama.cpp's cache holds while the drafter drafts after
position ``P`` (the true pairs of committed positions, then the drafted ones). The chain's tokens are
the data's tokens: a draft continues only while it matches, so the steps after a mismatch never count.

``kv_f16`` rounds keys and values through float16 as llama.cpp's default KV cache stores them (the
parity test uses it; training does not need it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from ..models.eagle3_gguf import Eagle3HeadConfig

__all__ = ["Eagle3Head", "rms_norm", "rope_norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """ggml's ``rms_norm`` (``x / sqrt(mean(x^2) + eps)``) times ``weight``."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y


def rope_norm(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """llama.cpp's ``NORM`` RoPE (consecutive pairs ``(x[2i], x[2i+1])`` rotated by ``pos * base^(-2i/d)``).

    ``x``: ``[..., T, H, D]``; ``pos``: ``[T]`` positions (or broadcastable to ``x``'s leading dims + T).
    """
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    ang = pos.to(torch.float64)[..., None] * inv  # [..., T, D/2]
    cos = torch.cos(ang).to(x.dtype)[..., None, :]  # broadcast over heads
    sin = torch.sin(ang).to(x.dtype)[..., None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2)


#: torch parameter name -> GGUF tensor name (both ``[out, in]`` for matrices).
GGUF_NAMES: dict[str, str] = {
    "fc": "fc.weight",
    "enc_norm": "enc.output_norm.weight",
    "attn_norm": "blk.0.attn_norm.weight",
    "attn_norm_2": "blk.0.attn_norm_2.weight",
    "wq": "blk.0.attn_q.weight",
    "wk": "blk.0.attn_k.weight",
    "wv": "blk.0.attn_v.weight",
    "wo": "blk.0.attn_output.weight",
    "ffn_norm": "blk.0.ffn_norm.weight",
    "ffn_gate": "blk.0.ffn_gate.weight",
    "ffn_up": "blk.0.ffn_up.weight",
    "ffn_down": "blk.0.ffn_down.weight",
    "output_norm": "output_norm.weight",
    "output": "output.weight",
}


class Eagle3Head(nn.Module):
    """An EAGLE-3 head of shape ``cfg`` whose forward pass is llama.cpp's ``eagle3`` graph.

    ``embed_rows`` (``[R, n_embd]`` float32) are the target's token embedding rows this head may need and
    ``embed_index`` (``[n_vocab]`` int64, -1 for absent ids) maps a target id to its row; with
    ``embed_index=None`` the rows are the whole table. They are buffers: the head borrows the target's
    embeddings at run time, so they are never trained or exported.
    """

    embed_rows: torch.Tensor
    embed_index: torch.Tensor
    d2t: torch.Tensor
    t2d: torch.Tensor

    def __init__(
        self, cfg: Eagle3HeadConfig, embed_rows: torch.Tensor, embed_index: torch.Tensor | None = None, *, seed: int = 0
    ) -> None:
        super().__init__()
        cfg.check()
        if cfg.own_embeddings:
            raise ValueError("training a head with its own token embeddings is not supported; borrow the target's")
        self.cfg = cfg
        e, th, hd = cfg.n_embd, cfg.target_hidden, cfg.head_dim
        n_q, n_kv = hd * cfg.n_head, hd * cfg.n_head_kv
        g = torch.Generator().manual_seed(seed)

        def mat(rows: int, cols: int, scale: float = 1.0) -> nn.Parameter:
            return nn.Parameter(torch.randn(rows, cols, generator=g) * (scale / math.sqrt(cols)))

        def ones(n: int) -> nn.Parameter:
            return nn.Parameter(torch.ones(n))

        self.fc = mat(e, 3 * th)
        self.enc_norm = ones(3 * th) if cfg.norm_before_fc else None
        self.attn_norm = ones(e)
        self.attn_norm_2 = ones(e)
        self.wq = mat(n_q, 2 * e)
        self.wk = mat(n_kv, 2 * e)
        self.wv = mat(n_kv, 2 * e)
        self.wo = mat(e, n_q, 0.5)
        self.ffn_norm = ones(e)
        self.ffn_gate = mat(cfg.n_ff, e)
        self.ffn_up = mat(cfg.n_ff, e)
        self.ffn_down = mat(e, cfg.n_ff, 0.5)
        self.output_norm = ones(e)
        self.output = mat(cfg.n_draft_vocab, e)
        self.register_buffer("embed_rows", embed_rows.to(torch.float32).contiguous(), persistent=False)
        if embed_index is None:
            embed_index = torch.arange(embed_rows.shape[0], dtype=torch.int64)
        self.register_buffer("embed_index", embed_index.to(torch.int64), persistent=False)
        d2t = torch.as_tensor(np.asarray(cfg.d2t, dtype=np.int64))
        t2d = torch.full((cfg.n_vocab,), -1, dtype=torch.int64)
        t2d[d2t] = torch.arange(len(d2t), dtype=torch.int64)
        self.register_buffer("d2t", d2t, persistent=False)
        self.register_buffer("t2d", t2d, persistent=False)
        self.kv_f16 = False

    # -- pieces ----------------------------------------------------------------------------------------
    @property
    def eps(self) -> float:
        """The RMS-norm epsilon (``attention.layer_norm_rms_epsilon``)."""
        return float(self.cfg.rms_eps)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's (unscaled) token embedding rows of ``tokens``."""
        idx = self.embed_index[tokens]
        if bool((idx < 0).any()):
            missing = tokens[idx < 0].unique()[:5].tolist()
            raise ValueError(f"token ids {missing} have no embedding row in this head's table")
        return self.embed_rows[idx]

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """``g`` from target features ``[..., 3 x target hidden]`` (the encoder graph)."""
        x = features
        if self.enc_norm is not None:
            x = rms_norm(x, self.enc_norm, self.eps)
        return x @ self.fc.t()

    def _qkv(
        self, tokens: torch.Tensor, g: torch.Tensor, pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v, residual) of pairs ``(tokens, g)`` at positions ``pos``; q/k/v as ``[B, T, heads, D]``."""
        cfg = self.cfg
        en = rms_norm(self.embed(tokens), self.attn_norm, self.eps)
        gn = rms_norm(g, self.attn_norm_2, self.eps)
        resid = gn if cfg.norm_before_residual else g
        x = torch.cat((en, gn), dim=-1)  # ggml_concat(embd_norm, g_norm): the embedding comes first
        B, T = x.shape[0], x.shape[1]
        hd = cfg.head_dim
        q = (x @ self.wq.t()).view(B, T, cfg.n_head, hd)
        k = (x @ self.wk.t()).view(B, T, cfg.n_head_kv, hd)
        v = (x @ self.wv.t()).view(B, T, cfg.n_head_kv, hd)
        q = rope_norm(q, pos, cfg.rope_freq_base)
        k = rope_norm(k, pos, cfg.rope_freq_base)
        if self.kv_f16:
            k, v = k.half().float(), v.half().float()
        return q, k, v, resid

    def _finish(self, attn: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        """The pre-norm output from the attention heads' output ``[B, T, n_q]`` and the residual."""
        r = attn @ self.wo.t() + resid
        f = rms_norm(r, self.ffn_norm, self.eps)
        y = (nn.functional.silu(f @ self.ffn_gate.t()) * (f @ self.ffn_up.t())) @ self.ffn_down.t()
        return y + r

    def logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits from pre-norm outputs."""
        return rms_norm(prenorm, self.output_norm, self.eps) @ self.output.t()

    # -- the unrolled drafting steps ---------------------------------------------------------------------
    def forward_steps(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        steps: int,
        positions: torch.Tensor | None = None,
        start: int = 0,
    ) -> list[torch.Tensor]:
        """Pre-norm outputs of ``steps`` drafting steps at every anchor from ``start`` on (see the module docstring).

        ``tokens``: ``[B, T + steps]`` target ids (``t[0] …``); ``features``: ``[B, T, 3 x target hidden]``
        (row ``P`` from evaluating ``t[P]``); returns ``steps`` tensors ``[B, T - start, n_embd]``: entry ``j``
        row ``P - start`` is the output of the pair at position ``P + j`` in the chain anchored at ``P``, which
        predicts ``t[P + j + 2]``. ``positions`` (``[T]`` or ``[B, T]``, default ``0 … T-1``) are the anchors'
        positions. Anchors before ``start`` serve only as keys and values (context) of the true pairs: their
        queries, feed-forward and chains are never computed (training starts there when the prompt has no
        labels); the outputs from ``start`` on are the same as without it.
        """
        B, T = features.shape[0], features.shape[1]
        if tokens.shape[1] < T + steps:
            raise ValueError(f"tokens must hold T + steps = {T + steps} columns, got {tokens.shape[1]}")
        if not 0 <= start < T:
            raise ValueError(f"start must lie in [0, {T}), got {start}")
        cfg = self.cfg
        rep = cfg.n_head // cfg.n_head_kv
        scale = 1.0 / math.sqrt(cfg.head_dim)
        pos = positions if positions is not None else torch.arange(T, device=features.device)
        n = T - start
        # query anchor start + i sees the true pairs 0 .. start + i
        causal = torch.ones(T, T, dtype=torch.bool, device=features.device).tril()[start:]
        g = self.encode(features)
        # step 0 over every anchor for its keys and values; queries only from start on
        q, k, v, resid = self._qkv(tokens[:, 1 : 1 + T], g, pos)
        k0 = k.repeat_interleave(rep, dim=2)
        v0 = v.repeat_interleave(rep, dim=2)
        q, resid = q[:, start:], resid[:, start:]
        pos_q = pos[..., start:]
        chain_k: list[torch.Tensor] = []
        chain_v: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        h = g  # replaced by each step's pre-norm output
        for j in range(steps):
            if j > 0:
                q, k, v, resid = self._qkv(tokens[:, start + j + 1 : T + j + 1], h, pos_q + j)
                chain_k.append(k.repeat_interleave(rep, dim=2))
                chain_v.append(v.repeat_interleave(rep, dim=2))
            # scores against the true pairs 0..P: [B, H, n (query), T (key)]
            s0 = torch.einsum("bqhd,bkhd->bhqk", q, k0) * scale
            s0 = s0.masked_fill(~causal, float("-inf"))
            if chain_k:  # and against the chain's own pairs at P+1 .. P+j (same anchor: elementwise)
                sd = torch.stack([(q * ck).sum(-1) for ck in chain_k], dim=-1) * scale  # [B, n, H, j]
                sc = torch.cat((s0, sd.permute(0, 2, 1, 3)), dim=-1)
            else:
                sc = s0
            p = torch.softmax(sc, dim=-1)
            out = torch.einsum("bhqk,bkhd->bqhd", p[..., :T], v0)
            for i, cv in enumerate(chain_v):
                out = out + p[..., T + i].permute(0, 2, 1)[..., None] * cv
            h = self._finish(out.reshape(B, n, -1), resid)
            outs.append(h)
        return outs

    # -- export ------------------------------------------------------------------------------------------
    def gguf_weights(self) -> dict[str, np.ndarray]:
        """Every tensor :func:`specviz.models.eagle3_gguf.write_eagle3_head` needs, by GGUF name (float32 numpy)."""
        out: dict[str, np.ndarray] = {}
        for attr, name in GGUF_NAMES.items():
            t = getattr(self, attr)
            if t is None:
                continue
            out[name] = t.detach().to(torch.float32).cpu().numpy().copy()
        return out

    def config_dict(self) -> dict[str, Any]:
        """The head's shape as plain data (for checkpoints)."""
        c = self.cfg
        return {
            "n_embd": c.n_embd,
            "n_head": c.n_head,
            "n_head_kv": c.n_head_kv,
            "n_ff": c.n_ff,
            "target_hidden": c.target_hidden,
            "target_layers": list(c.target_layers),
            "d2t": list(c.d2t),
            "n_vocab": c.n_vocab,
            "norm_before_fc": c.norm_before_fc,
            "norm_before_residual": c.norm_before_residual,
            "rms_eps": c.rms_eps,
            "rope_freq_base": c.rope_freq_base,
            "context_length": c.context_length,
        }
