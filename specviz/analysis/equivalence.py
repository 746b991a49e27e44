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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .replay import replay_greedy

if TYPE_CHECKING:
    from ..decoding.round import RoundResult
    from ..decoding.session import Session


def greedy_run(
    session: Session, prompt: str | list[int], max_tokens: int, strategy: str, knobs: dict[str, Any]
) -> tuple[list[int], list[tuple[float, int, int]], list[RoundResult]]:
    """Generate ``prompt`` greedily with ``strategy`` and ``knobs`` on ``session``: the tokens, the target's
    top-two ``(margin, first, second)`` at each of them and the rounds."""
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


@dataclass(frozen=True)
class Divergence:
    """Where two greedy runs of one prompt first part (run ``a`` and run ``b``): the ``index`` into their
    tokens, each run's token there (None where that run had already stopped), each run's target top-two
    ``(margin, first, second)`` there (None where not recorded) and ``same_pair``: whether both runs' top two
    hold both tokens, i.e. the two runs chose between the same pair, which is what a batch-shape difference in
    the logits does at a near-tie and a bug in drafting, acceptance or the cache does not guarantee."""

    index: int
    token_a: int | None
    token_b: int | None
    margin_a: tuple[float, int, int] | None
    margin_b: tuple[float, int, int] | None
    same_pair: bool

    @property
    def margin(self) -> float | None:
        """The larger of the two runs' top-two margins at the divergence (logits; None if either is missing)."""
        if self.margin_a is None or self.margin_b is None:
            return None
        return max(self.margin_a[0], self.margin_b[0])


def first_divergence(
    a: Sequence[int],
    margins_a: Sequence[tuple[float, int, int]],
    b: Sequence[int],
    margins_b: Sequence[tuple[float, int, int]],
) -> Divergence | None:
    """The first position where greedy runs ``a`` and ``b`` of one prompt differ (None: the same tokens), with
    the runs' recorded top-two margins per token (``Session.record_margins``). Where one run stopped earlier,
    the divergence is at the shorter one's end."""
    n = min(len(a), len(b))
    i = next((j for j in range(n) if a[j] != b[j]), None)
    if i is None and len(a) == len(b):
        return None
    if i is None:
        i = n
    ma = margins_a[i] if i < len(margins_a) else None
    mb = margins_b[i] if i < len(margins_b) else None
    ta = a[i] if i < len(a) else None
    tb = b[i] if i < len(b) else None
    pair = {t for t in (ta, tb) if t is not None}
    same_pair = all(m is not None and {m[1], m[2]} >= pair for m in (ma, mb))
    return Divergence(i, ta, tb, ma, mb, same_pair)


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
    plain, plain_m, _ = greedy_run(session, prompt, max_tokens, "none", {})
    prompt_ids = list(session.prompt_tokens)
    spec, spec_m, rounds = greedy_run(session, prompt, max_tokens, strategy, knobs)
    tel = session.telemetry_dict()
    out: dict[str, Any] = {
        "strategy": strategy,
        "knobs": knobs,
        "threshold": threshold,
        "plain_tokens": len(plain),
        "speculative_tokens": len(spec),
        "acceptance_rate": tel["acceptance_rate"],
    }
    div = first_divergence(plain, plain_m, spec, spec_m)
    if div is None:
        out.update(verdict="identical", divergence=None, replay=None)
        return out
    i, tp, ts, pt, st = div.index, div.margin_a, div.margin_b, div.token_a, div.token_b
    within = threshold is None or (tp is not None and ts is not None and max(tp[0], ts[0]) < threshold)
    replay = None
    if div.same_pair and within:
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
