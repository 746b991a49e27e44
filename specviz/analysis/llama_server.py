"""Start, ask and stop llama.cpp's own ``llama-server``, built from the llama.cpp that specviz runs.

``make llama-tools`` builds ``llama-server`` from the llama.cpp source that llama-cpp-python vendors, with
the wheel's CPU flags, beside ``llama-speculative-simple`` (``tools/build_llama_tools.sh``).
:func:`find_server_binary` finds it; :class:`LlamaServer` runs it on loopback for the differential tests,
``specviz advise --check-server`` and ``benchmarks/bench_server_advice.py``.

A server started here is never left running: :class:`LlamaServer` is a context manager, a failed start
stops the process before raising, every live server is killed when the interpreter exits (``atexit``),
and on Linux the process is asked to die with its parent (``PR_SET_PDEATHSIG``), so that even a killed
Python process takes its server with it.

The HTTP calls use the standard library only (``urllib``): the completion API (``POST /completion``),
``/metrics`` (Prometheus text, with ``--metrics``), ``/slots`` and ``/props``.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import LlamaServerError

#: The address every server started here listens on (loopback only: nothing is exposed).
LOOPBACK = "127.0.0.1"

#: Flags the server is started with by :class:`LlamaServer` itself; a caller's arguments must not set them.
OWN_FLAGS = ("--host", "--port", "-m", "--model")

_LIVE: set[subprocess.Popen] = set()


def _kill_live() -> None:
    """Kill every server this interpreter started and has not stopped (registered with ``atexit``)."""
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
                pass
        _LIVE.discard(proc)


atexit.register(_kill_live)


def live_servers() -> list[int]:
    """Process ids of the servers this interpreter started that are still running (the tests check it is
    empty after every use)."""
    return [p.pid for p in _LIVE if p.poll() is None]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # PR_SET_PDEATHSIG (1): the kernel sends SIGKILL to the server when the thread that started it exits.
    # Servers are started and used from one thread (the tests, the CLI, a notebook's kernel thread).
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` right now (the OS picks it). Another process may take it before the
    server binds it; :meth:`LlamaServer.start` then tries another."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _installed_llama_cpp_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama_cpp_python")
    except PackageNotFoundError:  # pragma: no cover - specviz needs it installed
        return "*"


def find_server_binary(binary: str | os.PathLike | None = None) -> Path:
    """The ``llama-server`` to run: ``binary`` when given, else ``$SPECVIZ_LLAMA_SERVER``, else
    ``$SPECVIZ_LLAMA_TOOLS/llama-server``, else the newest one ``make llama-tools`` built for the installed
    llama-cpp-python version in ``~/.cache/specviz/llama-tools``. A ``llama-server`` on ``PATH`` is not
    used: it may be another llama.cpp than the one specviz runs.

    Raises :class:`~specviz.errors.LlamaServerError` when there is none, saying how to build it.
    """
    candidates: list[Path] = []
    if binary is not None:
        p = Path(binary)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise LlamaServerError(f"llama-server {str(p)!r} is not an executable file; pass the built binary")
        return p
    env = os.environ.get("SPECVIZ_LLAMA_SERVER")
    if env:
        candidates.append(Path(env))
    tools = os.environ.get("SPECVIZ_LLAMA_TOOLS")
    if tools:
        candidates.append(Path(tools) / "llama-server")
    cache = Path.home() / ".cache" / "specviz" / "llama-tools"
    if cache.is_dir():
        version = _installed_llama_cpp_version()
        built = sorted(
            cache.glob(f"llama-cpp-python-{version}-*/llama-server"), key=lambda q: q.stat().st_mtime, reverse=True
        )
        candidates += built
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise LlamaServerError(
        "llama-server is not built: run `make llama-tools` in the specviz checkout (it builds llama.cpp's "
        "server from the llama.cpp that llama-cpp-python vendors), or pass its path "
        "(--server-binary PATH, or $SPECVIZ_LLAMA_SERVER)"
    )


@dataclass
class Completion:
    """One ``POST /completion`` answer, with the counters specviz compares."""

    content: str
    tokens: list[int]  #: the generated token ids (``return_tokens``)
    timings: dict[str, Any]  #: the server's own ``timings`` object
    stop_type: str  #: ``eos``, ``limit``, ``word`` or ``none``
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def draft_n(self) -> int:
        """Draft tokens the server verified for this request (``timings.draft_n``; 0 when it drafted none)."""
        return int(self.timings.get("draft_n", 0))

    @property
    def draft_n_accepted(self) -> int:
        """Draft tokens the target accepted (``timings.draft_n_accepted``)."""
        return int(self.timings.get("draft_n_accepted", 0))

    @property
    def predicted_n(self) -> int:
        """Tokens generated (``timings.predicted_n``)."""
        return int(self.timings.get("predicted_n", len(self.tokens)))

    @property
    def predicted_per_second(self) -> float:
        """Generation speed the server measured (``timings.predicted_per_second``)."""
        return float(self.timings.get("predicted_per_second", 0.0))

    @property
    def predicted_ms(self) -> float:
        """Milliseconds the server spent generating (``timings.predicted_ms``; the prompt excluded)."""
        return float(self.timings.get("predicted_ms", 0.0))


class LlamaServer:
    """A ``llama-server`` process on loopback, started by specviz and always stopped.

    ``args`` are further ``llama-server`` options (speculative flags, ``-c``, ``-fa`` ...); ``--host``,
    ``--port`` and ``-m`` are set here and refused in ``args``. Use it as a context manager::

        with LlamaServer(model, ["--spec-type", "ngram-simple", "-c", "1024"]) as srv:
            out = srv.complete("Once upon a time", n_predict=64)
            print(out.content, out.draft_n, out.draft_n_accepted)

    The server's log (stdout and stderr) goes to a temporary file, read by :meth:`log`.
    """

    def __init__(
        self,
        model: str | os.PathLike,
        args: Sequence[str] = (),
        *,
        binary: str | os.PathLike | None = None,
        startup_timeout: float = 120.0,
        request_timeout: float = 600.0,
    ) -> None:
        args = [str(a) for a in args]
        own = [a for a in args if a.split("=", 1)[0] in OWN_FLAGS]
        if own:
            raise LlamaServerError(
                f"llama-server option {own[0]} is set by specviz (the model, and loopback on a free port); "
                "leave it out of the arguments"
            )
        if not Path(model).is_file():
            raise LlamaServerError(f"model {str(model)!r} does not exist; pass the path of a .gguf file")
        self.binary = find_server_binary(binary)
        self.model = Path(model)
        self.args = args
        self.startup_timeout = float(startup_timeout)
        self.request_timeout = float(request_timeout)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._log: Any = None

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The server's base URL (``http://127.0.0.1:PORT``); only while it runs."""
        if self.port is None:
            raise LlamaServerError("the server is not running; call start() (or use it in a with block)")
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def command(self) -> list[str]:
        """The command line the server is (or will be) started with, without host and port."""
        return [str(self.binary), "-m", str(self.model), *self.args]

    def start(self) -> LlamaServer:
        """Start the server and wait until it answers ``/health`` with 200 (the model is loaded).

        A server that exits or does not become ready within ``startup_timeout`` seconds is stopped and
        :class:`~specviz.errors.LlamaServerError` raised with the end of its log. A port taken meanwhile by
        someone else is replaced by another, up to three times."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        last = ""
        for _ in range(3):
            self.port = free_port()
            self._log = tempfile.TemporaryFile(prefix="specviz-llama-server-")
            cmd = [*self.command, "--host", LOOPBACK, "--port", str(self.port)]
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
            _LIVE.add(self.proc)
            try:
                self._wait_ready()
                return self
            except _PortTaken as e:
                last = str(e)
                self.stop()
            except BaseException:
                self.stop()
                raise
        raise LlamaServerError(f"llama-server could not bind a loopback port three times: {last}")

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                tail = self.log()[-3000:]
                if "couldn't bind" in tail:
                    raise _PortTaken(tail[-300:])
                raise LlamaServerError(f"llama-server exited with status {code} while starting; its log ends:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:  # 503 while the model loads
                if e.code != 503:
                    raise LlamaServerError(f"llama-server answered /health with {e.code}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise LlamaServerError(
                    f"llama-server was not ready after {self.startup_timeout:g} s; its log ends:\n{self.log()[-3000:]}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and wait for it. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            _LIVE.discard(proc)
        self.port = None

    def close(self) -> None:
        """Stop the server and drop its log."""
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - finaliser
        try:
            self.stop()
        except Exception:
            pass

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        """What the server has written so far (stdout and stderr)."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    # -- HTTP ----------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        """One HTTP request to the server; ``(status, body)``. A connection failure raises
        :class:`~specviz.errors.LlamaServerError` with the end of the log."""
        return http_request(self.url, method, path, body, timeout=self.request_timeout, log=self.log)

    def complete(self, prompt: str | Sequence[int], n_predict: int, **params: Any) -> Completion:
        """``POST /completion``: greedy (``temperature`` 0) unless ``params`` say otherwise; ``prompt`` is text
        or token ids (ids are used as given: no BOS is added)."""
        return complete(self.url, prompt, n_predict, timeout=self.request_timeout, log=self.log, **params)

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics`` (the server must run with ``--metrics``)."""
        return fetch_text(self.url, "/metrics", timeout=self.request_timeout)

    def slots(self) -> list[dict[str, Any]]:
        """``/slots``: the server's slots and the parameters of their last task."""
        return json.loads(fetch_text(self.url, "/slots", timeout=self.request_timeout))

    def props(self) -> dict[str, Any]:
        """``/props``: the model path, context size and default generation settings."""
        return json.loads(fetch_text(self.url, "/props", timeout=self.request_timeout))


