"""The advisor (specviz.analysis.advise): its choice on synthetic cost curves and hand-made rounds, flags, a session."""

from __future__ import annotations

import json

import pytest
from test_diagnose import Rounds

from specviz.analysis.advise import advise, cost_from_times, llama_flags
from specviz.decoding.verify_cost import VerifyCostModel

NO_TILE = {"align": False, "draft_max": 8, "draft_min": 0}


def linear(fixed, per_token, n=64):
    """A cost curve: ``fixed`` seconds for a one-token verify, ``per_token`` more per extra token."""
    return VerifyCostModel(list(range(1, n + 1)), [fixed + per_token * (b - 1) for b in range(1, n + 1)])


def rejected_at_depth(k, rounds=20, strategy="ngram-simple", knobs=NO_TILE):
    R = Rounds(list(range(1, 30)), knobs=dict(knobs), strategy=strategy)
    for _ in range(rounds):
        R.round([100 + j for j in range(8)], k, 7, rank=2)
    return R.events


def test_a_cheap_extra_token_favours_drafts_as_long_as_they_are_accepted():
    adv = advise(rejected_at_depth(2), cost=linear(0.010, 0.005))
    b = adv.best
    # k=2: 3 tokens in 20 ms (150/s) beats k=1 (2 in 15 ms), k=3 (3 in 25 ms) and plain (100/s)
    assert (b.strategy, b.draft_max, b.draft_min, b.draft_p_min) == ("ngram-simple", 2, 0, None)
    assert b.tokens_per_second == pytest.approx(150.0) and b.speedup == pytest.approx(1.5)
    assert adv.baseline_tokens_per_second == pytest.approx(100.0)
    # the setting run (draft_max 8): 3 tokens in 50 ms (a batch of 9)
    assert adv.current["ngram-simple"].tokens_per_second == pytest.approx(3 / 0.050)
    assert "expected 150.0 tokens/s, 1.50x plain decoding" in adv.text
    assert adv.flags == "--spec-type ngram-simple --spec-ngram-simple-size-n 12 --spec-ngram-simple-size-m 2"
    json.dumps(adv.to_dict())


def test_an_expensive_extra_token_makes_plain_decoding_the_advice():
    adv = advise(rejected_at_depth(2), cost=linear(0.010, 0.010))  # every token costs as much as a decode
    assert adv.best.strategy == "none" and adv.flags == "--spec-type none"
    assert adv.text.startswith("speculation does not pay here")


def test_tile_alignment_is_honoured():
    knobs = {"align": True, "verify_tile": 4, "draft_max": 8}
    adv = advise(rejected_at_depth(6, knobs=knobs), cost=linear(0.010, 0.001))
    # with a nearly free extra token the longest useful draft wins, but only tile-aligned lengths exist:
    # 6 accepted + 1 → k=7 (a batch of 8), never k=6 (a batch of 7)
    assert adv.best.draft_max == 7


def test_a_replayed_draft_shorter_than_its_limit_is_cut_to_suit_the_tile_as_the_round_cuts_it():
    knobs = {"align": True, "verify_tile": 4, "draft_max": 8, "draft_min": 0}
    R = Rounds(list(range(1, 30)), knobs=knobs, strategy="ngram-map-k")
    for _ in range(10):
        R.round([60 + j for j in range(6)], 6)  # six tokens proposed under a limit of 7, all accepted
    adv = advise(R.events, cost=linear(0.010, 0.001))
    # hand-worked: the round verifies 3 of the 6 (a batch of 4 rows, not 7): 4 tokens in 13 ms
    assert adv.current["ngram-map-k"].tokens_per_second == pytest.approx(4 / 0.013)
    assert adv.current["ngram-map-k"].tokens_per_round == pytest.approx(4.0)


def test_draft_min_drops_the_short_drafts_that_never_pass():
    R = Rounds(list(range(1, 30)), knobs=NO_TILE, strategy="ngram-map-k")
    for _ in range(10):
        R.round([50], 0, 9, rank=3)  # one-token drafts: always rejected
        R.round([60 + j for j in range(6)], 6)  # six-token drafts: always accepted
    adv = advise(R.events, cost=linear(0.010, 0.002))
    assert adv.best.draft_min == 2 and adv.best.draft_max == 6
    assert "llama.cpp's ngram-map-k has no minimum draft length" in " ".join(adv.flag_notes)


