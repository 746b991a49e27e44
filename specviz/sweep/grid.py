"""The settings a sweep runs: strategies x knob values x temperatures x draft models, ``none`` always in.

A :class:`GridSpec` holds the raw values from the command line or a small TOML / YAML file (see
:func:`read_grid_file`); :func:`build_grid` validates it against the strategies' knob schemas — before
any model loads — and expands it into :class:`Setting` objects.

* Every strategy gets the product of the values given for the knobs it has. ``knobs`` maps a knob name
  to its values (for every strategy that has that knob), or a strategy name to such a mapping (that
  strategy only; on the command line ``--knob STRATEGY:NAME=V1,V2``).
* Each draft model adds one ``draft`` setting family with ``draft_model`` set to it.
* Every setting runs at every temperature; ``none`` at each temperature is the baseline the others at
  that temperature are paired with.

A file looks like this (TOML; YAML with the same keys works when PyYAML is installed)::

    strategies = ["prompt-lookup", "ngram-simple"]
    temperatures = [0.0]
    max_tokens = 128
    repeats = 1

    [knobs]
    draft_max = [4, 8]

    [knobs.prompt-lookup]
    max_ngram = [2, 3]
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..decoding.knob_schema import Knob, check_cross_knobs, ranged_int
from ..errors import KnobError, SpecvizError
from ..strategies import check_knob_rules, strategy_class, strategy_names, strategy_schema

#: Keys a grid file may hold.
GRID_KEYS = ("strategies", "knobs", "temperatures", "draft_models", "max_tokens", "repeats", "seed")

_TEMPERATURE = Knob("temperature", float, 0.0, "sampling temperature", lo=0.0, hi=100.0)


class GridError(SpecvizError, ValueError):
    """A grid value was refused; ``option`` names where it came from (a flag, or the grid file and key)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"option {option}: {message}")
        self.option = option


@dataclass(frozen=True)
class Setting:
    """One point of the grid: a strategy, the knob values set explicitly, and a temperature."""

    strategy: str
    knobs: tuple[tuple[str, Any], ...] = ()
    temperature: float = 0.0

    @property
    def knob_dict(self) -> dict[str, Any]:
        """The explicitly set knobs (the session fills in every other default)."""
        return dict(self.knobs)

    @property
    def label(self) -> str:
        """Short display name, e.g. ``prompt-lookup draft_max=8 max_ngram=3 T=0.7``."""
        parts = [self.strategy] + [f"{k}={v}" for k, v in self.knobs]
        if self.temperature:
            parts.append(f"T={self.temperature:g}")
        return " ".join(parts)

    @property
    def key(self) -> str:
        """Stable identity (JSON) of the setting, used to pair rows and to resume."""
        return json.dumps(
            {"strategy": self.strategy, "knobs": dict(self.knobs), "temperature": float(self.temperature)},
            sort_keys=True,
        )

    @property
    def is_baseline(self) -> bool:
        """True for ``none``, the baseline the other settings are compared with."""
        return self.strategy == "none"


@dataclass
class GridSpec:
    """Raw grid values (strings or numbers) as given on the command line or in a grid file.

    ``origin`` maps a field name to how it was given (``--strategy``, ``--grid sweep.toml: knobs``),
    so a refusal names the right place.
    """

    strategies: list[str] = field(default_factory=list)
    knobs: dict[str, Any] = field(default_factory=dict)
    temperatures: list[Any] = field(default_factory=list)
    draft_models: list[str] = field(default_factory=list)
    max_tokens: Any = None
    repeats: Any = None
    seed: Any = None
    origin: dict[str, str] = field(default_factory=dict)

    def where(self, name: str) -> str:
        """The option or file key that gave field ``name``."""
        flags = {
            "strategies": "--strategy",
            "knobs": "--knob",
            "temperatures": "--temperature",
            "draft_models": "--draft-model",
        }
        return self.origin.get(name, flags.get(name, "--" + name.replace("_", "-")))


@dataclass
class Grid:
    """The validated grid: settings (``none`` first at each temperature) and the run-wide values."""

    settings: list[Setting]
    max_tokens: int = 128
    repeats: int = 1
    seed: int = 0

    def temperatures(self) -> list[float]:
        """The temperatures, in the order given."""
        return list(dict.fromkeys(s.temperature for s in self.settings))

    def at(self, temperature: float) -> list[Setting]:
        """The settings at ``temperature``, ``none`` first."""
        return [s for s in self.settings if s.temperature == temperature]


def default_strategies() -> list[str]:
    """The strategies a grid has when none are named: every draftless one."""
    return [n for n in strategy_names() if not strategy_class(n).needs_model]


def parse_knob_flag(text: str) -> tuple[str | None, str, list[str]]:
    """``[STRATEGY:]NAME=V1,V2`` -> (strategy or None, knob name, values); GridError when malformed."""
    head, sep, values = text.partition("=")
    strategy, colon, name = head.rpartition(":")
    name = name.strip().lstrip("-").replace("-", "_")
    vals = [v.strip() for v in values.split(",")]
    if not sep or not name or any(v == "" for v in vals):
        raise GridError(
            "--knob", f"{text!r} is not allowed; expected NAME=V1,V2 or STRATEGY:NAME=V1,V2 (for example draft_max=4,8)"
        )
    return (strategy.strip() if colon else None), name, vals


