"""A whole ``llama-server`` command line, read into the configuration specviz runs — and the other way round.

:func:`parse_server_args` takes the command line a deployment runs (``llama-server -m model.gguf
--spec-type ngram-map-k4v -c 8192 -fa on -ctk q8_0 ...``) and returns a :class:`ServerConfig`: the model,
the strategy and its knobs, the context settings (:class:`~specviz.backends.context_settings.ContextSettings`)
and the sampling defaults, with llama.cpp's defaults (``common/common.h``) wherever the line gives none.
Every value is validated before any model loads (typed errors naming the flag). A flag specviz cannot
honour is never dropped silently: it is named in :attr:`ServerConfig.warnings` with the reason — serving
options that change neither the tokens nor the drafts (``--port``, ``--metrics`` ...) as well
as those that would change them (``--min-p``, ``-ctkd`` ...). ``-np N`` is applied: a request log runs N
requests at a time in N slots (:class:`~specviz.decoding.batch.BatchRun`), ``-c`` being the whole cache split
over them as llama.cpp splits it (``-kvu``: one pool every slot draws on).

``--spec-type`` is read with the strategies' own resolution (:func:`specviz.strategies.resolve_strategy`,
the same as the CLI's ``--spec-type``): llama.cpp's names only (``draft-simple`` ... ``draft-dspark``,
``ngram-*``), and a comma list — or a repeated ``--spec-type``, which llama.cpp's parser adds up — is a
chain asked in llama.cpp's priority order, each type's ``--spec-*`` flags setting that member's knobs
(:mod:`specviz.strategies.chain` names them). Refused as llama-server refuses them: a name it does not
know; refused by specviz: a chain of two model drafters (llama.cpp has one draft context).

:func:`server_spec_args` is the inverse for the speculative part: a specviz strategy and knobs as the
``llama-server`` flags that draft the same way.

How specviz runs a llama-server configuration (each a deliberate difference named where it applies):

* an n-gram type drafts up to its own length (``size_m``, ``n_max``, 8 for ngram-cache): llama.cpp's
  ``--spec-draft-n-max`` caps model drafts only, so ``draft_max`` is set to the type's own length; verify-tile
  alignment (specviz's own) is off and the policy is ``fixed``;
* a model draft (``draft-simple``, ``-eagle3``, ``-mtp``, ``-dflash``, ``-dspark``) takes llama.cpp's
  defaults ``--spec-draft-n-max 3``, ``--spec-draft-n-min 0`` and ``--spec-draft-p-min 0`` when the line
  gives none (specviz's own defaults are 16 and 0.75);
* a chain of n-gram types drafts up to its longest member's length (each member stops at its own); a chain
  holding a model drafter caps every member at ``--spec-draft-n-max`` (llama.cpp caps the model drafter
  only) and applies ``--spec-draft-n-min`` to whichever member drafts: both named in a warning;
* DFlash / DSpark decode the whole trained block and keep the first ``--spec-draft-n-max`` tokens
  (llama.cpp decodes that many masks): named in a warning;
* ``-ngl`` places the model as llama.cpp does (N, ``all``); ``auto``, llama-server's default when the line gives
  no ``-ngl``, puts every layer on a GPU build's GPU (llama.cpp also fits them into free memory) and none on a
  CPU build; a draft model goes where the target is (``-ngld`` is named in a warning where it differs);
* ``--grammar``, ``--grammar-file``, ``-j`` and ``-jf`` constrain every request as they do the server's
  (llama.cpp's grammar sampler; a schema converted by llama-cpp-python's port of the server's converter);
* the server samples the first token after the prompt without drafting; :mod:`specviz.analysis.server_repro`
  reproduces that loop.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..backends.context_settings import ContextSettings
from ..backends.devices import auto_gpu_layers, gpu_layers_value
from ..backends.grammar import GRAMMAR_FLAGS, grammar_of_flag
from ..errors import KnobError, StrategyError
from ..strategies import (
    SPEC_TYPES,
    draft_model_strategy,
    member_knob_names,
    per_type_flags,
    resolve_strategy,
    spec_type,
    strategy_class,
    strategy_schema,
)

#: llama.cpp's defaults for model drafts (``common_params_speculative_draft``)
LLAMA_DRAFT_DEFAULTS = {"draft_max": 3, "draft_min": 0, "draft_p_min": 0.0}
#: llama-server's default sampling (``common_params_sampling``): what a request gets unless it says otherwise
LLAMA_SAMPLING_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95}

#: per-type flags -> (strategy, knob): the knobs' own llama.cpp spellings (``--spec-ngram-mod-n-max`` ...)
SPEC_FLAGS: dict[str, tuple[str, str]] = per_type_flags()
#: model-draft flags -> knob (they serve every model-backed type alike: draft-simple ... draft-dspark)
DRAFT_FLAGS = {
    "--spec-draft-n-max": "draft_max",
    "--spec-draft-n-min": "draft_min",
    "--spec-draft-p-min": "draft_p_min",
    "--draft-p-min": "draft_p_min",
}
#: context settings -> the setting
SETTING_FLAGS = {
    "-c": "n_ctx",
    "--ctx-size": "n_ctx",
    "-b": "n_batch",
    "--batch-size": "n_batch",
    "-ub": "n_ubatch",
    "--ubatch-size": "n_ubatch",
    "-t": "n_threads",
    "--threads": "n_threads",
    "-fa": "flash_attn",
    "--flash-attn": "flash_attn",
    "-ctk": "cache_type_k",
    "--cache-type-k": "cache_type_k",
    "-ctv": "cache_type_v",
    "--cache-type-v": "cache_type_v",
}
SAMPLING_FLAGS = {"--temp": "temperature", "--temperature": "temperature", "--top-k": "top_k", "--top-p": "top_p"}
MODEL_FLAGS = ("-m", "--model")
#: the model's placement, and the draft model's (specviz puts a draft model where the target is)
GPU_LAYERS_FLAGS = ("-ngl", "--gpu-layers", "--n-gpu-layers")
DRAFT_GPU_LAYERS_FLAGS = ("-ngld", "--spec-draft-ngl", "--gpu-layers-draft", "--n-gpu-layers-draft")
DRAFT_MODEL_FLAGS = ("-md", "--model-draft", "--spec-draft-model")

#: the slots (``-np``: requests run at once, ``-c`` split over them) and their cache (``-kvu``: one unified pool)
PARALLEL_FLAGS = ("-np", "--parallel")
KV_UNIFIED_FLAGS = {"-kvu": True, "--kv-unified": True, "-no-kvu": False, "--no-kv-unified": False}
#: options that change neither the tokens nor the drafts of one request at a time (value-taking ones True)
SERVING_ONLY: dict[str, bool] = {
    **dict.fromkeys(("--host", "--port", "--path", "--api-key", "--api-key-file", "-a", "--alias"), True),
    **dict.fromkeys(("--timeout", "-to", "--threads-http", "--log-file", "-lv", "--verbosity"), True),
    **dict.fromkeys(("--cache-reuse", "-cram", "--cache-ram"), True),
    **dict.fromkeys(("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", "--sleep-idle-seconds"), True),
    **dict.fromkeys(("--reasoning-format", "--reasoning-budget", "-fit", "--fit", "--numa", "--prio"), True),
    **dict.fromkeys(("--metrics", "--slots", "--no-slots", "--props", "--no-webui", "--no-ui", "--webui"), False),
    **dict.fromkeys(("-cb", "--cont-batching", "-nocb", "--no-cont-batching"), False),
    **dict.fromkeys(("--mlock", "--no-mmap", "--mmap", "--jinja", "--no-jinja"), False),
    **dict.fromkeys(("--log-disable", "--log-colors", "--log-prefix", "--log-timestamps", "-v"), False),
    **dict.fromkeys(("--verbose", "--no-warmup", "--warmup", "--no-perf", "--perf", "-fitt"), False),
}
#: options that would change the tokens or the drafts, which specviz does not reproduce (value-taking ones True)
NOT_REPRODUCED: dict[str, tuple[bool, str]] = {
    "--min-p": (True, "specviz samples with temperature, top-k and top-p only"),
    "--typical": (True, "specviz samples with temperature, top-k and top-p only"),
    "--repeat-penalty": (True, "specviz applies no repetition penalty"),
    "--presence-penalty": (True, "specviz applies no presence penalty"),
    "--frequency-penalty": (True, "specviz applies no frequency penalty"),
    "--dry-multiplier": (True, "specviz has no DRY sampler"),
    "--mirostat": (True, "specviz has no mirostat sampler"),
    "--samplers": (True, "specviz's sampler chain is fixed (top-k, top-p, temperature)"),
    "-ctkd": (True, "the draft model's context keeps an f16 cache in specviz"),
    "--spec-draft-type-k": (True, "the draft model's context keeps an f16 cache in specviz"),
    "--cache-type-k-draft": (True, "the draft model's context keeps an f16 cache in specviz"),
    "-ctvd": (True, "the draft model's context keeps an f16 cache in specviz"),
    "--spec-draft-type-v": (True, "the draft model's context keeps an f16 cache in specviz"),
    "--cache-type-v-draft": (True, "the draft model's context keeps an f16 cache in specviz"),
    "--spec-draft-p-split": (True, "specviz drafts one sequence (no tree split)"),
    "--draft-p-split": (True, "specviz drafts one sequence (no tree split)"),
    "--spec-ngram-simple-min-hits": (True, "specviz's ngram-simple has no min_hits"),
    "--lora": (True, "specviz loads no LoRA adapters"),
    "--control-vector": (True, "specviz applies no control vectors"),
    "--rope-scaling": (True, "specviz uses the model's own RoPE settings"),
    "--rope-freq-base": (True, "specviz uses the model's own RoPE settings"),
    "--rope-freq-scale": (True, "specviz uses the model's own RoPE settings"),
    "--override-kv": (True, "specviz reads the model's metadata as it is"),
    "--spec-ngram-cache-static": (True, "specviz's ngram-cache learns from the session's own text"),
    "-lcs": (True, "specviz's ngram-cache learns from the session's own text"),
    "-lcd": (True, "specviz's ngram-cache learns from the session's own text"),
    "--chat-template-file": (True, "specviz applies the model's template or one of llama.cpp's built-in ones"),
    "--no-repack": (False, "specviz's contexts use llama.cpp's default weight repacking"),
    "-nr": (False, "specviz's contexts use llama.cpp's default weight repacking"),
    "--ignore-eos": (False, "specviz stops at the end-of-generation token"),
}


@dataclass
class ServerConfig:
    """A llama-server configuration as specviz runs it (see :func:`parse_server_args`)."""

    model: str | None
    strategy: str
    knobs: dict[str, Any]
    settings: ContextSettings
    given: dict[str, Any] = field(default_factory=dict)  #: the context settings the line gave
    sampling: dict[str, Any] = field(default_factory=dict)  #: temperature/top_k/top_p/seed the line gave
    n_predict: int | None = None  #: ``-n``: the server's default generation length
    chat_template: str | None = None  #: ``--chat-template``: a llama.cpp built-in template name
    #: ``--grammar`` / ``--grammar-file`` / ``-j`` / ``-jf``: the grammar every request obeys, as checked GBNF
    grammar: str | None = None
    #: ``--swa-full``: full-size caches for sliding-window layers; without it llama-server keeps llama.cpp's
    #: ring (``swa_full`` false), which changes the attention's numerics, so the tokens can part at a near-tie
    swa_full: bool = False
    #: ``-ngl``: the layers on a GPU build's GPU; None is llama.cpp's ``auto``, llama-server's default
    #: (:func:`~specviz.backends.devices.auto_gpu_layers`)
    n_gpu_layers: int | None = None
    gpu_layers_text: str | None = None  #: ``-ngl``'s value as the line gives it (None: the line gives none)
    #: ``-np``: the slots, requests run at once (:class:`~specviz.decoding.batch.BatchRun`), ``-c`` being the
    #: whole cache split over them; 1 where the line gives none or ``-np -1`` (llama-server's auto, 4 slots
    #: sharing one unified cache: specviz runs the requests one at a time, each with the whole cache)
    n_parallel: int = 1
    kv_unified: bool = False  #: ``-kvu``: one cache pool for every slot (each may hold up to ``-c`` positions)
    warnings: list[str] = field(default_factory=list)  #: flags specviz cannot honour, each named with why
    argv: list[str] = field(default_factory=list)

    def session_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~specviz.Session` for these settings: the context settings, the
        server's sliding-window cache (:attr:`swa_full`) and its prompt layout (``prefill="whole"``: the whole
        prompt in one prefill, the first token from its last row; see :class:`~specviz.Session`)."""
        s = self.settings
        return {
            **self.memory_kwargs(),
            "n_gpu_layers": self.gpu_layers(),
            "n_ctx": s.n_ctx,
            "n_batch": s.n_batch,
            "n_ubatch": s.n_ubatch,
            "n_threads": s.n_threads,
            "flash_attn": s.flash_attn,
            "cache_type_k": s.cache_type_k,
            "cache_type_v": s.cache_type_v,
        }

    @property
    def gpu_layers_given(self) -> bool:
        """Whether the line gives ``-ngl``."""
        return self.gpu_layers_text is not None

    def gpu_layers(self) -> int:
        """The layers specviz puts on the GPU for this line: ``-ngl``'s number, or ``auto`` (given or the
        default) as :func:`~specviz.backends.devices.auto_gpu_layers` reads it on this build."""
        return auto_gpu_layers() if self.n_gpu_layers is None else self.n_gpu_layers

    def memory_kwargs(self) -> dict[str, Any]:
        """The :class:`~specviz.Session` arguments beyond the context settings that make its numerics the
        server's: ``swa_full`` and ``prefill``."""
        return {"swa_full": self.swa_full, "prefill": "whole"}

    def start_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :meth:`~specviz.Session.start` (the strategy, its knobs, the sampling, the
        grammar)."""
        grammar = {"grammar": self.grammar} if self.grammar is not None else {}
        return {"strategy": self.strategy, **self.knobs, **self.sampling, **grammar}

    def warnings_one_at_a_time(self, runner: str) -> list[str]:
        """:attr:`warnings`, and ``-np N`` named as not applied where ``runner`` (``"a session"``, ``"replay"``
        …) runs one request at a time (``specviz run --requests`` applies it)."""
        if self.n_parallel <= 1:
            return list(self.warnings)
        return [
            *self.warnings,
            f"-np {self.n_parallel}: {runner} runs one request at a time; not applied (specviz run --requests "
            "runs them N at a time)",
        ]

    def spec_args(self) -> list[str]:
        """The speculative part as llama-server flags (:func:`server_spec_args`)."""
        return server_spec_args(self.strategy, self.knobs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {
            "model": self.model,
            "strategy": self.strategy,
            "knobs": dict(self.knobs),
            "settings": self.settings.to_dict(),
            "given": dict(self.given),
            "sampling": dict(self.sampling),
            "n_predict": self.n_predict,
            "chat_template": self.chat_template,
            "grammar": self.grammar,
            "swa_full": self.swa_full,
            "n_gpu_layers": self.n_gpu_layers,
            "n_parallel": self.n_parallel,
            "kv_unified": self.kv_unified,
            "warnings": list(self.warnings),
        }


def _split(argv: str | Sequence[str]) -> list[str]:
    args = shlex.split(argv) if isinstance(argv, str) else [str(a) for a in argv]
    if args and Path(args[0]).name.startswith("llama-server"):
        args = args[1:]  # the program itself
    return args


def _looks_like_value(tok: str) -> bool:
    return not tok.startswith("-") or tok[1:2].isdigit() or tok[1:2] == "."


def strategy_of_spec_types(values: Sequence[str]) -> str:
    """specviz's strategy for the ``--spec-type`` values of one command line (each a comma list; a repeated
    ``--spec-type`` adds its types, as llama.cpp's parser does): one strategy, or a chain in llama.cpp's
    priority order (:func:`specviz.strategies.resolve_strategy`). A value naming ``none`` adds nothing
    (llama.cpp reads it as the default list, ``none``, which enables no drafter).

    :class:`~specviz.errors.StrategyError` for a name that is not one of llama.cpp's types (llama-server
    refuses it too) and for a chain specviz does not run (two model-backed types)."""
    members: list[str] = []
    for v in values:
        for part in v.split(","):
            if part.strip() not in SPEC_TYPES.values():
                raise StrategyError(
                    f"--spec-type {v}: {part.strip()!r} is not one of llama.cpp's types; choose one of: "
                    + ", ".join(SPEC_TYPES.values())
                    + ", or a comma list of them",
                    knob="strategy",
                    value=v,
                )
        strategy = _resolved(v, v)
        if strategy != "none":
            members += strategy.split(",")
    return _resolved(",".join(members), ",".join(values)) if members else "none"


def _resolved(name: str, given: str) -> str:
    try:
        return resolve_strategy(name)
    except StrategyError as e:
        raise StrategyError(f"--spec-type {given}: {e}", knob="strategy", value=given) from None


def _member_configs(strategy: str, cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each member's own knobs (its own names) from a strategy's validated config."""
    return {
        m: {mine: cfg[ours] for mine, ours in names.items() if ours in cfg}
        for m, names in member_knob_names(strategy).items()
    }


