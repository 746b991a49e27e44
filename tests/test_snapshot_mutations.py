"""Run the property test over crafted snapshots (``snapshot_mutations.py``) in a subprocess, so that a crash of
llama.cpp (a segmentation fault, an abort) is reported as a failure instead of killing the runner."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.slow
def test_crafted_snapshots_never_crash_and_a_refused_restore_changes_nothing():
    p = subprocess.run(
        [sys.executable, str(HERE / "snapshot_mutations.py"), "300"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=HERE.parent,
    )
    if p.returncode < 0:
        raise AssertionError(
            f"the restoring process died with signal {signal.Signals(-p.returncode).name}:\n"
            f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
        )
    assert p.returncode == 0, f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    assert "passed" in p.stdout
