"""The generation options of ``specviz run`` and ``specviz verify``: the model, the prompt, the strategy
(with llama.cpp's and the static-shape runner's spellings, and comma lists of them: a chain of drafters),
every knob's flag (generated from the strategies' schemas), sampling, and the request options ``--chat`` /
``--system`` / ``--chat-template`` / ``--stop``.

A chain's knobs are its members' (:mod:`specviz.strategies.chain`): a knob several members declare
differently (``size_n`` of ``ngram-simple`` and ``ngram-map-k``) is set per member with llama.cpp's
per-type spelling (``--spec-ngram-map-k-size-n``) or the chain's own flag (``--ngram-map-k-size-n``);
the general ``--size-n`` is then refused as ambiguous.

:func:`generation_config` checks them all, before any model loads, into the arguments of
``Session.start``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from ..decoding.knob_schema import SESSION_KNOBS, Knob, check_cross_knobs
from ..errors import KnobError, StrategyError
from ..strategies import (
    SPEC_TYPES,
    check_knob_rules,
    draft_model_strategy,
    member_knob_names,
    per_type_flags,
    resolve_strategy,
    strategy_class,
    strategy_names,
    strategy_schema,
)
from ..strategies.chain import member_slug
from .grammar_options import add_grammar_options, grammar_request
from .options import UsageError, int_option
from .settings_options import (
    SETTING_FLAGS,
    add_settings_options,
    check_settings_for,
    given_settings,
    gpu_layers_of,
    server_config,
    settings_of,
)


def _all_knobs() -> dict[str, Knob]:
    """Every knob of every strategy by name (the first declaration gives the help text)."""
    out: dict[str, Knob] = {k.name: k for k in SESSION_KNOBS}
    for name in strategy_names():
        for k in strategy_class(name).knobs:
            out.setdefault(k.name, k)
    return out


def _per_type(alias: str, strategy: str) -> bool:
    """True for llama.cpp's per-type spellings (``--spec-ngram-map-k-size-n``). ``--spec-draft-*`` is not one:
    llama.cpp's draft settings (``--spec-draft-model``, ``--spec-draft-p-min`` …) serve every model-backed
    type (draft-simple, draft-eagle3, draft-mtp), not only the strategy named ``draft``."""
    return per_type_flags().get(alias, ("",))[0] == strategy


def _clashing(name: str) -> bool:
    """True when draftless strategies declare knob ``name`` differently: a chain of them sets it per member."""
    decls = {
        k
        for n in strategy_names()
        if not strategy_class(n).needs_model
        for k in strategy_class(n).knobs
        if k.name == name
    }
    return len(decls) > 1


def _strategy_flags() -> dict[str, tuple[str, str]]:
    """llama.cpp's per-type spellings (``--spec-ngram-map-k-size-n`` …) and a chain's per-member flags
    (``--ngram-map-k-size-n``, for the knobs members declare differently): flag -> (strategy, knob)."""
    out: dict[str, tuple[str, str]] = {}
    for name in strategy_names():
        for k in strategy_class(name).knobs:
            for alias in k.aliases:
                if _per_type(alias, name):
                    out[alias] = (name, k.name)
            if not strategy_class(name).needs_model and _clashing(k.name):
                out["--" + f"{member_slug(name)}_{k.name}".replace("_", "-")] = (name, k.name)
    return out


def _general_flags(knob: Knob) -> list[str]:
    """A knob's flag and every alias of any declaration of it that is not tied to one strategy."""
    flags = [knob.flag]
    for name in strategy_names():
        for k in (*SESSION_KNOBS, *strategy_class(name).knobs):
            if k.name == knob.name:
                flags += [a for a in k.aliases if not _per_type(a, name) and a not in flags]
    return flags


