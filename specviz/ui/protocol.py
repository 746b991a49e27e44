"""The page protocol, read from its one declaration (``widgets/protocol.json``, shipped as ``specviz.static``).

Every message between Python and the page is declared there with its fields (type, required, range).
:func:`validate_incoming` checks a message a page sent against ``to_python`` and raises
:class:`MessageError` naming the field and what it must be; what depends on the session's state (rounds
are running, an index below the upload's count …) is checked by the code that handles the message.
:func:`outgoing_problem` checks a message for the page against ``to_page`` (the tests run every message
the inspector sends through it).

Ranged integers follow the knob schema's rule (:meth:`specviz.decoding.knob_schema.Knob.convert`), with one
strictness of the page's own: a page's integer is a JSON integer, never text or a fraction.
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from ..decoding.knob_schema import Knob
from ..errors import KnobError, SpecvizError

#: The declaration's file in ``specviz.static``.
DECLARATION = "protocol.json"

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "number": (int, float),
    "str": (str,),
    "bool": (bool,),
    "object": (dict,),
    "list": (list,),
    "null": (type(None),),
}


class MessageError(SpecvizError):
    """A message from a view was refused: malformed, out of range, or out of order. Nothing changed."""


def show(value: Any, limit: int = 60) -> str:
    """A short repr for error texts (a huge value must not flood the page)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Field:
    """One declared field of a message: its JSON types and bounds (see the declaration's ``rules``)."""

    name: str
    types: tuple[str, ...]
    required: bool = False
    lo: float | None = None
    hi: float | None = None
    enum: tuple[str, ...] = ()
    min_length: int | None = None
    max_length: int | None = None
    items: str | None = None
    max_items: int | None = None
    what: str | None = None

    @classmethod
    def from_declaration(cls, name: str, d: Mapping[str, Any]) -> Field:
        """The field ``name`` as the declaration writes it."""
        types = d["type"] if isinstance(d["type"], list) else [d["type"]]
        for t in types:
            if t not in _JSON_TYPES:
                raise ValueError(f"protocol declaration: field {name!r} has the unknown type {t!r}")
        return cls(
            name,
            tuple(types),
            bool(d.get("required", False)),
            d.get("min"),
            d.get("max"),
            tuple(d.get("enum", ())),
            d.get("min_length"),
            d.get("max_length"),
            d.get("items"),
            d.get("max_items"),
            d.get("what"),
        )

    def _range(self, kind: str) -> Knob | None:
        """The knob-schema rule for this field's range (``None`` when it has none)."""
        if self.lo is None and self.hi is None:
            return None
        return Knob(self.name, int if kind == "int" else float, None, "", lo=self.lo, hi=self.hi)

    def describe(self) -> str:
        """What the field must be, for error texts (``an integer in [1, 100000]``)."""
        if self.what:
            return self.what
        parts = []
        for t in self.types:
            rng = self._range(t) if t in ("int", "number") else None
            if rng is not None:
                parts.append(rng.describe_range())
            elif t == "int":
                parts.append("an integer")
            elif t == "number":
                parts.append("a number")
            elif t == "str":
                parts.append("one of " + ", ".join(self.enum) if self.enum else "text")
            elif t == "bool":
                parts.append("true or false")
            elif t == "list":
                noun = {"str": "texts", "object": "objects"}.get(self.items or "", "items")
                parts.append(f"a list of at most {self.max_items} {noun}" if self.max_items is not None else "a list")
            elif t == "object":
                parts.append("an object")
            else:
                parts.append("null")
        return " or ".join(parts)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is of one of the field's types and within its bounds."""
        return any(self._accepts_as(t, value) for t in self.types)

    def _accepts_as(self, t: str, value: Any) -> bool:
        if not _is_json(t, value):
            return False
        if t in ("int", "number"):
            return self._in_range(t, value)
        if isinstance(value, str):
            return (
                (not self.enum or value in self.enum)
                and (self.min_length is None or len(value) >= self.min_length)
                and (self.max_length is None or len(value) <= self.max_length)
            )
        if isinstance(value, (list, dict)):
            if self.max_items is not None and len(value) > self.max_items:
                return False
            if isinstance(value, list) and self.items is not None:
                return all(_is_json(self.items, x) for x in value)
        return True

    def _in_range(self, t: str, value: Any) -> bool:
        rng = self._range(t)
        if rng is None:
            return True
        try:
            rng.convert(value)  # the knob schema's range rule (the type was checked above, strictly)
        except KnobError:
            return False
        return True


