"""A page's heavy messages, one at a time, off the thread that received them (a served page's IO loop).

Some page messages cost work that grows with the model or the history — a ``reset`` decodes its prompt, a
lane ``branch`` copies the whole context, ``advise`` times ~80 decodes, a snapshot moves megabytes. The
protocol declaration marks them (``"work": "background"`` in ``widgets/protocol.json``). A served page's
messages arrive on Tornado's one IO loop, which every other page needs too, so the server's inspector
cores run those messages here instead: :class:`BackgroundWork` runs one at a time in its own thread, says
what it is doing (:attr:`BackgroundWork.working`, the page's "working" state) and refuses a second one
while the first runs (the caller answers with a notice; nothing changes).

No UI library is imported here.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import Callable

_log = logging.getLogger(__name__)

#: Bytes moved that count as one unit of work, as one token decoded or copied does (what a page's message
#: costs is told in these units: :meth:`specviz.ui.core.InspectorCore.charge`).
BYTES_PER_UNIT = 16 * 1024


class BackgroundWork:
    """At most one named job at a time, each in a fresh daemon thread (in a copy of the submitter's
    :mod:`contextvars` context).

    ``changed()`` is called (from the job's thread) when a job starts and again when it has finished, so the
    host can send the page its new state.
    """

    def __init__(self, changed: Callable[[], None] = lambda: None) -> None:
        self._changed = changed
        self._lock = threading.Lock()
        self._name: str | None = None
        self._thread: threading.Thread | None = None
        #: Jobs run so far, and refused because one was running (for the tests and benchmarks).
        self.done = 0
        self.refused = 0

    @property
    def working(self) -> str | None:
        """The name of the job running now (``None``: idle)."""
        return self._name

    def submit(self, name: str, job: Callable[[], None]) -> bool:
        """Start ``job`` in the background; False (and nothing runs) while another job is running."""
        with self._lock:
            if self._name is not None:
                self.refused += 1
                return False
            self._name = name
            # the job runs in the submitter's context (a presenter-mode reply goes to the page that asked)
            ctx = contextvars.copy_context()
            self._thread = threading.Thread(
                target=ctx.run, args=(self._run, job), name=f"specviz-work-{name}", daemon=True
            )
            self._thread.start()
        return True

    def _run(self, job: Callable[[], None]) -> None:
        try:
            self._changed()
            job()
        except Exception:  # the job says its own failures; this only keeps the thread from dying loudly
            _log.exception("specviz inspector: background work failed")
        finally:
            with self._lock:
                self._name = None
                self.done += 1
            try:
                self._changed()
            except Exception:
                _log.exception("specviz inspector: reporting the end of background work failed")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the running job (if any) has finished; False when ``timeout`` passed first."""
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            return not t.is_alive()
        return True