def add_generation_options(p: argparse.ArgumentParser, *, strategy_default: str | None) -> None:
    """Add the generation options (model, prompt, strategy, knobs, sampling, request) to ``p``."""
    p.add_argument("--model", help="target GGUF path (default: the embedded Gemma 3 270M)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file")
    p.add_argument("--max-tokens", default=None, help="tokens to generate (default 128)")
    p.add_argument(
        "--strategy",
        default=strategy_default,
        help="one of: " + ", ".join(strategy_names()) + "; or a comma list of them, a chain tried in llama.cpp's "
        "priority order (the first that drafts wins)",
    )
    p.add_argument("--seed", default=None, help="seed for the sampling generator")
    p.add_argument("--temperature", default=None, help="sampling temperature (default 0: greedy, exact)")
    p.add_argument("--top-k", default=None, help="sample among the k most likely tokens (0: off)")
    p.add_argument("--top-p", default=None, help="sample from the smallest set holding this mass (1: off)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding only (the default); refuses sampling options")
    p.add_argument("--n-ctx", "-c", "--ctx-size", dest="n_ctx", default=None, help="context length (default 4096)")
    add_memory_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--prompt-lookup",
        nargs="?",
        const=True,
        default=None,
        metavar="MAX_NGRAM",
        help="use prompt lookup (the static-shape runner's spelling); optional largest n-gram size",
    )
    p.add_argument(
        "--spec-type",
        default=None,
        metavar="TYPE",
        help="llama.cpp's spelling of --strategy (draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark, "
        "ngram-* ...), or a comma list of them (draft-mtp,ngram-mod)",
    )
    seen: set[str] = {"--prompt-lookup"}
    for knob in _all_knobs().values():
        flags = [f for f in _general_flags(knob) if f not in seen]
        seen.update(flags)
        if flags:
            extra: dict[str, Any] = {"nargs": "?", "const": "true"} if knob.type is bool else {}
            p.add_argument(
                *flags,
                dest="knob_" + knob.name,
                default=None,
                metavar=knob.type.__name__.upper(),
                help=f"{knob.help} ({knob.describe_range()}; default {knob.default if knob.default != '' else 'none'})",
                **extra,
            )
    for flag, (strategy, name) in _strategy_flags().items():
        p.add_argument(
            flag,
            dest=f"spec_{strategy}_{name}",
            default=None,
            metavar="N",
            help=f"llama.cpp's spelling of --{name.replace('_', '-')} for --strategy {strategy}",
        )
    p.add_argument(
        "--adaptive-draft-count",
        action="store_true",
        help="the static-shape runner's spelling of --draft-policy adaptive",
    )
    p.add_argument(
        "--no-align-proposals",
        action="store_true",
        help="do not shorten proposals to fit one micro-batch (--align false)",
    )
    _add_request_options(p)
    add_settings_options(p, gpu_layers=True)


def add_memory_options(p: argparse.ArgumentParser) -> None:
    """``--swa-ring`` and ``--n-rs-seq``: how the target's memory is made (see specviz.backends.memory)."""
    p.add_argument(
        "--swa-ring",
        action="store_true",
        help="give sliding-window layers llama.cpp's ring-sized cache (swa_full=false): less memory; drafts "
        "and rewinds limited to what the ring still holds",
    )
    p.add_argument(
        "--n-rs-seq",
        default=None,
        metavar="N",
        help="recurrent-state snapshots llama.cpp keeps for partial rollback, on the architectures that have "
        "them (default 16; 0: every rollback through a checkpoint)",
    )


def memory_config(args: argparse.Namespace) -> dict[str, Any]:
    """The Session keyword arguments of :func:`add_memory_options` (validated, no model loaded)."""
    n_rs_seq = None if args.n_rs_seq is None else int_option("--n-rs-seq", args.n_rs_seq, 0, 1024)
    return {"swa_full": not args.swa_ring, "n_rs_seq": n_rs_seq}


def _add_request_options(p: argparse.ArgumentParser) -> None:
    """``--chat``, ``--system``, ``--chat-template`` and ``--stop`` for the generation commands."""
    p.add_argument(
        "--chat", action="store_true", help="send the prompt as a user message through the model's own chat template"
    )
    p.add_argument("--system", default=None, help="with --chat: a system message before the user's")
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME",
        help="with --chat or --requests: one of llama.cpp's built-in templates instead of the model's own",
    )
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop string (repeatable): the output ends before it, as plain decoding's would",
    )
    add_grammar_options(p)


