"""The ``specviz`` command: the parser of every command group and the entry point.

Each group is a module with an ``add_commands(subparsers)`` (:data:`COMMAND_GROUPS` lists them, in the
order ``specviz --help`` shows them). Every option is validated before any model loads; a refused one
exits with status 2 and one line naming the option, the value and what is allowed
(:class:`~specviz.cli.options.UsageError`); a specviz error at run time exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from ..errors import SpecvizError
from . import bench, catalog, derive_draft, generate, serve, server, sweep, train, workbench
from .options import Parser, UsageError

#: Every command group, in the order of ``specviz --help``: run, verify; bench; derive-draft; serve, replay;
#: info, strategies; diagnose, advise; compare-server; sweep, report; train-eagle3.
COMMAND_GROUPS = (generate, bench, derive_draft, serve, catalog, workbench, server, sweep, train)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``specviz`` command, every group of :data:`COMMAND_GROUPS` added."""
    p = Parser(prog="specviz", description="See speculative decoding happen (llama.cpp).")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    for group in COMMAND_GROUPS:
        group.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specviz`` console script."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"specviz: error: {e}", file=sys.stderr)
        return 2
    except SpecvizError as e:
        print(f"specviz: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `specviz run --json | head`: the reader went away
        try:  # point stdout's descriptor at /dev/null so the interpreter's final flush cannot fail
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