def test_draft_p_min_cuts_unsure_draft_tokens():
    knobs = {**NO_TILE, "draft_p_min": 0.0, "draft_model": "/models/d.gguf"}
    R = Rounds(list(range(1, 30)), knobs=knobs, strategy="draft")
    for _ in range(12):
        # sure tokens (0.9) are accepted, the first unsure one (0.3) is rejected, at depth 1 or at depth 4:
        # no draft_max cuts both drafts where they turn unsure, a draft_p_min does
        R.round([10, 11, 12, 13, 14], 1, 5, probs=[0.9, 0.3, 0.2, 0.2, 0.2], draft_seconds=0.005)
        R.round([10, 11, 12, 13, 14], 4, 5, probs=[0.9, 0.9, 0.9, 0.9, 0.3], draft_seconds=0.005)
    adv = advise(R.events, cost=linear(0.010, 0.004))
    b = adv.best
    assert b.strategy == "draft" and b.draft_max >= 4 and 0.3 < b.draft_p_min <= 0.9
    assert adv.flags.startswith("--spec-type draft-simple -md /models/d.gguf --spec-draft-n-max ")
    assert f"--spec-draft-p-min {b.draft_p_min:g}" in adv.flags
    # the search never goes below the draft_p_min the session drafted with
    R2 = Rounds(list(range(1, 30)), knobs={**knobs, "draft_p_min": 0.5}, strategy="draft")
    for _ in range(12):
        R2.round([10, 11], 2, probs=[0.9, 0.8], draft_seconds=0.004)
    assert advise(R2.events, cost=linear(0.010, 0.004)).best.draft_p_min >= 0.5


def test_the_best_strategy_among_those_run():
    R = Rounds(list(range(1, 30)), knobs=NO_TILE, strategy="prompt-lookup")
    for _ in range(10):
        R.round([100 + j for j in range(4)], 1, 7, rank=2)
    from specviz.decoding.events import KnobsChanged

    R.events.append(KnobsChanged(R.r, strategy="ngram-cache", knobs=dict(NO_TILE)))
    for _ in range(10):
        R.round([200 + j for j in range(4)], 4)
    adv = advise(R.events, cost=linear(0.010, 0.003))
    assert set(adv.per_strategy) == {"prompt-lookup", "ngram-cache"}
    assert adv.best.strategy == "ngram-cache" and adv.best.draft_max == 4
    assert adv.per_strategy["prompt-lookup"].draft_max == 1


def test_cost_curve_fitted_from_recorded_verify_times():
    c = cost_from_times({1: [0.010, 0.011, 0.009], 3: [0.020], 5: [0.030, 0.030]})
    assert c(1) == pytest.approx(0.010) and c(3) == pytest.approx(0.020) and c(4) == pytest.approx(0.025)
    assert cost_from_times({1: [0.01]}) is None
    # without a given curve the advisor fits one to the rounds' verify times
    R = Rounds(list(range(1, 30)), knobs=NO_TILE, strategy="ngram-simple")
    for _ in range(10):
        R.round([1, 2, 3], 3, verify_seconds=0.010 + 0.005 * 3)
        R.round([], 0, reason="no-match", verify_seconds=0.010)
    adv = advise(R.events)
    assert adv.cost_source == "fitted to the recorded verify times" and adv.best.draft_max == 3


def test_flags_for_each_family():
    from specviz.analysis.advise import Candidate

    c = Candidate("ngram-mod", 16, 4, None, 1.0, 1.0, 1.0)
    assert llama_flags(c, {"n_match": 12})[0] == (
        "--spec-type ngram-mod --spec-ngram-mod-n-match 12 --spec-ngram-mod-n-min 4 --spec-ngram-mod-n-max 16"
    )
    flags, notes = llama_flags(Candidate("prompt-lookup", 7, 0, None, 1, 1, 1), {"max_ngram": 3})
    assert flags == "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 7"
    assert any("no prompt-lookup type" in n for n in notes)
    assert llama_flags(Candidate("ngram-cache", 8, 0, None, 1, 1, 1), {})[0] == "--spec-type ngram-cache"


def test_advise_a_live_session(tiny_session):
    s = tiny_session
    s.start("the cat of the dog and the a the cat of the", 80, "prompt-lookup", draft_max=8)
    s.run()
    adv = advise(s)  # no measured curve: fitted to the verify times of this run
    assert adv.cost_source == "fitted to the recorded verify times"
    assert adv.best is not None and "prompt-lookup" in adv.per_strategy
    assert adv.measured["prompt-lookup"] > 0


