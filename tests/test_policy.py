"""Drafting policies (fixed, adaptive, cost) and verify-tile alignment."""

from __future__ import annotations

import pytest

from specviz import Session
from specviz.errors import KnobError
from specviz.policy import AdaptivePolicy, CostPolicy, VerifyCostModel

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
