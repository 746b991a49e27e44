"""The inspector shows an EAGLE-3 session: the head's context in the KV timeline, its draft_p_min and the
head's vocabulary coverage in the stats (front-end in a real chromium with a scripted host)."""

from __future__ import annotations

import pytest
from browser_util import browser_fixture

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    yield from browser_fixture()


def test_an_eagle3_session_shows_its_context_and_vocabulary_coverage(browser):
    from specviz.testing.page_harness import open_harness
    from specviz.testing.synthetic import synthetic_rounds

    groups = synthetic_rounds(12, seed=5, draft_model=True)  # a model drafter: its context rolls back
    cov = {
        "draft_vocab": 8192,
        "target_vocab": 262144,
        "vocab_share": 8192 / 262144,
        "committed": 40,
        "expressible": 37,
        "committed_share": 37 / 40,
        "rejections": 10,
        "rejections_expressible": 6,
        "rejection_share": 0.6,
    }
    for g in groups:
        for e in g:
            if e["kind"] == "session_started":
                e["strategy"] = "eagle3"
            elif e["kind"] == "telemetry":
                e["data"] = {**e["data"], "strategy": "eagle3", "vocab_coverage": cov}
    page = open_harness(browser)
    n = 0
    for g in groups:
        page.evaluate("m => window.__deliver(m)", {"type": "events", "epoch": 0, "start": n, "events": g})
        n += len(g)
    stats = page.locator(".sv-extra-stats")
    assert page.locator(".sv-cov-vocab").inner_text() == "draft vocab 8192/262144 (3.1%)"
    assert "93% of committed tokens expressible" in stats.inner_text()
    assert "60% of rejections expressible" in stats.inner_text()
    assert page.locator(".sv-pill-strategy").inner_text() == "eagle3"
    # the head's own context is drawn next to the target's in the KV timeline
    page.wait_for_function(f"document.querySelector('.specviz-inspector').dataset.chartRounds === '{len(groups) - 1}'")
    legend = page.locator('.sv-chart-card[data-chart="kv"] .sv-chart-legend').inner_text()
    assert "draft ctx: committed" in legend and "draft ctx: rolled back" in legend
