"""A strategy's configuration on a session: checked against the session's target, queued by
``Session.configure`` and applied at the next round boundary, and the drafter built for it.

Every check runs when the configuration is given (a draft model is loaded and checked then), so nothing
fails at the boundary; a refusal is a typed error (:class:`~specviz.errors.KnobError`,
:class:`~specviz.errors.ModelError`, :class:`~specviz.errors.RollbackUnavailableError`) and changes nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..backends.llama import LlamaContext
from ..backends.memory import rollback_refusal, tree_refusal
from ..errors import KnobError, ModelError, RollbackUnavailableError
from ..models.draft_cache import DraftModelCache
from ..strategies import make_drafter, strategy_class, strategy_schema
from ..strategies.base import Drafter, DraftResources, check_knob_rules
from ..strategies.context_drafter import context_class
from ..strategies.grammar import give_grammar
from ..strategies.knobs import tree_width_of
from .events import KnobsChanged
from .generation import SessionParts
from .knob_schema import check_cross_knobs
from .policy import make_policy
from .round_events import knobs_changed_event
from .sampling import SamplingParams
from .target_context import refill, swap_target

#: ``check(strategy, knobs, base)``: a complete, checked configuration (``Session.validate_config``).
Check = Callable[[str, dict[str, Any], Optional[dict[str, Any]]], dict[str, Any]]


def check_config(
    ctx: LlamaContext,
    draft_models: DraftModelCache,
    strategy: str,
    knobs: dict[str, Any],
    base: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The complete configuration of ``strategy`` with ``knobs`` set on top of ``base`` (the knobs of ``base``
    the strategy shares; None: the defaults), checked completely against the target context ``ctx``: each
    knob, the strategy's own rules, the rules between knobs, and a draft model (loaded from ``draft_models``
    and checked now)."""
    schema = strategy_schema(strategy)
    carried = {k: v for k, v in base.items() if k in set(schema.names())} if base is not None else None
    cfg = schema.validate(knobs, base=carried)
    cls = strategy_class(strategy)
    check_knob_rules(cls, cfg)
    check_cross_knobs(cfg)
    why = rollback_refusal(ctx.memory.info) if cls.drafts else None
    if why is not None:
        raise RollbackUnavailableError(f"strategy {strategy!r} cannot run: {why}")
    check_tree(ctx, cfg)
    if cls.needs_model:  # load and check now, so nothing fails at the boundary
        path = cfg.get("draft_model") or ""
        model = draft_models.get(path) if path or not cls.draft_model_optional else None
        if (hooks := context_class(cls)) is not None:
            hooks.check_models(cfg, ctx, model)
    return cfg


def check_tree(ctx: LlamaContext, cfg: dict[str, Any]) -> None:
    """Refuse a draft tree (``tree_width`` > 1, or a hidden-state drafter's ``tree_topk`` > 1) the target's context
    cannot verify: each branch is one of its sequences, sharing the prefix's cells, so it needs a unified cache of
    at least as many sequences as the tree can have branches (:func:`~specviz.strategies.knobs.tree_width_of`; a
    request of a batched run has one sequence of a shared context: no tree)."""
    width, knob = tree_width_of(cfg)
    if width <= 1:
        return
    why = tree_refusal(ctx.memory.info.kind)
    if why is not None:
        raise KnobError(f"knob '{knob}': no draft tree here: {why}", knob=knob, value=cfg.get(knob))
    n_seq = ctx.n_seq_max if isinstance(ctx, LlamaContext) and ctx.kv_unified else 1
    if width > n_seq:
        raise KnobError(
            f"knob '{knob}': a tree of {width} branches needs {width} sequences in the target's context, which "
            f"has {n_seq}; open the session with n_seq_max={width} (Session(n_seq_max=...); the CLI's "
            f"--{knob.replace('_', '-')} opens it so), or "
            + (f"set tree_width <= {n_seq}" if knob == "tree_width" else "lower tree_topk or tree_nodes")
            + ("" if isinstance(ctx, LlamaContext) else " (a batched run's requests draft chains)"),
            knob=knob,
            value=cfg.get(knob),
        )


