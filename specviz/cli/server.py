"""The ``specviz`` command's llama-server parts: ``advise --check-server`` (the advice measured in the server)
and ``compare-server URL`` (a running server's counters beside specviz's reproduction of the same requests).

Every option is validated before a model loads or a server starts; a refused one exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .options import UsageError, int_option, warn


def add_check_server_options(p: argparse.ArgumentParser) -> None:
    """``--check-server`` and its options, for ``specviz advise``."""
    from ..analysis.check_server import MAX_REPEATS, STABLE_SPREAD

    g = p.add_argument_group("checking the advice in llama-server (--check-server)")
    g.add_argument(
        "--check-server",
        action="store_true",
        help="run the recording's prompts through llama-server with --spec-type none and with the advised flags "
        "and print predicted and measured speedups side by side",
    )
    g.add_argument(
        "--for-server",
        action="store_true",
        help="advise llama-server: search only the settings its flags express (implied by --check-server)",
    )
    g.add_argument("--model", default=None, help="the GGUF the servers load (default: the recording's model)")
    g.add_argument("--server-binary", default=None, metavar="PATH", help="llama-server (default: make llama-tools's)")
    g.add_argument("--repeats", default="3", help="times every prompt is sent to each server (default 3)")
    g.add_argument(
        "--max-repeats",
        default=None,
        help=f"send the prompts again while the per-repeat speedups spread over {STABLE_SPREAD * 100:.0f}%% "
        f"(interquartile range over the median), up to this many times in all (default {MAX_REPEATS}, at least "
        "--repeats)",
    )
    g.add_argument("--max-tokens", default=None, help="tokens per request (default: what the recording ran)")
    g.add_argument("--threads", "-t", default=None, help="threads of both servers (default: every core)")
    g.add_argument(
        "--server-args",
        default=None,
        metavar='"ARGS"',
        help="further llama-server options for both servers (context settings such as -fa, -ctk, -c; no --spec-*)",
    )


def check_server(args: argparse.Namespace, adv: Any, events: list) -> int:
    """``specviz advise FILE --check-server``: the advice's prediction beside llama-server's measurement."""
    from ..analysis.check_server import check_advice

    target = _server_target(args, events)
    chk = check_advice(
        adv,
        target.prompts,
        target.model,
        settings=target.settings,
        max_tokens=target.max_tokens,
        repeats=target.repeats,
        max_repeats=target.max_repeats,
        binary=target.binary,
        extra_args=target.extra,
        progress=None if args.json else (lambda m: print(m, file=sys.stderr)),
        recorded_prefill=target.recorded.get("prefill"),
    )
    if args.json:
        print(json.dumps({"advice": adv.to_dict(), "server_check": chk.to_dict()}, ensure_ascii=False))
    else:
        print(adv.report())
        print()
        print(chk.report())
    return 0


def check_server_parallel(args: argparse.Namespace, advice: Any, events: list, extra_json: dict) -> int:
    """``specviz advise FILE --parallel 1,2,4 --check-server``: the advice under load
    (:class:`~specviz.analysis.advise_parallel.ParallelAdvice`) measured in llama-server with ``-np N`` and N
    requests at once (:mod:`specviz.analysis.check_parallel`)."""
    from ..analysis.check_parallel import check_parallel
    from ..errors import LlamaServerError

    target = _server_target(args, events)
    try:
        chk = check_parallel(
            advice,
            target.prompts,
            target.model,
            [r["parallel"] for r in advice.rows],
            settings=target.settings,
            max_tokens=target.max_tokens,
            repeats=target.repeats,
            binary=target.binary,
            extra_args=target.extra,
            progress=None if args.json else (lambda m: print(m, file=sys.stderr)),
        )
    except LlamaServerError as e:
        raise UsageError(f"option --check-server: {e}") from None
    if args.json:
        print(json.dumps({**advice.to_dict(), **extra_json, **chk.to_dict()}, ensure_ascii=False))
    else:
        print(advice.text())
        print()
        print(chk.report())
    return 0


@dataclass
class ServerTarget:
    """What a server check runs: the recording's prompts and context, the model, the context settings, the
    server binary, further server flags and the check's counts, every option checked."""

    prompts: list
    recorded: dict[str, Any]
    model: str
    settings: Any
    binary: Any
    extra: list[str]
    max_tokens: int | None
    repeats: int
    max_repeats: int | None


