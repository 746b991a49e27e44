"""The sweep's progress bar: done of total, running, failed, and an ETA."""

from __future__ import annotations

import io
import re

import pytest

pytest.importorskip("tqdm")

from specviz.sweep.progress import SweepProgress  # noqa: E402


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_done_running_failed_and_an_eta():
    out = Terminal()
    bar = SweepProgress(40, initial=10, file=out)
    bar.update(done=5, running=10)
    bar.update(failed=5, running=5)
    frames = out.getvalue().split("\r")
    assert any(re.search(r"15/40 \[\d\d:\d\d<\d\d:\d\d, .*running 10, failed 0\]", f) for f in frames), frames
    assert any("running 5, failed 5" in f for f in frames), frames
    bar.close()
    assert out.getvalue().rstrip().endswith("running 0, failed 5]")
    assert (bar.done, bar.failed, bar.running) == (15, 5, 0)


def test_a_log_file_gets_few_lines_and_the_final_state():
    out = io.StringIO()
    bar = SweepProgress(100, file=out)
    for _ in range(100):
        bar.update(done=1, running=3)
    bar.close()
    assert out.getvalue().count("\r") <= 3
    assert "100/100" in out.getvalue().rstrip().split("\r")[-1]


def test_disabled_prints_nothing(capsys):
    bar = SweepProgress(5, enabled=False)
    bar.update(done=5)
    bar.close()
    assert capsys.readouterr().err == ""