@dataclass
class _Line:
    """A llama-server command line's flags as given, by group (nothing validated yet), and the warnings so
    far. ``pos`` is the token being read; :meth:`value` takes the next one as a flag's value."""

    args: list[str]
    warnings: list[str] = field(default_factory=list)
    pos: int = 0
    # the model and the speculative flags
    model: str | None = None
    draft_model: str | None = None
    types: list[str] = field(default_factory=list)  # each --spec-type value
    spec_values: dict[tuple[str, str], tuple[str, str]] = field(
        default_factory=dict
    )  # (strategy, knob) -> (flag, value)
    draft_values: dict[str, tuple[str, str]] = field(default_factory=dict)  # knob -> (flag, value)
    # the context settings and the placement
    settings: dict[str, tuple[str, str]] = field(default_factory=dict)
    threads_batch: str | None = None
    threads_draft: str | None = None
    swa_full: bool = False
    gpu_layers: str | None = None
    draft_gpu_layers: tuple[str, str] | None = None
    parallel: tuple[str, str] | None = None  # (flag, value) of -np
    kv_unified: bool | None = None
    # sampling and generation
    sampling: dict[str, tuple[str, str]] = field(default_factory=dict)
    n_predict: tuple[str, str] | None = None
    chat_template: str | None = None
    grammar: tuple[str, str] | None = None  # (flag, value); llama.cpp keeps the last one given

    def value(self, flag: str) -> str:
        """The value of ``flag`` (the next token); :class:`~specviz.errors.KnobError` at the line's end."""
        if self.pos + 1 >= len(self.args):
            raise KnobError(f"llama-server option {flag} needs a value", knob=flag)
        self.pos += 1
        return self.args[self.pos]


