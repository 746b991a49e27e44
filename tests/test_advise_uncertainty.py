"""When the advisor says speculation pays: the bootstrap interval of a setting's speedup over the recorded
rounds (specviz.analysis.uncertainty) and the rule that its lower end must clear plain decoding."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_advise import NO_TILE, linear
from test_diagnose import Rounds

from specviz.analysis.advise import advise, predict
from specviz.analysis.uncertainty import block_length, ratio_interval

COST = linear(0.010, 0.002)  # a verify of 1 + k tokens costs 10 + 2k ms
DRAFT = [100 + j for j in range(4)]


def recording(pattern, repeats, strategy="ngram-simple", r=None):
    """Rounds drafting 4 tokens each, accepted whole (1 in ``pattern``) or rejected at once (0), the
    pattern ``repeats`` times in a row."""
    R = r or Rounds(list(range(1, 30)), knobs=dict(NO_TILE), strategy=strategy)
    for _ in range(repeats):
        for whole in pattern:
            R.round(DRAFT, 4 if whole else 0, 7, rank=2)
    return R


#: a copy of three rounds, then nine rejections: a quarter of the rounds accepted whole, in bursts, as a
#: generation that copies a passage now and then. Drafts of 4: (3 * 5 + 9) tokens in 12 * 18 ms = 1.11x
BURSTS = [1, 1, 1] + [0] * 9


def test_a_small_gain_from_few_bursty_rounds_is_not_advised():
    adv = advise(recording(BURSTS, 3).events, cost=COST)
    d = adv.declined
    # the best setting beats plain decoding on the point estimate ...
    assert d is not None and d.strategy == "ngram-simple" and d.draft_max == 4
    assert d.speedup == pytest.approx(10 * 24 / (12 * 18))
    # ... but its interval reaches below 1.0, so the advice is plain decoding, and says why
    assert d.rounds == 36 and d.speedup_low < 1.0 < d.speedup < d.speedup_high
    assert adv.best.strategy == "none" and adv.flags == "--spec-type none" and not adv.pays
    assert adv.text.startswith("speculation is not shown to pay here")
    assert f"{d.speedup:.2f}x, is within the recording's uncertainty ({d.interval_text()}" in adv.reason
    assert "36 rounds" in adv.reason
    out = adv.to_dict()
    json.dumps(out)
    assert out["pays"] is False and out["declined"]["speedup_low"] == d.speedup_low
    assert out["reason"] == adv.reason and out["per_strategy"]["ngram-simple"]["speedup_high"] == d.speedup_high
    assert "why: " + adv.reason in adv.report()


def test_a_clear_gain_is_advised_with_its_interval():
    # three of every four rounds accepted whole, in runs of six: 2.22x, and sure of it
    adv = advise(recording([1] * 6 + [0] * 2, 4).events, cost=COST)
    b = adv.best
    assert b.strategy == "ngram-simple" and b.draft_max == 4 and adv.pays and adv.declined is None
    assert b.speedup == pytest.approx(10 * (24 * 5 + 8) / (32 * 18))
    assert 1.0 < b.speedup_low < b.speedup < b.speedup_high
    assert adv.flags == "--spec-type ngram-simple --spec-ngram-simple-size-n 12 --spec-ngram-simple-size-m 4"
    assert f"({b.interval_text()} at 90%)" in adv.text and "is shown to pay" in adv.reason
    assert f"{b.speedup:.2f}x{', ' + b.interval_text()})" in adv.report()


def test_the_same_gain_is_advised_on_enough_rounds_or_steady_ones():
    """It is the evidence, not the size of the gain, that decides: the bursty mix above, ten times as long,
    and the same quarter of rounds accepted evenly (every fourth), are both advised at 1.11x."""
    longer = advise(recording(BURSTS, 30).events, cost=COST)
    assert longer.best.strategy == "ngram-simple" and longer.best.speedup_low > 1.0
    assert longer.best.speedup == pytest.approx(10 * 24 / (12 * 18))
    steady = advise(recording([1, 0, 0, 0], 9).events, cost=COST)
    assert steady.best.strategy == "ngram-simple" and steady.best.speedup == pytest.approx(10 * 24 / (12 * 18))
    assert steady.best.speedup_low == pytest.approx(steady.best.speedup)  # blocks of 4 each hold one copy


def test_a_sure_setting_is_advised_over_a_faster_looking_unsure_one():
    from specviz.decoding.events import KnobsChanged

    # one run of copies in 24 rounds: 1.30x, but one run is little evidence
    R = recording([1] * 8 + [0] * 16, 1, strategy="ngram-cache")
    R.events.append(KnobsChanged(R.r, strategy="prompt-lookup", knobs=dict(NO_TILE)))
    R = recording([1, 0, 0, 0], 10, r=R)  # every fourth round copied: 1.11x, steadily
    adv = advise(R.events, cost=COST)
    cache, lookup = adv.per_strategy["ngram-cache"], adv.per_strategy["prompt-lookup"]
    assert cache.tokens_per_second > lookup.tokens_per_second and cache.speedup_low < 1.0 < lookup.speedup_low
    assert adv.best.strategy == "prompt-lookup" and adv.declined is cache and adv.declined_label == "ngram-cache"
    assert "ngram-cache at" in adv.reason and "looks faster" in adv.reason


def test_one_round_cannot_show_that_speculation_pays():
    adv = advise(recording([1], 1).events, cost=COST)
    assert adv.best.strategy == "none" and adv.declined is not None and adv.declined.speedup_low is None
    assert "rests on 1 round" in adv.reason


def test_predict_carries_an_interval_over_the_new_rounds():
    adv = advise(recording([1] * 6 + [0] * 2, 4).events, cost=COST)
    few = predict(adv, recording(BURSTS, 3).events, cost=COST)
    many = predict(adv, recording(BURSTS, 30).events, cost=COST)
    assert few.speedup == pytest.approx(many.speedup) == pytest.approx(10 * 24 / (12 * 18))
    assert few.speedup_low < 1.0 < many.speedup_low and few.rounds == 36 and many.rounds == 360
    assert many.speedup_high - many.speedup_low < few.speedup_high - few.speedup_low


def test_ratio_interval_keeps_runs_of_rounds_together():
    """The same rounds in bursts and evenly spread: the blocks see a burst as one piece of evidence, so the
    bursty order is uncertain and the even one (a copy in every block) is not."""
    tokens_b = np.array([5.0 if w else 1.0 for w in BURSTS * 3])
    tokens_e = np.array([5.0 if w else 1.0 for w in [1, 0, 0, 0] * 9])
    seconds = np.full(36, 0.018)
    lo_b, hi_b = ratio_interval(tokens_b, seconds)
    lo_e, hi_e = ratio_interval(tokens_e, seconds)
    assert hi_e - lo_e == pytest.approx(0.0) and hi_b - lo_b > 0.3 * (tokens_b.sum() / seconds.sum())
    assert lo_b < tokens_b.sum() / seconds.sum() < hi_b
    assert ratio_interval(tokens_b, seconds) == (lo_b, hi_b)  # a fixed seed: the same rounds, the same interval
    assert ratio_interval(np.array([2.0]), np.array([1.0])) is None
    assert [block_length(n) for n in (1, 2, 8, 9, 27, 28, 1000)] == [1, 2, 2, 3, 3, 4, 10]


def test_ratio_interval_covers_the_true_ratio_about_as_often_as_it_says():
    """On 200 recordings of 200 independent rounds (a quarter copying 4 tokens, the rest none; each round
    18 or 30 ms at random), the 90% interval holds the true tokens/s in roughly 90% of them."""
    rng = np.random.default_rng(7)
    true = (0.25 * 5 + 0.75 * 1) / (0.5 * 0.018 + 0.5 * 0.030)
    hits = 0
    for _ in range(200):
        tokens = np.where(rng.random(200) < 0.25, 5.0, 1.0)
        seconds = np.where(rng.random(200) < 0.5, 0.018, 0.030)
        lo, hi = ratio_interval(tokens, seconds)
        hits += lo <= true <= hi
    assert 0.80 <= hits / 200 <= 0.97, hits


def test_the_round_overhead_is_what_a_round_costs_beyond_its_own_draft_and_verify():
    """Verify times that stray milliseconds from any curve, and a round held up by the machine: the
    fit gives the real overhead (0.3 ms a round, 0.05 ms a row read), not the strays."""
    from specviz.analysis.advise import fit_overhead

    rng = np.random.default_rng(3)
    rows = []
    for i in range(60):
        n_read = 1 + i % 8
        verify = 0.02 * (1 + n_read) * (1 + rng.uniform(-0.15, 0.15))  # a verify, with its noise
        draft = 0.001
        over = 0.0003 + 0.00005 * n_read
        rows.append((n_read, n_read + 2, draft + verify + over, draft, verify))
    rows.append((3, 5, 0.5, 0.001, 0.08))  # one round the machine held up for 0.4 s
    a, b = fit_overhead(rows)
    assert a == pytest.approx(0.0003, abs=2e-5) and b == pytest.approx(0.00005, abs=5e-6)


def test_the_round_overhead_without_a_slope_is_the_median():
    from specviz.analysis.advise import fit_overhead

    rows = [(1, 1, 0.0205, 0.0, 0.02)] * 9 + [(1, 1, 0.2, 0.0, 0.02)]
    assert fit_overhead(rows) == pytest.approx((0.0005, 0.0))
    assert fit_overhead([]) == (0.0, 0.0)