def generation_config(args: argparse.Namespace, *, warn: Callable[[str], None]) -> dict[str, Any]:
    """Validate the generation options into keyword arguments for Session.start (no model loaded).

    ``warn`` gets one line for each option accepted but not applied. The steps, in the order their
    refusals come: the strategy, its knobs, the prompt, the request options, then the numbers.
    """
    server = server_config(args, warn=warn, given=_options_server_args_sets(args))
    if server is None:
        strategy, knob_values = _strategy_of(args)
        knobs = _knobs_of(args, strategy, knob_values, warn=warn)
    else:
        strategy, knobs = server.strategy, dict(server.knobs)
        try:
            check_knob_rules(strategy_class(strategy), knobs)
        except KnobError as e:
            raise UsageError(f"option --server-args: {e}") from None
    prompt = _prompt_of(args)
    args.prompt_text = prompt
    try:
        request = _request_config(args)
    except (ValueError, KnobError) as e:
        raise UsageError(str(e).replace("stop:", "option --stop:", 1)) from None
    request.update(grammar_request(args, server))
    default_tokens = server.n_predict if server is not None and server.n_predict else 128
    given_tokens = args.max_tokens if args.max_tokens is not None else str(default_tokens)
    max_tokens = int_option("--max-tokens", given_tokens, 1, 1 << 20)
    sampling = _sampling_options(args, warn=warn, greedy_only=getattr(args, "greedy_only", None))
    if server is not None and not any(v is not None for v in (args.temperature, args.top_k, args.top_p)):
        sampling.update({k: v for k, v in server.sampling.items() if k != "seed"})
    if server is not None:
        settings = server.settings
    else:
        n_ctx = int_option("--n-ctx", args.n_ctx if args.n_ctx is not None else "4096", 16, 1 << 20)
        settings = settings_of(args, n_ctx=n_ctx)
    memory = memory_config(args)
    if server is not None:  # the server's sliding-window cache and prompt layout (its numerics)
        if args.swa_ring and server.swa_full:
            warn("option --swa-ring is accepted but not applied: the --server-args line gives --swa-full")
        memory.update(server.memory_kwargs())
    seed = None if args.seed is None else int_option("--seed", args.seed, 0, 2**63 - 1)
    model = args.model
    if server is not None and server.model is not None:
        if model is not None and Path(model).resolve() != Path(server.model).resolve():
            raise UsageError(f"option --model {model} conflicts with the model of --server-args ({server.model})")
        model = server.model
    if model is not None and not Path(model).exists():
        flag = "--model" if args.model is not None else "--server-args -m"
        raise UsageError(f"option {flag}: {model!r} does not exist; pass the path of a .gguf file")
    check_settings_for(settings, model)
    n_gpu_layers = gpu_layers_of(args, warn=warn, server=server)
    if seed is not None and sampling["temperature"] == 0:
        warn("option --seed is accepted but not applied: greedy decoding draws no random numbers")
    parallel = parallel_config(args, server, strategy)
    memory.update(tree_sequences(knobs, parallel))
    if server is not None and server.chat_template and "chat_template" in request:
        if request["chat_template"] != server.chat_template:
            raise UsageError(
                f"option --chat-template {request['chat_template']} conflicts with the --server-args line's "
                f"--chat-template {server.chat_template}; give one of them"
            )
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "strategy": strategy,
        "knobs": knobs,
        "seed": seed,
        "n_ctx": settings.n_ctx,
        "settings": settings,
        "model": model,
        "n_gpu_layers": n_gpu_layers,
        "memory": memory,
        "sampling": sampling,
        "request": request,
        "server": server,
        "parallel": parallel,
    }


def tree_sequences(knobs: dict[str, Any], parallel: dict[str, Any]) -> dict[str, Any]:
    """The target context's sequences a draft tree needs (``--tree-width N`` opens it with N, one per branch;
    ``--tree-topk`` with as many as its tree can have branches), as
    :class:`~specviz.Session` keyword arguments; a tree in a batched run (``-np``) is refused, its requests
    drafting chains."""
    from ..strategies.knobs import tree_width_of

    width, knob = tree_width_of(knobs)
    if width <= 1:
        return {}
    flag = "--" + knob.replace("_", "-")
    if parallel["n_parallel"] > 1:
        raise UsageError(
            f"option {flag} {knobs[knob]} with -np {parallel['n_parallel']}: a batched run's requests each hold one "
            f"sequence and draft chains; drop -np, or {flag}"
        )
    return {"n_seq_max": width}


