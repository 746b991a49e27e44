"""The equivalence check: is speculative greedy output the same as plain greedy output, and if not, why?

Speculative greedy decoding is exact in principle, but llama.cpp's CPU kernels are not batch invariant:
the same position can get other logits in a one-token decode and in a verify batch (about 0.3 apart on
some CPUs, up to 2 on others), so where the target's top two are close the two runs can pick different
tokens. :func:`check_equivalence` runs both on one prompt and tells such a flip (``numerics``) from a bug
(``mismatch``):

``numerics``
    at the first divergence both runs chose between the same two tokens (each run's top two are that
    pair), and a replay of the speculative run (:mod:`specviz.analysis.replay`: the same verify batches
    on a fresh cache, every row decided by the greedy rule anew) gives every token it committed up to
    and including the divergence: the run did what speculative decoding with those batches must do;
``mismatch``
    anything else.

The size of the margin at the divergence does not decide: on an AVX2-only CPU batch and one-token
margins part by up to 1.2 logits, so a margin bound would call such flips bugs; ``threshold`` can still
ask for both margins to be below a bound as well.

The static-shape runner (docs/strategies.md) documents the same kind of difference (plain greedy and its
verify scan treat a NaN row differently); here both paths share one row scan, so only the logits can
differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .replay import replay_greedy

if TYPE_CHECKING:
    from ..decoding.round import RoundResult
    from ..decoding.session import Session


def _greedy_run(
    session: Session, prompt: str | list[int], max_tokens: int, strategy: str, knobs: dict[str, Any]
) -> tuple[list[int], list[tuple[float, int, int]], list[RoundResult]]:
    """Generate greedily, returning the tokens, the target's top-two margin at each of them and the rounds."""
    session.record_margins = True
    margins: list[tuple[float, int, int]] = []
    rounds: list[RoundResult] = []
    try:
        session.start(prompt, max_tokens, strategy, **knobs)
        while session.finished is None:
            session.step()
            res = session.generation.last_result
            if res is not None and (not rounds or rounds[-1] is not res):
                rounds.append(res)
                margins.extend(res.margins[: len(res.committed)])
    finally:
        session.record_margins = False
    return list(session.tokens), margins, rounds


def check_equivalence(
    session: Session,
    prompt: str | list[int],
    max_tokens: int,
    strategy: str,
    knobs: dict[str, Any],
    threshold: float | None = None,
) -> dict[str, Any]:
    """Run plain greedy and speculative greedy on one prompt and compare them.

    Returns ``verdict`` (``identical``, ``numerics`` or ``mismatch``) and, at the first divergence, its
    index, both runs' tokens and texts, the target's top-two margin there under both runs, and what the
    replay of the speculative run found (``replay``; None where the two runs did not part between one
    pair of tokens, which is a mismatch without it). ``threshold`` (logits): also require both margins
    below it for ``numerics``; None, the default, leaves it to the replay.
    """
    plain, plain_m, _ = _greedy_run(session, prompt, max_tokens, "none", {})
    prompt_ids = list(session.prompt_tokens)
    spec, spec_m, rounds = _greedy_run(session, prompt, max_tokens, strategy, knobs)
    tel = session.telemetry_dict()
    out: dict[str, Any] = {
        "strategy": strategy,
        "knobs": knobs,
        "threshold": threshold,
        "plain_tokens": len(plain),
        "speculative_tokens": len(spec),
        "acceptance_rate": tel["acceptance_rate"],
    }
    n = min(len(plain), len(spec))
    i = next((j for j in range(n) if plain[j] != spec[j]), None)
    if i is None and len(plain) == len(spec):
        out.update(verdict="identical", divergence=None, replay=None)
        return out
    if i is None:  # one run stopped earlier (end of generation): compare the next position's margins
        i = n
    tp = plain_m[i] if i < len(plain_m) else None
    ts = spec_m[i] if i < len(spec_m) else None
    pt = plain[i] if i < len(plain) else None
    st = spec[i] if i < len(spec) else None
    pair = {t for t in (pt, st) if t is not None}
    same_pair = all(m is not None and {m[1], m[2]} >= pair for m in (tp, ts))
    within = threshold is None or (tp is not None and ts is not None and max(tp[0], ts[0]) < threshold)
    replay = None
    if same_pair and within:
        replay = replay_greedy(session.ctx, prompt_ids, rounds, prefill=session.prefill, upto=i)
    piece = session.model.piece
    out.update(
        verdict="numerics" if replay is not None and replay.reproduced else "mismatch",
        replay=replay.to_dict() if replay is not None else None,
        divergence={
            "index": i,
            "plain_token": pt,
            "speculative_token": st,
            "plain_piece": piece(pt) if pt is not None else None,
            "speculative_piece": piece(st) if st is not None else None,
            "plain_margin": tp[0] if tp else None,
            "speculative_margin": ts[0] if ts else None,
            "plain_top_two": list(tp[1:]) if tp else None,
            "speculative_top_two": list(ts[1:]) if ts else None,
        },
    )
    return out
