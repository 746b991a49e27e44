"""What a model (or a target and draft pair) is, and which strategies can run on it: ``specviz info``.

:func:`model_info` loads the GGUF (checked first, like every model specviz opens) and reports its
architecture, depth, width, vocabulary, trained context, sliding window, NextN layers, whether its layer
inputs can be read (the EAGLE-3 and DFlash features) and how, whether it carries a chat template, what an
EAGLE-3 head or a DFlash draft declares (its target layers, block size, mask token, DSpark's heads,
DFlash-2's selector), its memory kind and how a rejected draft is dropped from it
(:mod:`specviz.backends.memory`, probed on a small context with the options given) — and for every
strategy whether it can run with this model (and the draft model, when one is given) and, if not, why,
then how chains of them combine. The answers come from the same checks the strategies make when they
are configured, so ``info`` and ``start`` never disagree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.capture import capture_method, capture_unavailable_reason
from ..backends.context_settings import CACHE_TYPES, ContextSettings, cache_types_for, head_sizes
from ..backends.dflash import read_dflash_head
from ..backends.eagle3 import eagle3_problems, read_eagle3_head
from ..backends.mtp import mtp_pair_problems, mtp_problems, nextn_layers
from ..errors import KnobError
from ..models.embedded import resolve_model

__all__ = ["ModelInfo", "StrategyFit", "model_info"]

_FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


@dataclass(frozen=True)
class StrategyFit:
    """Whether a strategy can run: ``ok``, else ``why`` (``needs`` names a missing input, e.g. a draft model)."""

    strategy: str
    ok: bool
    why: str | None = None
    needs: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"strategy": self.strategy, "ok": self.ok, "why": self.why, "needs": self.needs}


@dataclass(frozen=True)
class ModelInfo:
    """The facts :func:`model_info` reports (see the module docstring)."""

    path: str
    architecture: str | None
    name: str | None
    file_type: str | None
    size_bytes: int
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    sliding_window: int
    nextn_layers: int
    layer_capture: str | None
    layer_capture_why: str | None
    chat_template: bool
    eagle3_head: dict[str, Any] | None = None
    draft_model: dict[str, Any] | None = None
    strategies: list[StrategyFit] = field(default_factory=list)
    memory: dict[str, Any] | None = None
    memory_text: str | None = None
    head_sizes: tuple[int, int] = (0, 0)  #: the K and V head sizes
    cache_types: list[str] = field(default_factory=list)  #: the KV cache types these heads allow
    settings: dict[str, Any] | None = None  #: the context settings asked about (specviz info -fa ... -ctk ...)
    settings_why: str | None = None  #: why those settings cannot be used with this model (None: they can)
    dflash_head: dict[str, Any] | None = None
    #: what a chain of the strategies that run here may hold (see specviz.strategies.chain)
    chains: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        d = dict(self.__dict__)
        d["strategies"] = [s.to_dict() for s in self.strategies]
        return d

    def format(self) -> str:
        """Human-readable text (what ``specviz info`` prints)."""
        how = "llama.cpp layer-input taps" if self.layer_capture == "api" else "the C eval-callback shim"
        cap = f"yes, through {how}" if self.layer_capture else f"no ({self.layer_capture_why})"
        rows = [
            ("model", self.path),
            ("architecture", f"{self.architecture}" + (f" ({self.name})" if self.name else "")),
            ("file type", f"{self.file_type or '?'}, {self.size_bytes / 1e6:.1f} MB"),
            ("layers", str(self.n_layer)),
            ("hidden size", str(self.n_embd)),
            ("vocabulary", f"{self.n_vocab} tokens"),
            ("context", f"{self.n_ctx_train} (trained)"),
            ("sliding window", str(self.sliding_window) if self.sliding_window else "none"),
            ("NextN layers", str(self.nextn_layers)),
            ("layer capture", cap),
            ("chat template", "yes" if self.chat_template else "no"),
            ("head sizes", f"K {self.head_sizes[0]}, V {self.head_sizes[1]}"),
            ("KV cache types", ", ".join(self.cache_types) + _quantized_note(self.cache_types)),
        ]
        if self.memory_text:
            rows.append(("memory", self.memory_text))
        if self.settings is not None:
            given = [(flag, self.settings[k]) for k, flag in ContextSettings.FLAGS.items() if self.settings[k]]
            verdict = "ok" if self.settings_why is None else f"refused: {self.settings_why}"
            rows.append(("context settings", " ".join(f"{f} {v}" for f, v in given) + f": {verdict}"))
        if self.eagle3_head:
            h = self.eagle3_head
            rows.append(
                (
                    "EAGLE-3 head",
                    f"reads target layers {h['target_layers']} of a {h['target_hidden']}-wide "
                    f"target; draft vocabulary {h['n_draft_vocab']} of {h['n_vocab']}",
                )
            )
        for dh in (self.dflash_head, (self.draft_model or {}).get("dflash_head")):
            if dh:
                rows.append(("DFlash draft", _describe_dflash(dh)))
        if self.draft_model:
            dm = self.draft_model
            rows.append(
                (
                    "draft model",
                    f"{dm['path']} ({dm['architecture']}, {dm['n_layer']} layer{'s' if dm['n_layer'] != 1 else ''})",
                )
            )
        w = max(len(k) for k, _ in rows)
        out = [f"{k:<{w}}  {v}" for k, v in rows]
        out.append("strategies")
        sw = max(len(s.strategy) for s in self.strategies) if self.strategies else 0
        for s in self.strategies:
            verdict = "yes" if s.ok else (f"needs {s.needs}" if s.needs and not s.why else f"no: {s.why}")
            out.append(f"  {s.strategy:<{sw}}  {verdict}")
        if self.chains:
            out.append(f"chains  {self.chains}")
        return "\n".join(out)


def _describe_dflash(h: dict[str, Any]) -> str:
    """One line for a DFlash draft: kind, block, mask token, target layers and the variant's heads."""
    kind = {"dflash": "DFlash", "dspark": "DSpark", "dflash2": "DFlash-2"}.get(h["kind"], h["kind"])
    parts = [
        f"{kind} (--spec-type draft-{'dspark' if h['dspark'] else 'dflash'})",
        f"block {h['block_size']}{'' if h['block_size_declared'] else ' (llama.cpp default)'} "
        f"= {h['max_draft']} draft positions{' anchor-first' if h['anchor_drafts'] else ''}",
        f"mask token {h['mask_token'] if h['mask_token'] is not None else 'none'}",
        f"reads target layers {h['target_layers']}",
    ]
    if h["dspark"]:
        parts.append("confidence head " + ("yes" if h["confidence_head"] else "no (draft_p_min must stay 0)"))
    if h["selector_top_k"]:
        parts.append(f"selector over the top {h['selector_top_k']}")
    if h["has_d2t"]:
        parts.append(f"draft vocabulary {h['n_draft_vocab']}")
    return "; ".join(parts)