def parallel_config(args: argparse.Namespace, server: Any, strategy: str) -> dict[str, Any]:
    """The slots a run has (``-np`` / ``--parallel``, or the ``--server-args`` line's) and whether their
    cache is one unified pool (``-kvu``): ``{"n_parallel": N, "kv_unified": bool}``, checked before any model
    loads. Fewer than one slot is refused with :class:`~specviz.errors.BatchError`'s words; more than one
    needs a strategy that can run batched (:func:`~specviz.decoding.batch.check_batchable`)."""
    from ..backends.sequences import MAX_SEQUENCES
    from ..decoding.batch import check_batchable, check_parallel, parse_schedule
    from ..errors import BatchError

    given = getattr(args, "parallel", None)
    n, unified = 1, bool(getattr(args, "kv_unified", False))
    if server is not None:
        n, unified = server.n_parallel, server.kv_unified
    elif given is not None:
        try:
            n = int(given)
        except ValueError:
            raise UsageError(f"option -np: {given!r} is not allowed; expected an integer of at least 1") from None
        try:
            check_parallel(n)
        except BatchError as e:  # 0 or fewer: the words of BatchRun's own refusal
            raise UsageError(f"option -np: {e}") from None
        if n > MAX_SEQUENCES:
            raise UsageError(f"option -np: {n} is not allowed; llama.cpp holds at most {MAX_SEQUENCES} sequences")
    if n > 1:
        try:
            check_batchable(strategy)
        except BatchError as e:
            raise UsageError(f"option {'--server-args -np' if server is not None else '-np'} {n}: {e}") from None
    out: dict[str, Any] = {"n_parallel": n, "kv_unified": unified}
    schedule = getattr(args, "draft_schedule", None)
    if schedule is not None:
        if n == 1:
            raise UsageError("option --draft-schedule: only with -np N above 1 (it caps drafts by the busy slots)")
        try:
            out["draft_schedule"] = [list(t) for t in parse_schedule(schedule)]
        except BatchError as e:
            raise UsageError(f"option --draft-schedule: {e}") from None
    return out


def _options_server_args_sets(args: argparse.Namespace) -> list[str]:
    """The options given that set what ``--server-args`` sets (strategy, knobs, context settings)."""
    given = [
        flag
        for flag, v in (
            ("--strategy", args.strategy),
            ("--spec-type", args.spec_type),
            ("--prompt-lookup", args.prompt_lookup),
            ("--n-ctx", args.n_ctx),
        )
        if v is not None
    ]
    given += ["-np"] if getattr(args, "parallel", None) is not None else []
    given += ["--kv-unified"] if getattr(args, "kv_unified", False) else []
    given += ["--adaptive-draft-count"] if args.adaptive_draft_count else []
    given += ["--no-align-proposals"] if args.no_align_proposals else []
    for name, knob in _all_knobs().items():
        if getattr(args, "knob_" + name, None) is not None:
            given.append(knob.flag)
    given += [flag for flag, (o, n) in _strategy_flags().items() if getattr(args, f"spec_{o}_{n}", None) is not None]
    given += [SETTING_FLAGS[name][0] for name in given_settings(args)]
    return given


