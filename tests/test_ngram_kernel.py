"""The n-gram search's C kernel (specviz/strategies/ngram_kernel.c) against its numpy reference, on
histories with many repeats, at every end and bound, and the fallback when it cannot be used."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specviz.strategies import ngram_kernel
from specviz.strategies.history import find_ngram, find_ngram_numpy
from specviz.strategies.ngram_map import _last_match, _last_match_numpy

needs_kernel = pytest.mark.skipif(
    ngram_kernel.unavailable_reason() is not None,
    reason=f"the n-gram kernel cannot be built here: {ngram_kernel.unavailable_reason()}",
)

histories = st.lists(st.integers(0, 3), min_size=0, max_size=80)  # four tokens: matches everywhere


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 6), st.integers(-2, 90), st.booleans(), st.integers(0, 2**31))
def test_find_ngram_agrees_with_numpy(hist, n, end, last, pick):
    arr = np.array(hist, dtype=np.int32)
    if arr.shape[0] >= n and pick % 2:  # a pattern from the history itself (found), or a random one
        at = pick % (arr.shape[0] - n + 1)
        pattern = arr[at : at + n].copy()
    else:
        pattern = np.array([(pick >> (2 * j)) & 3 for j in range(n)], dtype=np.int32)
    want = find_ngram_numpy(arr, pattern, end, last=last)
    assert ngram_kernel.find_ngram(arr, pattern, end, last) == want
    assert find_ngram(arr, pattern, end, last=last) == want


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 5), st.integers(0, 80), st.integers(0, 80), st.integers(0, 2**31))
def test_last_match_agrees_with_numpy(hist, n, hi, lo, pick):
    arr = np.array(hist, dtype=np.int32)
    hi = min(hi, arr.shape[0] - n)  # ngram-map asks only for positions whose n-gram fits
    lo = lo % hi if hi > 1 and lo % 3 else lo  # mostly a range that holds positions, sometimes none
    pattern = np.array([(pick >> (2 * j)) & 3 for j in range(n)], dtype=np.int32)
    want = _last_match_numpy(arr, pattern, hi, lo) if hi > lo else 0
    assert ngram_kernel.last_match(arr, pattern, hi, lo) == want
    assert _last_match(arr, pattern, hi, lo) == want


def test_other_arrays_take_numpy():
    arr = np.array([1, 2, 3, 1, 2, 3], dtype=np.int64)  # not int32: numpy's path, same answer
    pattern = np.array([1, 2], dtype=np.int64)
    assert ngram_kernel.find_ngram(arr, pattern, 6, True) is None
    assert find_ngram(arr, pattern, 6, last=True) == 3
    strided = np.array([1, 0, 2, 0, 1, 0, 2], dtype=np.int32)[::2]
    assert ngram_kernel.find_ngram(strided, np.array([1, 2], dtype=np.int32), 4, False) is None
    assert find_ngram(strided, np.array([1, 2], dtype=np.int32), 4, last=False) == 0


def test_the_switch_turns_the_kernel_off_and_numpy_answers():
    """``SPECVIZ_NGRAM_KERNEL=0`` (read when the kernel is first used) leaves the search to NumPy."""
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from specviz.strategies import ngram_kernel\n"
        "from specviz.strategies.history import find_ngram\n"
        "a = np.array([1, 2, 3, 1, 2, 3], dtype=np.int32)\n"
        "print(ngram_kernel.unavailable_reason(), ngram_kernel.find_ngram(a, a[:2], 6, True),"
        " find_ngram(a, a[:2], 6, last=True))\n"
    )
    env = {**__import__("os").environ, "SPECVIZ_NGRAM_KERNEL": "Off"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["SPECVIZ_NGRAM_KERNEL", "switches", "it", "off", "None", "3"]


# -- ngram-mod's pool: the polynomial hash, the last pending n-gram in a slot, a draft's chain -----------------
tokens = st.lists(st.one_of(st.integers(0, 3), st.integers(0, 2**31 - 1)), min_size=1, max_size=60)


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(tokens, st.integers(1, 30))
def test_poly_hash_agrees_with_python(toks, n):
    from specviz.strategies.ngram_mod import LCG_MULT, ngram_hash

    arr = np.array(toks, dtype=np.int32)
    for start in range(0, max(arr.shape[0] - n + 1, 0)):
        assert ngram_kernel.poly_hash(arr, start, n, LCG_MULT) == ngram_hash(toks[start : start + n])
    assert ngram_kernel.poly_hash(arr, arr.shape[0] - n + 1, n, LCG_MULT) is None  # past the end: refused


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 6), st.integers(1, 40), st.integers(0, 80), st.integers(0, 80), st.integers(0, 40))
@pytest.mark.slow
def test_poly_last_slot_agrees_with_hashing_every_position(hist, n, pool_size, start, stop, slot):
    """The kernel rolls the hash from one position to the next; the reference hashes each n-gram afresh.
    Small pools: many n-grams share a slot, so the last of them is what is compared."""
    from specviz.strategies.ngram_mod import LCG_MULT, ngram_hash

    arr = np.array(hist, dtype=np.int32)
    stop = min(stop, arr.shape[0] - n + 1)
    slot %= pool_size
    got = ngram_kernel.poly_last_slot(arr, start, stop, n, LCG_MULT, pool_size, slot)
    want = max((p for p in range(start, stop) if ngram_hash(hist[p : p + n]) % pool_size == slot), default=-1)
    assert got == want


def _mod_rounds(seed: int, kernel: bool) -> list:
    """A generation of random rounds of an ngram-mod drafter on a small pool: each round's peek, draft
    (tokens and reason) and state; with ``kernel`` False the pool's kernel calls are refused (the drafter's
    own loop and NumPy answer)."""
    from specviz import strategy_class

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    knobs = {"n_match": n, "n_min": int(rng.integers(1, 5)), "n_max": int(rng.integers(5, 40)), "pool_size": 1024}
    alphabet = int(rng.choice([3, 6, 50]))
    with pytest.MonkeyPatch.context() as mp:
        if not kernel:
            for name in ("poly_hash", "poly_last_slot", "poly_chain"):
                mp.setattr(ngram_kernel, name, lambda *a, **k: None)
        d = strategy_class("ngram-mod")(**knobs)
        h = rng.integers(0, alphabet, size=int(rng.integers(n + 1, 60))).tolist()
        d.begin(h)
        out = []
        for _ in range(60):
            peek = d.peek(h)
            if rng.random() < 0.6:
                draft = d.draft(h, int(rng.integers(0, 20)))
                k = int(rng.integers(0, len(draft.tokens) + 1))
                h = h + draft.tokens[:k] + rng.integers(0, alphabet, size=1).tolist()
                if draft.tokens:
                    d.accept(k, h)
                out.append((peek, draft.tokens, draft.reason))
            else:  # a plain round: one new token, no draft (the pending n-grams grow)
                h = h + rng.integers(0, alphabet, size=int(rng.integers(1, 3))).tolist()
                out.append((peek,))
            out.append(d.state())
    return out


@needs_kernel
def test_an_ngram_mod_drafter_drafts_and_peeks_the_same_with_the_kernel_and_without():
    """Drafts (the chain) and peeks (the window's slot and the last pending n-gram in it) through the
    kernel against the drafter's own loop and NumPy, over generations of random rounds: drafts accepted,
    cut and rejected, stretches of plain rounds, alphabets small enough that chains run into their own
    tokens and the pending n-grams repeat."""
    drafted = peeked = 0
    for seed in range(60):
        with_kernel = _mod_rounds(seed, kernel=True)
        assert with_kernel == _mod_rounds(seed, kernel=False), seed
        drafted += sum(1 for r in with_kernel if isinstance(r, tuple) and len(r) == 3 and r[1])
        peeked += sum(1 for r in with_kernel if isinstance(r, tuple) and len(r) == 1 and r[0] is not None)
    assert drafted > 100 and peeked > 100  # both paths were exercised, many times
