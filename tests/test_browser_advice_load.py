"""The inspector's advice panel in a real chromium (the Panel app's replay, no network): advice computed from
a recording whose rounds show a burst of outside load says so (the verdict and CPU share, the advisor's notes,
the card's ``data-load``), in Python's words; advice from a quiet recording shows no busy wording."""

from __future__ import annotations

import json

import pytest
from browser_util import SCREENSHOTS, browser_fixture, free_port, offline, start, stop, wait_http

pytestmark = [pytest.mark.browser, pytest.mark.slow]

#: The synthetic rounds that a burst of outside load slowed (of 143), and by how much.
BURST = range(40, 70)
FACTOR = 3.0


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


def _recording(path, burst: range) -> None:
    """A synthetic recording with each round's CPU figures: the rounds in ``burst`` took :data:`FACTOR` times
    as long with a CPU share of 0.3 of 2 threads (the cores held by other work), the others a share of 0.95."""
    from specviz.testing.synthetic import synthetic_rounds

    with path.open("w") as f:
        for group in synthetic_rounds(300, seed=1):
            for e in group:
                if e["kind"] == "verified":
                    slowed = e["round"] in burst
                    e["seconds"] *= FACTOR if slowed else 1.0
                    share = 0.3 if slowed else 0.95
                    e.update(round_seconds=e["seconds"], cpu_seconds=share * e["seconds"] * 2, n_threads=2)
                f.write(json.dumps(e) + "\n")


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    """Two ``specviz replay`` servers, started together: a recording with a burst and a quiet one."""
    tmp = tmp_path_factory.mktemp("advice-load")
    served = {}
    try:
        for name, burst in (("burst", BURST), ("quiet", range(0))):
            path = tmp / f"{name}.jsonl"
            _recording(path, burst)
            port = free_port()
            args = ["-m", "specviz.server.app", "replay", str(path), "--port", str(port)]
            served[name] = (path, f"http://127.0.0.1:{port}/", start(args, path.with_suffix(".log")))
        for _path, url, proc in served.values():
            wait_http(url, proc)
        yield {name: (path, url) for name, (path, url, _proc) in served.items()}
    finally:
        for _path, _url, proc in served.values():
            stop(proc)


def _advised(browser, url):
    """A page on ``url`` once the Advise button's advice is shown; the page's requests that left the machine
    and its script errors."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1320, "height": 1000})
    external = offline(page)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    expect(page.locator(".specviz-inspector")).to_have_attribute("data-rounds", "143", timeout=60000)
    page.locator(".sv-advise").click()
    expect(page.locator(".sv-advice-card .sv-flags")).to_contain_text("--spec-type", timeout=60000)
    return page, external, errors


def test_the_advice_panel_says_a_burst_of_outside_load_in_pythons_words(browser, replays):
    from playwright.sync_api import expect

    from specviz.analysis.advise import advise
    from specviz.decoding.recorder import read_events

    path, url = replays["burst"]
    expected = advise(read_events(path)).to_dict()["load"]
    assert expected["verdict"] == "burst" and expected["flagged"] == len(BURST)
    page, external, errors = _advised(browser, url)
    card = page.locator(".sv-advice-card")
    expect(card).to_have_attribute("data-load", "burst")
    head = card.locator(".sv-advice-load-on .sv-advice-load-h")
    expect(head).to_have_text(expected["headline"])
    assert head.inner_text().startswith(
        f"the timings were taken under outside load (a burst: {len(BURST)} of 143 rounds flagged); CPU share"
    )
    notes = card.locator(".sv-advice-load-note")
    assert notes.all_inner_texts() == expected["notes"] and "left out" in expected["notes"][0]
    assert card.locator(".sv-advice-load-on").get_attribute("title") == expected["text"]  # the report's load line
    assert card.locator(".sv-advice-figures").count() == 0  # no fresh curve behind a replay's advice
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    card.screenshot(path=str(SCREENSHOTS / "advice_load_burst.png"))
    assert external == [] and errors == []


def test_the_advice_panel_on_a_quiet_recording_says_nothing_busy(browser, replays):
    from playwright.sync_api import expect

    _path, url = replays["quiet"]
    page, external, errors = _advised(browser, url)
    card = page.locator(".sv-advice-card")
    expect(card).to_have_attribute("data-load", "quiet")
    assert card.locator(".sv-advice-load-on").count() == 0
    line = card.locator(".sv-advice-load")
    expect(line).to_have_text("the timings look quiet (0 of 143 rounds flagged); CPU share 95% of 2 threads")
    assert "sv-muted" in (line.get_attribute("class") or "")
    text = card.inner_text()
    assert "outside load" not in text and "busy" not in text
    assert external == [] and errors == []


def test_the_advice_panel_shows_the_fresh_and_the_recorded_speedup_side_by_side(browser):
    # advice scored with a fresh curve the recorded times disagree with, delivered to the front-end as the
    # workbench sends it
    from test_advise import linear
    from test_advise_load import recording

    from specviz.analysis.advise import advise
    from specviz.testing.page_harness import open_harness

    fresh = linear(0.010, 0.0005)
    adv = advise(recording(plain=0.016, drafted=3 * fresh(9)), cost=fresh, scale_to_rounds=True, fresh=True)
    assert adv.load is not None and adv.load.scored_fresh and adv.as_recorded is not None and adv.best is not None
    page = open_harness(browser)
    page.evaluate("m => window.__deliver(m)", {"type": "advice", "data": json.loads(json.dumps(adv.to_dict()))})
    card = page.locator(".sv-advice-card")
    card.locator(".sv-advice-figures").wait_for()
    assert card.get_attribute("data-load") == "steady load"
    assert card.locator(".sv-advice-load-h").inner_text() == adv.load.headline()  # what the fresh curve saw
    figures = card.locator(".sv-advice-figure")
    assert figures.all_inner_texts() == [
        f"on this machine now: {adv.best.speedup:.2f}×",
        f"as recorded, under load: {adv.as_recorded.speedup:.2f}×",
    ]
    first, second = (figures.nth(i).bounding_box() for i in range(2))
    assert first is not None and second is not None
    assert second["x"] > first["x"] and abs(second["y"] - first["y"]) < 2  # side by side, on one line
    assert any("scored with the fresh measurement" in n for n in card.locator(".sv-advice-load-note").all_inner_texts())
    card.screenshot(path=str(SCREENSHOTS / "advice_load_fresh.png"))
    assert page.external_requests == []
