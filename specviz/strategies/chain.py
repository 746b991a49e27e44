"""Chained drafters: several strategies asked in priority order each round, the first that drafts wins.

llama.cpp takes a comma list of ``--spec-type`` values (``draft-mtp,ngram-mod``) and builds one
implementation per type in a fixed priority order (``common_speculative_init``: the n-gram types, then
the draft model, EAGLE-3, MTP, DFlash, DSpark), whatever order the list names them in.
``common_speculative_draft`` asks each in that order and keeps the first non-empty draft; only that
drafter hears how many of its tokens were accepted (the others are told ``is_other`` and ignore it);
every drafter sees every target batch. :func:`chain_class` builds a drafter class with those semantics
for a tuple of member strategies (:func:`specviz.strategies.resolve_strategy` orders and checks them).

Each round's draft names the member that proposed it (``Draft.drafter``), which the events and the
telemetry break acceptance down by. A round where no member drafts carries the last member's reason.

Knobs: the chain's schema is its members' declarations, so the knob form, the CLI flags and validation
come from them as for any strategy. A knob declared identically by several members is one knob (as
llama.cpp shares ``--spec-draft-p-min``); a name several members declare differently (``size_n`` of
``ngram-simple`` and of ``ngram-map-k``) becomes one knob per member, prefixed with the member's name
(``ngram_map_k_size_n``, flag ``--ngram-map-k-size-n``), keeping the member's llama.cpp spellings
(``--spec-ngram-map-k-size-n``) as aliases.

Departures from llama.cpp: specviz's ``draft_min`` applies to the winning draft (the round drops a
shorter one), not inside each member; llama.cpp applies ``--spec-draft-n-min`` inside its model drafters
only, so there a too-short model draft lets the next type try. At most one member may draft with a model
(llama.cpp has one draft context, ``params.draft.ctx_dft``).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from functools import partial
from typing import Any, Callable, ClassVar, Sequence

from ..decoding.knob_schema import Knob
from ..errors import SnapshotError
from .base import Draft, Drafter, DraftResources, Upkeep, check_knob_rules
from .context_drafter import ContextDrafter, context_class, context_hooks


def member_slug(member: str) -> str:
    """The prefix of a member's own knobs in a chain (``ngram-map-k`` -> ``ngram_map_k``)."""
    return member.replace("-", "_")


def merge_knobs(members: Sequence[tuple[str, tuple[Knob, ...]]]) -> tuple[tuple[Knob, ...], dict[str, dict[str, str]]]:
    """The chain's knobs and, per member, its knob name -> the chain's knob name (see the module docstring)."""
    decls: dict[str, list[Knob]] = {}
    for _, knobs in members:
        for k in knobs:
            same = decls.setdefault(k.name, [])
            if k not in same:
                same.append(k)
    out: list[Knob] = []
    names: dict[str, dict[str, str]] = {}
    for member, knobs in members:
        mapping = names.setdefault(member, {})
        for k in knobs:
            if len(decls[k.name]) == 1:
                if k.name not in {x.name for x in out}:
                    out.append(k)
                mapping[k.name] = k.name
            else:
                name = f"{member_slug(member)}_{k.name}"
                out.append(replace(k, name=name, help=f"{member}: {k.help}"))
                mapping[k.name] = name
    return tuple(out), names


