"""``specviz serve`` (the Panel inspector on a model, for one person or an audience) and ``specviz replay``
(a recorded session in the inspector, no model loaded). The server itself is :mod:`specviz.server`, imported
only once the options are checked (it needs the ``ui`` extra)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..strategies import strategy_class, strategy_names
from .options import UsageError, int_option, warn
from .settings_options import add_settings_options, check_settings_for, gpu_layers_of, server_config, settings_of


def add_commands(sub: Any) -> None:
    """Add ``serve`` and ``replay`` to the ``specviz`` subcommands."""
    sv = sub.add_parser("serve", help="serve the inspector (Panel) on the embedded model")
    sv.add_argument("--port", default="5006")
    sv.add_argument("--address", default="127.0.0.1", help="interface to listen on (default loopback)")
    sv.add_argument("--model", help="target GGUF path (default: the embedded Gemma 3 270M)")
    sv.add_argument("--prompt", default=None, help="the prompt each new page starts with")
    sv.add_argument("--max-tokens", default="256")
    sv.add_argument("--strategy", default="prompt-lookup")
    sv.add_argument(
        "--draft-model",
        action="append",
        metavar="PATH",
        help="a draft GGUF to offer for the draft strategy (repeatable); pages pick drafts by name",
    )
    sv.add_argument(
        "--shared",
        action="store_true",
        help="presenter mode: one session every page watches; the presenter URL controls it",
    )
    sv.add_argument(
        "--token",
        default=None,
        help="the access token (default: none on loopback, a random one printed at start elsewhere)",
    )
    sv.add_argument("--presenter-token", default=None, help="the presenter's token with --shared (default: random)")
    sv.add_argument("--max-sessions", default="8", help="pages with a session at once (default 8); others: busy")
    sv.add_argument("--max-viewers", default="100", help="pages watching a --shared session (default 100)")
    sv.add_argument(
        "--idle-timeout",
        default="300",
        help="seconds before an idle page's session gives back its llama.cpp context (default 300)",
    )
    sv.add_argument(
        "--n-ctx", "-c", "--ctx-size", default=None, help="context length of every page's session (default 4096)"
    )
    # the server's settings for every page's session (a page cannot change them)
    add_settings_options(sv, gpu_layers=True)
    sv.set_defaults(func=cmd_serve)
    rp = sub.add_parser("replay", help="show a recorded .jsonl session, without a model")
    rp.add_argument("file", metavar="FILE")
    rp.add_argument("--port", default="5006")
    rp.add_argument("--address", default="127.0.0.1")
    rp.add_argument("--token", default=None, help="the access token (default: as for serve)")
    rp.add_argument(
        "--batch-cost",
        default=None,
        metavar="TABLE.json",
        help="a batched recording's batch-cost table (benchmarks/bench_batch_cost.py --json) for the advice under "
        "load (default: measured on the recorded model when Advise is pressed)",
    )
    g = rp.add_argument_group("a deployment's request log as FILE (its requests are run first, then replayed)")
    g.add_argument("--model", default=None, help="the GGUF to run the requests on (default: the embedded model)")
    g.add_argument(
        "--server-args",
        default=None,
        metavar='"LINE"',
        help="the deployment's llama-server command line: its strategy, knobs and context settings, its loop",
    )
    g.add_argument("--max-tokens", default="128", help="tokens for a request that names none (default 128)")
    g.add_argument("--record", default=None, metavar="FILE.jsonl", help="keep the recording of the requests here")
    rp.set_defaults(func=cmd_replay)


def cmd_serve(args: argparse.Namespace) -> int:
    """``specviz serve``: the Panel inspector on the embedded model (or ``--model``)."""
    port = int_option("--port", args.port, 1, 65535)
    max_tokens = int_option("--max-tokens", args.max_tokens, 1, 1 << 20)
    if args.model is not None and not Path(args.model).is_file():
        raise UsageError(f"option --model: {args.model!r} does not exist; pass the path of a .gguf file")
    strategy = args.strategy
    draftless = [n for n in strategy_names() if not strategy_class(n).needs_model]
    if strategy not in draftless:
        raise UsageError(f"option --strategy: {strategy!r} is not allowed; choose one of: {', '.join(draftless)}")
    for d in args.draft_model or []:
        if not Path(d).is_file():
            raise UsageError(f"option --draft-model: {d!r} does not exist; pass the path of a .gguf file")
    demo = _demo_options(args)
    n_ctx = int_option("--n-ctx", args.n_ctx if args.n_ctx is not None else "4096", 16, 1 << 20)
    settings = settings_of(args, n_ctx=n_ctx)
    check_settings_for(settings, args.model)
    n_gpu_layers = gpu_layers_of(args, warn=warn)
    from ..server.app import serve

    kwargs = {"prompt": args.prompt} if args.prompt else {}
    serve(
        port,
        args.model,
        address=args.address,
        max_tokens=max_tokens,
        strategy=strategy,
        draft_models=args.draft_model or (),
        settings=settings,
        n_gpu_layers=n_gpu_layers,
        **demo,
        **kwargs,
    )
    return 0


_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _token_option(flag: str, value: str | None) -> str | None:
    """A token as given (it goes into URLs as is): 8 to 256 letters, digits or ``-._~``."""
    if value is None:
        return None
    if not 8 <= len(value) <= 256 or not set(value) <= _TOKEN_CHARS:
        raise UsageError(
            f"option {flag}: {value[:40]!r} is not allowed; expected 8 to 256 letters, digits or "
            "-._~ (it goes into the page's URL)"
        )
    return value


def _demo_options(args: argparse.Namespace) -> dict[str, Any]:
    """``specviz serve``'s options for an audience (modes, tokens, caps), validated before any model loads."""
    try:
        idle = float(args.idle_timeout)
    except (TypeError, ValueError):
        idle = -1.0
    if not 1.0 <= idle <= 86400.0:
        raise UsageError(f"option --idle-timeout: {args.idle_timeout!r} is not allowed; expected seconds in [1, 86400]")
    if args.presenter_token is not None and not args.shared:
        raise UsageError("option --presenter-token: only presenter mode has a presenter; add --shared")
    if args.presenter_token is not None and args.presenter_token == args.token:
        raise UsageError(
            "option --presenter-token: it equals --token, so every viewer would present; give a different one"
        )
    return {
        "shared": bool(args.shared),
        "token": _token_option("--token", args.token),
        "presenter_token": _token_option("--presenter-token", args.presenter_token),
        "max_sessions": int_option("--max-sessions", args.max_sessions, 1, 256),
        "max_viewers": int_option("--max-viewers", args.max_viewers, 1, 10000),
        "idle_timeout": idle,
    }


