"""Structured output in a real chromium: the new-session form's JSON schema (and grammar) start a session
under llama.cpp's grammar, and the tokens the grammar forced are marked in the token stream (a dotted
underline, the legend's "forced" key, "forced by the grammar" in the token's detail). A grammar llama.cpp
refuses is shown with its reason and changes nothing; the page stays usable. In both hosts' front-end: the
scripted-host harness (the anywidget host's page) over a real inspector core, and the Panel app of
``specviz serve`` over its own server."""

from __future__ import annotations

import json

import pytest
from browser_util import browser_fixture, free_port, offline, start, stop, wait_http
from test_browser_deployment import Bridge
from test_grammar_forced import SCHEMA

from specviz import Session

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROMPT = "the cat of the dog and the a the cat of the"
BAD_GRAMMAR = 'root ::= "a" |\n  foo'


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


def fill_schema_and_reset(page):
    page.locator(".sv-newsession summary").click()
    page.locator(".sv-json-schema").fill(json.dumps(SCHEMA))
    assert page.locator(".sv-grammar").is_disabled()  # a schema stands instead of the grammar
    page.locator(".sv-reset").click()


def check_marks(page):
    """Forced tokens are drawn with the forced class, the legend names them, and hovering one says why."""
    from playwright.sync_api import expect

    forced = page.locator(".sv-stream .sv-tok.sv-forced")
    expect(forced.first).to_be_visible(timeout=60000)
    assert forced.count() >= 5 and page.locator(".sv-stream .sv-tok:not(.sv-prompt):not(.sv-forced)").count() > 0
    expect(page.locator(".sv-legend .sv-legend-forced")).to_be_visible()
    style = forced.first.evaluate("e => getComputedStyle(e).textDecorationStyle")
    assert style == "dotted"
    forced.first.hover()
    expect(page.locator(".sv-tip").filter(has_text="forced by the grammar")).to_be_visible()
    # the grammar field shows what the session runs under: the schema's conversion
    assert "root ::=" in page.locator(".sv-grammar").input_value()


def refuse_a_bad_grammar(page):
    from playwright.sync_api import expect

    n_tokens = page.locator(".sv-stream .sv-tok").count()
    page.locator(".sv-json-schema").fill("")
    assert not page.locator(".sv-grammar").is_disabled()
    page.locator(".sv-grammar").fill(BAD_GRAMMAR)
    page.locator(".sv-reset").click()
    return n_tokens, expect


def test_a_schema_from_the_form_marks_the_forced_tokens_in_the_harness(browser, tiny_model):
    from specviz.testing.page_harness import open_harness

    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, max_tokens=40, strategy="prompt-lookup")
    page = open_harness(browser)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    bridge = Bridge(page, s)
    try:
        bridge.pump()  # the page's hello
        assert page.locator(".sv-legend .sv-legend-forced").is_hidden()  # no grammar yet
        fill_schema_and_reset(page)
        bridge.pump()
        assert s.generation.grammar is not None and s.text == ""
        page.locator(".sv-runn").fill("60")
        page.locator(".sv-run").click()
        bridge.pump()
        bridge.core.wait(60)
        bridge.pump()
        assert s.text.startswith("{")
        check_marks(page)
        n_tokens, expect = refuse_a_bad_grammar(page)
        bridge.pump()
        expect(page.locator(".sv-notice-error").first).to_contain_text("Undefined rule identifier 'foo' (line 2")
        assert s.text.startswith("{") and page.locator(".sv-stream .sv-tok").count() == n_tokens  # nothing changed
        # still usable: a good grammar starts anew
        page.locator(".sv-grammar").fill('root ::= "Q" (" the" | " cat")+')
        page.locator(".sv-reset").click()
        bridge.pump()
        assert s.generation.grammar is not None and s.generation.grammar.gbnf.startswith('root ::= "Q"')
        assert page.external_requests == [] and errors == []
    finally:
        bridge.core.close()
        s.close()


@pytest.fixture(scope="module")
def served(tiny_model_path, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("panel-grammar") / "serve.log"
    code = (
        f"from specviz.server.app import serve; serve({port}, {str(tiny_model_path)!r}, prompt={PROMPT!r}, "
        "max_tokens=40, n_ctx=512)"
    )
    proc = start(["-c", code], log)
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop(proc)


def test_a_schema_from_the_form_marks_the_forced_tokens_in_the_panel_app(browser, served):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1320, "height": 1000})
    external = offline(page)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(served)
        page.wait_for_selector(".specviz-inspector .sv-tok.sv-prompt", timeout=60000)
        expect(page.locator(".sv-reset")).to_be_enabled(timeout=60000)
        fill_schema_and_reset(page)
        expect(page.locator(".sv-legend .sv-legend-forced")).to_be_visible(timeout=60000)
        expect(page.locator(".sv-run")).to_be_enabled(timeout=60000)
        page.locator(".sv-runn").fill("60")
        page.locator(".sv-run").click()
        page.wait_for_selector(".sv-finished:not([hidden])", timeout=60000)
        check_marks(page)
        n_tokens, _ = refuse_a_bad_grammar(page)
        expect(page.locator(".sv-notice-error").first).to_contain_text("Undefined rule identifier 'foo'", timeout=60000)
        expect(page.locator(".sv-reset")).to_be_enabled(timeout=60000)
        assert page.locator(".sv-stream .sv-tok").count() == n_tokens  # nothing changed
        assert external == [] and errors == []
    finally:
        page.close()
