"""Top-p over a whole row read in place: the kernel's mass by distance below the maximum
(specviz_nucleus_mass in rowscan_kernel.c) against the numpy reference (rows_reference.nucleus_mass), and
the nucleus it finds (sampling's _nucleus_in_place, behind probs_from_logits) against numpy's path, which
builds the whole distribution."""

from __future__ import annotations

import numpy as np
import pytest

from specviz.decoding import rows_reference, rowscan_kernel, sampling
from specviz.decoding.sampling import NUCLEUS_BUCKETS, SamplingParams, probs_from_logits

needs_kernel = pytest.mark.skipif(
    rowscan_kernel.unavailable_reason() is not None,
    reason=f"the row-scan kernel is not available here: {rowscan_kernel.unavailable_reason()}",
)


def llm_like_row(n: int, seed: int, spread: float = 2.5, peaks: int = 30) -> np.ndarray:
    """A wide body of logits with a few tokens far above it, as a language model's rows look."""
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(n) * spread).astype(np.float32)
    top = rng.choice(n, peaks, replace=False)
    row[top] += rng.uniform(4.0, 25.0, peaks).astype(np.float32)
    return row


@needs_kernel
@pytest.mark.parametrize("which", ["dispatch", "generic"])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 262144])
@pytest.mark.parametrize("t", [0.3, 1.0, 2.0])
def test_the_mass_by_distance_matches_numpy(which, n, t):
    row = llm_like_row(n, n, peaks=min(n, 30))
    if n > 20:
        row[[3, 11]] = [-np.inf, np.nan]  # left out, as the far tail
    m = float(np.nanmax(row))
    width = 0.02
    got = rowscan_kernel.nucleus_mass(row, m, 1.0 / t, width, 512, generic=which == "generic")
    assert got is not None
    mass, filed = got
    want_mass, want_filed = rows_reference.nucleus_mass(row, m, 1.0 / t, width, 512)
    assert filed == want_filed and 0 < filed < n + (n <= 20)  # the maximum is always filed; the tail is not
    np.testing.assert_allclose(mass, want_mass, rtol=1e-13, atol=1e-300)
    assert mass[0] >= 1.0  # the maximum's term


@needs_kernel
def test_every_bucket_holds_exactly_its_tokens():
    # one token in the middle of each bucket: bucket b holds exp(-(b + 0.5)·width) and nothing else
    width, nb = 0.05, 200
    row = np.array([-(b + 0.5) * width for b in range(nb + 50)], dtype=np.float32)
    for which in (False, True):
        mass, filed = rowscan_kernel.nucleus_mass(row, 0.0, 1.0, width, nb, generic=which)
        assert filed == nb
        np.testing.assert_allclose(mass, np.exp(row[:nb].astype(np.float64)), rtol=1e-14)


def assert_same(a, b) -> None:
    assert list(a.token_ids()) == list(b.token_ids())
    np.testing.assert_allclose(a.probs, b.probs, rtol=1e-12, atol=0)


CASES = [(0.8, 0.95), (1.0, 0.9), (0.3, 0.95), (1.5, 0.99), (1.0, 0.5), (0.7, 1e-6), (2.0, 0.999999), (50.0, 0.9)]


@pytest.mark.parametrize("t,p", CASES)
def test_the_nucleus_read_in_place_is_numpys(t, p, monkeypatch):
    """Narrow and wide nuclei on vocabulary-sized rows: the same tokens and probabilities as numpy's path."""
    rows = [llm_like_row(262144, s) for s in range(3)] + [llm_like_row(50000, 9, spread=0.5, peaks=2)]
    rows[0][:4000:7] = rows[0].max()  # ties at the top, across the buckets' edge
    params = SamplingParams(t, top_p=p)
    got = [probs_from_logits(r, params) for r in rows]
    monkeypatch.setenv("SPECVIZ_ROWSCAN_KERNEL", "0")
    for g, r in zip(got, rows):
        assert_same(g, probs_from_logits(r, params))


@needs_kernel
def test_the_kernel_finds_the_nucleus_itself():
    """The in-place path answers (it does not fall back) on ordinary rows, narrow and wide."""
    for t, p in CASES[:5]:
        row = llm_like_row(262144, 1)
        got = sampling._nucleus_in_place(row, SamplingParams(t, top_p=p))
        assert got is not None, (t, p)
        assert abs(got.probs.sum() - 1.0) < 1e-12
    wide = sampling._nucleus_in_place(llm_like_row(262144, 1, peaks=0), SamplingParams(1.5, top_p=0.99))
    assert wide is not None and wide.support_size > 1000


@needs_kernel
def test_buckets_that_round_wrong_cost_a_fallback_never_a_wrong_nucleus(monkeypatch):
    """Whatever the buckets say (their mass moved up or down, scaled, all in one bucket), the nucleus is
    numpy's: the exact checks after them refuse any boundary the tokens do not bear out."""
    rng = np.random.default_rng(4)
    real = rowscan_kernel.nucleus_mass
    distort = [
        lambda mass: mass * 0.9,
        lambda mass: mass * 1.1,
        lambda mass: np.roll(mass, 3),
        lambda mass: np.roll(mass, -3),
        lambda mass: mass * rng.uniform(0.5, 1.5, mass.shape[0]),
        lambda mass: np.r_[mass.sum(), np.zeros(mass.shape[0] - 1)],
    ]
    rows = [llm_like_row(20000, s, spread=s / 2 + 0.5) for s in range(4)]
    params = [SamplingParams(t, top_p=p) for t, p in [(0.8, 0.95), (1.5, 0.99), (1.0, 0.5)]]
    want = [probs_from_logits(r.astype(np.float64), q) for r in rows for q in params]  # numpy's path
    for f in distort:

        def wrong(row, m, inv_t, width, n_buckets, f=f, **kw):
            mass, filed = real(row, m, inv_t, width, n_buckets, **kw)
            return f(mass), filed

        monkeypatch.setattr(sampling, "nucleus_mass", wrong)
        for w, got in zip(want, [probs_from_logits(r, q) for r in rows for q in params]):
            assert_same(got, w)


def test_rows_the_kernel_does_not_take_go_to_numpy():
    params = SamplingParams(1.0, top_p=0.9)
    row = llm_like_row(1000, 2)
    row[5] = np.nan
    assert sampling._nucleus_in_place(row, params) is None  # NaN: numpy's rule (as -inf)
    assert 5 not in probs_from_logits(row, params).token_ids()
    inf = np.zeros(10, dtype=np.float32)
    inf[[2, 7]] = np.inf
    assert list(probs_from_logits(inf, params).token_ids()) == [2, 7]  # +inf: the infinite tokens share the mass
    tiny = SamplingParams(1e-35, top_p=0.9)  # too cold for the kernel's float test
    assert sampling._nucleus_in_place(llm_like_row(1000, 3), tiny) is None
    assert probs_from_logits(llm_like_row(1000, 3), tiny).support_size == 1
    assert NUCLEUS_BUCKETS >= 256
