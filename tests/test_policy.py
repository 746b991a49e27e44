"""Drafting policies (fixed, adaptive, cost) and verify-tile alignment."""

from __future__ import annotations

import pytest

from specviz import Session
from specviz.errors import KnobError
from specviz.policy import AdaptivePolicy, CostPolicy, VerifyCostModel, tile_aligned

from test_session import DRAFTLESS, eager, plain_reference


def test_adaptive_grows_by_two_after_full_acceptance_and_shrinks_by_one():
    p = AdaptivePolicy()
    assert p.length(0, 10)[0] == 10
    p.observe(10, 3, 0.0)
    assert p.length(0, 10)[0] == 9
    p.observe(9, 2, 0.0)
    p.observe(8, 8, 0.0)  # fully accepted: +2
    assert p.length(0, 10)[0] == 10  # 8 + 2, capped at draft_max
    for _ in range(20):
        p.observe(5, 0, 0.0)
    assert p.length(3, 10)[0] == 3  # floor at draft_min
    p.observe(0, 0, 0.0)  # no draft: no change
    assert p.length(3, 10)[0] == 3


def test_cost_policy_prefers_plain_decoding_when_nothing_is_accepted():
    cost = VerifyCostModel([1, 2, 4, 8, 16], [0.020, 0.024, 0.030, 0.055, 0.090])
    p = CostPolicy(cost)
    for _ in range(30):
        p.observe(4, 0, 0.0)
    k, expected = p.length(0, 16)
    assert k == 0 and expected == pytest.approx(1.0)
    # a one-token probe comes back after a few plain rounds so the estimate can recover
    ks = [p.length(0, 16)[0] for _ in range(CostPolicy.PROBE_EVERY)]
    assert ks.count(1) == 1 and ks.count(0) == CostPolicy.PROBE_EVERY - 1


def test_cost_policy_drafts_long_when_everything_is_accepted():
    cost = VerifyCostModel([1, 2, 4, 8, 16], [0.020, 0.024, 0.030, 0.055, 0.090])
    p = CostPolicy(cost)
    for _ in range(40):
        p.observe(16, 16, 0.0)
    k, expected = p.length(0, 16)
    assert k >= 8
    assert expected == pytest.approx(p.expected_tokens(k)) and expected > 5
    # the choice maximises expected tokens per second over every length
    rates = [p.expected_tokens(j) / cost(j + 1) for j in range(17)]
    assert rates[k] == pytest.approx(max(rates))


def test_cost_model_interpolates_and_extrapolates():
    c = VerifyCostModel([1, 2, 4], [1.0, 2.0, 4.0])
    assert c(3) == pytest.approx(3.0)
    assert c(6) == pytest.approx(6.0)


def test_cost_model_learns_from_real_verify_times():
    c = VerifyCostModel([1, 2, 4], [1.0, 2.0, 4.0])
    for _ in range(50):
        c.update(2, 3.0)
    assert c(2) == pytest.approx(3.0, rel=1e-3)
    c.update(3, 10.0)  # a size never measured is inserted
    assert c(3) == pytest.approx(10.0) and list(c.sizes) == [1, 2, 3, 4]


@pytest.mark.parametrize("policy", ["adaptive", "cost"])
@pytest.mark.parametrize("strategy", [s for s in DRAFTLESS if s != "none"])
def test_equivalence_under_every_policy(tiny_session, tiny_model, strategy, policy):
    prompt = tiny_model.tokenize("the a of the a of and the a the a")
    ref = plain_reference(tiny_model, prompt, 60)
    tiny_session.start(prompt, 60, strategy, draft_policy=policy, **eager(strategy))
    while tiny_session.finished is None:
        rnd = tiny_session.step()
        assert tiny_session.kv_length == tiny_session.committed
        d = rnd.of_kind("draft_proposed")
        if d and policy == "cost":
            assert d[0].policy == "cost" and d[0].expected_tokens is not None
    assert tiny_session.tokens == ref
    if policy == "cost":
        t = tiny_session.telemetry_dict()
        assert t["expected_tokens_per_round"] is not None and t["tokens_per_round"] > 0
        assert tiny_session.cost_model is not None


