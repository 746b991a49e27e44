"""A deployment's context settings — flash attention, KV cache types, context and batch sizes, threads —
validated in Python before llama.cpp sees them.

The numerics and the speed of a generation depend on how its llama.cpp context was created, not only on
the model: flash attention on or off changes the attention kernels (greedy outputs of the two part at
near-ties), a quantized KV cache (``-ctk/-ctv q8_0``) changes both speed and acceptance. To reproduce a
``llama-server`` deployment, a session's contexts are created with the same settings, spelled as
llama.cpp spells them (``common/arg.cpp``): ``-fa on|off|auto``, ``-ctk`` / ``-ctv`` TYPE, ``-c``, ``-b``,
``-ub``, ``-t``.

What llama.cpp (the version llama-cpp-python 0.3.36 vendors) accepts, checked here so that a refused value
raises a typed error instead of a NULL context or an abort (``src/llama-context.cpp``,
``llama_init_from_model``):

* cache types: the list of ``common/arg.cpp``'s ``kv_cache_types`` (f32, f16, bf16, q8_0, q4_0, q4_1,
  iq4_nl, q5_0, q5_1);
* a quantized V cache needs flash attention: with ``-fa off`` llama.cpp refuses the context, with
  ``auto`` it turns flash attention on;
* with flash attention, a quantized K (V) cache needs every layer's K (V) head size to be a multiple of
  the type's block size (32 for all of the quantized types above). Without flash attention llama.cpp does
  not check this and a non-multiple would reach ggml's row views: refused here in every case;
* ``n_ubatch <= n_batch`` (llama.cpp would lower ``n_ubatch`` silently).

Departure from llama.cpp: ``n_threads`` is one number for generation and batches (``-t``); llama.cpp has a
separate ``-tb``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, Mapping

from ..errors import ContextSettingsError

#: flash attention modes, as ``-fa`` takes them (llama.cpp also reads on/enabled/true/1 and off/disabled/false/0)
FLASH_ATTN = ("auto", "on", "off")
_FA_SYNONYMS = {
    "on": "on",
    "enabled": "on",
    "true": "on",
    "1": "on",
    "off": "off",
    "disabled": "off",
    "false": "off",
    "0": "off",
    "auto": "auto",
}
#: KV cache types ``-ctk`` / ``-ctv`` accept, with their ggml block size (1: not quantized)
CACHE_TYPES: dict[str, int] = {
    "f32": 1,
    "f16": 1,
    "bf16": 1,
    "q8_0": 32,
    "q4_0": 32,
    "q4_1": 32,
    "iq4_nl": 32,
    "q5_0": 32,
    "q5_1": 32,
}
#: the ggml type enum value of each cache type (``ggml.h``; llama-cpp-python's ``GGML_TYPE_*``)
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
#: llama.cpp's ``llama_flash_attn_type`` values
FLASH_ATTN_TYPE = {"auto": -1, "off": 0, "on": 1}


def _int(name: str, flag: str, value: Any, lo: int, hi: int = 1 << 24) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value), 10)
        except (TypeError, ValueError):
            raise ContextSettingsError(
                f"setting {name!r} ({flag}): {value!r} is not an integer; expected an integer in [{lo}, {hi}]",
                knob=name,
                value=value,
            ) from None
    if not lo <= value <= hi:
        raise ContextSettingsError(
            f"setting {name!r} ({flag}): {value} is outside [{lo}, {hi}]; pick a value in that range",
            knob=name,
            value=value,
        )
    return int(value)


def flash_attn_mode(value: Any) -> str:
    """``on``, ``off`` or ``auto`` for any spelling llama.cpp's ``-fa`` accepts; otherwise
    :class:`~specviz.errors.ContextSettingsError`."""
    v = str(value).strip().lower() if not isinstance(value, bool) else ("on" if value else "off")
    if v not in _FA_SYNONYMS:
        raise ContextSettingsError(
            f"setting 'flash_attn' (-fa): {value!r} is not allowed; choose on, off or auto",
            knob="flash_attn",
            value=value,
        )
    return _FA_SYNONYMS[v]


def cache_type(name: str, flag: str, value: Any) -> str:
    """A KV cache type name as llama.cpp spells it; :class:`~specviz.errors.ContextSettingsError` for any other."""
    v = str(value).strip().lower()
    if v not in CACHE_TYPES:
        raise ContextSettingsError(
            f"setting {name!r} ({flag}): {value!r} is not a KV cache type llama.cpp accepts; choose one of "
            + ", ".join(CACHE_TYPES),
            knob=name,
            value=value,
        )
    return v


@dataclass(frozen=True)
class ContextSettings:
    """How a llama.cpp context is created (``n_threads`` None: every CPU core). Build it with
    :meth:`make`, which validates every value; :meth:`check_model` adds the checks that need the model."""

    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"

    #: setting -> llama.cpp's short flag
    FLAGS: ClassVar[dict[str, str]] = {
        "n_ctx": "-c",
        "n_batch": "-b",
        "n_ubatch": "-ub",
        "n_threads": "-t",
        "flash_attn": "-fa",
        "cache_type_k": "-ctk",
        "cache_type_v": "-ctv",
    }

    @classmethod
    def make(cls, base: ContextSettings | None = None, **values: Any) -> ContextSettings:
        """Settings from ``values`` (on top of ``base``, default the defaults), every one validated; an
        unknown name or a refused value raises :class:`~specviz.errors.ContextSettingsError` naming it."""
        unknown = sorted(set(values) - set(cls.FLAGS))
        if unknown:
            raise ContextSettingsError(
                f"unknown context setting {unknown[0]!r}; the settings are {', '.join(cls.FLAGS)}",
                knob=unknown[0],
                value=values[unknown[0]],
            )
        out: dict[str, Any] = {}
        for name, v in values.items():
            if v is None and name != "n_threads":
                continue
            flag = cls.FLAGS[name]
            if name in ("n_ctx", "n_batch", "n_ubatch"):
                out[name] = _int(name, flag, v, 8)
            elif name == "n_threads":
                out[name] = None if v is None else _int(name, flag, v, 1, 512)
            elif name == "flash_attn":
                out[name] = flash_attn_mode(v)
            else:
                out[name] = cache_type(name, flag, v)
        s = replace(base or cls(), **out)
        s.check()
        return s

    def check(self) -> None:
        """The rules that need no model: ``n_ubatch <= n_batch``, a quantized V cache needs flash attention."""
        if self.n_ubatch > self.n_batch:
            raise ContextSettingsError(
                f"setting 'n_ubatch' (-ub): {self.n_ubatch} is larger than n_batch (-b) {self.n_batch}; set -ub <= -b",
                knob="n_ubatch",
                value=self.n_ubatch,
            )
        if CACHE_TYPES[self.cache_type_v] > 1 and self.flash_attn == "off":
            raise ContextSettingsError(
                f"setting 'cache_type_v' (-ctv): a quantized V cache ({self.cache_type_v}) needs flash attention, "
                "and flash_attn is off; use -fa on (or auto), or an f16/bf16/f32 V cache",
                knob="cache_type_v",
                value=self.cache_type_v,
            )

    def check_model(self, head_k: int, head_v: int, n_ctx_train: int = 0) -> None:
        """The rules that need the model's K and V head sizes: a quantized cache type's block size must
        divide them (:func:`head_sizes` reads them from a GGUF)."""
        for name, head in (("cache_type_k", head_k), ("cache_type_v", head_v)):
            t = getattr(self, name)
            block = CACHE_TYPES[t]
            if block > 1 and head % block:
                flag = self.FLAGS[name]
                raise ContextSettingsError(
                    f"setting {name!r} ({flag}): {t} stores blocks of {block} values, which do not divide the "
                    f"model's {name[-1].upper()} head size {head}; use f16 (or bf16/f32) for this model",
                    knob=name,
                    value=t,
                )

    @property
    def v_needs_flash_attn(self) -> bool:
        """A quantized V cache: llama.cpp turns ``auto`` flash attention on for it."""
        return CACHE_TYPES[self.cache_type_v] > 1

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary (JSON-serialisable)."""
        return asdict(self)

    def changed(self) -> dict[str, Any]:
        """The settings that differ from the defaults."""
        d = ContextSettings()
        return {k: v for k, v in self.to_dict().items() if getattr(d, k) != v}

    def server_args(self, *, include_defaults: bool = True) -> list[str]:
        """The settings as ``llama-server`` arguments (llama.cpp's short spellings; ``-tb`` follows ``-t``).

        With ``include_defaults`` every setting is written: llama-server's own defaults differ from
        specviz's (its ``-c`` is the model's training context, ``-b`` 2048), so a reproduction names them."""
        items = self.to_dict() if include_defaults else self.changed()
        out: list[str] = []
        for name, v in items.items():
            if v is None:
                continue
            out += [self.FLAGS[name], str(v)]
            if name == "n_threads":
                out += ["-tb", str(v)]
        return out

    def describe(self) -> str:
        """One line: ``-fa auto -ctk f16 -ctv f16 -c 4096 -b 512 -ub 512 -t 2``."""
        order = ("flash_attn", "cache_type_k", "cache_type_v", "n_ctx", "n_batch", "n_ubatch", "n_threads")
        return " ".join(f"{self.FLAGS[k]} {getattr(self, k)}" for k in order if getattr(self, k) is not None)