def _read_model_flag(line: _Line, tok: str) -> bool:
    """The model and speculative flags: whether ``tok`` is one (then it is read)."""
    if tok in MODEL_FLAGS:
        line.model = line.value(tok)
    elif tok in DRAFT_MODEL_FLAGS:
        line.draft_model = line.value(tok)
    elif tok == "--spec-type":
        line.types.append(line.value(tok))
    elif tok in SPEC_FLAGS:
        line.spec_values[SPEC_FLAGS[tok]] = (tok, line.value(tok))
    elif tok in DRAFT_FLAGS:
        line.draft_values[DRAFT_FLAGS[tok]] = (tok, line.value(tok))
    else:
        return False
    return True


def _read_context_flag(line: _Line, tok: str) -> bool:
    """The context settings and the placement flags: whether ``tok`` is one (then it is read)."""
    if tok in SETTING_FLAGS:
        line.settings[SETTING_FLAGS[tok]] = (tok, line.value(tok))
    elif tok in ("-tb", "--threads-batch"):
        line.threads_batch = line.value(tok)
    elif tok in ("-td", "--spec-draft-threads", "--threads-draft"):
        line.threads_draft = line.value(tok)
    elif tok == "--swa-full":
        line.swa_full = True
    elif tok in GPU_LAYERS_FLAGS:
        line.gpu_layers = line.value(tok)
    elif tok in DRAFT_GPU_LAYERS_FLAGS:
        line.draft_gpu_layers = (tok, line.value(tok))
    elif tok in PARALLEL_FLAGS:
        line.parallel = (tok, line.value(tok))
    elif tok in KV_UNIFIED_FLAGS:
        line.kv_unified = KV_UNIFIED_FLAGS[tok]
    else:
        return False
    return True