def _capture(arch: str | None) -> tuple[str | None, str | None]:
    why = capture_unavailable_reason(arch)
    return (capture_method(arch), None) if why is None else (None, why)


def _fits(target: Any, tinfo: Any, draft: Any | None, dinfo: Any | None, memory: Any = None) -> list[StrategyFit]:
    """Every strategy's verdict for this target (and draft); ``memory`` is the target's
    :class:`~specviz.backends.memory.MemoryInfo` (None: not probed)."""
    from ..backends.memory import rollback_refusal
    from ..models.vocab import vocab_differences
    from ..strategies import strategy_class, strategy_names

    refusal = rollback_refusal(memory) if memory is not None else None
    if refusal is not None:
        return [
            StrategyFit(n, not strategy_class(n).drafts, None if not strategy_class(n).drafts else refusal)
            for n in strategy_names()
        ]

    arch = tinfo.architecture
    out: list[StrategyFit] = []
    if arch in ("eagle3", "dflash"):
        what = "an EAGLE-3 head" if arch == "eagle3" else "a DFlash draft"
        why = (
            f"{what} drafts for a target and cannot generate alone; pass its target as MODEL and the "
            f"{'head' if arch == 'eagle3' else 'draft'} with --draft-model"
        )
        return [StrategyFit(n, False, why) for n in strategy_names()]
    d_arch = dinfo.architecture if dinfo is not None else None
    vocab_diff = None
    if draft is not None:
        diffs = vocab_differences(target.ptr, draft.ptr)
        vocab_diff = diffs[0].describe() if diffs else None
    for name in strategy_names():
        if name == "draft":
            if draft is None:
                out.append(StrategyFit(name, False, None, "--draft-model DRAFT.gguf"))
            elif d_arch == "eagle3":
                out.append(StrategyFit(name, False, "the draft model is an EAGLE-3 head; use --strategy eagle3"))
            elif d_arch == "dflash":
                out.append(
                    StrategyFit(name, False, "the draft model is a DFlash draft; use --strategy dflash or dspark")
                )
            elif vocab_diff:
                out.append(StrategyFit(name, False, f"the vocabularies differ ({vocab_diff})"))
            else:
                out.append(StrategyFit(name, True))
        elif name == "eagle3":
            cap_why = capture_unavailable_reason(arch)
            if draft is None:
                need = "--draft-model HEAD.gguf (an EAGLE-3 head for this model)"
                no_read = f"the target's hidden states cannot be read: {cap_why}" if cap_why else None
                out.append(StrategyFit(name, False, no_read, need))
                continue
            why_list = eagle3_problems(
                draft.path,
                target_arch=arch,
                target_n_layer=target.n_layer,
                target_n_embd=target.n_embd,
                target_n_vocab=target.n_vocab,
                head_info=dinfo,
            )
            if vocab_diff and d_arch == "eagle3":
                why_list.append(f"the vocabularies differ ({vocab_diff})")
            if cap_why:
                why_list.append(f"the target's hidden states cannot be read: {cap_why}")
            out.append(StrategyFit(name, not why_list, "; ".join(why_list) or None))
        elif name == "mtp":
            src_model = draft if draft is not None and d_arch not in ("eagle3", "dflash") else target
            why_list = mtp_problems(src_model.info) or mtp_pair_problems(src_model, target)
            out.append(StrategyFit(name, not why_list, "; ".join(why_list) or None))
        elif name in ("dflash", "dspark"):
            from ..strategies import strategy_schema
            from ..strategies.dflash import dflash_unusable_reasons

            if draft is None:
                need = f"--draft-model DRAFT.gguf (a {'DSpark' if name == 'dspark' else 'DFlash'} draft for this model)"
                cap_why = capture_unavailable_reason(arch)
                no_read = f"the target's hidden states cannot be read: {cap_why}" if cap_why else None
                out.append(StrategyFit(name, False, no_read, need))
                continue
            config = {**strategy_schema(name).defaults(), "draft_model": str(draft.path)}
            why_list = dflash_unusable_reasons(target, config, dspark=name == "dspark")
            if vocab_diff and d_arch == "dflash":
                why_list.append(f"the vocabularies differ ({vocab_diff})")
            out.append(StrategyFit(name, not why_list, "; ".join(why_list) or None))
        else:
            out.append(StrategyFit(name, True))
    return out


