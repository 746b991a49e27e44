"""Helpers of the differential tests: find llama.cpp's native tools and replay drafting rounds through them.

The tools are built by ``make llama-tools`` (``tools/build_llama_tools.sh``) into the cache directory that
``tools/llama_tools.py`` names. ``specviz-draft-replay`` is specviz's driver of llama.cpp's own draftless
drafters (``common_speculative_begin/draft/accept``, as ``examples/speculative-simple`` calls them): given
the same history and the same round results, it prints llama.cpp's draft for every round.

:func:`replay_rounds` runs a specviz drafter through a scripted generation — every round it drafts, the
"target" accepts the longest prefix that matches a fixed continuation and adds its own next token — and
returns specviz's drafts and llama.cpp's drafts for the same calls.
"""

from __future__ import annotations

import importlib.util
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
from conftest import IN_CI

from specviz.strategies import context_hooks, ngram_cache

_TOOLS = Path(__file__).resolve().parent.parent / "tools" / "llama_tools.py"
_spec = importlib.util.spec_from_file_location("llama_tools", _TOOLS)
assert _spec is not None and _spec.loader is not None
llama_tools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(llama_tools)


def native_tool(name: str) -> Path:
    """The path of a native tool; skips the test (fails it in CI) when the tools have not been built."""
    p = llama_tools.tool_path(name)
    if p is None:
        msg = (
            f"{name} is not built in {llama_tools.tools_dir()}: run `make llama-tools` (make test does) "
            "to build llama.cpp's tools from the vendored source"
        )
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return p


#: specviz strategy -> the replay driver's parameter names for its knobs
_REPLAY_PARAMS = {
    "ngram-simple": ("size_n", "size_m"),
    "ngram-map-k": ("size_n", "size_m", "min_hits"),
    "ngram-map-k4v": ("size_n", "size_m", "min_hits"),
    "ngram-mod": ("n_match", "n_min", "n_max"),
    "ngram-cache": (),
}


