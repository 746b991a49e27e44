"""A served page gets every message sent to it from another thread, in order (a real chromium, no network).

The bug this pins: with Panel's own send path, the last message of a burst sent while an earlier write
was still in flight could stay unsent until a later message flushed it; a page of ``specviz serve`` then
kept the ``state`` before the last one and its Step button disabled. ``OrderedSender`` is driven here by
a thread sending numbered messages in short bursts, each followed by a wait for the page to have the
burst's last one (tests/apps/ordered_sender_app.py); the page must get every burst whole, every message,
in order.
"""

from __future__ import annotations

import re

import pytest
from browser_util import ROOT, browser_fixture, free_port, offline, start, stop, wait_http

pytestmark = pytest.mark.browser

N = 180  # bursts (the old path left about one in 60 stuck)
PAD = 200_000


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


def test_every_message_from_another_thread_arrives_in_order(browser, tmp_path):
    from playwright.sync_api import expect

    port = free_port()
    app = ROOT / "tests" / "apps" / "ordered_sender_app.py"
    proc = start([str(app), str(port), str(N), str(PAD)], tmp_path / "app.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)
        page = browser.new_page()
        external = offline(page)
        page.goto(f"http://127.0.0.1:{port}/")
        probe = page.locator(".sender-probe")
        expect(probe).to_have_attribute("data-stuck", re.compile(r"\d+"), timeout=120000)
        # every burst's last message arrived without a later one to flush it
        assert probe.get_attribute("data-stuck") == "0"
        last = int(probe.get_attribute("data-last"))
        assert probe.get_attribute("data-count") == str(last + 1)  # all of them
        assert probe.get_attribute("data-disorder") == "0"
        assert external == []
        page.close()
    finally:
        stop(proc)