def _chains(fits: list[StrategyFit]) -> str | None:
    """What a chain (``--spec-type A,B``) of the strategies that run here may hold, in llama.cpp's order."""
    from ..strategies import CHAIN_PRIORITY, strategy_class

    ok = [f.strategy for f in fits if f.ok and f.strategy != "none"]
    if len(ok) < 2:
        return None
    order = [n for n in CHAIN_PRIORITY if n in ok]
    model = [n for n in order if strategy_class(n).needs_model]
    rule = f"; at most one of {', '.join(model)}" if len(model) > 1 else ""
    return f"any comma list of {', '.join(order)}{rule}; asked in that order, the first that drafts wins"


def _memory(model: Any, swa_full: bool, n_rs_seq: int | None) -> Any:
    """The memory facts of ``model`` on a small context made with these options (the byte figures are for
    that context's 512 positions; the kind and the removal type do not depend on the size)."""
    from ..backends.llama import LlamaContext

    ctx = LlamaContext(
        model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, capture=False, swa_full=swa_full, n_rs_seq=n_rs_seq
    )
    try:
        return ctx.memory.info
    finally:
        ctx.close()


def _quantized_note(types: list[str]) -> str:
    if any(CACHE_TYPES[t] > 1 for t in types):
        return " (a quantized V cache needs flash attention)"
    return " (no quantized type: its blocks of 32 would split a head)"


