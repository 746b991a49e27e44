"""``specviz run`` (one generation, text or ``--json``) and ``specviz verify`` (plain greedy vs speculative
greedy, with a verdict)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .generation_options import add_generation_options, generation_config
from .options import UsageError, warn
from .settings_options import add_server_args_option, session_kwargs
from .workbench import run_extras


def add_commands(sub: Any) -> None:
    """Add ``run`` and ``verify`` to the ``specviz`` subcommands."""
    r = sub.add_parser("run", help="generate once and print the text and telemetry")
    add_generation_options(r, strategy_default=None)
    r.add_argument("--record", default=None, metavar="FILE.jsonl", help="record every event as JSON Lines")
    add_server_args_option(r)
    r.add_argument(
        "--requests",
        default=None,
        metavar="LOG.jsonl",
        help="run every request of a deployment's OpenAI chat-format request log ({messages} or {body: {messages}}) "
        "instead of one prompt; each request's max_tokens, temperature and stop are used where it gives them",
    )
    add_slot_options(
        r,
        "llama-server's slots: with --requests, N requests at a time, every busy slot's verify batch in one "
        "decode; -c is the whole cache, split over the slots (default 1: one request at a time)",
    )
    r.add_argument(
        "--draft-schedule",
        dest="draft_schedule",
        default=None,
        metavar="START-END:K,...",
        help="with -np: while START to END slots are busy, drafts of at most K tokens (vLLM's schedule; "
        "specviz advise REC --parallel N,... --schedule derives one), e.g. 1-2:16,3-8:0",
    )
    r.set_defaults(func=cmd_run)
    v = sub.add_parser(
        "verify", help="compare plain greedy and speculative greedy output (-np N: batched against alone)"
    )
    add_generation_options(v, strategy_default=None)
    v.add_argument(
        "--threshold",
        default=None,
        help="also require both top-two margins below this (logits) for numerics; by default a replay of the "
        "speculative run's verify batches decides (with -np: it also replaces the near-tie bound of 1.2)",
    )
    add_slot_options(
        v,
        "instead: run N requests at a time in one batch (llama-server's slots; -c split over them) and each "
        "alone, and judge every request's batched greedy tokens against its own alone; the prompt runs as N "
        "identical requests, --requests LOG as its requests",
    )
    v.add_argument(
        "--requests",
        default=None,
        metavar="LOG.jsonl",
        help="with -np: the requests of a chat-format request log (as run --requests reads it; --chat-template for "
        "a model without one), each greedy (its sampling options dropped), instead of one prompt",
    )
    v.set_defaults(func=cmd_verify, greedy_only="specviz verify")


def add_slot_options(p: argparse.ArgumentParser, parallel_help: str) -> None:
    """``-np N`` / ``--parallel N`` (llama-server's slots, with ``parallel_help``) and ``-kvu`` / ``--kv-unified``."""
    p.add_argument("-np", "--parallel", dest="parallel", default=None, metavar="N", help=parallel_help)
    p.add_argument(
        "-kvu",
        "--kv-unified",
        dest="kv_unified",
        action="store_true",
        help="with -np: one cache pool every slot draws on (llama-server's -kvu), instead of -c split over them",
    )


def forced_indexes(session: Any) -> list[int]:
    """The indexes in ``session.tokens`` (the generated tokens) of those the generation's grammar forced (the
    only token it allowed there), from its ``Accepted`` events' ``forced``; empty without a grammar."""
    from ..decoding.events import Accepted

    n = session.n_prompt
    return sorted(e.position - n + i for e in session.events if isinstance(e, Accepted) for i in e.forced)


def grammar_line(t: dict[str, Any]) -> str:
    """One line of what a run's grammar did, for people: the tokens it forced, and the share of drafted tokens
    it made impossible (the telemetry's ``forced``, ``grammar_impossible`` and their share)."""
    return (
        f"grammar: {t['forced']} of {t['n_generated']} tokens forced (the only token it allowed there; --json: "
        f"'forced', their indexes in 'tokens'); {t['grammar_impossible']} of {t['drafted']} drafted tokens "
        f"({t['grammar_impossible_share']:.0%}) impossible under it"
    )


def tree_line(t: dict[str, Any]) -> str:
    """One line of what a run's draft trees did (the telemetry's ``tree``): the rounds that branched, the most
    branches one had, the nodes they verified."""
    tree = t["tree"]
    return (
        f"tree: {tree['rounds_with_branches']} of {t['rounds']} rounds branched (up to {tree['max_branches']} "
        f"branches), {tree['nodes_verified']} nodes verified in them; the other rounds drafted a chain"
    )


def _result(session, cfg: dict[str, Any]) -> dict[str, Any]:
    tel = session.telemetry_dict()
    return {
        "tokens": session.tokens,
        "forced": forced_indexes(session),
        "text": session.text,
        "finish_reason": session.finished,
        "strategy": session.strategy,
        "knobs": session.knobs,
        "prompt_tokens": session.n_prompt,
        "sampling": session.generation.sampling.to_dict(),
        "seed": session.generation.seed if not session.generation.sampling.greedy else None,
        "model": str(session.model.path),
        "telemetry": tel,
    }


def memory_line(t: dict[str, Any]) -> str:
    """One line of a run's memory figures for people (the telemetry's ``memory`` and counters)."""
    from ..backends.memory import mib_text

    m = t["memory"]
    tgt = m["target"]
    parts = [f"memory {tgt['kind']}"]
    sizes = [
        ("KV", tgt["kv_bytes"]),
        ("sliding-window KV", tgt["swa_kv_bytes"]),
        ("recurrent state", tgt["recurrent_bytes"]),
    ]
    parts.append(", ".join(f"{k} {mib_text(v)}" for k, v in sizes if v) or "no cache")
    if t["checkpoints"] or t["rollback_paths"]:
        paths = ", ".join(f"{k} {v}" for k, v in sorted(t["rollback_paths"].items()))
        parts.append(
            f"{t['checkpoints']} checkpoints ({mib_text(t['checkpoint_bytes'])}, "
            f"{t['checkpoint_seconds'] * 1e3:.2f} ms), "
            f"rollbacks: {paths or 'none'}, restores {t['restore_seconds'] * 1e3:.2f} ms"
        )
    rss = mib_text(m["rss_bytes"]) if m["rss_bytes"] is not None else "not available"
    parts.append(f"process resident {rss}, peak {mib_text(m['peak_rss_bytes'])}")
    return "; ".join(parts)


def cpu_line(t: dict[str, Any]) -> str:
    """One line of how much of the machine a run had, for people (the telemetry's ``cpu_share`` and
    ``n_threads``, worded by :func:`~specviz.decoding.machine_load.share_text`), with the load average at
    the start and the end where the system reports one."""
    from ..decoding.machine_load import share_text

    text = share_text(t.get("cpu_share"), t.get("n_threads"))
    load = (t.get("machine") or {}).get("load_average") or {}
    if load.get("start") is not None and load.get("latest") is not None:
        text += f"; load average {load['start'][0]:.2f} at the start, {load['latest'][0]:.2f} at the end"
    return text


def _open_batch(cfg: dict[str, Any], *, record_margins: bool = False) -> Any:
    """The :class:`~specviz.decoding.batch.BatchRun` of ``cfg``'s slots (``-np``): ``-c`` the whole cache;
    ``record_margins``: each result keeps its top-two margins (``verify -np``)."""
    from ..decoding.batch import BatchRun

    par, memory = cfg["parallel"], cfg["memory"]
    if memory.get("n_rs_seq") is not None:
        warn("option --n-rs-seq is accepted but not applied: several slots share memory that removes a tail")
    # a server line without --swa-full keeps llama-server's ring-sized sliding-window cache, which specviz's
    # slots cannot share (a cut of one sequence): they take the full-size cache, named where it matters
    ring_line = cfg["server"] is not None and not memory["swa_full"]
    batch = BatchRun(
        cfg["model"],
        n_parallel=par["n_parallel"],
        kv_unified=par["kv_unified"],
        draft_schedule=par.get("draft_schedule"),
        **session_kwargs(cfg["settings"]),
        swa_full=memory["swa_full"] or ring_line,
        prefill=memory.get("prefill", "all-but-last"),
        n_gpu_layers=cfg["n_gpu_layers"],
        record_margins=record_margins,
    )
    if ring_line and batch.ctx.memory.info.kind == "sliding-window":
        warn(
            f"--server-args -np {par['n_parallel']} without --swa-full: llama-server's slots keep the ring-sized "
            "sliding-window cache, specviz's the full-size one (its slots cut one sequence alone); a greedy text "
            "can part from the server's at a near-tie (add --swa-full to the line to run the server alike)"
        )
    return batch


def _open_session(cfg: dict[str, Any]) -> tuple[Any, Any]:
    """The session one prompt runs on, and the batched run it is slot 0 of (None with one slot): a single
    prompt with ``-np N`` is a batch of one, as llama-server serves one request with N slots (its context
    is its slot's share of ``-c``)."""
    from ..decoding.session import Session

    if cfg["parallel"]["n_parallel"] > 1:
        batch = _open_batch(cfg)
        return batch.slots[0], batch
    s = Session(cfg["model"], **session_kwargs(cfg["settings"]), **cfg["memory"], n_gpu_layers=cfg["n_gpu_layers"])
    return s, None


def _slots_of(cfg: dict[str, Any], session: Any) -> dict[str, Any]:
    """The ``--json`` entries of the slots: ``n_parallel``, ``kv_unified``, ``draft_schedule`` where given and each
    slot's context ``n_ctx_seq``."""
    return {**cfg["parallel"], "n_ctx_seq": int(session.ctx.capacity.n_ctx)}


def cmd_run(args: argparse.Namespace) -> int:
    """``specviz run``: one generation; prints the text and a telemetry line, or one JSON object."""
    cfg = generation_config(args, warn=warn)
    if args.record is not None and not Path(args.record).resolve().parent.is_dir():
        raise UsageError(f"option --record: folder of {args.record!r} does not exist")
    requests = _requests_of(args)
    from ..decoding.recorder import Recorder

    if requests is not None:
        return _run_requests(args, cfg, requests)

    s, batch = _open_session(cfg)
    recorder = Recorder(args.record) if args.record else None
    if recorder is not None:
        s.subscribe(recorder)
    req = cfg["request"]
    prompt = None if "messages" in req else cfg["prompt"]
    server_run = None
    if cfg["server"] is not None:  # the server's configuration, through its generation loop
        from ..analysis.server_repro import run_like_the_server

        server_run = run_like_the_server(
            s, prompt, cfg["max_tokens"], cfg["strategy"], cfg["knobs"], seed=cfg["seed"], **cfg["sampling"], **req
        )
    else:
        s.start(prompt, cfg["max_tokens"], cfg["strategy"], seed=cfg["seed"], **cfg["sampling"], **req, **cfg["knobs"])
        s.run()
    if recorder is not None:
        recorder.close()
    res = _result(s, cfg)
    res["settings"] = s.settings.to_dict()
    res["n_gpu_layers"] = s.model.n_gpu_layers
    res.update(_slots_of(cfg, s))
    if server_run is not None:
        res["server_counts"] = {
            k: getattr(server_run, k) for k in ("draft_n", "draft_n_accepted", "verify_steps", "accepted_per_pos")
        }
    if args.json:
        res.update(run_extras(s))
        print(json.dumps(res, ensure_ascii=False))
    else:
        t = res["telemetry"]
        print(res["text"])
        print(
            f"\n[{res['strategy']}] {t['n_generated']} tokens in {t['rounds']} rounds, "
            f"acceptance {t['acceptance_rate']:.1%} ({t['accepted']}/{t['drafted']}), "
            f"mean accepted length {t['mean_accepted_length']:.2f}, {t['tokens_per_second']:.1f} tokens/s, "
            f"finish: {res['finish_reason']}",
            file=sys.stderr,
        )
        print(memory_line(t), file=sys.stderr)
        print(cpu_line(t), file=sys.stderr)
        if s.generation.grammar is not None:
            print(grammar_line(t), file=sys.stderr)
        from ..strategies.knobs import tree_width_of

        if tree_width_of(cfg["knobs"])[0] > 1:
            print(tree_line(t), file=sys.stderr)
        if server_run is not None:
            print(
                f"as llama-server counts it: draft_n = {server_run.draft_n}, draft_n_accepted = "
                f"{server_run.draft_n_accepted} ({server_run.acceptance:.1%}), {server_run.verify_steps} "
                f"verification steps; settings {s.settings.describe()}",
                file=sys.stderr,
            )
        st = t.get("strategy_stats") or {}
        if st and res["strategy"] != "none":
            print(
                f"statistics {res['strategy']}: #calls = {st['calls']}, #gen drafts = {st['drafts_generated']}, "
                f"#acc drafts = {st['drafts_accepted']}, #gen tokens = {st['tokens_generated']}, "
                f"#acc tokens = {st['tokens_accepted']}, dur(b,g,a) = {st['begin_seconds'] * 1e3:.3f}, "
                f"{st['draft_seconds'] * 1e3:.3f}, {st['accept_seconds'] * 1e3:.3f} ms",
                file=sys.stderr,
            )
    (batch or s).close()
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """``specviz verify``: plain greedy vs speculative greedy on one prompt, with a verdict; with ``-np N``, every
    request batched against the same request alone (:func:`_verify_batched`)."""
    cfg = generation_config(args, warn=warn)
    requests = _requests_of(args)
    batched = cfg["parallel"]["n_parallel"] > 1
    if requests is not None and not batched:
        raise UsageError("option --requests: only with -np N above 1 (without it verify compares one prompt)")
    if set(cfg["request"]) - ({"chat_template"} if requests is not None else set()):
        raise UsageError(
            "specviz verify compares plain text prompts: --chat, --stop and the grammar options are for specviz run"
        )
    threshold = None
    if args.threshold is not None:
        try:
            threshold = float(args.threshold)
            if not threshold > 0:
                raise ValueError
        except ValueError:
            raise UsageError(f"option --threshold: {args.threshold!r} is not allowed; expected a number > 0") from None
    if batched:
        return _verify_batched(args, cfg, requests, threshold)
    from ..analysis.equivalence import check_equivalence
    from ..decoding.session import Session

    s = Session(cfg["model"], **session_kwargs(cfg["settings"]), **cfg["memory"], n_gpu_layers=cfg["n_gpu_layers"])
    res = check_equivalence(s, cfg["prompt"], cfg["max_tokens"], cfg["strategy"], cfg["knobs"], threshold)
    s.close()
    if args.json:
        print(json.dumps(res, ensure_ascii=False))
    else:
        if res["verdict"] == "identical":
            print(f"identical: {res['plain_tokens']} tokens, plain and {res['strategy']} agree")
        else:
            d, replay = res["divergence"], res["replay"]
            bound = f", threshold {threshold}" if threshold is not None else ""
            print(
                f"{res['verdict']}: first divergence at generated token {d['index']}: plain "
                f"{d['plain_piece']!r} vs speculative {d['speculative_piece']!r}; top-two margin "
                f"{d['plain_margin']} (plain) / {d['speculative_margin']} (speculative){bound}; "
                + _replay_words(replay)
            )
    return 0 if res["verdict"] != "mismatch" else 1


def _verify_batched(args: argparse.Namespace, cfg: dict[str, Any], requests: list | None, threshold: Any) -> int:
    """``specviz verify -np N``: the requests (the prompt N times without ``--requests``) run N at a time in one
    batch and each alone with the settings ``specviz run`` alone has, every request judged
    (:func:`~specviz.analysis.batch_equivalence.check_batched_equivalence`); one line each and a total, or one JSON
    object. Exit status 1 when any request's verdict is ``mismatch``."""
    from ..analysis.batch_equivalence import VERDICTS, check_batched_equivalence
    from ..decoding.session import Session
    from ..errors import BatchError

    par = cfg["parallel"]
    items = requests if requests is not None else [cfg["prompt"]] * par["n_parallel"]
    batch = _open_batch(cfg, record_margins=True)
    try:
        alone = Session(
            batch.model, **session_kwargs(cfg["settings"]), **cfg["memory"], n_gpu_layers=cfg["n_gpu_layers"]
        )
        try:
            res = check_batched_equivalence(
                batch,
                alone,
                items,
                cfg["max_tokens"],
                cfg["strategy"],
                cfg["knobs"],
                threshold,
                chat_template=cfg["request"].get("chat_template"),
            )
        except BatchError as e:  # a request that fails alone: bad input, nothing compared
            raise UsageError(str(e)) from None
        finally:
            alone.close()
    finally:
        batch.close()
    res.update(n_parallel=par["n_parallel"], kv_unified=par["kv_unified"])
    if args.json:
        print(json.dumps(res, ensure_ascii=False))
    else:
        for r in res["requests"]:
            print(_batched_line(r))
        counts = ", ".join(f"{sum(r['verdict'] == v for r in res['requests'])} {v}" for v in VERDICTS)
        cache = "a unified cache" if par["kv_unified"] else "the cache split over the slots"
        print(
            f"{res['verdict']}: {len(res['requests'])} requests, {par['n_parallel']} at a time ({cache}), each "
            f"against itself alone: {counts}; near-tie bound {res['bound']} logits"
        )
    return 0 if res["verdict"] != "mismatch" else 1


def _batched_line(r: dict[str, Any]) -> str:
    """One request of ``verify -np`` for people: its verdict, where it parted from itself alone, the margins there
    and, off the same pair, the ranks in the row evaluated alone again."""
    head = f"{r['id']}: {r['verdict']}"
    if r["error"] is not None:
        return f"{head}, a run ended with an error: {r['error']}"
    d = r["divergence"]
    if d is None:
        return f"{head}, {r['tokens']} tokens, slot {r['slot']}"
    margins = " / ".join(
        f"{d[run + '_margin']:.3f} ({run})" if d[run + "_margin"] is not None else f"none ({run})"
        for run in ("alone", "batched")
    )
    text = (
        f"{head} at generated token {d['index']} (slot {r['slot']}): alone {d['alone_piece']!r} vs batched "
        f"{d['batched_piece']!r}; top-two margin {margins}"
    )
    if d["same_pair"]:
        return text + "; both runs' top two are these two tokens"
    ranks = r["ranks_alone"]
    if not ranks:
        return text + "; one run had stopped"
    where = ", ".join(f"the {k} token rank {n}, {g:.3f} logits below the top" for k, (n, g) in ranks.items())
    return text + f"; not the same pair, that row evaluated alone again: {where}"


def _replay_words(replay: dict[str, Any] | None) -> str:
    """What the replay of the speculative run found, in words."""
    if replay is None:
        return "the two runs did not choose between the same two tokens (no replay)"
    if replay["reproduced"]:
        return f"a replay of its verify batches gives the same {replay['tokens']} tokens"
    expected = "nothing more" if replay["expected"] is None else f"token {replay['expected']}"
    return (
        f"a replay of its verify batches parts at generated token {replay['tokens']} (round {replay['round']}, "
        f"row {replay['row']}: the greedy rule gives {expected}, the run committed {replay['committed']})"
    )


def _requests_of(args: argparse.Namespace) -> list | None:
    """The requests of ``--requests`` (None without it); a malformed line is refused naming it."""
    if args.requests is None:
        return None
    from ..sweep.request_log import read_request_log

    if not Path(args.requests).is_file():
        raise UsageError(f"option --requests: {args.requests!r} does not exist; pass a .jsonl request log")
    requests, problems = read_request_log(args.requests)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"option --requests: {problems[0]}{more}")
    if not requests:
        raise UsageError("option --requests: the log holds no chat request")
    return requests


