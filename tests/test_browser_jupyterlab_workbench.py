"""JupyterLab on loopback: the "why is my acceptance low?" notebook, Run All Cells, then the workbench in the
rendered inspector — the rewind marker, the comparison lanes, the diagnosis and advice panels — and a
rewind and a branch clicked in the page."""

from __future__ import annotations

import secrets
import shutil

import pytest
from browser_util import ROOT, SCREENSHOTS, free_port, need_browser, offline, start, stop, wait_http

from specviz.testing.page_harness import jupyterlab_args

pytestmark = pytest.mark.browser

NOTEBOOK = "why_is_my_acceptance_low.ipynb"


def run_all(page, port, token, console):
    page.goto(f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}?reset&token={token}")
    page.wait_for_selector(".jp-Notebook", timeout=120000)
    try:  # some Lab versions still ask for the kernel despite the notebook's kernelspec
        page.locator(".jp-Dialog .jp-mod-accept").click(timeout=8000)
    except Exception:
        pass
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120000)
    page.locator(".lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()


def test_workbench_notebook_in_jupyterlab(tiny_model_path, tmp_path):
    need_browser()
    pytest.importorskip("jupyterlab")
    from playwright.sync_api import expect, sync_playwright

    from specviz.testing.page_harness import launch

    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, nbdir / NOTEBOOK)
    port, token = free_port(), secrets.token_hex(16)
    proc = start(
        jupyterlab_args(port, token, str(nbdir)),
        tmp_path / "lab.log",
        env={
            "SPECVIZ_MODEL": str(tiny_model_path),
            "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
            "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws"),
        },
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc, timeout=120)
        with sync_playwright() as p:
            b = launch(p)
            page = b.new_page(viewport={"width": 1500, "height": 1100})
            external = offline(page)
            console: list[str] = []
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            run_all(page, port, token, console)
            root = page.locator(".specviz-inspector").first
            try:
                root.wait_for(timeout=120000)
            except Exception:
                page.screenshot(path=str(tmp_path / "lab_failure.png"))
                raise AssertionError("no inspector rendered; console:\n" + "\n".join(console[-30:])) from None
            # the notebook rewound, compared and advised: the widget shows each
            expect(root.locator(".sv-stream .sv-rewindmark")).to_have_count(1, timeout=180000)
            expect(root.locator(".sv-lanes-card")).to_have_attribute("data-lane", "finished", timeout=180000)
            expect(root.locator(".sv-lane-words li").first).to_contain_text(
                "B differs from A in draft_policy fixed → cost"
            )
            expect(root.locator(".sv-diag-card .sv-findings li").first).to_be_visible(timeout=60000)
            expect(root.locator(".sv-advice-card .sv-flags")).to_contain_text("--spec-type", timeout=180000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=180000)
            # a rewind and a branch, clicked in the page
            root.locator(".sv-stream .sv-r[data-round='2'] .sv-tok").first.click()
            root.locator(".sv-actions .sv-rewind-round").click()
            expect(root).to_have_attribute("data-rounds", "2", timeout=60000)
            root.locator(".sv-stream .sv-r[data-round='1'] .sv-tok").first.click()
            root.locator(".sv-actions .sv-branch").click()
            expect(root.locator(".sv-lanes-card")).to_have_attribute("data-lane", "open", timeout=60000)
            root.locator(".sv-lane-step").click()
            expect(root).to_have_attribute("data-rounds", "3", timeout=60000)
            for label in ("No", "Dismiss"):  # the "Jupyter news?" toast, if any
                btn = page.locator(".jp-toast-button", has_text=label)
                if btn.count():
                    btn.first.click()
            root.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(800)
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "jupyterlab_workbench_tiny_model.png"))
            b.close()
            assert external == [], f"requests left the machine: {external}"
            assert not [c for c in console if c.startswith("pageerror")], console
    finally:
        stop(proc)


@pytest.mark.embedded
def test_workbench_notebook_on_the_embedded_model_writes_the_screenshot(tmp_path):
    """The notebook in JupyterLab on Gemma 3 270M, offline."""
    need_browser()
    pytest.importorskip("jupyterlab")
    import sys
    import time

    sys.path.insert(0, str(ROOT / "examples"))
    from make_screenshots import jupyterlab_workbench_screenshot

    out = SCREENSHOTS / "jupyterlab_workbench.png"
    t0 = time.time()
    shown = jupyterlab_workbench_screenshot(out, workdir=tmp_path)
    assert out.stat().st_mtime >= t0 - 1 and out.stat().st_size > 50_000
    assert shown["lane"] == "finished" and shown["findings"] > 0
    assert shown["external"] == [] and not [c for c in shown["console"] if c.startswith("pageerror")]
