"""Strategy registry: name → drafter class, and the knob schema of each strategy.

Names follow llama.cpp (``none``, ``ngram-simple``, ``ngram-map-k`` …) plus ``prompt-lookup``
(the static-shape runner's prompt lookup, docs/strategies.md), ``draft`` (a second GGUF), ``eagle3``
(an EAGLE-3 head over the target's hidden states), ``mtp`` (the target's multi-token-prediction layers)
and ``dflash`` / ``dspark`` (a block-diffusion draft over the target's layer inputs, one block per round).

Every function here also takes llama.cpp's ``--spec-type`` spellings (:data:`SPEC_TYPES`:
``draft-simple``, ``draft-eagle3``, ``draft-mtp``, ``draft-dflash``, ``draft-dspark``) and comma lists of
names, which make a chain of drafters asked in llama.cpp's priority order (:data:`CHAIN_PRIORITY`, see
:mod:`specviz.strategies.chain`); :func:`resolve_strategy` turns any of them into the canonical name.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import import_module
from typing import Any

from ..decoding.knob_schema import SESSION_KNOBS, Knob, Schema
from ..errors import StrategyError
from .base import Draft, Drafter, DrafterStats, DraftResources, PeekingDrafter, check_knob_rules, peeker
from .chain import ChainDrafter, chain_class
from .context_drafter import ContextDrafter, context_hooks

# name -> "module:Class"; modules are imported on first use so a strategy's dependencies load lazily.
_REGISTRY: dict[str, str] = {
    "none": "specviz.strategies.none:NoDrafter",
    "grammar": "specviz.strategies.grammar:GrammarDrafter",
    "prompt-lookup": "specviz.strategies.prompt_lookup:PromptLookupDrafter",
    "ngram-simple": "specviz.strategies.ngram_simple:NgramSimpleDrafter",
    "ngram-map-k": "specviz.strategies.ngram_map:NgramMapKDrafter",
    "ngram-map-k4v": "specviz.strategies.ngram_map:NgramMapK4VDrafter",
    "ngram-mod": "specviz.strategies.ngram_mod:NgramModDrafter",
    "ngram-cache": "specviz.strategies.ngram_cache:NgramCacheDrafter",
    "draft": "specviz.strategies.draft_model:DraftModelDrafter",
    "eagle3": "specviz.strategies.eagle3:Eagle3Drafter",
    "mtp": "specviz.strategies.mtp:MtpDrafter",
    "dflash": "specviz.strategies.dflash:DFlashDrafter",
    "dspark": "specviz.strategies.dflash:DSparkDrafter",
}


#: llama.cpp's ``--spec-type`` name of each strategy that has one (``prompt-lookup`` and ``grammar`` are
#: specviz's own).
SPEC_TYPES: dict[str, str] = {
    "none": "none",
    "draft": "draft-simple",
    "eagle3": "draft-eagle3",
    "mtp": "draft-mtp",
    "dflash": "draft-dflash",
    "dspark": "draft-dspark",
    "ngram-simple": "ngram-simple",
    "ngram-map-k": "ngram-map-k",
    "ngram-map-k4v": "ngram-map-k4v",
    "ngram-mod": "ngram-mod",
    "ngram-cache": "ngram-cache",
}
_FROM_SPEC_TYPE = {v: k for k, v in SPEC_TYPES.items()}

#: The order a chain asks its members: llama.cpp's priority (``common_speculative_init`` lists the n-gram
#: types, then draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark), with specviz's own
#: ``prompt-lookup`` after the n-gram types and its own ``grammar`` first (it drafts only forced text).
CHAIN_PRIORITY: tuple[str, ...] = (
    "grammar",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "prompt-lookup",
    "draft",
    "eagle3",
    "mtp",
    "dflash",
    "dspark",
)


def strategy_names() -> list[str]:
    """Every registered strategy name, in registry order (chains of them are not listed)."""
    return list(_REGISTRY)


def spec_type(strategy: str) -> str | None:
    """llama.cpp's ``--spec-type`` for ``strategy`` (a chain: its members' comma list); None for a strategy
    llama.cpp does not have (``prompt-lookup``, ``grammar``, or a chain holding one)."""
    parts = [SPEC_TYPES.get(m) for m in resolve_strategy(strategy).split(",")]
    return None if None in parts else ",".join(p for p in parts if p is not None)


def _choices() -> str:
    names = list(_REGISTRY) + [t for t in _FROM_SPEC_TYPE if t not in _REGISTRY]
    return ", ".join(names)


def resolve_strategy(name: str) -> str:
    """The canonical strategy ``name`` stands for: a registered name, llama.cpp's spelling of one
    (``draft-dflash`` -> ``dflash``), or a comma list of them — a chain, its members in
    :data:`CHAIN_PRIORITY` order (``draft-mtp,ngram-mod`` -> ``ngram-mod,mtp``), repeats dropped, ``none``
    among them meaning ``none`` (as llama.cpp reads the list). :class:`StrategyError` for an unknown
    name, an empty part, or a chain with two model drafters (llama.cpp has one draft context)."""
    if not isinstance(name, str):
        raise StrategyError(
            f"strategy must be a name, got {name!r}; choose one of: {_choices()}", knob="strategy", value=name
        )
    parts = [p.strip() for p in name.split(",")]
    out: list[str] = []
    for p in parts:
        m = p if p in _REGISTRY else _FROM_SPEC_TYPE.get(p)
        if m is None:
            what = "an empty name" if not p else repr(p)
            raise StrategyError(
                f"unknown strategy {name!r}"
                + (f" ({what} is not one)" if len(parts) > 1 else "")
                + f"; choose one of: {_choices()}, or a comma list of them (a chain)",
                knob="strategy",
                value=name,
            )
        if m not in out:
            out.append(m)
    if "none" in out:
        return "none"
    if len(out) == 1:
        return out[0]
    out.sort(key=CHAIN_PRIORITY.index)
    model = [m for m in out if _registered_class(m).needs_model]
    if len(model) > 1:
        raise StrategyError(
            f"strategy {name!r} chains {' and '.join(model)}, which both draft with a model; a chain holds at most "
            "one (llama.cpp has one draft context): keep one of them",
            knob="strategy",
            value=name,
        )
    return ",".join(out)


def _registered_class(name: str) -> type[Drafter]:
    mod, _, cls = _REGISTRY[name].partition(":")
    return getattr(import_module(mod), cls)


@lru_cache(maxsize=None)
def _chain(canonical: str) -> type[Drafter]:
    members = tuple(canonical.split(","))
    return chain_class(members, tuple(_registered_class(m) for m in members), make_drafter)


def strategy_class(name: str) -> type[Drafter]:
    """The drafter class ``name`` stands for (see :func:`resolve_strategy`); :class:`StrategyError` when unknown."""
    canonical = resolve_strategy(name)
    if "," in canonical:
        return _chain(canonical)
    return _registered_class(canonical)


def strategy_schema(name: str) -> Schema:
    """The full knob schema of a strategy: the shared draft-length knobs, then its own."""
    name = resolve_strategy(name)
    cls = strategy_class(name)
    own = tuple(cls.knobs)
    own_names = {k.name for k in own}
    shared: tuple[Knob, ...] = () if name == "none" else tuple(k for k in SESSION_KNOBS if k.name not in own_names)
    return Schema(owner=f"strategy {name!r}", knobs=shared + own)


def member_knob_names(name: str) -> dict[str, dict[str, str]]:
    """Per member strategy of ``name`` (a chain's members, or the strategy itself): its own knob name -> the
    name the strategy's schema gives it (a chain prefixes a knob its members declare differently, see
    :mod:`specviz.strategies.chain`)."""
    canonical = resolve_strategy(name)
    cls = strategy_class(canonical)
    if issubclass(cls, ChainDrafter):
        return {m: dict(names) for m, names in cls.member_knobs.items()}
    return {canonical: {k.name: k.name for k in cls.knobs}}


def per_type_flags() -> dict[str, tuple[str, str]]:
    """llama.cpp's per-type spellings of the strategies' knobs, as the knobs declare them:
    ``--spec-ngram-map-k-size-n`` -> ``("ngram-map-k", "size_n")``. ``--spec-draft-*`` is none of them:
    llama.cpp's draft settings serve every model-backed type, not only the strategy named ``draft``."""
    out: dict[str, tuple[str, str]] = {}
    for name in _REGISTRY:
        if name == "draft":
            continue
        for k in _registered_class(name).knobs:
            out.update({a: (name, k.name) for a in k.aliases if a.startswith(f"--spec-{name}-")})
    return out


