"""Advice under load (specviz.analysis.advise_parallel): a request's round at concurrency p costs the decode of p
sequences plus the other requests' own work; each setting's break-even concurrency; the best single setting for
a load; the command line. Hand-made batch-cost tables, a tiny model's real rounds."""

from __future__ import annotations

import json

import pytest

from specviz.analysis.advise import advise
from specviz.analysis.advise_parallel import advise_parallel, cost_at, decode_seconds, parse_parallels
from specviz.decoding.batch_cost import BatchCostTable
from specviz.errors import KnobError

SEQS, DRAFTS = (1, 2, 4, 8), (0, 2, 4, 8)
ONE_ROW = 0.010


def table(decode) -> BatchCostTable:
    """A table whose decode of ``s`` sequences with drafts of ``d`` takes ``decode(s, d)`` seconds."""
    grid = tuple(tuple(decode(s, d) for d in DRAFTS) for s in SEQS)
    return BatchCostTable(SEQS, DRAFTS, grid, grid, 1)


#: rows nearly free up to 8 in a decode, then every row costs its share (a CPU's shape, in small)
KNEE = table(lambda s, d: ONE_ROW * max(1.0, s * (d + 1) / 8))
#: every row free, whatever the batch (a GPU far from its compute bound)
FREE = table(lambda s, d: ONE_ROW)


@pytest.fixture(scope="module")
def rounds(tiny_model_path):
    """A tiny model's rounds that copy a lot: prompt lookup on a looping text, long drafts."""
    from specviz import Session

    with Session(tiny_model_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1) as s:
        s.start("the a of the a of the a of the a of", 120, "prompt-lookup", draft_max=8, max_ngram=2, min_ngram=1)
        s.run()
        return list(s.events)


def test_the_decode_between_and_beyond_measured_sequence_counts_is_a_straight_line():
    t = table(lambda s, d: 0.01 * s + 0.001 * d)
    assert decode_seconds(t, 4, 2) == pytest.approx(0.042)
    assert decode_seconds(t, 3, 2) == pytest.approx(0.032)  # between 2 and 4
    assert decode_seconds(t, 16, 8) == pytest.approx(0.168)  # beyond 8: the last segment's slope
    c = cost_at(t, 3, lane=0.002)  # a round of one request at 3 at once: the decode and two other lanes
    assert c(1) == pytest.approx(0.030 + 0.004) and c(9) == pytest.approx(0.038 + 0.004)
    assert c.sizes.tolist() == [1, 3, 5, 9]


def test_parallels_are_checked():
    assert parse_parallels("4,1, 2,4") == [1, 2, 4]
    for bad in ("0", "1,x", "", "300", "-2"):
        with pytest.raises(KnobError, match="parallel"):
            parse_parallels(bad)


def test_alone_the_advice_is_the_one_request_advice(rounds):
    alone = advise(rounds, cost=cost_at(KNEE, 1, 0.0), for_server=True)
    got = advise_parallel(rounds, KNEE, [1])
    assert got.rows[0]["predicted_speedup"] == pytest.approx(alone.best.speedup)
    assert got.rows[0]["flags"] == alone.flags and got.rows[0]["total_tokens_per_second"] == pytest.approx(
        alone.best.tokens_per_second
    )


def test_where_rows_stop_being_free_the_setting_that_wins_alone_stops_paying(rounds):
    got = advise_parallel(rounds, KNEE, [1, 2, 4, 8])
    by = {r["parallel"]: r for r in got.rows}
    alone = got.settings[by[1]["setting"]]
    assert by[1]["setting"] != "none" and by[1]["predicted_speedup"] > 1.2
    # up to 8 rows a decode the drafts ride free; at 8 requests at once every draft row costs a row's share
    assert got.break_even_parallel is not None and 2 <= got.break_even_parallel <= 8
    assert alone["speedups"][8] < 1.0 and by[8]["predicted_speedup"] < by[1]["predicted_speedup"]
    assert all(r["total_tokens_per_second"] == pytest.approx(r["parallel"] * r["tokens_per_second"]) for r in got.rows)
    # a load-aware schedule is at least as good as the best single setting for the load
    assert got.load_aware_gain >= 0.0 and got.best_single in got.settings
    d = got.to_dict()
    assert [e["parallel"] for e in d["by_parallel"]] == [1, 2, 4, 8]
    assert d["break_even_parallel"] == got.break_even_parallel and json.dumps(d)
    assert "stops paying at" in got.text() and "best single setting" in got.text()


def test_where_rows_stay_free_speculation_pays_at_every_concurrency(rounds):
    got = advise_parallel(rounds, FREE, [1, 4, 8])
    assert got.break_even_parallel is None and all(r["predicted_speedup"] > 1.0 for r in got.rows)
    assert "pays up to 8 requests at once" in got.text()