def head_sizes(metadata: Mapping[str, Any], architecture: str | None) -> tuple[int, int]:
    """The K and V head sizes of a model from its GGUF metadata (``ARCH.attention.key_length`` /
    ``value_length``, else the embedding width over the head count)."""
    a = architecture or ""

    def first(key: str) -> Any:
        v = metadata.get(f"{a}.{key}")
        return v[0] if isinstance(v, (list, tuple)) and v else v

    n_embd = first("embedding_length") or 0
    n_head = first("attention.head_count") or 1
    default = int(n_embd) // max(int(n_head), 1) if n_embd else 0
    k = first("attention.key_length") or default
    v = first("attention.value_length") or k
    return int(k), int(v)


def cache_types_for(head_k: int, head_v: int) -> list[str]:
    """The KV cache types whose blocks divide both head sizes (llama.cpp's list, in its order)."""
    return [t for t, block in CACHE_TYPES.items() if head_k % block == 0 and head_v % block == 0]


def settings_from_mapping(values: Mapping[str, Any], base: ContextSettings | None = None) -> ContextSettings:
    """:meth:`ContextSettings.make` from a mapping that may hold other keys too (those are ignored)."""
    return ContextSettings.make(base, **{k: v for k, v in values.items() if k in ContextSettings.FLAGS})
