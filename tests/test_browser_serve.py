"""``specviz serve`` for an audience, in a real chromium with no network (tiny model).

Presenter mode: the presenter's page steps, plays and changes knobs; the viewers' pages follow with their
controls disabled, and a viewer's command is refused with an error and changes nothing; a page that joins
late catches up. The default mode: two pages playing at once both progress, and beyond the session cap a
page is told the server is busy.
"""

from __future__ import annotations

import pytest
from browser_util import browser_fixture, free_port, offline, start, stop, wait_http

pytestmark = pytest.mark.browser

PROMPT = "the cat sat on the mat and the cat sat"
PRESENTER = "presenter-token-for-tests"


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


def serve_proc(model_path, tmp_path_factory, **opts):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    kwargs = ", ".join(f"{k}={v!r}" for k, v in opts.items())
    code = (
        f"from specviz.server.app import serve; serve({port}, {str(model_path)!r}, prompt={PROMPT!r}, "
        f"max_tokens=1800, n_ctx=2048, {kwargs})"
    )
    proc = start(["-c", code], log)
    wait_http(f"http://127.0.0.1:{port}/", proc)
    return proc, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def shared_app(tiny_model_path, tmp_path_factory):
    proc, url = serve_proc(tiny_model_path, tmp_path_factory, shared=True, presenter_token=PRESENTER)
    try:
        yield url
    finally:
        stop(proc)


def root(page):
    return page.locator(".specviz-inspector")


def rounds(page) -> int:
    return int(root(page).get_attribute("data-rounds") or 0)


def expect_attr(page, name, value, timeout=60000):
    from playwright.sync_api import expect

    expect(root(page)).to_have_attribute(name, value, timeout=timeout)


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1320, "height": 1000})
    page.external = offline(page)
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector(".specviz-inspector .sv-stream .sv-tok.sv-prompt", timeout=60000)
    return page


def test_presenter_drives_viewers_watch_and_a_viewers_step_is_refused(browser, shared_app):
    from playwright.sync_api import expect

    presenter = open_page(browser, shared_app + f"?presenter={PRESENTER}")
    expect(presenter.locator(".sv-step")).to_be_enabled(timeout=60000)
    viewer = open_page(browser, shared_app)
    expect(viewer.locator(".sv-audience")).to_contain_text("Watching the presenter's session")
    expect(presenter.locator(".sv-audience")).to_contain_text("Presenting")
    # every control of a viewer is disabled (the rejected-token toggle is the page's own view option)
    for sel in (
        ".sv-step",
        ".sv-run",
        ".sv-runn",
        ".sv-play",
        ".sv-reset",
        ".sv-strategy",
        ".sv-apply",
        ".sv-prompt-input",
        ".sv-maxtok",
    ):
        expect(viewer.locator(sel)).to_be_disabled()
    assert viewer.locator(".sv-form input").count() > 0
    for i in range(viewer.locator(".sv-form input").count()):
        assert viewer.locator(".sv-form input").nth(i).is_disabled()
    assert viewer.locator(".sv-showrej").is_enabled()
    # the presenter steps and runs: the viewer sees each round
    presenter.locator(".sv-step").click()
    expect_attr(viewer, "data-rounds", "1")
    presenter.locator(".sv-runn").fill("6")
    presenter.locator(".sv-run").click()
    expect_attr(presenter, "data-rounds", "7")
    expect_attr(viewer, "data-rounds", "7")
    events = root(viewer).get_attribute("data-events")
    assert events == root(presenter).get_attribute("data-events")
    # a viewer's commands, sent as the page would (the test hook of its host adapter): refused, nothing changes
    send = "(el, m) => el.__specviz.send(m)"
    for msg in (
        {"type": "cmd", "cmd": "step"},
        {"type": "cmd", "cmd": "play"},
        {"type": "configure", "strategy": "ngram-simple", "knobs": {}},
        {"type": "cmd", "cmd": "reset", "prompt": "something else"},
    ):
        root(viewer).evaluate(send, msg)
        expect(viewer.locator(".sv-notice-error").first).to_contain_text("only the presenter")
    viewer.wait_for_timeout(500)
    assert rounds(presenter) == 7 and rounds(viewer) == 7
    assert root(presenter).get_attribute("data-events") == events
    assert presenter.locator(".sv-notice-error").count() == 0, "the presenter saw nothing of it"
    # the presenter changes a knob: the viewer sees it queued, then applied
    field = presenter.locator('.sv-field[data-knob="draft_max"]')
    field.locator("input").fill("3")
    presenter.locator(".sv-apply").click()
    expect(viewer.locator(".sv-form-note")).to_contain_text("draft_max=3")
    presenter.locator(".sv-step").click()
    viewer.wait_for_selector(".sv-knobmark")
    expect(viewer.locator('.sv-field[data-knob="draft_max"] input')).to_have_value("3")
    # a path typed into the draft-model field is refused beside it; no file is named back
    presenter.locator(".sv-strategy").select_option("draft")
    presenter.wait_for_selector('.sv-field[data-knob="draft_model"]')
    presenter.locator('.sv-field[data-knob="draft_model"] input').fill("/etc/passwd")
    presenter.locator(".sv-apply").click()
    presenter.wait_for_selector('.sv-field[data-knob="draft_model"].sv-invalid')
    err = presenter.locator('.sv-field[data-knob="draft_model"] .sv-field-err').inner_text()
    assert "not one of the server's draft models" in err and "root:" not in err
    # Play on the presenter's page, Pause: the viewer follows and stops with it
    presenter.locator(".sv-play").click()
    for _ in range(600):
        if rounds(viewer) > 20:
            break
        viewer.wait_for_timeout(100)
    expect(viewer.locator(".sv-play")).to_be_disabled()  # Pause is the presenter's too
    root(presenter).evaluate(send, {"type": "cmd", "cmd": "pause"})  # the Pause button's message (no race
    expect(presenter.locator(".sv-play")).to_contain_text("Play", timeout=30000)  # with the end of the text)
    expect_attr(viewer, "data-rounds", str(rounds(presenter)))
    for p in (presenter, viewer):
        assert p.external == [] and p.errors == []


