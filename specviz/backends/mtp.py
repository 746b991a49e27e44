"""Multi-token prediction (NextN) layers of a target, as a drafting context.

Some models carry extra "NextN" blocks after their trunk (``{arch}.nextn_predict_layers``), trained to
predict one token further from the trunk's final hidden state. llama.cpp runs them in a context of type
``LLAMA_CONTEXT_TYPE_MTP`` created from the same model with ``ctx_other`` set to the target context;
the target context outputs its hidden state for every row (``llama_set_embeddings_nextn`` unmasked),
and the MTP context decodes ``(token, hidden state)`` pairs (``llama_batch_ext`` rows with a token id
and an embedding) whose outputs are logits and the next hidden state.

:func:`mtp_problems` says why a model cannot be used (empty list: it can). The MTP graphs of the
vendored llama.cpp abort (``GGML_ASSERT``) on missing tensors or on more than one NextN block, so only
architectures whose graph requirements specviz checks are accepted (:data:`MTP_ARCHS`), each verified
with a tiny model the tests write: ``glm4moe`` and ``qwen35`` (Qwen3.5's dense series: one integrated
NextN block after a hybrid trunk, whose recurrent layers the target's memory rolls back after a rejected
draft, :mod:`specviz.backends.memory`; the MTP context itself has a plain attention cache). Every other
architecture with NextN layers is refused with its reason (:func:`mtp_problems`): llama.cpp builds MTP
graphs for more of them (:data:`MTP_GRAPH_ARCHS`) whose requirements specviz has not verified, and loads
some NextN layers without building any MTP graph. :func:`mtp_pair_problems` checks a NextN model
against its target: llama.cpp's MTP path checks the hidden width (and asserts), specviz also the
vocabulary the head's output covers.

Pairing convention (llama.cpp's): the pair at MTP position ``p`` is ``(token[p], h[p - 1])``.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from ..errors import ContextError, StrategyUnavailableError
from .binding import llama_lib
from .gguf_check import GGUFInfo
from .llama import LlamaContext, LlamaModel
from .tied_context import TiedContext

#: Architectures whose MTP graph specviz checks fully: name -> tensors (per NextN block) the graph requires.
MTP_ARCHS: dict[str, tuple[str, ...]] = {
    "glm4moe": (
        "nextn.eh_proj.weight",
        "nextn.enorm.weight",
        "nextn.hnorm.weight",
        "ffn_gate_inp.weight",
        "attn_norm.weight",
        "post_attention_norm.weight",
    ),
    # src/models/qwen35.cpp graph_mtp: a gated full-attention block fed eh_proj([enorm(e), hnorm(h)])
    "qwen35": (
        "nextn.eh_proj.weight",
        "nextn.enorm.weight",
        "nextn.hnorm.weight",
        "attn_norm.weight",
        "post_attention_norm.weight",
        "attn_q_norm.weight",
        "attn_k_norm.weight",
        "attn_output.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    ),
}

#: Architectures for which the vendored llama.cpp builds an MTP graph (``LLM_GRAPH_TYPE_DECODER_MTP`` in
#: ``src/models/*.cpp``) but specviz has not verified its requirements, with what stands in the way.
MTP_GRAPH_ARCHS: dict[str, str] = {
    "qwen35moe": "its NextN block is a mixture-of-experts block",
    "qwen3next": "its NextN block is a mixture-of-experts block",
    "deepseek2": "its NextN block uses multi-head latent attention",
    "deepseek32": "its NextN block uses sparse latent attention with an indexer",
    "deepseek4": "its NextN block uses DeepSeek-V4's hyper-connections and compressed attention",
    "glm-dsa": "its NextN block uses sparse latent attention with an indexer",
    "glm5-next": "its NextN block uses sparse latent attention",
    "hy_v3": "its NextN block is a mixture-of-experts block",
    "mimo2": "its NextN blocks use sliding-window attention",
    "step35": "it chains several NextN heads, one per draft step (llama_set_nextn_layer_offset)",
    "bailingmoe3": "its NextN block is a mixture-of-experts block",
    "cohere2moe": "its NextN block is a mixture-of-experts block",
    "nemotron_h_moe": "its NextN block is a mixture-of-experts block",
    "gemma4": "its assistant drafter shares the target's cache (llama.cpp's shared-memory MTP path)",
    "gemma4-assistant": "it shares the target's cache (llama.cpp's shared-memory MTP path)",
}


def nextn_layers(info: GGUFInfo) -> int:
    """The number of NextN blocks a GGUF declares (0 when none)."""
    v = info.metadata.get(f"{info.architecture}.nextn_predict_layers", 0)
    return int(v) if isinstance(v, (int, np.integer)) else 0


def mtp_problems(info: GGUFInfo) -> list[str]:
    """Every reason the NextN layers of the GGUF described by ``info`` cannot draft here (empty: they can)."""
    arch = info.architecture
    n = nextn_layers(info)
    if n == 0:
        return [
            f"the model ({arch}) has no NextN (multi-token prediction) layers; mtp needs a model trained "
            f"with them ({arch}.nextn_predict_layers > 0, as GLM-4.5 and Qwen3.5 ship them)"
        ]
    if arch not in MTP_ARCHS:
        supported = ", ".join(MTP_ARCHS)
        if arch in MTP_GRAPH_ARCHS:
            return [
                f"the model has {n} NextN layer(s) and llama.cpp builds a {arch} MTP graph, but specviz has not "
                f"verified its requirements ({MTP_GRAPH_ARCHS[arch]}); specviz's MTP driver runs {supported}"
            ]
        return [
            f"the model has {n} NextN layer(s), but llama.cpp loads them without building an MTP graph for "
            f"{arch} (they are kept, unused); specviz's MTP driver runs {supported}"
        ]
    if n != 1:
        return [f"the model has {n} NextN layers; llama.cpp's {arch} MTP graph runs exactly one"]
    n_all = int(info.metadata.get(f"{arch}.block_count", 0))
    il = n_all - n
    missing = [f"blk.{il}.{t}" for t in MTP_ARCHS[arch] if f"blk.{il}.{t}" not in info.tensors]
    if arch == "qwen35" and not any(f"blk.{il}.attn_{t}.weight" in info.tensors for t in ("q", "qkv")):
        missing.append(f"blk.{il}.attn_q.weight")
    if missing:
        return [f"the NextN block lacks {', '.join(missing)} (the file was converted without its MTP weights?)"]
    return []


def mtp_pair_problems(nextn: LlamaModel, target: LlamaModel) -> list[str]:
    """Why the NextN layers of the loaded model ``nextn`` cannot draft for the loaded ``target`` (empty: they
    can): the hidden state they read must be the target's width (llama.cpp asserts it) and their output
    head must cover the target's vocabulary (llama.cpp does not check it)."""
    lc = llama_lib()
    why = []
    w_n, w_t = int(lc.llama_model_n_embd_out(nextn.ptr)), int(lc.llama_model_n_embd_out(target.ptr))
    if w_n != w_t:
        why.append(f"the NextN layers read a {w_n}-wide hidden state, the target's is {w_t} wide")
    if nextn.n_vocab != target.n_vocab:
        why.append(f"the NextN head covers {nextn.n_vocab} tokens, the target's vocabulary {target.n_vocab}")
    if nextn.info.architecture != target.info.architecture:
        why.append(f"the NextN model is a {nextn.info.architecture!r} model, the target {target.info.architecture!r}")
    return why


