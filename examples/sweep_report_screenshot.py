"""A screenshot of a ``specviz report`` page, taken offline in headless chromium.

    python examples/sweep_report_screenshot.py REPORT.html [-o docs/screenshots/sweep_report.png]

Every request that leaves the page's own file is aborted and reported: the page must draw its charts
with the plotly.js it carries. The screenshot shows the top of the page (the tables and the first chart).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def screenshot(report: Path, out: Path, *, width: int = 1280, height: int = 1500) -> list[str]:
    """Write ``out`` from ``report``; returns the external requests that were refused (none expected)."""
    from playwright.sync_api import sync_playwright

    from specviz.testing.page_harness import launch

    refused: list[str] = []
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)

            def route(r):
                if r.request.url.startswith(("file:", "data:", "blob:", "about:")):
                    return r.continue_()
                refused.append(r.request.url)
                return r.abort()

            page.route("**/*", route)
            page.goto(report.resolve().as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 5", timeout=60000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(out), full_page=False)
        finally:
            browser.close()
    return refused


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "screenshots" / "sweep_report.png")
    args = ap.parse_args()
    refused = screenshot(args.report, args.output)
    for url in refused:
        print(f"refused an external request: {url}", file=sys.stderr)
    print(f"wrote {args.output}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
