"""Requests that arrive together (specviz.analysis.load_burst and ``schedule_for_load(..., burst=W)``): a burst
replayed from hand-made requests and priced by hand, slot by slot and step by step, the schedule it chooses where the
steady-load model chooses otherwise, the draws, the refusals and ``specviz advise --schedule --burst``."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from test_diagnose import Rounds as HandRounds
from test_load_schedule import MILD, C, table, write_recording

from specviz.analysis.load_burst import burst_rate, capped_step, draw_bursts, recorded_requests
from specviz.analysis.load_schedule import schedule_for_load
from specviz.cli import main as cli
from specviz.errors import KnobError

#: a request that copies 8 tokens in one round (7 drafted, all accepted), and one of 8 plain rounds
COPY, PLAIN = ((7, 7),), ((0, 0),) * 8
#: a request that copies 16 tokens in two rounds, and one of a single plain round
LONG, SHORT = ((7, 7), (7, 7)), ((0, 0),)
#: every sequence in a decode costs half a one-row decode more; every draft row a twentieth (bilinear: exact)
PER_SEQUENCE = table(lambda s, d: C * (0.5 + 0.5 * s + 0.05 * s * d))


def recording(*requests, strategy="ngram-simple") -> list:
    """Hand-made events of one generation per request, each a run of rounds ``(drafted, accepted)``."""
    events: list = []
    for rounds in requests:
        r = HandRounds([1, 2, 3], strategy=strategy, knobs={"draft_max": 8})
        for length, n in rounds:
            r.round(list(range(10, 10 + length)), n)
        events += r.events
    return events


def test_capped_step_copies_on_where_the_whole_chunk_was_accepted():
    assert capped_step(7, 7, 3) == (4, 4, (3, 3))  # 4 committed, the recorded round's last 4 left to copy
    assert capped_step(3, 3, 3) == (4, 4, None)  # the recorded draft ends with the chunk
    assert capped_step(7, 2, 4) == (5, 3, None)  # refused within the chunk
    assert capped_step(0, 0, 16) == (1, 1, None)  # a plain round whatever the cap


def test_recorded_requests_are_the_generations_of_the_drafting_group_in_order():
    events = recording(COPY, PLAIN) + recording(((4, 1),), strategy="ngram-mod")
    assert recorded_requests(events, "ngram-simple") == [COPY, PLAIN]
    assert recorded_requests(events, "ngram-mod") == [((4, 1),)]


@pytest.mark.parametrize(
    "requests,queue,by_busy,unified,seconds,tokens",
    [
        # both plain: 8 steps of two one-row sequences, one micro-batch each
        ([COPY, PLAIN], [0, 1], [0, 0], False, 8 * C, 16),
        # the copy done in step 1: rows [8, 1], in a split cache llama.cpp's equal split, a micro-batch of both
        # sequences at one row (C) and one of the copy's other 7 rows (C (1 + 0.05 x 6)); then the plain request
        # alone for 7 steps: the tail
        ([COPY, PLAIN], [0, 1], [7, 7], False, 2.3 * C + 7 * C, 16),
        # in a unified cache one graph of 2 sequences at 4.5 rows each: C (1 + 0.05 x 2 x 3.5)
        ([COPY, PLAIN], [0, 1], [7, 7], True, 1.35 * C + 7 * C, 16),
        # capped at 3 with 2 busy: the copy takes two steps of [4, 1] rows (C + 1.1 C each), then the tail
        ([COPY, PLAIN], [0, 1], [7, 3], False, 2 * 2.1 * C + 6 * C, 16),
        # a slot freed in step 1 takes the third request at step 2: 7 steps of both plain, then the last alone
        ([COPY, PLAIN, PLAIN], [0, 1, 2], [7, 7], False, 2.3 * C + 7 * C + C, 24),
    ],
)
def test_a_burst_is_replayed_step_by_step_and_priced_by_hand(requests, queue, by_busy, unified, seconds, tokens):
    got = burst_rate(requests, [queue], 2, by_busy, MILD, unified=unified, lane=0.0)
    assert got == pytest.approx(tokens / seconds, rel=1e-9)
    # each request's own work: one lane per busy slot per step (two slots, 8 steps, both busy throughout)
    with_lane = burst_rate(requests[:2], [[0, 1]], 2, [0, 0], MILD, unified=False, lane=0.001)
    assert with_lane == pytest.approx(16 / (8 * C + 16 * 0.001), rel=1e-9)


def test_the_tail_drafts_at_the_busy_count_it_runs_at_and_idle_slots_add_no_rows():
    # step 1, both busy (plain): [1, 1] rows, C (0.5 + 1); the short request is done. The long one alone drafts 7:
    # step 2 copies the rest of its first round ([7, 0] rows, C (1 + 0.3)), step 3 its second ([8, 0], C 1.35)
    lane = 0.001
    got = burst_rate([LONG, SHORT], [[0, 1]], 2, [7, 0], PER_SEQUENCE, unified=False, lane=lane)
    assert got == pytest.approx(17 / (4.15 * C + 4 * lane), rel=1e-9)


def test_requests_arriving_together_choose_plain_decoding_where_steady_load_drafts():
    # steady load draws 2 of the 9 rounds at random every step, so a copy usually shares its decode with plain
    # rounds: drafting pays (1.4x at 2 busy). Arriving together, the copy request finishes in the first step and
    # the plain one runs the rest alone: 16 tokens in 9.3 C (split cache) where plain decoding takes 8 C.
    events = recording(COPY, PLAIN)
    steady = schedule_for_load(events, MILD, 2, [7], unified=False, lane_seconds=0.0, samples=400)
    assert steady.schedule == [(1, 2, 7)]
    burst = schedule_for_load(events, MILD, 2, [7], unified=False, lane_seconds=0.0, burst=1, samples=4)
    assert burst.schedule == [(1, 1, 7), (2, 2, 0)] and burst.flag == "1-1:7,2-2:0"
    one, two = burst.rows
    # every draw holds each request as often: alone, the two requests take 1.35 C and 8 C for 16 tokens
    assert one["tokens_per_second"][7] == pytest.approx(16 / (9.35 * C), rel=1e-9)
    assert one["tokens_per_second"][0] == pytest.approx(1 / C, rel=1e-9)
    assert two["tokens_per_second"][7] == pytest.approx(16 / (9.3 * C), rel=1e-9)
    assert two["tokens_per_second"][0] == pytest.approx(2 / C, rel=1e-9)
    assert two["vs_none"] == pytest.approx(1.0) and one["vs_none"] == pytest.approx(16 / 9.35, rel=1e-9)
    # in a unified cache the first step is cheaper (1.35 C), still not enough
    unified = schedule_for_load(events, MILD, 2, [7], unified=True, lane_seconds=0.0, burst=1, samples=4)
    assert unified.rows[1]["tokens_per_second"][7] == pytest.approx(16 / (8.35 * C), rel=1e-9)
    assert unified.schedule == [(1, 1, 7), (2, 2, 0)]
    assert burst.to_dict()["burst"] == 1 and steady.to_dict()["burst"] is None
    assert "arriving together" in burst.text() and "arriving together" not in steady.text()


def test_each_busy_count_is_chosen_with_the_lengths_below_it_pricing_its_tail():
    # alone the long request drafts (2.7 C for 16 tokens, not 16 C); 2 busy: at k = 7 the first step ([8, 1] rows,
    # 2.3 C) and the long request's second round alone (1.35 C); at k = 0 a plain step (C), then the long request
    # alone at busy 1's length 7 (1.3 C, 1.35 C): 17 tokens in 3.65 C either way, and a tie keeps the shorter
    events = recording(LONG, SHORT)
    got = schedule_for_load(events, MILD, 2, [7], unified=False, lane_seconds=0.0, burst=1, samples=2)
    one, two = got.rows
    assert one["tokens_per_second"][7] == pytest.approx(17 / (3.7 * C), rel=1e-9)
    assert two["tokens_per_second"][7] == pytest.approx(17 / (3.65 * C), rel=1e-9)
    assert two["tokens_per_second"][0] == pytest.approx(17 / (3.65 * C), rel=1e-9)
    assert got.schedule == [(1, 1, 7), (2, 2, 0)]
    # against plain decoding at every busy count: 16 steps of C for 17 tokens, the first with both requests
    assert two["vs_none"] == pytest.approx((17 / 3.65) / (17 / 16), rel=1e-9)


def test_draws_hold_every_recorded_request_equally_and_follow_the_seed():
    bursts = draw_bursts(3, 5, 3, np.random.default_rng(7))
    assert len(bursts) == 5 and all(len(b) == 3 for b in bursts)
    assert Counter(i for b in bursts for i in b) == {0: 5, 1: 5, 2: 5}
    assert bursts == draw_bursts(3, 5, 3, np.random.default_rng(7))
    events = recording(COPY, PLAIN, ((4, 2), (0, 0)))
    a = schedule_for_load(events, MILD, 3, [2, 4], unified=False, lane_seconds=0.0, burst=2, samples=8, seed=3)
    b = schedule_for_load(events, MILD, 3, [2, 4], unified=False, lane_seconds=0.0, burst=2, samples=8, seed=3)
    assert a.rows == b.rows


@pytest.mark.parametrize("burst", [0, -1, 1.5, True, 1001])
def test_a_burst_out_of_range_is_refused(burst):
    with pytest.raises(KnobError, match="burst"):
        schedule_for_load(recording(COPY), MILD, 2, [7], unified=False, burst=burst)


def test_advise_schedule_burst_on_the_command_line(tmp_path, capsys):
    rec = write_recording(tmp_path / "rec.jsonl", recording(COPY, PLAIN))
    costs = tmp_path / "cost.json"
    costs.write_text(json.dumps(MILD.to_dict()))
    common = ["advise", rec, "--parallel", "1,2", "--batch-cost", str(costs), "--schedule"]
    assert cli.main([*common, "--burst", "1", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["load_schedule"]
    assert got["burst"] == 1 and got["busy_max"] == 2 and got["draft_schedule"][-1] == [2, 2, 0]
    for extra, words in (
        (["--burst", "0"], "option --burst: '0' is not allowed"),
        (["--burst", "x"], "option --burst: 'x' is not allowed"),
    ):
        assert cli.main([*common, *extra]) == 2
        assert words in capsys.readouterr().err
    assert cli.main(["advise", rec, "--parallel", "1,2", "--burst", "1"]) == 2
    assert "option --burst: only with --schedule" in capsys.readouterr().err