def test_alignment_caps_drafts_to_one_micro_batch(tiny_model):
    s = Session(tiny_model, n_ctx=256, n_batch=32, n_ubatch=8, n_threads=1)
    s.start("the a the a the a the a the a the a", 40, "prompt-lookup", max_ngram=2, draft_max=20)
    limits = [r.events[0] for r in s.run() if r.events and r.events[0].kind == "draft_proposed"]
    assert all(d.limit <= 7 for d in limits)
    assert any(d.cap == "ubatch" for d in limits)
    s.start("the a the a the a the a the a the a", 40, "prompt-lookup", max_ngram=2, draft_max=20, align=False)
    limits = [r.events[0] for r in s.run() if r.events and r.events[0].kind == "draft_proposed"]
    assert any(d.limit > 7 for d in limits)
    assert not any(d.cap == "ubatch" for d in limits)
    s.ctx.close()


def test_policy_knob_validation(tiny_session):
    tiny_session.start("the a", 5, "prompt-lookup")
    with pytest.raises(KnobError, match="draft_policy.*greedy.*fixed, adaptive, cost"):
        tiny_session.configure(draft_policy="greedy")
    with pytest.raises(KnobError, match="align"):
        tiny_session.configure(align="sometimes")
    assert tiny_session.configure(draft_policy="adaptive")["draft_policy"] == "adaptive"


def test_policy_state_survives_a_snapshot(tiny_session, tiny_model):
    s = tiny_session
    s.start("the a of the a of the a of", 50, "prompt-lookup", draft_policy="adaptive", **eager("prompt-lookup"))
    s.run(max_rounds=5)
    blob = s.snapshot()
    s.run()
    original = [e.limit for e in s.events if e.kind == "draft_proposed"]
    r = Session.restore(blob, model=tiny_model)
    r.run()
    restored = [e.limit for e in r.events if e.kind == "draft_proposed"]
    assert restored == original[len(original) - len(restored):]
    r.ctx.close()


def test_tile_aligned_rounds_long_verify_batches_down_to_the_tile():
    # k draft tokens make a verify batch of k + 1 rows
    assert [tile_aligned(k, 4) for k in range(1, 20)] == [1, 2, 3, 3, 3, 3, 7, 7, 7, 7, 11, 11, 11, 11, 15,
                                                          15, 15, 15, 19]
    assert tile_aligned(0, 4) == 0
    assert [tile_aligned(k, 1) for k in range(0, 20)] == list(range(0, 20))
    assert tile_aligned(16, 8) == 15 and tile_aligned(6, 8) == 6 and tile_aligned(23, 8) == 23


def test_verify_tile_shortens_the_round_limit_and_names_the_cap(tiny_model):
    s = Session(tiny_model, n_ctx=256, n_threads=1)
    prompt = "the a the a the a the a the a the a"
    s.start(prompt, 60, "prompt-lookup", max_ngram=2, draft_max=16)
    s.run()
    drafts = [e for e in s.events if e.kind == "draft_proposed"]
    assert drafts[0].limit == 15 and drafts[0].cap == "tile" and drafts[0].requested == 16
    # every limit, the budget-capped ones near the end included, leaves a tile-shaped verify batch
    assert all(tile_aligned(d.limit, 4) == d.limit for d in drafts), [d.limit for d in drafts]
    assert any(d.tokens for d in drafts)
    ref = s.tokens
    # off three ways: tile 1, alignment off, or a draft_min the rounding would fall below
    for knobs in ({"verify_tile": 1}, {"align": False}, {"draft_min": 16}):
        s.start(prompt, 60, "prompt-lookup", max_ngram=2, draft_max=16, **knobs)
        s.run()
        first = next(e for e in s.events if e.kind == "draft_proposed")
        assert first.limit == 16 and first.cap is None, knobs
        assert s.tokens == ref  # lossless either way
    s.start(prompt, 60, "prompt-lookup", max_ngram=2, draft_max=16, verify_tile=8)
    s.run()
    assert next(e for e in s.events if e.kind == "draft_proposed").limit == 15
    assert s.tokens == ref
    s.ctx.close()


def test_verify_tile_knob_bounds(tiny_session):
    tiny_session.start("the a", 5, "prompt-lookup")
    for bad in (0, 65, "four", 2.5):
        with pytest.raises(KnobError, match="verify_tile"):
            tiny_session.configure(verify_tile=bad)
    assert tiny_session.configure(verify_tile=1)["verify_tile"] == 1
    assert tiny_session.step() is not None  # still usable


