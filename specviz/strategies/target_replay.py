"""Re-evaluating the target's committed positions to read what a drafter needs from them.

Drafters that draft from the target's own internals (``eagle3``, ``mtp``, ``dflash``, ``dspark``) read
per-row outputs of the target's batches (hidden states, layer inputs). When a drafter cannot tell that
the target's last batch was the round's verify batch — it was switched in mid-generation, the cost
policy measured the verify cost, a long prompt took several batches, a rewind cut the history — it
evaluates the missing committed positions again with its outputs switched on: the same tokens at the
same positions, so the target's cache is unchanged (up to the CPU kernels' batch-size rounding). Exact,
and it costs one pass over the missing positions; on a recurrent or hybrid target the cache is first cut
back by its memory (:meth:`~specviz.backends.memory.ContextMemory.cut`: from the newest saved state at or
before the first missing position, the tokens after it evaluated again).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ContextError


def reevaluate(
    target_ctx: Any, history: Sequence[int], start: int, read: Callable[[int], np.ndarray], *, what: str
) -> np.ndarray:
    """Evaluate the committed positions ``start … len(history) - 2`` of the target again (in ``n_batch``
    chunks, no logits) and return ``read(n)`` of each chunk, concatenated: one row per position.

    The target's cache must hold exactly the committed positions (``what`` names the drafter in the
    :class:`~specviz.errors.ContextError` otherwise).
    """
    n_committed = len(history) - 1
    if target_ctx.kv_len() != n_committed:
        raise ContextError(
            f"the target cache holds {target_ctx.kv_len()} positions, the history {n_committed}; "
            f"the {what} drafter cannot catch up"
        )
    rows = []
    nb = target_ctx.capacity.n_batch
    # the memory drops the tail its own way (on a recurrent or hybrid target: from a saved state, the
    # tokens after it evaluated again without outputs), so the rows read below are exactly start … end
    target_ctx.memory.cut(start, history)
    for a in range(start, n_committed, nb):
        chunk = [int(t) for t in history[a : min(a + nb, n_committed)]]
        target_ctx.eval(chunk, a, rows="none")
        rows.append(read(len(chunk)))
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    return np.concatenate(rows)
