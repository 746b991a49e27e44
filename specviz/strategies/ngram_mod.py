"""``ngram-mod``: llama.cpp's constant-memory n-gram hasher.

A fixed pool of ``pool_size`` slots (int32, so 16 MiB at the default 4 Mi slots) maps the hash of an
n-gram of ``n_match`` tokens to the token that followed it; a later n-gram with the same slot overwrites
it (collisions are not detected, as upstream). The hash is the 64-bit LCG polynomial
``h = (…((t0·A + t1)·A + t2)…)·A + t(n-1)  mod 2^64`` with ``A = 6364136223846793005``, and the slot is
``h mod pool_size``.

Drafting starts from the last ``n_match`` tokens of the history, reads the token stored for their slot,
appends it, slides the window by one and repeats, up to ``n_max`` tokens. An empty slot ends the chain;
if that happens before ``n_min`` tokens were found there is no draft at all, so drafts are of variable
length in ``[n_min, n_max]`` or empty.

As upstream:

* ``begin`` adds every n-gram of the history whose next token is committed to the cache (upstream's
  ``begin`` receives the prompt without its last, pending token); afterwards new n-grams are added in
  chunks, once more than 32 tokens have accumulated past the last added position.
* if, after ``begin``, more than a quarter of the pool's slots are occupied, the pool is cleared
  (upstream's occupancy guard; with the default pool it needs a million distinct slots).
* after ``low_accept_streak`` consecutive drafts of which less than ``low_accept_ratio`` was accepted,
  the pool is cleared and refilled from the history at the next draft.

Different from upstream (on purpose):

* Upstream shares one pool between all requests of a server and never clears it in ``begin``. Here the
  pool is request-local: ``begin`` clears it and refills it from the history alone.
* The low-acceptance fraction is measured against the tokens actually proposed (after the round's cap
  ``n_max``), not against the uncapped chain. Upstream counts a chain of 64 cut to 3 tokens, all three
  accepted, as 3/64 accepted, and clears the pool after five such rounds.
* When a round allows fewer tokens than ``n_min`` (the session's ``draft_max``, the remaining budget or
  the context), a chain that fills the allowance is enough; upstream still requires ``n_min`` tokens
  before it cuts the draft. specviz has a ``draft_max`` below ``n_min`` by default (16 against 48), and
  the ``cost`` policy asks for short drafts: upstream's rule would leave them empty.

In a round the ``cost`` policy keeps plain, :meth:`peek` gives the first token a draft would propose
without adding anything: where a draft would first add the n-grams since the last add, the last of them
in the window's slot stands in for the pool's entry.

Restoring: the pool is always "the n-grams at history positions ``[lo, i_last)`` added in order", so it
is saved as those two numbers (with the acceptance streak and the last draft length) by
:meth:`~Drafter.state` and rebuilt from the history by :meth:`~Drafter.load_state`; the state's size does
not grow with the history. ``begin`` alone adds every n-gram before the pending token, which can differ from
a running session that has not yet added its last (fewer than 33) positions.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import numpy as np

from ..decoding.knob_schema import Knob
from ..errors import KnobError, SnapshotError
from . import ngram_kernel
from .base import Draft, PeekingDrafter

#: LCG multiplier of upstream's n-gram hash.
LCG_MULT = 6364136223846793005
_MASK = (1 << 64) - 1
#: Marker of an empty pool slot.
EMPTY = -1
#: New n-grams are added once more than this many tokens accumulated past the last added position.
ADD_CHUNK = 32
#: ``begin`` clears the pool when more than this fraction of its size was added onto occupied slots.
OCCUPANCY_RESET = 0.25


def ngram_hash(tokens: Sequence[int]) -> int:
    """Upstream's 64-bit LCG hash of an n-gram (before the modulo by the pool size)."""
    h = 0
    for t in tokens:
        h = (h * LCG_MULT + (int(t) & _MASK)) & _MASK
    return h


def _check_lengths(config: dict[str, Any]) -> None:
    """Cross-knob rule: ``n_min`` ≤ ``n_max``."""
    if config["n_min"] > config["n_max"]:
        raise KnobError(
            f"knob 'n_min': {config['n_min']} is larger than n_max={config['n_max']}; set n_min <= n_max",
            knob="n_min",
            value=config["n_min"],
        )


