"""``ngram-map-k`` and ``ngram-map-k4v``: llama.cpp's n-gram map drafters (``common/ngram-map.cpp``).

Both look up the *key* — the last ``size_n`` tokens of the history — at an earlier occurrence that still
has ``size_m`` tokens after it before the newest token, and keep a small record per key they have looked
up. Nothing is drafted until the history holds ``2·size_n + size_m + 1`` tokens.

Which occurrence: as upstream, a *key index* (262144 slots, from a 32-bit LCG hash of the n-gram to a
position) is filled at every look-up with the positions that became searchable since the previous one,
newest first, and a slot keeps the first position written to it. A look-up takes the indexed position
when its slot holds one of this key, else searches backwards for the most recent occurrence among the
positions not indexed yet — first those of the history ``begin`` received, then the newer ones. So a key
keeps drafting from the occurrence it was first found at, and a key whose slot another key took is not
found once indexed. The positions from ``size_n + size_m`` tokens before the end of ``begin``'s history up
to its end are never searched after the first look-up (upstream's ranges leave them out). Upstream looks
up in every round; a round the ``cost`` policy keeps plain makes no look-up here, so the index then grows
in larger steps. Such a round asks :meth:`peek` instead (the first token a draft would propose, which
the policy checks against the target's token): the same look-up, with the key's record counted on a copy,
so nothing is recorded and the drafts that follow are those of a drafter that never peeked.

``ngram-map-k`` (key only)
    Drafts the ``size_m`` tokens (the *m-gram*) that follow the occurrence found. The record counts
    look-ups of the key and remembers how many tokens of its last draft the target accepted: the next
    draft for that key is no longer than that (it starts at ``size_m``; once a draft of the key is wholly
    rejected, the key never drafts again, as upstream).

``ngram-map-k4v`` (key and up to four values)
    Once the key has been looked up ``min_hits`` times, the record counts the m-grams (*values*) that
    followed the key's occurrences, up to four distinct ones: every look-up counts the occurrences from
    where the previous one stopped up to the occurrence found, that one included — so with an indexed
    key, the value after its indexed occurrence gains one count per look-up. A draft is made when the
    most frequent value has at least twice the sum of the others' counts; it is the tokens after the
    occurrence found (upstream's comment says the dominant value's, its code takes these), capped by the
    dominant value's accepted count.

specviz follows upstream's code rather than its comment: replayed on synthetic histories of repeated
phrases, these rules draft about 60% more tokens than counting each occurrence once and drafting the
dominant value's tokens, at the same or a higher acceptance rate, in 27-35% fewer rounds.

Where this differs from llama.cpp (on purpose):

* ``ngram-map-k`` honours ``min_hits`` too. Upstream's key-only path returns before the check, so the
  option (documented for ``ngram-map-k``) does nothing there. With the default ``min_hits=1`` the two
  agree.
* ``check_rate`` (search only every this many tokens of history) has no upstream counterpart; at its
  default 1 it changes nothing.
* Upstream's ``begin`` on a shorter history prunes the records of the dropped part (a server reusing the
  map for its next request); here ``begin`` starts the map afresh from the history it gets.

Draft trees (``tree_width`` > 1, :mod:`~specviz.strategies.ngram_tree`): a look-up that drafts proposes
the key's stored values as a tree. Branch 0 is the chain's draft (the tokens after the occurrence found, as
long as the chain's cap allows); the other values follow, the most counted first (ties: the lower slot), each
as long as its cap allows, merged into a trie of at most ``tree_width`` branches. ``ngram-map-k`` then counts
its key's values as ``ngram-map-k4v`` does (upstream's key-only record counts none), keeping its key's cap, the
key's accepted count, in value 0 as upstream, and caps every branch by it. ``ngram-map-k4v`` drafts where the
values the tree holds have at least twice the count of those it leaves out (with one value held, the chain's
rule), so a key whose values no single one dominates drafts them together. After a tree round, the cap of
every value the target followed through the whole accepted path (read from the committed history) becomes the
accepted count; a value the target left for a sibling keeps its cap (``ngram-map-k``: the key's cap becomes the
accepted count, as for a chain). At ``tree_width`` 1 nothing changes.

Restoring: the records, the key index and the look-up position depend on when look-ups happened, not on
the history alone; they are saved by :meth:`~Drafter.state` and brought back by :meth:`~Drafter.load_state`.
"""

