"""The deployment's context settings on the command line, in llama.cpp's spellings: ``-fa on|off|auto``,
``-ctk`` / ``-ctv`` TYPE, ``-c`` (``--n-ctx``), ``-b``, ``-ub``, ``-t``; where the model's layers go,
``-ngl N`` (a GPU build's devices, :class:`~specviz.Session`'s ``n_gpu_layers``); and ``--server-args
"LINE"``, a whole llama-server command line that sets the model, the strategy, its knobs and these settings
at once.

Every value is checked before any model loads (:class:`~specviz.backends.context_settings.ContextSettings`);
a refused one exits with status 2 naming the flag.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

from ..backends.context_settings import CACHE_TYPES, ContextSettings
from ..errors import KnobError, StrategyError
from .options import UsageError

#: setting -> the flags that spell it here
SETTING_FLAGS = {
    "flash_attn": ("-fa", "--flash-attn"),
    "cache_type_k": ("-ctk", "--cache-type-k"),
    "cache_type_v": ("-ctv", "--cache-type-v"),
    "n_batch": ("-b", "--batch-size"),
    "n_ubatch": ("-ub", "--ubatch-size"),
    "n_threads": ("-t", "--threads"),
}


#: the flags of the model's placement, as llama.cpp's tools spell it
GPU_LAYERS_FLAGS = ("-ngl", "--n-gpu-layers", "--gpu-layers")


def add_settings_options(p: argparse.ArgumentParser, *, threads: bool = True, gpu_layers: bool = False) -> None:
    """``-fa``, ``-ctk``, ``-ctv``, ``-b``, ``-ub``, (with ``threads``) ``-t`` and (with ``gpu_layers``) ``-ngl``
    for a command that creates a context (``-c`` is the command's ``--n-ctx``)."""
    g = p.add_argument_group("deployment settings (llama.cpp's spellings)")
    if gpu_layers:
        g.add_argument(
            *GPU_LAYERS_FLAGS,
            dest="n_gpu_layers",
            default=None,
            metavar="N|all|auto",
            help="layers of the model on the GPU of a GPU build (make install LLAMA_BACKEND=cuda|vulkan|metal); "
            "all (or more than the model has) puts every layer and the output layer there, auto all of them on a "
            "GPU build (llama.cpp's auto also fits them into free memory); default 0, unlike llama.cpp's auto",
        )
    g.add_argument(
        *SETTING_FLAGS["flash_attn"],
        dest="set_flash_attn",
        default=None,
        metavar="on|off|auto",
        help="flash attention (default auto: llama.cpp decides; on for this CPU)",
    )
    types = ", ".join(CACHE_TYPES)
    g.add_argument(
        *SETTING_FLAGS["cache_type_k"],
        dest="set_cache_type_k",
        default=None,
        metavar="TYPE",
        help=f"KV cache type for K ({types}; default f16)",
    )
    g.add_argument(
        *SETTING_FLAGS["cache_type_v"],
        dest="set_cache_type_v",
        default=None,
        metavar="TYPE",
        help="KV cache type for V (a quantized one needs flash attention; default f16)",
    )
    g.add_argument(
        *SETTING_FLAGS["n_batch"],
        dest="set_n_batch",
        default=None,
        metavar="N",
        help="logical batch size (default 512)",
    )
    g.add_argument(
        *SETTING_FLAGS["n_ubatch"],
        dest="set_n_ubatch",
        default=None,
        metavar="N",
        help="physical batch size, at most -b (default 512)",
    )
    if threads:
        g.add_argument(
            *SETTING_FLAGS["n_threads"],
            dest="set_n_threads",
            default=None,
            metavar="N",
            help="llama.cpp threads (default: every core)",
        )


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (their raw values), by setting name."""
    out = {name: getattr(args, "set_" + name, None) for name in SETTING_FLAGS}
    return {k: v for k, v in out.items() if v is not None}


def settings_of(
    args: argparse.Namespace, *, n_ctx: int | None = None, base: ContextSettings | None = None
) -> ContextSettings:
    """The context settings of the command line (on top of ``base``), checked; a refused value raises
    :class:`~specviz.cli.options.UsageError` naming the flag."""
    values = given_settings(args)
    if n_ctx is not None:
        values["n_ctx"] = n_ctx
    try:
        return ContextSettings.make(base, **values)
    except KnobError as e:
        flags = SETTING_FLAGS.get(e.knob or "", ("--n-ctx",) if e.knob == "n_ctx" else ())
        flag = "/".join(flags) or str(e.knob)
        short = ContextSettings.FLAGS.get(e.knob or "", "")
        raise UsageError(str(e).replace(f"setting {e.knob!r} ({short})", f"option {flag}", 1)) from None


def check_settings_for(settings: ContextSettings, model: str | None, *, flag: str = "--model") -> None:
    """The checks that need the model's head sizes, read from its GGUF header (no model loads); a refused
    setting raises :class:`~specviz.cli.options.UsageError`. ``model`` None (the embedded model): nothing to
    read yet; the session checks it."""
    if model is None:
        return
    from ..backends.context_settings import head_sizes
    from ..backends.gguf_check import check_gguf
    from ..errors import ModelError

    try:
        info = check_gguf(model)
    except ModelError:
        return  # the session reports the file
    try:
        settings.check_model(*head_sizes(info.metadata, info.architecture))
    except KnobError as e:
        flags = SETTING_FLAGS.get(e.knob or "", ())
        short = ContextSettings.FLAGS.get(e.knob or "", "")
        raise UsageError(str(e).replace(f"setting {e.knob!r} ({short})", f"option {'/'.join(flags)}", 1)) from None


def gpu_layers_of(args: argparse.Namespace, *, warn: Callable[[str], None], server: Any = None) -> int:
    """The model's placement: ``-ngl``'s value (llama.cpp's spellings: N, ``all``, ``auto``), else the
    ``--server-args`` line's (``server``, a :class:`~specviz.analysis.server_args.ServerConfig`; without
    ``-ngl`` there, llama-server's default ``auto``), else 0; ``auto`` read by
    :func:`~specviz.backends.devices.auto_gpu_layers`. Refused: a ``-ngl`` beside a line that gives another.
    A warning where layers are asked for and this llama.cpp build has no GPU device to put them on
    (llama.cpp then runs them on the CPU, as its own tools do)."""
    from ..backends.devices import auto_gpu_layers, devices, gpu_devices, gpu_layers_value

    given = getattr(args, "n_gpu_layers", None)
    n: int | None = 0
    if given is not None:
        try:
            n = gpu_layers_value(given, label=f"option {GPU_LAYERS_FLAGS[0]}")
        except KnobError as e:
            raise UsageError(str(e)) from None
        if server is not None and server.gpu_layers_given and n != server.n_gpu_layers:
            raise UsageError(
                f"option -ngl {given} conflicts with the --server-args line's -ngl {server.gpu_layers_text}; give "
                "the placement once"
            )
    elif server is not None:
        n = server.n_gpu_layers
    if n is None:
        return auto_gpu_layers()
    if n > 0 and not gpu_devices():
        backends = ", ".join(sorted({d.backend for d in devices()})) or "none"
        warn(
            f"option -ngl {given if given is not None else server.gpu_layers_text} is accepted but puts nothing on "
            f"a GPU: this llama.cpp build has no GPU device (backends: {backends}); build one with "
            "`make install LLAMA_BACKEND=cuda` (or vulkan, metal)"
        )
    return n


def session_kwargs(settings: ContextSettings) -> dict[str, Any]:
    """The :class:`~specviz.Session` keyword arguments of ``settings``."""
    return settings.to_dict()


def add_server_args_option(p: argparse.ArgumentParser) -> None:
    """``--server-args "LINE"``: run a whole llama-server command line's configuration."""
    p.add_argument(
        "--server-args",
        default=None,
        metavar='"LINE"',
        help="a whole llama-server command line (-m, --spec-*, -fa, -ctk, -c ...): run its configuration, "
        "through the server's generation loop; flags specviz cannot honour are named in warnings",
    )


def server_config(args: argparse.Namespace, *, warn: Callable[[str], None], given: list[str]) -> Any:
    """The :class:`~specviz.analysis.server_args.ServerConfig` of ``--server-args`` (None without it), its
    warnings printed; ``given`` names the options of the command line that would set the same thing (a
    strategy, a knob, a setting), which are refused beside it."""
    line = getattr(args, "server_args", None)
    if line is None:
        return None
    from ..analysis.server_args import parse_server_args

    if given:
        raise UsageError(
            f"option {given[0]} conflicts with --server-args, which sets the strategy, its knobs and the "
            "context settings; leave it out (or put it in the line)"
        )
    try:
        cfg = parse_server_args(line)
    except (KnobError, StrategyError) as e:
        raise UsageError(f"option --server-args: {e}") from None
    for w in cfg.warnings:
        warn(f"--server-args {w}")
    return cfg