class ChainDrafter(Drafter):
    """Base of the classes :func:`chain_class` builds: ``members`` are asked in order, the first that drafts
    wins. Built like any drafter, with :class:`DraftResources` when a member drafts with a model; a chain
    holding a member with a context is a :class:`ContextChainDrafter`."""

    #: The member strategies, in the order they are asked.
    members: ClassVar[tuple[str, ...]] = ()
    #: The members' classes, in the same order.
    member_classes: ClassVar[tuple[type[Drafter], ...]] = ()
    #: Per member: its knob name -> the chain's knob name.
    member_knobs: ClassVar[dict[str, dict[str, str]]] = {}
    #: Builds a member (the registry's ``make_drafter``, given by :func:`chain_class`).
    make_member: ClassVar[Callable[..., Drafter]]

    def __init__(self, resources: DraftResources | None = None, **knobs: Any) -> None:
        super().__init__(**knobs)
        self.drafters: list[Drafter] = []
        try:
            for m in self.members:
                own = {mine: self.config[chain] for mine, chain in self.member_knobs[m].items()}
                self.drafters.append(type(self).make_member(m, own, resources))
        except Exception:
            self.close()
            raise
        self._winner: Drafter | None = None

    @classmethod
    def member_config(cls, member: str, config: dict[str, Any]) -> dict[str, Any]:
        """A member's own config from the chain's (the member's knob names)."""
        return member_config(cls.member_knobs[member], config)

    def member_telemetry(self) -> dict[str, Any]:
        """The members and each member's counters (the telemetry's ``chain`` figures)."""
        return {"members": list(self.members), "stats": {d.name: d.stats.to_dict() for d in self.drafters}}

    # -- the interface -----------------------------------------------------------------------------
    def _begin(self, history: Sequence[int]) -> None:
        self._winner = None
        for d in self.drafters:
            d.begin(history)

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        self._winner = None
        last = Draft(reason="none")
        for d in self.drafters:
            last = d.draft(history, n_max)
            if last.tokens:
                self._winner = d
                return replace(last, drafter=last.drafter or d.name)
        return Draft(reason=last.reason, block=last.block)

    def _accept(self, n_accepted: int, history: Sequence[int]) -> None:
        # llama.cpp tells the others is_other, which every implementation ignores
        if self._winner is not None:
            self._winner.accept(n_accepted, history)
        self._winner = None

    def _export_state(self) -> dict[str, Any]:
        return {"members": [{"state": d.state(), "stats": d.stats.to_dict()} for d in self.drafters]}

    def _import_state(self, d: dict[str, Any]) -> None:
        parts = d["members"]
        if not isinstance(parts, list) or len(parts) != len(self.drafters):
            raise ValueError(f"the chain holds {len(self.drafters)} drafters, the state {len(parts)}")
        saved = [copy.deepcopy(x.state()) for x in self.drafters]
        try:
            for x, p in zip(self.drafters, parts):
                x.load_state(p["state"])
                for k, v in p.get("stats", {}).items():
                    if hasattr(x.stats, k):
                        setattr(x.stats, k, v)
        except SnapshotError as e:
            for x, s in zip(self.drafters, saved):
                x.load_state(s)
            raise ValueError(str(e)) from None

    def close(self) -> None:
        """Close every member."""
        for d in self.drafters:
            d.close()