def test_two_lanes_each_folded_on_its_own_and_policies_apart(tiny_session):
    s = tiny_session
    s.start("the cat of the dog and the a the cat of the", 60, "prompt-lookup", draft_max=8)
    s.run()
    f = s.fork()
    try:
        f.rewind(0)  # its Rewound event must not cut the first lane's rounds
        f.configure(draft_policy="adaptive")
        f.run()
        one = advise(s)
        both = advise(s, f)
        assert set(both.per_strategy) == {"prompt-lookup", "prompt-lookup (adaptive policy)"}
        assert both.current["prompt-lookup"].tokens_per_round == pytest.approx(
            one.current["prompt-lookup"].tokens_per_round
        )
        assert both.best_label in both.per_strategy or both.best_label == "none"
    finally:
        f.close()


def test_a_measured_curve_is_scaled_to_the_rounds_own_verify_times():
    from specviz.analysis.advise import scaled_to_times

    # the rounds ran under twice the load the curve was measured under
    c, scale = scaled_to_times(linear(0.010, 0.005), {1: [0.020, 0.020], 3: [0.040]})
    assert scale == pytest.approx(2.0) and c(1) == pytest.approx(0.020) and c(5) == pytest.approx(0.060)
    assert scaled_to_times(linear(0.010, 0.005), {})[1] == 1.0
    R = Rounds(list(range(1, 30)), knobs=NO_TILE, strategy="ngram-simple")
    for _ in range(10):
        R.round([100 + j for j in range(8)], 2, 7, rank=2, verify_seconds=2 * (0.010 + 0.005 * 8))
    adv = advise(R.events, cost=linear(0.010, 0.005), scale_to_rounds=True)
    assert "scaled by 2.00" in adv.cost_source and adv.baseline_tokens_per_second == pytest.approx(50.0)
    # the choice (a ratio of costs) is the same as unscaled; only the level moves
    assert adv.best.draft_max == advise(R.events, cost=linear(0.010, 0.005)).best.draft_max == 2


def test_for_server_searches_only_what_llama_servers_flags_express():
    """ngram-map-k has no minimum draft length in llama.cpp: for llama-server the advice keeps draft_min at
    0 (and its expected speedup is that of the flags), where specviz's own advice uses 2."""
    R = Rounds(list(range(1, 30)), knobs=NO_TILE, strategy="ngram-map-k")
    for _ in range(10):
        R.round([50], 0, 9, rank=3)
        R.round([60 + j for j in range(6)], 6)
    own = advise(R.events, cost=linear(0.010, 0.002))
    srv = advise(R.events, cost=linear(0.010, 0.002), for_server=True)
    assert own.best.draft_min == 2 and srv.best.draft_min == 0 and srv.best.draft_max == 6
    assert srv.best.speedup < own.best.speedup
    assert not any("minimum draft length" in n for n in srv.flag_notes)
    assert any("searched for llama-server" in x for x in srv.limits)


def test_for_server_verifies_without_tile_alignment():
    knobs = {"align": True, "verify_tile": 4, "draft_max": 8}
    adv = advise(rejected_at_depth(6, knobs=knobs), cost=linear(0.010, 0.001), for_server=True)
    assert adv.best.draft_max == 6  # a batch of 7 rows: the server does not round it to the tile


def test_for_server_keeps_ngram_cache_at_eight_and_leaves_prompt_lookup_out():
    R = Rounds(list(range(1, 30)), knobs=NO_TILE, strategy="prompt-lookup")
    for _ in range(10):
        R.round([100 + j for j in range(8)], 8)
    from specviz.decoding.events import KnobsChanged

    R.events.append(KnobsChanged(R.r, strategy="ngram-cache", knobs=dict(NO_TILE)))
    for _ in range(10):
        R.round([200 + j for j in range(8)], 2, 7, rank=2)
    own = advise(R.events, cost=linear(0.010, 0.003))
    srv = advise(R.events, cost=linear(0.010, 0.003), for_server=True)
    assert own.best.strategy == "prompt-lookup" and own.per_strategy["ngram-cache"].draft_max == 2
    assert set(srv.per_strategy) == {"ngram-cache"} and srv.per_strategy["ngram-cache"].draft_max == 8
    assert any("prompt-lookup: left out" in x for x in srv.limits)
    # prompt lookup alone is still advised (its flags say ngram-simple is the nearest)
    R2 = Rounds(list(range(1, 30)), knobs=NO_TILE, strategy="prompt-lookup")
    for _ in range(10):
        R2.round([100 + j for j in range(4)], 4)
    assert advise(R2.events, cost=linear(0.010, 0.003), for_server=True).best.strategy == "prompt-lookup"