class _PortTaken(LlamaServerError):
    """The server could not bind its port (another process took it after :func:`free_port`)."""


def http_request(
    url: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    timeout: float = 600.0,
    log: Any = None,
) -> tuple[int, bytes]:
    """One HTTP request to a llama-server at ``url``; ``(status, body)``. HTTP error statuses are returned,
    a connection failure raises :class:`~specviz.errors.LlamaServerError` (with ``log()``'s tail if given)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url.rstrip("/") + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
        tail = f"; its log ends:\n{log()[-2000:]}" if log is not None else ""
        raise LlamaServerError(f"llama-server at {url} did not answer {method} {path}: {e}{tail}") from None


def fetch_text(url: str, path: str, *, timeout: float = 60.0) -> str:
    """``GET path`` from a llama-server at ``url`` as text; an error status raises
    :class:`~specviz.errors.LlamaServerError` with the server's message (``/metrics`` without ``--metrics``,
    ``/slots`` with ``--no-slots``)."""
    status, body = http_request(url, "GET", path, timeout=timeout)
    if status != 200:
        raise LlamaServerError(f"llama-server at {url} answered GET {path} with {status}: {_message(body)}")
    return body.decode("utf-8", "replace")


def _message(body: bytes) -> str:
    try:
        data = json.loads(body)
        return str((data.get("error") or {}).get("message") or data)
    except (ValueError, AttributeError):
        return body.decode("utf-8", "replace")[:300]


def complete(
    url: str,
    prompt: str | Sequence[int],
    n_predict: int,
    *,
    timeout: float = 600.0,
    log: Any = None,
    **params: Any,
) -> Completion:
    """``POST /completion`` to a llama-server at ``url`` (greedy unless ``params`` set ``temperature``); the
    generated token ids come back too (``return_tokens``)."""
    body: dict[str, Any] = {
        "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
        "n_predict": int(n_predict),
        "temperature": 0.0,
        "return_tokens": True,
        "stream": False,
    }
    body.update(params)
    status, raw = http_request(url, "POST", "/completion", body, timeout=timeout, log=log)
    if status != 200:
        raise LlamaServerError(f"llama-server at {url} refused the completion ({status}): {_message(raw)}")
    data = json.loads(raw)
    return Completion(
        content=str(data.get("content", "")),
        tokens=[int(t) for t in data.get("tokens") or []],
        timings=dict(data.get("timings") or {}),
        stop_type=str(data.get("stop_type", "")),
        raw=data,
    )