def test_a_page_that_joins_late_catches_up(browser, shared_app):
    from playwright.sync_api import expect

    presenter = open_page(browser, shared_app + f"?presenter={PRESENTER}")
    expect(presenter.locator(".sv-reset")).to_be_enabled(timeout=60000)
    presenter.locator(".sv-reset").click()  # a new generation (the previous test may have played it out)
    expect_attr(presenter, "data-rounds", "0")
    expect(presenter.locator(".sv-step")).to_be_enabled(timeout=60000)
    start_rounds = 0
    presenter.locator(".sv-runn").fill("25")
    presenter.locator(".sv-run").click()
    expect_attr(presenter, "data-rounds", str(start_rounds + 25))
    late = open_page(browser, shared_app)
    expect_attr(late, "data-rounds", str(start_rounds + 25))
    assert root(late).get_attribute("data-events") == root(presenter).get_attribute("data-events")
    assert late.locator(".sv-stream .sv-tok").count() == presenter.locator(".sv-stream .sv-tok").count()
    expect(late.locator(".sv-audience")).to_contain_text("Watching")
    # and it follows the next rounds live
    presenter.locator(".sv-step").click()
    expect_attr(late, "data-rounds", str(start_rounds + 26))
    assert late.external == [] and late.errors == []


def test_per_page_sessions_both_progress_and_beyond_the_cap_the_server_is_busy(
    browser, tiny_model_path, tmp_path_factory
):
    from playwright.sync_api import expect

    proc, url = serve_proc(tiny_model_path, tmp_path_factory, max_sessions=2)
    try:
        pages = [open_page(browser, url) for _ in range(2)]
        for p in pages:
            expect(p.locator(".sv-play")).to_be_enabled(timeout=60000)
            assert p.locator(".sv-audience").is_hidden()  # no presenter mode: no banner
        for p in pages:
            p.locator(".sv-play").click()
        # both pages progress while both play (one decode at a time, in turns)
        for _ in range(1200):
            if all(rounds(p) >= 30 for p in pages):
                break
            pages[0].wait_for_timeout(100)
        assert all(rounds(p) >= 30 for p in pages), [rounds(p) for p in pages]
        for p in pages:
            root(p).evaluate("(el) => el.__specviz.send({type: 'cmd', cmd: 'pause'})")
        # a third page: busy
        third = browser.new_page()
        offline(third)
        third.goto(url)
        third.wait_for_selector(".specviz-busy", timeout=60000)
        assert "All 2 sessions of this server are in use" in third.locator(".specviz-busy").inner_text()
        assert third.locator(".specviz-inspector").count() == 0
        third.close()
        # a page that goes away frees its place (Bokeh lets its document go shortly after)
        pages[0].close()
        for _ in range(60):
            again = browser.new_page()
            offline(again)
            again.goto(url)
            # the page shows an inspector at once; it starts a session, or turns into the busy notice
            again.wait_for_selector(".specviz-inspector .sv-stream .sv-tok.sv-prompt, .specviz-busy", timeout=60000)
            if again.locator(".specviz-busy").count() == 0:
                break
            again.close()
            pages[1].wait_for_timeout(1000)
        assert again.locator(".specviz-busy").count() == 0 and again.locator(".sv-stream .sv-tok.sv-prompt").count() > 0
        expect(again.locator(".sv-step")).to_be_enabled(timeout=60000)
    finally:
        stop(proc)
