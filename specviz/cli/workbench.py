"""The debugging workbench on the command line: ``specviz diagnose`` and ``specviz advise`` on a recording,
and the ``diagnosis`` and ``advice`` of ``specviz run --json``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..analysis.advise import advise, session_cost
from ..analysis.advise_fresh import measure_recorded
from ..analysis.diagnose import diagnose
from ..decoding.verify_cost import VerifyCostModel
from .options import UsageError
from .server import add_check_server_options, check_server, check_server_parallel


def run_extras(s: Any) -> dict[str, Any]:
    """The ``diagnosis`` and ``advice`` entries of ``specviz run --json``."""
    cost = session_cost(s)
    return {
        "diagnosis": diagnose(s, cost=cost).to_dict(),
        "advice": advise(s, cost=cost, scale_to_rounds=True, fresh=True).to_dict(),
    }


def _read(path: str) -> list:
    from ..decoding.recorder import read_events

    if not Path(path).is_file():
        raise UsageError(f"argument FILE: {path!r} does not exist; pass a .jsonl recording")
    return read_events(path)


def _cost_file(path: str | None) -> VerifyCostModel | None:
    """A verify-cost curve from ``benchmarks/bench_verify_cost.py --json`` (or ``{"sizes", "seconds"}``)."""
    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text())
        if isinstance(data, dict):
            return VerifyCostModel(data["sizes"], data["seconds"])
        return VerifyCostModel([int(r["batch"]) for r in data], [float(r["median_ms"]) / 1000 for r in data])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(
            f"option --verify-cost: {path!r} is not a verify-cost curve (bench_verify_cost.py --json output): {e}"
        ) from None


def cmd_diagnose(args: argparse.Namespace) -> int:
    """``specviz diagnose FILE.jsonl``: why acceptance is what it is, from a recording."""
    dg = diagnose(_read(args.file), cost=_cost_file(args.verify_cost))
    print(json.dumps(dg.to_dict(), ensure_ascii=False) if args.json else dg.text())
    return 0


def cmd_advise(args: argparse.Namespace) -> int:
    """``specviz advise FILE.jsonl``: the draft settings with the best expected tokens/s, and llama.cpp flags;
    with ``--check-server``, measured in llama-server beside the prediction (:mod:`specviz.cli.server`)."""
    _check_tree_alone(args)
    _check_schedule_options(args)
    events = _read(args.file)
    if getattr(args, "synth_rates", False):
        return _synth_rates(args, events)
    if getattr(args, "parallel", None) is not None:
        return _under_load(args, events)
    for_server = bool(getattr(args, "for_server", False) or getattr(args, "check_server", False))
    cost, fresh = _cost_file(args.verify_cost), bool(getattr(args, "fresh", False))
    if fresh and cost is None:
        cost = measure_recorded(events, getattr(args, "model", None), _tree_rows(args))
        if cost is None:
            raise UsageError("option --fresh: the recorded model is not at hand (pass --model PATH)")
    if getattr(args, "tree", False):
        return _tree(args, events, cost)
    adv = advise(events, cost=cost, for_server=for_server, fresh=fresh)
    if getattr(args, "check_server", False):
        return check_server(args, adv, events)
    print(json.dumps(adv.to_dict(), ensure_ascii=False) if args.json else adv.report())
    return 0


def _check_schedule_options(args: argparse.Namespace) -> None:
    """``--schedule`` needs ``--parallel`` (its busy counts); ``--kv-unified`` needs ``--schedule``."""
    if getattr(args, "schedule", False) and getattr(args, "parallel", None) is None:
        raise UsageError("option --schedule: only with --parallel N,N,... (the busy counts the schedule covers)")
    if getattr(args, "kv_unified", False) and not getattr(args, "schedule", False):
        raise UsageError("option --kv-unified: only with --schedule (the cache the schedule's batches are priced in)")
    burst = getattr(args, "burst", None)
    if burst is not None:
        if not getattr(args, "schedule", False):
            raise UsageError("option --burst: only with --schedule (the load the schedule is chosen for)")
        if not (burst.isdigit() and 1 <= int(burst) <= 1000):
            raise UsageError(f"option --burst: {burst!r} is not allowed; expected requests per slot, 1..1000")


def _check_tree_alone(args: argparse.Namespace) -> None:
    """``--tree`` is its own report: refused beside the options that make another one; ``--check`` needs it."""
    if not getattr(args, "tree", False):
        if getattr(args, "check", False):
            raise UsageError("option --check: only with --tree (it runs the advised tree beside the chain)")
        return
    others = {
        "--synth-rates": getattr(args, "synth_rates", False),
        "--parallel": getattr(args, "parallel", None) is not None,
        "--check-server": getattr(args, "check_server", False),
        "--for-server": getattr(args, "for_server", False),
    }
    named = [name for name, given in others.items() if given]
    if named:
        raise UsageError(f"option --tree: not with {', '.join(named)} (--tree is a report of its own)")


def _tree_rows(args: argparse.Namespace) -> int | None:
    """With ``--tree``, the draft tokens ``--fresh`` times (the largest tree's nodes); else None (the recording's)."""
    from ..analysis.tree_advice import NODE_BUDGET

    return NODE_BUDGET if getattr(args, "tree", False) else None


def _tree(args: argparse.Namespace, events: list, cost: VerifyCostModel | None) -> int:
    """``specviz advise FILE --tree``: whether a draft tree would pay, predicted from the recording's rank shares
    (:mod:`specviz.analysis.tree_advice`); a recording without draft candidates is refused."""
    from ..analysis.tree_advice import tree_advice
    from ..errors import RecordingError

    try:
        adv = tree_advice(events, cost)
    except RecordingError as e:
        raise UsageError(f"option --tree: {e}") from None
    out = adv.to_dict()
    text = adv.report()
    if getattr(args, "check", False):
        check = _tree_check(args, events, adv)
        out["check"] = check.to_dict()
        text += "\n\n" + check.report()
    print(json.dumps({"tree": out}, ensure_ascii=False) if args.json else text)
    return 0


def _tree_check(args: argparse.Namespace, events: list, adv: Any) -> Any:
    """``--tree --check``: the advised tree and the chain run on the recording's prompt
    (:mod:`specviz.analysis.tree_check`); ``--model``, ``--max-tokens`` and ``--repeats`` as for the server check."""
    from ..analysis.tree_check import check_tree
    from ..errors import RecordingError
    from .options import int_option

    repeats = int_option("--repeats", args.repeats, 1, 50)
    n = None if args.max_tokens is None else int_option("--max-tokens", args.max_tokens, 1, 1 << 16)
    try:
        return check_tree(events, adv, model=args.model, max_tokens=n, repeats=repeats)
    except RecordingError as e:
        raise UsageError(f"option --check: {e}") from None


def _under_load(args: argparse.Namespace, events: list) -> int:
    """``specviz advise FILE --parallel 1,2,4``: the advice at each concurrency
    (:mod:`specviz.analysis.advise_parallel`), from a batch-cost table read (``--batch-cost``) or measured now on
    the recorded model (or ``--model``)."""
    from ..analysis.advise_fresh import recorded_load
    from ..analysis.advise_parallel import advise_parallel, parse_parallels
    from ..errors import KnobError

    load = recorded_load(events)
    try:
        parallels = sorted(load) if args.parallel == "recorded" else parse_parallels(args.parallel)
    except KnobError as e:
        raise UsageError(f"option --parallel: {e}") from None
    if not parallels:
        raise UsageError(
            "option --parallel: the recording holds no batched run (no batch_step events): give the concurrencies, "
            "e.g. --parallel 1,2,4"
        )
    table = _batch_cost_table(args, events, parallels)
    # one request's verify cost at every batch size, which the table scales by concurrency
    base = _cost_file(args.verify_cost) or measure_recorded(events, getattr(args, "model", None))
    adv = advise_parallel(events, table, parallels, load=load if args.parallel == "recorded" else None, base=base)
    extra: dict[str, Any] = {"batch_cost": table.to_dict()}
    schedule = _load_schedule(args, events, table, max(parallels))
    if schedule is not None:
        extra["load_schedule"] = schedule.to_dict()
    if getattr(args, "check_server", False):
        return check_server_parallel(args, adv, events, extra)
    if args.json:
        print(json.dumps({**adv.to_dict(), **extra}))
    else:
        print(adv.text() if schedule is None else adv.text() + "\n\n" + schedule.text())
    return 0


def _batch_cost_table(args: argparse.Namespace, events: list, parallels: list[int]) -> Any:
    """The batch-cost table the advice under load prices with: ``--batch-cost``'s, or measured now on the recorded
    model (or ``--model``) at ``parallels``."""
    from ..analysis.advise_fresh import measure_batch_cost_for
    from ..decoding.batch_cost import BatchCostTable

    if args.batch_cost:
        try:
            return BatchCostTable.from_dict(json.loads(Path(args.batch_cost).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"option --batch-cost: {args.batch_cost!r} is not a batch-cost table: {e}") from None
    measured = measure_batch_cost_for(events, parallels, getattr(args, "model", None))
    if measured is None:
        raise UsageError("option --parallel: the recorded model is not at hand (pass --model PATH or --batch-cost)")
    return measured


def _load_schedule(args: argparse.Namespace, events: list, table: Any, busy_max: int) -> Any:
    """With ``--schedule``: the draft length per busy count ``1 … busy_max`` on ``table``, in a unified cache with
    ``--kv-unified``, for requests arriving together with ``--burst W`` (:mod:`specviz.analysis.load_schedule`);
    None without it."""
    if not getattr(args, "schedule", False):
        return None
    from ..analysis.load_schedule import candidate_lengths, schedule_for_load
    from ..errors import RecordingError

    try:
        lengths = candidate_lengths(events)
        burst = None if getattr(args, "burst", None) is None else int(args.burst)
        unified = bool(getattr(args, "kv_unified", False))
        return schedule_for_load(events, table, busy_max, lengths, unified=unified, burst=burst)
    except RecordingError as e:
        raise UsageError(f"option --schedule: {e}") from None


def _synth_rates(args: argparse.Namespace, events: list) -> int:
    """``specviz advise FILE --synth-rates``: the recording's acceptance by draft position as llama-server's
    ``--spec-synth-rates`` and ``--spec-synth-len`` (:mod:`specviz.analysis.synth_rates`)."""
    from ..analysis.synth_rates import synth_rates
    from ..errors import RecordingError

    try:
        sr = synth_rates(events)
    except RecordingError as e:
        raise UsageError(f"argument FILE: {e}") from None
    if not getattr(args, "check_server", False):
        print(json.dumps(sr.to_dict(), ensure_ascii=False) if args.json else sr.report())
        return 0
    run = _measure_synthetic(args, events, sr.rates)
    if args.json:
        print(json.dumps({**sr.to_dict(), "server_check": run.to_dict()}, ensure_ascii=False))
    else:
        print(sr.report())
        print()
        print(f"in llama-server on this machine ({run.n_predict} tokens x {run.repeats}): {run.report()}")
    return 0


def _measure_synthetic(args: argparse.Namespace, events: list, rates: Any) -> Any:
    """``--synth-rates --check-server``: the rates measured in llama-server on the recording's model (or
    ``--model``), every option checked before a server starts (:mod:`specviz.analysis.synth_server`)."""
    import os
    import shlex

    from ..analysis.llama_server import find_server_binary
    from ..analysis.synth_server import measure_synthetic
    from ..errors import KnobError, LlamaServerError
    from .options import int_option

    repeats = int_option("--repeats", args.repeats, 1, 50)
    n_predict = 128 if args.max_tokens is None else int_option("--max-tokens", args.max_tokens, 1, 1 << 16)
    threads = (os.cpu_count() or 1) if args.threads is None else int_option("--threads", args.threads, 1, 512)
    model = args.model or next((getattr(e, "model", None) for e in events if e.kind == "session_started"), None)
    if not model or not Path(model).is_file():
        raise UsageError(f"option --model: the recording's model {model!r} is not a file here; pass --model")
    try:
        binary = find_server_binary(args.server_binary)
    except LlamaServerError as e:
        raise UsageError(str(e)) from None
    extra = ["-t", str(threads), *shlex.split(args.server_args or "")]
    n_ctx = next((getattr(e, "n_ctx", None) for e in events if e.kind == "session_started"), None)
    if n_ctx and not {"-c", "--ctx-size"} & set(extra):
        extra += ["-c", str(n_ctx)]  # the recording's context, not the model's training length
    if not {"-np", "--parallel"} & set(extra):
        extra += ["-np", "1"]  # one request at a time: one slot holds the whole context
    try:
        return measure_synthetic(model, rates, n_predict=n_predict, repeats=repeats, args=extra, binary=binary)
    except KnobError as e:
        raise UsageError(f"option --server-args: {e}") from None


def add_commands(sub: Any) -> None:
    """Add ``diagnose`` and ``advise`` to the ``specviz`` command's subparsers."""
    for name, func, text in (
        ("diagnose", cmd_diagnose, "why acceptance is low, from a recording (.jsonl)"),
        ("advise", cmd_advise, "draft settings that pay, as llama.cpp flags, from a recording"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("file", metavar="FILE")
        p.add_argument(
            "--verify-cost",
            default=None,
            metavar="FILE.json",
            help="a measured verify-cost curve (benchmarks/bench_verify_cost.py --json)",
        )
        p.add_argument("--json", action="store_true")
        if name == "advise":
            p.add_argument(
                "--fresh",
                action="store_true",
                help="measure the verify cost on this machine now with the recorded model (or --model) and check "
                "the recorded times against it: where they are slower beyond noise, the advice is scored with it",
            )
            p.add_argument(
                "--synth-rates",
                action="store_true",
                help="print the recording's acceptance by draft position as llama-server's --spec-synth-rates "
                "(unconditional, one per position) and --spec-synth-len, instead of the advice",
            )
            p.add_argument(
                "--tree",
                action="store_true",
                help="whether a draft tree would pay on this machine, predicted from a draft model's recording (the "
                "draft's rank 2, 3, ... candidates the target picked, per depth) and the verify-cost curve",
            )
            p.add_argument(
                "--check",
                action="store_true",
                help="with --tree: run the best tree the draft strategy drafts and the best chain on the recording's "
                "prompt with its draft model (--model, --max-tokens, --repeats), predicted beside measured",
            )
            p.add_argument(
                "--parallel",
                nargs="?",
                const="recorded",
                default=None,
                metavar="N,N,...",
                help="advice under load: each setting's tokens/s per request and in total at each of these many "
                "requests at once (llama-server's -np), its break-even concurrency, and the best single setting for "
                "that load; without a list, the concurrency the recording's batched run held",
            )
            p.add_argument(
                "--batch-cost",
                default=None,
                metavar="FILE.json",
                help="with --parallel: a measured batch-cost table (benchmarks/bench_batch_cost.py --json) instead of "
                "measuring one now with the recorded model (or --model)",
            )
            p.add_argument(
                "--schedule",
                action="store_true",
                help="with --parallel: the draft length per busy count 1..max of --parallel that raises the batch's "
                "total tokens/s, as run's --draft-schedule (and vLLM's [start, end, k] form)",
            )
            p.add_argument(
                "--kv-unified",
                dest="kv_unified",
                action="store_true",
                help="with --schedule: price the batch in one unified cache (llama-server's -kvu), not split over "
                "the slots",
            )
            p.add_argument(
                "--burst",
                default=None,
                metavar="W",
                help="with --schedule: choose it for W requests a slot arriving together, replayed from the "
                "recording's requests to the last (the slots that fall idle and the tail priced), not for steady load",
            )
            add_check_server_options(p)
        p.set_defaults(func=func)