def draft_model_strategy(path: str) -> str:
    """The strategy a draft GGUF alone implies, read from its architecture (no model loaded): ``eagle3`` for
    an EAGLE-3 head, ``dspark`` / ``dflash`` for a DFlash draft with / without DSpark's Markov head (as
    llama.cpp's ``common_speculative_types_from_gguf`` detects them), else ``draft``."""
    from ..backends.gguf_check import check_gguf
    from ..errors import ModelError

    try:
        info = check_gguf(path)
    except ModelError:
        return "draft"  # the draft strategy's own check reports the file
    if info.architecture == "dflash":
        return "dspark" if "markov_w1.weight" in info.tensors else "dflash"
    return "eagle3" if info.architecture == "eagle3" else "draft"


def make_drafter(name: str, knobs: dict[str, Any], resources: DraftResources | None = None) -> Drafter:
    """Instantiate strategy ``name`` with already-validated ``knobs``; a model-backed strategy
    (``needs_model``) also gets its :class:`DraftResources`."""
    cls = strategy_class(name)
    names = {k.name for k in cls.knobs}
    own = {k: v for k, v in knobs.items() if k in names}
    if cls.needs_model:
        if resources is None:
            raise StrategyError(
                f"strategy {name!r} drafts with a model: it is built by a Session, which loads "
                "and checks the draft model",
                knob="strategy",
                value=name,
            )
        return cls(resources, **own)  # type: ignore[call-arg]
    return cls(**own)


__all__ = [
    "CHAIN_PRIORITY",
    "SPEC_TYPES",
    "resolve_strategy",
    "spec_type",
    "member_knob_names",
    "per_type_flags",
    "draft_model_strategy",
    "Draft",
    "Drafter",
    "DrafterStats",
    "DraftResources",
    "ContextDrafter",
    "PeekingDrafter",
    "context_hooks",
    "peeker",
    "check_knob_rules",
    "strategy_names",
    "strategy_class",
    "strategy_schema",
    "make_drafter",
]