def model_info(
    model: str | os.PathLike | None = None,
    draft_model: str | os.PathLike | None = None,
    settings: ContextSettings | None = None,
    *,
    swa_full: bool = True,
    n_rs_seq: int | None = None,
) -> ModelInfo:
    """Facts about ``model`` (default: the embedded Gemma 3 270M) and which strategies it can run, with
    ``draft_model`` (a draft GGUF or an EAGLE-3 head) when given, and whether the context ``settings`` (a
    deployment's -fa / -ctk / -ctv ...) can be used with it; ``swa_full`` / ``n_rs_seq`` are the context
    options the memory is probed with (as :class:`~specviz.Session` takes them). Raises a typed
    :class:`~specviz.errors.ModelError` for a file that is missing or not a loadable GGUF."""
    from ..backends.llama import LlamaModel

    path = resolve_model(model)
    target = LlamaModel(path)
    draft = None
    try:
        tinfo = target.info
        meta = tinfo.metadata
        arch = tinfo.architecture
        method, why = _capture(arch) if arch != "eagle3" else (None, "an EAGLE-3 head is not a target")
        head = dhead = None
        if arch == "eagle3":
            head = read_eagle3_head(path, tinfo).to_dict()
        if arch == "dflash":
            dhead = read_dflash_head(path, tinfo).to_dict()
        dinfo = None
        dsum: dict[str, Any] | None = None
        if draft_model is not None:
            draft = LlamaModel(Path(draft_model))
            dinfo = draft.info
            dsum = {
                "path": str(draft.path),
                "architecture": dinfo.architecture,
                "n_layer": draft.n_layer,
                "n_vocab": draft.n_vocab,
            }
            if dinfo.architecture == "eagle3":
                dsum["eagle3_head"] = read_eagle3_head(draft.path, dinfo).to_dict()
            if dinfo.architecture == "dflash":
                dsum["dflash_head"] = read_dflash_head(draft.path, dinfo).to_dict()
        ft = meta.get("general.file_type")
        mem = _memory(target, swa_full, n_rs_seq) if arch not in ("eagle3", "dflash") else None
        heads = head_sizes(meta, arch)
        refused = None
        if settings is not None:
            try:
                settings.check_model(*heads)
            except KnobError as e:
                refused = str(e)
        return ModelInfo(
            path=str(path),
            architecture=arch,
            name=meta.get("general.name"),
            file_type=_FILE_TYPES.get(int(ft), str(ft)) if isinstance(ft, int) else None,
            size_bytes=Path(path).stat().st_size,
            n_layer=target.n_layer,
            n_embd=target.n_embd,
            n_vocab=target.n_vocab,
            n_ctx_train=target.n_ctx_train,
            sliding_window=target.n_swa,
            nextn_layers=nextn_layers(tinfo),
            layer_capture=method,
            layer_capture_why=why,
            chat_template=isinstance(meta.get("tokenizer.chat_template"), str),
            eagle3_head=head,
            head_sizes=heads,
            cache_types=cache_types_for(*heads),
            settings=settings.to_dict() if settings is not None else None,
            settings_why=refused,
            draft_model=dsum,
            strategies=(fits := _fits(target, tinfo, draft, dinfo, mem)),
            memory=mem.to_dict() if mem is not None else None,
            memory_text=mem.describe() if mem is not None else None,
            dflash_head=dhead,
            chains=_chains(fits),
        )
    finally:
        if draft is not None:
            draft.close()
        target.close()