from __future__ import annotations

import bisect
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

from ..errors import SnapshotError
from . import ngram_kernel
from .base import Draft, PeekingDrafter
from .knobs import TREE_WIDTH_KNOB, ngram_size_knobs
from .ngram_tree import followed, tree_draft, trie_of

#: Values (distinct m-grams) tracked per key, as upstream.
MAX_VALUES = 4
#: Counters saturate here, as upstream.
COUNT_CAP = 16380
#: A value is used when its count is at least this many times the sum of the other values' counts.
DOMINANCE = 2
#: Slots of the key index, as upstream (``COMMON_NGRAM_HASH_MAP_SIZE``).
INDEX_SIZE = 262144
#: Multiplier of upstream's 32-bit LCG hash of a key.
LCG_FACTOR = 2654435761
_MASK32 = (1 << 32) - 1
#: Ranges of at most this many new positions (a round's one or two) are indexed one position at a time
#: in plain Python: the vectorised hash is a dozen NumPy calls per n-gram token, which for one position
#: cost ten times the loop. ``ngram-map-k4v`` counts values over ranges this short in plain Python too.
SMALL_RANGE = 8


def key_hash(tokens: Iterable[int]) -> int:
    """Upstream's 32-bit LCG hash of an n-gram (before the modulo by the index size)."""
    h = 0
    for t in tokens:
        h = (h * LCG_FACTOR + int(t)) & _MASK32
    return h


