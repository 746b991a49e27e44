"""The package root is the front door: what a user types, at most 40 names, each importable."""

from __future__ import annotations

import importlib

MAX_ROOT_NAMES = 40


def test_root_exports_at_most_40_names():
    specviz = importlib.import_module("specviz")
    assert len(specviz.__all__) <= MAX_ROOT_NAMES, sorted(specviz.__all__)
    assert len(set(specviz.__all__)) == len(specviz.__all__), "a name is listed twice in __all__"


def test_every_root_name_is_importable():
    specviz = importlib.import_module("specviz")
    for name in specviz.__all__:
        assert getattr(specviz, name) is not None, name


def test_root_holds_what_a_user_types():
    specviz = importlib.import_module("specviz")
    for name in ("Session", "Inspector", "compare", "diagnose", "advise", "strategy_names", "errors"):
        assert name in specviz.__all__, name
    assert specviz.errors.SpecvizError is specviz.SpecvizError
