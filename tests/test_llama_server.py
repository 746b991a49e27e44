"""llama-server started and stopped by specviz (specviz.analysis.llama_server): on loopback, ready before
use, and never left running — after a with block, after a failed start, when the Python process exits
without stopping it, and when that process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from native_util import native_tool

from specviz.analysis.llama_server import LOOPBACK, LlamaServer, find_server_binary, live_servers
from specviz.errors import LlamaServerError


def server_processes() -> set[int]:
    """Process ids of every running process whose program is llama-server (zombies excluded)."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state = stat[stat.rindex(")") + 2 :].split()[0]
        if name.startswith("llama-server") and state != "Z":
            out.add(int(d.name))
    return out


def gone(pid: int, within: float = 20.0) -> bool:
    """Whether process ``pid`` has ended (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if pid not in server_processes():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def binary():
    return native_tool("llama-server")


@pytest.mark.tools
def test_a_server_answers_on_loopback_and_is_gone_after_the_with_block(binary, tiny_model_path):
    with LlamaServer(tiny_model_path, ["-c", "256", "-t", "1", "-np", "1"], binary=binary) as srv:
        assert srv.url.startswith(f"http://{LOOPBACK}:")
        pid = srv.proc.pid
        assert pid in server_processes() and pid in live_servers()
        out = srv.complete("1, 2, 3", n_predict=8)
        assert out.predicted_n == 8 and len(out.tokens) == 8 and out.stop_type == "limit"
        assert srv.props()["default_generation_settings"]["n_ctx"] == 256
    assert srv.proc is None and gone(pid)
    assert live_servers() == []
    with pytest.raises(LlamaServerError, match="not running"):
        _ = srv.url


@pytest.mark.tools
def test_a_server_that_fails_to_start_is_stopped_and_its_log_quoted(binary, tiny_model_path):
    before = server_processes()
    srv = LlamaServer(tiny_model_path, ["-ctk", "q9_9"], binary=binary)
    with pytest.raises(LlamaServerError, match="exited with status") as e:
        srv.start()
    assert "q9_9" in str(e.value)  # the end of llama-server's own log
    assert server_processes() <= before and live_servers() == []
    srv.close()


@pytest.mark.tools
def test_host_port_and_model_are_specvizs_to_set(binary, tiny_model_path):
    for flag in ("--port", "--host", "-m"):
        with pytest.raises(LlamaServerError, match=f"option {flag} is set by specviz"):
            LlamaServer(tiny_model_path, [flag, "x"], binary=binary)
    with pytest.raises(LlamaServerError, match="does not exist"):
        LlamaServer(tiny_model_path.parent / "missing.gguf", binary=binary)


def test_no_binary_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.cache/specviz here
    monkeypatch.delenv("SPECVIZ_LLAMA_SERVER", raising=False)
    monkeypatch.delenv("SPECVIZ_LLAMA_TOOLS", raising=False)
    with pytest.raises(LlamaServerError, match="make llama-tools"):
        find_server_binary()
    with pytest.raises(LlamaServerError, match="not an executable"):
        find_server_binary(tmp_path / "llama-server")


@pytest.mark.tools
def test_metrics_and_slots(binary, tiny_model_path):
    with LlamaServer(tiny_model_path, ["-c", "256", "-t", "1", "-np", "1", "--metrics"], binary=binary) as srv:
        srv.complete("1, 2, 3", n_predict=4)
        text = srv.metrics()
        assert "llamacpp:tokens_predicted_total 4" in text
        slots = srv.slots()
        assert len(slots) == 1 and slots[0]["n_ctx"] == 256
    with LlamaServer(tiny_model_path, ["-c", "256", "-t", "1", "--no-slots"], binary=binary) as srv:
        with pytest.raises(LlamaServerError, match="metrics"):
            srv.metrics()  # started without --metrics
        with pytest.raises(LlamaServerError, match="/slots"):
            srv.slots()


_CHILD = textwrap.dedent(
    """
    import sys, time
    import specviz.analysis.llama_server as m
    from specviz.analysis.llama_server import LlamaServer
    if sys.argv[3] == "exit":  # atexit alone: no parent-death signal (it would end the server too)
        m._die_with_parent = lambda: None
    srv = LlamaServer(sys.argv[1], ["-c", "256", "-t", "1"], binary=sys.argv[2]).start()
    print(srv.proc.pid, flush=True)
    if sys.argv[3] == "wait":
        time.sleep(600)
    # "exit": leave without stopping the server
    """
)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
@pytest.mark.tools
def test_a_server_does_not_outlive_the_python_process_that_started_it(binary, tiny_model_path, how):
    """atexit (and the finaliser) stop the servers of an interpreter that exits without stopping them; the
    parent-death signal kills them when the interpreter itself is killed (nothing of Python runs then)."""
    mode = "exit" if how == "exit" else "wait"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tiny_model_path), str(binary), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        pid = int(child.stdout.readline())
        if how == "sigkill":
            assert pid in server_processes()
            os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    survived = not gone(pid)
    if survived:
        os.kill(pid, signal.SIGKILL)  # leave nothing running, even when the test fails
    assert not survived, f"llama-server {pid} outlived its parent ({how})"
