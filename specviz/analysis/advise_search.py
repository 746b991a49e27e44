"""Scoring and searching draft settings on recorded rounds (a replay; no model needed).

A round that drafted ``L`` tokens of which the target accepted ``n`` is replayed under a setting
(:func:`replay_rounds`): the draft is cut at ``draft_max`` (after verify-tile alignment) and at the first
token whose draft probability is below ``draft_p_min``, rounded down to suit the verify tile; a cut draft
shorter than ``max(draft_min, 1)`` is dropped (a plain round). A drafting round commits ``min(n, k) + 1``
tokens and costs the verify of ``k + 1`` tokens, its drafting (a model drafter's seconds per token times
``k``, an n-gram drafter's seconds per call) and the fitted overhead; a plain round commits 1 token for a
one-token verify. Greedy acceptance of a prefix does not depend on the tokens after it, so each cut round is
exact; how later rounds would have differed is not known, so the score is of the per-round mix recorded.

:func:`score` is tokens/s (committed tokens over seconds); the speedup is over plain decoding, one token
per one-token verify. :func:`search` tries ``draft_max`` up to the longest draft recorded,
:data:`DRAFT_MIN_GRID` and, for model drafters, :data:`P_MIN_GRID` from the recorded ``draft_p_min`` up;
:func:`server_grid` limits it to what llama-server's flags express. :func:`with_interval` adds the
speedup's block-bootstrap interval (:mod:`specviz.analysis.uncertainty`); :func:`choose` advises the fastest
setting whose interval's lower end clears 1.0, else plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..decoding.tiling import aligned_length, tile_aligned
from ..decoding.verify_cost import VerifyCostModel
from .advise_rounds import Rounds, recorded_tile
from .uncertainty import ratio_interval

#: The draft_min values searched (capped by draft_max).
DRAFT_MIN_GRID = (0, 1, 2, 3, 4, 6, 8)
#: The draft_p_min values searched (model drafters; from the recorded draft_p_min up).
P_MIN_GRID = tuple(round(0.1 * i, 1) for i in range(10))


@dataclass
class Candidate:
    """One scored setting."""

    strategy: str
    draft_max: int
    draft_min: int
    draft_p_min: float | None
    tokens_per_second: float
    tokens_per_round: float
    speedup: float
    #: the speedup's bootstrap interval over the rounds it was scored on (:mod:`specviz.analysis.uncertainty`;
    #: None where it was not estimated: plain decoding, fewer than two rounds)
    speedup_low: float | None = None
    speedup_high: float | None = None
    #: the rounds the setting was scored on
    rounds: int = 0

    @property
    def shown_to_pay(self) -> bool:
        """Whether the lower end of the speedup's interval clears plain decoding (1.0)."""
        return self.speedup_low is not None and self.speedup_low > 1.0

    def interval_text(self) -> str:
        """``"1.20-1.36x"``, or ``""`` without an interval."""
        if self.speedup_low is None or self.speedup_high is None:
            return ""
        return f"{self.speedup_low:.2f}-{self.speedup_high:.2f}x"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return dict(self.__dict__)


def first_below(probs: list[list[float | None]], p_min: float) -> np.ndarray:
    """Per round: index of the first draft token whose probability is below ``p_min`` (its length if none)."""
    out = np.empty(len(probs), dtype=np.int64)
    for i, ps in enumerate(probs):
        j = next((j for j, p in enumerate(ps) if p is not None and p < p_min), len(ps))
        out[i] = j
    return out


def replay_rounds(
    r: Rounds,
    cost: VerifyCostModel,
    kmax: int,
    kmin: int,
    p_min: float | None,
    tile: int,
    first_below: np.ndarray | None,
    overhead: tuple[float, float] = (0.0, 0.0),
) -> tuple[np.ndarray, np.ndarray]:
    """Per round of ``r`` replayed under one setting (see the module docstring): the tokens it commits and
    the seconds it costs."""
    limit = aligned_length(kmax, tile, kmin)
    k = np.minimum(r.length, limit)
    if p_min is not None and first_below is not None:
        k = np.minimum(k, first_below)
    # what the round does to a draft shorter than its limit, by table (k never exceeds the limit)
    k = np.asarray([aligned_length(j, tile, kmin) for j in range(limit + 1)], dtype=np.int64)[k]
    plain = (k < max(kmin, 1)) | (r.length == 0)
    n_tok = np.where(plain, 1, np.minimum(r.accepted, k) + 1)
    vcost = np.array([cost(int(b)) for b in range(1, int(r.length.max(initial=0)) + 2)])
    verify = np.where(plain, vcost[0], vcost[np.maximum(k, 0)])
    if r.has_probs:  # a model drafter: its seconds per drafted token
        per_tok = r.draft_seconds / np.maximum(r.length, 1)
        draft = np.where(r.length == 0, r.draft_seconds, per_tok * np.maximum(k, 1))
    else:
        draft = r.draft_seconds
    return n_tok.astype(float), verify + draft + overhead[0] + overhead[1] * n_tok


