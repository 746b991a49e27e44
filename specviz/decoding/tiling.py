"""Verify-tile alignment: which draft lengths give a verify batch that suits the target's batch kernel.

llama.cpp's CPU kernels for quantised weights multiply four batch rows at a time; leftover rows take a
one-row path that reads every weight again, so a verify of 17 rows costs more than one of 16 (on this
project's 2-core host with the embedded model: 5 rows 47 ms against 4 rows 32, 9 rows 64 against 8 rows
49). The budget (:mod:`specviz.decoding.budget`) rounds a round's limit down with :func:`aligned_length`,
the round (:mod:`specviz.decoding.round`) rounds a draft that came back shorter than that limit down the
same way, the cost policy (:mod:`specviz.decoding.policy`) only compares lengths that survive that
rounding, and the verify-cost measurement only times batch sizes a round can use.
"""

from __future__ import annotations

from typing import Any, Mapping


def tile_aligned(k: int, tile: int) -> int:
    """The longest draft ``<= k`` whose verify batch (the draft plus the pending token) suits the tile.

    Batches of up to ``tile`` rows are left alone; longer ones are rounded down to a multiple of
    ``tile``. ``tile_aligned(16, 4) == 15`` (a batch of 16), ``tile_aligned(2, 4) == 2``.
    """
    if tile <= 1 or k + 1 <= tile or (k + 1) % tile == 0:
        return k
    return (k + 1) // tile * tile - 1


def aligned_length(k: int, tile: int, draft_min: int = 0) -> int:
    """``k`` draft tokens rounded down with :func:`tile_aligned`, unless that would leave fewer than
    ``max(draft_min, 1)`` (a draft that short would be dropped, so ``k`` stays): the one rounding rule, for a
    round's limit and for a draft shorter than it. ``aligned_length(6, 4) == 3``, ``aligned_length(6, 4, 4) == 6``.
    """
    aligned = tile_aligned(k, tile)
    return aligned if aligned >= max(draft_min, 1) else k


def verify_tile(knobs: Mapping[str, Any]) -> int:
    """The verify tile in force: the ``verify_tile`` knob with alignment on, 1 (no rounding) without."""
    return int(knobs.get("verify_tile", 1)) if knobs.get("align", True) else 1
