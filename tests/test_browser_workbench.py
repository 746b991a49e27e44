"""The debugging workbench in the Panel app, in a real chromium with no network (tiny model): rewind from the
token stream and the KV timeline, branch and compare lanes, diagnosis and advice panels, presets, the
sampling form passed on by Reset, snapshot / JSONL downloads and a snapshot upload."""

from __future__ import annotations

import json

import pytest
from browser_util import SCREENSHOTS, browser_fixture, free_port, offline, start, stop, wait_http

pytestmark = pytest.mark.browser

PROMPT = "the cat sat on the mat and the cat sat"
PRESETS = [
    {
        "name": "lookup",
        "title": "prompt lookup",
        "prompt": "the cat of the dog and the a the cat of the",
        "strategy": "prompt-lookup",
        "knobs": {"draft_max": 8},
        "max_tokens": 120,
    },
    {
        "name": "cache",
        "title": "ngram cache",
        "prompt": PROMPT,
        "strategy": "ngram-cache",
        "knobs": {},
        "max_tokens": 60,
    },
]


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


@pytest.fixture(scope="module")
def app(tiny_model_path, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("panel-wb") / "serve.log"
    code = (
        f"from specviz.server.app import serve; "
        f"serve({port}, {str(tiny_model_path)!r}, prompt={PRESETS[0]['prompt']!r}, "
        f"max_tokens=400, n_ctx=2048, draft_max=8, presets={PRESETS!r})"
    )
    proc = start(["-c", code], log)
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc)
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop(proc)


def root(page):
    return page.locator(".specviz-inspector")


def expect_attr(loc, name, value, timeout=60000):
    from playwright.sync_api import expect

    expect(loc).to_have_attribute(name, value, timeout=timeout)


def open_page(browser, app):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1320, "height": 1000}, accept_downloads=True)
    external = offline(page)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(app)
    page.wait_for_selector(".specviz-inspector .sv-tok.sv-prompt", timeout=60000)
    expect(page.locator(".sv-step")).to_be_enabled(timeout=60000)
    return page, external, errors


def state(page, expr):
    return root(page).evaluate(f"el => {{ const s = el.__specviz.state; return {expr}; }}")


def wait_for(page, expr, timeout=30.0):
    """Poll the page's state (the inspector is in a shadow root, out of reach of wait_for_function)."""
    import time

    deadline = time.monotonic() + timeout
    while not state(page, expr):
        if time.monotonic() > deadline:
            raise AssertionError(f"the page's state never satisfied {expr}")
        page.wait_for_timeout(100)


def test_rewind_branch_and_compare_lanes(browser, app):
    from playwright.sync_api import expect

    page, external, errors = open_page(browser, app)
    page.locator(".sv-runn").fill("20")
    page.locator(".sv-run").click()
    expect_attr(root(page), "data-rounds", "20")
    n_tokens = state(page, "s.tokens.length")
    # click a token of round 8 and rewind to right after that round
    page.locator(".sv-stream .sv-r[data-round='8'] .sv-tok").first.click()
    page.locator(".sv-actions .sv-rewind-round").click()
    expect_attr(root(page), "data-rounds", "8")
    expect(page.locator(".sv-stream .sv-rewindmark")).to_have_count(1)
    assert page.locator(".sv-stream .sv-r[data-round='9']").count() == 0
    assert state(page, "s.tokens.length") < n_tokens and state(page, "s.rewinds") == 1
    assert page.locator('.sv-stat[data-k="rounds"] .sv-stat-v').inner_text() == "8"
    # step on: round 9 again
    page.locator(".sv-step").click()
    expect_attr(root(page), "data-rounds", "9")
    # rewind to just before a token (a position inside a round when the round committed several)
    page.locator(".sv-stream .sv-r[data-round='4'] .sv-tok:not(.sv-rej)").last.click()
    page.locator(".sv-actions .sv-rewind-pos").click()
    wait_for(page, "s.rewinds === 2")
    expect(page.locator(".sv-stream .sv-rewindmark")).to_have_count(1)
    assert int(root(page).get_attribute("data-rounds")) <= 4
    # the KV timeline: a click on a round's bar rewinds there
    page.locator(".sv-runn").fill("6")
    page.locator(".sv-run").click()
    page.wait_for_timeout(1500)
    rounds_now = int(root(page).get_attribute("data-rounds"))
    page.wait_for_selector(".sv-kv .main-svg", timeout=60000)
    bars = page.locator(".sv-kv .bars .point path")
    bars.nth(1).click(force=True)
    page.wait_for_timeout(1500)
    after = int(root(page).get_attribute("data-rounds"))
    assert after < rounds_now
    page.locator(".sv-run").click()
    expect_attr(root(page), "data-rounds", str(after + 6))
    # branch after round 3: a second lane; another setting; run both to their end
    page.locator(".sv-stream .sv-r[data-round='3'] .sv-tok").first.click()
    page.locator(".sv-actions .sv-branch").click()
    expect_attr(page.locator(".sv-lanes-card"), "data-lane", "open")
    page.locator(".sv-lane-knobs").fill("draft_max=2")
    page.locator(".sv-lane-apply").click()
    page.locator(".sv-lane-run").click()
    expect_attr(page.locator(".sv-lanes-card"), "data-lane", "finished", timeout=120000)
    words = page.locator(".sv-lane-words li").all_inner_texts()
    assert any(w.startswith("B differs from A in draft_max 8 → 2") for w in words), words
    assert any("tokens" in w for w in words)
    assert (
        page.locator(".sv-lane-a .sv-lane-cell").count() > 20 and page.locator(".sv-lane-b .sv-lane-cell").count() > 20
    )
    figs = page.locator(".sv-lane-figures").inner_text()
    assert "acceptance" in figs and "mean accepted length" in figs and "tokens/s" in figs
    page.wait_for_selector(".sv-lane-chart .main-svg", timeout=30000)
    # compare from the start with another strategy
    page.locator(".sv-lane-strategy").select_option("ngram-cache")
    page.locator(".sv-lane-knobs").fill("")
    page.locator(".sv-lane-compare").click()
    expect(page.locator(".sv-lane-sub")).to_contain_text("B: ngram-cache", timeout=120000)
    expect_attr(page.locator(".sv-lanes-card"), "data-lane", "finished", timeout=120000)
    assert any("strategy prompt-lookup → ngram-cache" in w for w in page.locator(".sv-lane-words li").all_inner_texts())
    # diagnosis (sent when the generation finished) and advice
    page.locator(".sv-diagnose").click()
    expect(page.locator(".sv-diag-card .sv-findings li").first).to_be_visible(timeout=30000)
    assert page.locator(".sv-diag-depth tr").count() >= 1
    page.locator(".sv-advise").click()
    expect(page.locator(".sv-advice-card .sv-flags")).to_contain_text("--spec-type", timeout=60000)
    expect(page.locator(".sv-advice-card .sv-advice-why")).to_contain_text("why: ")  # why it was or was not advised
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "panel_workbench_tiny_model.png"), full_page=True)
    page.locator(".sv-lane-close").click()
    expect_attr(page.locator(".sv-lanes-card"), "data-lane", "closed")
    # a refused rewind: an error shown, nothing changed
    before = root(page).get_attribute("data-events")
    root(page).evaluate("(el) => el.__specviz.send({type: 'rewind', round: 9999})")
    expect(page.locator(".sv-notice-error").first).to_contain_text("outside the committed rounds", timeout=30000)
    assert root(page).get_attribute("data-events") == before
    assert external == [] and errors == []


