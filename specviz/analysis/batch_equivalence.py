"""Batched greedy against the same requests alone: does every request of a batched run (llama-server's ``-np N``
slots, :class:`~specviz.decoding.batch.BatchRun`) give the tokens it gives run alone, and where not, why?

llama.cpp's CPU kernels are not batch invariant: a position evaluated in a decode that holds other sequences' rows,
in a context of another size, gets slightly other logits than alone, so at a near-tie a batched request can choose
another token and part from its alone run from there on. :func:`check_batched_equivalence` runs the requests
batched (N at a time, a queued request taking the first free slot) and each alone with the same strategy and
knobs (:func:`~specviz.analysis.equivalence.greedy_run`), finds where they first part
(:func:`~specviz.analysis.equivalence.first_divergence`) and gives each request a verdict
(:func:`verdict_of`):

``identical``
    the same tokens;
``numerics``
    at the first divergence both runs' top two hold both tokens (``same_pair``: the batch shape moved the
    logits between two near-equal tokens); or, not on the same pair, the row evaluated alone again
    (:func:`ranks_alone`) puts the batched token less than :data:`NEAR_TIE_BOUND` logits below its top (a
    near-tie among three or more tokens);
``mismatch``
    anything else: a run that stopped where the other went on, a request that ended with an error, a batched
    token far from the top when its row is evaluated alone — what a bug in drafting, acceptance or one
    sequence's cache does.

The bound is 1.2 logits because that is how far a one-token decode's and a verify batch's top-two margins part
on an AVX2-only CPU (:mod:`specviz.analysis.equivalence`): a token within it of the top alone may have been the
top in the batch's logits, and one further away cannot have been. ``threshold`` replaces the bound, and then a
same-pair parting also needs both runs' margins below it. The run's verdict is ``mismatch`` if any request's is,
else ``numerics`` if any, else ``identical``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Sequence

from ..backends.llama import LlamaContext
from ..errors import BatchError, SpecvizError
from .equivalence import Divergence, first_divergence, greedy_run
from .request_runs import chat_start_args

if TYPE_CHECKING:
    from ..backends.llama import LlamaModel
    from ..decoding.batch import BatchResult, BatchRun
    from ..decoding.session import Session

#: How far below the top (logits) the batched token may stand in its row evaluated alone for a parting not on the
#: same pair to be a near-tie: the most a one-token decode's and a batch's margins part on an AVX2-only CPU.
NEAR_TIE_BOUND = 1.2
#: The verdicts, from the best: a run's is its worst request's.
VERDICTS = ("identical", "numerics", "mismatch")
#: A logged request's sampling options that a greedy comparison drops (both runs decode greedily).
_SAMPLING = ("temperature", "top_p", "top_k", "seed")


def ranks_alone(model: LlamaModel, context: list[int], tokens: dict[str, int], **context_args: Any) -> dict[str, Any]:
    """Where each of ``tokens`` stands in the target's row after ``context`` evaluated alone again: one sequence in
    a fresh context opened with ``context_args`` (:class:`~specviz.backends.llama.LlamaContext`'s keyword arguments:
    those of the alone runs, ``n_ctx`` above all, as the context's size changes the attention's reduction), the
    last token a one-row decode as plain decoding reads it. Each name maps to ``(rank, below_top)``: its rank (1:
    the top) and how many logits below the top it is. Two tokens the batched and the alone run chose outside each
    other's top two can still be a near-tie among three or more."""
    ctx = LlamaContext(model, **context_args)
    try:
        ctx.eval_prompt(context[:-1])
        ctx.eval(context[-1:], len(context) - 1, rows="last")
        row = ctx.last_row()
        top = float(row.max())
        return {name: (int((row > row[t]).sum()) + 1, top - float(row[t])) for name, t in tokens.items()}
    finally:
        ctx.close()


def verdict_of(div: Divergence | None, ranks: dict[str, Any] | None = None, threshold: float | None = None) -> str:
    """The verdict of one request (see the module docstring): ``div`` its first divergence from its alone run
    (``a`` alone, ``b`` batched; None: the same tokens), ``ranks`` the row evaluated alone again
    (:func:`ranks_alone`, with a ``batched`` entry) where the parting is not on the same pair, ``threshold`` the
    bound in logits in place of :data:`NEAR_TIE_BOUND`."""
    if div is None:
        return "identical"
    if div.token_a is None or div.token_b is None:  # one run stopped where the other went on
        return "mismatch"
    if div.same_pair:
        below = threshold is None or (div.margin is not None and div.margin < threshold)
        return "numerics" if below else "mismatch"
    bound = NEAR_TIE_BOUND if threshold is None else threshold
    batched = (ranks or {}).get("batched")
    return "numerics" if batched is not None and batched[1] < bound else "mismatch"


def overall_verdict(verdicts: Sequence[str]) -> str:
    """A run's verdict from its requests': the worst of them (``identical`` with none)."""
    return max(verdicts, key=VERDICTS.index, default="identical")


def _as_request(i: int, item: Any, max_tokens: int, chat_template: str | None) -> tuple[str, Any, int, dict]:
    """Request ``item`` (a prompt, or a logged chat request: :class:`~specviz.sweep.request_log.LoggedRequest`) as
    its id, prompt, length and :meth:`~specviz.Session.start` options, greedy."""
    if isinstance(item, (str, list)):
        return str(i), item, max_tokens, {}
    n, options = chat_start_args(item, max_tokens, None, chat_template)
    for key in _SAMPLING:
        options.pop(key, None)
    return item.id, None, n, options


