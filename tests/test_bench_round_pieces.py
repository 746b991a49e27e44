"""The round-pieces benchmark (benchmarks/bench_round_pieces.py) runs from a fresh clone on a tiny model and
prints every piece the docs quote, the floor of a greedy round included, warm and right after a decode, and
the bookkeeping's cost after each thing that does part of what a decode does to the caches, and a verify
batch's rows read three ways right after its decode."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_round_pieces.py"


def test_the_round_pieces_benchmark_times_every_piece_and_the_floor(capsys, tiny_model_path):
    spec = importlib.util.spec_from_file_location("bench_round_pieces", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = ["--model", str(tiny_model_path), "--threads", "1", "--repeats", "3", "--cold-repeats", "3"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    pieces, causes = out.split("\nthe round's bookkeeping")
    causes, batch_rows = causes.split("\na verify batch's rows read right after its decode")
    rows = [line for line in pieces.splitlines() if line.startswith("| ") and not line.startswith("| piece")]
    names = [r.split(" | ")[0].lstrip("| ") for r in rows]
    assert "round events" in names and "checkpoint (Generation.capture)" in names
    assert any(n.startswith("the floor:") for n in names)
    assert any("top-p 0.95: the nucleus" in n for n in names)
    for r in rows:
        warm, cold = (float(x) for x in r.rstrip(" |").split(" | ")[-2:])
        assert warm >= 0 and cold >= 0
    after = [line for line in causes.splitlines() if line.startswith("| ") and not line.startswith("| right after")]
    names = [r.split(" | ")[0].lstrip("| ") for r in after]
    assert names[:2] == ["nothing (warm)", "a one-token decode"] and len(names) == 6
    assert any(n.startswith("streaming 256 MiB") for n in names) and any(n.startswith("waiting as long") for n in names)
    for r in after:
        assert float(r.rstrip(" |").split(" | ")[-1]) >= 0
    # the third table: a verify batch of 1, 5 and 12 tokens whose drafts are the target's own choices, so the
    # kernel reads every row; each way of reading them timed
    rows = [line for line in batch_rows.splitlines() if line.startswith("| ") and not line.startswith("| rows")]
    cells = [[c.strip() for c in r.strip("| ").split(" | ")] for r in rows]
    assert [c[0] for c in cells] == ["1", "5", "12"]
    for c in cells:
        assert c[4] == c[0], f"the kernel stopped early on a batch of the target's own choices: {c}"
        assert all(float(x) > 0 for x in c[1:4])