def test_cost_policy_only_weighs_lengths_that_survive_the_tile():
    cost = VerifyCostModel([1, 2, 3, 4, 8, 12, 16], [0.020, 0.024, 0.027, 0.030, 0.055, 0.075, 0.090])
    p = CostPolicy(cost)
    for _ in range(40):
        p.observe(15, 15, 0.0)
    k, _ = p.length(0, 16, tile=4)
    assert k == 15
    for draft_max in range(1, 17):
        k, _ = p.length(0, draft_max, tile=4)
        assert tile_aligned(k, 4) == k and k <= draft_max


def test_cost_measurement_times_every_usable_batch_size():
    seen = []
    c = VerifyCostModel.measure(lambda b: seen.append(b), 17, repeats=2, tile=4)
    assert c.sizes.astype(int).tolist() == [1, 2, 3, 4, 8, 12, 16]
    assert sorted(set(seen)) == [1, 2, 3, 4, 8, 12, 16]
    c = VerifyCostModel.measure(lambda b: None, 40, repeats=1, tile=1)
    assert c.sizes.astype(int).tolist() == list(range(1, 33)) + [40]


def test_cost_policy_estimates_acceptance_by_run_position():
    cost = VerifyCostModel([1, 2, 3, 4, 8, 12, 16], [0.020, 0.024, 0.027, 0.030, 0.055, 0.075, 0.090])
    p = CostPolicy(cost)
    assert [CostPolicy.bucket(r) for r in (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 500)] == [0, 1, 2, 2, 3, 3, 4, 4,
                                                                                      5, 5, 6, 6]
    for _ in range(8):  # acceptance comes in runs: a few long copies, each followed by rejections
        p.observe(15, 15, 0.0)
        p.observe(15, 15, 0.0)
        p.observe(15, 3, 0.0)
        for _ in range(4):
            p.observe(3, 0, 0.0)
    assert p.run == 0
    after_rejection = p.length(0, 16, tile=4)[0]
    assert p.acceptance(0) < 0.3 and after_rejection <= 3
    p.observe(1, 1, 0.0)  # a one-token probe passes: the run has begun
    assert p.run == 1
    p.observe(3, 3, 0.0)
    assert p.run == 4
    assert p.acceptance(0) > 0.9 and p.length(0, 16, tile=4)[0] == 15
    # the run position is counted across rounds: a draft's depth i sits at run position run + i
    assert p.acceptance(4, run=0) == p.acceptance(0, run=4) == p.bucket_estimates()[3]
    # the estimates and the run travel with the state (snapshots)
    q = CostPolicy(cost)
    q.load(p.state())
    assert q.length(0, 16, tile=4) == p.length(0, 16, tile=4) and q.run == p.run
    # a snapshot of an older policy's state starts the estimates afresh rather than failing
    old = CostPolicy(cost)
    old.load({"tries": [[1.0, 2.0], [3.0]], "hits": [[1.0], []], "regime": 1, "draft_calls": 3})
    assert old.tries == [0.0] * CostPolicy.BUCKETS and old.draft_calls == 3


def test_cost_policy_untried_run_positions_borrow_from_the_bucket_below():
    cost = VerifyCostModel([1, 2, 4, 8, 16], [0.020, 0.024, 0.030, 0.055, 0.090])
    p = CostPolicy(cost)
    for _ in range(10):
        p.observe(2, 2, 0.0)
        p.observe_idle()  # the run is broken without evidence
    est = p.bucket_estimates()
    assert est[1] > 0.8 and est[2:] == [est[1]] * (CostPolicy.BUCKETS - 2)
    assert p.length(0, 16)[0] > 2  # so it explores longer drafts


def test_cost_policy_learns_from_the_drafters_prediction_in_plain_rounds():
    cost = VerifyCostModel([1, 2, 4, 8, 16], [0.020, 0.024, 0.030, 0.055, 0.090])
    p = CostPolicy(cost)
    for _ in range(30):
        p.observe(4, 0, 0.0)
    assert p.length(0, 16)[0] == 0
    # predictions keep coming and keep failing: no probe is needed, the estimate stays low
    for _ in range(3 * CostPolicy.PROBE_EVERY):
        assert p.length(0, 16)[0] == 0
        p.observe_shadow(False)
    assert p.shadow_tries == 3 * CostPolicy.PROBE_EVERY and p.shadow_hits == 0
    # the model starts to copy: predictions pass, the run grows, and drafting resumes
    ks = []
    for _ in range(6):
        ks.append(p.length(0, 16)[0])
        p.observe_shadow(True)
    assert p.run == 6 and p.shadow_hits == 6
    assert ks[0] == 0 and p.length(0, 16)[0] > 0


