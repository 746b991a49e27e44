"""``--grammar``, ``--grammar-file``, ``-j`` / ``--json-schema`` and ``-jf`` / ``--json-schema-file`` for the
generation commands, as llama.cpp spells them: one of them, or the one a ``--server-args`` line gives, checked
by llama.cpp's own parser (a JSON schema converted first) before any model loads. A refusal is a usage error
(exit 2) with llama.cpp's reason and the line it points at.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..backends.grammar import grammar_of_flag
from ..errors import GrammarError
from .options import UsageError

#: The options, each with its ``argparse`` destination.
_OPTIONS = (
    (("--grammar",), "grammar", "GBNF", "a GBNF grammar every generated token obeys (llama.cpp's grammar sampler)"),
    (("--grammar-file",), "grammar_file", "FILE", "read the GBNF grammar from this file"),
    (("-j", "--json-schema"), "json_schema", "SCHEMA", "a JSON schema the output obeys (converted to GBNF)"),
    (("-jf", "--json-schema-file"), "json_schema_file", "FILE", "read the JSON schema from this file"),
)


def add_grammar_options(p: argparse.ArgumentParser) -> None:
    """Add the four grammar options to ``p`` (at most one of them)."""
    group = p.add_mutually_exclusive_group()
    for flags, dest, metavar, help_text in _OPTIONS:
        group.add_argument(*flags, dest=dest, default=None, metavar=metavar, help=help_text)


def grammar_request(args: argparse.Namespace, server: Any) -> dict[str, Any]:
    """``{"grammar": GBNF}`` for :meth:`~specviz.Session.start` from the option given, or from ``server`` (a
    :class:`~specviz.analysis.server_args.ServerConfig`, whose line's grammar is checked already); ``{}``
    without one. A grammar llama.cpp refuses raises :class:`~specviz.cli.options.UsageError`."""
    values = [(flags[-1], getattr(args, dest, None)) for flags, dest, _, _ in _OPTIONS]
    given = [(flag, str(v)) for flag, v in values if v is not None]
    from_server = getattr(server, "grammar", None)
    if given and from_server is not None:
        raise UsageError(f"option {given[0][0]}: the --server-args line gives a grammar already; give one of them")
    if from_server is not None:
        return {"grammar": from_server}
    if not given:
        return {}
    flag, value = given[0]
    try:
        return {"grammar": grammar_of_flag(flag, value)}
    except GrammarError as exc:
        raise UsageError(str(exc)) from None
