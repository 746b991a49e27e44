"""What can run: ``specviz info`` (a model's facts and which strategies it can run, with a draft model) and
``specviz strategies`` (every strategy and its knobs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..strategies import strategy_names, strategy_schema
from .generation_options import add_memory_options, memory_config
from .options import UsageError, int_option
from .settings_options import add_settings_options, given_settings, settings_of


def add_commands(sub: Any) -> None:
    """Add ``info`` and ``strategies`` to the ``specviz`` subcommands."""
    inf = sub.add_parser("info", help="what a model is and which strategies it (with a draft model) can run")
    inf.add_argument(
        "model", metavar="MODEL", nargs="?", default=None, help="the GGUF (default: the embedded Gemma 3 270M)"
    )
    inf.add_argument(
        "--draft-model",
        "-md",
        "--spec-draft-model",
        default=None,
        metavar="PATH",
        help="a draft GGUF, an EAGLE-3 head or a DFlash draft to check with the model",
    )
    add_memory_options(inf)
    inf.add_argument("--json", action="store_true")
    inf.add_argument("--n-ctx", "-c", "--ctx-size", dest="n_ctx", default=None, help="a context length to check")
    add_settings_options(inf)
    inf.set_defaults(func=cmd_info)
    s = sub.add_parser("strategies", help="list strategies and their knobs")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_strategies)


def cmd_info(args: argparse.Namespace) -> int:
    """``specviz info [MODEL] [--draft-model D] [-fa ... -ctk ...]``: the model's facts, which strategies it can
    run, which KV cache types its heads allow, and whether the given context settings can be used."""
    for flag, p in (("argument MODEL", args.model), ("option --draft-model", args.draft_model)):
        if p is not None and not Path(p).is_file():
            raise UsageError(f"{flag}: {p!r} does not exist; pass the path of a .gguf file")
    from ..analysis.model_info import model_info

    asked = bool(given_settings(args)) or args.n_ctx is not None
    n_ctx = None if args.n_ctx is None else int_option("--n-ctx", args.n_ctx, 16, 1 << 20)
    settings = settings_of(args, n_ctx=n_ctx) if asked else None  # values refused before the model loads
    info = model_info(args.model, args.draft_model, settings, **memory_config(args))
    print(json.dumps(info.to_dict()) if args.json else info.format())
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    """``specviz strategies``: list every strategy with its knobs."""
    out = {n: strategy_schema(n).to_list() for n in strategy_names()}
    if args.json:
        print(json.dumps(out))
        return 0
    for n, knobs in out.items():
        print(n)
        for k in knobs:
            print(f"  {k['flag']:<28} default {k['default']!s:<8} {k['help']}")
    return 0