def recorded_on_the_command_line(model, tmp_path):
    """``specviz run --record`` of a tiny model's copying rounds: the recording's path."""
    from test_cli import run_cli

    rec = tmp_path / "rec.jsonl"
    p = run_cli(
        "run",
        "--model",
        str(model),
        "--prompt",
        "the a of the a of the a of",
        "--strategy",
        "prompt-lookup",
        "--max-tokens",
        "40",
        "--record",
        str(rec),
    )
    assert p.returncode == 0, p.stderr
    return rec


@pytest.mark.slow
def test_advise_parallel_on_the_command_line(tiny_model_path, tmp_path):
    from test_cli import run_cli

    rec = recorded_on_the_command_line(tiny_model_path, tmp_path)
    costs = tmp_path / "cost.json"
    costs.write_text(json.dumps(KNEE.to_dict()))
    p = run_cli("advise", str(rec), "--parallel", "1,2,8", "--batch-cost", str(costs), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert [e["parallel"] for e in out["by_parallel"]] == [1, 2, 8]
    assert {"setting", "flags", "predicted_speedup"} <= set(out["by_parallel"][0]) and "break_even_parallel" in out
    # measured now on the recorded model (a tiny one: the table's figures are whatever this machine gives)
    p = run_cli("advise", str(rec), "--parallel", "1,2")
    assert p.returncode == 0, p.stderr
    assert "best single setting" in p.stdout
    for args, what in (
        (["--parallel", "0"], "option --parallel"),
        (["--parallel"], "no batched run"),
        (["--parallel", "1,2", "--batch-cost", str(rec)], "option --batch-cost"),
    ):
        p = run_cli("advise", str(rec), *args)
        assert p.returncode == 2 and what in p.stderr, p.stderr


@pytest.mark.tools
@pytest.mark.slow
def test_advice_under_load_checked_in_llama_server_with_parallel_slots(tiny_model_path, tmp_path):
    from test_cli import run_cli

    rec = recorded_on_the_command_line(tiny_model_path, tmp_path)
    costs = tmp_path / "cost.json"
    costs.write_text(json.dumps(FREE.to_dict()))
    p = run_cli(
        "advise",
        str(rec),
        "--parallel",
        "1,2",
        "--batch-cost",
        str(costs),
        "--check-server",
        "--repeats",
        "1",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    checked = out["checked"]
    assert [r["parallel"] for r in checked] == [1, 2] and len(out["by_parallel"]) == 2
    for row, advised in zip(checked, out["by_parallel"]):
        assert row["predicted_speedup"] == advised["predicted_speedup"] and row["flags"] == advised["flags"]
        assert row["measured_speedup"] > 0 and len(row["speedups"]) == 1
        assert row["tokens_per_second"]["none"] > 0 and row["tokens_per_second"]["advised"] > 0
    p = run_cli("advise", str(rec), "--parallel", "1", "--batch-cost", str(costs), "--check-server", "--model", "/nope")
    assert p.returncode == 2 and "option --model" in p.stderr


def test_a_measured_one_request_curve_is_scaled_by_the_tables_ratio_of_p_sequences_over_one():
    from specviz.decoding.batch_cost import batch_round_cost
    from specviz.decoding.verify_cost import VerifyCostModel

    t = table(lambda s, d: 0.01 * (d + 1) * (1 + 0.5 * (s - 1)))  # p sequences cost 1 + (p - 1) / 2 times one
    base = VerifyCostModel(list(range(1, 18)), [0.02 + 0.001 * b for b in range(1, 18)])
    alone = batch_round_cost(t, 1, 0.003, base)
    assert alone.sizes.tolist() == list(range(1, 18)) and [alone(b) for b in range(1, 18)] == pytest.approx(
        [base(b) for b in range(1, 18)]
    )  # one request: its own curve, every size's cost kept (no other lanes)
    four = batch_round_cost(t, 4, 0.003, base)
    assert [four(b) for b in (1, 6, 17)] == pytest.approx([2.5 * base(b) + 3 * 0.003 for b in (1, 6, 17)])
    # beyond the table's longest draft the last ratio holds; without a base, the table's own points
    uneven = table(lambda s, d: 0.01 * (1 + s * d))
    r = batch_round_cost(uneven, 2, 0.0, base)
    at4, at8 = (1 + 2 * 4) / (1 + 4), (1 + 2 * 8) / (1 + 8)  # the ratio at the measured drafts 4 and 8
    assert r(7) == pytest.approx(base(7) * (at4 + (6 - 4) * (at8 - at4) / 4))  # 7 rows: a draft of 6, between
    assert batch_round_cost(uneven, 2, 0.0).sizes.tolist() == [1, 3, 5, 9]
