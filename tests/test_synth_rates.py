"""A recording's acceptance by draft position as llama-server's synthetic acceptance reads it
(specviz.analysis.synth_rates, ``specviz advise REC --synth-rates``): hand-worked rounds, the rule for short
drafts, monotonicity, the flags as the server checks them, the refusal and the CLI."""

from __future__ import annotations

import json
import random

import pytest
from test_diagnose import Rounds

from specviz.analysis.synth_rates import check_rates, format_rates, synth_rates
from specviz.cli.main import main
from specviz.decoding.events import KnobsChanged
from specviz.decoding.recorder import Recorder
from specviz.errors import KnobError, RecordingError

KNOBS = {"align": False, "draft_max": 4, "draft_min": 0, "size_n": 12}
DRAFT = [100, 101, 102, 103]


def hand_worked() -> list:
    """Ten drafting rounds and one plain one, worked by hand:

    ====  =====  ========  ===========================================
    n     draft  accepted
    ====  =====  ========  ===========================================
    4     4      4         reach positions 0-3, all accepted
    2     4      1         reach 0-1, refused at 1
    2     4      0         reach 0, refused at 0
    2     2      2         short drafts: reach 0-1, accepted, end there
    ====  =====  ========  ===========================================

    Position 0: 10 reached, 8 accepted (0.8). Position 1: 8 reached (4 + 2 + 2), 6 accepted (0.75).
    Positions 2 and 3: the 4 full drafts alone reach them (the short drafts never had them), all accepted
    (1.0). Unconditional: 0.8, 0.6, 0.6, 0.6; length 1 + 2.6 = 3.6.
    """
    R = Rounds(list(range(1, 30)), knobs=dict(KNOBS), strategy="ngram-simple")
    for draft, n_acc, times in ((DRAFT, 4, 4), (DRAFT, 1, 2), (DRAFT, 0, 2), (DRAFT[:2], 2, 2)):
        for _ in range(times):
            R.round(draft, n_acc, 7, rank=2)
    R.round([], 0, reason="no-match")
    return R.events


def test_hand_worked_rounds_give_the_rates_worked_by_hand():
    sr = synth_rates(hand_worked())
    assert sr.strategy == "ngram-simple" and sr.reached == (10, 8, 4, 4) and sr.accepted == (8, 6, 4, 4)
    assert sr.conditional == pytest.approx((0.8, 0.75, 1.0, 1.0))
    assert sr.rates == pytest.approx((0.8, 0.6, 0.6, 0.6))
    assert sr.synth_len == pytest.approx(3.6)
    assert (sr.drafting_rounds, sr.draft_tokens, sr.accepted_tokens) == (10, 36, 22)
    # the server's own 'mean len' of these drafts (1 + accepted / steps) counts the short drafts' lost positions
    assert sr.mean_accepted_length == pytest.approx(3.2) and sr.mean_draft_length == pytest.approx(3.6)
    # the server's /metrics counter for these drafts: every round counts, a short draft as not accepted past its end
    assert sr.accepted_per_pos == (8, 6, 4, 4) and sr.per_step == pytest.approx((0.8, 0.6, 0.4, 0.4))
    assert sr.rates_flag == "--spec-synth-rates 0.8,0.6,0.6,0.6" and sr.len_flag == "--spec-synth-len 3.6000"
    assert sr.server_flags() == (
        "--spec-type ngram-simple --spec-ngram-simple-size-n 12 --spec-ngram-simple-size-m 4 "
        "--spec-synth-rates 0.8,0.6,0.6,0.6"
    )
    # the server turns the rates back into P_i / P_(i-1), the conditional rates the rounds show
    r = sr.rates
    assert [r[0]] + [r[i] / r[i - 1] for i in range(1, 4)] == pytest.approx(list(sr.conditional))
    d = sr.to_dict()
    assert d["synth_rates"] == pytest.approx([0.8, 0.6, 0.6, 0.6]) and d["synth_len"] == pytest.approx(3.6)
    json.dumps(d)


