"""The overhead benchmark (benchmarks/bench_overhead.py) runs from a fresh clone on its tiny-model
reference and prints what the docs quote: specviz's time per round, the row scans' share of it, and
llama.cpp's time, per strategy and draft length."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_overhead.py"


def test_the_overhead_benchmark_times_specviz_apart_from_llama_cpp_and_the_row_scans(capsys, tiny_model_path):
    from specviz import Session

    with Session(str(tiny_model_path), n_ctx=256, n_threads=1) as s:  # this thread's kernel bound first,
        s.generate("the cat", 4, "none")  # as earlier tests leave it in a whole run
    spec = importlib.util.spec_from_file_location("bench_overhead", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--tiny-model", "--threads", "1", "--repeats", "1", "--max-tokens", "24"]
    assert bench.main([*args, "--draft-max", "1,3", "--strategies", "none,ngram-simple", "--json"]) == 0
    out = capsys.readouterr().out
    assert "| of which row scans | of which GC (mean) |" in out and "tiny-llama.gguf" in out
    rows = json.loads(out[out.index("\n[") + 1 :])
    assert [(r["strategy"], r["draft_max"]) for r in rows] == [("none", None), ("ngram-simple", 1), ("ngram-simple", 3)]
    for r in rows:
        assert r["tokens"] == 24 and r["rounds"] >= 1 and r["llama_calls"] >= 1
        assert 0 < r["scan_ms"] < r["specviz_wall_ms"]  # the scans are specviz's work, timed inside it
        assert r["gc_ms"] >= 0  # the collections' mean (most short runs have none)
        assert r["llama_ms"] > 0 and r["specviz_cpu_ms"] > 0


def _bench():
    spec = importlib.util.spec_from_file_location("bench_overhead", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow
def test_the_wide_tiny_model_has_the_embedded_models_vocabulary(capsys):
    """``--tiny-wide-model``: the GPU host's regime here, rows of the embedded model's 262,144 values."""
    bench = _bench()
    args = ["--tiny-wide-model", "--threads", "1", "--repeats", "1", "--max-tokens", "6", "--strategies", "none"]
    assert bench.main([*args, "--json"]) == 0
    out = capsys.readouterr().out
    assert "tiny-wide-262k.gguf" in out
    (row,) = json.loads(out[out.index("\n[") + 1 :])
    assert row["tokens"] == 6 and 0 < row["scan_ms"] < row["specviz_wall_ms"]
    assert bench.WIDE_TINY_SHAPE.vocab_size == 262144


def test_the_benchmark_takes_one_model(capsys):
    bench = _bench()
    with pytest.raises(SystemExit) as e:
        bench.main(["--tiny-model", "--tiny-wide-model"])
    assert e.value.code == 2
    assert "give one" in capsys.readouterr().err


@pytest.mark.slow
def test_the_collectors_time_is_counted_while_installed_only():
    import gc

    timer = _bench().GcTimer().install()
    try:
        gc.collect()
        gc.collect(0)
    finally:
        timer.uninstall()
    assert timer.collections == 2 and timer.wall > 0
    gc.collect()
    assert timer.collections == 2
    timer.reset()
    assert (timer.collections, timer.wall) == (0, 0.0)
