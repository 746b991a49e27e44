"""Knob values as a page sends them (the knob form's text, a lane's ``name=value`` text), converted by the
strategy's knob schema: the one place the inspector turns form values into knob values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import KnobError
from ..strategies import strategy_schema
from .protocol import MessageError, show


@dataclass
class FormValues:
    """A form converted knob by knob: the ``values`` that passed, an ``errors`` text for each one refused,
    and the ``knobs`` the strategy has."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    knobs: frozenset[str] = frozenset()

    def raise_first(self) -> dict[str, Any]:
        """The values, or :class:`~specviz.errors.KnobError` for the first refused knob."""
        for name, text in self.errors.items():
            raise KnobError(text, knob=name)
        return self.values


def convert_form(strategy: str, raw: Mapping[str, Any]) -> FormValues:
    """Every value of ``raw`` converted by ``strategy``'s knob declarations (text as typed, or JSON values).

    An unknown knob, an empty field of a knob that is not text, and a value its knob refuses each get an
    error naming it; an unknown strategy raises :class:`~specviz.errors.StrategyError`.
    """
    schema = strategy_schema(str(strategy))
    by_name = {k.name: k for k in schema.knobs}
    out = FormValues(knobs=frozenset(by_name))
    for name, value in raw.items():
        knob = by_name.get(name)
        if knob is None:
            out.errors[name] = f"unknown knob {name!r} for strategy {strategy!r}"
            continue
        if isinstance(value, str) and value.strip() == "" and knob.type is not str:
            out.errors[name] = f"knob {name!r}: a value is required; expected {knob.describe_range()}"
            continue
        try:
            out.values[name] = knob.convert(value)
        except KnobError as e:
            out.errors[name] = str(e)
    return out


def parse_knob_text(text: str) -> dict[str, str]:
    """``"draft_max=8, draft_policy=cost"`` as ``{"draft_max": "8", "draft_policy": "cost"}`` (the values are
    converted and checked by the strategy's schema when applied); text that is not ``name=value`` raises
    :class:`~specviz.ui.protocol.MessageError`."""
    out: dict[str, str] = {}
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise MessageError(f"knobs: {show(part, 40)} is not name=value")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out