class NgramModDrafter(PeekingDrafter):
    """Rolling n-gram hash → next token in a fixed-size pool; variable-length chained drafts."""

    name = "ngram-mod"
    knob_rules = (_check_lengths,)
    state_format = "ngram-mod/1"
    knobs = (
        Knob(
            "n_match",
            int,
            24,
            "n-gram length hashed to find the next token (small values draft poorly)",
            lo=1,
            hi=1024,
            aliases=("--spec-ngram-mod-n-match",),
        ),
        Knob(
            "n_min",
            int,
            48,
            "shortest chain that is drafted; a shorter one gives no draft",
            lo=1,
            hi=1024,
            aliases=("--spec-ngram-mod-n-min",),
        ),
        Knob(
            "n_max",
            int,
            64,
            "longest chain followed through the pool",
            lo=1,
            hi=1024,
            aliases=("--spec-ngram-mod-n-max",),
        ),
        Knob(
            "pool_size",
            int,
            4 * 1024 * 1024,
            "number of pool slots (4 bytes each); memory is constant",
            lo=1024,
            hi=64 * 1024 * 1024,
        ),
        Knob(
            "low_accept_ratio",
            float,
            0.25,
            "a draft with a smaller accepted fraction counts as poorly accepted",
            lo=0.0,
            hi=1.0,
        ),
        Knob("low_accept_streak", int, 5, "this many poorly accepted drafts in a row clear the pool", lo=1, hi=1024),
    )

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self._pool = np.full(self.config["pool_size"], EMPTY, dtype=np.int32)
        self._clear_state()

    # -- pool -----------------------------------------------------------------------------------
    def _clear_pool(self) -> None:
        self._pool.fill(EMPTY)
        self._used = 0  # slots occupied since the last clear (upstream's `used`)

    def _clear_state(self) -> None:
        self._clear_pool()
        self._lo = 0  # the pool holds the n-grams at positions [lo, i_last), added in order
        self._i_last = 0
        self._n_draft_last = 0
        self._n_low = 0

    def slot(self, tokens: Sequence[int]) -> int:
        """Pool slot of an n-gram."""
        return ngram_hash(tokens) % self._pool.shape[0]

    def _slots(self, arr: np.ndarray, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The pool slots of the n-grams starting at ``start … stop-1`` and the token after each."""
        n = self.config["n_match"]
        starts = np.arange(start, stop, dtype=np.int64)
        h = np.zeros(starts.shape[0], dtype=np.uint64)
        mult = np.uint64(LCG_MULT)
        for j in range(n):
            h = h * mult + arr[starts + j].astype(np.uint64)  # wraps modulo 2^64, as size_t does
        return (h % np.uint64(self._pool.shape[0])).astype(np.int64), arr[starts + n]

    def _add_range(self, arr: np.ndarray, start: int, stop: int) -> None:
        """Add the n-grams starting at ``start … stop-1`` (each mapped to the token after it), in order."""
        if stop <= start:
            return
        slots, nxt = self._slots(arr, start, stop)
        # sequential semantics: the last add to a slot wins
        rev = slots[::-1]
        uniq, first_in_rev = np.unique(rev, return_index=True)
        was_empty = int(np.count_nonzero(self._pool[uniq] == EMPTY))
        self._used += was_empty  # slots newly occupied (upstream counts adds onto an empty slot)
        self._pool[uniq] = nxt[::-1][first_in_rev]

    def _due(self, cur_len: int) -> bool:
        """Whether a draft at this history length first adds the n-grams since the last add."""
        return self._i_last + ADD_CHUNK < cur_len

    # -- drafter --------------------------------------------------------------------------------
    def _begin(self, history: Sequence[int]) -> None:
        arr = self.tokens
        self._clear_state()
        n = self.config["n_match"]
        L = arr.shape[0] - 1  # upstream's begin gets the prompt without its newest (pending) token
        if L >= n:
            self._add_range(arr, 0, L - n)
            self._i_last = L - n
            if self._used / self._pool.shape[0] > OCCUPANCY_RESET:
                self._clear_pool()
                self._lo = self._i_last

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        arr = self.tokens
        self._n_draft_last = 0
        n = self.config["n_match"]
        L = arr.shape[0]
        cur_len = L - 1  # upstream's prompt excludes the newest (sampled) token
        if cur_len < n:
            return Draft(reason="short-history")
        if self._due(cur_len):
            self._add_range(arr, self._i_last, cur_len - n)
            self._i_last = cur_len - n

        # a round allowed fewer tokens than n_min (draft_max, budget, context) still drafts a full-length chain
        n_min = min(self.config["n_min"], n_max)
        out = self._chain(arr, L - n)
        if len(out) < n_min:  # an empty slot came before n_min tokens (n_min <= n_max: the chain stopped there)
            return Draft(reason="n-min")
        proposed = out[:n_max]
        self._n_draft_last = len(proposed)
        short = len(proposed) < n_max and len(out) < self.config["n_max"]
        return Draft(tokens=proposed, reason="no-match" if short else None)

    def _chain(self, arr: np.ndarray, start: int) -> list[int]:
        """The pool's tokens that follow the n-gram at ``start``, each read for the n-gram slid by the one
        before, up to ``n_max`` or the first empty slot: one kernel call, else the loop below (its reference)."""
        n, n_max = self.config["n_match"], self.config["n_max"]
        got = ngram_kernel.poly_chain(self._pool, EMPTY, arr, start, n, LCG_MULT, n_max)
        if got is not None:
            return got
        size = self._pool.shape[0]
        window = deque(int(t) for t in arr[start : start + n])
        h = ngram_hash(window)
        top = pow(LCG_MULT, n - 1, 1 << 64)  # weight of the window's oldest token
        out: list[int] = []
        for _ in range(n_max):
            tok = int(self._pool[h % size])
            if tok == EMPTY:
                break
            out.append(tok)
            old = window.popleft()
            window.append(tok)
            h = ((h - (old & _MASK) * top) * LCG_MULT + tok) & _MASK
        return out

    def peek(self, history: Sequence[int]) -> int | None:
        """The first token a draft would propose now (a one-token draft), with the pool as it is: where
        the draft would first add the n-grams since the last add, the last of them that lands in the
        window's slot stands in for the pool's entry (the last add to a slot wins), and nothing is added."""
        self.mirror.sync(history)
        arr = self.tokens
        n = self.config["n_match"]
        L = arr.shape[0]
        cur_len = L - 1
        if cur_len < n:
            return None
        h = ngram_kernel.poly_hash(arr, L - n, n, LCG_MULT)
        slot = h % self._pool.shape[0] if h is not None else self.slot(arr[L - n :].tolist())
        tok = int(self._pool[slot])
        if self._due(cur_len) and cur_len - n > self._i_last:
            last = self._last_pending(arr, self._i_last, cur_len - n, slot)
            if last >= 0:
                tok = int(arr[last + n])
        return None if tok == EMPTY else tok

    def _last_pending(self, arr: np.ndarray, start: int, stop: int, slot: int) -> int:
        """The last of the n-grams at ``start … stop-1`` (not added yet) that lands in ``slot``; -1 if none.
        In a stretch of plain rounds that range grows by a token a round (thousands of positions): the
        kernel rolls the hash along it, a few operations a position; without it, NumPy hashes them all."""
        n = self.config["n_match"]
        got = ngram_kernel.poly_last_slot(arr, start, stop, n, LCG_MULT, self._pool.shape[0], slot)
        if got is not None:
            return got
        slots, _ = self._slots(arr, start, stop)
        hits = np.flatnonzero(slots == slot)
        return int(hits[-1]) + start if hits.size else -1

    def _accept(self, n_accepted: int, history: Sequence[int]) -> None:
        if self._n_draft_last <= 0:
            return
        if n_accepted / self._n_draft_last < self.config["low_accept_ratio"]:
            self._n_low += 1
            if self._n_low >= self.config["low_accept_streak"]:
                self._clear_pool()
                self._n_low = 0
                self._i_last = 0
                self._lo = 0
        else:
            self._n_low = 0

    # -- introspection --------------------------------------------------------------------------
    @property
    def pool(self) -> np.ndarray:
        """The pool (read-only view): slot → next token, or ``EMPTY``."""
        v = self._pool.view()
        v.flags.writeable = False
        return v

    @property
    def pool_bytes(self) -> int:
        """Memory held by the pool, fixed by ``pool_size``."""
        return int(self._pool.nbytes)

    # -- state ----------------------------------------------------------------------------------
    def _export_state(self) -> dict[str, Any]:
        return {
            "n_match": self.config["n_match"],
            "pool_size": self.config["pool_size"],
            "lo": self._lo,
            "i_last": self._i_last,
            "n_low": self._n_low,
            "n_draft_last": self._n_draft_last,
        }

    def _import_state(self, d: dict[str, Any]) -> None:
        if (d["n_match"], d["pool_size"]) != (self.config["n_match"], self.config["pool_size"]):
            raise SnapshotError(
                f"ngram-mod state was saved with n_match={d['n_match']}, pool_size={d['pool_size']}; this "
                f"drafter has n_match={self.config['n_match']}, pool_size={self.config['pool_size']}: "
                "restore the knobs first"
            )
        lo, i_last = int(d["lo"]), int(d["i_last"])
        arr = self.tokens
        if not 0 <= lo <= i_last or (i_last > 0 and i_last + self.config["n_match"] > arr.shape[0]):
            raise ValueError(f"pool range [{lo}, {i_last}) does not fit a history of {arr.shape[0]} tokens")
        self._clear_pool()
        self._add_range(arr, lo, i_last)
        self._lo, self._i_last = lo, i_last
        self._n_low, self._n_draft_last = int(d["n_low"]), int(d["n_draft_last"])