def test_rounds_the_cost_policy_keeps_plain_still_teach_it(tiny_session, tiny_model):
    s = tiny_session
    prompt = "the a of the a of the a of"
    ref = plain_reference(tiny_model, tiny_model.tokenize(prompt, add_special=True), 40)
    # a verify cost curve so steep that drafting never pays: every round is plain (but for probes)
    s.cost_model = VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0])
    s.start(prompt, 40, "prompt-lookup", draft_policy="cost", max_ngram=2, min_ngram=1, draft_max=8)
    s.run()
    assert s.tokens == ref
    plain = [e for e in s.events if e.kind == "draft_proposed" and e.limit == 0]
    assert plain and all(e.cap == "policy" and not e.tokens for e in plain)
    # each plain round asked the drafter what it would have proposed and compared it with the target:
    # work out the same independently, with a fresh drafter at each plain round's position
    from specviz.strategies import strategy_class

    history = list(s.history)
    tries = hits = 0
    for e in plain:
        d = strategy_class("prompt-lookup")(max_ngram=2, min_ngram=1)
        d.begin(history[:e.position])
        proposal = d.draft(history[:e.position], 1).tokens
        if proposal and e.position < len(history):
            tries += 1
            hits += proposal[0] == history[e.position]
    assert tries > 0 and hits > 0
    assert (s.policy.shadow_tries, s.policy.shadow_hits) == (tries, hits)


def test_a_strategy_without_peek_breaks_the_run_in_plain_rounds(tiny_session):
    s = tiny_session
    s.cost_model = VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0])
    s.start("the a of the a of the a of", 20, "ngram-mod", draft_policy="cost", n_match=2, n_min=1, draft_max=8)
    s.policy.run = 5
    s.step()
    assert s.policy.shadow_tries == 0 and s.policy.run == 0


def test_telemetry_says_what_the_policy_works_from(tiny_session):
    import json

    s = tiny_session
    s.start("the a of the a of the a of", 30, "prompt-lookup", draft_policy="cost", max_ngram=2, draft_max=8)
    s.run()
    d = json.loads(json.dumps(s.telemetry_dict()))["policy"]
    assert d["name"] == "cost" and d["run"] == s.policy.run
    assert list(d["acceptance_by_run_position"]) == ["0", "1", "2-3", "4-7", "8-15", "16-31", "32+"]
    assert list(d["acceptance_by_run_position"].values()) == pytest.approx(s.policy.bucket_estimates())
    assert sum(d["tries_by_run_position"].values()) > 0
    assert d["verify_cost"]["sizes"][0] == 1 and (d["shadow_tries"], d["shadow_hits"]) == (
        s.policy.shadow_tries, s.policy.shadow_hits)
    s.start("the a", 4, "prompt-lookup", draft_policy="adaptive", draft_max=6)
    s.run()
    assert s.telemetry_dict()["policy"]["name"] == "adaptive"
    s.start("the a", 4, "none")
    s.step()
    assert s.telemetry_dict()["policy"] == {"name": "fixed"}


def test_cost_policy_counts_only_the_depths_a_draft_really_tested():
    """Depths after the first rejection were never verified: they are neither tries nor failures."""
    p = CostPolicy(VerifyCostModel([1, 2, 4], [0.02, 0.024, 0.03]))
    p.observe(8, 2, 0.0)  # run positions 0 and 1 accepted, 2 rejected, 3..7 untested
    assert p.tries == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert p.hits == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert p.run == 0
    p.observe(3, 3, 0.0)  # a full acceptance extends the run across rounds
    assert p.run == 3
    p.observe(2, 1, 0.0)  # positions 3 (accepted) and 4 (rejected), decayed counts before
    assert p.tries[2] == pytest.approx(1.0 * 0.98 * 0.98 + 1.0 * 0.98 + 1.0)
    assert p.hits[3] == pytest.approx(0.0) and p.tries[3] == pytest.approx(1.0)
    assert p.hits[2] == pytest.approx(1.0 * 0.98 + 1.0)
