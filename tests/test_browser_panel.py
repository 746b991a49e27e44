"""The Panel app in a real chromium with no network: live session (tiny model) and replay."""

from __future__ import annotations

import json

import pytest
from browser_util import SCREENSHOTS, browser_fixture, free_port, offline, start, stop, wait_http

pytestmark = pytest.mark.browser

PROMPT = "the cat sat on the mat and the cat sat"


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


@pytest.fixture(scope="module")
def live_app(tiny_model_path, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("panel") / "serve.log"
    code = (
        f"from specviz.server.app import serve; serve({port}, {str(tiny_model_path)!r}, prompt={PROMPT!r}, "
        "max_tokens=1800, n_ctx=2048)"
    )
    proc = start(["-c", code], log)
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop(proc)


def root(page):
    return page.locator(".specviz-inspector")


def expect_attr(page, name, value, timeout=60000):
    from playwright.sync_api import expect

    expect(root(page)).to_have_attribute(name, value, timeout=timeout)


def rounds(page) -> int:
    return int(page.locator(".specviz-inspector").get_attribute("data-rounds") or 0)


def test_panel_live_step_knobs_telemetry(browser, live_app):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1320, "height": 1000})
    external = offline(page)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(live_app)
    page.wait_for_selector(".specviz-inspector .sv-tok.sv-prompt", timeout=60000)
    expect(page.locator(".sv-step")).to_be_enabled(timeout=60000)
    assert rounds(page) == 0
    # Step: one round appears
    page.locator(".sv-step").click()
    expect_attr(page, "data-rounds", "1")
    assert page.locator('.sv-stat[data-k="rounds"] .sv-stat-v').inner_text() == "1"
    # Run N
    page.locator(".sv-runn").fill("30")
    page.locator(".sv-run").click()
    expect_attr(page, "data-rounds", "31")
    for cls in ("sv-prompt", "sv-corr", "sv-rej"):
        assert page.locator(f".sv-stream .sv-tok.{cls}").count() > 0, cls
    assert page.locator(".sv-stream .sv-plain, .sv-stream .sv-bonus").count() > 0
    # telemetry charts follow
    expect_attr(page, "data-chart-rounds", "31")
    gen_before = page.locator('.sv-stat[data-k="generated"] .sv-stat-v').inner_text()
    # an invalid knob: error beside the field, nothing changes
    field = page.locator('.sv-field[data-knob="draft_max"]')
    field.locator("input").fill("0")
    page.locator(".sv-apply").click()
    page.wait_for_selector('.sv-field[data-knob="draft_max"].sv-invalid')
    err = field.locator(".sv-field-err").inner_text()
    assert "draft_max" in err and "[1, 1024]" in err
    page.locator(".sv-step").click()
    expect_attr(page, "data-rounds", "32")
    assert page.locator(".sv-knobmark").count() == 0
    # a valid knob: queued, applied at the next round (a marker in the stream, the form shows it)
    field.locator("input").fill("3")
    page.locator(".sv-apply").click()
    expect(page.locator(".sv-form-note")).to_contain_text("draft_max=3")
    assert "sv-invalid" not in (field.get_attribute("class") or "")
    page.locator(".sv-step").click()
    page.wait_for_selector(".sv-knobmark")
    expect_attr(page, "data-rounds", "33")
    assert field.locator("input").input_value() == "3"
    assert page.locator('.sv-stat[data-k="generated"] .sv-stat-v').inner_text() != gen_before
    # Play, then Pause stops after the current round
    page.locator(".sv-play").click()
    for _ in range(600):
        if rounds(page) > 40:
            break
        page.wait_for_timeout(100)
    page.locator(".sv-play").click()
    expect(page.locator(".sv-play")).to_contain_text("Play", timeout=30000)
    r = rounds(page)
    page.wait_for_timeout(500)
    assert rounds(page) == r
    # hover a rejected token and open its alternatives
    page.locator(".sv-stream .sv-rej").first.click()
    assert page.locator(".sv-alts .sv-alt").count() > 0
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "panel_live_tiny_model.png"), full_page=True)
    assert external == [], f"requests left the machine: {external}"
    assert errors == []


