"""``ngram-cache``: llama.cpp's lookup decoding with n-gram statistics, in memory only.

For every n-gram of 1 to 4 tokens the drafter counts which tokens followed it. It drafts greedily, one
token at a time: for the last 4, 3, 2, then 1 tokens of the history plus the draft so far it takes the
first n-gram whose most frequent follower passes two thresholds — a minimum number of observations and a
minimum share of them — and appends that follower.

Two sets of statistics are consulted, as in upstream's ``common_ngram_cache_draft``:

* *context*: the current request's history, with lax thresholds (observations ≥ 2, 2, 1, 1 and share
  ≥ 66, 50, 50, 50 % for n = 1, 2, 3, 4);
* *dynamic*: the statistics of earlier, unrelated requests handled by this drafter, with strict
  thresholds (observations ≥ 4, 3, 2, 2 and share ≥ 75, 66, 66, 66 %). The previous request's context
  statistics are merged into them when ``begin`` receives a history that is neither an extension nor a
  prefix of the previous one (a new request rather than a restore or a strategy switch), as upstream's
  lookup example merges the context cache into the dynamic one after each generation.

Nothing is read from or written to files: there is no static cache (upstream's third, file-only level)
and the dynamic statistics live in memory (see the first seed document for why).

Different from upstream (on purpose):

* The context statistics cover every n-gram of the history, also those that straddle two draft calls.
  Upstream's server path updates its context cache from each call's new tokens alone, so n-grams spanning
  the boundary are missed and the result depends on when draft calls happened; the ``lookup`` example
  updates over the whole input, as here. This makes the context statistics a function of the history.
* Where two followers tie for the top count, the one seen first in the history wins (upstream's choice
  follows ``std::unordered_map`` iteration order, which is unspecified).
* The draft length is the ``n_draft`` knob (upstream hard-codes 8), capped by the session.

In a round the ``cost`` policy keeps plain, :meth:`peek` gives the first token a draft would propose.

Draft trees (``tree_width`` > 1, :mod:`~specviz.strategies.ngram_tree`): the draft walks the most counted
follower as above, and at each step the n-gram that gave it offers its other followers, the most counted first
(ties: the one seen first), as further branches while the tree has fewer than ``tree_width``; each branch walks
on from its own tail. The tree grows a depth at a time, every branch's step in branch order (a branch's own
follower before its splits), at most ``n_draft`` deep and at most the round's limit in nodes. Each position of
branch 0 reports its n-gram's followers as ``Draft.alternatives``. The statistics are a function of the
history, so a tree round needs no other bookkeeping. At ``tree_width`` 1 nothing changes.

Restoring: ``begin`` rebuilds the context statistics from the history; the dynamic statistics are saved
by :meth:`~Drafter.state` and brought back by :meth:`~Drafter.load_state`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..decoding.draft_tree import ROOT, DraftTree
from ..decoding.knob_schema import Knob
from .base import DRAFT_ALTERNATIVES, Draft, PeekingDrafter
from .knobs import TREE_WIDTH_KNOB
from .ngram_tree import tree_draft

NGRAM_MIN = 1
NGRAM_MAX = 4
#: Thresholds per n-gram size (index n-1): minimum observations and minimum share in percent.
LAX_MIN_SAMPLES = (2, 2, 1, 1)
LAX_MIN_PERCENT = (66, 50, 50, 50)
STRICT_MIN_SAMPLES = (4, 3, 2, 2)
STRICT_MIN_PERCENT = (75, 66, 66, 66)

# n-gram size -> n-gram -> follower token -> count (dicts keep first-seen order for tie-breaking)
_Stats = dict[int, dict[tuple[int, ...], dict[int, int]]]


def _empty_stats() -> _Stats:
    return {n: {} for n in range(NGRAM_MIN, NGRAM_MAX + 1)}


def _count(stats: _Stats, tokens: list[int], first: int) -> None:
    """Count, for every position ``i >= first`` of ``tokens``, the n-grams ending just before it."""
    for i in range(max(first, 1), len(tokens)):
        tok = tokens[i]
        for n in range(NGRAM_MIN, min(NGRAM_MAX, i) + 1):
            part = stats[n].setdefault(tuple(tokens[i - n : i]), {})
            part[tok] = part.get(tok, 0) + 1


def _merge(into: _Stats, add: _Stats) -> None:
    for n, table in add.items():
        dst = into[n]
        for key, part in table.items():
            d = dst.setdefault(key, {})
            for tok, c in part.items():
                d[tok] = d.get(tok, 0) + c


def _pick(stats: _Stats, tail: list[int], min_samples: Sequence[int], min_percent: Sequence[int]) -> int | None:
    """The confident follower of the longest qualifying n-gram ending ``tail``, else ``None``."""
    part = _qualifying(stats, tail, min_samples, min_percent)
    return None if part is None else _best(part)


def _best(part: dict[int, int]) -> int:
    """The most counted follower, the first seen on ties."""
    best, best_count = -1, 0
    for tok, c in part.items():
        if c > best_count:
            best, best_count = tok, c
    return best


def _ranked(part: dict[int, int]) -> list[int]:
    """The followers, the most counted first (ties: the first seen; the first is :func:`_best`'s)."""
    return sorted(part, key=lambda tok: -part[tok])  # stable: dict order breaks ties


def _qualifying(
    stats: _Stats, tail: list[int], min_samples: Sequence[int], min_percent: Sequence[int]
) -> dict[int, int] | None:
    """The followers of the longest n-gram ending ``tail`` whose most counted follower passes the thresholds."""
    for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
        if len(tail) < n:
            continue
        part = stats[n].get(tuple(tail[-n:]))
        if not part:
            continue
        best_count, total = max(part.values()), sum(part.values())
        if total < min_samples[n - 1] or 100 * best_count < min_percent[n - 1] * total:
            continue
        return part
    return None


class NgramCacheDrafter(PeekingDrafter):
    """Context + dynamic n-gram statistics (n = 1…4), greedy confident drafting; memory only."""

    name = "ngram-cache"
    state_format = "ngram-cache/1"
    knobs = (Knob("n_draft", int, 8, "most tokens drafted per round (upstream uses 8)", lo=1, hi=1024), TREE_WIDTH_KNOB)

    def __init__(self, **knobs: Any) -> None:
        super().__init__(**knobs)
        self._prev = np.zeros(0, dtype=np.int32)  # the history of the previous begin, to tell a new request
        self._context: _Stats = _empty_stats()
        self._dynamic: _Stats = _empty_stats()
        self._counted = 0  # history positions already counted into the context statistics

    def _begin(self, history: Sequence[int]) -> None:
        prev, new = self._prev, self.tokens
        k = min(prev.shape[0], new.shape[0])
        if prev.shape[0] and not np.array_equal(prev[:k], new[:k]):
            # a different request: keep what the previous one taught, as dynamic statistics
            self._sync_context(prev)
            _merge(self._dynamic, self._context)
        self._context = _empty_stats()
        self._counted = 0
        self._sync_context(new)
        self._prev = new.copy()

    def _sync_context(self, arr: np.ndarray) -> None:
        L = arr.shape[0]
        if L > self._counted:
            start = max(0, self._counted - NGRAM_MAX)
            _count(self._context, arr[start:].tolist(), self._counted - start)
            self._counted = L

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        arr = self.tokens
        self._prev = arr.copy()
        if arr.shape[0] < 2:  # upstream needs at least LLAMA_NGRAM_STATIC tokens
            return Draft(reason="short-history")
        self._sync_context(arr)
        seq = arr[max(0, arr.shape[0] - NGRAM_MAX) :].tolist()
        if int(self.config.get("tree_width", 1)) > 1:
            return self._draft_tree(seq, n_max)
        limit = min(self.config["n_draft"], n_max)
        out: list[int] = []
        while len(out) < limit:
            tok = self._next(seq[-NGRAM_MAX:])
            if tok is None:
                break
            out.append(tok)
            seq.append(tok)
        return Draft(tokens=out, reason="no-match" if len(out) < limit else None)

    def _next(self, tail: list[int]) -> int | None:
        """The token drafted after ``tail``: the context's confident follower, else the dynamic one's."""
        tok = _pick(self._context, tail, LAX_MIN_SAMPLES, LAX_MIN_PERCENT)
        if tok is None:
            tok = _pick(self._dynamic, tail, STRICT_MIN_SAMPLES, STRICT_MIN_PERCENT)
        return tok

    def _candidates(self, tail: list[int]) -> list[int]:
        """The followers of the n-gram :meth:`_next` drafts from, the most counted first (empty: no draft)."""
        part = _qualifying(self._context, tail, LAX_MIN_SAMPLES, LAX_MIN_PERCENT)
        if part is None:
            part = _qualifying(self._dynamic, tail, STRICT_MIN_SAMPLES, STRICT_MIN_PERCENT)
        return [] if part is None else _ranked(part)

    def _draft_tree(self, seq: list[int], n_max: int) -> Draft:
        """The walk as a tree (see the module docstring), from ``seq``, the history's last tokens."""
        width, depth_max = int(self.config["tree_width"]), int(self.config["n_draft"])
        tree = DraftTree()
        ranked: dict[int, list[int]] = {}  # node (ROOT too) -> its n-gram's followers, best first
        growing: list[tuple[int, list[int]]] = [(ROOT, seq)]  # (newest node, its tail), in branch order
        branches, depth = 1, 0
        while growing and depth < depth_max and len(tree) < n_max:
            step: list[tuple[int, list[int]]] = []
            for node, tail in growing:
                cands = ranked[node] = self._candidates(tail[-NGRAM_MAX:])
                if not cands:  # this branch's walk found no confident follower
                    continue
                room = min(width - branches, n_max - len(tree) - 1)
                kids = cands[: 1 + max(room, 0)]
                branches += len(kids) - 1
                for tok in kids:
                    if len(tree) >= n_max:
                        break
                    step.append((tree.add(tok, node), [*tail[-NGRAM_MAX + 1 :], tok]))
            growing, depth = step, depth + 1
        main = tree.branches[0] if len(tree) else []
        alternatives = [ranked[tree.parents[i]][:DRAFT_ALTERNATIVES] for i in main]
        stopped = ranked.get(main[-1] if main else ROOT) == []  # branch 0's walk ended, not the budget
        return tree_draft(tree, "no-match" if stopped else None, alternatives)

    def peek(self, history: Sequence[int]) -> int | None:
        """The first token a draft would propose now. The context statistics are brought up to the
        history first, as a draft does (they are a function of the history: counting the new tokens now or
        at the next draft gives the same statistics); nothing else is touched (a draft also remembers the
        history it saw, to tell a new request at ``begin``)."""
        self.mirror.sync(history)
        arr = self.tokens
        if arr.shape[0] < 2:
            return None
        self._sync_context(arr)
        return self._next(arr[max(0, arr.shape[0] - NGRAM_MAX) :].tolist())

    def _accept(self, n_accepted: int, history: Sequence[int]) -> None:
        self._prev = self.tokens.copy()

    # -- introspection --------------------------------------------------------------------------
    def followers(self, ngram: Sequence[int], *, dynamic: bool = False) -> dict[int, int]:
        """Counts of the tokens seen after ``ngram`` (1 to 4 tokens) in the context or dynamic statistics."""
        stats = self._dynamic if dynamic else self._context
        return dict(stats[len(ngram)].get(tuple(int(t) for t in ngram), {}))

    # -- state ----------------------------------------------------------------------------------
    def _export_state(self) -> dict[str, Any]:
        return {
            "dynamic": [
                [list(key), [[tok, c] for tok, c in part.items()]]
                for n in range(NGRAM_MIN, NGRAM_MAX + 1)
                for key, part in self._dynamic[n].items()
            ]
        }

    def _import_state(self, d: dict[str, Any]) -> None:
        dyn = _empty_stats()
        for key, part in d["dynamic"]:
            key_t = tuple(int(t) for t in key)
            if not NGRAM_MIN <= len(key_t) <= NGRAM_MAX:
                raise ValueError(f"n-gram {key_t} has a size outside {NGRAM_MIN}..{NGRAM_MAX}")
            dyn[len(key_t)][key_t] = {int(tok): int(c) for tok, c in part}
        self._dynamic = dyn
