"""A batched run in a real chromium (no network): ``specviz replay`` of a tiny model's requests run three at a
time shows the Verify batch card (one row per slot for a step, each lane's rows in the decode with its accepted
draft tokens, busy sequences over time as a bar per step) and, on Advise with a given batch-cost table, the
speedup-against-concurrency chart with the break-even Python computed marked; the same front-end on an
anywidget-style host shows the lanes from delivered events and hides them for one request; and in JupyterLab
``Inspector.replay(path, batch_cost=...)`` with its ``advise()`` shows both."""

from __future__ import annotations

import json

import pytest
from batch_recording import record_batched_run
from browser_util import SCREENSHOTS, browser_fixture, free_port, offline, start, stop, wait_http
from test_advise_parallel import KNEE

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for this module (skips with a reason without one; fails in CI)."""
    yield from browser_fixture()


@pytest.fixture(scope="module")
def recorded(tiny_model_path, tmp_path_factory):
    """The batched recording, its steps, and a batch-cost table file (rows nearly free up to 8 in a decode)."""
    tmp = tmp_path_factory.mktemp("batch-browser")
    path = tmp / "batched.jsonl"
    steps = record_batched_run(tiny_model_path, path)
    table = tmp / "table.json"
    table.write_text(json.dumps(KNEE.to_dict()))
    return path, steps, table


@pytest.fixture(scope="module")
def served(recorded):
    """``specviz replay`` of the batched recording with the table; its URL."""
    path, _steps, table = recorded
    port = free_port()
    args = ["-m", "specviz.server.app", "replay", str(path), "--port", str(port), "--batch-cost", str(table)]
    proc = start(args, path.with_suffix(".log"))
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_http(url, proc)
        yield url
    finally:
        stop(proc)


def _busy(step: dict) -> int:
    return sum(1 for lane in step["lanes"] if lane["rows"] > 0)


def _break_even(path) -> int:
    """The break-even concurrency the advice under load gives the recording with the table (Python's figure)."""
    from specviz.analysis.advise_fresh import recorded_load
    from specviz.analysis.advise_parallel import advise_parallel
    from specviz.decoding.recorder import read_events
    from specviz.ui.parallel_advice import chart_parallels

    events = read_events(path)
    load = recorded_load(events)
    be = advise_parallel(events, KNEE, chart_parallels(load), load=load).break_even_parallel
    assert be is not None  # the fixture must stop paying somewhere
    return be


def _show_step(page, index: int) -> None:
    """Move the card's step slider to step ``index`` (0-based) as a person would."""
    page.eval_on_selector(
        ".sv-batch-slider", "(e, i) => { e.value = String(i); e.dispatchEvent(new Event('input')); }", index
    )


def _check_step(card, step: dict, n_parallel: int) -> None:
    """The card's rows for ``step``: one per slot, each lane's request, its rows and accepted draft cells."""
    from playwright.sync_api import expect

    expect(card).to_have_attribute("data-step", str(step["round"]))
    slots = card.locator(".sv-batch-slot")
    expect(slots).to_have_count(n_parallel)
    lanes = {lane["slot"]: lane for lane in step["lanes"]}
    for k in range(n_parallel):
        row = slots.nth(k)
        assert row.get_attribute("data-slot") == str(k)
        lane = lanes.get(k)
        if lane is None:
            assert "sv-batch-idle" in (row.get_attribute("class") or "") and row.locator(".sv-batch-cell").count() == 0
            continue
        assert row.get_attribute("data-request") == str(lane["request"])
        assert row.locator(".sv-batch-cell").count() == lane["rows"]  # its pending token and its draft
        assert row.locator(".sv-batch-cell.sv-acc").count() == lane["accepted"]
        assert row.locator(".sv-batch-cell.sv-rej").count() == lane["drafted"] - lane["accepted"]
        assert f"request {lane['request']} · round {lane['round']}" in row.inner_text()


def test_a_replayed_batched_run_shows_its_lanes_and_the_speedup_against_concurrency(browser, recorded, served):
    from playwright.sync_api import expect

    from specviz.analysis.advise_fresh import recorded_load
    from specviz.analysis.advise_parallel import advise_parallel
    from specviz.decoding.recorder import read_events
    from specviz.ui.parallel_advice import chart_parallels

    path, steps, _table = recorded
    page = browser.new_page(viewport={"width": 1320, "height": 1100})
    external = offline(page)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(served)
    card = page.locator(".sv-batch-card")
    expect(card).to_have_attribute("data-steps", str(len(steps)), timeout=60000)
    expect(card).to_be_visible()
    assert "3 slots" in card.locator(".sv-batch-sub").inner_text()
    # the newest step is shown; then a step where a draft was partly accepted
    _check_step(card, steps[-1], 3)
    k = next(i for i, s in enumerate(steps) if any(0 < x["accepted"] < x["drafted"] for x in s["lanes"]))
    _show_step(page, k)
    _check_step(card, steps[k], 3)
    # busy sequences over time: one bar per step, as many as the run's decode held
    assert card.get_attribute("data-busy") == ",".join(str(_busy(s)) for s in steps)
    expect(card).to_have_attribute("data-chart-steps", str(len(steps)), timeout=30000)
    expect(card.locator(".sv-batch-busy .bars .point")).to_have_count(len(steps))
    # the followed request's tokens fill the stream as a one-request session's would
    assert page.locator(".specviz-inspector").get_attribute("data-rounds") != "0"

    events = read_events(path)
    load = recorded_load(events)
    expected = advise_parallel(events, KNEE, chart_parallels(load), load=load).to_dict()
    assert expected["break_even_parallel"] is not None  # the fixture must stop paying somewhere
    page.locator(".sv-advise").click()
    section = page.locator(".sv-advice-card .sv-advice-parallel")
    expect(section).to_have_attribute("data-break-even", str(expected["break_even_parallel"]), timeout=60000)
    chart = section.locator(".sv-advice-parallel-chart")
    expect(chart.locator(".main-svg").first).to_be_attached(timeout=30000)
    drawn = [s for s in expected["settings"] if s != "none"]
    expect(chart.locator(".scatterlayer .trace")).to_have_count(
        len(drawn) + sum(1 for s in drawn if expected["settings"][s]["break_even_parallel"] is not None)
    )
    marks = chart.locator(".textpoint").all_text_contents()
    assert f"break-even {expected['break_even_parallel']}" in marks
    items = section.locator(".sv-advice-parallel-item")
    expect(items).to_have_count(len(drawn))
    assert [items.nth(i).get_attribute("data-break-even") for i in range(len(drawn))] == [
        str(expected["settings"][s]["break_even_parallel"] or "") for s in drawn
    ]
    assert expected["best_single"]["flags"] in section.locator(".sv-advice-parallel-single").inner_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    card.screenshot(path=str(SCREENSHOTS / "batch_lanes.png"))
    section.screenshot(path=str(SCREENSHOTS / "advice_parallel.png"))
    assert external == [] and errors == []


def test_the_widget_host_shows_the_lanes_for_batch_steps_only(browser, recorded, tiny_session):
    from specviz.decoding.recorder import read_events
    from specviz.testing.page_harness import open_harness
    from specviz.ui.batch_stream import batched_groups

    path, steps, _table = recorded
    events = [e.to_dict() for g in batched_groups(read_events(path)) for e in g]
    page = open_harness(browser)
    page.evaluate("m => window.__deliver(m)", {"type": "events", "epoch": 0, "start": 0, "events": events})
    card = page.locator(".sv-batch-card")
    card.wait_for()
    assert card.get_attribute("data-steps") == str(len(steps))
    _check_step(card, steps[-1], 3)
    # one request at a time: a new epoch without batch steps hides the card
    tiny_session.start("the a of the a of", 10, "prompt-lookup")
    tiny_session.run()
    one = [e.to_dict() for e in tiny_session.events]
    page.evaluate("m => window.__deliver(m)", {"type": "events", "epoch": 1, "start": 0, "events": one})
    page.wait_for_function("document.querySelector('.specviz-inspector').dataset.events === '%d'" % len(one))
    assert card.is_hidden()
    assert page.external_requests == []


def test_a_batched_recording_in_jupyterlab_shows_the_lanes_and_the_chart(browser, recorded, tmp_path):
    """The same widget in JupyterLab: ``Inspector.replay(path, batch_cost=...)`` and its ``advise()``, run in a
    notebook on loopback."""
    pytest.importorskip("jupyterlab")
    import secrets

    import nbformat
    from playwright.sync_api import expect

    from specviz.testing.page_harness import jupyterlab_args

    path, steps, table = recorded
    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    code = (
        "from specviz import Inspector\nfrom specviz.ui.parallel_advice import read_batch_cost\n"
        f"w = Inspector.replay({str(path)!r}, batch_cost=read_batch_cost({str(table)!r}))\nw"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code), nbformat.v4.new_code_cell("_ = w.advise()")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(nbdir / "batched.ipynb"))
    port, token = free_port(), secrets.token_hex(16)
    env = {"JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws")}
    proc = start(jupyterlab_args(port, token, str(nbdir)), tmp_path / "lab.log", env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc, timeout=120)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        external = offline(page)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{port}/lab/tree/batched.ipynb?reset&token={token}")
        page.wait_for_selector(".jp-Notebook", timeout=120000)
        try:  # some Lab versions still ask for the kernel despite the notebook's kernelspec
            page.locator(".jp-Dialog .jp-mod-accept").click(timeout=8000)
        except Exception:
            pass
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120000)
        page.locator(".lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
        page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
        card = page.locator(".specviz-inspector .sv-batch-card").first
        expect(card).to_have_attribute("data-steps", str(len(steps)), timeout=180000)
        _check_step(card, steps[-1], 3)
        section = page.locator(".specviz-inspector .sv-advice-parallel").first
        expect(section).to_have_attribute("data-break-even", str(_break_even(path)), timeout=180000)
        expect(section.locator(".sv-advice-parallel-chart .main-svg").first).to_be_attached(timeout=60000)
        assert "break-even" in " ".join(section.locator(".textpoint").all_text_contents())
        page.close()
        assert external == [] and errors == []
    finally:
        stop(proc)
