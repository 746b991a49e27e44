"""What a served page fetches over plain HTTP rather than its websocket, and what it may not fetch at all.

* The plotly bundle (4.6 MB, shipped inside the ``plotly`` package): a page is told its address
  (:func:`plotly_url`, versioned by its digest) and fetches it once; the browser keeps it (``Cache-Control:
  immutable``, an ``ETag``), so a page load costs the server nothing after the first, and a page can no
  longer make the server push the bundle down its websocket again and again.
* Panel's ``/components/<module>/…`` route, which imports any installed module named in the URL before any
  token is checked, is off: the inspector's own resources are inline, so nothing needs it.

Both routes are checked like pages (:func:`~specviz.server.access.request_allowed`). Tornado is imported
only when :func:`asset_routes` is called.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Any

from ..ui.core import plotly_source
from .access import COOKIE_PREFIX, TOKEN_ARG, AccessPolicy, request_allowed

#: Where a page fetches the plotly bundle, relative to the page.
PLOTLY_PATH = "specviz-assets/plotly.min.js"


@lru_cache(maxsize=1)
def plotly_bytes() -> tuple[bytes, str]:
    """The bundle's bytes and their SHA-256 (read once)."""
    data = plotly_source().encode("utf-8")
    return data, hashlib.sha256(data).hexdigest()


def plotly_url() -> str:
    """The bundle's address for pages (relative, versioned by its digest so a cached copy is never stale)."""
    return f"{PLOTLY_PATH}?v={plotly_bytes()[1][:16]}"


def asset_routes(policy: AccessPolicy, port: int) -> list[tuple[str, Any, dict[str, Any]]]:
    """The Tornado routes of the bundle and of Panel's ``/components`` (off), for ``pn.serve(extra_patterns=…)``
    (they come before Panel's own, so they win)."""
    from tornado.web import HTTPError, RequestHandler

    cookie = COOKIE_PREFIX + str(port)

    class PlotlyBundle(RequestHandler):
        """The plotly bundle, for pages that may be opened (403 otherwise)."""

        def get(self) -> None:
            if not request_allowed(policy, port, self.get_query_argument(TOKEN_ARG, None), self.get_cookie(cookie)):
                raise HTTPError(403, reason="a token is required")
            data, digest = plotly_bytes()
            self.set_header("Content-Type", "application/javascript; charset=utf-8")
            self.set_header("Cache-Control", "private, max-age=31536000, immutable")
            self.set_etag_header()
            if self.check_etag_header():
                self.set_status(304)
                return
            self.write(data)

        def compute_etag(self) -> str:
            return '"' + plotly_bytes()[1][:32] + '"'

    class Off(RequestHandler):
        """Panel's module-importing route: not served."""

        def get(self, *args: Any) -> None:
            raise HTTPError(404, reason="not served by specviz")

    return [
        (r"/" + PLOTLY_PATH.replace(".", r"\."), PlotlyBundle, {}),
        (r"/components/(.*)", Off, {}),
    ]
