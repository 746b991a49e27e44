"""``python -m specviz.backends.build_capture``: compile the layer-capture shim into the cache (run by ``make
install`` and the GPU check).

Its own module, not a ``__main__`` block of :mod:`specviz.backends.capture`: the package imports that module,
so running it with ``-m`` would execute a second copy of it next to the imported one (runpy warns so).
"""

from __future__ import annotations

import argparse
from typing import Sequence

from ..errors import CaptureUnavailableError
from .capture import build_shim


def main(argv: Sequence[str] | None = None) -> int:
    """Build the shim (again with ``--force``) and print its path; without a C compiler, a warning and 0: an
    install without one still works, and what needs the shim is then refused with why."""
    p = argparse.ArgumentParser(prog="python -m specviz.backends.build_capture", description=main.__doc__)
    p.add_argument("--force", action="store_true", help="compile it again even if it is cached")
    a = p.parse_args(argv)
    try:
        print(build_shim(force=a.force))
    except CaptureUnavailableError as e:
        print(f"specviz: warning: {e}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