def test_for_server_leaves_out_an_ngram_simple_m_gram_shorter_than_its_n_gram():
    """llama.cpp's ngram-simple drafts nothing when fewer than size_n tokens would be copied: with size_n 3,
    `--spec-ngram-simple-size-m 2` never drafts in the server, so it is not advised for it (cutting the
    recorded drafts to 2 tokens would score it as drafting). specviz's own advice may cut drafts anywhere."""
    knobs = {**NO_TILE, "size_n": 3, "size_m": 8}
    R = Rounds(list(range(1, 30)), knobs=knobs, strategy="ngram-simple")
    for _ in range(10):
        R.round([100 + j for j in range(8)], 1, 7, rank=2)  # only the first drafted token is ever accepted
    own = advise(R.events, cost=linear(0.010, 0.004))
    srv = advise(R.events, cost=linear(0.010, 0.004), for_server=True)
    assert own.best.draft_max == 1  # a one-token draft, as specviz's own cap makes it
    assert any("drafts nothing" in n and "--for-server" in n for n in own.flag_notes), own.flag_notes
    assert srv.best.strategy == "none" or srv.best.draft_max >= 3, srv.text


def test_predict_scores_the_advised_setting_on_other_rounds_without_searching():
    """Advice learnt on some rounds, predicted for others (the prompts a server is then measured on): the
    advised setting replayed on the new rounds as advise scores it, not the best setting for them."""
    from specviz.analysis.advise import predict

    cost = linear(0.010, 0.005)
    adv = advise(rejected_at_depth(2), cost=cost)
    assert adv.best.draft_max == 2 and adv.best.speedup == pytest.approx(1.5)
    same = predict(adv, rejected_at_depth(2), cost=cost)
    assert same.tokens_per_second == pytest.approx(adv.best.tokens_per_second) and same.draft_max == 2
    # rounds whose first drafted token is always rejected: k=2 commits 1 token for a batch of 3 (20 ms)
    assert predict(adv, rejected_at_depth(0), cost=cost).speedup == pytest.approx(0.5)
    # three of four copied whole, one rejected at once: 3 * 3 + 1 tokens in 4 * 20 ms
    R = Rounds(list(range(1, 30)), knobs=dict(NO_TILE), strategy="ngram-simple")
    for _ in range(5):
        for _ in range(3):
            R.round([100 + j for j in range(8)], 8)
        R.round([200 + j for j in range(8)], 0, 7, rank=2)
    mixed = predict(adv, R.events, cost=cost)
    assert mixed.tokens_per_second == pytest.approx(125.0) and mixed.tokens_per_round == pytest.approx(2.5)
    # what these rounds alone would advise: drafts of 8 (3 * 9 + 1 tokens in 4 * 50 ms, 140 tokens/s)
    assert advise(R.events, cost=cost).best.draft_max == 8
    # rounds of another strategy say nothing about the advised one
    assert predict(adv, rejected_at_depth(2, strategy="ngram-map-k"), cost=cost) is None
    # plain decoding is plain decoding on any rounds
    plain = advise(rejected_at_depth(2), cost=linear(0.010, 0.010))
    assert predict(plain, R.events, cost=cost).speedup == 1.0


def test_predict_keeps_the_advices_search_for_the_server():
    """Advice for llama-server verifies without tile alignment, and so does its prediction on other rounds."""
    from specviz.analysis.advise import predict

    knobs = {"align": True, "verify_tile": 4, "draft_max": 8}
    cost = linear(0.010, 0.001)
    adv = advise(rejected_at_depth(6, knobs=knobs), cost=cost, for_server=True)
    assert adv.for_server and adv.best.draft_max == 6
    p = predict(adv, rejected_at_depth(6, knobs=knobs), cost=cost)
    assert p.tokens_per_second == pytest.approx(adv.best.tokens_per_second)
    own = advise(rejected_at_depth(6, knobs=knobs), cost=cost)
    assert predict(own, rejected_at_depth(6, knobs=knobs), cost=cost).tokens_per_second == pytest.approx(
        own.best.tokens_per_second
    )