def score(
    r: Rounds,
    cost: VerifyCostModel,
    kmax: int,
    kmin: int,
    p_min: float | None,
    tile: int,
    first_below: np.ndarray | None,
    overhead: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float]:
    """(tokens/s, tokens/round) of rounds ``r`` replayed under one setting (see the module docstring)."""
    n_tok, seconds = replay_rounds(r, cost, kmax, kmin, p_min, tile, first_below, overhead)
    total = float(np.sum(seconds))
    return (float(np.sum(n_tok)) / total if total > 0 else 0.0), float(np.mean(n_tok)) if n_tok.size else 0.0


def with_interval(
    c: Candidate,
    r: Rounds,
    cost: VerifyCostModel,
    tile: int,
    overhead: tuple[float, float],
    base: float,
) -> Candidate:
    """``c`` (a setting scored on rounds ``r``) with the uncertainty of its speedup: the interval of
    :func:`~specviz.analysis.uncertainty.ratio_interval` over ``r``'s rounds replayed under the setting, over
    plain decoding's tokens/s ``base``, and the number of rounds it is from. The interval stays None with
    fewer than two rounds."""
    fb = first_below(r.probs, c.draft_p_min) if c.draft_p_min else None
    n_tok, seconds = replay_rounds(r, cost, c.draft_max, c.draft_min, c.draft_p_min, tile, fb, overhead)
    iv = ratio_interval(n_tok, seconds)
    c.rounds = int(n_tok.size)
    if iv is not None and base > 0:
        c.speedup_low, c.speedup_high = iv[0] / base, iv[1] / base
    return c


def rescore(
    c: Candidate, r: Rounds, cost: VerifyCostModel, tile: int, overhead: tuple[float, float], base: float
) -> Candidate:
    """Setting ``c`` scored anew on rounds ``r`` (nothing searched), with its interval over them."""
    fb = first_below(r.probs, c.draft_p_min) if c.draft_p_min else None
    tps, tpr = score(r, cost, c.draft_max, c.draft_min, c.draft_p_min, tile, fb, overhead)
    new = Candidate(c.strategy, c.draft_max, c.draft_min, c.draft_p_min, tps, tpr, tps / base if base else 0.0)
    return with_interval(new, r, cost, tile, overhead, base)


#: n-gram types without a minimum draft length in llama.cpp (``--spec-draft-n-min`` serves model drafts only)
NO_DRAFT_MIN = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "prompt-lookup")
#: llama.cpp's ngram-cache drafts up to this many tokens (hard-coded in common/speculative.cpp)
NGRAM_CACHE_DRAFT = 8


def server_grid(strategy: str, longest: int, knobs: dict[str, Any] | None = None) -> tuple[list[int], tuple[int, ...]]:
    """The ``draft_max`` and ``draft_min`` values llama-server's flags can express for ``strategy`` (drafts
    recorded up to ``longest`` tokens, under ``knobs``).

    An n-gram type's ``draft_max`` is its m-gram size in the server (``--spec-ngram-simple-size-m``), not a
    cap on a longer draft: llama.cpp's ngram-simple drafts nothing at all when fewer than ``size_n``
    tokens would be copied (``common_ngram_simple_draft``), so an m-gram shorter than ``size_n`` never
    drafts, and those values are left out (a recorded draft cut to them would be scored as drafting)."""
    kmaxes = list(range(1, longest + 1))
    if strategy == "ngram-cache":
        kmaxes = [min(NGRAM_CACHE_DRAFT, longest)]
    size_n = (knobs or {}).get("size_n")
    if strategy == "ngram-simple" and isinstance(size_n, int):  # a recording's knobs hold it
        kmaxes = [k for k in kmaxes if k >= size_n]
    return kmaxes, ((0,) if strategy in NO_DRAFT_MIN else DRAFT_MIN_GRID)