def _read_sampling_flag(line: _Line, tok: str) -> bool:
    """The sampling and generation flags: whether ``tok`` is one (then it is read)."""
    if tok in SAMPLING_FLAGS:
        line.sampling[SAMPLING_FLAGS[tok]] = (tok, line.value(tok))
    elif tok in ("-s", "--seed"):
        line.sampling["seed"] = (tok, line.value(tok))
    elif tok in ("-n", "--n-predict", "--predict"):
        line.n_predict = (tok, line.value(tok))
    elif tok == "--chat-template":
        line.chat_template = line.value(tok)
    elif tok in GRAMMAR_FLAGS:
        line.grammar = (tok, line.value(tok))
    else:
        return False
    return True


def _read_unapplied_flag(line: _Line, tok: str) -> bool:
    """Any other token, named in a warning: serving only, not reproduced, or unknown (an unknown option takes
    the next token as its value when it looks like one). Always True."""
    if tok in SERVING_ONLY:
        v = f" {line.value(tok)}" if SERVING_ONLY[tok] else ""
        line.warnings.append(
            f"{tok}{v}: serving only (changes neither the tokens nor the drafts of a request); not applied"
        )
    elif tok in NOT_REPRODUCED:
        takes, why = NOT_REPRODUCED[tok]
        v = f" {line.value(tok)}" if takes else ""
        line.warnings.append(f"{tok}{v}: not applied ({why}); the server's tokens or drafts may differ")
    else:
        v = ""
        if line.pos + 1 < len(line.args) and _looks_like_value(line.args[line.pos + 1]) and tok.startswith("-"):
            v = f" {line.value(tok)}"
        what = "option" if tok.startswith("-") else "argument"
        line.warnings.append(f"{tok}{v}: an {what} specviz does not know; not applied")
    return True


