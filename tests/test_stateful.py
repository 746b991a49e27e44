"""Run the stateful property test of Session (``stateful_session.py``) in a subprocess, so that a crash
of llama.cpp (a segmentation fault, an abort) is reported as a failure instead of killing the runner."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.slow
def test_random_call_sequences_never_crash_and_keep_every_invariant():
    p = subprocess.run(
        [sys.executable, str(HERE / "stateful_session.py"), "60", "40"],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=HERE.parent,
    )
    if p.returncode < 0:
        raise AssertionError(
            f"the session process died with signal {signal.Signals(-p.returncode).name}:\n"
            f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
        )
    assert p.returncode == 0, f"{p.stdout[-6000:]}\n{p.stderr[-6000:]}"
    assert "passed" in p.stdout
