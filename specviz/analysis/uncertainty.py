"""How sure is a ratio of sums over a recording's rounds? A circular block bootstrap, for the advisor.

The advisor's expected tokens/s of a setting is a ratio of sums over the recorded rounds: the tokens the
rounds would commit over the seconds they would cost (:mod:`specviz.analysis.advise`). Whether a setting
pays is decided by how far that ratio stands from plain decoding's, and a recording of a few hundred
rounds leaves it uncertain: which rounds drew a long accepted copy and which a rejection is chance, and
the rounds of one generation are not independent (a text that falls into a loop gives a run of fully
accepted drafts). :func:`ratio_interval` estimates that uncertainty from the rounds themselves.

The method (Politis & Romano's circular block bootstrap): the rounds, in recorded order, are cut into
blocks of ``ceil(n ** (1/3))`` consecutive rounds (the order of block length Hall, Horowitz & Jing,
1995, find best for estimating a variance), starting anywhere and wrapping around the end so that every round is as
likely to be drawn; enough blocks to make ``n`` rounds are drawn with replacement, the ratio is computed
on them, :data:`BOOTSTRAP_SAMPLES` times, and the interval is the central :data:`CONFIDENCE` of those
ratios (percentiles). Blocks keep runs of alike rounds together, so a loop of accepted drafts counts as
the one piece of evidence it is rather than as many independent ones. The random draws come from a fixed
seed: the same rounds give the same interval, so the same recording gives the same advice.

What the interval does not cover: anything the rounds do not vary in — a verify-cost curve that is wrong
for every round alike, or other text than the recording's (a held-out prompt may copy more or less).
"""

from __future__ import annotations

import math

import numpy as np

#: the central share of bootstrap ratios the interval spans; its lower end is a one-sided 95% bound
CONFIDENCE = 0.90
#: bootstrap resamples per interval (the percentiles of 1000 move by well under 1% between seeds)
BOOTSTRAP_SAMPLES = 1000
#: the seed of the resampling, fixed so that an interval is a function of the rounds alone
SEED = 0


def block_length(n: int) -> int:
    """The bootstrap's block length for ``n`` rounds: ``ceil(n ** (1/3))``, at least 1."""
    return max(1, math.ceil(n ** (1.0 / 3.0) - 1e-9))


def ratio_interval(
    numerator: np.ndarray,
    denominator: np.ndarray,
    *,
    confidence: float = CONFIDENCE,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = SEED,
) -> tuple[float, float] | None:
    """The central ``confidence`` interval of ``sum(numerator) / sum(denominator)`` over a circular block
    bootstrap of the paired per-round values (see the module docstring), as ``(low, high)``. None for
    fewer than two rounds (nothing to resample: one round cannot show how much rounds vary)."""
    num = np.asarray(numerator, dtype=float)
    den = np.asarray(denominator, dtype=float)
    n = int(num.size)
    if n < 2 or den.size != n:
        return None
    length = block_length(n)
    blocks = math.ceil(n / length)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n, size=(samples, blocks))
    # every block is a difference of prefix sums over the rounds followed by their first ``length`` again
    # (the wrap-around), so a resample costs its blocks, not its rounds; the last block is cut to make n
    lengths = np.full(blocks, length)
    lengths[-1] = n - length * (blocks - 1)
    total_num = _block_sums(num, length, starts, lengths)
    total = _block_sums(den, length, starts, lengths)
    ratios = np.where(total > 0, total_num / np.where(total > 0, total, 1.0), 0.0)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)


def _block_sums(values: np.ndarray, length: int, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per resample (a row of ``starts``): the sum of ``values`` over its circular blocks."""
    prefix = np.concatenate(([0.0], np.cumsum(np.concatenate((values, values[:length])))))
    return (prefix[starts + lengths] - prefix[starts]).sum(axis=1)