def read_grid_file(path: str | Path) -> GridSpec:
    """A :class:`GridSpec` from a ``.toml``, ``.yaml`` or ``.yml`` file (relative draft paths: from its folder)."""
    p = Path(path)
    opt = f"--grid {path}"
    if not p.is_file():
        raise GridError("--grid", f"{str(path)!r} does not exist; pass a .toml or .yaml grid file")
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        elif suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ModuleNotFoundError:
                raise GridError(
                    "--grid", "reading a YAML grid needs PyYAML (pip install pyyaml); or write the grid as TOML"
                ) from None
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        else:
            raise GridError("--grid", f"{str(path)!r} is not allowed; expected a .toml, .yaml or .yml file")
    except GridError:
        raise
    except (ValueError, UnicodeDecodeError, OSError) as e:  # TOMLDecodeError is a ValueError; its text has the line
        raise GridError(opt, f"cannot be parsed ({e})") from None
    except Exception as e:  # noqa: BLE001 - PyYAML's errors (yaml.YAMLError) when PyYAML is the parser
        raise GridError(opt, f"cannot be parsed ({e})") from None
    if not isinstance(data, dict):
        raise GridError(opt, "expected a table of keys: " + ", ".join(GRID_KEYS))
    unknown = sorted(set(data) - set(GRID_KEYS))
    if unknown:
        raise GridError(opt, f"unknown key {unknown[0]!r}; allowed keys: {', '.join(GRID_KEYS)}")
    spec = GridSpec()
    for name in ("strategies", "temperatures", "draft_models"):
        if name in data:
            v = data[name]
            spec.__setattr__(name, list(v) if isinstance(v, list) else [v])
            spec.origin[name] = f"{opt}: {name}"
    spec.draft_models = [str(d if Path(str(d)).is_absolute() else p.parent / str(d)) for d in spec.draft_models]
    if "knobs" in data:
        if not isinstance(data["knobs"], dict):
            raise GridError(f"{opt}: knobs", "expected a table of knob names to lists of values")
        spec.knobs = dict(data["knobs"])
        spec.origin["knobs"] = f"{opt}: knobs"
    for name in ("max_tokens", "repeats", "seed"):
        if name in data:
            setattr(spec, name, data[name])
            spec.origin[name] = f"{opt}: {name}"
    return spec


def _int(where: str, value: Any, lo: int, hi: int) -> int:
    """``value`` through the knob schema's ranged-integer rule; refused as a :class:`GridError` naming ``where``."""
    try:
        return ranged_int(value, lo, hi)
    except KnobError as e:
        raise GridError(where, str(e)) from None


def _values(where: str, raw: Any) -> list[Any]:
    vals = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not vals:
        raise GridError(where, "an empty list of values is not allowed; give at least one value")
    return vals


def build_grid(spec: GridSpec) -> Grid:
    """Validate ``spec`` and expand it into a :class:`Grid`; :class:`GridError` names what was refused.

    The steps, in the order their refusals come: the strategies and draft models, the knob tables, the
    temperatures, every strategy's settings, then the run-wide integers.
    """
    strategies, drafts = _grid_strategies(spec)
    shared, own = _knob_tables(spec, strategies)
    temps = _temperatures(spec)
    families: list[Setting] = []
    for strat in strategies:
        families += _strategy_settings(spec, strat, shared, own.get(strat, {}), drafts)
    settings = [Setting(f.strategy, f.knobs, t) for t in temps for f in dict.fromkeys(families)]
    max_tokens = 128 if spec.max_tokens is None else _int(spec.where("max_tokens"), spec.max_tokens, 1, 1 << 20)
    repeats = 1 if spec.repeats is None else _int(spec.where("repeats"), spec.repeats, 1, 1000)
    seed = 0 if spec.seed is None else _int(spec.where("seed"), spec.seed, 0, 2**63 - 1)
    return Grid(settings, max_tokens, repeats, seed)


def _grid_strategies(spec: GridSpec) -> tuple[list[str], list[str]]:
    """The grid's strategies (``none`` first, ``draft`` when a draft model is given) and its draft models."""
    names = strategy_names()
    strategies: list[str] = []
    for s in spec.strategies:
        for part in str(s).split(","):
            part = part.strip()
            if part not in names:
                raise GridError(spec.where("strategies"), f"{part!r} is not allowed; choose among: {', '.join(names)}")
            if part not in strategies:
                strategies.append(part)
    drafts = [str(d) for d in spec.draft_models]
    for d in drafts:
        if not Path(d).is_file():
            raise GridError(spec.where("draft_models"), f"{d!r} does not exist; pass the path of a draft .gguf file")
    if not strategies:
        strategies = ["draft"] if drafts else default_strategies()
    if drafts and "draft" not in strategies:
        strategies.append("draft")  # each draft model is a setting family of the draft strategy
    if "draft" in strategies and not drafts:
        raise GridError(spec.where("strategies"), "'draft' needs a draft model; add --draft-model PATH")
    return ["none"] + [s for s in strategies if s != "none"], drafts