def _hashes(arr: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """:func:`key_hash` of the n-grams at ``starts`` (vectorised, wrapping modulo 2^32)."""
    h = np.zeros(starts.shape[0], dtype=np.uint64)
    for j in range(n):
        h = (h * np.uint64(LCG_FACTOR) + arr[starts + j].astype(np.uint64)) & np.uint64(_MASK32)
    return h


def _last_match(arr: np.ndarray, pattern: np.ndarray, hi: int, lo: int) -> int:
    """The largest ``j`` with ``lo < j <= hi`` where ``arr[j:j+n] == pattern``; 0 if none (one call of the
    C kernel where it can be had, else numpy)."""
    if hi <= lo:
        return 0
    got = ngram_kernel.last_match(arr, pattern, hi, lo)
    if got is not None:
        return got
    return _last_match_numpy(arr, pattern, hi, lo)


def _last_match_numpy(arr: np.ndarray, pattern: np.ndarray, hi: int, lo: int) -> int:
    """:func:`_last_match` with numpy only (the kernel's reference, and its fallback)."""
    n = pattern.shape[0]
    cand = np.flatnonzero(arr[lo + 1 : hi + 1] == pattern[0]) + lo + 1
    for k in range(1, n):
        if cand.size == 0:
            break
        cand = cand[arr[cand + k] == pattern[k]]
    return int(cand[-1]) if cand.size else 0


class _Key:
    """The record of one key n-gram: where it was first matched, where its value counting stopped,
    how often it was looked up, and ``[value_idx, value_num, n_accepted]`` per value slot."""

    __slots__ = ("key_idx", "stat_idx", "key_num", "values")

    def __init__(self, key_idx: int, m: int) -> None:
        self.key_idx = key_idx
        self.stat_idx = 0  # the next look-up counts occurrences from here (inclusive)
        self.key_num = 0
        # value_idx 0 means an unused slot (a value can never start at index 0)
        self.values = [[0, 0, m] for _ in range(MAX_VALUES)]

    def copy(self) -> _Key:
        """An independent copy (a peek decides on one)."""
        other = _Key(self.key_idx, 0)
        other.stat_idx, other.key_num = self.stat_idx, self.key_num
        other.values = [list(v) for v in self.values]
        return other


class _NgramMapBase(PeekingDrafter):
    """Shared look-up, bookkeeping and state handling of the two n-gram map drafters."""

    key_only: ClassVar[bool] = True
    state_format = "ngram-map/2"

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self._index = np.zeros(INDEX_SIZE, dtype=np.uint32)  # hash slot -> key position (0: empty)
        self._reset(0)

    def _reset(self, size_begin: int) -> None:
        self._keys: dict[tuple[int, ...], _Key] = {}
        self._index.fill(0)
        # the filled slots of _index as [slot, position] pairs sorted by slot, kept up to date as slots are
        # filled: state() is taken after every round (a rewind checkpoint), and building the list from the
        # index each time cost more than the round's drafting (its copy is a list copy; a pair, once
        # filled, never changes, so states taken in different rounds share them)
        self._pairs: list[list[int]] = []
        # each key's exported record, rebuilt only for the keys changed since the last state()
        self._key_states: dict[tuple[int, ...], dict[str, Any]] = {}
        self._changed: set[tuple[int, ...]] = set()
        self._index_last = 0  # positions up to this one have been indexed (upstream's key_map_last_idx)
        self._size_begin = size_begin  # the history length begin() received (upstream's size_last_begin)
        self._idx_last_check = 0  # history length at the last look-up (for check_rate)
        self._last: tuple[tuple[int, ...], int] | None = None  # (key, value slot) of the last draft
        # a tree's (key, [(value slot, start, tokens held)], history length at the draft) until its accept
        self._last_tree: tuple[tuple[int, ...], list[tuple[int, int, int]], int] | None = None

    @property
    def _tree(self) -> bool:
        return int(self.config.get("tree_width", 1)) > 1

    def _begin(self, history: Sequence[int]) -> None:
        self._reset(max(len(history) - 1, 0))  # upstream's begin gets the prompt without its pending token

    # -- drafting -------------------------------------------------------------------------------
    def _skip(self, cur_len: int) -> str | None:
        """Why no look-up is made at this history length (None: one is)."""
        n, m = self.config["size_n"], self.config["size_m"]
        if cur_len < 2 * n + m:
            return "short-history"
        if self._idx_last_check + self.config["check_rate"] > cur_len > self._idx_last_check:
            return "check-rate"
        return None

    def _decide(
        self, inp: np.ndarray, key_arr: np.ndarray, key_list: list[int], rec: _Key, pos: int
    ) -> tuple[str | None, int, int]:
        """A look-up of the key ``rec`` records, found at ``pos``: counts it in ``rec`` (and the values, for
        ``ngram-map-k4v``) and returns ``(reason, value slot, tokens to draft)``, reason None for a draft."""
        m = self.config["size_m"]
        rec.key_num = min(rec.key_num + 1, COUNT_CAP)
        if rec.key_num < self.config["min_hits"]:  # ngram-map-k too: see the module docstring
            return "min-hits", 0, 0
        slot = 0
        if not self.key_only or self._tree:  # a tree holds the key's values: ngram-map-k counts them too
            cap = rec.values[0][2]
            self._count_values(inp, key_arr, key_list, rec, pos, m)
            if self.key_only:  # ngram-map-k's key cap lives in value 0 (upstream's); counting must not reset it
                rec.values[0][2] = cap
        if not self.key_only:
            counts = [v[1] for v in rec.values]
            slot = max(range(MAX_VALUES), key=lambda v: (counts[v], -v))  # first slot with the top count
            others = sum(counts) - counts[slot]
            if others > 0 and counts[slot] < DOMINANCE * others:
                return "ambiguous", slot, min(m, rec.values[slot][2])
        return None, slot, min(m, rec.values[slot][2])

    def _tree_paths(self, rec: _Key, pos: int, slot: int, n_draft: int) -> list[tuple[int, int, int]]:
        """A tree's continuations in priority order as ``(value slot, start, length)``: the chain's draft (the
        tokens after the occurrence found, credited to the best-counted value), then every counted value, the
        most counted first, each capped as its draft would be."""
        n, m = self.config["size_n"], self.config["size_m"]
        out = [(slot, pos + n, n_draft)]
        counted = [s for s in range(MAX_VALUES) if rec.values[s][0] != 0 and rec.values[s][1] > 0]
        for s in sorted(counted, key=lambda s: (-rec.values[s][1], s)):
            cap = rec.values[0 if self.key_only else s][2]
            out.append((s, rec.values[s][0], min(m, cap)))
        return out

    def _draft_tree(
        self, inp: np.ndarray, rec: _Key, pos: int, decided: tuple[str | None, int, int], n_max: int
    ) -> tuple[Draft, list[tuple[int, int, int]]]:
        """The key's values as a tree (see the module docstring) and the continuations it holds as
        ``(value slot, start, tokens held)``; an empty Draft with the reason where it does not draft."""
        reason, slot, n_draft = decided
        paths = self._tree_paths(rec, pos, slot, n_draft)
        tree, held = trie_of([inp[s : s + k].tolist() for _, s, k in paths], self.config["tree_width"], n_max)
        kept = [(v, s, h) for (v, s, _), h in zip(paths, held) if h > 0]
        if not self.key_only:
            counts = [v[1] for v in rec.values]
            held_count = sum(counts[v] for v in {v for v, _, _ in kept})
            others = sum(counts) - held_count
            if others > 0 and held_count < DOMINANCE * others:
                return Draft(reason="ambiguous"), []
        if not kept:
            return Draft(reason=reason or "accept-cap"), []
        capped = n_draft < min(self.config["size_m"], n_max)
        return tree_draft(tree, "accept-cap" if capped and tree.is_chain else None), kept

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        self._last = None
        self._last_tree = None
        arr = self.tokens
        n, m = self.config["size_n"], self.config["size_m"]
        cur_len = arr.shape[0] - 1  # upstream's inp excludes the newest (sampled) token
        skip = self._skip(cur_len)
        if skip is not None:
            return Draft(reason=skip)
        self._idx_last_check = cur_len

        key_arr = arr[arr.shape[0] - n :]
        key_list = key_arr.tolist()
        inp = arr[:cur_len]
        pos = self._look_up(inp, key_arr, key_list, cur_len, n, m)
        self._extend_index(inp, cur_len, n, m)
        if pos == 0:
            return Draft(reason="no-match")

        key = tuple(key_list)
        rec = self._keys.get(key)
        if rec is None:
            rec = self._keys[key] = _Key(pos, m)
        self._changed.add(key)  # its count moved (and its values may below)
        reason, slot, n_draft = self._decide(inp, key_arr, key_list, rec, pos)
        if self._tree and reason != "min-hits":
            d, kept = self._draft_tree(inp, rec, pos, (reason, slot, n_draft), n_max)
            if kept:
                self._last_tree = (key, kept, arr.shape[0])
            return d
        if reason is not None:
            return Draft(reason=reason)
        self._last = (key, slot)
        tokens = inp[pos + n : pos + n + n_draft].tolist()
        capped = n_draft < min(m, n_max)
        return Draft(tokens=tokens, reason="accept-cap" if capped else None)

    def peek(self, history: Sequence[int]) -> int | None:
        """The first token a draft would propose now, with no look-up recorded: the same look-up on the
        key index as it stands (a draft indexes the new positions only after looking up), the decision
        made on a copy of the key's record."""
        self.mirror.sync(history)
        arr = self.tokens
        n, m = self.config["size_n"], self.config["size_m"]
        cur_len = arr.shape[0] - 1
        if self._skip(cur_len) is not None:
            return None
        key_arr = arr[arr.shape[0] - n :]
        key_list = key_arr.tolist()
        inp = arr[:cur_len]
        pos = self._look_up(inp, key_arr, key_list, cur_len, n, m)
        if pos == 0:
            return None
        rec = self._keys.get(tuple(key_list))
        rec = rec.copy() if rec is not None else _Key(pos, m)
        reason, slot, n_draft = self._decide(inp, key_arr, key_list, rec, pos)
        if self._tree and reason != "min-hits":
            d, _ = self._draft_tree(inp, rec, pos, (reason, slot, n_draft), m)
            return d.tokens[0] if d.tokens else None
        return int(inp[pos + n]) if reason is None and n_draft > 0 else None

    def _ranges(self, cur_len: int, n: int, m: int) -> list[tuple[int, int]]:
        """The not yet indexed positions, as ``(hi, lo)`` meaning ``lo < j <= hi``: those of begin's
        history first, then the newer ones (upstream's two descending loops)."""
        out = []
        if self._size_begin > n + m + 1:
            out.append((self._size_begin - n - m - 1, self._index_last))
        out.append((cur_len - n - m - 1, max(self._size_begin, self._index_last)))
        return out

    def _look_up(self, inp: np.ndarray, key_arr: np.ndarray, key_list: list[int], cur_len: int, n: int, m: int) -> int:
        """The key's position: the indexed one if its slot holds this key, else the most recent in the
        not yet indexed ranges (begin's history first); 0 when there is none. ``key_list`` is ``key_arr``
        as Python ints: the hash and the slot's check read it as a list (numpy's per-element reads and
        ``array_equal`` on a dozen tokens cost several times a list's)."""
        j = int(self._index[key_hash(key_list) % INDEX_SIZE])
        if j != 0 and j < cur_len - n - m - 1 and inp[j : j + n].tolist() == key_list:
            return j
        for hi, lo in self._ranges(cur_len, n, m):
            j = _last_match(inp, key_arr, hi, lo)
            if j:
                return j
        return 0

    def _extend_index(self, inp: np.ndarray, cur_len: int, n: int, m: int) -> None:
        """Index the new positions, newest first in each range; a slot keeps its first position."""
        for hi, lo in self._ranges(cur_len, n, m):
            if hi <= lo:
                continue
            if hi - lo <= SMALL_RANGE:
                new = []
                for j in range(hi, lo, -1):  # newest first: a slot keeps the first position written
                    slot = key_hash(inp[j : j + n].tolist()) % INDEX_SIZE
                    if self._index[slot] == 0:
                        self._index[slot] = j
                        new.append([slot, j])
                self._add_pairs(new)
                continue
            starts = np.arange(hi, lo, -1, dtype=np.int64)  # descending, as upstream writes them
            slots = (_hashes(inp, starts, n) % np.uint64(INDEX_SIZE)).astype(np.int64)
            uniq, first = np.unique(slots, return_index=True)
            free = self._index[uniq] == 0
            new_slots, new_pos = uniq[free], starts[first[free]]
            self._index[new_slots] = new_pos
            self._add_pairs(np.column_stack((new_slots, new_pos)).tolist())
        self._index_last = max(cur_len - n - m - 1, self._index_last)

    def _add_pairs(self, new: list[list[int]]) -> None:
        """Merge newly filled [slot, position] pairs (in slot order) into the sorted list."""
        if len(new) <= 32:  # a round's few: each put in its place
            for p in new:
                bisect.insort(self._pairs, p)
        else:  # begin's whole prompt: one sort over two sorted runs
            self._pairs.extend(new)
            self._pairs.sort()

    @staticmethod
    def _count_values(inp: np.ndarray, key_arr: np.ndarray, key_list: list[int], rec: _Key, pos: int, m: int) -> None:
        """Count the m-grams after the key's occurrences from ``rec.stat_idx`` to ``pos`` inclusive.

        Once a key is indexed, every look-up after its first counts one position (the occurrence found,
        where the previous count stopped): a range of at most ``SMALL_RANGE`` positions is searched and
        compared as Python lists, a longer one with numpy (the same counts: a test compares the two)."""
        n = key_arr.shape[0]
        lo = rec.stat_idx
        if pos >= lo:
            if pos - lo < SMALL_RANGE:
                seg = inp[lo : pos + n].tolist()
                cand = [lo + i for i in range(pos - lo + 1) if seg[i : i + n] == key_list]
            else:
                found = np.flatnonzero(inp[lo : pos + 1] == key_arr[0]) + lo
                for k in range(1, n):
                    found = found[inp[found + k] == key_arr[k]]
                cand = found.tolist()
            for i in cand:
                vi = i + n
                value = inp[vi : vi + m].tolist()
                for v in rec.values:
                    if v[0] == 0:  # free slot: a new value
                        v[0], v[1], v[2] = vi, 0, m
                    elif inp[v[0] : v[0] + m].tolist() != value:
                        continue
                    v[1] = min(v[1] + 1, COUNT_CAP)
                    break
                # a fifth distinct value is not counted (all four slots taken)
        rec.stat_idx = pos  # upstream restarts at the occurrence found, so it is counted again

    def _accept(self, n_accepted: int, history: Sequence[int]) -> None:
        if self._last_tree is not None:
            self._accept_tree(n_accepted, *self._last_tree)
            self._last_tree = None
        if self._last is None:
            return
        key, slot = self._last
        self._keys[key].values[slot][2] = int(n_accepted)
        self._changed.add(key)
        self._last = None

    def _accept_tree(self, n_accepted: int, key: tuple[int, ...], kept: list[tuple[int, int, int]], at: int) -> None:
        """After a tree round on ``key`` drafted at history length ``at``, holding ``kept`` (value slot, start,
        tokens held): the caps of the values the target followed through the whole accepted path become
        ``n_accepted`` (``ngram-map-k``: the key's cap), read from the committed history."""
        rec = self._keys[key]
        self._changed.add(key)
        if self.key_only:
            rec.values[0][2] = int(n_accepted)
            return
        arr = self.tokens
        paths = [arr[s : s + h].tolist() for _, s, h in kept]
        for (slot, _, _), went in zip(kept, followed(paths, arr[at:].tolist(), n_accepted)):
            if went:
                rec.values[slot][2] = int(n_accepted)

    # -- state ----------------------------------------------------------------------------------
    def _export_state(self) -> dict[str, Any]:
        ks = self._key_states
        for k in self._changed:
            r = self._keys[k]
            ks[k] = {
                "tokens": list(k),
                "key_idx": r.key_idx,
                "stat_idx": r.stat_idx,
                "key_num": r.key_num,
                "values": [list(v) for v in r.values],
            }
        self._changed.clear()
        return {
            "kind": self.name,
            "size_n": self.config["size_n"],
            "size_m": self.config["size_m"],
            "idx_last_check": self._idx_last_check,
            "size_begin": self._size_begin,
            "index_last": self._index_last,
            "index": list(self._pairs),
            "keys": [ks[k] for k in self._keys],
            "last": None if self._last is None else {"tokens": list(self._last[0]), "slot": self._last[1]},
            "last_tree": None
            if self._last_tree is None
            else {
                "tokens": list(self._last_tree[0]),
                "values": [list(v) for v in self._last_tree[1]],
                "at": self._last_tree[2],
            },
        }

    def _import_state(self, d: dict[str, Any]) -> None:
        if d["kind"] != self.name or (d["size_n"], d["size_m"]) != (self.config["size_n"], self.config["size_m"]):
            raise SnapshotError(
                f"drafter state was saved by {d['kind']!r} with size_n={d['size_n']}, size_m={d['size_m']}; "
                f"this is {self.name!r} with size_n={self.config['size_n']}, size_m={self.config['size_m']}: "
                "restore the knobs first"
            )
        keys: dict[tuple[int, ...], _Key] = {}
        for e in d["keys"]:
            rec = _Key(int(e["key_idx"]), self.config["size_m"])
            rec.stat_idx, rec.key_num = int(e["stat_idx"]), int(e["key_num"])
            vals = [[int(x) for x in v] for v in e["values"]]
            if len(vals) != MAX_VALUES or any(len(v) != 3 for v in vals):
                raise ValueError("each key needs four [value_idx, value_num, n_accepted] slots")
            rec.values = vals
            keys[tuple(int(t) for t in e["tokens"])] = rec
        index = np.zeros(INDEX_SIZE, dtype=np.uint32)
        for slot, j in d["index"]:
            if not 0 <= int(slot) < INDEX_SIZE or int(j) <= 0:
                raise ValueError(f"key index entry {slot} -> {j} is out of range")
            index[int(slot)] = int(j)
        last = d["last"]
        self._keys = keys
        self._index = index
        used = np.flatnonzero(index)
        self._pairs = np.column_stack((used, index[used].astype(np.int64))).tolist()
        self._key_states = {}
        self._changed = set(keys)
        self._index_last = int(d["index_last"])
        self._size_begin = int(d["size_begin"])
        self._idx_last_check = int(d["idx_last_check"])
        self._last = None if last is None else (tuple(int(t) for t in last["tokens"]), int(last["slot"]))
        tree = d.get("last_tree")  # absent from states saved before trees
        self._last_tree = (
            None
            if tree is None
            else (
                tuple(int(t) for t in tree["tokens"]),
                [(int(v), int(s), int(h)) for v, s, h in tree["values"]],
                int(tree["at"]),
            )
        )


class NgramMapKDrafter(_NgramMapBase):
    """Key n-gram → the m-gram after its occurrence, capped by the key's accepted count."""

    name = "ngram-map-k"
    knobs = (*ngram_size_knobs("ngram-map-k", min_hits=True), TREE_WIDTH_KNOB)
    key_only = True


class NgramMapK4VDrafter(_NgramMapBase):
    """Key n-gram → up to four counted m-gram values; drafts when one value clearly dominates."""

    name = "ngram-map-k4v"
    knobs = (*ngram_size_knobs("ngram-map-k4v", min_hits=True), TREE_WIDTH_KNOB)
    key_only = False
