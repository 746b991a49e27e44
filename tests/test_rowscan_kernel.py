"""The row scan's C kernel (specviz/decoding/rowscan_kernel.c) against float64 numpy, and its fallback."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from specviz.decoding import rowscan_kernel
from specviz.decoding.rows_reference import RowScan
from specviz.decoding.rowscan import ScoredRow

needs_kernel = pytest.mark.skipif(
    rowscan_kernel.unavailable_reason() is not None,
    reason=f"the row-scan kernel is not available here: {rowscan_kernel.unavailable_reason()}",
)


def reference(row: np.ndarray) -> tuple[float, float]:
    """(max, Σ exp(x − max)) in float64 with NaN as −∞."""
    r = np.where(np.isnan(row), -np.inf, row).astype(np.float64)
    m = float(r.max())
    return m, float(np.exp(r - m).sum())


@needs_kernel
@pytest.mark.parametrize("n", [1, 7, 255, 256, 257, 4096 + 13, 262144])
@pytest.mark.parametrize("scale", [0.5, 4.0, 40.0])
def test_the_kernel_matches_float64(n, scale):
    rng = np.random.default_rng(n)
    row = (rng.standard_normal(n) * scale).astype(np.float32)
    m, z = reference(row)
    got = rowscan_kernel.expsum(row, m)
    assert got is not None and abs(got - z) <= 2e-7 * z


@needs_kernel
def test_nan_and_minus_infinity_count_for_nothing_and_far_values_underflow():
    row = np.array([0.0, np.nan, -np.inf, -1.0, -200.0, np.nan] * 100, dtype=np.float32)
    got = rowscan_kernel.expsum(row, 0.0)
    assert got == pytest.approx(100 * (1 + np.exp(-1.0)), rel=1e-7)
    one = np.zeros(1, dtype=np.float32)
    assert rowscan_kernel.expsum(one, 0.0) == pytest.approx(1.0, rel=1e-7)


@needs_kernel
def test_every_exponent_of_the_range_is_accurate():
    x = np.linspace(-86.0, 0.0, 20001).astype(np.float32)
    got = np.array([rowscan_kernel.expsum(x[i : i + 1], 0.0) for i in range(x.shape[0])])
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(got - want) / want) < 2e-7


def test_other_arrays_and_a_switched_off_kernel_get_numpy(monkeypatch):
    row = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    assert rowscan_kernel.expsum(row.astype(np.float64), 0.0) is None
    assert rowscan_kernel.expsum(row[::2], 0.0) is None  # not contiguous
    with_kernel = [ScoredRow(row).prob(t) for t in (0, 5, int(np.argmax(row)))]
    monkeypatch.setenv("SPECVIZ_ROWSCAN_KERNEL", "0")
    assert rowscan_kernel.expsum(row, float(row.max())) is None
    assert rowscan_kernel.unavailable_reason() == "SPECVIZ_ROWSCAN_KERNEL switches it off"
    numpy_only = [ScoredRow(row).prob(t) for t in (0, 5, int(np.argmax(row)))]
    assert np.allclose(with_kernel, numpy_only, rtol=1e-6, atol=0)
    m, z = reference(row)
    assert numpy_only[2] == pytest.approx(1 / z, rel=1e-6)


def _lib():
    import ctypes

    return ctypes.CDLL(str(rowscan_kernel.build()))


#: Every build of the one-pass scan: the dispatching entry point, the plain-C one and the AVX2 one (which a
#: CPU with AVX-512 never dispatches to, so it is called here).
PATHS = ["dispatched", "plain-c", "avx2"]
#: The rejection row's two passes have one build (plain C, vectorised by the compiler): both its names.
ROW_QUESTION_PATHS = ["dispatched", "plain-c"]


def _path(which: str) -> str:
    """The C function suffix for a path (skipping the test where this CPU cannot run it)."""
    if which == "avx2" and "avx2" not in rowscan_kernel.vector_paths():
        pytest.skip("this CPU has no AVX2 with FMA: the AVX2 path cannot run here")
    return {"plain-c": "_generic", "avx2": "_avx2"}.get(which, "")


def _scan(which: str):
    """One build of the one-pass scan, as :func:`rowscan_kernel.scan` returns it."""
    import ctypes

    suffix = _path(which)
    if not suffix:
        return rowscan_kernel.scan
    fn = getattr(_lib(), "specviz_scan" + suffix)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]

    def scan(row: np.ndarray) -> RowScan:
        best, out = ctypes.c_int64(), (ctypes.c_double * 2)()
        nan = fn(row.ctypes.data, row.shape[0], ctypes.addressof(best), ctypes.addressof(out))
        return RowScan(best.value, out[0], out[1], bool(nan))

    return scan


@needs_kernel
@pytest.mark.parametrize("which", PATHS)
@pytest.mark.parametrize("n", [1, 7, 16, 255, 256, 257, 4096 + 13, 262144])
@pytest.mark.parametrize("scale", [0.5, 4.0, 40.0])
def test_the_one_pass_scan_matches_argmax_and_float64(which, n, scale):
    rng = np.random.default_rng(n + int(scale))
    row = (rng.standard_normal(n) * scale).astype(np.float32)
    got = _scan(which)(row)
    m, z = reference(row)
    assert got.best == int(np.argmax(row)) and got.max == m and not got.has_nan
    assert abs(got.z - z) <= 2e-7 * z


@needs_kernel
@pytest.mark.parametrize("which", PATHS)
def test_the_one_pass_scan_keeps_the_first_maximum_across_and_within_blocks(which):
    scan = _scan(which)
    row = np.zeros(3000, dtype=np.float32)
    row[[700, 2900, 5]] = [3.0, 3.0, 1.0]  # blocks 2 and 11 tie: block 2's wins
    assert scan(row).best == 700
    row[[703, 699]] = [3.0, 3.0]  # within a block: the first of three
    assert scan(row).best == 699
    row[2999] = 3.5  # a later, strictly greater maximum in the tail
    assert scan(row).best == 2999


@needs_kernel
@pytest.mark.parametrize("which", PATHS)
def test_the_one_pass_scan_flags_nan_and_reads_it_as_minus_infinity(which):
    scan = _scan(which)
    row = np.array([np.nan, 1.0, 5.0, np.nan] * 100, dtype=np.float32)
    got = scan(row)
    assert got.has_nan and got.best == 2 and got.max == 5.0
    assert got.z == pytest.approx(100 * (1 + np.exp(-4.0)), rel=1e-7)
    assert scan(np.full(300, -np.inf, dtype=np.float32))[:2] == (0, -np.inf)
    inf = np.array([1.0, np.inf, 2.0, np.inf], dtype=np.float32)
    assert scan(inf)[:2] == (1, np.inf)


@needs_kernel
@pytest.mark.parametrize("which", PATHS)
def test_a_single_nan_is_found_wherever_it_lies(which):
    """One NaN in any lane of a vector step (a block's first or second vector, a block's short tail, the
    row's last values) is reported, and the row reads as if it were -inf there."""
    scan = _scan(which)
    rng = np.random.default_rng(5)
    base = (rng.standard_normal(300) * 2).astype(np.float32)  # a whole block and a tail of 44
    for at in [*range(32), 255, 256, 263, 264, 290, 299]:
        row = base.copy()
        row[at] = np.nan
        got = scan(row)
        clean = np.where(np.isnan(row), -np.inf, row)
        assert got.has_nan, at
        assert got.best == int(np.argmax(clean)) and got.max == float(clean.max())
        m, z = reference(row)
        assert abs(got.z - z) <= 2e-7 * z


@needs_kernel
def test_a_row_that_keeps_rising_rescales_the_sum_exactly_enough():
    """Every block sets a new maximum: the sum is rescaled 1024 times (in double)."""
    row = np.linspace(-50.0, 30.0, 262144).astype(np.float32)
    got = rowscan_kernel.scan(row)
    m, z = reference(row)
    assert got.best == 262143 and abs(got.z - z) <= 2e-7 * z


@needs_kernel
def test_the_acceptors_one_pass_rows_agree_with_the_two_pass_scan():
    rng = np.random.default_rng(7)
    for n in (9, 300, 262144):
        row = (rng.standard_normal(n) * 6).astype(np.float32)
        one, two = ScoredRow(row, normaliser=True), ScoredRow(row)
        assert one.best == two.best and one.max == two.max
        for t in (0, n // 2, one.best):
            assert one.prob(t) == pytest.approx(two.prob(t), rel=1e-6)
        assert [t for t, _ in one.top(5)] == [t for t, _ in two.top(5)]
    nan_row = np.array([np.nan, 2.0, 1.0], dtype=np.float32)  # the NaN-aware path
    assert ScoredRow(nan_row, normaliser=True).prob(1) == pytest.approx(ScoredRow(nan_row).prob(1))


def _row_questions(which: str) -> tuple:
    """One build of specviz_topk and specviz_rank: (topk, rank)."""
    import ctypes

    suffix = _path(which)
    if not suffix:
        return rowscan_kernel.topk, rowscan_kernel.rank
    lib = _lib()
    topk_c, rank_c = getattr(lib, "specviz_topk" + suffix), getattr(lib, "specviz_rank" + suffix)
    topk_c.restype = rank_c.restype = ctypes.c_int64
    topk_c.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rank_c.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]

    def plain_topk(row, k):
        out = np.empty(k, dtype=np.int64)
        assert topk_c(row.ctypes.data, row.shape[0], k, out.ctypes.data) == k
        return out

    def plain_rank(row, t):
        return int(rank_c(row.ctypes.data, row.shape[0], t))

    return plain_topk, plain_rank


def reference_rank(row: np.ndarray, t: int) -> int:
    v = row[t]
    return 1 + sum(1 for x in row if x > v) + sum(1 for x in row[:t] if x == v)


def reference_topk(row: np.ndarray, k: int) -> list[int]:
    """The k largest, largest first, ties to the lower index (a stable sort on the negated values)."""
    return np.argsort(-row.astype(np.float64), kind="stable")[:k].tolist()


@needs_kernel
@pytest.mark.parametrize("which", ROW_QUESTION_PATHS)
@pytest.mark.parametrize("n", [1, 5, 15, 16, 17, 300, 4099, 262144])
def test_topk_and_rank_match_a_stable_sort(which, n):
    topk, rank = _row_questions(which)
    rng = np.random.default_rng(n)
    row = np.round(rng.standard_normal(n) * 3, 1).astype(np.float32)  # rounded: many ties
    for k in {1, min(5, n), min(64, n)}:
        assert topk(row, k).tolist() == reference_topk(row, k)
    for t in {0, n // 3, n - 1, int(np.argmax(row))}:
        assert rank(row, t) == (reference_rank(row, t) if n < 5000 else _numpy_rank(row, t))


def _numpy_rank(row: np.ndarray, t: int) -> int:
    v = row[t]
    return int(np.count_nonzero(row > v)) + int(np.count_nonzero(row[:t] == v)) + 1


@needs_kernel
@pytest.mark.parametrize("which", ROW_QUESTION_PATHS)
def test_topk_keeps_ties_in_index_order_and_handles_infinities(which):
    topk, _ = _row_questions(which)
    row = np.zeros(100, dtype=np.float32)
    row[[90, 10, 50]] = 2.0  # a three-way tie, found out of order in no particular lane
    row[70] = 3.0
    assert topk(row, 4).tolist() == [70, 10, 50, 90]
    assert topk(row, 6).tolist() == [70, 10, 50, 90, 0, 1]
    assert topk(np.full(40, -np.inf, dtype=np.float32), 3).tolist() == [0, 1, 2]
    inf = np.array([1.0, np.inf, 2.0, np.inf] * 5, dtype=np.float32)
    assert topk(inf, 3).tolist() == [1, 3, 5]
    # an ascending row: every value enters the list (the worst case of the insertion)
    assert topk(np.arange(1000, dtype=np.float32), 5).tolist() == [999, 998, 997, 996, 995]


@needs_kernel
def test_topk_refuses_what_it_cannot_hold():
    row = np.zeros(10, dtype=np.float32)
    assert rowscan_kernel.topk(row, 0) is None and rowscan_kernel.topk(row, 11) is None
    assert rowscan_kernel.topk(np.zeros(100, dtype=np.float32), rowscan_kernel.TOPK_MAX + 1) is None


def test_top_and_rank_agree_with_and_without_the_kernel(monkeypatch):
    rng = np.random.default_rng(3)
    row = np.round(rng.standard_normal(20000) * 4, 1).astype(np.float32)
    flat = np.zeros(9000, dtype=np.float32)  # every value tied
    picks = [0, 77, 19999, int(np.argmax(row))]
    with_kernel = (ScoredRow(row).top(5), [ScoredRow(row).rank(t) for t in picks], ScoredRow(flat).top(3))
    monkeypatch.setenv("SPECVIZ_ROWSCAN_KERNEL", "0")
    numpy_only = (ScoredRow(row).top(5), [ScoredRow(row).rank(t) for t in picks], ScoredRow(flat).top(3))
    assert [t for t, _ in with_kernel[0]] == [t for t, _ in numpy_only[0]] == reference_topk(row, 5)
    assert np.allclose([p for _, p in with_kernel[0]], [p for _, p in numpy_only[0]], rtol=1e-6, atol=0)
    assert with_kernel[1] == numpy_only[1] == [reference_rank(row, t) for t in picks]
    assert [t for t, _ in with_kernel[2]] == [t for t, _ in numpy_only[2]] == [0, 1, 2]


@needs_kernel
def test_a_row_cut_into_pieces_keeps_the_first_maximum_and_the_sum():
    """Long rows are scanned in one piece per thread (OpenMP) and joined: the first maximum across the
    pieces, each piece's sum rescaled to the row's maximum. On one thread the same checks hold."""
    n = 262144
    row = np.zeros(n, dtype=np.float32)
    row[[200000, 10]] = 4.0  # equal maxima in the last piece and the first: the first wins
    got = rowscan_kernel.scan(row)
    assert got.best == 10 and got.max == 4.0
    row[10] = 3.0
    assert rowscan_kernel.scan(row).best == 200000
    row[150000] = np.nan  # a NaN only in a later piece is reported
    got = rowscan_kernel.scan(row)
    assert got.has_nan and got.best == 200000
    row = np.full(n, -np.inf, dtype=np.float32)
    row[n - 1] = 0.0  # every piece but the last is all -inf
    got = rowscan_kernel.scan(row)
    assert (got.best, got.max, got.z) == (n - 1, 0.0, 1.0)
    rng = np.random.default_rng(11)
    row = (rng.standard_normal(n) * 5).astype(np.float32)
    row[:1000] -= 100.0  # the first piece's maximum far below the row's: its sum rescaled to nearly 0
    m, z = reference(row)
    got = rowscan_kernel.scan(row)
    assert got.best == int(np.argmax(row)) and abs(got.z - z) <= 2e-7 * z
    assert 1 <= rowscan_kernel.scan_threads() <= rowscan_kernel.default_scan_threads()


def _pieces_script(body: str) -> str:
    return "import numpy as np, warnings\nfrom specviz.decoding import rowscan_kernel as rk\n" + body


def _run_child(body: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", _pieces_script(body)], env=full_env, capture_output=True, text=True, timeout=120
    )


@needs_kernel
def test_the_scan_thread_cap_changes_the_pieces_not_the_answers():
    """``set_scan_threads``: one piece or as many as OpenMP has, the same first maximum, and the sum within
    the kernel's tolerance of float64; a refused cap changes nothing."""
    rng = np.random.default_rng(5)
    row = (rng.standard_normal(262144) * 6).astype(np.float32)
    row[[3, 250000]] = row.max() + 1.0  # a tie across the first and last pieces: the first wins
    m, z = reference(row)
    before = rowscan_kernel.scan_threads()
    try:
        assert rowscan_kernel.set_scan_threads(1) == 1
        one = rowscan_kernel.scan(row)
        got = rowscan_kernel.set_scan_threads(rowscan_kernel.SCAN_THREADS_MAX)
        assert 1 <= got <= rowscan_kernel.SCAN_THREADS_MAX
        many = rowscan_kernel.scan(row)
        for r in (one, many):
            assert (r.best, r.max) == (3, m) and abs(r.z - z) <= 2e-7 * z
        for bad in (0, rowscan_kernel.SCAN_THREADS_MAX + 1, True, 2.0):
            with pytest.raises(ValueError, match="scan threads"):
                rowscan_kernel.set_scan_threads(bad)
        assert rowscan_kernel.scan_threads() == got
    finally:
        rowscan_kernel.set_scan_threads(rowscan_kernel.default_scan_threads())
    assert rowscan_kernel.scan_threads() == before


@needs_kernel
def test_sixteen_pieces_from_the_environment_join_as_one_pass():
    """``SPECVIZ_SCAN_THREADS=16`` with 16 OpenMP threads (more than this machine's cores: the pieces
    still join as one pass would): the cap is applied when the kernel loads, every piece is read."""
    body = """
assert rk.scan_threads() == 16, rk.scan_threads()
n = 262144
row = np.zeros(n, dtype=np.float32)
row[n - 5] = 3.0                      # the maximum in the sixteenth piece
row[7 * n // 16 + 1] = np.nan          # a NaN in the eighth
got = rk.scan(row)
assert got.has_nan and got.best == n - 5 and got.max == 3.0
row[7 * n // 16 + 1] = 0.0
got = rk.scan(row)
expect = 1.0 + (n - 1) * np.exp(-3.0)
assert not got.has_nan and abs(got.z - expect) <= 2e-7 * expect, (got.z, expect)
print("ok")
"""
    done = _run_child(body, OMP_NUM_THREADS="16", SPECVIZ_SCAN_THREADS="16")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@needs_kernel
@pytest.mark.slow
def test_a_scan_thread_cap_out_of_range_in_the_environment_is_refused_with_a_warning():
    body = """
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    threads = rk.scan_threads()
print(threads, "|", " ".join(str(w.message) for w in seen))
"""
    for raw in ("0", "17", "many"):
        done = _run_child(body, OMP_NUM_THREADS="16", SPECVIZ_SCAN_THREADS=raw)
        assert done.returncode == 0, done.stderr[-2000:]
        threads, message = done.stdout.split("|", 1)
        assert int(threads) == rowscan_kernel.default_scan_threads()
        assert f"SPECVIZ_SCAN_THREADS={raw!r}" in message and "from 1 to 16" in message


@needs_kernel
@pytest.mark.slow
def test_without_a_setting_a_long_row_is_read_by_eight_threads_where_openmp_has_them():
    """The default cap is 8 (measured on a 16-core GPU host: 8 threads read a 262k-token row faster than 4,
    and 16 no faster than 8); OpenMP's thread count still caps it below that."""
    env = {k: v for k, v in os.environ.items() if k != "SPECVIZ_SCAN_THREADS"}
    body = "print(rk.default_scan_threads(), rk.scan_threads())"
    for omp, want in (("16", 8), ("3", 3)):
        done = subprocess.run(
            [sys.executable, "-c", _pieces_script(body)],
            env={**env, "OMP_NUM_THREADS": omp},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["8", str(want)]


@needs_kernel
def test_the_vector_paths_are_the_cpus_own():
    """The paths the kernel reports (and the benchmark prints) are those the CPU lists in /proc/cpuinfo."""
    import platform
    from pathlib import Path

    cpuinfo = Path("/proc/cpuinfo")
    if platform.machine() != "x86_64" or not cpuinfo.exists():
        pytest.skip("the vector paths are x86-64 ones, read against Linux's /proc/cpuinfo")
    flags = set(next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")).split())
    want = {"avx2"} if {"avx2", "fma"} <= flags else set()
    want |= {"avx512"} if "avx512f" in flags else set()
    assert rowscan_kernel.vector_paths() == want
    assert rowscan_kernel.scan_path() == ("avx512" if "avx512" in want else "avx2" if want else "plain C")
