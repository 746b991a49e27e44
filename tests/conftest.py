"""Shared fixtures: tiny real llama.cpp models written with the gguf package, and the embedded model."""

from __future__ import annotations

import os

import pytest

from specviz.testing.tiny_models import write_tiny_eagle3, write_tiny_llama

#: The parameters of the shared tiny fixture model.
TINY = {"seed": 1, "block_scale": 0.1}


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny llama-architecture GGUF (vocab 320, 2 layers, width 64, f32, seed 1).

    Its blocks are scaled down (``block_scale=0.1``) so that greedy output partly loops: every n-gram
    strategy then drafts, and gets tokens both accepted and rejected.
    """
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", **TINY)


@pytest.fixture(scope="session")
def e3_target_path(tmp_path_factory):
    """The EAGLE-3 pair's target: a tiny llama GGUF with 4 layers (a head reads three of them), seed 2."""
    return write_tiny_llama(tmp_path_factory.mktemp("e3-pair") / "target.gguf", seed=2, n_layer=4, block_scale=0.1)


@pytest.fixture(scope="session")
def e3_head_path(e3_target_path):
    """A random EAGLE-3 head (seed 1) for :func:`e3_target_path`'s target."""
    return write_tiny_eagle3(e3_target_path.with_name("head.gguf"), e3_target_path, seed=1)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_path):
    """The tiny model loaded once per test session."""
    from specviz.backends import LlamaModel

    m = LlamaModel(tiny_model_path)
    yield m
    m.close()


@pytest.fixture()
def tiny_session(tiny_model):
    """A fresh Session over the shared tiny model (small context)."""
    from specviz import Session

    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    yield s
    s.ctx.close()


@pytest.fixture(scope="session")
def embedded_model_path():
    """The embedded Gemma 3 270M (assembled once)."""
    from specviz.models.embedded import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def embedded_model(embedded_model_path):
    """The embedded model loaded once per test session."""
    from specviz.backends import LlamaModel

    m = LlamaModel(embedded_model_path)
    yield m
    m.close()


def pytest_collection_modifyitems(config, items):
    """Real-model tests run last, after the fast ones."""
    items.sort(key=lambda it: 1 if it.get_closest_marker("embedded") else 0)


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
