"""The equivalence check: is speculative greedy output the same as plain greedy output, and if not, why?

Speculative greedy decoding is exact in principle, but llama.cpp's CPU kernels are not batch invariant:
the same position can get logits about 0.3 apart in a one-token decode and in a verify batch, so at a
near-tie the two runs can pick different tokens. :func:`check_equivalence` runs both on one prompt and
tells such a flip (``numerics``) from a bug (``mismatch``):

``numerics``
    at the first divergence both runs faced a near-tie — the target's top-two logit margin below
    ``threshold`` in both — between the same two tokens, and each run took one of them;
``mismatch``
    anything else.

The runner PR documents the same kind of difference (plain greedy and its verify scan treat a NaN row
differently); here both paths share one row scan, so only the logits can differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..decoding.session import Session

#: Default margin (in logits) below which a divergence counts as a numerical near-tie.
DEFAULT_THRESHOLD = 0.5


def _greedy_run(
    session: Session, prompt: str | list[int], max_tokens: int, strategy: str, knobs: dict[str, Any]
) -> tuple[list[int], list[tuple[float, int, int]]]:
    """Generate greedily, returning the tokens and the target's top-two margin at each of them."""
    session.record_margins = True
    margins: list[tuple[float, int, int]] = []
    try:
        session.start(prompt, max_tokens, strategy, **knobs)
        while session.finished is None:
            session.step()
            if session.last_result is not None:
                margins.extend(session.last_result.margins[: len(session.last_result.committed)])
    finally:
        session.record_margins = False
    return list(session.tokens), margins


def check_equivalence(
    session: Session,
    prompt: str | list[int],
    max_tokens: int,
    strategy: str,
    knobs: dict[str, Any],
    threshold: float = DEFAULT_THRESHOLD,
) -> dict[str, Any]:
    """Run plain greedy and speculative greedy on one prompt and compare them.

    Returns ``verdict`` (``identical``, ``numerics`` or ``mismatch``) and, at the first divergence, its
    index, both runs' tokens and texts, and the target's top-two margin there under both runs.
    """
    plain, plain_m = _greedy_run(session, prompt, max_tokens, "none", {})
    spec, spec_m = _greedy_run(session, prompt, max_tokens, strategy, knobs)
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
        out.update(verdict="identical", divergence=None)
        return out
    if i is None:  # one run stopped earlier (end of generation): compare the next position's margins
        i = n
    tp = plain_m[i] if i < len(plain_m) else None
    ts = spec_m[i] if i < len(spec_m) else None
    pt = plain[i] if i < len(plain) else None
    st = spec[i] if i < len(spec) else None
    pair = {t for t in (pt, st) if t is not None}
    same_pair = all(m is not None and {m[1], m[2]} >= pair for m in (tp, ts))
    near_tie = tp is not None and ts is not None and max(tp[0], ts[0]) < threshold
    piece = session.model.piece
    out.update(
        verdict="numerics" if near_tie and same_pair else "mismatch",
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
