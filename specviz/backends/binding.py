"""llama-cpp-python's low-level binding, imported on first use, and llama.cpp's one-time initialisation.

Every module of :mod:`specviz.backends` reaches llama.cpp's C API through :func:`llama_lib`, so importing
specviz loads no native library until a model is loaded. :func:`ensure_backend` initialises llama.cpp once
per process and silences its log (``SPECVIZ_LLAMA_LOG=1`` keeps it).
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import threading
from contextlib import contextmanager
from typing import Any, Iterator

_init_lock = threading.Lock()
_initialised = False
_log_cb = None  # keeps the ctypes callback alive
_addresses: dict[str, int | None] = {}


def llama_lib() -> Any:
    """The ``llama_cpp.llama_cpp`` module: llama.cpp's C API as llama-cpp-python binds it."""
    import llama_cpp.llama_cpp as lc

    return lc


def c_function_address(name: str) -> int | None:
    """The address of llama.cpp's C function ``name`` as the binding loaded it, for compiled code that
    calls it directly; None when the binding's attribute is not a ctypes function (a profiler's wrapper,
    say). Resolved once per name (a wrapper installed later does not change it)."""
    if name not in _addresses:
        try:
            _addresses[name] = ctypes.cast(getattr(llama_lib(), name), ctypes.c_void_p).value
        except (AttributeError, TypeError, ctypes.ArgumentError):
            _addresses[name] = None
    return _addresses[name]


def ensure_backend() -> None:
    """Initialise llama.cpp's backend once per process (and quieten its log unless ``SPECVIZ_LLAMA_LOG``)."""
    global _initialised, _log_cb
    with _init_lock:
        if _initialised:
            return
        lc = llama_lib()
        if not os.environ.get("SPECVIZ_LLAMA_LOG"):

            @lc.llama_log_callback
            def _quiet(level, text, user_data):  # noqa: ARG001 - signature fixed by llama.cpp
                return None

            _log_cb = _quiet
            lc.llama_log_set(_log_cb, ctypes.c_void_p(0))
        lc.llama_backend_init()
        _initialised = True


@contextmanager
def llama_output() -> Iterator[list[str]]:
    """Collect what llama.cpp says during the block: its log lines and what it prints on the process's C
    stderr (its grammar parser prints its reason there), as lines, in the list yielded (filled when the block
    ends). The log goes back to what :func:`ensure_backend` set (quiet, or llama.cpp's own under
    ``SPECVIZ_LLAMA_LOG``). While the block runs, anything else written to file descriptor 2 is collected
    too: keep it to one short call."""
    ensure_backend()
    lc = llama_lib()
    lines: list[str] = []

    @lc.llama_log_callback
    def _collect(level, text, user_data):  # noqa: ARG001 - signature fixed by llama.cpp
        lines.append(text.decode("utf-8", "replace").rstrip("\n"))

    lc.llama_log_set(_collect, ctypes.c_void_p(0))
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            lc.llama_log_set(_log_cb, ctypes.c_void_p(0))
            sink.seek(0)
            lines.extend(sink.read().decode("utf-8", "replace").splitlines())
