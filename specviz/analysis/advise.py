"""Which draft settings pay on this machine: the advisor's entry points (:func:`advise`, :func:`predict`).

:func:`advise` reads a session's events (live or recorded; rewinds honoured) and a verify-cost curve,
replays the recorded rounds under each ``draft_max`` / ``draft_min`` / ``draft_p_min`` (and each strategy,
or chain of a chain's first members, the session ran) and answers with an :class:`Advice`: the setting with
the highest expected tokens/s whose speedup interval clears plain decoding (else ``--spec-type none``), and
the same setting as ``llama-server`` flags. :func:`predict` scores the advised setting, without searching,
on other rounds (what it should give on other prompts).

The parts, one job each: :mod:`.advise_rounds` (the events read into rounds), :mod:`.advise_costs` (the
verify-cost curve and a round's overhead), :mod:`.advise_search` (the replay, the search and the choice),
:mod:`.advise_load` (the timings checked for outside load), :mod:`.advise_flags` (llama.cpp flags),
:mod:`.advise_report` (the advice in words and JSON).

Limits, stated in every answer: nothing is searched beyond the longest draft recorded, nor below the
``draft_p_min`` the session drafted with. ``for_server=True`` searches only what llama-server's flags express:
no verify-tile alignment, no ``draft_min`` for the n-gram types without one, ngram-cache at 8 tokens, no
ngram-simple m-gram shorter than its n-gram, and no prompt lookup when a llama.cpp type was recorded too.
"""

from __future__ import annotations

from ..decoding.verify_cost import VerifyCostModel
from .advise_costs import (
    cost_from_times,
    fit_overhead,
    round_costs,
    scaled_to_times,
    session_cost,
    verify_cost,
)
from .advise_flags import NEAREST_SPEC_TYPE, grammar_advice, llama_flags
from .advise_load import DISAGREE, LoadCheck, check_load, quiet_verify
from .advise_report import Advice
from .advise_rounds import Recorded, Rounds, chain_prefixes, collect, group_label, recorded_tile
from .advise_search import (
    DRAFT_MIN_GRID,
    NGRAM_CACHE_DRAFT,
    NO_DRAFT_MIN,
    P_MIN_GRID,
    Candidate,
    GroupScore,
    choose,
    rescore,
    score_group,
    server_grid,
    with_interval,
)
from .diagnose import diagnose
from .sources import EventSource, events_of

__all__ = [
    "DRAFT_MIN_GRID",
    "NEAREST_SPEC_TYPE",
    "NGRAM_CACHE_DRAFT",
    "NO_DRAFT_MIN",
    "P_MIN_GRID",
    "Advice",
    "Candidate",
    "LoadCheck",
    "Recorded",
    "advise",
    "chain_prefixes",
    "choose_best",
    "collect",
    "cost_from_times",
    "fit_overhead",
    "group_label",
    "llama_flags",
    "predict",
    "recorded_tile",
    "round_costs",
    "scaled_to_times",
    "server_grid",
    "session_cost",
    "verify_cost",
    "with_interval",
]