class Replay:
    """A running ``specviz-draft-replay`` (see tools/native/draft-replay.cpp), driven command by command."""

    def __init__(self, strategy: str, knobs: dict[str, Any]) -> None:
        params = " ".join(f"{k}={int(knobs[k])}" for k in _REPLAY_PARAMS[strategy] if k in knobs)
        self.proc = subprocess.Popen(
            [str(native_tool("specviz-draft-replay"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._send(f"init {strategy} {params}".strip())

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def push(self, tokens: Sequence[int]) -> None:
        if tokens:
            self._send("push " + " ".join(str(int(t)) for t in tokens))

    def last(self, token: int) -> None:
        self._send(f"last {int(token)}")

    def begin(self) -> None:
        self._send("begin")

    def draft(self, n_max: int) -> list[int]:
        """llama.cpp's draft for the current history, capped at ``n_max`` as the tool caps it."""
        self._send(f"draft {int(n_max)}")
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        parts = line.split()
        if not parts or parts[0] != "draft":
            self.close()
            raise RuntimeError(f"specviz-draft-replay answered {line!r}; stderr: {self.proc.stderr.read()[-1000:]}")
        toks = [int(t) for t in parts[2:]]
        assert len(toks) == int(parts[1])
        return toks

    def accept(self, n: int) -> None:
        self._send(f"accept {int(n)}")

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@dataclass
class Replayed:
    """The rounds of a replay: the calls made and what each side drafted."""

    n_max: list[int]
    specviz: list[list[int]]
    llama: list[list[int]]
    accepted: list[int]

    def first_difference(self) -> int | None:
        """Index of the first round where the drafts differ, or ``None``."""
        for i, (a, b) in enumerate(zip(self.specviz, self.llama)):
            if a != b:
                return i
        return None

    def describe(self, i: int) -> str:
        """A readable account of round ``i``."""
        return f"round {i} (n_max {self.n_max[i]}): specviz drafted {self.specviz[i]}, llama.cpp {self.llama[i]}"


def replay_rounds(
    drafter: Any,
    strategy: str,
    knobs: dict[str, Any],
    prompt: Sequence[int],
    truth: Sequence[int],
    n_max: int | Callable[[int], int] = 64,
    rounds: int | None = None,
) -> Replayed:
    """Run ``drafter`` (a specviz drafter built with ``knobs``) and llama.cpp's ``strategy`` on the same rounds.

    The generation starts from ``prompt``; ``truth`` is what the target generates after it, token for token:
    a round accepts the longest prefix of the draft that agrees with it, then the target's token follows.
    ``n_max`` (a number, or a function of the round index) is each round's cap on the draft, as the session
    passes it. The calls are those of llama.cpp's ``speculative-simple`` loop (begin with the prompt, then
    per round draft and accept). The replay stops at the first round where the two drafts differ (it is the
    last one returned), or when ``truth`` or ``rounds`` runs out.
    """
    history = [int(t) for t in prompt]
    full = history + [int(t) for t in truth]
    native = Replay(strategy, knobs)
    try:
        native.push(history[:-1])
        native.last(history[-1])
        native.begin()
        drafter.begin(list(history))
        caps: list[int] = []
        drafts: list[list[int]] = []
        theirs: list[list[int]] = []
        accepted: list[int] = []
        r = 0
        while rounds is None or r < rounds:
            cap = n_max(r) if callable(n_max) else n_max
            if len(history) + cap + 1 > len(full):
                break
            d = [int(t) for t in drafter.draft(list(history), cap).tokens]
            caps.append(cap)
            drafts.append(d)
            theirs.append(native.draft(cap))
            if theirs[-1] != d:
                break
            pos = len(history)
            n_acc = 0
            while n_acc < len(d) and d[n_acc] == full[pos + n_acc]:
                n_acc += 1
            accepted.append(n_acc)
            committed = d[:n_acc] + [full[pos + n_acc]]
            native.accept(n_acc)
            native.push([history[-1]] + committed[:-1])
            native.last(committed[-1])
            history += committed
            hooks = context_hooks(drafter)
            if hooks is not None:
                hooks.sync(list(history))
            if d:
                drafter.accept(n_acc, list(history))
            r += 1
    finally:
        native.close()
    return Replayed(caps, drafts, theirs, accepted)


# -- libstdc++'s std::unordered_map iteration order ----------------------------------------------------
# llama.cpp's ngram-cache keeps the followers of an n-gram in a std::unordered_map<llama_token, int> and,
# among followers with the same count, drafts the one its iteration meets first. The C++ standard leaves
# that order unspecified; specviz breaks such ties by first appearance instead (a documented departure).
# To compare everything else with llama.cpp, the differential tests reproduce the order GCC's libstdc++
# gives a map of int keys inserted one by one (std::hash<int> is the identity): a node goes to the front
# of its bucket's run of nodes, or to the front of the whole list when its bucket is empty; the table
# starts with 13 buckets and grows to the next prime of libstdc++'s list at least twice as large, re-linking
# the nodes in list order by the same rule.
_FAST_BUCKETS = (2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13)
_PRIMES = (
    2,
    3,
    5,
    7,
    11,
    13,
    17,
    19,
    23,
    29,
    31,
    37,
    41,
    43,
    47,
    53,
    59,
    61,
    67,
    71,
    73,
    79,
    83,
    89,
    97,
    103,
    109,
    113,
    127,
    137,
    139,
    149,
    157,
    167,
    179,
    193,
    199,
    211,
    227,
    241,
    257,
    277,
    293,
    313,
    337,
    359,
    383,
    409,
    439,
    467,
    503,
    541,
    577,
    619,
    661,
    709,
    761,
    823,
    887,
    953,
    1031,
    1109,
    1193,
    1289,
    1381,
    1493,
    1613,
)


def libstdcxx_order(keys: Sequence[int]) -> list[int]:
    """The iteration order of a libstdc++ ``std::unordered_map<int, ...>`` after inserting the distinct
    non-negative ``keys`` in the given order."""
    import bisect

    order: list[int] = []
    n_buckets, next_resize = 1, 0

    def place(lst: list[int], k: int, nb: int) -> None:
        for i, x in enumerate(lst):
            if x % nb == k % nb:
                lst.insert(i, k)
                return
        lst.insert(0, k)

    for k in keys:
        if len(order) + 1 > next_resize:
            min_buckets = max(len(order) + 1, 0 if next_resize else 11)
            if min_buckets >= n_buckets:
                want = max(min_buckets + 1, n_buckets * 2)
                if want < len(_FAST_BUCKETS):
                    nb = _FAST_BUCKETS[want]
                else:
                    i = bisect.bisect_left(_PRIMES, want, lo=6)
                    if i == len(_PRIMES):
                        raise ValueError("libstdcxx_order: too many keys for the tabulated bucket sizes")
                    nb = _PRIMES[i]
                new: list[int] = []
                for x in order:
                    place(new, x, nb)
                order, n_buckets, next_resize = new, nb, nb
            else:
                next_resize = n_buckets
        place(order, int(k), n_buckets)
    return order


# -- ngram-cache with llama.cpp's two behaviours specviz departs from ------------------------------------
def _upstream_pick(stats: Any, tail: list[int], min_samples: Sequence[int], min_percent: Sequence[int]) -> int | None:
    """``ngram_cache._pick`` with llama.cpp's tie-break: followers are met in libstdc++'s iteration order
    (specviz's statistics keep them in order of first appearance, which is the order of insertion)."""
    for n in range(ngram_cache.NGRAM_MAX, ngram_cache.NGRAM_MIN - 1, -1):
        if len(tail) < n:
            continue
        part = stats[n].get(tuple(tail[-n:]))
        if not part:
            continue
        best, best_count, total = None, 0, 0
        for tok in libstdcxx_order(list(part)):
            c = part[tok]
            if c > best_count:
                best, best_count = tok, c
            total += c
        if total < min_samples[n - 1] or 100 * best_count < min_percent[n - 1] * total:
            continue
        return best
    return None


class UpstreamNgramCache(ngram_cache.NgramCacheDrafter):
    """specviz's ngram-cache with its two documented departures undone, to compare the rest with llama.cpp:
    the context statistics are updated from each draft call's new tokens alone (n-grams that straddle two
    calls are missed, as in ``common/speculative.cpp``), and ties between followers go to the first in
    libstdc++'s ``unordered_map`` order. Everything else is specviz's own code."""

    def _sync_context(self, arr: Any) -> None:
        if arr.shape[0] > self._counted:
            ngram_cache._count(self._context, arr[self._counted :].tolist(), 0)
            self._counted = arr.shape[0]

    def _draft(self, history: Sequence[int], n_max: int) -> Any:
        saved = ngram_cache._pick
        ngram_cache._pick = _upstream_pick
        try:
            return super()._draft(history, n_max)
        finally:
            ngram_cache._pick = saved