def _server_target(args: argparse.Namespace, events: list) -> ServerTarget:
    """The options of ``--check-server`` checked (exit 2 on a bad one) before any server starts."""
    import os
    import shlex

    from ..analysis.check_server import recorded_prompts
    from ..analysis.llama_server import find_server_binary
    from ..analysis.server_args import parse_server_args
    from ..backends.context_settings import ContextSettings
    from ..errors import KnobError, LlamaServerError

    repeats = int_option("--repeats", args.repeats, 1, 50)
    max_repeats = None if args.max_repeats is None else int_option("--max-repeats", args.max_repeats, repeats, 50)
    max_tokens = None if args.max_tokens is None else int_option("--max-tokens", args.max_tokens, 1, 1 << 16)
    threads = None if args.threads is None else int_option("--threads", args.threads, 1, 512)
    prompts, ctx = recorded_prompts(events)
    if not prompts:
        raise UsageError("argument FILE: the recording holds no session_started event: nothing to send")
    model = args.model or ctx.get("model")
    if not model or not Path(model).is_file():
        raise UsageError(f"option --model: the recording's model {model!r} is not a file here; pass --model")
    extra: list[str] = []
    values: dict[str, Any] = {k: ctx[k] for k in ("n_ctx", "n_batch", "n_ubatch") if ctx.get(k)}
    if args.server_args:
        try:
            cfg = parse_server_args(args.server_args)
        except KnobError as e:
            raise UsageError(f"option --server-args: {e}") from None
        if cfg.strategy != "none" or any(a.startswith("--spec") for a in cfg.argv):
            raise UsageError("option --server-args: leave out --spec-*; the advice sets them")
        values.update(cfg.given)
        for w in cfg.warnings:
            warn(f"--server-args {w}")
        extra = _without_settings(shlex.split(args.server_args))
    if threads is not None:
        values["n_threads"] = threads
    try:
        settings = ContextSettings.make(None, **values)
        binary = find_server_binary(args.server_binary)
    except KnobError as e:
        raise UsageError(f"option --server-args: {e}") from None
    except LlamaServerError as e:
        raise UsageError(str(e)) from None
    if settings.n_threads is None:
        settings = ContextSettings.make(settings, n_threads=os.cpu_count() or 1)
    return ServerTarget(prompts, ctx, str(model), settings, binary, extra, max_tokens, repeats, max_repeats)


def _without_settings(args: list[str]) -> list[str]:
    """``args`` less the context settings (those travel as :class:`ContextSettings`) and the serving-only
    options specviz sets itself."""
    from ..analysis.server_args import SETTING_FLAGS

    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in SETTING_FLAGS or a in ("-tb", "--threads-batch", "-np", "--parallel", "--host", "--port"):
            skip = True
            continue
        out.append(a)
    return out


def cmd_compare_server(args: argparse.Namespace) -> int:
    """``specviz compare-server URL --requests LOG``: the server's counters beside specviz's reproduction."""
    from ..analysis.compare_server import compare_server
    from ..analysis.server_args import parse_server_args
    from ..errors import KnobError
    from ..sweep.request_log import read_request_log

    if not args.url.startswith(("http://", "https://")):
        raise UsageError(f"argument URL: {args.url!r} is not allowed; expected http://HOST:PORT")
    log = Path(args.requests)
    if not log.is_file():
        raise UsageError(f"option --requests: {args.requests!r} does not exist; pass a .jsonl request log")
    requests, problems = read_request_log(log)
    if problems and not args.skip_bad_lines:
        raise UsageError(f"option --requests: {problems[0]}; fix it or pass --skip-bad-lines")
    if not requests:
        raise UsageError("option --requests: the log holds no chat request")
    if args.server_args is not None:
        try:
            parse_server_args(args.server_args)
        except KnobError as e:
            raise UsageError(f"option --server-args: {e}") from None
    if args.model is not None and not Path(args.model).is_file():
        raise UsageError(f"option --model: {args.model!r} does not exist; pass the path of a .gguf file")
    max_tokens = int_option("--max-tokens", args.max_tokens, 1, 1 << 16)
    cmp = compare_server(
        args.url,
        requests,
        model=args.model,
        server_args=args.server_args,
        send=args.send,
        max_tokens=max_tokens,
    )
    print(json.dumps(cmp.to_dict(), ensure_ascii=False) if args.json else cmp.report())
    return 0


def add_commands(sub: Any) -> None:
    """Add ``compare-server`` to the ``specviz`` command's subparsers."""
    p = sub.add_parser(
        "compare-server",
        help="a running llama-server's acceptance (/metrics) beside specviz's reproduction of the same requests",
    )
    p.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:8080 (started with --metrics)")
    p.add_argument("--requests", required=True, metavar="LOG.jsonl", help="the requests it served (chat format)")
    p.add_argument("--model", default=None, help="the GGUF to reproduce with (default: the server's, when it is here)")
    p.add_argument(
        "--server-args",
        default=None,
        metavar='"ARGS"',
        help="the server's command line, for its --spec-* knobs and context settings",
    )
    p.add_argument(
        "--send", action="store_true", help="send the requests to the server first and compare only what they add"
    )
    p.add_argument("--max-tokens", default="128", help="tokens for a request that names none (default 128)")
    p.add_argument("--skip-bad-lines", action="store_true", help="reproduce the good lines of a log with bad ones")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare_server)