class ContextChainDrafter(ChainDrafter, ContextDrafter):
    """A chain holding a member with a llama.cpp context: the context hooks forward to the members that
    have one (at most one draft model, as llama.cpp has one draft context).

    :meth:`expect_plain` is not forwarded: a chain does not declare ``pause_when_plain``, so a member
    that could pause (``eagle3``) feeds its model every round, as a chain's member does in llama.cpp."""

    @classmethod
    def check_models(cls, config: dict[str, Any], target_ctx: Any, model: Any) -> None:
        """The model-backed member's refusal of this model pair."""
        for m, mc in zip(cls.members, cls.member_classes):
            hooks = context_class(mc)
            if mc.needs_model and hooks is not None:
                hooks.check_models({**config, **cls.member_config(m, config)}, target_ctx, model)

    def _context_members(self) -> list[ContextDrafter]:
        return [h for h in (context_hooks(d) for d in self.drafters) if h is not None]

    def _context_member(self) -> ContextDrafter | None:
        return next(iter(self._context_members()), None)

    def sync(self, history: Sequence[int]) -> list[tuple[int, int]]:
        """Every member with a context is brought in step (each sees every target batch, as upstream)."""
        out: list[tuple[int, int]] = []
        for d in self._context_members():
            out += d.sync(history)
        return out

    def take_upkeep(self) -> Upkeep | None:
        """The members' upkeep together (their seconds added; the committed positions are the same for all)."""
        ups = [u for u in (d.take_upkeep() for d in self._context_members()) if u is not None]
        if not ups:
            return None
        return Upkeep(
            seconds=sum(u.seconds for u in ups),
            tokens=max(u.tokens for u in ups),
            in_draft=sum(u.in_draft for u in ups),
            paused=all(u.paused for u in ups),
        )

    def kv_length(self) -> int | None:
        """Positions the model-backed member's context holds."""
        ctx = self._context_member()
        return ctx.kv_length() if ctx is not None else None

    def extra_telemetry(self) -> dict[str, Any]:
        """The members' own figures (the chain's ``chain`` figures are :meth:`member_telemetry`)."""
        out: dict[str, Any] = {}
        for d in self._context_members():
            out.update(d.extra_telemetry())
        return out

    def context_state(self) -> bytes:
        """The model-backed member's context (for snapshots)."""
        ctx = self._context_member()
        return ctx.context_state() if ctx is not None else b""

    def load_context_state(self, blob: bytes) -> None:
        """Restore :meth:`context_state`."""
        ctx = self._context_member()
        if ctx is not None:
            ctx.load_context_state(blob)

    def memory_context(self) -> Any:
        """The model-backed member's own context, whose memory the telemetry reports (None: none)."""
        ctx = self._context_member()
        return ctx.memory_context() if ctx is not None else None

    def memory_log(self) -> list[Any]:
        """The model-backed member's checkpoints and cuts since the last call (recurrent or hybrid drafts)."""
        ctx = self._context_member()
        return ctx.memory_log() if ctx is not None else []


def member_config(names: dict[str, str], config: dict[str, Any]) -> dict[str, Any]:
    """A member's own config from the chain's, given the member's knob name -> chain knob name ``names``."""
    return {mine: config[chain] for mine, chain in names.items() if chain in config}


def _member_rules(member_class: type[Drafter], names: dict[str, str], config: dict[str, Any]) -> None:
    """A member's cross-knob rules on its own part of the chain's config."""
    check_knob_rules(member_class, {**config, **member_config(names, config)})


def drafter_telemetry(drafter: Drafter | None) -> dict[str, Any]:
    """The strategy-specific figures the telemetry merges in: a context drafter's own
    (:meth:`~specviz.strategies.context_drafter.ContextDrafter.extra_telemetry`) and, for a chain, each
    member's counters under ``chain``."""
    hooks = context_hooks(drafter)
    out = hooks.extra_telemetry() if hooks is not None else {}
    if isinstance(drafter, ChainDrafter):
        out["chain"] = drafter.member_telemetry()
    return out


def chain_class(
    members: tuple[str, ...], classes: tuple[type[Drafter], ...], make_member: Callable[..., Drafter]
) -> type[ChainDrafter]:
    """A drafter class asking ``members`` (strategy names with their ``classes``, in the order to ask them)
    each round. ``make_member(name, knobs, resources)`` builds one member (the registry's ``make_drafter``).
    """
    knobs, names = merge_knobs([(m, tuple(c.knobs)) for m, c in zip(members, classes)])
    model = [c for c in classes if c.needs_model]
    attrs: dict[str, Any] = {
        "name": ",".join(members),
        "knobs": knobs,
        "members": tuple(members),
        "member_classes": tuple(classes),
        "member_knobs": names,
        "make_member": staticmethod(make_member),
        "state_format": "chain-1:" + ",".join(members),
        "knob_rules": tuple(partial(_member_rules, c, names[m]) for m, c in zip(members, classes) if c.knob_rules),
        "needs_model": bool(model),
        "reads_target": any(c.reads_target for c in classes),
        "draft_model_optional": bool(model) and all(c.draft_model_optional for c in model),
        "__doc__": f"The chain {', '.join(members)}: the first that drafts wins (see :mod:`specviz.strategies.chain`).",
    }
    base = ContextChainDrafter if any(c.has_context for c in classes) else ChainDrafter
    return type(f"Chain[{','.join(members)}]", (base,), attrs)
