"""The inspector's telemetry cards in a real chromium: tokens/s is marked when the run's CPU share says the
machine was busy (the telemetry's ``cpu_busy``), and only then."""

from __future__ import annotations

import pytest
from browser_util import browser_fixture

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


def _with_cpu(groups, share: float, busy: bool):
    for g in groups:
        for e in g:
            if e["kind"] == "telemetry":
                e["data"] = {**e["data"], "cpu_seconds": 1.0, "n_threads": 2, "cpu_share": share, "cpu_busy": busy}
    return groups


def _shown(browser, groups):
    from specviz.testing.page_harness import open_harness

    page = open_harness(browser)
    n = 0
    for g in groups:
        page.evaluate("m => window.__deliver(m)", {"type": "events", "epoch": 0, "start": n, "events": g})
        n += len(g)
    page.wait_for_function("document.querySelector('.sv-stat[data-k=\"tps\"] .sv-stat-v').textContent !== '—'")
    card = page.locator('.sv-stat[data-k="tps"]')
    return card.locator(".sv-stat-l").inner_text(), card.get_attribute("class"), card.get_attribute("title")


def test_tokens_per_second_is_marked_on_a_busy_machine_only(browser):
    from specviz.testing.synthetic import synthetic_rounds

    label, cls, title = _shown(browser, _with_cpu(synthetic_rounds(20, seed=3), 0.38, True))
    assert label == "tokens/s (busy machine)" and "sv-busy" in cls
    assert title == "CPU share 38% of 2 threads: the machine was busy"
    label, cls, title = _shown(browser, _with_cpu(synthetic_rounds(20, seed=3), 0.95, False))
    assert label == "tokens/s" and "sv-busy" not in cls and title == "CPU share 95% of 2 threads"
    label, cls, title = _shown(browser, synthetic_rounds(20, seed=3))  # telemetry without the figures
    assert label == "tokens/s" and "sv-busy" not in cls and title is None