class NextNContext(TiedContext):
    """The MTP context of a model with NextN layers, tied to a target context (see the module docstring)."""

    what = "MTP"

    def __init__(
        self, model: LlamaModel, target: LlamaContext, *, n_threads: int | None = None, n_seq: int = 1
    ) -> None:
        why = mtp_problems(model.info)
        if why:
            raise StrategyUnavailableError("; ".join(why), knob="strategy", value="mtp")
        if model.n_layer_nextn < 1:
            raise StrategyUnavailableError(
                f"{model.path} was loaded without its NextN layers", knob="strategy", value="mtp"
            )
        lc = llama_lib()
        self.model = model
        self.target = target
        self.n_embd = int(lc.llama_model_n_embd_out(model.ptr))
        if self.n_embd != int(lc.llama_model_n_embd_out(target.model.ptr)):
            raise StrategyUnavailableError(
                "the NextN model's hidden size differs from the target's", knob="strategy", value="mtp"
            )
        self.n_vocab = model.n_vocab
        # LLAMA_CONTEXT_TYPE_MTP; n_seq > 1: a draft tree's branches as sequences of a unified cache
        self._open(model, target, n_threads=n_threads, ctx_type=1, n_seq=n_seq)

    def decode(self, tokens: Sequence[int], h: np.ndarray, start: int, outputs: Sequence[int] = ()) -> None:
        """Evaluate pairs ``(tokens[i], h[i])`` at positions ``start + i``; keep outputs for rows ``outputs``."""
        self._decode_pairs(tokens, h, start, outputs, "hidden-state")


#: How many live taps keep each target context's hidden-state output on.
_NEXTN_USERS: weakref.WeakKeyDictionary[LlamaContext, int] = weakref.WeakKeyDictionary()


class TargetNextNTap:
    """Switches a target context's per-row hidden-state output on (unmasked: every batch row) and reads it."""

    def __init__(self, target: LlamaContext) -> None:
        from . import llama_ext

        self._ext = llama_ext.ext()
        self.target = target
        self.n_embd = int(llama_lib().llama_model_n_embd_out(target.model.ptr))
        # several drafters may hold the output on at once (a successor is built before its predecessor is
        # closed): count them on the context, and switch it off with the last one
        _NEXTN_USERS[target] = _NEXTN_USERS.get(target, 0) + 1
        self._ext.set_embeddings_nextn(target.ptr, True, False)
        self._on = True

    def rows(self, n: int) -> np.ndarray:
        """Hidden states of the first ``n`` rows of the target's last batch (a copy)."""
        ptr = self._ext.get_embeddings_nextn(self.target.ptr)
        if not ptr:
            raise ContextError("the target produced no hidden states (was a batch evaluated?)")
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()

    def close(self) -> None:
        """Switch the output off again (idempotent)."""
        if not self._on:
            return
        self._on = False
        _NEXTN_USERS[self.target] = _NEXTN_USERS.get(self.target, 1) - 1
        if _NEXTN_USERS[self.target] <= 0 and not self.target.closed:
            self._ext.set_embeddings_nextn(self.target.ptr, False, False)


def describe(model: Any) -> dict[str, Any]:
    """NextN facts of a loaded model (for ``specviz info``)."""
    return {"nextn_layers": int(getattr(model, "n_layer_nextn", 0)), "problems": mtp_problems(model.info)}
