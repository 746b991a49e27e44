"""``specviz serve``'s context settings (``-fa``, ``-ctk``, ``-ctv``, ``-c``, ``-b``, ``-ub``, ``-t``): every
page's session is made with them, a parked session comes back with them, and a page cannot change them."""

from __future__ import annotations

import pytest
from conftest import TINY
from test_ui_messages import Sink, error_shown

from specviz.backends.context_settings import ContextSettings
from specviz.testing.tiny_models import write_tiny_llama
from specviz.ui.core import InspectorCore

pytest.importorskip("panel", reason="specviz serve needs the ui extra (panel)")


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """A tiny llama whose heads are 32 wide: quantized KV caches fit it."""
    return write_tiny_llama(tmp_path_factory.mktemp("heads") / "wide.gguf", n_head=2, n_head_kv=1, **TINY)


def test_every_page_session_has_the_servers_settings_parked_or_not(wide_heads):
    from specviz.server.app import build_app

    settings = ContextSettings.make(
        n_ctx=512, n_batch=64, n_ubatch=32, n_threads=1, flash_attn="on", cache_type_k="q8_0"
    )
    app = build_app(0, wide_heads, prompt="1, 2, 3, 1, 2, 3,", max_tokens=12, settings=settings)
    try:
        assert any("-fa on -ctk q8_0" in line for line in app.lines)
        assert app.pool is not None
        ms = app.pool.open()
        assert ms is not None
        ms.start("1, 2, 3, 1, 2, 3,", max_tokens=12, strategy="ngram-simple")
        ms.step()
        assert ms.settings == settings
        assert ms.release()  # parked: its context given back
        ms.step()  # restored from its snapshot into a session made with the same settings
        assert ms.restores == 1 and ms.settings == settings and ms.round_index == 2
        sink = Sink()
        core = InspectorCore(sink, ms)
        n = len(sink.msgs)
        core.handle({"type": "cmd", "cmd": "reset", "context": {"cache_type_k": "f16"}})
        assert error_shown(sink.msgs[n:]) and ms.settings == settings  # a page cannot change them
        core.close()
    finally:
        if app.pool is not None:
            app.pool.close_all()


@pytest.mark.slow
def test_every_page_session_has_the_servers_gpu_layers(wide_heads):
    from specviz.server.app import build_app

    app = build_app(0, wide_heads, prompt="1, 2, 3, 1, 2, 3,", max_tokens=8, n_gpu_layers=5)
    try:
        assert app.pool is not None
        ms = app.pool.open()
        assert ms is not None
        ms.start("1, 2, 3, 1, 2, 3,", max_tokens=8, strategy="ngram-simple")
        ms.step()
        assert ms.model.n_gpu_layers == 5
    finally:
        if app.pool is not None:
            app.pool.close_all()