def advise(
    source: EventSource,
    *more: EventSource,
    cost: VerifyCostModel | None = None,
    scale_to_rounds: bool = False,
    for_server: bool = False,
    fresh: bool = False,
) -> Advice:
    """The advised setting for a :class:`~specviz.decoding.session.Session` or a list of events (see the module
    docstring); ``more`` sessions or recordings (another lane, another run) add their rounds, each folded
    over its own rewinds. ``cost`` is the measured verify-cost curve; without it, the session's measured
    one, the one recorded in the telemetry, or one fitted to the recorded verify times is used.

    ``scale_to_rounds``: scale the curve to the level of the rounds' own verify times
    (:func:`scaled_to_times`) — for a curve measured on the same machine just after the run, whose load
    may have changed meanwhile; not for a curve measured elsewhere on purpose.

    ``fresh``: ``cost`` was measured on this machine just now (the model at hand). Where the recorded verify
    times are slower than it beyond noise (:func:`~specviz.analysis.advise_load.compare_fresh`), the advice
    is scored with it as measured (not scaled to the rounds) and the best setting scored on the recorded
    times is kept beside it (:attr:`Advice.as_recorded`).

    The timings are checked for outside load (:func:`~specviz.analysis.advise_load.check_load`,
    :attr:`Advice.load`). Without a measured curve, the verify times of the rounds flagged are left out of
    the fitted curve where enough others remain; the advice never declines speculation on timings it has
    flagged (:attr:`Advice.text` asks for a quiet recording or a fresh measurement instead).

    ``for_server``: search only what llama-server's flags express (see the module docstring).

    Rounds are grouped by strategy and drafting policy (``per_strategy`` / ``current`` are keyed
    ``"prompt-lookup"`` or ``"prompt-lookup (cost policy)"``)."""
    if cost is None:
        cost = getattr(source, "cost_model", None)
    first = events_of(source)
    rec = collect(first + [e for m in more for e in events_of(m)])
    load = check_load(rec, cost if fresh and cost is not None else None)
    if fresh and load.fresh_disagrees:
        load.scored_fresh, scale_to_rounds = True, False
    elif load.fresh_level is not None and load.fresh_level < 1 / DISAGREE:
        load.notes.append(
            f"the fresh measurement is {1 / load.fresh_level:.2f}x slower than the recorded verify times: the "
            "machine may be busy now" + (" (the curve is scaled to the recorded times)" if scale_to_rounds else "")
        )
    terms = _costs(rec, cost, scale_to_rounds, load)
    dg = diagnose(first)
    if terms is None:
        adv = Advice(None, 0.0, cost_source="none: fewer than two verify batch sizes were recorded", load=load)
        adv.limits.append(
            "the verify cost of batches longer than one token is unknown: measure it "
            "(benchmarks/bench_verify_cost.py, or the cost policy) or record a drafting session"
        )
        return adv
    curve, source_name, overhead, base = terms
    adv = Advice(
        None,
        base,
        cost_source=source_name,
        overhead=overhead,
        cost_curve=curve.to_dict(),
        by_depth=dg.by_depth(),
        by_confidence=dg.by_confidence(),
        knobs=dict(dg.knobs),
        measured=rec.measured,
        by_drafter=dg.by_drafter(),
        for_server=for_server,
        load=load,
    )
    groups = {name: r for name, r in rec.rounds.items() if name != "none"}
    if for_server and any(r.strategy != "prompt-lookup" for r in groups.values()):
        for name in [n for n, r in groups.items() if r.strategy == "prompt-lookup"]:
            del groups[name]
            adv.limits.append(f"{name}: left out (llama-server has no prompt-lookup type; a llama.cpp type ran too)")
    for label, scored in _score_groups(groups, terms, for_server).items():
        adv.per_strategy[label], adv.current[label] = scored.best, scored.current
        adv.limits.append(f"{label}: {scored.limit}")
    if for_server:
        adv.limits.append(
            "searched for llama-server: no verify-tile alignment, no draft_min for the n-gram types without one, "
            "ngram-cache at 8 tokens"
        )
    if adv.per_strategy:
        choose_best(adv, rec.rounds)
    grammar = grammar_advice(dg)
    if grammar is not None:
        adv.flag_notes.append(grammar)
    if load.scored_fresh:
        adv.as_recorded = _fastest(_score_groups(groups, round_costs(rec, None), for_server))
    return adv


def _costs(
    rec: Recorded, cost: VerifyCostModel | None, scale_to_rounds: bool, load: LoadCheck
) -> tuple[VerifyCostModel, str, tuple[float, float], float] | None:
    """:func:`round_costs` as the advice uses them after the load check: without a measured curve and with
    rounds flagged for outside load, the curve fitted to the other rounds' verify times where enough remain
    (:func:`~specviz.analysis.advise_load.quiet_verify`), and ``load``'s notes say what was done."""
    if load.scored_fresh:
        load.notes.append(
            f"the recorded verify times are {load.fresh_level:.2f}x a fresh measurement's on this machine: "
            "scored with the fresh measurement"
        )
    if cost is not None or not load.under_load:
        return round_costs(rec, cost, scale_to_rounds)
    quiet = quiet_verify(rec, load)
    if quiet is None:
        if load.under_load:
            load.notes.append(
                "the timings were taken under load: too few rounds were not flagged to fit the verify cost without "
                "the flagged ones"
            )
        return round_costs(rec, cost, scale_to_rounds)
    terms = round_costs(rec, cost_from_times(quiet), False)
    if terms is None:
        return None
    n = sum(len(ts) for ts in quiet.values())
    load.notes.append(
        f"the verify cost was fitted to the {n} rounds not flagged; the {len(load.flagged)} flagged rounds' "
        "verify times were left out"
    )
    return terms[0], "fitted to the recorded verify times", *terms[2:]


