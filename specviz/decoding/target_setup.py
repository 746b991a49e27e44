"""What a session's target is made with, checked before any model loads: the prompt's layout, the GPU
layers and the context's settings as llama.cpp spells them. Every refusal is a
:class:`~specviz.errors.ContextSettingsError` naming the setting, raised before anything is loaded or created.

``swa_full`` (default True) gives sliding-window layers a full-size cache; False uses llama.cpp's
ring-sized one, which holds only the last window of keys (drafts and rewinds are then limited to what
the ring still holds, see :mod:`specviz.backends.memory`). ``n_rs_seq`` is how many recurrent-state
snapshots llama.cpp keeps for partial rollback on the architectures that have them (None: the
default of :mod:`specviz.backends.memory`).

``prefill`` is how a prompt is evaluated. ``"all-but-last"`` (the default), as llama.cpp's
``speculative-simple``: every prompt token but the last in the prefill, the last one the first row of
the first round's batch (which may carry a draft). ``"whole"``, as ``llama-server``: the whole prompt in
the prefill, the first token chosen from its last row without a draft, drafting from the second round.
llama.cpp's CPU kernels are not batch-invariant, so the two layouts can part at a near-tie (measured on
the embedded Gemma 3: 3 of 4 ``summarise`` prompts within 128 greedy tokens); a reproduction of a server
uses ``"whole"`` (:func:`~specviz.analysis.server_args.session_from_server_args` sets it). With
``"whole"``, strategies that read the target's activations (``reads_target``: EAGLE-3, MTP, DFlash)
are refused at ``start``: their first round would find no verify batch to read.

The context settings: ``n_ctx`` (``-c``), ``n_batch`` / ``n_ubatch`` (``-b`` / ``-ub``), ``n_threads``
(``-t``), ``flash_attn`` (``-fa``: ``auto``, ``on`` or ``off``) and ``cache_type_k`` / ``cache_type_v``
(``-ctk`` / ``-ctv``: ``f16``, ``q8_0`` ...); a quantized V cache needs flash attention, a quantized
type's blocks must divide the model's head sizes (checked once the model is loaded).

``n_gpu_layers`` (``-ngl``) is how many of the model's layers a GPU build of llama.cpp puts on its GPU
devices when the session loads the model from a path (default 0: none; more than the model has offloads
the output layer too); draft models the session loads follow the target. With a loaded
:class:`~specviz.backends.LlamaModel` the model's own placement holds, and another value is refused.
"""

from __future__ import annotations

import os
from typing import Any

from ..backends.context_settings import ContextSettings
from ..backends.llama import LlamaContext, LlamaModel
from ..backends.memory import memory_kind, tree_refusal
from ..backends.sequences import MAX_SEQUENCES
from ..errors import ContextSettingsError
from ..models.embedded import resolve_model

#: How a session evaluates a prompt: as speculative-simple (all but the last token), as llama-server (whole).
PREFILL_LAYOUTS = ("all-but-last", "whole")
#: The settings a session's target context is created with (what a snapshot records and restores).
CONTEXT_KEYS = (
    "n_ctx",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "swa_full",
    "n_rs_seq",
    "flash_attn",
    "cache_type_k",
    "cache_type_v",
    "n_seq_max",
)


def check_prefill(prefill: str) -> str:
    """``prefill`` when it is one of :data:`PREFILL_LAYOUTS`; a :class:`ContextSettingsError` otherwise."""
    if prefill not in PREFILL_LAYOUTS:
        raise ContextSettingsError(
            f"prefill {prefill!r} is not allowed; choose {' or '.join(map(repr, PREFILL_LAYOUTS))} "
            "(the prompt but its last token, as speculative-simple; or the whole prompt, as llama-server)",
            knob="prefill",
        )
    return prefill


def gpu_layers(n_gpu_layers: Any, model: object) -> int:
    """``n_gpu_layers`` checked (an integer >= 0; None: 0, or a loaded model's own), before any model loads;
    :class:`~specviz.errors.ContextSettingsError` naming it otherwise, or where it differs from the
    placement of the already loaded ``model``."""
    loaded = model.n_gpu_layers if isinstance(model, LlamaModel) else None
    if n_gpu_layers is None:
        return loaded if loaded is not None else 0
    if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int) or n_gpu_layers < 0:
        raise ContextSettingsError(
            f"n_gpu_layers (-ngl): {n_gpu_layers!r} is not allowed; expected an integer >= 0 (the layers to put "
            "on the GPU; more than the model has puts all of them and the output layer there)",
            knob="n_gpu_layers",
            value=n_gpu_layers,
        )
    if loaded is not None and loaded != n_gpu_layers:
        raise ContextSettingsError(
            f"n_gpu_layers (-ngl) {n_gpu_layers} differs from the {loaded} the model was loaded with; load it "
            f"with LlamaModel(path, n_gpu_layers={n_gpu_layers}) or pass the path and let the session load it",
            knob="n_gpu_layers",
            value=n_gpu_layers,
        )
    return n_gpu_layers


def context_args(**settings: Any) -> dict[str, Any]:
    """The keyword arguments of the target's :class:`~specviz.backends.llama.LlamaContext` for a session's
    settings (every key of :data:`CONTEXT_KEYS`), each checked (:meth:`ContextSettings.make`) and the
    attention and cache types in their canonical spelling."""
    checked = ContextSettings.make(
        n_ctx=settings["n_ctx"],
        n_batch=settings["n_batch"],
        n_ubatch=settings["n_ubatch"],
        n_threads=settings["n_threads"] or None,
        flash_attn=settings["flash_attn"],
        cache_type_k=settings["cache_type_k"],
        cache_type_v=settings["cache_type_v"],
    )
    args = {k: settings[k] for k in CONTEXT_KEYS if k != "n_seq_max"}
    args.update(flash_attn=checked.flash_attn, cache_type_k=checked.cache_type_k, cache_type_v=checked.cache_type_v)
    n_seq = settings.get("n_seq_max", 1)
    if not isinstance(n_seq, int) or isinstance(n_seq, bool) or not 1 <= n_seq <= MAX_SEQUENCES:
        raise ContextSettingsError(
            f"n_seq_max must be an integer in 1..{MAX_SEQUENCES} (the target's sequences: a draft tree's branches "
            f"each need one), got {n_seq!r}",
            knob="n_seq_max",
        )
    if n_seq > 1:  # a draft tree's branches share the prefix's cells: one unified cache
        args.update(n_seq_max=n_seq, kv_unified=True)
    return args


def open_target(
    model: str | os.PathLike | LlamaModel | None, n_gpu_layers: int | None, settings: dict[str, Any]
) -> tuple[LlamaModel, LlamaContext, dict[str, Any]]:
    """The target model (``model`` itself when loaded, else loaded from its path, None: the embedded one)
    and its context with ``settings`` (every key of :data:`CONTEXT_KEYS`), and the context's arguments
    (:func:`context_args`); every setting is checked before the model loads."""
    args = context_args(**settings)
    ngl = gpu_layers(n_gpu_layers, model)
    loaded = model if isinstance(model, LlamaModel) else LlamaModel(resolve_model(model), n_gpu_layers=ngl)
    if args.get("n_seq_max", 1) > 1 and (why := tree_refusal(memory_kind(loaded, bool(args["swa_full"])))):
        raise ContextSettingsError(f"n_seq_max={args['n_seq_max']} (a draft tree's sequences) is refused: {why}")
    return loaded, LlamaContext(loaded, **args), args