#: the groups of flags, asked in this order (the sets are disjoint; the last group takes any token)
_FLAG_GROUPS = (_read_model_flag, _read_context_flag, _read_sampling_flag, _read_unapplied_flag)


def _read_line(args: list[str]) -> _Line:
    """Every token of ``args`` read into its group (``--flag=value`` split as some launchers write it)."""
    line = _Line(args)
    while line.pos < len(args):
        tok = args[line.pos]
        flag, eq, inline = tok.partition("=")
        if eq and flag.startswith("--"):
            args[line.pos : line.pos + 1] = [flag, inline]
            tok = flag
        next(read for read in _FLAG_GROUPS if read(line, tok))
        line.pos += 1
    return line


def _model_members(strategy: str) -> list[str]:
    """The members of ``strategy`` (itself when it is no chain) that draft with a model."""
    return [m for m in member_knob_names(strategy) if strategy_class(m).needs_model]


def _strategy(line: _Line) -> str:
    """The strategy: one type, or a chain of them (the first that drafts wins, in llama.cpp's priority order);
    without ``--spec-type``, the draft model's own type or none."""
    if not line.types:
        return draft_model_strategy(line.draft_model) if line.draft_model else "none"
    return strategy_of_spec_types(line.types)


def _spec_knobs(line: _Line, strategy: str) -> dict[str, Any]:
    """The knobs the speculative flags give ``strategy`` (llama.cpp's draft defaults for a model drafter),
    not yet validated; a flag for another type, or a model-draft flag without a model drafter, is named in
    a warning."""
    name = spec_type(strategy) or strategy
    members = member_knob_names(strategy)
    knobs: dict[str, Any] = {}
    for (owner, knob), (flag, v) in line.spec_values.items():
        if owner not in members:
            line.warnings.append(f"{flag} {v}: for --spec-type {owner}, not {name}; not applied")
        else:
            knobs[members[owner][knob]] = v
    if strategy_class(strategy).needs_model:
        knobs.update(LLAMA_DRAFT_DEFAULTS)
        for knob, (_, v) in line.draft_values.items():
            knobs[knob] = v
        if line.draft_model is not None:
            knobs["draft_model"] = line.draft_model
        else:
            for m in _model_members(strategy):
                if not strategy_class(m).draft_model_optional and m != "draft":
                    # common_speculative_init enables these types only with a draft context
                    line.warnings.append(
                        f"--spec-type {SPEC_TYPES[m]} without -md: llama-server leaves {SPEC_TYPES[m]} out (it needs "
                        "a draft model); specviz needs one too: give -md"
                    )
        knobs["align"] = False
        knobs["draft_policy"] = "fixed"
    else:
        for flag, v in line.draft_values.values():
            if strategy != "none":
                line.warnings.append(f"{flag} {v}: llama.cpp applies it to model drafts only; not applied to {name}")
            else:
                line.warnings.append(f"{flag} {v}: no --spec-type drafts; not applied")
        if line.draft_model is not None:
            line.warnings.append(f"-md {line.draft_model}: --spec-type {name} does not draft with a model; not applied")
    return knobs


