"""The visual inspector: one front-end (``widgets/`` → ``specviz.static``) in two hosts.

* :class:`Inspector` — an anywidget for JupyterLab (``Inspector(session)``, ``Inspector.replay(path)``).
* :mod:`specviz.ui.panel_app` — the same front-end in a Panel app; :func:`specviz.server.app.serve` and
  :func:`specviz.server.app.replay` are the entry points of ``specviz serve`` and ``specviz replay``.

Both hosts wrap one :class:`InspectorCore` (:mod:`specviz.ui.core`), which shows a live session or a recording
(:mod:`specviz.ui.sources`), carries the workbench (:mod:`specviz.ui.workbench`) and checks every page message
against the protocol's one declaration, ``widgets/protocol.json`` (:mod:`specviz.ui.protocol`).
"""

from __future__ import annotations

from .core import InspectorCore


def __getattr__(name: str):
    if name == "Inspector":
        from .inspector import Inspector

        return Inspector
    raise AttributeError(f"module 'specviz.ui' has no attribute {name!r}")


__all__ = ["Inspector", "InspectorCore"]