def test_presets_sampling_form_and_files(browser, app, tmp_path):
    from playwright.sync_api import expect

    page, external, errors = open_page(browser, app)
    # presets: one click to another starting point
    page.locator(".sv-preset[data-preset='cache']").click()
    expect(page.locator(".sv-pill-strategy")).to_have_text("ngram-cache", timeout=30000)
    assert state(page, "s.started.prompt_pieces.join('')").endswith(PROMPT)
    page.locator(".sv-preset[data-preset='lookup']").click()
    expect(page.locator(".sv-pill-strategy")).to_have_text("prompt-lookup", timeout=30000)
    # the new-session form: sampling settings and stop strings, passed on by Reset
    page.locator(".sv-newsession summary").click()
    page.locator(".sv-temp").fill("0.7")
    page.locator(".sv-topk").fill("5")
    page.locator(".sv-topp").fill("0.9")
    page.locator(".sv-seed").fill("3")
    page.locator(".sv-stops").fill("zzz\\nqq")
    page.locator(".sv-reset").click()
    wait_for(page, "s.started && s.started.temperature === 0.7")
    st = state(page, "s.started")
    assert (st["temperature"], st["top_k"], st["top_p"], st["seed"], st["stop"]) == (0.7, 5, 0.9, 3, ["zzz\nqq"])
    page.locator(".sv-topk").fill("lots")
    page.locator(".sv-reset").click()
    expect(page.locator(".sv-notice-error").first).to_contain_text("'top_k' must be an integer", timeout=30000)
    page.locator(".sv-temp").fill("0")
    page.locator(".sv-topk").fill("0")
    page.locator(".sv-topp").fill("1")
    page.locator(".sv-reset").click()
    wait_for(page, "s.started && s.started.temperature === 0")
    page.locator(".sv-runn").fill("10")
    page.locator(".sv-run").click()
    expect_attr(root(page), "data-rounds", "10")
    # snapshot download, JSONL download
    with page.expect_download() as dl:
        page.locator(".sv-snapshot").click()
    snap = tmp_path / "snap.bin"
    dl.value.save_as(snap)
    assert snap.read_bytes().startswith(b"SPECVIZ-SNAPSHOT-1\n")
    with page.expect_download() as dl:
        page.locator(".sv-record").click()
    rec = tmp_path / "rec.jsonl"
    dl.value.save_as(rec)
    kinds = [json.loads(x)["kind"] for x in rec.read_text().splitlines()]
    assert kinds[0] == "session_started" and kinds.count("telemetry") == 10
    # go on, then load the snapshot: back at round 10
    page.locator(".sv-step").click()
    expect_attr(root(page), "data-rounds", "11")
    page.locator(".sv-upload").set_input_files(str(snap))
    expect_attr(root(page), "data-rounds", "10")
    page.locator(".sv-step").click()
    expect_attr(root(page), "data-rounds", "11")
    assert external == [] and errors == []


@pytest.mark.embedded
def test_workbench_on_the_embedded_model_writes_the_screenshot(browser):
    """The demo's losing summary on Gemma: played, rewound, compared with the cost policy, diagnosed, advised."""
    import sys
    import time

    from browser_util import ROOT

    sys.path.insert(0, str(ROOT / "examples"))
    from make_screenshots import workbench_screenshot

    out = SCREENSHOTS / "panel_workbench.png"
    t0 = time.time()
    shown = workbench_screenshot(out, browser=browser)
    assert out.stat().st_mtime >= t0 - 1 and out.stat().st_size > 50_000
    assert any(w.startswith("B differs from A in draft_policy fixed → cost") for w in shown["words"])
    assert shown["findings"] and shown["flags"].startswith("--spec-type")
    assert shown["external"] == [] and shown["errors"] == []
