"""``specviz derive-draft``: a draft GGUF keeping a subset of the target's layers (:mod:`specviz.models.derive`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import KnobError
from .options import UsageError


def add_commands(sub: Any) -> None:
    """Add ``derive-draft`` to the ``specviz`` subcommands."""
    d = sub.add_parser("derive-draft", help="write a draft GGUF keeping a subset of the target's layers")
    d.add_argument("target", metavar="TARGET", help="the target GGUF")
    d.add_argument("--keep-layers", required=True, help="layers to keep, e.g. 0-5,12-17")
    d.add_argument("-o", "--output", required=True, help="the draft GGUF to write")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_derive_draft)


def cmd_derive_draft(args: argparse.Namespace) -> int:
    """``specviz derive-draft``: write a draft GGUF keeping a subset of the target's layers."""
    from ..models.derive import derive_draft, parse_layers

    target = Path(args.target)
    if not target.is_file():
        raise UsageError(f"argument TARGET: {args.target!r} does not exist; pass the target .gguf file")
    try:
        parse_layers(args.keep_layers)  # the syntax, before reading the model
    except KnobError as e:
        raise UsageError(str(e)) from None
    out = Path(args.output)
    if not out.parent.is_dir():
        raise UsageError(f"option -o: folder {str(out.parent)!r} does not exist")
    try:
        res = derive_draft(target, args.keep_layers, out)
    except KnobError as e:  # a layer the target does not have
        raise UsageError(str(e)) from None
    info = res.to_dict() if hasattr(res, "to_dict") else {"path": str(res.path)}
    if args.json:
        print(json.dumps(info, default=str))
    else:
        print(f"wrote {res.path}: {len(res.kept)} of {res.source_layers} layers kept ({args.keep_layers})")
    return 0
