"""Strategy registry: name → drafter class, and the knob schema of each strategy.

Names follow llama.cpp (``none``, ``ngram-simple``, ``ngram-map-k`` …) plus ``prompt-lookup``
(the runner PR's prompt lookup), ``draft`` (a second GGUF), ``eagle3`` (an EAGLE-3 head over the target's
hidden states), ``mtp`` (the target's multi-token-prediction layers) and ``dflash`` / ``dspark`` (a
block-diffusion draft over the target's layer inputs, one block per round).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ..decoding.knob_schema import SESSION_KNOBS, Knob, Schema
from ..errors import StrategyError
from .base import Draft, Drafter, DrafterStats, DraftResources

# name -> "module:Class"; modules are imported on first use so a strategy's dependencies load lazily.
_REGISTRY: dict[str, str] = {
    "none": "specviz.strategies.none:NoDrafter",
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


def strategy_names() -> list[str]:
    """Every registered strategy name, in registry order."""
    return list(_REGISTRY)


def strategy_class(name: str) -> type[Drafter]:
    """The drafter class registered under ``name``; :class:`StrategyError` when unknown."""
    target = _REGISTRY.get(name)
    if target is None:
        raise StrategyError(
            f"unknown strategy {name!r}; choose one of: {', '.join(_REGISTRY)}", knob="strategy", value=name
        )
    mod, _, cls = target.partition(":")
    return getattr(import_module(mod), cls)


def strategy_schema(name: str) -> Schema:
    """The full knob schema of a strategy: the shared draft-length knobs, then its own."""
    cls = strategy_class(name)
    own = tuple(cls.knobs)
    own_names = {k.name for k in own}
    shared: tuple[Knob, ...] = () if name == "none" else tuple(k for k in SESSION_KNOBS if k.name not in own_names)
    return Schema(owner=f"strategy {name!r}", knobs=shared + own)


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
    "Draft",
    "Drafter",
    "DrafterStats",
    "DraftResources",
    "strategy_names",
    "strategy_class",
    "strategy_schema",
    "make_drafter",
]