def _score_groups(
    groups: dict[str, Rounds],
    terms: tuple[VerifyCostModel, str, tuple[float, float], float] | None,
    for_server: bool,
) -> dict[str, GroupScore]:
    """Each group's (and each chain prefix's) best setting, the setting it ran with and its limit, under the
    costs ``terms`` (:func:`round_costs`); groups that never drafted are left out."""
    if terms is None:
        return {}
    curve, _, overhead, base = terms
    out = {}
    for name, r in groups.items():
        for label, rounds in [(name, r), *chain_prefixes(name, r)]:
            scored = score_group(rounds, curve, base, overhead, for_server=for_server)
            if scored is not None:
                out[label] = scored
    return out


def _fastest(scored: dict[str, GroupScore]) -> Candidate | None:
    """The fastest of the groups' best settings (None without any)."""
    if not scored:
        return None
    return max((g.best for g in scored.values()), key=lambda c: c.tokens_per_second)


def predict(
    advice: Advice,
    source: EventSource,
    *more: EventSource,
    cost: VerifyCostModel | None = None,
    scale_to_rounds: bool = False,
) -> Candidate | None:
    """The advised setting (``advice.best``) scored on other rounds: its expected tokens/s and speedup on the
    prompts ``source`` (and ``more``) ran, where ``advice``'s own figure is for the rounds it was learnt from.

    The rounds are read, costed (:func:`round_costs`, with ``cost`` and ``scale_to_rounds`` as in
    :func:`advise`) and replayed under the advised setting exactly as :func:`advise` scores a setting —
    the same group of rounds (strategy and drafting policy, or the chain's first members), the same cuts,
    no tile alignment when the advice was made ``for_server`` — but nothing is searched: the setting is
    the advice's. So advice learnt on some prompts gets a prediction for others (those a server is then
    measured on, :func:`~specviz.analysis.check_server.check_advice`) before they are measured, from a
    recording of them alone. Plain decoding scores ``1.0``. None when the advice has no setting, the rounds
    give no verify-cost curve, or they hold no round of the advised setting's group. The prediction carries
    its own bootstrap interval over the new rounds (``speedup_low`` / ``speedup_high``)."""
    b = advice.best
    if b is None:
        return None
    if cost is None:
        cost = getattr(source, "cost_model", None)
    rec = collect(events_of(source) + [e for m in more for e in events_of(m)])
    terms = round_costs(rec, cost, scale_to_rounds)
    if terms is None:
        return None
    curve, _, overhead, base = terms
    if b.strategy == "none":
        return Candidate("none", 0, 0, None, base, 1.0, 1.0)
    groups = dict(rec.rounds)
    for name, rounds in rec.rounds.items():
        groups.update(chain_prefixes(name, rounds))
    r = groups.get(advice.best_label)
    if r is None or not r.length.size:
        return None
    tile = 1 if advice.for_server else recorded_tile(r.knobs)
    return rescore(b, r, curve, tile, overhead, base)


def choose_best(adv: Advice, rounds: dict[str, Rounds]) -> None:
    """Set ``adv``'s advised setting, the setting declined and the llama.cpp flags from the groups' best
    settings (:func:`~specviz.analysis.advise_search.choose`); the flags carry the advised group's knobs."""
    choice = choose(adv.per_strategy, adv.baseline_tokens_per_second)
    adv.best, adv.best_label = choice.best, choice.label
    if choice.declined is not None:
        adv.declined, adv.declined_label = choice.declined, choice.declined_label
    knobs: dict = {}
    if choice.best.strategy != "none":
        group = rounds.get(choice.label) or next(
            (r for r in rounds.values() if choice.best.strategy in r.strategy), None
        )
        knobs = group.knobs if group else {}
    adv.flags, adv.flag_notes = llama_flags(adv.best, knobs)
