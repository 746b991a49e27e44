"""What every command group of the ``specviz`` command shares: the usage error (exit status 2), the parser
that raises it instead of printing usage, the ranged-integer option and the warning line.

A refused option is one line naming the option, the value and what is allowed; it is raised before any
model loads.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from ..decoding.knob_schema import ranged_int
from ..errors import KnobError


class UsageError(Exception):
    """A command-line option or argument was refused (``specviz`` exits with status 2)."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose refusals are :class:`UsageError`: one line, no usage dump, status 2."""

    def error(self, message: str) -> NoReturn:
        """Raise ``message`` as a :class:`UsageError` (argparse would print the usage and exit)."""
        raise UsageError(message)


def int_option(flag: str, value: str, lo: int, hi: int | None = None) -> int:
    """``value`` of option ``flag`` as an integer in ``[lo, hi]`` (no upper bound when ``hi`` is None), by the
    knob schema's rule (:func:`~specviz.decoding.knob_schema.ranged_int`); else a :class:`UsageError`."""
    try:
        return ranged_int(value, lo, hi, label=f"option {flag}")
    except KnobError as e:
        raise UsageError(str(e)) from None


def warn(msg: str) -> None:
    """Print a warning line (an option accepted but not applied, a dataset line refused) on stderr."""
    print(f"specviz: warning: {msg}", file=sys.stderr)
