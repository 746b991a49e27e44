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
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                unit="run",
                desc=desc,
                dynamic_ncols=True,
                file=file if file is not None else sys.stderr,
                smoothing=0.1,
            )
            self._show()

    def _show(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(f"running {self.running}, failed {self.failed}", refresh=True)

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
            self._show()
            self._bar.close()
            self._bar = None