def _is_json(t: str, value: Any) -> bool:
    """Whether ``value`` is of the JSON type ``t`` (an int or number is never true or false)."""
    return isinstance(value, _JSON_TYPES[t]) and not (isinstance(value, bool) and t in ("int", "number"))


#: The values of a message's ``work`` (see the declaration's rules): run off the IO loop, or always at once.
WORK_KINDS = ("background", "always")


@dataclass(frozen=True)
class Shape:
    """The fields of one message (or of one variant of it), its ``exactly_one_of`` rule and its ``work``."""

    fields: tuple[Field, ...]
    exactly_one_of: tuple[str, ...] = ()
    work: str | None = None

    @classmethod
    def from_declaration(cls, d: Mapping[str, Any], base: tuple[Field, ...] = (), work: str | None = None) -> Shape:
        """A message's (or variant's) shape; ``base`` are the fields every variant shares, ``work`` the
        message's own ``work`` (a variant's overrides it)."""
        own = tuple(Field.from_declaration(n, f) for n, f in (d.get("fields") or {}).items())
        kind = d.get("work", work)
        if kind is not None and kind not in WORK_KINDS:
            raise ValueError(f"protocol declaration: unknown work {kind!r} (one of {WORK_KINDS})")
        return cls(base + own, tuple(d.get("exactly_one_of", ())), kind)


@dataclass(frozen=True)
class Message:
    """One declared message type: its shape, or (with ``by``) one shape per value of the ``by`` field."""

    type: str
    shape: Shape
    by: str | None = None
    noun: str = ""
    variants: Mapping[str, Shape] | None = None

    @classmethod
    def from_declaration(cls, type_: str, d: Mapping[str, Any]) -> Message:
        """The message ``type_`` as the declaration writes it."""
        shape = Shape.from_declaration(d)
        by = d.get("by")
        if by is None:
            return cls(type_, shape)
        variants = {v: Shape.from_declaration(vd, shape.fields, shape.work) for v, vd in d["variants"].items()}
        return cls(type_, shape, by["field"], by.get("noun", by["field"]), variants)

    def shape_of(self, msg: Mapping[str, Any]) -> tuple[Shape, str]:
        """The shape ``msg`` must have and the name of its kind for errors (``cmd run``); raises
        :class:`MessageError` for an unknown variant."""
        if self.by is None or self.variants is None:
            return self.shape, self.type
        v = msg.get(self.by)
        if not isinstance(v, str) or v not in self.variants:
            known = ", ".join(self.variants)
            raise MessageError(f"{self.type}: unknown {self.noun} {show(v, 40)}; known {self.noun}s: {known}")
        return self.variants[v], f"{self.type} {v}"


@dataclass(frozen=True)
class Protocol:
    """The whole declaration: the messages a page may send (``to_python``) and those it is sent (``to_page``)."""

    to_python: Mapping[str, Message]
    to_page: Mapping[str, Message]

    @classmethod
    def from_declaration(cls, d: Mapping[str, Any]) -> Protocol:
        """The protocol from the parsed declaration."""
        return cls(
            {t: Message.from_declaration(t, m) for t, m in d["to_python"].items()},
            {t: Message.from_declaration(t, m) for t, m in d["to_page"].items()},
        )


