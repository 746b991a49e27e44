"""``specviz bench``: how the table's figures are made from the runs, and the command end to end."""

from __future__ import annotations

import json
import statistics

import pytest
from test_cli import run_cli

from specviz.analysis.bench import BenchRun, format_per_prompt, format_table, summarise


def _run(prompt, repeat, tokens, seconds, paired=1.0, acc=0.5, mal=2.0, copied=0.0):
    return BenchRun(prompt, repeat, acc, mal, tokens, seconds, paired, copied)


def test_a_cell_is_the_median_over_prompts_of_per_prompt_medians_over_repeats():
    # prompt 0: fast and steady; prompt 1: one repeat hit by a slow machine; prompt 2: slow
    runs = [
        _run(0, 0, 100, 1.0, 3.0, acc=0.9),
        _run(0, 1, 100, 1.0, 3.2, acc=0.9),
        _run(0, 2, 100, 1.0, 3.1, acc=0.9),
        _run(1, 0, 100, 2.0, 2.0, acc=0.6),
        _run(1, 1, 100, 9.0, 0.4, acc=0.6),
        _run(1, 2, 100, 2.0, 2.2, acc=0.6),
        _run(2, 0, 100, 5.0, 1.1, acc=0.1),
        _run(2, 1, 100, 5.0, 1.2, acc=0.2),
        _run(2, 2, 100, 5.0, 1.0, acc=0.3),
    ]
    none = [_run(p, r, 100, 4.0) for p in range(3) for r in range(3)]
    row = summarise("quote", "prompt-lookup", runs, none)
    assert [d["speedup"] for d in row.per_prompt] == [3.1, 2.0, 1.1]  # the slow repeat of prompt 1 is outvoted
    assert row.speedup == 2.0
    assert [d["tokens_per_second"] for d in row.per_prompt] == [100.0, 50.0, 20.0]
    assert row.tokens_per_second == 50.0
    assert row.acceptance_rate == 0.6 and [d["acceptance_rate"] for d in row.per_prompt] == [0.9, 0.6, 0.2]
    # all runs pooled: 900 tokens in 3 + 13 + 15 s, against none's 900 tokens in 36 s
    assert row.total_time_speedup == pytest.approx((900 / 31) / (900 / 36))
    assert row.runs == 9


def test_total_time_speedup_weighs_prompts_by_their_time():
    # one prompt 4x faster, one unchanged: the median of two is 2.5x, the pooled time only 1.6x
    runs = [_run(0, 0, 100, 1.0, 4.0), _run(1, 0, 100, 4.0, 1.0)]
    none = [_run(0, 0, 100, 4.0), _run(1, 0, 100, 4.0)]
    row = summarise("quote", "x", runs, none)
    assert row.speedup == 2.5
    assert row.total_time_speedup == pytest.approx(8 / 5)


def test_table_and_per_prompt_lines():
    runs = [_run(0, 0, 100, 1.0, 4.0), _run(1, 0, 100, 4.0, 1.0)]
    none = [_run(0, 0, 100, 4.0, copied=0.99), _run(1, 0, 100, 4.0, copied=0.125)]
    rows = [summarise("quote", "none", none, none), summarise("quote", "ngram-mod", runs, none)]
    table = format_table(rows)
    assert "| speedup vs none | total-time speedup |" in table.splitlines()[0]
    assert "| quote | ngram-mod | 50.0% | 2.00 | 62.5 | 2.50× | 1.60× |" in table
    assert format_per_prompt(rows).splitlines() == [
        "quote         copied         #0   99%  #1   12%",
        "quote         ngram-mod      #0 4.00×  #1 1.00×",
    ]


@pytest.mark.slow
def test_bench_command_on_a_tiny_model(tiny_model_path):
    p = run_cli(
        "bench",
        "--model",
        str(tiny_model_path),
        "--kinds",
        "free",
        "--strategies",
        "prompt-lookup,ngram-mod",
        "--repeats",
        "2",
        "--max-tokens",
        "12",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["repeats"] == 2 and out["max_tokens"] == 12
    rows = out["rows"]
    assert [(r["kind"], r["strategy"]) for r in rows] == [
        ("free", "none"),
        ("free", "prompt-lookup"),
        ("free", "ngram-mod"),
    ]
    none = rows[0]
    assert none["speedup"] == 1.0 and none["total_time_speedup"] == pytest.approx(1.0)
    for r in rows:
        assert r["runs"] == 2 * 4 and len(r["per_prompt"]) == 4
        assert r["speedup"] == pytest.approx(statistics.median(d["speedup"] for d in r["per_prompt"]))
        assert r["tokens_per_second"] == pytest.approx(
            statistics.median(d["tokens_per_second"] for d in r["per_prompt"])
        )
        assert r["total_time_speedup"] > 0 and 0.0 <= r["acceptance_rate"] <= 1.0
        assert all(0.0 <= d["copied"] <= 1.0 for d in r["per_prompt"])


@pytest.mark.slow
def test_bench_command_prints_the_table(tiny_model_path):
    p = run_cli(
        "bench",
        "--model",
        str(tiny_model_path),
        "--kinds",
        "quote",
        "--strategies",
        "ngram-simple",
        "--repeats",
        "1",
        "--max-tokens",
        "6",
        "--draft-policy",
        "cost",
        "--draft-max",
        "8",
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("specviz bench — model tiny.gguf, 6 tokens, 1 repeats")
    assert "'draft_policy': 'cost'" in lines[0] and "'draft_max': 8" in lines[0]
    assert any(line.startswith("| quote | ngram-simple |") for line in lines)
    assert any(line.startswith("quote         ngram-simple   #0 ") for line in lines)
    assert any(line.startswith("quote         copied         #0 ") and line.endswith("%") for line in lines)