def next_config(
    check: Check, current: tuple[str, dict[str, Any]], target: str, knobs: dict[str, Any]
) -> dict[str, Any]:
    """The checked configuration of strategy ``target`` with ``knobs`` changed from the ``current``
    (strategy, knobs), which carries the knobs both strategies share.

    A draft GGUF is the file of the strategy that loaded it (a draft model, an EAGLE-3 or DFlash head, an MTP
    model): a switch carries it only where the new strategy takes it; otherwise the new strategy is checked
    as if it had not been given one (MTP then drafts with the target's own layers), and a refusal names what
    the new strategy lacks, not the old file."""
    cur_strategy, cur_knobs = current
    try:
        return check(target, knobs, cur_knobs)
    except (KnobError, ModelError):
        if target == cur_strategy or "draft_model" in knobs or not cur_knobs.get("draft_model"):
            raise
    # outside the handler: a refusal here is the new strategy's own, unchained
    return check(target, knobs, {k: v for k, v in cur_knobs.items() if k != "draft_model"})


def build_drafter(s: SessionParts, strategy: str, cfg: dict[str, Any], sampling: SamplingParams) -> Drafter:
    """A new drafter of session ``s`` for a configuration :func:`check_config` returned, drafting under
    ``sampling``; a strategy that drafts with a model gets its draft model (or the target, where it may draft
    with it), the target and its context, and the session's generator."""
    cls, resources = strategy_class(strategy), None
    if cls.needs_model:
        path, cap = cfg.get("draft_model") or "", s.ctx.capacity
        resources = DraftResources(
            model=s.model if not path and cls.draft_model_optional else s.draft_models.get(path),
            target=s.model,
            target_ctx=s.ctx,
            n_ctx=cap.n_ctx,
            n_batch=cap.n_batch,
            n_ubatch=cap.n_ubatch,
            n_threads=s.context_args["n_threads"],
            sampling=sampling,
            rng=s.rng,
            flash_attn=s.ctx.settings.flash_attn,
        )
    drafter = make_drafter(strategy, cfg, resources)
    give_grammar(drafter, lambda: s.generation.grammar)  # read when it drafts: the generation of that moment
    return drafter


def use_drafter(s: SessionParts, drafter: Drafter | None) -> None:
    """Make ``drafter`` the session's (None: none), closing the one it replaces."""
    if s.drafter is not None:
        s.drafter.close()
    s.drafter = drafter


def apply_pending(s: SessionParts) -> KnobsChanged | None:
    """Apply the configuration queued on ``s`` at this round boundary, and return the event to publish (None:
    nothing queued, or nothing changed). A drafter whose own knobs change is built anew from the history
    before the old one is closed, so a failure leaves the session as it was."""
    g = s.generation
    if g.pending is None:
        return None
    (strategy, cfg), g.pending = g.pending, None
    previous = (g.strategy, dict(g.knobs))
    own = {k.name for k in strategy_class(strategy).knobs}
    if strategy != g.strategy or any(g.knobs.get(k) != cfg.get(k) for k in own):
        # a drafter's knobs can change the meaning of its state: rebuild it from the history
        with swap_target(s, strategy) as (old_ctx, fresh):
            drafter = s.build_drafter(strategy, cfg, g.sampling)
            try:
                if fresh is not None:  # the new context holds what the old one held, then the drafter starts
                    refill(fresh, old_ctx, g.history if g.prefilled else g.history[:-1], keep_last=g.prefilled)
                drafter.begin(g.history)
            except BaseException:
                drafter.close()
                raise
            use_drafter(s, drafter)
    if cfg.get("draft_policy", "fixed") != g.knobs.get("draft_policy", "fixed"):
        g.policy = make_policy(cfg.get("draft_policy", "fixed"), s.cost_model)
    g.strategy, g.knobs = strategy, cfg
    if previous == (strategy, cfg):
        return None
    return knobs_changed_event(g.round_index, strategy, cfg, previous, strategy_schema(strategy).to_list())