@lru_cache(maxsize=1)
def declaration() -> dict[str, Any]:
    """The parsed ``protocol.json`` shipped in ``specviz.static`` (read once)."""
    text = (importlib.resources.files("specviz.static") / DECLARATION).read_text(encoding="utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def protocol() -> Protocol:
    """The declaration as :class:`Protocol` (built once)."""
    return Protocol.from_declaration(declaration())


def message_types() -> tuple[str, ...]:
    """The message types a page may send, in the declaration's order."""
    return tuple(protocol().to_python)


def variants(message_type: str) -> tuple[str, ...]:
    """The values of a page message's ``by`` field (the commands of ``cmd``, ``lane``, ``file``)."""
    m = protocol().to_python[message_type]
    return tuple(m.variants or ())


def field(message_type: str, name: str, variant: str | None = None) -> Field:
    """The declared field ``name`` of a page message (of its ``variant``)."""
    m = protocol().to_python[message_type]
    shape = m.variants[variant] if variant is not None and m.variants is not None else m.shape
    return next(f for f in shape.fields if f.name == name)


def _check_fields(shape: Shape, msg: Mapping[str, Any], where: str, *, null_is_absent: bool) -> None:
    for f in shape.fields:
        present = f.name in msg and not (null_is_absent and msg[f.name] is None)
        if not present:
            if f.required:
                got = "nothing" if f.name not in msg else show(msg[f.name])
                raise MessageError(f"{where}: {f.name!r} must be {f.describe()}; got {got}")
            continue
        if not f.accepts(msg[f.name]):
            raise MessageError(f"{where}: {f.name!r} must be {f.describe()}; got {show(msg[f.name])}")
    if shape.exactly_one_of:
        given = [n for n in shape.exactly_one_of if msg.get(n) is not None]
        if len(given) != 1:
            names = " and ".join(repr(n) for n in shape.exactly_one_of)
            raise MessageError(f"{where}: give exactly one of {names}")


def validate_incoming(msg: Any) -> dict[str, Any]:
    """``msg`` (a page's message) when it is declared and its fields are well formed; otherwise
    :class:`MessageError` naming the type or the field and what is allowed. Fields not declared are ignored."""
    if not isinstance(msg, dict):
        raise MessageError(f"ignored a message that is not an object: {show(msg)}")
    t = msg.get("type")
    decl = protocol().to_python.get(t) if isinstance(t, str) else None
    if decl is None:
        raise MessageError(f"ignored a message of unknown type {show(t)}; known types: {', '.join(message_types())}")
    shape, where = decl.shape_of(msg)
    _check_fields(shape, msg, where, null_is_absent=True)
    return msg


def work_of(msg: Mapping[str, Any]) -> tuple[str | None, str]:
    """How a served inspector runs a page message already checked by :func:`validate_incoming`: its declared
    ``work`` (``"background"``, ``"always"`` or ``None``) and its name for the page (``reset``, ``lane branch``)."""
    decl = protocol().to_python[msg["type"]]
    shape, where = decl.shape_of(msg)
    name = where.removeprefix("cmd ") if decl.type == "cmd" else where
    return shape.work, name


def outgoing_problem(msg: Any) -> str | None:
    """What is wrong with a message for the page (undeclared type, a missing, undeclared or ill-typed field),
    or ``None`` when it matches its declaration."""
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        return f"a message for the page must be an object with a type: {show(msg)}"
    decl = protocol().to_page.get(msg["type"])
    if decl is None:
        return f"the page protocol declares no message {msg['type']!r} to the page"
    try:
        shape, where = decl.shape_of(msg)
        _check_fields(shape, msg, f"to the page: {where}", null_is_absent=False)
    except MessageError as e:
        return str(e)
    extra = sorted(set(msg) - {"type"} - {f.name for f in shape.fields})
    if extra:
        return f"to the page: {msg['type']}: fields not declared: {', '.join(extra)}"
    return None