def _validated_knobs(line: _Line, strategy: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """``knobs`` validated by the strategy's schema; a refusal names the llama-server option that gave it."""
    members = member_knob_names(strategy)
    try:
        return strategy_schema(strategy).validate(knobs)
    except KnobError as e:
        bad = next(
            (f for (o, k), (f, _) in line.spec_values.items() if members.get(o, {}).get(k) == e.knob),
            next((f for k, (f, _) in line.draft_values.items() if k == e.knob), str(e.knob)),
        )
        msg = str(e).replace(f"knob {e.knob!r}", f"llama-server option {bad}", 1)
        raise KnobError(msg, knob=e.knob, value=e.value) from None


def _draft_lengths(line: _Line, strategy: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with an n-gram strategy's ``draft_max`` at its own length (llama.cpp's --spec-draft-n-max does
    not cap an n-gram type; a chain: its longest member's); where a model drafter's cap, minimum or block
    makes the drafts differ from llama.cpp's, a warning."""
    name = spec_type(strategy) or strategy
    model_members = _model_members(strategy)
    own = {m: own_draft_length(m, c) for m, c in _member_configs(strategy, cfg).items() if m not in model_members}
    if strategy != "none" and not model_members:
        cfg = strategy_schema(strategy).validate({**cfg, "draft_max": max(own.values())})
        cfg = strategy_schema(strategy).validate({**cfg, "align": False, "draft_policy": "fixed"})
    if model_members and any(n > int(cfg["draft_max"]) for n in own.values()):
        # departure: specviz's chain has one draft_max for every member
        longer = ", ".join(f"{SPEC_TYPES[m]} up to {n}" for m, n in own.items() if n > int(cfg["draft_max"]))
        line.warnings.append(
            f"--spec-type {name}: specviz caps every member of a chain at --spec-draft-n-max {cfg['draft_max']}; "
            f"llama.cpp caps only {SPEC_TYPES[model_members[0]]} and drafts {longer}: specviz's n-gram drafts may "
            "be shorter"
        )
    if model_members and own and int(cfg.get("draft_min", 0)) > 0:
        line.warnings.append(
            f"--spec-draft-n-min {cfg['draft_min']}: specviz applies it to whichever member drafts, llama.cpp "
            f"inside {SPEC_TYPES[model_members[0]]} only (a too-short model draft lets the next type try)"
        )
    block = [m for m in model_members if m in ("dflash", "dspark")]
    if block:
        line.warnings.append(
            f"--spec-type {SPEC_TYPES[block[0]]} with --spec-draft-n-max {cfg['draft_max']}: llama.cpp decodes that "
            "many masks (clamped to the trained block), specviz always the trained block (dflash.block_size) and "
            "keeps the first tokens: the drafts may differ unless --spec-draft-n-max reaches the block's capacity"
        )
    elif model_members and float(cfg.get("draft_p_min", 0.0)) > 0:
        line.warnings.append(
            f"--spec-draft-p-min {cfg['draft_p_min']:g}: specviz compares it with the draft's top probability over "
            "the whole vocabulary, llama.cpp over its top 10 candidates: specviz's drafts may stop earlier"
        )
    return cfg


def _context(line: _Line) -> tuple[ContextSettings, dict[str, Any]]:
    """The context settings and those the line gave; a refusal names the flag as the line spells it; the
    thread counts specviz does not apply named in a warning."""
    setting_values = {name: v for name, (_, v) in line.settings.items()}
    try:
        ctx = ContextSettings.make(None, **setting_values)
    except KnobError as e:
        short = ContextSettings.FLAGS.get(e.knob or "", "")
        given_flag = line.settings.get(e.knob or "", (short, ""))[0]
        raise type(e)(str(e).replace(f"({short})", f"({given_flag})", 1), knob=e.knob, value=e.value) from None
    if line.threads_batch is not None and str(line.threads_batch) != str(ctx.n_threads):
        line.warnings.append(
            f"-tb {line.threads_batch}: specviz uses one thread count (-t {ctx.n_threads}) for generation and "
            "batches; not applied"
        )
    if line.threads_draft is not None and str(line.threads_draft) != str(ctx.n_threads):
        line.warnings.append(
            f"-td {line.threads_draft}: the draft model runs with the target's thread count (-t {ctx.n_threads}) "
            "in specviz; not applied"
        )
    return ctx, {name: getattr(ctx, name) for name in line.settings}


def _placement(line: _Line) -> int | None:
    """``-ngl``'s layers (None: ``auto``); where specviz places a model otherwise than llama-server, a warning."""
    gpu_layers = line.gpu_layers
    n_gpu_layers = None if gpu_layers is None else gpu_layers_value(gpu_layers, label="llama-server option -ngl")
    if gpu_layers is not None and n_gpu_layers is None:
        line.warnings.append(
            "-ngl auto: specviz puts every layer on a GPU build's GPU; llama-server fits them into its free memory"
        )
    if line.draft_gpu_layers is not None:
        flag, v = line.draft_gpu_layers
        d = gpu_layers_value(v, label=f"llama-server option {flag}")
        if d != n_gpu_layers:
            line.warnings.append(
                f"{flag} {v}: specviz puts a draft model where the target is (-ngl {gpu_layers or 'auto'}); not "
                "applied (the draft's numerics, and so its drafts, may differ on a GPU build)"
            )
    return n_gpu_layers


def _parallel(line: _Line) -> tuple[int, bool]:
    """``-np``'s slots and ``-kvu``: refused as llama-server refuses them (0, not an integer) and beyond
    llama.cpp's sequences; ``-np -1`` (auto) or none run the requests one at a time, named in a warning where
    the line says auto."""
    from ..backends.sequences import MAX_SEQUENCES

    unified = bool(line.kv_unified)
    if line.parallel is None:
        return 1, unified
    flag, v = line.parallel
    try:
        n = int(v)
    except ValueError:
        raise KnobError(f"llama-server option {flag}: {v!r} is not an integer", knob="n_parallel", value=v) from None
    if n == 0 or n > MAX_SEQUENCES:
        raise KnobError(
            f"llama-server option {flag} {v}: the slots must be -1 (auto) or 1..{MAX_SEQUENCES}",
            knob="n_parallel",
            value=v,
        )
    if n < 0:
        line.warnings.append(
            f"{flag} {v}: llama-server's auto (4 slots sharing one unified cache); specviz runs the requests one "
            "at a time, each with the whole cache (give -np N to run them N at a time)"
        )
        return 1, unified
    return n, unified


def _sampling(line: _Line) -> tuple[dict[str, Any], int | None]:
    """The sampling values as numbers and ``-n`` (None when not given or negative); a refusal names the flag."""
    samp: dict[str, Any] = {}
    for key, (flag, v) in line.sampling.items():
        try:
            samp[key] = int(v) if key in ("top_k", "seed") else float(v)
        except ValueError:
            raise KnobError(f"llama-server option {flag}: {v!r} is not a number", knob=key, value=v) from None
    n_pred: int | None = None
    if line.n_predict is not None:
        try:
            n_pred = int(line.n_predict[1])
        except ValueError:
            raise KnobError(
                f"llama-server option {line.n_predict[0]}: {line.n_predict[1]!r} is not an integer", knob="n_predict"
            ) from None
    return samp, (n_pred if n_pred is None or n_pred >= 0 else None)


def parse_server_args(argv: str | Sequence[str]) -> ServerConfig:
    """Read a ``llama-server`` command line (a string, split as a shell would, or a list; the program name
    may lead) into a :class:`ServerConfig`, validated; nothing is loaded.

    Raises :class:`~specviz.errors.KnobError` (a bad value, naming the flag; a grammar llama.cpp refuses:
    :class:`~specviz.errors.GrammarError`) or :class:`~specviz.errors.StrategyError` (a ``--spec-type``
    specviz does not have)."""
    line = _read_line(_split(argv))
    strategy = _strategy(line)
    knobs = _draft_lengths(line, strategy, _validated_knobs(line, strategy, _spec_knobs(line, strategy)))
    ctx, given = _context(line)
    n_gpu_layers = _placement(line)
    sampling, n_predict = _sampling(line)
    n_parallel, kv_unified = _parallel(line)
    return ServerConfig(
        model=line.model,
        strategy=strategy,
        knobs=knobs,
        settings=ctx,
        given=given,
        sampling=sampling,
        n_predict=n_predict,
        chat_template=line.chat_template,
        grammar=grammar_of_flag(*line.grammar) if line.grammar is not None else None,
        swa_full=line.swa_full,
        n_gpu_layers=n_gpu_layers,
        gpu_layers_text=line.gpu_layers,
        n_parallel=n_parallel,
        kv_unified=kv_unified,
        warnings=line.warnings,
        argv=line.args,
    )


def own_draft_length(strategy: str, knobs: dict[str, Any]) -> int:
    """How many tokens an n-gram type drafts at most in llama.cpp: ``size_m``, ngram-mod's ``n_max``, or 8
    (ngram-cache)."""
    if strategy == "ngram-mod":
        return int(knobs["n_max"])
    if strategy == "ngram-cache":
        return 8
    return int(knobs.get("size_m", 48))


def server_spec_args(strategy: str, knobs: dict[str, Any]) -> list[str]:
    """``--spec-type`` and the ``--spec-*`` flags that make llama-server draft as ``strategy`` with ``knobs``
    (a chain: its members' comma list and each member's own flags).

    Raises :class:`~specviz.errors.StrategyError` for prompt lookup (no llama.cpp type, alone or in a chain)
    and ``KnobError`` for a knob llama.cpp has no flag for at a value other than its own (ngram-cache's
    ``n_draft``)."""
    name = spec_type(strategy)
    if name is None:
        raise StrategyError(
            f"{strategy}: prompt-lookup is not a llama.cpp --spec-type; ngram-simple is the nearest",
            knob="strategy",
            value=strategy,
        )
    if name == "none":
        return ["--spec-type", "none"]
    args = ["--spec-type", name]
    if strategy_class(strategy).needs_model:
        if knobs.get("draft_model"):
            args += ["-md", str(knobs["draft_model"])]
        args += ["--spec-draft-n-max", str(int(knobs.get("draft_max", LLAMA_DRAFT_DEFAULTS["draft_max"])))]
        args += ["--spec-draft-n-min", str(int(knobs.get("draft_min", 0)))]
        args += ["--spec-draft-p-min", f"{float(knobs.get('draft_p_min', 0.0)):g}"]
    for member, names in member_knob_names(strategy).items():
        if member == "ngram-cache" and int(knobs.get(names.get("n_draft", "n_draft"), 8)) != 8:
            n_draft = knobs[names["n_draft"]]
            raise KnobError(
                f"ngram-cache with n_draft={n_draft}: llama.cpp's drafts up to 8 tokens (no flag)",
                knob=names["n_draft"],
                value=n_draft,
            )
        for flag, (owner, knob) in SPEC_FLAGS.items():
            if owner == member and names.get(knob) in knobs:
                args += [flag, str(int(knobs[names[knob]]))]
    return args


def session_from_server_args(argv: str | Sequence[str], *, model: str | None = None) -> tuple[Any, ServerConfig]:
    """A :class:`~specviz.Session` with the context settings of a llama-server command line, and the
    :class:`ServerConfig` to start it with (the Python side of ``specviz run --server-args``)::

        s, cfg = session_from_server_args("llama-server -m m.gguf --spec-type ngram-mod -c 8192 -fa on")
        run = run_like_the_server(s, "prompt", 128, cfg.strategy, cfg.knobs)   # the server's loop
        s.start("prompt", 128, **cfg.start_kwargs())                            # or a plain session

    ``model`` replaces the line's ``-m``. Every flag specviz cannot honour is issued as a
    :class:`UserWarning` (and listed in ``cfg.warnings``); a refused value raises before the model loads."""
    import warnings

    from ..decoding.session import Session

    cfg = parse_server_args(argv)
    for w in cfg.warnings_one_at_a_time("a session (BatchRun runs several)"):
        warnings.warn(f"llama-server option {w}", UserWarning, stacklevel=2)
    return Session(model or cfg.model, **cfg.session_kwargs()), cfg