def test_a_position_no_draft_reached_with_the_ones_before_accepted_takes_zero():
    R = Rounds(list(range(1, 30)), knobs=dict(KNOBS), strategy="ngram-simple")
    for _ in range(2):
        R.round(DRAFT[:3], 0, 7)  # long drafts, refused at once
        R.round(DRAFT[:1], 1)  # short drafts, accepted
    sr = synth_rates(R.events)
    assert sr.reached == (4, 0, 0) and sr.rates == pytest.approx((0.5, 0.0, 0.0))
    assert sr.rates_flag == "--spec-synth-rates 0.5,0,0" and "position 1" in sr.report()


@pytest.mark.parametrize("seed", range(5))
def test_rates_are_non_increasing_within_the_unit_interval_one_per_position(seed):
    rng = random.Random(seed)
    R = Rounds(list(range(1, 30)), knobs=dict(KNOBS), strategy="ngram-simple")
    longest = 0
    for _ in range(60):
        n = rng.randint(0, 6)
        k = rng.randint(0, n)
        longest = max(longest, n)
        R.round([100 + j for j in range(n)], k, 7, reason=None if n else "no-match")
    sr = synth_rates(R.events)
    r = sr.rates
    assert len(r) == longest and all(0.0 <= x <= 1.0 for x in r)
    assert all(r[i] <= r[i - 1] for i in range(1, len(r)))
    assert sr.synth_len == pytest.approx(1 + sum(r)) and 1.0 <= sr.synth_len <= longest + 1
    assert check_rates(r) == tuple(float(x) for x in format_rates(r).split(","))


def test_rates_are_checked_as_the_server_checks_them():
    assert check_rates([1, 0.99996, 0.5]) == (1.0, 1.0, 0.5)  # rounding keeps the order
    with pytest.raises(KnobError, match="at least one"):
        check_rates([])
    with pytest.raises(KnobError, match="within"):
        check_rates([0.5, -0.1])
    with pytest.raises(KnobError, match="must not increase"):
        check_rates([0.5, 0.6])
    with pytest.raises(KnobError, match="within"):
        check_rates([float("nan")])


def test_the_strategy_with_most_drafting_rounds_unless_one_is_named():
    R = Rounds(list(range(1, 30)), knobs=dict(KNOBS), strategy="ngram-simple")
    R.round(DRAFT, 4)
    R.events.append(KnobsChanged(1, strategy="ngram-mod", knobs={"draft_max": 2}, previous_strategy="ngram-simple"))
    for _ in range(3):
        R.round(DRAFT[:2], 1, 7)
    sr = synth_rates(R.events)
    assert sr.strategy == "ngram-mod" and sr.rates == pytest.approx((1.0, 0.0))
    assert any("drafted with ngram-mod, ngram-simple" in n for n in sr.notes)
    assert synth_rates(R.events, "ngram-simple").rates == pytest.approx((1.0,) * 4)


def test_a_recording_without_drafts_is_refused():
    R = Rounds(list(range(1, 30)), knobs={}, strategy="none")
    R.round([], 0)
    with pytest.raises(RecordingError, match="no drafted token"):
        synth_rates(R.events)
    with pytest.raises(RecordingError, match="by ngram-mod"):
        synth_rates(hand_worked(), "ngram-mod")


def record(events, path):
    with Recorder(path) as rec:
        for e in events:
            rec(e)
    return str(path)


def test_the_command_line_text_and_json(tmp_path, capsys):
    path = record(hand_worked(), tmp_path / "rec.jsonl")
    assert main(["advise", path, "--synth-rates"]) == 0
    out = capsys.readouterr().out
    assert "--spec-synth-rates 0.8,0.6,0.6,0.6" in out and "--spec-synth-len 3.6000" in out
    assert "either flag, not both" in out and "--spec-ngram-simple-size-m 4" in out
    assert main(["advise", path, "--synth-rates", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["synth_rates"] == pytest.approx([0.8, 0.6, 0.6, 0.6]) and d["synth_len"] == pytest.approx(3.6)


def test_the_command_line_refuses_a_recording_without_drafts(tmp_path, capsys):
    R = Rounds(list(range(1, 30)), knobs={}, strategy="none")
    R.round([], 0)
    path = record(R.events, tmp_path / "plain.jsonl")
    assert main(["advise", path, "--synth-rates"]) == 2
    err = capsys.readouterr().err
    assert "argument FILE" in err and "no drafted token" in err