def _run_requests(args: argparse.Namespace, cfg: dict[str, Any], requests: list) -> int:
    """``specviz run --requests LOG``: every request (``-np N``: N at a time), one line each as it finishes and
    the totals (or one JSON object); exit status 1 when a request ended with an error (the others still ran)."""
    from ..analysis.request_runs import run_requests, run_requests_batched
    from ..decoding.recorder import Recorder

    sampling = dict(cfg["sampling"])
    if cfg["seed"] is not None:
        sampling["seed"] = cfg["seed"]
    if "grammar" in cfg["request"]:  # every request's, unless it gives its own
        sampling["grammar"] = cfg["request"]["grammar"]
    server = cfg["server"]
    template = cfg["request"].get("chat_template") or (server.chat_template if server is not None else None)
    common: dict[str, Any] = dict(max_tokens=cfg["max_tokens"], sampling=sampling, chat_template=template)
    common.update(server_loop=server is not None, progress=None if args.json else _request_line)
    recorder = Recorder(args.record) if args.record else None
    batch = _open_batch(cfg) if cfg["parallel"]["n_parallel"] > 1 else None
    s = batch.slots[0] if batch is not None else _open_session(cfg)[0]
    t0 = time.perf_counter()
    try:
        if batch is not None:
            runs = run_requests_batched(batch, requests, cfg["strategy"], cfg["knobs"], record=recorder, **common)
        else:
            if recorder is not None:
                s.subscribe(recorder)
            runs = run_requests(s, requests, cfg["strategy"], cfg["knobs"], **common)
    finally:
        if recorder is not None:
            recorder.close()
        settings, slots = s.settings.to_dict(), _slots_of(cfg, s)
        (batch or s).close()
    totals, share_words = _request_totals(runs, batch, time.perf_counter() - t0)
    if args.json:
        out = {"strategy": cfg["strategy"], "knobs": cfg["knobs"], "settings": settings, **slots, "totals": totals}
        out["requests"] = [r.to_dict() for r in runs]
        print(json.dumps(out, ensure_ascii=False))
    else:
        t = totals
        print(
            f"[{cfg['strategy']}] {t['requests']} requests, {t['n_generated']} tokens, acceptance "
            f"{t['acceptance_rate']:.1%} ({t['accepted']}/{t['drafted']}), {t['tokens_per_second']:.1f} tokens/s per "
            f"request, {t['tokens_per_wall_second']:.1f} in all; "
            f"{t['decodes']} decodes, {t['mean_sequences_per_decode']:.2f} sequences per decode "
            f"({slots['n_parallel']} slot{'s' if slots['n_parallel'] > 1 else ''} of {slots['n_ctx_seq']} positions); "
            + share_words
        )
    failed = [r for r in runs if r.error is not None]
    if failed:
        print(f"specviz: error: {len(failed)} of {len(runs)} requests ended with an error", file=sys.stderr)
    return 1 if failed else 0