def _run_alone(session: Session, rid: str, prompt: Any, n: int, strategy: str, options: dict) -> dict[str, Any]:
    """Request ``rid`` run alone on ``session``: its tokens, margins and prompt tokens. A request the session
    refuses (a chat template the model lacks, a bad option in its line) cannot be compared:
    :class:`~specviz.errors.BatchError` naming it and why."""
    try:
        tokens, margins, _ = greedy_run(session, prompt, n, strategy, options)
    except SpecvizError as e:
        raise BatchError(f"request {rid!r} cannot be compared, as it fails run alone: {e}") from e
    return {"tokens": tokens, "margins": margins, "prompt": list(session.prompt_tokens)}


def _divergence_dict(div: Divergence, piece: Any) -> dict[str, Any]:
    """A first divergence for ``--json``: both runs' tokens, pieces, top-two margins and top twos."""
    out: dict[str, Any] = {"index": div.index, "same_pair": div.same_pair}
    for run, token, margin in (("alone", div.token_a, div.margin_a), ("batched", div.token_b, div.margin_b)):
        out[f"{run}_token"] = token
        out[f"{run}_piece"] = piece(token) if token is not None else None
        out[f"{run}_margin"] = margin[0] if margin is not None else None
        out[f"{run}_top_two"] = list(margin[1:]) if margin is not None else None
    return out


def _judge(
    rid: str, i: int, res: BatchResult, alone: dict[str, Any], session: Session, threshold: float | None
) -> dict[str, Any]:
    """One request's entry: its verdict, its first divergence and, off the same pair, the row alone again."""
    error = str(res.error) if res.error is not None else None
    out: dict[str, Any] = {"id": rid, "index": i, "slot": res.slot, "tokens": len(res.tokens)}
    out.update(alone_tokens=len(alone["tokens"]), error=error, divergence=None, ranks_alone=None)
    if error is not None:
        out["verdict"] = "mismatch"
        return out
    div = first_divergence(alone["tokens"], alone["margins"], res.tokens, res.margins)
    ranks = None
    if div is not None:
        out["divergence"] = _divergence_dict(div, session.model.piece)
        if not div.same_pair and div.token_a is not None and div.token_b is not None:
            context = alone["prompt"] + alone["tokens"][: div.index]
            chosen = {"alone": div.token_a, "batched": div.token_b}
            ranks = ranks_alone(session.model, context, chosen, **session.context_args)
            out["ranks_alone"] = {k: list(v) for k, v in ranks.items()}
    out["verdict"] = verdict_of(div, ranks, threshold)
    return out


def check_batched_equivalence(
    batch: BatchRun,
    session: Session,
    requests: Sequence[Any],
    max_tokens: int,
    strategy: str,
    knobs: dict[str, Any],
    threshold: float | None = None,
    *,
    chat_template: str | None = None,
) -> dict[str, Any]:
    """Run ``requests`` batched on ``batch`` (opened with ``record_margins=True``; its slots' count at a time) and
    each alone on ``session`` (the same model; the settings a run alone has), greedily with ``strategy`` and
    ``knobs``, and judge every request (see the module docstring).

    A request is a prompt (text or token ids; ``max_tokens`` long) or a logged chat request
    (:class:`~specviz.sweep.request_log.LoggedRequest`: its messages through ``chat_template`` or the model's own,
    its ``max_tokens`` and stops; its sampling options dropped). Identical requests run alone once; a request that
    fails run alone is refused (:class:`~specviz.errors.BatchError`) before the batch runs.

    Returns ``verdict`` (the worst request's), ``strategy``, ``knobs``, ``threshold``, ``bound`` (the near-tie
    bound used, logits) and ``requests``: per request, in order, its ``id`` (a logged request's, else its index),
    ``index``, ``slot``, ``tokens`` (batched) and ``alone_tokens`` (their counts), ``verdict``, ``error`` (why the
    batched run ended early, else None), ``divergence`` (None where identical: ``index`` into the generated tokens,
    ``same_pair``, and per run, ``alone_*`` and ``batched_*``, its ``token``, ``piece``, top-two ``margin`` and
    ``top_two``) and ``ranks_alone`` (a parting not on the same pair: each token's ``[rank, below_top]`` in the row
    evaluated alone again, :func:`ranks_alone`; else None).
    """
    if not all(s.record_margins for s in batch.slots):
        raise BatchError(
            "check_batched_equivalence needs a BatchRun(record_margins=True): the top-two margins decide a verdict"
        )
    items = [_as_request(i, r, max_tokens, chat_template) for i, r in enumerate(requests)]
    alone_runs: dict[str, dict[str, Any]] = {}  # identical requests run alone once
    keys = [json.dumps([prompt, n, options], sort_keys=True, default=str) for _, prompt, n, options in items]
    for key, (rid, prompt, n, options) in zip(keys, items):
        if key not in alone_runs:
            alone_runs[key] = _run_alone(session, rid, prompt, n, strategy, {**options, **knobs})
    ids = [batch.submit(prompt, n, strategy, **options, **knobs) for _, prompt, n, options in items]
    while batch.pending:
        batch.step()
    entries = [
        _judge(rid, i, batch.results[bid], alone_runs[key], session, threshold)
        for i, ((rid, *_), bid, key) in enumerate(zip(items, ids, keys))
    ]
    return {
        "verdict": overall_verdict([e["verdict"] for e in entries]),
        "strategy": strategy,
        "knobs": knobs,
        "threshold": threshold,
        "bound": NEAR_TIE_BOUND if threshold is None else threshold,
        "requests": entries,
    }
