"""A new generation on a session (``Session.start``, after every argument was checked): the drafter built,
on a new target context where its strategy needs one (:mod:`specviz.decoding.target_context`), a fresh
:class:`~specviz.decoding.generation.Generation`, and the prompt evaluated as the session's prefill layout
says (:mod:`specviz.decoding.target_setup`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..backends.llama import LlamaContext
from ..errors import StrategyError
from ..strategies import strategy_class
from ..strategies.base import Drafter
from .configuration import use_drafter
from .constrained import GrammarState
from .generation import Generation, SessionParts
from .policy import make_policy
from .request import Request
from .target_context import swap_target


def new_generation(
    s: SessionParts, req: Request, strategy: str, cfg: dict[str, Any], prefill: str
) -> tuple[Generation, Drafter]:
    """Give ``s`` the drafter of ``strategy`` with ``cfg`` (returned with the generation; it has not begun)
    and a fresh generation of request ``req``, its generator reseeded; the prompt is not evaluated yet
    (:func:`evaluate_start`). A strategy that reads the
    target's activations is refused (:class:`~specviz.errors.StrategyError`) with a whole-prompt prefill,
    whose first round has no verify batch to read; a refusal, or a drafter that cannot be built, changes
    nothing."""
    if prefill == "whole" and strategy_class(strategy).reads_target:
        raise StrategyError(
            f"strategy {strategy!r} reads the target's activations of every verify batch, and a "
            "whole-prompt prefill (prefill='whole') gives its first round none; start it on a session "
            "with prefill='all-but-last', or start with 'none' and configure it after the first round",
            knob="strategy",
        )
    with swap_target(s, strategy):
        drafter = s.build_drafter(strategy, cfg, req.sampling)  # may fail: nothing has changed yet
        use_drafter(s, drafter)
    g = s.generation = Generation(
        history=list(req.ids),
        n_prompt=len(req.ids),
        max_tokens=req.max_tokens,
        sampling=req.sampling,
        seed=req.seed,
        strategy=strategy,
        knobs=cfg,
        stop=req.stop,
        grammar=GrammarState(s.model, req.grammar) if req.grammar is not None else None,
        policy=make_policy(cfg.get("draft_policy", "fixed"), s.cost_model),
    )
    s.rng.bit_generator.state = np.random.default_rng(g.seed).bit_generator.state
    return g, drafter


def evaluate_prompt(ctx: LlamaContext, g: Generation, prefill: str) -> None:
    """Fill the emptied cache of ``ctx`` with the prompt of ``g`` (``g.history`` is the prompt) as ``prefill``
    says: all of it, its last row kept for the first round (``whole``), or all but the last token."""
    ctx.clear()
    if prefill == "whole":
        ctx.eval_prompt(g.history, 0, keep_last=True)
        g.prefilled = True
    else:
        ctx.eval_prompt(g.history[:-1], 0)


def evaluate_start(ctx: LlamaContext, g: Generation, prefill: str) -> None:
    """:func:`evaluate_prompt` of a new generation, timed into its telemetry, with the memory's state after the
    prompt (where memory that cannot drop a tail rewinds from at the latest)."""
    t0 = time.perf_counter()
    evaluate_prompt(ctx, g, prefill)
    g.telemetry.prompt_seconds = time.perf_counter() - t0
    g.telemetry.prompt_tokens = g.n_prompt
    g.telemetry.record_memory(ctx.memory.remember(), None, [])


def prompt_row_again(ctx: LlamaContext, g: Generation, prefill: str) -> bool:
    """After a rewind or a restore to the start of ``g`` under a whole-prompt prefill: evaluate the prompt
    again, so that the first round reads its last row (which the restored or cut cache does not keep); True
    when it did."""
    if prefill != "whole" or len(g.history) != g.n_prompt:
        return False
    evaluate_prompt(ctx, g, prefill)
    return True