def _knob_tables(spec: GridSpec, strategies: list[str]) -> tuple[dict[str, list[Any]], dict[str, dict[str, list[Any]]]]:
    """The knob values: shared ones (knob name -> values, for every strategy having the knob) and per
    strategy (strategy -> {knob name: values}); each name checked against the strategies in the grid."""
    names = strategy_names()
    shared: dict[str, list[Any]] = {}
    own: dict[str, dict[str, list[Any]]] = {}
    knob_where = spec.where("knobs")
    for name, raw in spec.knobs.items():
        if name in names:
            if not isinstance(raw, dict):
                raise GridError(f"{knob_where} {name}", "expected a table of knob names to lists of values")
            own[name] = {str(k).replace("-", "_"): _values(f"{knob_where} {name}:{k}", v) for k, v in raw.items()}
            if name not in strategies:
                raise GridError(
                    f"{knob_where} {name}",
                    f"strategy {name!r} is not in the grid; add it with --strategy or drop its knobs",
                )
        else:
            shared[str(name).replace("-", "_")] = _values(f"{knob_where} {name}", raw)
    for name in list(shared) + [k for d in own.values() for k in d]:
        if name == "draft_model":
            raise GridError(knob_where, "draft_model is not allowed here; give draft models with --draft-model")
    for name in shared:
        if not any(name in strategy_schema(s).names() for s in strategies if s != "none"):
            holders = ", ".join(sorted({s for s in strategies if s != "none"})) or "only none, which has no knobs"
            raise GridError(
                f"{knob_where} {name}",
                f"no strategy in the grid ({holders}) has a knob {name!r}; `specviz strategies` lists each "
                "strategy's knobs",
            )
    for strat, table in own.items():
        for name in table:
            if name not in strategy_schema(strat).names():
                raise GridError(
                    f"{knob_where} {strat}:{name}",
                    f"strategy {strat!r} has no knob {name!r}; its knobs: "
                    f"{', '.join(strategy_schema(strat).names()) or 'none'}",
                )
    return shared, own


def _temperatures(spec: GridSpec) -> list[float]:
    """The temperatures, each once, in the order given (default: greedy only)."""
    temps: list[float] = []
    for t in spec.temperatures or [0.0]:
        try:
            v = float(_TEMPERATURE.convert(t))
        except KnobError:
            raise GridError(
                spec.where("temperatures"), f"{t!r} is not allowed; expected {_TEMPERATURE.describe_range()}"
            ) from None
        if not math.isfinite(v):
            raise GridError(spec.where("temperatures"), f"{t!r} is not allowed; expected a finite number")
        if v not in temps:
            temps.append(v)
    return temps


def _strategy_settings(
    spec: GridSpec, strat: str, shared: dict[str, list[Any]], own: dict[str, list[Any]], drafts: list[str]
) -> list[Setting]:
    """One strategy's settings (temperature aside): the product of the values of its knobs in the grid,
    times its draft models for ``draft``; each combination validated and checked by the strategy."""
    schema = strategy_schema(strat)
    varied = {k: v for k, v in shared.items() if k in schema.names()}
    varied.update(own)
    extra = [[("draft_model", d)] for d in drafts] if strat == "draft" else [[]]
    names = list(varied)
    out: list[Setting] = []
    for combo in itertools.product(*(varied[n] for n in names)):
        for ext in extra:
            converted = _converted_knobs(spec, strat, dict(zip(names, combo)), own)
            _check_setting(spec, strat, converted, ext)
            out.append(Setting(strat, tuple(converted.items()) + tuple(ext)))
    return out


def _converted_knobs(spec: GridSpec, strat: str, given: dict[str, Any], own: dict[str, list[Any]]) -> dict[str, Any]:
    """``given`` converted to the knobs' types; a refusal names the table the value came from."""
    schema = strategy_schema(strat)
    knob_where = spec.where("knobs")
    try:
        return {k: schema.validate({k: v})[k] for k, v in given.items()}
    except KnobError as e:
        place = f"{knob_where} {strat}:{e.knob}" if e.knob in own else f"{knob_where} {e.knob}"
        raise GridError(place, str(e).split(": ", 1)[-1]) from None


def _check_setting(spec: GridSpec, strat: str, converted: dict[str, Any], ext: list[tuple[str, str]]) -> None:
    """The strategy's own check of a whole setting, and draft_min <= draft_max."""
    knob_where = spec.where("knobs")
    full = strategy_schema(strat).validate({**converted, **dict(ext)})
    try:
        check_knob_rules(strategy_class(strat), full)
    except KnobError as e:
        raise GridError(
            knob_where if not ext else spec.where("draft_models"),
            f"{strat} with {converted or 'its defaults'}: {e}",
        ) from None
    try:
        check_cross_knobs(full)  # the one draft_min <= draft_max rule; the grid words the refusal its way
    except KnobError:
        raise GridError(
            knob_where,
            f"draft_min {full['draft_min']} is larger than draft_max {full['draft_max']} in {strat} {converted}",
        ) from None
