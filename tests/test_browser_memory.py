"""The inspector shows a real recurrent session's memory: checkpoint restores and saves on the KV timeline and
the memory chart beside ``none`` (front-end in a real chromium with a scripted host, events of the tiny Mamba)."""

from __future__ import annotations

import pytest
from browser_util import browser_fixture

from specviz import Session
from specviz.testing.memory_models import write_tiny_mamba

pytestmark = pytest.mark.browser

PROMPT = "the cat sat on the mat and the cat sat on the mat and the"


@pytest.fixture(scope="module")
def browser():
    yield from browser_fixture()


def test_a_recurrent_session_shows_its_checkpoint_restores_and_its_memory(browser, tmp_path):
    from specviz.testing.page_harness import open_harness

    path = write_tiny_mamba(tmp_path / "mamba.gguf", block_scale=0.02)
    s = Session(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, max_tokens=40, strategy="prompt-lookup", draft_max=6)
    s.run()
    events = [e.to_dict() for e in s.events]
    s.close()
    restores = [e for e in events if e["kind"] == "kv_rollback" and e.get("path") == "checkpoint"]
    assert restores, "the fixture must reject a draft for the timeline to show a restore"
    page = open_harness(browser)
    page.evaluate("m => window.__deliver(m)", {"type": "events", "epoch": 0, "start": 0, "events": events})
    n_rounds = max(e.get("round", 0) for e in events)
    page.wait_for_function(f"document.querySelector('.specviz-inspector').dataset.chartRounds === '{n_rounds}'")
    legend = page.locator('.sv-chart-card[data-chart="kv"] .sv-chart-legend').inner_text()
    assert "target: restored a checkpoint" in legend and "checkpoint saved" in legend
    mem = page.locator('.sv-chart-card[data-chart="mem"]')
    assert "recurrent memory" in mem.locator(".sv-sub").inner_text()
    assert "recurrent state" in mem.locator(".sv-chart-legend").inner_text()
    assert mem.locator(".main-svg").count() >= 1
    assert page.external_requests == []
