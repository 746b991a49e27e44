"""A draft schedule by load (specviz.analysis.load_schedule): hand-made rounds and batch-cost tables whose answer
is worked out by hand, the seed and the common random numbers, the merged schedule, the refusals, and
``specviz advise --parallel --schedule`` / ``specviz run --draft-schedule``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_diagnose import Rounds as HandRounds

from specviz.analysis.load_schedule import candidate_lengths, capped_rounds, merge_runs, schedule_for_load
from specviz.cli import main as cli
from specviz.decoding.batch import check_schedule, parse_schedule
from specviz.decoding.batch_cost import BatchCostTable
from specviz.decoding.recorder import Recorder
from specviz.errors import BatchError, KnobError, RecordingError

SEQS, DRAFTS = (1, 2, 4, 8), (0, 2, 4, 8)
C = 0.010  # a one-row decode's seconds


def table(decode) -> BatchCostTable:
    """A table whose decode of ``s`` sequences with drafts of ``d`` takes ``decode(s, d)`` seconds."""
    grid = tuple(tuple(decode(s, d) for d in DRAFTS) for s in SEQS)
    return BatchCostTable(SEQS, DRAFTS, grid, grid, 1)


#: every decode one one-row decode's time, whatever its rows (a GPU far from its compute bound)
FREE = table(lambda s, d: C)
#: every row costs a one-row decode (a CPU past its knee): bilinear, so every interpolation is exact
LINEAR = table(lambda s, d: C * s * (d + 1))
#: rows nearly free: each draft row adds a twentieth of a one-row decode (bilinear too)
MILD = table(lambda s, d: C * (1 + 0.05 * s * d))


def recording(rounds) -> list:
    """Hand-made events of an ngram-simple run whose rounds draft ``L`` tokens and accept ``n`` of them."""
    r = HandRounds([1, 2, 3], strategy="ngram-simple", knobs={"draft_max": 8})
    for length, n in rounds:
        r.round(list(range(10, 10 + length)), n)
    return r.events


def test_with_free_rows_and_every_draft_accepted_the_longest_length_wins_at_every_busy_count():
    # rounds copying 12 tokens (11 drafted, all accepted): capped at k = 1, 2, 3 or 5 each takes 12 / (k + 1)
    # rounds of k + 1 rows committing k + 1 tokens (capped_rounds), so every round at one k is alike
    events = recording([(11, 11)] * 5)
    got = schedule_for_load(events, FREE, 4, [1, 2, 3, 5], unified=False, lane_seconds=0.001, samples=50)
    # a step of p slots capped at k commits p (1 + k) tokens in C + p x lane seconds
    for row in got.rows:
        p = row["busy"]
        for k in (0, 1, 2, 3, 5):
            assert row["tokens_per_second"][k] == pytest.approx(p * (1 + k) / (C + p * 0.001), rel=1e-9)
        assert row["draft_max"] == 5 and row["vs_none"] == pytest.approx(6.0, rel=1e-9)
    assert got.schedule == [(1, 4, 5)] and got.flag == "1-4:5"


def test_a_capped_draft_takes_the_rounds_that_copy_what_the_recorded_round_committed():
    def rounds(length, n, k):
        rows, tokens = capped_rounds(np.array([length]), np.array([n]), k)
        return list(zip(rows.tolist(), tokens.tolist()))

    assert rounds(8, 1, 4) == [(5, 2)]  # refused inside the chunk: one round
    assert rounds(8, 3, 2) == [(3, 3), (3, 1)]  # the chunk accepted, the next one refused at its first token
    assert rounds(4, 4, 1) == [(2, 2), (2, 2), (1, 1)]  # the last token past the recorded draft: a plain round
    assert rounds(3, 3, 0) == [(1, 1)] * 4  # plain decoding: a round per token
    assert rounds(6, 2, 8) == [(7, 3)]  # a cap above the draft changes nothing
    # whatever the cap, the rounds commit what the recorded ones did, and verify no fewer rows than tokens
    rng = np.random.default_rng(3)
    length = rng.integers(0, 17, size=200)
    accepted = np.minimum(rng.integers(0, 17, size=200), length)
    for k in (0, 1, 3, 7, 16):
        rows, tokens = capped_rounds(length, accepted, k)
        assert tokens.sum() == (accepted + 1).sum() and (rows >= tokens).all() and rows.max() <= k + 1


def test_when_every_row_costs_a_decode_and_nothing_is_accepted_plain_decoding_wins():
    events = recording([(8, 0)] * 3)
    for unified in (False, True):
        got = schedule_for_load(events, LINEAR, 3, [2, 4], unified=unified, lane_seconds=0.0, samples=20)
        # a step of p slots capped at k: p (1 + k) rows at C each, p tokens: 1 / (C (1 + k)) tokens/s
        for row in got.rows:
            for k in (0, 2, 4):
                assert row["tokens_per_second"][k] == pytest.approx(1 / (C * (1 + k)), rel=1e-9)
            assert row["draft_max"] == 0 and row["vs_none"] == 1.0
        assert got.schedule == [(1, 3, 0)]


def test_a_split_caches_extra_micro_batch_flips_the_choice_at_two_busy_slots():
    # half the rounds draft 4 and accept 1, half draft nothing; MILD prices a decode at C (1 + 0.05 s d).
    # One slot (either cache): k=4 costs 1.2 C for 2 tokens or C for 1: 1.5 / 1.1 C = 1.364 / C against 1 / C.
    # Two slots, k=0: C for 2 tokens, 2 / C. Two slots, k=4, each pair of draws a quarter of the steps:
    #   both draft: rows [5, 5], one graph either way: 1.4 C, 4 tokens
    #   one drafts: rows [5, 1] (or [1, 5]), 3 tokens: unified one graph at mean 3 rows, 1.2 C; split a graph of
    #     both slots' first row (C) and one of the drafter's other 4 (1.15 C): 2.15 C
    #   neither: C, 2 tokens
    # unified: 3 tokens / 1.2 C = 2.5 / C > 2 / C, so k=4; split: 3 / 1.675 C = 1.791 / C < 2 / C, so k=0
    events = recording([(4, 1), (0, 0)] * 4)
    split = schedule_for_load(events, MILD, 2, [4], unified=False, lane_seconds=0.0, samples=4000)
    unified = schedule_for_load(events, MILD, 2, [4], unified=True, lane_seconds=0.0, samples=4000)
    for got in (split, unified):
        assert got.rows[0]["tokens_per_second"][4] == pytest.approx(1.5 / 1.1 / C, rel=0.03)
        assert got.rows[0]["draft_max"] == 4
        assert got.rows[1]["tokens_per_second"][0] == pytest.approx(2 / C, rel=1e-9)
    assert split.rows[1]["tokens_per_second"][4] == pytest.approx(3 / 1.675 / C, rel=0.03)
    assert unified.rows[1]["tokens_per_second"][4] == pytest.approx(2.5 / C, rel=0.03)
    assert split.schedule == [(1, 1, 4), (2, 2, 0)] and unified.schedule == [(1, 2, 4)]
    assert split.rows[1]["vs_none"] == 1.0 and unified.rows[1]["vs_none"] == pytest.approx(1.25, rel=0.03)


def test_the_seed_makes_it_deterministic_and_every_length_is_priced_on_the_same_draws():
    events = recording([(4, 1), (0, 0), (8, 8), (2, 0)])
    a = schedule_for_load(events, MILD, 4, [4, 8, 16], unified=False, lane_seconds=0.001, seed=3)
    b = schedule_for_load(events, MILD, 4, [4, 8, 16], unified=False, lane_seconds=0.001, seed=3)
    c = schedule_for_load(events, MILD, 4, [4, 8, 16], unified=False, lane_seconds=0.001, seed=4)
    assert a.to_dict() == b.to_dict()
    assert [r["tokens_per_second"] for r in a.rows] != [r["tokens_per_second"] for r in c.rows]
    # no round drafts more than 8: a cap of 16 changes no round, so on the same draws it prices exactly as 8
    for row in a.rows:
        assert row["tokens_per_second"][16] == row["tokens_per_second"][8]


def test_the_schedule_merges_runs_and_is_a_valid_schedule():
    assert merge_runs([8, 8, 4, 4, 4, 0, 0, 8]) == [(1, 2, 8), (3, 5, 4), (6, 7, 0), (8, 8, 8)]
    assert check_schedule(merge_runs([8, 8, 4, 0])) == ((1, 2, 8), (3, 3, 4), (4, 4, 0))
    one = schedule_for_load(recording([(4, 4)]), FREE, 1, [4], unified=True, lane_seconds=0.0, samples=5)
    assert one.schedule == [(1, 1, 4)] and len(one.rows) == 1
    d = one.to_dict()
    assert d["draft_schedule"] == [[1, 1, 4]] and d["unified"] is True and d["lane_seconds"] == 0.0
    assert d["rows"][0]["tokens_per_second"].keys() == {"0", "4"} and json.dumps(d)
    assert "--draft-schedule 1-1:4" in one.text() and "unified cache" in one.text()


def test_candidate_lengths_are_the_longest_recorded_draft_and_the_ladder_below_it():
    assert candidate_lengths(recording([(6, 2), (0, 0)])) == [1, 2, 3, 4, 6]
    assert candidate_lengths(recording([(16, 2)])) == [1, 2, 3, 4, 8, 12, 16]
    assert candidate_lengths(recording([(1, 0)])) == [1]


def test_lengths_are_weighed_as_rounds_run_them_rounded_down_to_the_verify_tile():
    # with the tile of 4 a cap of 4 drafts 3 (a batch of 4 rows), 8 drafts 7, 12 drafts 11, 16 drafts 15: a schedule
    # naming 4 would run as 3, and a replay capped at 4 would price rounds that never run
    r = HandRounds([1, 2, 3], strategy="ngram-simple", knobs={"draft_max": 16, "verify_tile": 4, "align": True})
    for _ in range(3):
        r.round(list(range(10, 25)), 15)
    assert candidate_lengths(r.events) == [1, 2, 3, 7, 11, 15]
    got = schedule_for_load(r.events, FREE, 2, [4, 8, 16], unified=False, lane_seconds=0.0, samples=20)
    assert got.draft_lengths == (0, 3, 7, 15) and got.schedule == [(1, 2, 15)]
    # without alignment every length runs as given
    r = HandRounds([1, 2, 3], strategy="ngram-simple", knobs={"draft_max": 16, "verify_tile": 4, "align": False})
    r.round(list(range(10, 25)), 15)
    assert candidate_lengths(r.events) == [1, 2, 3, 4, 8, 12, 15]


def test_refusals():
    plain = recording([(0, 0)] * 3)
    with pytest.raises(RecordingError, match="no drafted round.*--record"):
        schedule_for_load(plain, FREE, 2, [4], unified=False)
    events = recording([(4, 4)])
    for kwargs in ({"busy_max": 0}, {"draft_lengths": [-1]}, {"samples": 0}, {"lane_seconds": -1.0}):
        args = {"busy_max": 2, "draft_lengths": [4], **kwargs}
        with pytest.raises(KnobError):
            schedule_for_load(events, FREE, args.pop("busy_max"), args.pop("draft_lengths"), unified=False, **args)


def test_the_run_flags_schedule_is_parsed_as_vllms_form():
    assert parse_schedule("1-2:16,3-8:0") == ((1, 2, 16), (3, 8, 0))
    assert parse_schedule(" 3:4 , 1-2:8") == ((1, 2, 8), (3, 3, 4))
    for bad in ("", "1-2", "a-2:3", "1-2:x", "2-1:4", "1-2:-1", "1-3:4,2-4:0"):
        with pytest.raises(BatchError, match="draft schedule"):
            parse_schedule(bad)


def write_recording(path, events) -> str:
    with Recorder(path) as rec:
        for e in events:
            rec(e)
    return str(path)


def test_advise_schedule_on_the_command_line(tmp_path, capsys):
    rec = write_recording(tmp_path / "rec.jsonl", recording([(4, 1), (0, 0)] * 4))
    costs = tmp_path / "cost.json"
    costs.write_text(json.dumps(MILD.to_dict()))
    common = ["advise", rec, "--parallel", "1,2", "--batch-cost", str(costs), "--schedule"]
    assert cli.main([*common, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    split = out["load_schedule"]
    assert split["unified"] is False and split["draft_lengths"] == [0, 1, 2, 3, 4] and split["busy_max"] == 2
    assert [r["busy"] for r in split["rows"]] == [1, 2] and check_schedule(split["draft_schedule"])
    assert "by_parallel" in out and "batch_cost" in out
    assert cli.main([*common, "--kv-unified"]) == 0
    text = capsys.readouterr().out
    assert "best single setting" in text and "unified cache (-kvu)" in text and "--draft-schedule 1-2:" in text


@pytest.mark.parametrize(
    "extra,words",
    [
        (["--schedule"], "option --schedule: only with --parallel"),
        (["--kv-unified"], "option --kv-unified: only with --schedule"),
        (["--parallel", "1,2", "--kv-unified"], "option --kv-unified: only with --schedule"),
    ],
)
def test_advise_schedule_refusals(tmp_path, capsys, extra, words):
    rec = write_recording(tmp_path / "rec.jsonl", recording([(4, 1)]))
    assert cli.main(["advise", rec, *extra]) == 2
    assert words in capsys.readouterr().err


def test_advise_schedule_refuses_a_recording_without_drafts(tmp_path, capsys):
    rec = write_recording(tmp_path / "rec.jsonl", recording([(0, 0)] * 3))
    costs = tmp_path / "cost.json"
    costs.write_text(json.dumps(MILD.to_dict()))
    assert cli.main(["advise", rec, "--parallel", "1,2", "--batch-cost", str(costs), "--schedule"]) == 2
    assert "option --schedule: the recording holds no drafted round" in capsys.readouterr().err