def cmd_replay(args: argparse.Namespace) -> int:
    """``specviz replay FILE.jsonl``: show a recorded session in the inspector, no model loaded. FILE may be a
    deployment's request log instead: its requests are run on ``--model`` first (with ``--server-args``'s
    configuration, through the server's loop), recorded, and the recording replayed."""
    port = int_option("--port", args.port, 1, 65535)
    if not Path(args.file).is_file():
        raise UsageError(f"argument FILE: {args.file!r} does not exist; pass a .jsonl recording")
    token = _token_option("--token", args.token)
    from ..errors import KnobError
    from ..server.app import replay
    from ..ui.parallel_advice import read_batch_cost

    try:
        batch_cost = read_batch_cost(args.batch_cost)
    except KnobError as e:
        raise UsageError(f"option --batch-cost: {e}") from None
    from ..sweep.request_log import looks_like_request_log

    path = args.file
    if looks_like_request_log(path):
        path = record_requests(args)
    elif args.model is not None or args.server_args is not None or args.record is not None:
        raise UsageError("options --model/--server-args/--record are for a request log; FILE is a recording")
    replay(path, port, address=args.address, token=token, batch_cost=batch_cost)
    return 0


def record_requests(args: argparse.Namespace) -> str:
    """Run a request log's requests (``args.file``) and record them; the recording's path."""
    import tempfile

    from ..analysis.request_runs import run_requests
    from ..decoding.recorder import Recorder
    from ..decoding.session import Session
    from ..sweep.request_log import read_request_log

    max_tokens = int_option("--max-tokens", args.max_tokens, 1, 1 << 20)
    server = server_config(args, warn=warn, given=[])
    if server is not None and server.n_parallel > 1:
        warn(f"--server-args {server.warnings_one_at_a_time('replay')[-1]}")
    model = args.model or (server.model if server is not None else None)
    if model is not None and not Path(model).is_file():
        raise UsageError(f"option --model: {model!r} does not exist; pass the path of a .gguf file")
    requests, problems = read_request_log(args.file)
    if problems:
        raise UsageError(f"argument FILE: {problems[0]}")
    if args.record is not None and not Path(args.record).resolve().parent.is_dir():
        raise UsageError(f"option --record: folder of {args.record!r} does not exist")
    out = args.record or tempfile.NamedTemporaryFile(prefix="specviz-requests-", suffix=".jsonl", delete=False).name
    kwargs = server.session_kwargs() if server is not None else {}
    s = Session(model, **kwargs)
    rec = Recorder(out)
    s.subscribe(rec)
    try:
        strategy, knobs = (server.strategy, server.knobs) if server is not None else ("prompt-lookup", {})
        template = server.chat_template if server is not None else None
        runs = run_requests(
            s, requests, strategy, knobs, max_tokens=max_tokens, chat_template=template, server_loop=server is not None
        )
    finally:
        rec.close()
        s.close()
    failed = [r for r in runs if r.error is not None]
    for r in failed:
        warn(f"request {r.id} ended with an error: {r.error}")
    print(f"specviz replay: {len(runs)} requests run and recorded in {out}", file=sys.stderr)
    return out
