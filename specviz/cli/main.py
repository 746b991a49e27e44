"""The ``specviz`` command.

Subcommands: ``run`` (one generation, text or ``--json``), ``verify`` (plain greedy vs speculative greedy,
with a verdict), ``strategies`` (every strategy and its knobs). Every option is validated before any
model loads; a bad one exits with status 2 and one line naming the option, the value and what is
allowed. Knob flags are generated from the strategies' schemas.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

from ..decoding.knob_schema import SESSION_KNOBS, Knob, check_cross_knobs
from ..errors import KnobError, SpecvizError
from ..strategies import strategy_class, strategy_names, strategy_schema
from .workbench import OptionError, add_request_options, request_config
from .workbench import add_commands as _add_workbench_commands


class UsageError(Exception):
    """A command-line option was refused (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump, status 2
        raise UsageError(message)


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
    return strategy != "draft" and alias.startswith(f"--spec-{strategy}-")


def _strategy_flags() -> dict[str, tuple[str, str]]:
    """llama.cpp's per-type spellings (``--spec-ngram-map-k-size-n`` …): flag -> (strategy, knob)."""
    out: dict[str, tuple[str, str]] = {}
    for name in strategy_names():
        for k in strategy_class(name).knobs:
            for alias in k.aliases:
                if _per_type(alias, name):
                    out[alias] = (name, k.name)
    return out


def _general_flags(knob: Knob) -> list[str]:
    """A knob's flag and every alias of any declaration of it that is not tied to one strategy."""
    flags = [knob.flag]
    for name in strategy_names():
        for k in (*SESSION_KNOBS, *strategy_class(name).knobs):
            if k.name == knob.name:
                flags += [a for a in k.aliases if not _per_type(a, name) and a not in flags]
    return flags


#: llama.cpp's ``--spec-type`` names for the strategies whose specviz name differs.
SPEC_TYPES = {"draft-simple": "draft", "draft-eagle3": "eagle3", "draft-mtp": "mtp"}


def _add_generation_options(p: argparse.ArgumentParser, *, strategy_default: str | None) -> None:
    p.add_argument("--model", help="target GGUF path (default: the embedded Gemma 3 270M)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="read the prompt from this file")
    p.add_argument("--max-tokens", default="128", help="tokens to generate (default 128)")
    p.add_argument("--strategy", default=strategy_default, help="one of: " + ", ".join(strategy_names()))
    p.add_argument("--seed", default=None, help="seed for the sampling generator")
    p.add_argument("--temperature", default=None, help="sampling temperature (default 0: greedy, exact)")
    p.add_argument("--top-k", default=None, help="sample among the k most likely tokens (0: off)")
    p.add_argument("--top-p", default=None, help="sample from the smallest set holding this mass (1: off)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding only (the default); refuses sampling options")
    p.add_argument("--n-ctx", default="4096", help="context length (default 4096)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--prompt-lookup",
        nargs="?",
        const=True,
        default=None,
        metavar="MAX_NGRAM",
        help="use prompt lookup (the runner's spelling); optional largest n-gram size",
    )
    p.add_argument(
        "--spec-type",
        default=None,
        metavar="TYPE",
        help="llama.cpp's spelling of --strategy (draft-simple, draft-eagle3, draft-mtp, ngram-* ...)",
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
                help=f"{knob.help} ({knob.describe_range()}; default {knob.default})",
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
        "--adaptive-draft-count", action="store_true", help="the runner's spelling of --draft-policy adaptive"
    )
    p.add_argument(
        "--no-align-proposals",
        action="store_true",
        help="do not shorten proposals to fit one micro-batch (--align false)",
    )
    add_request_options(p)


def _int_option(flag: str, value: str, lo: int, hi: int | None = None) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        v = None
    if v is None or v < lo or (hi is not None and v > hi):
        rng = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        raise UsageError(f"option {flag}: {value!r} is not allowed; expected {rng}")
    return v


def _draft_model_strategy(path: str) -> str:
    """``eagle3`` for an EAGLE-3 head, else ``draft`` (read from the file's architecture, no model loaded)."""
    from ..backends.gguf_check import check_gguf
    from ..errors import ModelError

    try:
        return "eagle3" if check_gguf(path).architecture == "eagle3" else "draft"
    except ModelError:
        return "draft"  # the draft strategy's own check reports the file


def _generation_config(args: argparse.Namespace, *, warn) -> dict[str, Any]:
    """Validate the generation options into keyword arguments for Session.start (no model loaded)."""
    strategy = args.strategy
    knob_values: dict[str, Any] = {}
    if args.spec_type is not None:
        spec = SPEC_TYPES.get(args.spec_type, args.spec_type)
        if "," in args.spec_type:
            raise UsageError(
                f"option --spec-type: {args.spec_type!r} names several types; specviz drafts with one "
                "strategy per round: give one"
            )
        if spec not in strategy_names():
            names = [n for n in strategy_names() if n not in SPEC_TYPES.values()]
            names += [t for t, n in SPEC_TYPES.items() if n in strategy_names()]
            raise UsageError(
                f"option --spec-type: {args.spec_type!r} is not allowed; choose one of: {', '.join(sorted(names))}"
            )
        if strategy not in (None, spec):
            raise UsageError(f"option --spec-type {args.spec_type} conflicts with --strategy {strategy}; use one")
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
            strategy = _draft_model_strategy(draft_model) if Path(draft_model).is_file() else "draft"
    strategy = strategy or "prompt-lookup"
    if strategy not in strategy_names():
        raise UsageError(
            f"option --strategy: {strategy!r} is not allowed; choose one of: {', '.join(strategy_names())}"
        )
    schema = strategy_schema(strategy)
    own = set(schema.names())
    all_knobs = _all_knobs()
    for name in all_knobs:
        v = getattr(args, "knob_" + name, None)
        if v is None:
            continue
        if name in own:
            knob_values[name] = v
        else:
            warn(
                f"option {all_knobs[name].flag} is accepted but not applied: strategy {strategy!r} has no knob {name!r}"
            )
    for flag, (owner, name) in _strategy_flags().items():
        v = getattr(args, f"spec_{owner}_{name}", None)
        if v is None:
            continue
        if owner != strategy:
            warn(f"option {flag} is accepted but not applied: it is for strategy {owner!r}, not {strategy!r}")
        elif name in knob_values and str(knob_values[name]) != str(v):
            raise UsageError(
                f"option {flag} {v} conflicts with --{name.replace('_', '-')} {knob_values[name]}; use one of them"
            )
        else:
            knob_values[name] = v
    by_name = {k.name: k for k in schema.knobs}
    try:
        knobs = schema.validate(knob_values)
        strategy_class(strategy).check(knobs)
        check_cross_knobs(knobs)
    except KnobError as e:
        knob = by_name.get(e.knob or "")
        flag = "/".join((knob.flag,) + knob.aliases) if knob else f"--{(e.knob or '').replace('_', '-')}"
        if e.knob == "max_ngram" and args.prompt_lookup not in (None, True):
            flag = "--prompt-lookup"
        msg = str(e).replace(f"knob {e.knob!r}", f"option {flag}", 1)
        raise UsageError(msg) from None
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
    args.prompt_text = prompt
    try:
        request = request_config(args)
    except (ValueError, KnobError) as e:
        raise UsageError(str(e).replace("stop:", "option --stop:", 1)) from None
    max_tokens = _int_option("--max-tokens", args.max_tokens, 1, 1 << 20)
    sampling = _sampling_options(args, warn=warn, greedy_only=getattr(args, "greedy_only", None))
    n_ctx = _int_option("--n-ctx", args.n_ctx, 16, 1 << 20)
    seed = None if args.seed is None else _int_option("--seed", args.seed, 0, 2**63 - 1)
    if args.model is not None and not Path(args.model).exists():
        raise UsageError(f"option --model: {args.model!r} does not exist; pass the path of a .gguf file")
    if seed is not None and sampling["temperature"] == 0:
        warn("option --seed is accepted but not applied: greedy decoding draws no random numbers")
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "strategy": strategy,
        "knobs": knobs,
        "seed": seed,
        "n_ctx": n_ctx,
        "model": args.model,
        "sampling": sampling,
        "request": request,
    }


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


def _warn(msg: str) -> None:
    print(f"specviz: warning: {msg}", file=sys.stderr)


def _result(session, cfg: dict[str, Any]) -> dict[str, Any]:
    tel = session.telemetry_dict()
    return {
        "tokens": session.tokens,
        "text": session.text,
        "finish_reason": session.finished,
        "strategy": session.strategy,
        "knobs": session.knobs,
        "prompt_tokens": session.n_prompt,
        "sampling": session.sampling.to_dict(),
        "seed": session.seed if not session.sampling.greedy else None,
        "model": str(session.model.path),
        "telemetry": tel,
    }


def cmd_run(args: argparse.Namespace) -> int:
    """``specviz run``: one generation; prints the text and a telemetry line, or one JSON object."""
    cfg = _generation_config(args, warn=_warn)
    if args.record is not None and not Path(args.record).resolve().parent.is_dir():
        raise UsageError(f"option --record: folder of {args.record!r} does not exist")
    from ..decoding.recorder import Recorder
    from ..decoding.session import Session

    s = Session(cfg["model"], n_ctx=cfg["n_ctx"])
    recorder = Recorder(args.record) if args.record else None
    if recorder is not None:
        s.subscribe(recorder)
    req = cfg["request"]
    prompt = None if "messages" in req else cfg["prompt"]
    s.start(prompt, cfg["max_tokens"], cfg["strategy"], seed=cfg["seed"], **cfg["sampling"], **req, **cfg["knobs"])
    s.run()
    if recorder is not None:
        recorder.close()
    res = _result(s, cfg)
    if args.json:
        from .workbench import run_extras

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
        st = t.get("strategy_stats") or {}
        if st and res["strategy"] != "none":
            print(
                f"statistics {res['strategy']}: #calls = {st['calls']}, #gen drafts = {st['drafts_generated']}, "
                f"#acc drafts = {st['drafts_accepted']}, #gen tokens = {st['tokens_generated']}, "
                f"#acc tokens = {st['tokens_accepted']}, dur(b,g,a) = {st['begin_seconds'] * 1e3:.3f}, "
                f"{st['draft_seconds'] * 1e3:.3f}, {st['accept_seconds'] * 1e3:.3f} ms",
                file=sys.stderr,
            )
    s.close()
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """``specviz verify``: plain greedy vs speculative greedy on one prompt, with a verdict."""
    cfg = _generation_config(args, warn=_warn)
    if cfg["request"]:
        raise UsageError("specviz verify compares plain text prompts: --chat and --stop are for specviz run")
    try:
        threshold = float(args.threshold)
        if not threshold > 0:
            raise ValueError
    except ValueError:
        raise UsageError(f"option --threshold: {args.threshold!r} is not allowed; expected a number > 0") from None
    from ..analysis.equivalence import check_equivalence
    from ..decoding.session import Session

    s = Session(cfg["model"], n_ctx=cfg["n_ctx"])
    res = check_equivalence(s, cfg["prompt"], cfg["max_tokens"], cfg["strategy"], cfg["knobs"], threshold)
    s.close()
    if args.json:
        print(json.dumps(res, ensure_ascii=False))
    else:
        if res["verdict"] == "identical":
            print(f"identical: {res['plain_tokens']} tokens, plain and {res['strategy']} agree")
        else:
            d = res["divergence"]
            print(
                f"{res['verdict']}: first divergence at generated token {d['index']}: plain "
                f"{d['plain_piece']!r} vs speculative {d['speculative_piece']!r}; top-two margin "
                f"{d['plain_margin']} (plain) / {d['speculative_margin']} (speculative), threshold {threshold}"
            )
    return 0 if res["verdict"] != "mismatch" else 1


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


def cmd_bench(args: argparse.Namespace) -> int:
    """``specviz bench``: every strategy on every workload kind, one table of medians (:mod:`specviz.analysis.bench`).

    ``--draft-model`` adds a row per model: the ``eagle3`` strategy for an EAGLE-3 head, ``draft`` for a whole
    model; with a head, the draftless strategies and a draft derived from the target (``--derived-draft``,
    default: every layer but the last) are run beside it and compared with it per workload kind.
    """
    from ..analysis.workloads import WORKLOADS

    names = [n for n in strategy_names() if not strategy_class(n).needs_model]  # model-backed ones need a model
    model_backed = [n for n in strategy_names() if strategy_class(n).needs_model]
    given = [("--strategies", args.strategies)] if args.strategies else []
    given += [("--strategy", v) for v in args.strategy or []]
    flag_of = {x.strip(): flag for flag, v in given for x in v.split(",") if x.strip()}
    asked = list(flag_of)
    for st in asked:
        if st not in names and st not in model_backed:
            raise UsageError(
                f"option {flag_of[st]}: {st!r} is not allowed; choose among: {', '.join(names + model_backed)}"
            )
    drafts = [str(d) for d in (args.draft_model or [])]
    for d in drafts:
        if not Path(d).is_file():
            raise UsageError(f"option --draft-model: {d!r} does not exist; pass the path of a .gguf file")
    kinds_of = {d: _draft_model_strategy(d) for d in drafts}
    for st in asked:
        if st in model_backed and st not in kinds_of.values():
            need = "an EAGLE-3 head" if st == "eagle3" else "a draft GGUF"
            raise UsageError(f"option {flag_of[st]}: {st!r} needs {need}; pass --draft-model PATH")
    derived = [x for v in (args.derived_draft or []) for x in [v.strip()] if x]
    from ..models.derive import parse_layers

    for spec in derived:
        if spec != "none":
            try:
                parse_layers(spec)
            except KnobError as e:
                raise UsageError(str(e).replace("--keep-layers", "--derived-draft", 1)) from None
    kinds = [x.strip() for x in args.kinds.split(",")] if args.kinds else list(WORKLOADS)
    for k in kinds:
        if k not in WORKLOADS:
            raise UsageError(f"option --kinds: {k!r} is not allowed; choose among: {', '.join(WORKLOADS)}")
    repeats = _int_option("--repeats", args.repeats, 1, 100)
    max_tokens = _int_option("--max-tokens", args.max_tokens, 1, 1 << 16)
    common: dict[str, Any] = {}
    try:
        common = strategy_schema("prompt-lookup").validate(
            {k: v for k, v in (("draft_policy", args.draft_policy), ("draft_max", args.draft_max)) if v is not None}
        )
        common = {k: common[k] for k in ("draft_policy", "draft_max", "draft_min", "align", "verify_tile")}
    except KnobError as e:
        raise UsageError(
            str(e)
            .replace("knob ", "option --", 1)
            .replace("'draft_policy'", "draft-policy")
            .replace("'draft_max'", "draft-max")
        ) from None
    model_knobs: dict[str, Any] = {}
    if args.draft_p_min is not None:
        try:
            model_knobs = strategy_schema("eagle3").validate({"draft_p_min": args.draft_p_min, "draft_model": "x"})
            model_knobs = {"draft_p_min": model_knobs["draft_p_min"]}
        except KnobError as e:
            raise UsageError(str(e).replace("knob 'draft_p_min'", "option --draft-p-min", 1)) from None
    if args.model is not None and not Path(args.model).exists():
        raise UsageError(f"option --model: {args.model!r} does not exist; pass the path of a .gguf file")
    from ..analysis.bench import (
        BenchSetting,
        default_settings,
        derived_draft,
        format_comparison,
        format_per_prompt,
        format_positions,
        format_table,
        run_bench,
    )
    from ..decoding.session import Session

    draftless = [st for st in asked if st in names]
    if drafts and not draftless:
        draftless = names  # a model row is compared with every draftless strategy
    settings = default_settings(draftless or None, common=common)
    heads = [d for d in drafts if kinds_of[d] == "eagle3"]
    if heads and not derived:
        derived = ["default"]
    s = Session(args.model, n_ctx=4096)
    for spec in derived:
        if spec == "none":
            continue
        if spec == "default":
            spec = f"0-{s.model.n_layer - 2}" if s.model.n_layer >= 2 else "0"
        try:
            path = derived_draft(s.model.path, spec)
        except KnobError as e:
            s.close()
            raise UsageError(str(e).replace("--keep-layers", "--derived-draft", 1)) from None
        drafts.append(str(path))
        kinds_of[str(path)] = "draft"
    for d in drafts:
        st = kinds_of[d]
        settings.append(BenchSetting(f"{st} {Path(d).name}", st, {**common, **model_knobs, "draft_model": d}))
    rows = run_bench(
        s,
        kinds=kinds,
        repeats=repeats,
        max_tokens=max_tokens,
        settings=settings,
        progress=(lambda m: print(m, file=sys.stderr)) if not args.json else None,
    )
    s.close()
    subject = next((x.label for x in settings if x.strategy == "eagle3"), None)
    subject = subject or next((x.label for x in settings if x.strategy in model_backed), None)
    if args.json:
        print(
            json.dumps(
                {"max_tokens": max_tokens, "repeats": repeats, "common": common, "rows": [r.to_dict() for r in rows]}
            )
        )
    else:
        print(f"specviz bench — model {s.model.path.name}, {max_tokens} tokens, {repeats} repeats, knobs {common}")
        print(
            "each figure: per prompt the median over repeats, then the median over prompts; speedup: each run "
            "over the none run just before it; total-time speedup: all runs pooled"
        )
        print(format_table(rows))
        print()
        print("acceptance by draft position (accepted at depth i over drafts reaching it, pooled over runs):")
        print(format_positions(rows))
        if subject is not None:
            print()
            print("tokens/s compared (paired speedups, medians over prompts):")
            print(format_comparison(rows, subject))
        print()
        print("speedup vs none per prompt (median over repeats):")
        print(format_per_prompt(rows))
    return 0


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


def cmd_serve(args: argparse.Namespace) -> int:
    """``specviz serve``: the Panel inspector on the embedded model (or ``--model``)."""
    port = _int_option("--port", args.port, 1, 65535)
    max_tokens = _int_option("--max-tokens", args.max_tokens, 1, 1 << 20)
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
    from ..server.app import serve

    kwargs = {"prompt": args.prompt} if args.prompt else {}
    serve(
        port,
        args.model,
        address=args.address,
        max_tokens=max_tokens,
        strategy=strategy,
        draft_models=args.draft_model or (),
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
    return {
        "shared": bool(args.shared),
        "token": _token_option("--token", args.token),
        "presenter_token": _token_option("--presenter-token", args.presenter_token),
        "max_sessions": _int_option("--max-sessions", args.max_sessions, 1, 256),
        "max_viewers": _int_option("--max-viewers", args.max_viewers, 1, 10000),
        "idle_timeout": idle,
    }


def cmd_replay(args: argparse.Namespace) -> int:
    """``specviz replay FILE.jsonl``: show a recorded session in the inspector, no model loaded."""
    port = _int_option("--port", args.port, 1, 65535)
    if not Path(args.file).is_file():
        raise UsageError(f"argument FILE: {args.file!r} does not exist; pass a .jsonl recording")
    token = _token_option("--token", args.token)
    from ..server.app import replay

    replay(args.file, port, address=args.address, token=token)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """``specviz info [MODEL] [--draft-model D]``: the model's facts and which strategies it can run."""
    for flag, p in (("argument MODEL", args.model), ("option --draft-model", args.draft_model)):
        if p is not None and not Path(p).is_file():
            raise UsageError(f"{flag}: {p!r} does not exist; pass the path of a .gguf file")
    from ..models.info import model_info

    info = model_info(args.model, args.draft_model)
    print(json.dumps(info.to_dict()) if args.json else info.format())
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``specviz`` command."""
    p = _Parser(prog="specviz", description="See speculative decoding happen (llama.cpp).")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    r = sub.add_parser("run", help="generate once and print the text and telemetry")
    _add_generation_options(r, strategy_default=None)
    r.add_argument("--record", default=None, metavar="FILE.jsonl", help="record every event as JSON Lines")
    r.set_defaults(func=cmd_run)
    v = sub.add_parser("verify", help="compare plain greedy and speculative greedy output")
    _add_generation_options(v, strategy_default=None)
    v.add_argument("--threshold", default="0.5", help="margin below which a divergence counts as numerics")
    v.set_defaults(func=cmd_verify, greedy_only="specviz verify")
    b = sub.add_parser("bench", help="benchmark every strategy on every workload kind")
    b.add_argument("--model", help="target GGUF path (default: the embedded Gemma 3 270M)")
    b.add_argument("--strategies", help="comma-separated strategy names (default: all draftless)")
    b.add_argument(
        "--strategy",
        action="append",
        metavar="NAME",
        help="a strategy to run (repeatable; eagle3 and draft need --draft-model)",
    )
    b.add_argument(
        "--draft-model",
        "-md",
        "--spec-draft-model",
        action="append",
        metavar="PATH",
        help="an EAGLE-3 head or a draft GGUF: one row each (repeatable)",
    )
    b.add_argument(
        "--derived-draft",
        action="append",
        metavar="LAYERS",
        help="also run a draft derived from the target keeping LAYERS, e.g. 0-16 (repeatable; "
        "with an EAGLE-3 head the default is every layer but the last; 'none' for none)",
    )
    b.add_argument("--draft-p-min", default=None, help="draft_p_min of the model-backed rows")
    b.add_argument("--kinds", help="comma-separated workload kinds (default: all)")
    b.add_argument("--repeats", default="3")
    b.add_argument("--max-tokens", default="128")
    b.add_argument("--draft-policy", default=None, help="fixed, adaptive or cost")
    b.add_argument("--draft-max", default=None)
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bench)
    d = sub.add_parser("derive-draft", help="write a draft GGUF keeping a subset of the target's layers")
    d.add_argument("target", metavar="TARGET", help="the target GGUF")
    d.add_argument("--keep-layers", required=True, help="layers to keep, e.g. 0-5,12-17")
    d.add_argument("-o", "--output", required=True, help="the draft GGUF to write")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_derive_draft)
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
    sv.set_defaults(func=cmd_serve)
    rp = sub.add_parser("replay", help="show a recorded .jsonl session, without a model")
    rp.add_argument("file", metavar="FILE")
    rp.add_argument("--port", default="5006")
    rp.add_argument("--address", default="127.0.0.1")
    rp.add_argument("--token", default=None, help="the access token (default: as for serve)")
    rp.set_defaults(func=cmd_replay)
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
        help="a draft GGUF or an EAGLE-3 head to check with the model",
    )
    inf.add_argument("--json", action="store_true")
    inf.set_defaults(func=cmd_info)
    s = sub.add_parser("strategies", help="list strategies and their knobs")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_strategies)
    for extra in _EXTRA_COMMANDS:
        extra(sub)
    return p


#: Functions adding further subcommands to the parser (the workbench's diagnose and advise).
_EXTRA_COMMANDS: list = [_add_workbench_commands]


def _add_sweep_commands(sub) -> None:
    """``sweep`` and ``report`` (:mod:`specviz.cli.sweep`), imported when the parser is built."""
    from .sweep import add_commands

    add_commands(sub)


_EXTRA_COMMANDS.append(_add_sweep_commands)


def _add_train_commands(sub) -> None:
    """``train-eagle3`` (:mod:`specviz.cli.train`; training itself needs the ``train`` extra)."""
    from .train import add_commands

    add_commands(sub)


_EXTRA_COMMANDS.append(_add_train_commands)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specviz`` console script."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except (UsageError, OptionError) as e:
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
