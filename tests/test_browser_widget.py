"""The front-end module in a real chromium with a scripted host (no server): rendering and interaction."""

from __future__ import annotations

import pytest
from browser_util import browser_fixture

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


def deliver(page, msg):
    page.evaluate("m => window.__deliver(m)", msg)


def feed(page, groups, epoch=0, start=0):
    n = start
    for g in groups:
        deliver(page, {"type": "events", "epoch": epoch, "start": n, "events": g})
        n += len(g)
    return n


@pytest.fixture()
def groups():
    from specviz.testing.synthetic import synthetic_rounds

    return synthetic_rounds(120, seed=3)


def test_tokens_of_each_kind_hover_and_alternatives(browser, groups):
    from specviz.testing.page_harness import open_harness

    page = open_harness(browser)
    assert page.evaluate("window.__sent")[0] == {"type": "hello", "epoch": -1, "have": 0}
    feed(page, groups)
    root = page.locator(".specviz-inspector")
    n_rounds = len(groups) - 1
    assert root.get_attribute("data-rounds") == str(n_rounds)
    for cls in ("sv-prompt", "sv-acc", "sv-bonus", "sv-corr", "sv-plain", "sv-rej"):
        assert page.locator(f".sv-stream .sv-tok.{cls}").count() > 0, cls
    # counts match the events
    evs = [e for g in groups for e in g]
    n_acc = sum(e["n_accepted"] for e in evs if e["kind"] == "accepted")
    n_rej = sum(len(e["tokens"]) for e in evs if e["kind"] == "rejected")
    assert page.locator(".sv-stream .sv-acc").count() == n_acc
    assert page.locator(".sv-stream .sv-rej").count() == n_rej
    # whitespace is visible: a newline token shows ↵ and a space shows ·
    assert page.locator(".sv-stream .sv-tok", has_text="↵").count() > 0
    assert page.locator(".sv-stream .sv-tok", has_text="·").count() > 0
    # hover a rejected token: text, id, round, depth, draft p and target p
    rej_ev = next(e for e in evs if e["kind"] == "rejected")
    first = page.locator(f'.sv-r[data-round="{rej_ev["round"]}"] .sv-rej').first
    first.hover()
    tip = page.locator(".sv-tip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    for label in ("text", "id", "round", "depth", "draft p", "target p"):
        assert label in text
    assert str(rej_ev["tokens"][0]) in text and f"{rej_ev['draft_probs'][0]:.3f}" in text
    # click: the target's alternatives
    first.click()
    alts = page.locator(".sv-alts .sv-alt")
    assert alts.count() == len(rej_ev["alternatives"])
    assert "chosen" in page.locator(".sv-alts .sv-alt-chosen").inner_text()
    # collapsible: one group, then all
    grp = page.locator(".sv-rejg").first
    grp.locator(".sv-rejtgl").click()
    assert not grp.locator(".sv-rej").first.is_visible()
    page.locator(".sv-showrej").uncheck()
    assert page.locator(".sv-stream .sv-rej:visible").count() == 0
    # telemetry cards and charts follow the last round
    tel = [e for e in evs if e["kind"] == "telemetry"][-1]["data"]
    assert page.locator('.sv-stat[data-k="generated"] .sv-stat-v').inner_text() == str(tel["n_generated"])
    page.wait_for_function(f"document.querySelector('.specviz-inspector').dataset.chartRounds === '{n_rounds}'")
    assert page.locator(".sv-chart .main-svg").count() >= 5
    assert page.external_requests == []


def test_only_new_events_are_applied_and_gaps_are_requested(browser, groups):
    from specviz.testing.page_harness import open_harness

    page = open_harness(browser)
    n = feed(page, groups[:5])
    root = page.locator(".specviz-inspector")
    assert root.get_attribute("data-events") == str(n)
    # the same message again (a second hello answered twice): nothing is applied twice
    deliver(page, {"type": "events", "epoch": 0, "start": n - len(groups[4]), "events": groups[4]})
    assert root.get_attribute("data-events") == str(n)
    assert root.get_attribute("data-rounds") == "4"
    # a gap: the view asks for what it misses instead of applying out of order
    deliver(page, {"type": "events", "epoch": 0, "start": n + len(groups[5]), "events": groups[6]})
    assert root.get_attribute("data-events") == str(n)
    assert page.evaluate("window.__sent")[-1] == {"type": "hello", "epoch": 0, "have": n}
    # a new epoch (reset) clears the views
    feed(page, groups[:1], epoch=1)
    assert root.get_attribute("data-events") == "1"
    assert page.locator(".sv-stream .sv-acc").count() == 0


def test_plotly_comes_from_the_host_when_the_page_lacks_it(browser, groups):
    from specviz.testing.page_harness import open_harness
    from specviz.ui.core import plotly_source

    page = open_harness(browser, preload_plotly=False)
    feed(page, groups[:10])
    sent = page.evaluate("window.__sent")
    assert {"type": "plotly"} in sent
    assert page.locator(".sv-chart-loading").count() == 8  # one per chart card (the memory chart is the 8th)
    deliver(page, {"type": "plotly", "source": plotly_source()})
    page.wait_for_selector(".sv-kv .main-svg")
    assert page.locator(".sv-chart-loading").count() == 0
    assert page.external_requests == []


def test_knob_form_sends_values_and_shows_errors_beside_fields(browser):
    from specviz.strategies import strategy_names, strategy_schema
    from specviz.testing.page_harness import open_harness

    page = open_harness(browser)
    schema = strategy_schema("prompt-lookup").to_list()
    deliver(
        page,
        {
            "type": "state",
            "replay": False,
            "running": False,
            "finished": None,
            "can_step": True,
            "can_reset": True,
            "can_control": True,
            "strategy": "prompt-lookup",
            "knobs": {k["name"]: k["default"] for k in schema},
            "schema": schema,
            "strategies": strategy_names(),
            "pending": None,
            "epoch": 0,
        },
    )
    field = page.locator('.sv-field[data-knob="draft_max"]')
    field.locator("input").fill("0")
    page.locator(".sv-apply").click()
    msg = page.evaluate("window.__sent")[-1]
    assert msg["type"] == "configure" and msg["strategy"] == "prompt-lookup" and msg["knobs"]["draft_max"] == "0"
    deliver(
        page,
        {
            "type": "knob_errors",
            "errors": {"draft_max": "knob 'draft_max': 0 is not allowed"},
            "general": "nothing changed",
        },
    )
    assert "sv-invalid" in field.get_attribute("class")
    assert "not allowed" in field.locator(".sv-field-err").inner_text()
    page.locator(".sv-step").click()
    assert page.evaluate("window.__sent")[-1] == {"type": "cmd", "cmd": "step"}
    page.locator(".sv-runn").fill("7")
    page.locator(".sv-run").click()
    assert page.evaluate("window.__sent")[-1] == {"type": "cmd", "cmd": "run", "n": 7}
    deliver(page, {"type": "state", "running": True})
    assert "Pause" in page.locator(".sv-play").inner_text()
    assert page.locator(".sv-step").is_disabled()


def _chart_traces(page, key):
    """The plotly traces drawn in chart ``key`` (name → number of points), read from the chart element."""
    return page.evaluate(
        """k => {
        const gd = document.querySelector(`.sv-chart-card[data-chart="${k}"] .sv-chart`);
        return (gd.data || []).map(t => ({n: (t.x || []).length, y: t.y, base: t.base, hover: t.hovertemplate || ""}));
    }""",
        key,
    )


def test_draft_context_confidence_and_expected_tokens_are_charted(browser):
    from specviz.testing.page_harness import open_harness
    from specviz.testing.synthetic import synthetic_rounds

    groups = synthetic_rounds(150, seed=4, draft_model=True)
    page = open_harness(browser)
    feed(page, groups)
    n_rounds = len(groups) - 1
    page.wait_for_function(f"document.querySelector('.specviz-inspector').dataset.chartRounds === '{n_rounds}'")
    evs = [e for g in groups for e in g]
    # KV timeline: the draft context's before → after and its rollback beside the target's
    kv = _chart_traces(page, "kv")
    hovers = " ".join(t["hover"] for t in kv)
    assert "draft ctx" in hovers and "draft rollback" in hovers and "target rollback" in hovers
    last = [e for e in evs if e["round"] == n_rounds]
    ver = next(e for e in last if e["kind"] == "verified")
    draft_trace = next(t for t in kv if "draft ctx" in t["hover"])
    assert draft_trace["base"][-1] == ver["draft_kv_before"]
    rb = next((e for e in last if e["kind"] == "kv_rollback" and e["context"] == "draft"), None)
    after = rb["to_pos"] if rb else ver["draft_kv_peak"]
    assert draft_trace["base"][-1] + draft_trace["y"][-1] == after
    legend = page.locator('.sv-chart-card[data-chart="kv"] .sv-chart-legend').inner_text()
    assert "draft ctx: rolled back" in legend
    # draft confidence: one bar per bucket with the telemetry's rates; draft_p_min is not in the state yet
    buckets = [e for e in evs if e["kind"] == "telemetry"][-1]["data"]["draft_buckets"]
    conf = _chart_traces(page, "conf")
    assert conf[0]["y"] == [b["rate"] for b in buckets]
    assert page.locator('.sv-chart-card[data-chart="conf"] .sv-chart-note').is_hidden()
    # draft_p_min of the draft strategy is marked once the state says so
    deliver(
        page,
        {
            "type": "state",
            "strategy": "draft",
            "knobs": {"draft_p_min": 0.3},
            "schema": [],
            "strategies": ["draft"],
            "running": False,
            "can_step": True,
            "can_control": True,
        },
    )
    page.wait_for_function(
        "document.querySelector('.sv-chart-card[data-chart=\"conf\"] .sv-chart-legend')"
        ".textContent.includes('draft_p_min = 0.3')"
    )
    # expected vs realised tokens per round (cost policy) and the draft model's own speed
    tpr = _chart_traces(page, "tpr")
    exp = [e["expected_tokens"] for e in evs if e["kind"] == "draft_proposed"][-len(tpr[0]["y"]) :]
    assert any("expected" in t["hover"] for t in tpr)
    assert next(t for t in tpr if "round %{x}: expected" in t["hover"])["y"] == exp
    extra = page.locator(".sv-extra-stats").inner_text()
    assert "draft-model tok/s" in extra and "expected vs" in extra
    # what the cost policy works from, as the last telemetry says
    policy = [e for e in evs if e["kind"] == "telemetry"][-1]["data"]["policy"]
    run = page.locator(".sv-extra-stats .sv-policy-run").inner_text()
    assert run == f"{policy['run']} accepted in a row"
    acc = page.locator(".sv-extra-stats .sv-policy-acc").inner_text()
    assert acc == "acceptance by run: " + " · ".join(
        f"{k} {100 * v:.0f}%" for k, v in policy["acceptance_by_run_position"].items()
    )
    shadow = page.locator(".sv-extra-stats .sv-policy-shadow").inner_text()
    assert shadow == f"{policy['shadow_hits']}/{policy['shadow_tries']} plain-round predictions right"


def test_without_drafter_probabilities_the_confidence_chart_explains_why(browser, groups):
    from specviz.testing.page_harness import open_harness

    page = open_harness(browser)
    feed(page, groups)
    page.wait_for_function(f"document.querySelector('.specviz-inspector').dataset.chartRounds === '{len(groups) - 1}'")
    note = page.locator('.sv-chart-card[data-chart="conf"] .sv-chart-note')
    assert note.is_visible() and "No drafter probabilities" in note.inner_text()
    assert page.locator('.sv-chart-card[data-chart="conf"] .sv-chart').is_hidden()
    # no cost policy: no expected trace, and the subtitle says how to get one
    assert not any("expected" in t["hover"] for t in _chart_traces(page, "tpr"))
    assert "draft_policy = cost" in page.locator('.sv-chart-card[data-chart="tpr"] .sv-card-h').inner_text()
    # no cost policy: no policy figures (nor any other extra figure here)
    assert page.locator(".sv-extra-stats").is_hidden()
    assert page.locator(".sv-policy-acc").count() == 0
    # no draft model: the KV timeline has only the target's bars
    assert not any("draft" in t["hover"] for t in _chart_traces(page, "kv"))


def test_notices_and_malformed_messages_are_shown_and_the_page_keeps_working(browser, groups):
    from specviz.testing.page_harness import open_harness

    page = open_harness(browser)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    n = feed(page, groups[:5])
    # a notice from the host: shown, the same text again counted instead of stacked
    for _ in range(2):
        deliver(page, {"type": "notice", "level": "error", "text": "cmd: unknown command 'jump'"})
    notice = page.locator(".sv-notice")
    assert notice.count() == 1 and "sv-notice-error" in notice.get_attribute("class")
    assert notice.inner_text().startswith("cmd: unknown command 'jump'") and "×2" in notice.inner_text()
    # an events message the page cannot use: refused in the page, nothing applied
    deliver(page, {"type": "events", "epoch": 0, "start": "5", "events": groups[5]})
    assert "malformed events message" in page.locator(".sv-notice").first.inner_text()
    root = page.locator(".specviz-inspector")
    assert root.get_attribute("data-events") == str(n)
    # a message whose handling throws (a schema that is not a list): said in the page, not thrown at the host
    deliver(page, {"type": "state", "strategies": "not-a-list", "schema": 5, "strategy": "x", "knobs": {}})
    assert 'could not handle a "state" message' in page.locator(".sv-notice").first.inner_text()
    deliver(page, {"type": "knob_errors", "errors": None})
    assert errors == []
    # still working: the next round applies, dismissing removes a notice
    feed(page, groups[5:6], start=n)
    assert root.get_attribute("data-rounds") == "5"
    count = page.locator(".sv-notice").count()
    page.locator(".sv-notice-x").first.click()
    assert page.locator(".sv-notice").count() == count - 1
