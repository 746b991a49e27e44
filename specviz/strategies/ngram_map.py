"""``ngram-map-k`` and ``ngram-map-k4v``: llama.cpp's n-gram map drafters.

Both look up the *key* — the last ``size_n`` tokens of the history — at its most recent earlier
occurrence that still has ``size_m`` tokens after it and ends before the newest token, and keep a small
record per key they have looked up.

``ngram-map-k`` (key only)
    Drafts the ``size_m`` tokens (the *m-gram*) that followed the most recent occurrence of the key. The
    record counts look-ups of the key (``min_hits`` must be reached before it drafts) and remembers how
    many tokens of its last draft the target accepted: the next draft for that key is no longer than
    that (llama.cpp's per-key accepted count, which starts at ``size_m``).

``ngram-map-k4v`` (key and up to four values)
    The record also holds up to four distinct m-grams seen after the key, each with the number of times
    it occurred. A draft is made only when one value is clearly the most frequent — at least twice the
    sum of the others' counts — and it is capped by that value's accepted count as above.

As upstream, nothing is drafted until the history holds ``2·size_n + size_m + 1`` tokens, and the
search runs at most every ``check_rate`` tokens of history.

Where this differs from llama.cpp's ``common/ngram-map.cpp`` (on purpose):

* ``ngram-map-k`` honours ``min_hits`` too (upstream's key-only path returns before the check; its
  documentation says the option applies). With the default ``min_hits=1`` nothing changes.
* ``ngram-map-k4v`` drafts the tokens of the dominant value. Upstream's comment says so, but its code
  copies the tokens after the most recent key occurrence, which can be a different, rarer value.
* ``ngram-map-k4v`` counts each occurrence of a key once. Upstream rescans from the previous match
  position inclusive, so that occurrence is counted again at every later look-up of the key.
* Upstream's optional hash index from key to position (a first-writer-wins speed-up whose choice of
  occurrence depends on when draft calls happened) is not reproduced: the most recent occurrence is
  always used, as upstream's linear search does.

Restoring: with ``check_rate=1``, ``min_hits=1`` and no accept feedback shorter than a draft, the state
is a function of the history, so a drafter begun on a history drafts exactly as one fed incrementally
(``ngram-map-k4v`` counts occurrences, which the history determines). Look-up counts, the check-rate
position and accepted counts depend on how the session ran; they are saved by :meth:`~Drafter.state` and
brought back by :meth:`~Drafter.load_state`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import numpy as np

from ..errors import SnapshotError
from .base import Draft, Drafter
from .history import find_ngram
from .knobs import ngram_size_knobs

#: Values (distinct m-grams) tracked per key, as upstream.
MAX_VALUES = 4
#: Counters saturate here, as upstream.
COUNT_CAP = 16380
#: A value is used when its count is at least this many times the sum of the other values' counts.
DOMINANCE = 2


def _occurrences(arr: np.ndarray, pattern: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Start indices ``i`` in ``[start, stop]`` (inclusive) where ``arr[i:i+len(pattern)] == pattern``."""
    n = pattern.shape[0]
    stop = min(stop, arr.shape[0] - n)
    if stop < start:
        return np.zeros(0, dtype=np.int64)
    cand = np.flatnonzero(arr[start:stop + 1] == pattern[0]) + start
    for j in range(1, n):
        if cand.size == 0:
            break
        cand = cand[arr[cand + j] == pattern[j]]
    return cand


class _Key:
    """The record of one key n-gram: where it was first matched, how far its values were counted,
    how often it was looked up, and ``[value_idx, value_num, n_accepted]`` per value slot."""

    __slots__ = ("key_idx", "stat_idx", "key_num", "values")

    def __init__(self, key_idx: int, m: int) -> None:
        self.key_idx = key_idx
        self.stat_idx = 0  # next history index to scan for occurrences (values counted before it)
        self.key_num = 0
        # value_idx 0 means an unused slot (a value can never start at index 0)
        self.values = [[0, 0, m] for _ in range(MAX_VALUES)]


