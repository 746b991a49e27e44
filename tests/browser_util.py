"""Helpers for the browser tests: chromium discovery (skip locally, fail in CI), free ports, servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The browser tests write their screenshots here, never into the tracked docs/screenshots/: `build/` is
# git-ignored, and `make screenshots` runs these tests and copies the pictures into docs/screenshots/.
SCREENSHOTS = ROOT / "build" / "screenshots"


def need_browser():
    """Playwright and Debian's chromium, or skip with the reason (a failure when CI=true)."""
    from specviz.testing.page_harness import chromium_path

    problem = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problem = "playwright is not installed (pip install 'specviz[test]')"
    if problem is None and chromium_path() is None:
        problem = "chromium is not installed (apt-get install chromium; .ci/run does it)"
    if problem is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"browser tests must run in CI: {problem}")
        pytest.skip(problem)


from specviz.testing.page_harness import free_port, wait_http  # noqa: E402,F401  (shared with the examples)


def start(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen(
        [sys.executable, *args], stdout=log.open("w"), stderr=subprocess.STDOUT, env=e, cwd=str(ROOT)
    )


from specviz.testing.page_harness import stop_process as stop  # noqa: E402,F401


def offline(page, allowed=("http://127.0.0.1", "ws://127.0.0.1", "http://localhost", "ws://localhost")):
    """Abort every request that leaves this machine; returns the list of aborted URLs."""
    external: list[str] = []

    def route(r):
        u = r.request.url
        if u.startswith(allowed) or u.startswith(("data:", "blob:")):
            return r.continue_()
        external.append(u)
        return r.abort()

    page.route("**/*", route)
    return external


def browser_fixture():
    """Generator behind the ``browser`` fixtures: one headless chromium per test module."""
    need_browser()
    from playwright.sync_api import sync_playwright

    from specviz.testing.page_harness import launch

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()