def _request_line(r: Any) -> None:
    """One finished request for people, on stderr."""
    if r.error is not None:
        print(f"{r.id}: slot {r.slot}, error after {len(r.tokens)} tokens: {r.error}", file=sys.stderr)
        return
    c = r.server_counts
    extra = f", as llama-server counts it {c['draft_n_accepted']}/{c['draft_n']}" if c else ""
    print(
        f"{r.id}: {len(r.tokens)} tokens, acceptance {r.acceptance:.1%} ({r.accepted}/{r.drafted}), "
        f"{r.tokens_per_second:.1f} tokens/s, finish {r.finish}, slot {r.slot}{extra}; {r.cpu_text()}",
        file=sys.stderr,
    )


def _request_totals(runs: list, batch: Any, wall_seconds: float) -> tuple[dict[str, Any], str]:
    """``--json``'s ``totals`` of a request log's runs: the counts, the speeds (per request, over the requests'
    own seconds; and all together, over the run's ``wall_seconds``, prompts included), the pooled CPU share, and
    the target's generation decodes with the busy sequences each held on average (a batched run's own counts; one at a
    time, every decode held one sequence: the requests' decodes summed); and the CPU share in words."""
    from ..analysis.request_runs import pooled_cpu_share

    drafted, accepted = sum(r.drafted for r in runs), sum(r.accepted for r in runs)
    n, secs = sum(len(r.tokens) for r in runs), sum(r.seconds for r in runs)
    share, share_words = pooled_cpu_share(runs)
    if batch is not None:
        decodes, mean = batch.decodes, batch.mean_sequences_per_decode
    else:
        decodes = sum(r.decodes for r in runs)
        mean = 1.0 if decodes else 0.0
    return {
        "requests": len(runs),
        "failed": sum(1 for r in runs if r.error is not None),
        "n_generated": n,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "tokens_per_second": n / secs if secs > 0 else 0.0,
        "cpu_share": share,
        "decodes": decodes,
        "mean_sequences_per_decode": mean,
        "wall_seconds": wall_seconds,
        "tokens_per_wall_second": n / wall_seconds if wall_seconds > 0 else 0.0,
    }, share_words