class _NgramMapBase(Drafter):
    """Shared look-up, bookkeeping and state handling of the two n-gram map drafters."""

    key_only: ClassVar[bool] = True
    state_format = "ngram-map/1"

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self._reset()

    def _reset(self) -> None:
        self._keys: dict[tuple[int, ...], _Key] = {}
        self._idx_last_check = 0
        self._last: tuple[tuple[int, ...], int] | None = None  # (key, value slot) of the last draft

    def _begin(self, history: Sequence[int]) -> None:
        self._reset()

    # -- drafting -------------------------------------------------------------------------------
    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        self._last = None
        arr = self.tokens
        n, m = self.config["size_n"], self.config["size_m"]
        cur_len = arr.shape[0] - 1  # upstream's inp excludes the newest (sampled) token
        if cur_len < 2 * n + m:
            return Draft(reason="short-history")
        if self._idx_last_check + self.config["check_rate"] > cur_len > self._idx_last_check:
            return Draft(reason="check-rate")
        self._idx_last_check = cur_len

        key_arr = arr[arr.shape[0] - n:]
        inp = arr[:cur_len]
        # most recent start j in [1, cur_len-n-m-1]: m tokens follow the key inside inp, before its end
        pos = find_ngram(inp, key_arr, cur_len - n - m, last=True)
        if pos <= 0:
            return Draft(reason="no-match")

        key = tuple(int(t) for t in key_arr)
        rec = self._keys.get(key)
        if rec is None:
            rec = self._keys[key] = _Key(pos, m)
        rec.key_num = min(rec.key_num + 1, COUNT_CAP)
        if rec.key_num < self.config["min_hits"]:
            return Draft(reason="min-hits")

        if self.key_only:
            slot, start = 0, pos + n
        else:
            self._count_values(inp, key_arr, rec, pos, m)
            counts = [v[1] for v in rec.values]
            slot = max(range(MAX_VALUES), key=lambda v: (counts[v], -v))  # first slot with the top count
            top, others = counts[slot], sum(counts) - counts[slot]
            if top == 0:
                return Draft(reason="no-match")
            if others > 0 and top < DOMINANCE * others:
                return Draft(reason="ambiguous")
            start = rec.values[slot][0]

        n_draft = min(m, rec.values[slot][2])
        self._last = (key, slot)
        tokens = inp[start:start + n_draft].tolist()
        capped = n_draft < min(m, n_max)
        return Draft(tokens=tokens, reason="accept-cap" if capped else None)

    @staticmethod
    def _count_values(inp: np.ndarray, key_arr: np.ndarray, rec: _Key, pos: int, m: int) -> None:
        """Count the m-grams after every not yet counted occurrence of the key up to ``pos``."""
        for i in _occurrences(inp, key_arr, rec.stat_idx, pos).tolist():
            vi = i + key_arr.shape[0]
            for v in rec.values:
                if v[0] == 0:  # free slot: a new value
                    v[0], v[1], v[2] = vi, 0, m
                elif not np.array_equal(inp[vi:vi + m], inp[v[0]:v[0] + m]):
                    continue
                v[1] = min(v[1] + 1, COUNT_CAP)
                break
            # a fifth distinct value is not tracked (all four slots taken)
        rec.stat_idx = max(rec.stat_idx, pos + 1)

    def _accept(self, n_accepted: int, history: Sequence[int]) -> None:
        if self._last is None:
            return
        key, slot = self._last
        self._keys[key].values[slot][2] = int(n_accepted)
        self._last = None

    # -- state ----------------------------------------------------------------------------------
    def _export_state(self) -> dict[str, Any]:
        return {
            "kind": self.name,
            "size_n": self.config["size_n"],
            "size_m": self.config["size_m"],
            "idx_last_check": self._idx_last_check,
            "keys": [
                {"tokens": list(k), "key_idx": r.key_idx, "stat_idx": r.stat_idx, "key_num": r.key_num,
                 "values": [list(v) for v in r.values]}
                for k, r in self._keys.items()
            ],
            "last": None if self._last is None else {"tokens": list(self._last[0]), "slot": self._last[1]},
        }

    def _import_state(self, d: dict[str, Any]) -> None:
        if d["kind"] != self.name or (d["size_n"], d["size_m"]) != (self.config["size_n"], self.config["size_m"]):
            raise SnapshotError(
                f"drafter state was saved by {d['kind']!r} with size_n={d['size_n']}, size_m={d['size_m']}; "
                f"this is {self.name!r} with size_n={self.config['size_n']}, size_m={self.config['size_m']}: "
                "restore the knobs first")
        keys: dict[tuple[int, ...], _Key] = {}
        for e in d["keys"]:
            rec = _Key(int(e["key_idx"]), self.config["size_m"])
            rec.stat_idx, rec.key_num = int(e["stat_idx"]), int(e["key_num"])
            vals = [[int(x) for x in v] for v in e["values"]]
            if len(vals) != MAX_VALUES or any(len(v) != 3 for v in vals):
                raise ValueError("each key needs four [value_idx, value_num, n_accepted] slots")
            rec.values = vals
            keys[tuple(int(t) for t in e["tokens"])] = rec
        last = d["last"]
        self._keys = keys
        self._idx_last_check = int(d["idx_last_check"])
        self._last = None if last is None else (tuple(int(t) for t in last["tokens"]), int(last["slot"]))



class NgramMapKDrafter(_NgramMapBase):
    """Key n-gram → the m-gram after its most recent occurrence, capped by the key's accepted count."""

    name = "ngram-map-k"
    knobs = ngram_size_knobs("ngram-map-k", min_hits=True)
    key_only = True


class NgramMapK4VDrafter(_NgramMapBase):
    """Key n-gram → up to four counted m-gram values; drafts the clearly most frequent one."""

    name = "ngram-map-k4v"
    knobs = ngram_size_knobs("ngram-map-k4v", min_hits=True)
    key_only = False
