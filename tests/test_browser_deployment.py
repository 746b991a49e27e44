"""The new-session form's deployment settings in a real chromium, end to end: the page (the front-end in the
scripted-host harness, no network) and a real inspector core over a real session of the tiny model, the
page's messages handed to the core and the core's answers delivered to the page. The form shows the
session's context settings and the cache types its heads allow; Reset makes the context anew with the
chosen ones, or with a whole llama-server command line (its flags not honoured shown as warnings); a
refused setting is shown and changes nothing."""

from __future__ import annotations

import json

import pytest
from browser_util import browser_fixture
from conftest import TINY

from specviz import Session
from specviz.testing.tiny_models import write_tiny_llama
from specviz.ui.core import InspectorCore

pytestmark = pytest.mark.browser

PROMPT = "the cat of the dog and the a the cat of the"


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """A tiny llama whose heads are 32 wide: quantized KV caches fit it."""
    return write_tiny_llama(tmp_path_factory.mktemp("heads") / "wide.gguf", n_head=2, n_head_kv=1, **TINY)


class Bridge:
    """The page and the core: what the page sent is handled by the core, whose answers go to the page."""

    def __init__(self, page, session):
        self.page = page
        self.out: list[dict] = []
        self.core = InspectorCore(self.out.append, session)
        self.seen = 0

    def pump(self):
        sent = self.page.evaluate("window.__sent")
        for msg in sent[self.seen :]:
            self.core.handle(msg)
        self.seen = len(sent)
        answers, self.out[:] = list(self.out), []
        for msg in answers:
            self.page.evaluate("m => window.__deliver(m)", json.loads(json.dumps(msg)))
        return answers


def test_the_form_sets_the_deployment_and_a_server_line(browser, wide_heads):
    from playwright.sync_api import expect

    from specviz.testing.page_harness import open_harness

    s = Session(wide_heads, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, max_tokens=12, strategy="prompt-lookup", draft_max=6)
    page = open_harness(browser)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    bridge = Bridge(page, s)
    try:
        bridge.pump()  # the page's hello: state and events
        page.locator(".sv-newsession summary").click()
        expect(page.locator(".sv-deployment")).to_be_visible()
        assert page.locator(".sv-fa").input_value() == "auto"
        assert page.locator(".sv-nctx").input_value() == "512" and page.locator(".sv-nthreads").input_value() == "1"
        assert "q8_0" in page.locator(".sv-ctk option").all_inner_texts()
        # chosen settings: Reset makes the context anew, and the fields show what it has now
        page.locator(".sv-fa").select_option("on")
        page.locator(".sv-ctk").select_option("q8_0")
        page.locator(".sv-ctv").select_option("q8_0")
        page.locator(".sv-nctx").fill("1024")
        page.locator(".sv-reset").click()
        bridge.pump()
        assert (s.settings.flash_attn, s.settings.cache_type_k, s.settings.cache_type_v) == ("on", "q8_0", "q8_0")
        assert s.settings.n_ctx == 1024 and s.started and s.strategy == "prompt-lookup"
        assert page.locator(".sv-nctx").input_value() == "1024"
        # a refused choice is shown and changes nothing
        page.locator(".sv-fa").select_option("off")
        page.locator(".sv-reset").click()
        bridge.pump()
        expect(page.locator(".sv-notice-error").first).to_contain_text("needs flash attention")
        assert s.settings.flash_attn == "on"
        # a llama-server line instead: the fields are off while it is given; its flags not honoured warn
        page.locator(".sv-server-args").fill("llama-server --spec-type ngram-simple -fa off -c 2048 --port 8090")
        assert page.locator(".sv-fa").is_disabled() and page.locator(".sv-nctx").is_disabled()
        page.locator(".sv-reset").click()
        bridge.pump()
        assert s.strategy == "ngram-simple" and s.settings.flash_attn == "off" and s.settings.n_ctx == 2048
        assert s.settings.cache_type_k == "f16"  # the line's settings: its defaults where it gives none
        expect(page.locator(".sv-notice-warning").first).to_contain_text("--port")
        assert page.locator(".sv-fa").input_value() == "off" and page.locator(".sv-nctx").input_value() == "2048"
        page.locator(".sv-server-args").fill("")
        assert not page.locator(".sv-fa").is_disabled()
        assert page.external_requests == [] and errors == []
    finally:
        bridge.core.close()
        s.close()