def test_panel_replay_shows_every_token_kind(browser, tmp_path_factory):
    from specviz.testing.synthetic import synthetic_rounds

    path = tmp_path_factory.mktemp("replay") / "rec.jsonl"
    groups = synthetic_rounds(300, seed=1)
    with path.open("w") as f:
        for g in groups:
            for e in g:
                f.write(json.dumps(e) + "\n")
    port = free_port()
    proc = start(["-m", "specviz.server.app", "replay", str(path), "--port", str(port)], path.with_suffix(".log"))
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)
        page = browser.new_page(viewport={"width": 1320, "height": 1000})
        external = offline(page)
        page.goto(f"http://127.0.0.1:{port}/")
        expect_attr(page, "data-rounds", str(len(groups) - 1))
        for cls in ("sv-prompt", "sv-acc", "sv-bonus", "sv-corr", "sv-plain", "sv-rej"):
            assert page.locator(f".sv-stream .sv-tok.{cls}").count() > 0, cls
        assert page.locator(".sv-apply").is_disabled()  # a recording is read-only
        page.wait_for_selector(".sv-kv .main-svg", timeout=60000)
        # rewind and step through the recording
        page.locator(".sv-reset").click()
        expect_attr(page, "data-rounds", "0")
        page.locator(".sv-step").click()
        expect_attr(page, "data-rounds", "1")
        page.locator(".sv-play").click()
        page.wait_for_selector(".sv-finished:not([hidden])", timeout=60000)
        page.wait_for_timeout(600)
        page.locator(".sv-stream .sv-rej").nth(2).click()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "panel_replay.png"), full_page=True)
        assert external == []
    finally:
        stop(proc)


@pytest.mark.embedded
def test_panel_on_the_embedded_model_writes_the_screenshot(browser):
    """A real Gemma session (prompt lookup, then a derived draft model) captured mid-generation."""
    import sys
    import time

    from browser_util import ROOT

    sys.path.insert(0, str(ROOT / "examples"))
    from make_screenshots import panel_screenshot

    out = SCREENSHOTS / "panel_inspector.png"
    t0 = time.time()
    shown = panel_screenshot(out, browser=browser)
    assert out.stat().st_mtime >= t0 - 1 and out.stat().st_size > 50_000
    assert shown["rounds"] >= 18
    for cls in ("sv-prompt", "sv-acc", "sv-corr", "sv-rej"):
        assert shown["kinds"][cls] > 0, cls
    assert "draft ctx: committed" in shown["draft_kv"]  # the derived draft's context is drawn
    assert shown["external"] == [] and shown["errors"] == []


def test_panel_malformed_messages_from_the_page_show_an_error_and_change_nothing(browser, live_app):
    """Messages the page's module would never send, and a Run N out of range typed in the page."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1320, "height": 1000})
    external = offline(page)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(live_app)
    page.wait_for_selector(".specviz-inspector .sv-tok.sv-prompt", timeout=60000)
    expect(page.locator(".sv-step")).to_be_enabled(timeout=60000)
    page.locator(".sv-step").click()
    expect_attr(page, "data-rounds", "1")
    events = root(page).get_attribute("data-events")
    send = "(el, m) => el.__specviz.send(m)"  # the test hook of the page's own host adapter (Panel: in a shadow root)
    for msg, text in [
        ({"type": "cmd", "cmd": "jump"}, "unknown command 'jump'"),
        ({"type": "explode", "payload": [1, 2]}, "unknown type 'explode'"),
        ({"type": "hello", "epoch": "zero", "have": -4}, "'epoch' must be an integer"),
        ({"type": "configure", "strategy": "prompt-lookup", "knobs": "draft_max=0"}, "'knobs' must be an object"),
        ({"type": "cmd", "cmd": "reset", "prompt": 42}, "'prompt' must be text"),
    ]:
        root(page).evaluate(send, msg)
        expect(page.locator(".sv-notice-error").first).to_contain_text(text, timeout=30000)
    root(page).evaluate(send, [1, 2, 3])
    expect(page.locator(".sv-notice-error").first).to_contain_text("not an object", timeout=30000)
    # a Run N beyond the field's maximum, typed in the page
    page.locator(".sv-runn").fill("250000")
    page.locator(".sv-run").click()
    expect(page.locator(".sv-notice-error").first).to_contain_text("'n' must be an integer in [1, 100000]; got 250000")
    assert page.locator(".sv-notice").count() == 4, "the newest notices are kept"
    # nothing changed: no round ran, no event arrived, the knobs are as they were
    assert rounds(page) == 1 and root(page).get_attribute("data-events") == events
    assert page.locator(".sv-knobmark").count() == 0
    # the page still works: dismiss a notice, step, run
    page.locator(".sv-notice-x").first.click()
    assert page.locator(".sv-notice").count() == 3
    page.locator(".sv-step").click()
    expect_attr(page, "data-rounds", "2")
    page.locator(".sv-runn").fill("3")
    page.locator(".sv-run").click()
    expect_attr(page, "data-rounds", "5")
    assert external == [] and errors == []
