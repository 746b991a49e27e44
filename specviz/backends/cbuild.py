"""Compiling specviz's small C helpers once per machine, into a cache, with the system C compiler.

Three helpers exist: the layer-capture eval callback (:mod:`specviz.backends.capture`), the logits-row
reader (:mod:`specviz.decoding.rowscan_kernel`) and the n-gram search (:mod:`specviz.strategies.ngram_kernel`),
each loaded through one :class:`NativeLibrary`. Each is one C file with no dependencies,
compiled to a shared library named after a hash of its source, its flags and the platform (so a changed
source or another machine never loads a stale build), kept in ``$SPECVIZ_NATIVE_CACHE`` or
``~/.cache/specviz/native``. Without a C compiler a helper is unavailable and its caller says why (or
falls back to numpy).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sysconfig
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence


class BuildError(RuntimeError):
    """A helper could not be compiled; the message says why and what to do."""


#: What an environment switch says to turn a helper off.
OFF_WORDS = ("0", "off", "no", "false")


def switched_off(variable: str) -> bool:
    """True when the environment variable ``variable`` switches a helper off (``0``, ``off``, ``no``,
    ``false``, any case)."""
    return os.environ.get(variable, "").lower() in OFF_WORDS


def bind(path: Path, signatures: dict[str, tuple[Any, list[Any]]]) -> SimpleNamespace:
    """Load the compiled library at ``path`` and give its functions, typed by ``signatures`` (name ->
    (result type, argument types)), as attributes named without the ``specviz_`` prefix."""
    lib = ctypes.CDLL(str(path))
    fns = SimpleNamespace()
    for name, (res, args) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
        setattr(fns, name.removeprefix("specviz_"), fn)
    return fns


def cache_dir() -> Path:
    """Where compiled helpers are kept (``$SPECVIZ_NATIVE_CACHE``, else ``~/.cache/specviz/native``)."""
    env = os.environ.get("SPECVIZ_NATIVE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "specviz" / "native"


def library_path(source: Path, stem: str, flags: Sequence[str] = ()) -> Path:
    """The compiled library's path; its name carries a hash of the source, the extra flags and the
    platform (the cache key). Without extra flags the hash is over the source and the platform only."""
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    key = source.read_bytes() + plat.encode() + "\0".join(flags).encode()
    return cache_dir() / f"{stem}-{plat}-{hashlib.sha256(key).hexdigest()[:16]}.so"


def build_library(source: Path, stem: str, flags: Sequence[str] = (), *, force: bool = False) -> Path:
    """Compile ``source`` (``-O2 -shared -fPIC`` and ``flags``) with ``$CC``, else cc/gcc/clang, unless cached."""
    out = library_path(source, stem, flags)
    if out.exists() and not force:
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise BuildError(f"building {source.name} needs a C compiler (cc, gcc or clang) on PATH; install one")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [*cc.split(), "-O2", *flags, "-shared", "-fPIC", "-o", str(tmp), str(source)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"compiling {source.name} failed ({e})") from None
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"compiling {source.name} failed: {' '.join(cmd)}\n{res.stderr.strip()}")
    os.replace(tmp, out)
    return out


#: A helper's C functions: name -> (result type, argument types).
Signatures = dict[str, tuple[Any, list[Any]]]


class NativeLibrary:
    """One C helper: its source, how it is compiled, its typed functions, and the environment switch that
    turns it off. Built and loaded once per process, on first use; :meth:`load` gives the functions (a
    namespace named as in the C file without ``specviz_``) or ``None``, and :meth:`unavailable_reason` says
    why not. Every helper goes through this one loader.

    ``flag_sets`` are tried in order until one compiles (e.g. with OpenMP, then without). ``on_load`` runs
    once on the freshly bound functions (e.g. to apply a tuning variable). With ``switch_read_once`` the
    switch is read on first use only (a look-up on a round's path must not read the environment each
    time); otherwise every :meth:`load` reads it, so a test can switch the helper off and on again."""

    def __init__(
        self,
        source: Path,
        stem: str,
        signatures: Signatures,
        disable_env: str | None,
        flag_sets: Sequence[Sequence[str]] = ((),),
        *,
        on_load: Callable[[SimpleNamespace], None] | None = None,
        switch_read_once: bool = False,
    ) -> None:
        self.source = source
        self.stem = stem
        self.signatures = signatures
        self.disable_env = disable_env
        self.flag_sets = tuple(tuple(f) for f in flag_sets)
        self.on_load = on_load
        self.switch_read_once = switch_read_once
        self._lock = threading.Lock()
        self._fns: SimpleNamespace | None = None
        self._why: str | None = None

    def switched_off(self) -> bool:
        """True when the helper's environment switch turns it off."""
        return self.disable_env is not None and switched_off(self.disable_env)

    def build(self, force: bool = False) -> Path:
        """Compile the helper into the cache (unless cached) and return its path, with the first flag set
        that compiles; raises :class:`BuildError` (the last set's) when none does."""
        for flags in self.flag_sets[:-1]:
            try:
                return build_library(self.source, self.stem, flags, force=force)
            except BuildError:
                pass
        return build_library(self.source, self.stem, self.flag_sets[-1], force=force)

    def load(self) -> SimpleNamespace | None:
        """The helper's functions, or ``None`` when it is switched off or cannot be built or loaded."""
        if not self.switch_read_once and self.switched_off():
            return None
        if self._fns is None and self._why is None:
            with self._lock:
                if self._fns is None and self._why is None:
                    self._why = self._bind_once()
        return self._fns

    def _bind_once(self) -> str | None:
        """Build and bind the helper (under the lock); the reason it is unavailable, or ``None``."""
        if self.switch_read_once and self.switched_off():
            return f"{self.disable_env} switches it off"
        try:
            fns = bind(self.build(), self.signatures)
        except (BuildError, OSError, AttributeError) as e:
            return str(e)
        if self.on_load is not None:
            self.on_load(fns)
        self._fns = fns
        return None

    def unavailable_reason(self) -> str | None:
        """Why the helper is not used, or ``None`` when it is."""
        if not self.switch_read_once and self.switched_off():
            return f"{self.disable_env} switches it off"
        self.load()
        return self._why
