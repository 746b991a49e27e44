"""The drafter interface stays narrow: the base class has six public methods, and every optional ability is a
declared flag backed by the mixin that carries its methods (:mod:`specviz.strategies.base`,
:mod:`specviz.strategies.context_drafter`)."""

from __future__ import annotations

from typing import Any, Sequence

import pytest

from specviz.errors import KnobError
from specviz.strategies import (
    CHAIN_PRIORITY,
    ContextDrafter,
    Draft,
    Drafter,
    PeekingDrafter,
    check_knob_rules,
    context_hooks,
    peeker,
    strategy_class,
    strategy_names,
)
from specviz.strategies.base import DrafterStats
from specviz.strategies.chain import ChainDrafter, ContextChainDrafter, drafter_telemetry
from specviz.strategies.context_drafter import context_class

#: llama.cpp's begin / draft / accept, the state a snapshot keeps, and close.
INTERFACE = {"begin", "draft", "accept", "state", "load_state", "close"}
#: The hooks only a drafter with a llama.cpp context of its own has.
CONTEXT_HOOKS = {
    "check_models",
    "kv_length",
    "sync",
    "context_state",
    "load_context_state",
    "memory_context",
    "memory_log",
    "take_upkeep",
    "extra_telemetry",
    "expect_plain",
}


def public_methods(cls: type) -> set[str]:
    """The public callables ``cls`` has (its own and inherited), properties left out."""
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


def every_class() -> list[type[Drafter]]:
    """Every registered strategy's class, and chains: each model member after the n-gram ones, and n-grams only."""
    out = [strategy_class(n) for n in strategy_names()]
    out += [strategy_class(f"ngram-mod,{m}") for m in CHAIN_PRIORITY if strategy_class(m).needs_model]
    out += [strategy_class("ngram-simple,prompt-lookup"), strategy_class("ngram-map-k,ngram-cache")]
    return out


def test_the_base_drafter_has_six_public_methods():
    assert public_methods(Drafter) == INTERFACE
    assert public_methods(ContextDrafter) == INTERFACE | CONTEXT_HOOKS
    assert public_methods(PeekingDrafter) == INTERFACE | {"peek"}
    assert isinstance(Drafter.tokens, property)
    d = Drafter()
    assert isinstance(d.stats, DrafterStats) and d.config == {} and d.tokens.shape == (0,)


def test_each_declared_ability_comes_with_its_mixin():
    for cls in every_class():
        assert cls.has_context == issubclass(cls, ContextDrafter), cls
        assert cls.can_peek == issubclass(cls, PeekingDrafter), cls
        if cls.can_peek:  # the mixin's peek only refuses: the class brings its own
            assert cls.peek is not PeekingDrafter.peek, cls
        if cls.needs_model:  # a draft model lives in a context of the drafter's own
            assert cls.has_context and context_class(cls) is cls, cls
    names = {c.name for c in every_class() if c.has_context}
    assert {"draft", "eagle3", "mtp", "dflash", "dspark", "ngram-mod,mtp"} <= names
    assert {c.name for c in every_class() if c.can_peek} == {
        "prompt-lookup",
        "ngram-simple",
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-mod",
        "ngram-cache",
    }


def test_a_chain_is_a_context_drafter_only_with_a_context_member():
    assert issubclass(strategy_class("ngram-mod,draft"), ContextChainDrafter)
    plain = strategy_class("ngram-simple,ngram-mod")
    assert issubclass(plain, ChainDrafter) and not issubclass(plain, ContextDrafter) and not plain.has_context
    d = plain()
    d.begin([1, 2, 3, 1, 2])
    assert context_hooks(d) is None and peeker(d) is None
    # the members' counters are reported whether or not the chain has a context
    assert drafter_telemetry(d)["chain"]["members"] == ["ngram-simple", "ngram-mod"]


def test_the_helpers_answer_none_for_a_drafter_without_the_ability():
    none = strategy_class("none")()
    assert context_hooks(None) is None and peeker(None) is None
    assert context_hooks(none) is None and peeker(none) is None and context_class(type(none)) is None
    assert drafter_telemetry(none) == {} and drafter_telemetry(None) == {}
    lookup = strategy_class("prompt-lookup")()
    assert peeker(lookup) is lookup and context_hooks(lookup) is None
    lookup.can_peek = False  # the flag is the declaration: an instance with the ability switched off has none
    assert peeker(lookup) is None


class _ClaimsContext(Drafter):
    """Declares a context of its own without the hooks that context needs."""

    name = "claims-context"
    has_context = True


class _ClaimsPeek(Drafter):
    """Declares it can peek without deriving from the peeking mixin."""

    name = "claims-peek"
    can_peek = True


class _ForgetsPeek(PeekingDrafter):
    """Derives from the peeking mixin but brings no peek of its own."""

    name = "forgets-peek"


def test_a_drafter_missing_its_mixin_is_refused():
    with pytest.raises(TypeError, match="declares has_context but is not a ContextDrafter"):
        context_hooks(_ClaimsContext())
    with pytest.raises(TypeError, match="declares has_context"):
        context_class(_ClaimsContext)
    with pytest.raises(TypeError, match="declares can_peek but is not a PeekingDrafter"):
        peeker(_ClaimsPeek())
    with pytest.raises(NotImplementedError, match="does not implement peek"):
        _ForgetsPeek().peek([1, 2])


class _Echo(ContextDrafter):
    """A context drafter that counts its syncs (the default hooks report nothing)."""

    name = "echo"

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self.synced = 0

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        return Draft([history[-1]])

    def sync(self, history: Sequence[int]) -> list[tuple[int, int]]:
        self.synced += 1
        return []


def test_the_context_hooks_default_to_nothing():
    d = _Echo()
    d.begin([4, 5])
    hooks = context_hooks(d)
    assert hooks is d and d.has_context
    assert hooks.kv_length() is None and hooks.context_state() == b"" and hooks.memory_context() is None
    assert hooks.memory_log() == [] and hooks.take_upkeep() is None and hooks.extra_telemetry() == {}
    hooks.expect_plain(3)  # a hint: ignored unless the drafter pauses
    assert d.draft([4, 5], 2).tokens == [5] and hooks.sync([4, 5, 5]) == [] and d.synced == 1


def test_knob_rules_are_declared_and_checked_in_one_place():
    lookup = strategy_class("prompt-lookup")
    with pytest.raises(KnobError) as e:
        check_knob_rules(lookup, {"min_ngram": 3, "max_ngram": 2})
    assert e.value.knob == "min_ngram"
    # a chain runs each member's rules on its own part of the config
    chain = strategy_class("ngram-mod,prompt-lookup")
    ok = {"n_min": 2, "n_max": 4, "min_ngram": 1, "max_ngram": 3}
    check_knob_rules(chain, ok)
    with pytest.raises(KnobError) as e:
        check_knob_rules(chain, {**ok, "n_min": 5})
    assert e.value.knob == "n_min"
    assert check_knob_rules(strategy_class("none"), {}) is None
