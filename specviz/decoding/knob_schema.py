"""Knob schemas: one declaration per knob, from which validation, CLI flags and UI forms are built.

A :class:`Knob` names a tunable value (its type, range, default and help). Strategies declare a tuple
of knobs; the session adds the shared ones (:data:`SESSION_KNOBS`). :func:`validate` checks a mapping
of proposed values against a schema and either returns a complete, converted mapping or raises
:class:`~specviz.errors.KnobError` naming the knob, the value and what is allowed; :func:`check_cross_knobs`
checks the rules between knobs.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..errors import KnobError


@dataclass(frozen=True)
class Knob:
    """One tunable value of a strategy or of the session.

    ``type`` is ``int``, ``float``, ``bool`` or ``str``; numeric knobs have an inclusive ``[lo, hi]``
    range, string knobs a tuple of ``choices``. ``aliases`` are extra command-line spellings (for
    example the static-shape runner's ``--num-draft-tokens``).
    """

    name: str
    type: type
    default: Any
    help: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        """The command-line flag for this knob (``draft_max`` → ``--draft-max``)."""
        return "--" + self.name.replace("_", "-")

    def describe_range(self) -> str:
        """Human text for what is allowed, used in error messages and help."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.type is bool:
            return "true or false"
        if self.type is str:
            return "any text"
        if self.type is int:
            return int_range_text(self.lo, self.hi)
        lo = "-inf" if self.lo is None else _fmt(self.lo)
        hi = "inf" if self.hi is None else _fmt(self.hi)
        return f"a number in [{lo}, {hi}]"

    def convert(self, value: Any) -> Any:
        """Return ``value`` converted to this knob's type, or raise :class:`KnobError`."""
        bad = KnobError(
            f"knob {self.name!r}: {value!r} is not allowed; expected {self.describe_range()}",
            knob=self.name,
            value=value,
        )
        if self.type is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                return value.lower() in ("true", "1", "yes", "on")
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            raise bad
        if self.type is str:
            if not isinstance(value, str) or (self.choices and value not in self.choices):
                raise bad
            return value
        if self.type is int:
            return ranged_int(value, self.lo, self.hi, label=f"knob {self.name!r}", knob=self.name)
        if isinstance(value, bool):
            raise bad
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise bad from None
        if math.isnan(value):
            raise bad
        if self.lo is not None and value < self.lo:
            raise bad
        if self.hi is not None and value > self.hi:
            raise bad
        return value

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description, used by the inspector to build its form."""
        return {
            "name": self.name,
            "type": self.type.__name__,
            "default": self.default,
            "help": self.help,
            "lo": self.lo,
            "hi": self.hi,
            "choices": list(self.choices),
            "flag": self.flag,
        }


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def int_range_text(lo: float | None = None, hi: float | None = None) -> str:
    """What :func:`ranged_int` allows, in words: ``an integer in [1, 65535]``, ``an integer >= 1``, ``an
    integer <= 3`` or ``an integer`` (also for a caller that words its own refusal, as the inspector's message
    checks do)."""
    if lo is not None and hi is not None:
        return f"an integer in [{_fmt(lo)}, {_fmt(hi)}]"
    if lo is not None:
        return f"an integer >= {_fmt(lo)}"
    if hi is not None:
        return f"an integer <= {_fmt(hi)}"
    return "an integer"


def ranged_int(
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    label: str = "",
    knob: str | None = None,
    strict: bool = False,
) -> int:
    """The one rule for an integer in ``[lo, hi]`` (a missing bound: unbounded on that side), used by every
    integer knob (:meth:`Knob.convert`), the command line's options and the sweep grids.

    Accepted: an ``int`` or any other integral number (never a ``bool``), an integral ``float`` (``4.0``) and
    the text of an integer (surrounding blanks allowed, ``int()``'s syntax). With ``strict``, only an
    integral number that is not a float: what a JSON message's integer is, refusing ``"12"`` and ``4.0``.

    Raises :class:`~specviz.errors.KnobError` (``knob``, ``value`` set) whose message is ``LABEL: VALUE is not
    allowed; expected an integer in [LO, HI]``, without ``LABEL: `` when no label is given, so that a caller
    can put it after its own prefix.
    """
    head = f"{label}: " if label else ""
    bad = KnobError(f"{head}{value!r} is not allowed; expected {int_range_text(lo, hi)}", knob=knob, value=value)
    if isinstance(value, bool):
        raise bad
    if isinstance(value, str) and not strict:
        try:
            v = int(value.strip())
        except ValueError:
            raise bad from None
    elif isinstance(value, float) and not strict:
        if not value.is_integer():
            raise bad
        v = int(value)
    elif isinstance(value, numbers.Integral):
        v = int(value)
    else:
        raise bad
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise bad
    return v


def validate(
    schema: Iterable[Knob], values: Mapping[str, Any], *, base: Mapping[str, Any] | None = None, owner: str = "strategy"
) -> dict[str, Any]:
    """Validate ``values`` against ``schema`` on top of ``base`` (or the defaults).

    Returns a new complete mapping (every knob of the schema). Raises :class:`KnobError` for an unknown
    name or a bad value; the inputs are never modified.
    """
    by_name = {k.name: k for k in schema}
    out = dict(base) if base is not None else {k.name: k.default for k in by_name.values()}
    for key in by_name:
        out.setdefault(key, by_name[key].default)
    for name, value in values.items():
        knob = by_name.get(name)
        if knob is None:
            known = ", ".join(sorted(by_name)) or "none"
            raise KnobError(f"unknown knob {name!r} for {owner}; known knobs: {known}", knob=name, value=value)
        out[name] = knob.convert(value)
    return out


def check_cross_knobs(knobs: Mapping[str, Any]) -> None:
    """The rules between knobs that no single knob's range can state, on a validated configuration:
    ``draft_min <= draft_max``. Raises :class:`KnobError` naming ``draft_min`` otherwise.

    The session checks every configuration with it; the CLI and sweep grids call it too, so the rule is
    written once. A configuration without the shared draft-length knobs (strategy ``none``) passes.
    """
    lo, hi = knobs.get("draft_min"), knobs.get("draft_max")
    if lo is not None and hi is not None and lo > hi:
        raise KnobError(
            f"knob 'draft_min': {lo} is larger than draft_max={hi}; set draft_min <= draft_max",
            knob="draft_min",
            value=lo,
        )


@dataclass(frozen=True)
class Schema:
    """A named, ordered collection of knobs (a strategy's or the session's)."""

    owner: str
    knobs: tuple[Knob, ...] = field(default_factory=tuple)

    def names(self) -> list[str]:
        """Knob names in declaration order."""
        return [k.name for k in self.knobs]

    def defaults(self) -> dict[str, Any]:
        """Default value of every knob."""
        return {k.name: k.default for k in self.knobs}

    def validate(self, values: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """See :func:`validate`."""
        return validate(self.knobs, values, base=base, owner=self.owner)

    def to_list(self) -> list[dict[str, Any]]:
        """JSON-serialisable description of every knob."""
        return [k.to_dict() for k in self.knobs]


#: Knobs every strategy shares: how long a draft may be and how the length is chosen each round.
DRAFT_MAX_LIMIT = 1024

SESSION_KNOBS: tuple[Knob, ...] = (
    Knob(
        "draft_max",
        int,
        16,
        "maximum number of draft tokens per round (capped each round by the "
        "remaining budget, the free context and n_batch)",
        lo=1,
        hi=DRAFT_MAX_LIMIT,
        aliases=("--num-draft-tokens", "--draft", "--spec-draft-n-max"),
    ),
    Knob(
        "draft_min",
        int,
        0,
        "minimum draft length; a shorter proposal is dropped (not verified)",
        lo=0,
        hi=DRAFT_MAX_LIMIT,
        aliases=("--spec-draft-n-min",),
    ),
    Knob(
        "draft_policy",
        str,
        "fixed",
        "how each round's draft length is chosen: fixed (draft_max), adaptive "
        "(+2 after a fully accepted draft, -1 otherwise) or cost (maximise expected tokens/s from the "
        "measured verify cost)",
        choices=("fixed", "adaptive", "cost"),
    ),
    Knob(
        "align",
        bool,
        True,
        "verify-tile alignment: shorten a proposal so the draft plus the last token fit "
        "in one micro-batch (n_ubatch), so one verify is one forward, and round that batch down to a "
        "multiple of verify_tile rows",
    ),
    Knob(
        "verify_tile",
        int,
        4,
        "rows of the target's batch kernel (with align): a verify batch longer than "
        "this is rounded down to a multiple of it. llama.cpp's CPU kernels for quantised weights process "
        "a batch four rows at a time and the rows left over each read every weight again, so a batch of 17 "
        "costs more than one of 16; 1 turns the rounding off",
        lo=1,
        hi=64,
    ),
)