def _strategy_of(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The strategy from ``--strategy`` and its other spellings (``--spec-type``, ``--prompt-lookup``, a
    ``--draft-model`` alone), and the knob value ``--prompt-lookup N`` gives; the static-shape
    runner's ``--adaptive-draft-count`` and ``--no-align-proposals`` become the knob flags they stand for."""
    strategy = None if args.strategy is None else _resolved("--strategy", args.strategy)
    knob_values: dict[str, Any] = {}
    if args.spec_type is not None:
        spec = _resolved("--spec-type", args.spec_type)
        if strategy not in (None, spec):
            raise UsageError(f"option --spec-type {args.spec_type} conflicts with --strategy {args.strategy}; use one")
        strategy = spec
    if args.prompt_lookup is not None:
        if strategy not in (None, "prompt-lookup"):
            raise UsageError(f"option --prompt-lookup conflicts with --strategy {strategy}; use one of them")
        strategy = "prompt-lookup"
        if args.prompt_lookup is not True:
            knob_values["max_ngram"] = args.prompt_lookup
    if args.adaptive_draft_count:
        given = getattr(args, "knob_draft_policy", None)
        if given not in (None, "adaptive"):
            raise UsageError(f"option --adaptive-draft-count conflicts with --draft-policy {given}; use one of them")
        args.knob_draft_policy = "adaptive"
    if args.no_align_proposals:
        given = getattr(args, "knob_align", None)
        if given is not None and str(given).lower() in ("true", "1", "yes", "on"):
            raise UsageError(f"option --no-align-proposals conflicts with --align {given}; use one of them")
        args.knob_align = "false"
    draft_model = getattr(args, "knob_draft_model", None)
    if draft_model is not None:
        if args.prompt_lookup is not None:
            raise UsageError(
                "option --draft-model conflicts with --prompt-lookup: a round drafts with one strategy; use one of them"
            )
        if strategy is None:
            strategy = draft_model_strategy(draft_model) if Path(draft_model).is_file() else "draft"
    return strategy or "prompt-lookup", knob_values


def _resolved(option: str, name: str) -> str:
    """The canonical strategy ``name`` stands for (llama.cpp's spellings, chains); a usage error otherwise."""
    try:
        return resolve_strategy(name)
    except StrategyError as e:
        if "," not in name and not str(e).startswith("unknown"):
            raise UsageError(f"option {option}: {e}") from None
        if str(e).startswith("unknown"):
            names = [n for n in strategy_names() if SPEC_TYPES.get(n, n) == n]
            names += [t for n, t in SPEC_TYPES.items() if t != n]
            msg = f"{name!r} is not allowed; choose one of: {', '.join(sorted(names))}, or a comma list of them"
            if "," in name:
                msg = str(e).replace("unknown strategy", "", 1).strip()
            raise UsageError(f"option {option}: {msg}") from None
        raise UsageError(f"option {option}: {e}") from None


#: The knobs that make a draft a tree: given above 1 to a strategy that cannot branch, a run is refused (a tree
#: silently drafted as a chain would mislead), where other strategies' knobs are only warned about.
TREE_SHAPE_KNOBS = ("tree_width", "tree_topk")


def _knobs_of(
    args: argparse.Namespace, strategy: str, knob_values: dict[str, Any], *, warn: Callable[[str], None]
) -> dict[str, Any]:
    """The strategy's knobs from the knob flags and llama.cpp's per-type spellings, validated and checked
    by the strategy; a flag of another strategy's knob is warned about and dropped."""
    schema = strategy_schema(strategy)
    own = set(schema.names())
    # a chain's members: member -> its knob name -> the chain's (see specviz.strategies.chain)
    members = member_knob_names(strategy)
    all_knobs = _all_knobs()
    for name in all_knobs:
        v = getattr(args, "knob_" + name, None)
        if v is None:
            continue
        if name in own:
            knob_values[name] = v
            continue
        per_member = [m for m, names in members.items() if names.get(name, name) != name]
        if per_member:
            flags = " / ".join(
                f
                for f, (owner, k) in _strategy_flags().items()
                if owner in per_member and k == name and f.startswith("--spec-")
            )
            raise UsageError(
                f"option {all_knobs[name].flag}: the chain's {' and '.join(per_member)} each have a {name!r}; "
                f"set each with {flags}"
            )
        if name in TREE_SHAPE_KNOBS and str(v) not in ("1", "1.0"):
            able = ", ".join(n for n in strategy_names() if name in strategy_schema(n).names())
            raise UsageError(
                f"option {all_knobs[name].flag} {v}: strategy {strategy!r} cannot draft a tree; the strategies that "
                f"can: {able}"
            )
        warn(f"option {all_knobs[name].flag} is accepted but not applied: strategy {strategy!r} has no knob {name!r}")
    for flag, (owner, name) in _strategy_flags().items():
        v = getattr(args, f"spec_{owner}_{name}", None)
        if v is None:
            continue
        target = members.get(owner, {}).get(name)
        if target is None:
            warn(f"option {flag} is accepted but not applied: it is for strategy {owner!r}, not {strategy!r}")
        elif target in knob_values and str(knob_values[target]) != str(v):
            raise UsageError(
                f"option {flag} {v} conflicts with --{target.replace('_', '-')} {knob_values[target]}; use one of them"
            )
        else:
            knob_values[target] = v
    by_name = {k.name: k for k in schema.knobs}
    try:
        knobs = schema.validate(knob_values)
        check_knob_rules(strategy_class(strategy), knobs)
        check_cross_knobs(knobs)
    except KnobError as e:
        knob = by_name.get(e.knob or "")
        flag = "/".join((knob.flag,) + knob.aliases) if knob else f"--{(e.knob or '').replace('_', '-')}"
        if e.knob == "max_ngram" and args.prompt_lookup not in (None, True):
            flag = "--prompt-lookup"
        msg = str(e).replace(f"knob {e.knob!r}", f"option {flag}", 1)
        raise UsageError(msg) from None
    return knobs


def _prompt_of(args: argparse.Namespace) -> str:
    """The prompt text, from ``--prompt`` or ``--prompt-file``; refused when missing or empty. With
    ``--requests`` (a request log: the prompts are its requests) there is none, and neither may be given."""
    if getattr(args, "requests", None) is not None:
        for flag, v in (("--prompt", args.prompt), ("--prompt-file", args.prompt_file), ("--chat", args.chat or None)):
            if v is not None:
                raise UsageError(f"option {flag} conflicts with --requests, whose requests are the prompts; use one")
        return ""
    if args.prompt is None and args.prompt_file is None:
        raise UsageError("one of --prompt TEXT or --prompt-file PATH is required")
    if args.prompt_file is not None:
        pf = Path(args.prompt_file)
        if not pf.is_file():
            raise UsageError(f"option --prompt-file: {args.prompt_file!r} is not a readable file")
        prompt = pf.read_text(encoding="utf-8")
    else:
        prompt = args.prompt
    if not prompt:
        raise UsageError("option --prompt: the prompt is empty; give some text")
    return prompt


def _sampling_options(args: argparse.Namespace, *, warn, greedy_only: str | None) -> dict[str, Any]:
    """Validate --temperature/--top-k/--top-p against --greedy and greedy-only commands."""
    from ..decoding.sampling import SamplingParams

    given = {
        k: v
        for k, v in (("--temperature", args.temperature), ("--top-k", args.top_k), ("--top-p", args.top_p))
        if v is not None
    }
    blocker = "--greedy" if args.greedy else greedy_only
    if blocker:
        for flag, v in given.items():
            if flag == "--temperature" and _is_zero(v):
                continue
            raise UsageError(f"option {flag} {v} conflicts with {blocker}, which decodes greedily; drop one of them")
    values: dict[str, Any] = {}
    for flag, key, conv in (
        ("--temperature", "temperature", float),
        ("--top-k", "top_k", int),
        ("--top-p", "top_p", float),
    ):
        v = given.get(flag)
        if v is None:
            continue
        try:
            values[key] = conv(v)
        except ValueError:
            raise UsageError(
                f"option {flag}: {v!r} is not allowed; expected {'an integer' if conv is int else 'a number'}"
            ) from None
    try:
        params = SamplingParams(**values)
    except KnobError as e:
        raise UsageError(str(e).replace(f"{e.knob}=", f"option --{str(e.knob).replace('_', '-')} ", 1)) from None
    if params.greedy:
        for flag in ("--top-k", "--top-p"):
            if flag in given:
                warn(f"option {flag} is accepted but not applied: it shapes sampling, and --temperature is 0 (greedy)")
    return params.to_dict()


def _is_zero(v: str) -> bool:
    try:
        return float(v) == 0.0
    except ValueError:
        return False


def _request_config(args: argparse.Namespace) -> dict[str, Any]:
    """The start() arguments of the request options, checked without a model (raises ValueError)."""
    from ..decoding.stops import check_stops

    out: dict[str, Any] = {}
    if args.stop:
        out["stop"] = list(check_stops(args.stop))
    if args.chat:
        msgs = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt_text}
        ]
        out["messages"] = msgs
        if args.chat_template:
            out["chat_template"] = args.chat_template
    elif args.system:
        raise ValueError("option --system: only with --chat (a logged request carries its own system message)")
    elif getattr(args, "requests", None) is not None and args.chat_template:
        from ..decoding.chat import builtin_templates

        names = builtin_templates()
        if args.chat_template not in names:  # refused once here, not by every request
            raise ValueError(
                f"option --chat-template: {args.chat_template!r} is not one of llama.cpp's built-in templates; "
                f"choose one of: {', '.join(names)}"
            )
        out["chat_template"] = args.chat_template  # every logged request is a chat: its messages take it
    elif args.chat_template:
        raise ValueError("option --chat-template: only with --chat or --requests")
    return out
