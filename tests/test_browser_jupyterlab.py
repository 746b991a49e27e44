"""JupyterLab on loopback: open the quick start, Run All Cells, find the rendered inspector and its tokens."""

from __future__ import annotations

import secrets
import shutil

import pytest
from browser_util import ROOT, SCREENSHOTS, free_port, need_browser, offline, start, stop, wait_http

from specviz.testing.page_harness import jupyterlab_args

pytestmark = pytest.mark.browser


def test_quickstart_renders_the_inspector_in_jupyterlab(tiny_model_path, tmp_path):
    need_browser()
    pytest.importorskip("jupyterlab")
    from playwright.sync_api import expect, sync_playwright

    from specviz.testing.page_harness import launch

    nbdir = tmp_path / "nb"
    nbdir.mkdir()
    shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", nbdir / "quickstart.ipynb")
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
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"http://127.0.0.1:{port}/lab/tree/quickstart.ipynb?reset&token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=120000)
            # some Lab versions still ask for the kernel despite the notebook's kernelspec: accept python3
            try:
                page.locator(".jp-Dialog .jp-mod-accept").click(timeout=8000)
            except Exception:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120000)
            page.locator(".lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
            page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
            root = page.locator(".specviz-inspector").first
            try:
                root.wait_for(timeout=120000)
            except Exception:
                page.screenshot(path=str(tmp_path / "lab_failure.png"))
                raise AssertionError("no inspector rendered; console:\n" + "\n".join(console[-30:])) from None
            expect(root.locator(".sv-stream .sv-tok.sv-prompt").first).to_be_visible(timeout=60000)
            # the notebook steps, configures and plays to the end: the widget follows
            expect(root.locator(".sv-finished")).to_be_visible(timeout=120000)
            assert (
                root.locator(
                    ".sv-stream .sv-tok.sv-corr, .sv-stream .sv-tok.sv-acc, .sv-stream .sv-tok.sv-plain"
                ).count()
                > 0
            )
            expect(root.locator(".sv-kv .main-svg").first).to_be_attached(timeout=60000)
            for label in ("No", "Dismiss"):  # the "Jupyter news?" toast, if any
                btn = page.locator(".jp-toast-button", has_text=label)
                if btn.count():
                    btn.first.click()
            root.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(800)
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "jupyterlab_quickstart.png"))
            # the replay cell renders a second inspector, without any model
            expect(page.locator(".specviz-inspector")).to_have_count(2, timeout=60000)
            b.close()
            assert external == [], f"requests left the machine: {external}"
    finally:
        stop(proc)


@pytest.mark.embedded
def test_quickstart_on_the_embedded_model_writes_the_screenshot(tmp_path):
    """The quick start run in JupyterLab on Gemma 3 270M: the inspector renders, plays to the end, offline."""
    need_browser()
    pytest.importorskip("jupyterlab")
    import sys
    import time

    sys.path.insert(0, str(ROOT / "examples"))
    from make_screenshots import jupyterlab_screenshot

    out = SCREENSHOTS / "jupyterlab_inspector.png"
    t0 = time.time()
    shown = jupyterlab_screenshot(out, workdir=tmp_path)
    assert out.stat().st_mtime >= t0 - 1 and out.stat().st_size > 50_000
    assert shown["inspectors"] == 2 and shown["tokens"] > 0
    assert shown["external"] == [], f"requests left the machine: {shown['external']}"
    assert not [c for c in shown["console"] if c.startswith("pageerror")]
