"""The sweep's progress bar: runs done of the total, with running and failed counts and an ETA.

It is tqdm's ``auto`` bar, so the same object is a text bar in a terminal and a widget in JupyterLab.
A run is one (prompt, setting, repeat) row; the ETA is tqdm's, from the rate rows have finished at.
"""

from __future__ import annotations

import sys
from typing import Any


class SweepProgress:
    """Shows ``done/total`` runs, ``running`` and ``failed`` counts and an ETA; silent when not ``enabled``."""

    def __init__(
        self, total: int, *, initial: int = 0, enabled: bool = True, file: Any = None, desc: str = "sweep"
    ) -> None:
        self.done = initial
        self.running = 0
        self.failed = 0
        self._bar = None
        self._live = False
        if enabled:
            from tqdm.auto import tqdm

            out = file if file is not None else sys.stderr
            # a terminal or a notebook widget redraws in place; a log file gets a line per redraw, so fewer
            live = "notebook" in tqdm.__module__ or bool(getattr(out, "isatty", lambda: False)())
            self._live = live
            self._bar = tqdm(
                total=total,
                initial=initial,
                unit="run",
                desc=desc,
                dynamic_ncols=True,
                file=out,
                smoothing=0.1,
                mininterval=0.1 if live else 5.0,
            )
            self._show()

    def _show(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(f"running {self.running}, failed {self.failed}", refresh=self._live)

    def update(self, *, done: int = 0, running: int | None = None, failed: int = 0) -> None:
        """Add ``done`` finished and ``failed`` runs; set the number of runs ``running`` now."""
        self.done += done
        self.failed += failed
        changed = bool(failed) or (running is not None and running != self.running)
        if running is not None:
            self.running = running
        if self._bar is not None:
            if done:
                self._bar.update(done)
            if done or changed:
                self._show()

    def close(self) -> None:
        """Leave the final line on screen."""
        if self._bar is not None:
            self.running = 0
            self._bar.set_postfix_str(f"running 0, failed {self.failed}", refresh=False)
            self._bar.close()  # draws the final state once
            self._bar = None
