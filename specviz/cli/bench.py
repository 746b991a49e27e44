"""``specviz bench``: every strategy on every workload kind, one table of medians (:mod:`specviz.analysis.bench`).

``--draft-model`` adds a row per model: the ``eagle3`` strategy for an EAGLE-3 head, ``draft`` for a whole
model; with a head, the draftless strategies and a draft derived from the target (``--derived-draft``,
default: every layer but the last) are run beside it and compared with it per workload kind.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import KnobError
from ..strategies import draft_model_strategy, strategy_class, strategy_names, strategy_schema
from .options import UsageError, int_option


def add_commands(sub: Any) -> None:
    """Add ``bench`` to the ``specviz`` subcommands."""
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


@dataclass
class _BenchPlan:
    """The checked options of one ``specviz bench`` (nothing loaded yet)."""

    draftless: list[str]  # every draftless strategy
    model_backed: list[str]  # every strategy that needs a model file
    asked: list[str]  # the strategies named by --strategies / --strategy
    drafts: list[str]  # the --draft-model files
    kinds_of: dict[str, str]  # draft file -> its strategy (eagle3 or draft)
    derived: list[str]  # --derived-draft layer specs
    kinds: list[str]  # workload kinds
    repeats: int
    max_tokens: int
    common: dict[str, Any]  # the draft-length knobs every row shares
    model_knobs: dict[str, Any]  # draft_p_min of the model-backed rows


def cmd_bench(args: argparse.Namespace) -> int:
    """``specviz bench``: check the options, run every setting on every workload kind, print the tables."""
    plan = _plan(args)
    from ..analysis.bench import run_bench
    from ..decoding.session import Session

    s = Session(args.model, n_ctx=4096)
    settings = _settings(plan, s)
    rows = run_bench(
        s,
        kinds=plan.kinds,
        repeats=plan.repeats,
        max_tokens=plan.max_tokens,
        settings=settings,
        progress=(lambda m: print(m, file=sys.stderr)) if not args.json else None,
    )
    s.close()
    if args.json:
        print(
            json.dumps(
                {
                    "max_tokens": plan.max_tokens,
                    "repeats": plan.repeats,
                    "common": plan.common,
                    "rows": [r.to_dict() for r in rows],
                }
            )
        )
    else:
        _print_tables(plan, s.model.path.name, rows, _subject(settings, plan.model_backed))
    return 0


def _plan(args: argparse.Namespace) -> _BenchPlan:
    """Every option of ``specviz bench``, checked in order, without loading a model."""
    draftless = [n for n in strategy_names() if not strategy_class(n).needs_model]  # the others need a model
    model_backed = [n for n in strategy_names() if strategy_class(n).needs_model]
    asked, flag_of = _asked_strategies(args, draftless + model_backed)
    drafts = [str(d) for d in (args.draft_model or [])]
    for d in drafts:
        if not Path(d).is_file():
            raise UsageError(f"option --draft-model: {d!r} does not exist; pass the path of a .gguf file")
    kinds_of = {d: draft_model_strategy(d) for d in drafts}
    for st in asked:
        if st in model_backed and st not in kinds_of.values():
            need = "an EAGLE-3 head" if st == "eagle3" else "a draft GGUF"
            raise UsageError(f"option {flag_of[st]}: {st!r} needs {need}; pass --draft-model PATH")
    derived = _derived_specs(args)
    kinds = _workload_kinds(args)
    repeats = int_option("--repeats", args.repeats, 1, 100)
    max_tokens = int_option("--max-tokens", args.max_tokens, 1, 1 << 16)
    common = _common_knobs(args)
    model_knobs = _model_knobs(args)
    if args.model is not None and not Path(args.model).exists():
        raise UsageError(f"option --model: {args.model!r} does not exist; pass the path of a .gguf file")
    return _BenchPlan(
        draftless, model_backed, asked, drafts, kinds_of, derived, kinds, repeats, max_tokens, common, model_knobs
    )


def _asked_strategies(args: argparse.Namespace, allowed: list[str]) -> tuple[list[str], dict[str, str]]:
    """The strategies named by ``--strategies`` and ``--strategy`` (in order, each once) and the flag that
    named each."""
    given = [("--strategies", args.strategies)] if args.strategies else []
    given += [("--strategy", v) for v in args.strategy or []]
    flag_of = {x.strip(): flag for flag, v in given for x in v.split(",") if x.strip()}
    asked = list(flag_of)
    for st in asked:
        if st not in allowed:
            raise UsageError(f"option {flag_of[st]}: {st!r} is not allowed; choose among: {', '.join(allowed)}")
    return asked, flag_of


def _derived_specs(args: argparse.Namespace) -> list[str]:
    """The ``--derived-draft`` layer specs, their syntax checked (``none``: no derived draft)."""
    derived = [x for v in (args.derived_draft or []) for x in [v.strip()] if x]
    from ..models.derive import parse_layers

    for spec in derived:
        if spec != "none":
            try:
                parse_layers(spec)
            except KnobError as e:
                raise UsageError(str(e).replace("--keep-layers", "--derived-draft", 1)) from None
    return derived


def _workload_kinds(args: argparse.Namespace) -> list[str]:
    """The ``--kinds`` workload kinds (default: every kind)."""
    from ..analysis.workloads import WORKLOADS

    kinds = [x.strip() for x in args.kinds.split(",")] if args.kinds else list(WORKLOADS)
    for k in kinds:
        if k not in WORKLOADS:
            raise UsageError(f"option --kinds: {k!r} is not allowed; choose among: {', '.join(WORKLOADS)}")
    return kinds


def _common_knobs(args: argparse.Namespace) -> dict[str, Any]:
    """The draft-length knobs every row shares (``--draft-policy``, ``--draft-max``, the rest at defaults)."""
    try:
        common = strategy_schema("prompt-lookup").validate(
            {k: v for k, v in (("draft_policy", args.draft_policy), ("draft_max", args.draft_max)) if v is not None}
        )
    except KnobError as e:
        raise UsageError(
            str(e)
            .replace("knob ", "option --", 1)
            .replace("'draft_policy'", "draft-policy")
            .replace("'draft_max'", "draft-max")
        ) from None
    return {k: common[k] for k in ("draft_policy", "draft_max", "draft_min", "align", "verify_tile")}


def _model_knobs(args: argparse.Namespace) -> dict[str, Any]:
    """``--draft-p-min`` for the model-backed rows (none given: their default)."""
    if args.draft_p_min is None:
        return {}
    try:
        knobs = strategy_schema("eagle3").validate({"draft_p_min": args.draft_p_min, "draft_model": "x"})
    except KnobError as e:
        raise UsageError(str(e).replace("knob 'draft_p_min'", "option --draft-p-min", 1)) from None
    return {"draft_p_min": knobs["draft_p_min"]}


def _settings(plan: _BenchPlan, s: Any) -> list[Any]:
    """The rows to run: the draftless strategies, then one per draft model, derived drafts included (each
    written from the target the session holds; a layer it does not have closes the session and is refused)."""
    from ..analysis.bench import BenchSetting, default_settings, derived_draft

    drafts, kinds_of = list(plan.drafts), dict(plan.kinds_of)
    draftless = [st for st in plan.asked if st in plan.draftless]
    if drafts and not draftless:
        draftless = plan.draftless  # a model row is compared with every draftless strategy
    settings = default_settings(draftless or None, common=plan.common)
    derived = plan.derived
    if any(kinds_of[d] == "eagle3" for d in drafts) and not derived:
        derived = ["default"]
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
        settings.append(BenchSetting(f"{st} {Path(d).name}", st, {**plan.common, **plan.model_knobs, "draft_model": d}))
    return settings


def _subject(settings: list[Any], model_backed: list[str]) -> str | None:
    """The row the others are compared with: the EAGLE-3 head's, else the first model-backed one's."""
    subject = next((x.label for x in settings if x.strategy == "eagle3"), None)
    return subject or next((x.label for x in settings if x.strategy in model_backed), None)


def _print_tables(plan: _BenchPlan, model_name: str, rows: list[Any], subject: str | None) -> None:
    """The text report: the table of medians, acceptance by position, the comparison, per-prompt speedups."""
    from ..analysis.bench import format_comparison, format_memory, format_per_prompt, format_positions, format_table

    print(f"specviz bench — model {model_name}, {plan.max_tokens} tokens, {plan.repeats} repeats, knobs {plan.common}")
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
    print()
    print("memory (the largest over each row's runs; none first: the same model without speculation):")
    print(format_memory(rows))
