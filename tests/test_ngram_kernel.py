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
