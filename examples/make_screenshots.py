"""Screenshots of the inspector on real sessions: the Panel app and JupyterLab (quick start).

    python examples/make_screenshots.py [--model PATH] [--out docs/screenshots]
        [--only panel|jupyterlab|workbench|jupyterlab-workbench]

* ``panel_inspector.png``: ``specviz serve`` on the model (default: the embedded Gemma 3 270M) in a
  headless chromium — some prompt-lookup rounds, then the ``draft`` strategy with a draft derived from
  the target (layers 0-16; derived once into the specviz cache), captured while Play runs.
* ``jupyterlab_inspector.png``: a local JupyterLab on loopback running ``notebooks/quickstart.ipynb``
  (Run All Cells) on the same model, captured when the inspector has played to the end.

* ``panel_workbench.png``: the debugging workbench in the Panel app (the demo's losing summary preset
  played to its end, rewound, compared with the cost policy from the start, diagnosed and advised).
* ``jupyterlab_workbench.png``: ``notebooks/why_is_my_acceptance_low.ipynb`` run in JupyterLab.

Nothing leaves the machine: every request to another host is aborted (and reported). The browser tests
marked ``embedded`` call :func:`panel_screenshot`, :func:`jupyterlab_screenshot`,
:func:`workbench_screenshot` and :func:`jupyterlab_workbench_screenshot` with an output under
``build/screenshots/`` (git-ignored), never the tracked ``docs/screenshots/``; ``make screenshots`` runs
those tests and copies the pictures into ``docs/screenshots/``. Run this script to retake these four alone
(into ``docs/screenshots/`` by default, or ``--out DIR``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ("http://127.0.0.1", "ws://127.0.0.1", "http://localhost", "ws://localhost", "data:", "blob:")


from specviz.testing.page_harness import free_port as _free_port  # noqa: E402
from specviz.testing.page_harness import jupyterlab_args, wait_http  # noqa: E402


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    wait_http(url, proc, timeout)


from specviz.testing.page_harness import stop_process as _stop  # noqa: E402


def _offline(page) -> list[str]:
    external: list[str] = []

    def route(r):
        if r.request.url.startswith(LOCAL):
            return r.continue_()
        external.append(r.request.url)
        return r.abort()

    page.route("**/*", route)
    return external


def _attr(page, name: str, value: str, timeout: float = 120000) -> None:
    from playwright.sync_api import expect

    expect(page.locator(".specviz-inspector").first).to_have_attribute(name, value, timeout=timeout)


def panel_screenshot(
    out: Path, model: str | None = None, *, draft: bool = True, log: Path | None = None, browser=None
) -> dict:
    """Serve the Panel inspector on ``model``, step a real session and write the screenshot to ``out``.

    ``browser`` is a Playwright browser to use (one is launched otherwise). Returns what was shown:
    ``{"rounds", "kinds": {token class: count}, "external": [...], "errors": [...], "draft_kv": legend}``.
    """
    from playwright.sync_api import sync_playwright

    from specviz.models.embedded import resolve_model
    from specviz.testing.page_harness import launch

    target = resolve_model(model)
    drafts: list[str] = []
    if draft:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from serve_inspector import derive_demo_drafts

        spec = {"0-16": "keep-0-16"} if _n_layer(target) >= 18 else {"0": "keep-0"}
        drafts = [str(p) for p in derive_demo_drafts(target, spec)]
    port = _free_port()
    code = (
        f"from specviz.server.app import serve; serve({port}, {str(target)!r}, max_tokens=400, draft_models={drafts!r})"
    )
    logf = (log or Path(tempfile.mkdtemp()) / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=logf, stderr=subprocess.STDOUT, cwd=str(ROOT))
    try:
        _wait_http(f"http://127.0.0.1:{port}/", proc)
        if browser is not None:
            return _panel_page(browser, port, drafts, out)
        with sync_playwright() as p:
            b = launch(p)
            try:
                return _panel_page(b, port, drafts, out)
            finally:
                b.close()
    finally:
        _stop(proc)
        logf.close()


def _panel_page(b, port: int, drafts: list[str], out: Path) -> dict:
    """Drive one page of the served app and take the screenshot (see :func:`panel_screenshot`)."""
    from playwright.sync_api import expect

    page = b.new_page(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
    external = _offline(page)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{port}/")
    page.wait_for_selector(".specviz-inspector .sv-tok.sv-prompt", timeout=120000)
    expect(page.locator(".sv-step")).to_be_enabled(timeout=60000)
    page.locator(".sv-runn").fill("10")
    page.locator(".sv-run").click()
    _attr(page, "data-rounds", "10")
    rounds = 10
    if drafts:
        page.locator(".sv-strategy").select_option("draft")
        page.wait_for_selector('.sv-field[data-knob="draft_model"] input')
        # a served page picks a draft by the name the server offers it under (never by path)
        page.locator('.sv-field[data-knob="draft_model"] input').fill(Path(drafts[0]).stem)
        page.locator('.sv-field[data-knob="draft_p_min"] input').fill("0.3")
        page.locator('.sv-field[data-knob="draft_max"] input').fill("8")
        page.locator(".sv-apply").click()
        expect(page.locator(".sv-form-note")).to_contain_text("queued", timeout=30000)
        page.locator(".sv-runn").fill("6")
        page.locator(".sv-run").click()
        rounds = 16
        _attr(page, "data-rounds", str(rounds))
    # mid-generation: Play, let a few rounds land, capture while it runs, then Pause
    page.locator(".sv-play").click()
    expect(page.locator(".sv-status")).to_contain_text("running", timeout=30000)
    deadline = time.monotonic() + 30
    while (
        int(page.locator(".specviz-inspector").get_attribute("data-rounds") or 0) < rounds + 2
        and time.monotonic() < deadline
    ):
        page.wait_for_timeout(200)
    page.wait_for_timeout(700)  # let the chart scheduler catch up
    # show a rejected token's alternatives in the detail panel
    rej = page.locator(".sv-stream .sv-rej")
    if rej.count():
        rej.last.click()
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out), full_page=True)
    page.locator(".sv-play").click()
    expect(page.locator(".sv-play")).to_contain_text("Play", timeout=60000)
    kinds = {
        c: page.locator(f".sv-stream .sv-tok.{c}").count()
        for c in ("sv-prompt", "sv-acc", "sv-bonus", "sv-corr", "sv-plain", "sv-rej")
    }
    shown = {
        "rounds": int(page.locator(".specviz-inspector").get_attribute("data-rounds") or 0),
        "kinds": kinds,
        "external": external,
        "errors": errors,
        "draft_kv": page.locator('.sv-chart-card[data-chart="kv"] .sv-chart-legend').inner_text(),
    }
    page.close()
    return shown


def _n_layer(path: Path) -> int:
    from specviz.backends import LlamaModel

    m = LlamaModel(path)
    try:
        return m.n_layer
    finally:
        m.close()


def jupyterlab_screenshot(out: Path, model: str | None = None, *, workdir: Path | None = None) -> dict:
    """Run ``notebooks/quickstart.ipynb`` in a local JupyterLab on ``model`` and write the screenshot.

    Returns ``{"inspectors", "tokens", "external", "console"}`` for the caller to check.
    """
    from playwright.sync_api import expect, sync_playwright

    from specviz.models.embedded import resolve_model
    from specviz.testing.page_harness import launch

    work = workdir or Path(tempfile.mkdtemp(prefix="specviz-lab-"))
    nbdir = work / "nb"
    nbdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", nbdir / "quickstart.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        SPECVIZ_MODEL=str(resolve_model(model)),
        JUPYTER_CONFIG_DIR=str(work / "cfg"),
        JUPYTERLAB_WORKSPACES_DIR=str(work / "ws"),
    )
    logf = (work / "lab.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, *jupyterlab_args(port, token, str(nbdir))],
        stdout=logf,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(ROOT),
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc)
        with sync_playwright() as p:
            b = launch(p)
            page = b.new_page(viewport={"width": 1440, "height": 1180})
            external = _offline(page)
            console: list[str] = []
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"http://127.0.0.1:{port}/lab/tree/quickstart.ipynb?reset&token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=120000)
            try:  # some Lab versions still ask for the kernel despite the kernelspec
                page.locator(".jp-Dialog .jp-mod-accept").click(timeout=5000)
            except Exception:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120000)
            # more room for the notebook: close the left sidebar
            page.locator(".lm-MenuBar-itemLabel").get_by_text("View", exact=True).click()
            item = page.locator(".lm-Menu-itemLabel").get_by_text("Show Left Sidebar", exact=True)
            if item.count():
                item.click()
            else:
                page.keyboard.press("Escape")
            page.locator(".lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
            page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
            root = page.locator(".specviz-inspector").first
            root.wait_for(timeout=120000)
            expect(root.locator(".sv-finished")).to_be_visible(timeout=180000)
            expect(page.locator(".specviz-inspector")).to_have_count(2, timeout=120000)  # the replay cell
            for label in ("No", "Dismiss"):  # the "Jupyter news?" toast, if any
                btn = page.locator(".jp-toast-button", has_text=label)
                if btn.count():
                    btn.first.click()
            rej = root.locator(".sv-stream .sv-rej")
            if rej.count():
                rej.last.click()
            root.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.evaluate(
                "() => { const n = document.querySelector('.jp-WindowedPanel-outer, .jp-Notebook');"
                " if (n) n.scrollTop -= 90; }"
            )
            page.wait_for_timeout(1200)
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
            shown = {
                "inspectors": page.locator(".specviz-inspector").count(),
                "tokens": root.locator(
                    ".sv-stream .sv-tok.sv-acc, .sv-stream .sv-tok.sv-corr, "
                    ".sv-stream .sv-tok.sv-bonus, .sv-stream .sv-tok.sv-plain"
                ).count(),
                "external": external,
                "console": console,
            }
            b.close()
            return shown
    finally:
        _stop(proc)
        logf.close()


def workbench_screenshot(out: Path, model: str | None = None, *, browser=None, log: Path | None = None) -> dict:
    """The debugging workbench in the Panel app on ``model`` (the demo's presets): the losing summary with
    16-token drafts played to its end, rewound, compared with the cost policy from the start, diagnosed
    and advised; writes the screenshot to ``out`` and returns what was shown."""
    from playwright.sync_api import expect, sync_playwright

    from specviz.models.embedded import resolve_model
    from specviz.testing.page_harness import launch
    from specviz.ui.presets import demo_presets

    target = resolve_model(model)
    presets = demo_presets()
    bad = next(p for p in presets if p["name"] == "summarise-fixed")
    port = _free_port()
    code = (
        f"from specviz.server.app import serve; serve({port}, {str(target)!r}, prompt={bad['prompt']!r}, "
        f"max_tokens=96, strategy='prompt-lookup', presets={presets!r}, **{bad['knobs']!r})"
    )
    logf = (log or Path(tempfile.mkdtemp()) / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=logf, stderr=subprocess.STDOUT, cwd=str(ROOT))

    def drive(b) -> dict:
        page = b.new_page(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
        external = _offline(page)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector(".specviz-inspector .sv-tok.sv-prompt", timeout=120000)
        expect(page.locator(".sv-step")).to_be_enabled(timeout=60000)
        page.locator(".sv-play").click()
        expect(page.locator(".sv-finished")).to_be_visible(timeout=300000)
        expect(page.locator(".sv-diag-card .sv-findings li").first).to_be_visible(timeout=60000)
        # rewind to round 6 from the token stream, then compare the cost policy from the start
        page.locator(".sv-stream .sv-r[data-round='6'] .sv-tok").first.click()
        page.locator(".sv-actions .sv-rewind-round").click()
        _attr(page, "data-rounds", "6")
        page.locator(".sv-lane-knobs").fill("draft_policy=cost")
        page.locator(".sv-lane-compare").click()
        expect(page.locator(".sv-lanes-card")).to_have_attribute("data-lane", "finished", timeout=600000)
        page.locator(".sv-advise").click()
        expect(page.locator(".sv-advice-card .sv-flags")).to_contain_text("--spec-type", timeout=300000)
        page.locator(".sv-diagnose").click()
        page.wait_for_timeout(1500)
        # a full-page capture can skip the stream's off-screen chunks (CSS content-visibility): show them all,
        # and the stream's end
        page.locator(".sv-stream").evaluate(
            "e => { e.querySelectorAll('.sv-chunk').forEach((c) => "
            "{ c.style.contentVisibility = 'visible'; }); e.scrollTop = e.scrollHeight; }"
        )
        page.wait_for_timeout(500)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out), full_page=True)
        shown = {
            "rounds": int(page.locator(".specviz-inspector").get_attribute("data-rounds") or 0),
            "words": page.locator(".sv-lane-words li").all_inner_texts(),
            "findings": page.locator(".sv-findings li").all_inner_texts(),
            "advice": page.locator(".sv-advice-text").inner_text(),
            "flags": page.locator(".sv-flags").inner_text(),
            "external": external,
            "errors": errors,
        }
        page.close()
        return shown

    try:
        _wait_http(f"http://127.0.0.1:{port}/", proc)
        if browser is not None:
            return drive(browser)
        with sync_playwright() as p:
            b = launch(p)
            try:
                return drive(b)
            finally:
                b.close()
    finally:
        _stop(proc)
        logf.close()


def jupyterlab_workbench_screenshot(out: Path, model: str | None = None, *, workdir: Path | None = None) -> dict:
    """Run ``notebooks/why_is_my_acceptance_low.ipynb`` in a local JupyterLab on ``model`` and write the
    screenshot of its inspector (rewound, compared, diagnosed and advised)."""
    from playwright.sync_api import expect, sync_playwright

    from specviz.models.embedded import resolve_model
    from specviz.testing.page_harness import launch

    name = "why_is_my_acceptance_low.ipynb"
    work = workdir or Path(tempfile.mkdtemp(prefix="specviz-lab-"))
    nbdir = work / "nb"
    nbdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "notebooks" / name, nbdir / name)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        SPECVIZ_MODEL=str(resolve_model(model)),
        JUPYTER_CONFIG_DIR=str(work / "cfg"),
        JUPYTERLAB_WORKSPACES_DIR=str(work / "ws"),
    )
    logf = (work / "lab.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, *jupyterlab_args(port, token, str(nbdir))],
        stdout=logf,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(ROOT),
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc)
        with sync_playwright() as p:
            b = launch(p)
            page = b.new_page(viewport={"width": 1440, "height": 1180})
            external = _offline(page)
            console: list[str] = []
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"http://127.0.0.1:{port}/lab/tree/{name}?reset&token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=120000)
            try:  # some Lab versions still ask for the kernel despite the kernelspec
                page.locator(".jp-Dialog .jp-mod-accept").click(timeout=5000)
            except Exception:
                pass
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120000)
            page.locator(".lm-MenuBar-itemLabel").get_by_text("View", exact=True).click()
            item = page.locator(".lm-Menu-itemLabel").get_by_text("Show Left Sidebar", exact=True)
            if item.count():
                item.click()
            else:
                page.keyboard.press("Escape")
            page.locator(".lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
            page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
            root = page.locator(".specviz-inspector").first
            root.wait_for(timeout=120000)
            expect(root.locator(".sv-advice-card .sv-flags")).to_contain_text("--spec-type", timeout=900000)
            for label in ("No", "Dismiss"):  # the "Jupyter news?" toast, if any
                btn = page.locator(".jp-toast-button", has_text=label)
                if btn.count():
                    btn.first.click()
            root.locator(".sv-lanes-card").evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(1200)
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
            shown = {
                "lane": root.locator(".sv-lanes-card").get_attribute("data-lane"),
                "findings": root.locator(".sv-findings li").count(),
                "external": external,
                "console": console,
            }
            b.close()
            return shown
    finally:
        _stop(proc)
        logf.close()


def main(argv: list[str] | None = None) -> None:
    """Write the screenshots and say what each shows."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="target GGUF (default: the embedded Gemma 3 270M)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    ap.add_argument("--only", choices=("panel", "jupyterlab", "workbench", "jupyterlab-workbench"), default=None)
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.only in (None, "panel"):
        t = time.monotonic()
        shown = panel_screenshot(out / "panel_inspector.png", a.model)
        print(f"{out / 'panel_inspector.png'}: {shown} ({time.monotonic() - t:.0f} s)")
    if a.only in (None, "jupyterlab"):
        t = time.monotonic()
        shown = jupyterlab_screenshot(out / "jupyterlab_inspector.png", a.model)
        print(f"{out / 'jupyterlab_inspector.png'}: {shown} ({time.monotonic() - t:.0f} s)")
    if a.only in (None, "workbench"):
        t = time.monotonic()
        shown = workbench_screenshot(out / "panel_workbench.png", a.model)
        print(f"{out / 'panel_workbench.png'}: {shown} ({time.monotonic() - t:.0f} s)")
    if a.only in (None, "jupyterlab-workbench"):
        t = time.monotonic()
        shown = jupyterlab_workbench_screenshot(out / "jupyterlab_workbench.png", a.model)
        print(f"{out / 'jupyterlab_workbench.png'}: {shown} ({time.monotonic() - t:.0f} s)")


if __name__ == "__main__":
    main()