def search(
    r: Rounds,
    cost: VerifyCostModel,
    base: float,
    tile: int,
    overhead: tuple[float, float] = (0.0, 0.0),
    for_server: bool = False,
) -> Candidate | None:
    """The setting with the highest expected tokens/s for rounds ``r`` (plain decoding at ``base`` tokens/s),
    searched over the grids (see the module docstring; :func:`server_grid` with ``for_server``) at verify
    tile ``tile``; None when ``r`` never drafted. Of equal scores the first found wins."""
    if not r.length.size or r.length.max() == 0:
        return None
    kmaxes, kmins = (
        server_grid(r.strategy, int(r.length.max()), r.knobs)
        if for_server
        else (list(range(1, int(r.length.max()) + 1)), DRAFT_MIN_GRID)
    )
    recorded_pmin = float(r.knobs.get("draft_p_min", 0.0) or 0.0) if r.has_probs else None
    pmins: list[float | None] = (
        [p for p in P_MIN_GRID if p >= recorded_pmin - 1e-9] if recorded_pmin is not None else [None]
    )
    best: Candidate | None = None
    for p in pmins:
        fb = first_below(r.probs, p) if p is not None and p > 0 else None
        for kmax in kmaxes:
            if tile_aligned(kmax, tile) != kmax:
                continue  # the session would round it down: the shorter one is scored already
            for kmin in kmins:
                if kmin > kmax:
                    break
                tps, tpr = score(r, cost, kmax, kmin, p, tile, fb, overhead)
                if best is None or tps > best.tokens_per_second * (1 + 1e-9):
                    best = Candidate(r.strategy, kmax, kmin, p, tps, tpr, tps / base if base else 0.0)
    return best


@dataclass
class GroupScore:
    """A group of rounds scored: its best setting (with its interval), the setting it ran with scored the same
    way, and the limit of the search in words."""

    best: Candidate
    current: Candidate
    limit: str


def score_group(
    r: Rounds,
    cost: VerifyCostModel,
    base: float,
    overhead: tuple[float, float],
    *,
    for_server: bool = False,
) -> GroupScore | None:
    """The best setting of rounds ``r`` (plain decoding at ``base`` tokens/s), the setting they ran with and the
    limits of the search; None for a group that never drafted. ``for_server``: only what llama-server's flags
    express (:func:`server_grid`, no tile alignment)."""
    run_tile = recorded_tile(r.knobs)
    tile = 1 if for_server else run_tile
    c = search(r, cost, base, tile, overhead, for_server=for_server)
    if c is None:
        return None
    best = with_interval(c, r, cost, tile, overhead, base)
    kmax, kmin = int(r.knobs.get("draft_max", int(r.length.max()))), int(r.knobs.get("draft_min", 0))
    p = float(r.knobs["draft_p_min"]) if r.has_probs and "draft_p_min" in r.knobs else None
    tps, tpr = score(r, cost, kmax, kmin, p, run_tile, first_below(r.probs, p) if p else None, overhead)
    current = Candidate(r.strategy, kmax, kmin, p, tps, tpr, tps / base)
    longest = int(r.length.max())
    limit = f"draft_max searched up to {longest}, the longest draft recorded" + (
        f"; draft_p_min from {p:g}, the value it drafted with" if p is not None else ""
    )
    return GroupScore(best, current, limit)


@dataclass
class Choice:
    """The advised setting and its group's label, and the fastest setting not advised (None if there is none)."""

    label: str
    best: Candidate
    declined_label: str = ""
    declined: Candidate | None = None


def choose(per_group: dict[str, Candidate], base: float) -> Choice:
    """Of the groups' best settings (``per_group``, not empty) whose speedup is shown to pay (the lower end of
    its interval above 1.0, :attr:`Candidate.shown_to_pay`), the one with the highest expected tokens/s; else
    plain decoding (at ``base`` tokens/s), with the fastest setting that beats plain decoding only within the
    recording's uncertainty as the one declined."""
    paying = {k: c for k, c in per_group.items() if c.shown_to_pay}
    fastest = max(per_group.items(), key=lambda kv: kv[1].tokens_per_second)
    if paying:
        label, best = max(paying.items(), key=lambda kv: kv[1].tokens_per_second)
        if fastest[0] != label:
            return Choice(label, best, fastest[0], fastest[1])
        return Choice(label, best)
    label, best = fastest
    plain = Candidate("none", 0, 0, None, base, 1.0, 1.0)
    return Choice("none", plain, label, best) if best.speedup > 1.0 else Choice("none", plain)
