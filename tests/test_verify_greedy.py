"""The greedy acceptor's one-call path (``specviz_verify_greedy``, a context's rows through
:class:`~specviz.decoding.rowscan.ContextRows`) against its row-by-row path: the same verdict, field for field, on
crafted rows (ties, rejections at every depth, the draft token inside and outside the alternatives) and on a real
session; the rounds it hands back (a NaN, a non-finite maximum, a missing row, a draft token outside the vocabulary,
too many alternatives) give what the ordinary path gives; and it reads exactly the rows the ordinary path reads."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from specviz.decoding import rowscan_kernel
from specviz.decoding.acceptor import accept
from specviz.decoding.rowscan import ContextRows
from specviz.decoding.sampling import SamplingParams

needs_kernel = pytest.mark.skipif(
    rowscan_kernel.unavailable_reason() is not None,
    reason=f"the row-scan kernel is not available here: {rowscan_kernel.unavailable_reason()}",
)

GREEDY = SamplingParams(0.0)
ROW_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)


class CountingRows:
    """A context whose rows the kernel reads the way llama.cpp hands them out (a C function of ``(ctx, i)``
    returning the row's address, NULL for a row it has no logits for), counting the rows asked for."""

    def __init__(self, rows: list[np.ndarray], missing: tuple[int, ...] = ()) -> None:
        self.rows = [np.ascontiguousarray(r, dtype=np.float32) for r in rows]
        self.missing = missing
        self.asked: list[int] = []
        self.fn = ROW_FN(self._row)  # kept alive as long as this object
        self.native = (ctypes.cast(self.fn, ctypes.c_void_p).value, 0, self.rows[0].shape[0])

    def _row(self, ctx: int | None, i: int) -> int | None:
        self.asked.append(i)
        return None if i in self.missing else self.rows[i].ctypes.data

    def row(self, i: int) -> np.ndarray:
        """Row ``i``, as :meth:`LlamaContext.row <specviz.backends.llama.LlamaContext.row>` gives it."""
        return self.rows[i]

    def native_rows(self) -> tuple[int, int, int]:
        """Where the kernel reads the rows."""
        return self.native  # type: ignore[return-value]


def both(draft: list[int], rows: list[np.ndarray], top_n: int = 5, **kw) -> tuple:
    """(verdict with the native rows, verdict without, the rows the kernel asked for)."""
    src = CountingRows(rows, **kw)
    rng = np.random.default_rng(0)
    native = accept(draft, ContextRows(src), GREEDY, rng, top_n=top_n)
    plain = accept(draft, src.rows, GREEDY, rng, top_n=top_n)
    return native, plain, src.asked


def crafted_rows(rng: np.random.Generator, n_rows: int, n: int, levels: int | None = None) -> list[np.ndarray]:
    """Random logits rows; with ``levels``, values from a few levels only, so maxima and the k-th best
    tie often (first maximum and lower id win)."""
    out = []
    for _ in range(n_rows):
        if levels is None:
            out.append((rng.standard_normal(n) * 3).astype(np.float32))
        else:
            out.append(rng.integers(0, levels, n).astype(np.float32) * np.float32(0.75))
    return out


@needs_kernel
@pytest.mark.parametrize("n", [6, 1000, 262144])
@pytest.mark.parametrize("levels", [None, 4])
@pytest.mark.slow
def test_every_depth_of_rejection_and_the_bonus_give_the_ordinary_verdict(n, levels):
    rng = np.random.default_rng(n + (levels or 0))
    k = 6
    rows = crafted_rows(rng, k + 1, n, levels)
    choices = [int(np.argmax(r)) for r in rows]  # numpy's argmax: the first maximum
    for depth in range(k + 1):
        for refused in ("second", "far"):
            draft = choices[:k]
            if depth < k:
                order = np.lexsort((np.arange(n), -rows[depth]))  # best first, ties to the lower id
                draft[depth] = int(order[1] if refused == "second" else order[-1])
            native, plain, asked = both(draft, rows)
            assert native == plain
            assert asked == list(range(plain.rows_read))  # lazily: up to the refusal or the bonus
    native, plain, asked = both([], rows[:1])
    assert native == plain and asked == [0] and native.bonus


@needs_kernel
@pytest.mark.parametrize("top_n", [1, 2, 5, 64])
def test_the_alternatives_rank_and_margin_follow_top_n(top_n):
    rng = np.random.default_rng(top_n)
    rows = crafted_rows(rng, 3, 5000, 50)
    order = np.lexsort((np.arange(5000), -rows[1]))
    for pos in (1, 3, top_n, top_n + 1, 400):  # the draft token inside and outside the alternatives
        draft = [int(np.argmax(rows[0])), int(order[pos])]
        native, plain, asked = both(draft, rows, top_n=top_n)
        assert native == plain and asked == [0, 1]
        assert native.rejected_rank == pos + 1
        assert len(native.alternatives) == top_n
        assert (native.margin is None) == (top_n < 2)


@needs_kernel
def test_rounds_the_kernel_hands_back_give_what_the_ordinary_path_gives():
    rng = np.random.default_rng(7)
    rows = crafted_rows(rng, 4, 300)
    draft = [int(np.argmax(r)) for r in rows[:3]]
    nan_row = rows[1].copy()
    nan_row[[3, 50]] = np.nan
    minus_inf = np.full(300, -np.inf, dtype=np.float32)
    plus_inf = rows[1].copy()
    plus_inf[9] = np.inf
    for bad in (nan_row, minus_inf, plus_inf):
        native, plain, _ = both(draft, [rows[0], bad, rows[2], rows[3]])
        assert repr(native) == repr(plain)  # the repr: a margin of inf - inf is NaN on both paths
    native, plain, asked = both(draft, rows, missing=(2,))  # llama.cpp has no logits for row 2
    assert native == plain and asked == [0, 1, 2]
    refused = [draft[0], (draft[1] + 1) % 300]
    native, plain, asked = both(refused, rows, top_n=65)  # more alternatives than the kernel keeps
    assert native == plain and len(native.alternatives) == 65 and asked == []
    native, plain, asked = both(refused, rows[:2], top_n=300)
    assert native == plain and len(native.alternatives) == 300 and asked == []
    src = CountingRows(rows)
    with pytest.raises(IndexError):  # a token outside the vocabulary: refused as the ordinary path refuses it
        accept([draft[0], 300], ContextRows(src), GREEDY, np.random.default_rng(0))
    assert src.asked == []  # the kernel read no row of it


@needs_kernel
def test_a_session_gives_the_same_rounds_with_and_without_the_kernel_call(tiny_session, monkeypatch):
    from specviz.backends.llama import LlamaContext

    calls = []
    real = rowscan_kernel.verify_greedy

    def counted(*a):
        got = real(*a)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(rowscan_kernel, "verify_greedy", counted)

    def run(strategy: str, knobs: dict) -> tuple:
        tiny_session.start("a b c a b c a b", 40, strategy, temperature=0.0, seed=1, **knobs)
        tiny_session.run()
        events = [
            {k: v for k, v in e.to_dict().items() if "seconds" not in k and k != "load_average"}
            for e in tiny_session.generation.events
            if type(e).__name__ != "TelemetryEvent"
        ]
        return list(tiny_session.tokens), events

    rejections = 0
    for strategy, knobs in [("none", {}), ("prompt-lookup", {"draft_max": 8}), ("ngram-simple", {"draft_max": 4})]:
        calls.clear()
        with_kernel = run(strategy, knobs)
        assert calls and all(calls)  # every round went through the one call
        with monkeypatch.context() as m:
            m.setattr(LlamaContext, "native_rows", lambda self: None)
            calls.clear()
            without = run(strategy, knobs)
            assert not calls
        assert with_kernel == without
        rejections += sum(1 for e in with_kernel[1] if "alternatives" in e)
    assert rejections > 0  # the refusing rows' alternatives, ranks and margins were compared too


def test_a_closed_context_offers_no_native_rows(tiny_model):
    from specviz.backends.llama import LlamaContext

    ctx = LlamaContext(tiny_model, n_ctx=64, n_batch=16, n_ubatch=16, n_threads=1)
    got = ctx.native_rows()
    assert got is not None and got[2] == tiny_model.n_vocab and got[1] != 0
    ctx.close()
    assert ctx.native_rows() is None
