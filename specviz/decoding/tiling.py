"""Verify-tile alignment: which draft lengths give a verify batch that suits the target's batch kernel.

llama.cpp's CPU kernels for quantised weights multiply four batch rows at a time; leftover rows take a
one-row path that reads every weight again, so a verify of 17 rows costs more than one of 16. The budget
(:mod:`specviz.decoding.budget`) rounds a draft down with :func:`tile_aligned`, the cost policy
(:mod:`specviz.decoding.policy`) only compares lengths that survive that rounding, and the verify-cost
measurement only times batch sizes a round can use.
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


def verify_tile(knobs: Mapping[str, Any]) -> int:
    """The verify tile in force: the ``verify_tile`` knob with alignment on, 1 (no rounding) without."""
    return int(knobs.get("verify_tile", 1)) if knobs.get("align", True) else 1
