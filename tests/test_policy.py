"""Drafting policies (fixed, adaptive, cost) and verify-tile alignment."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_session import DRAFTLESS, eager, plain_reference

from specviz import Session
from specviz.decoding import policy as policy_module
from specviz.decoding import verify_cost as verify_cost_module
from specviz.decoding.cost_policy import CostPolicy
from specviz.decoding.policy import AdaptivePolicy
from specviz.decoding.tiling import tile_aligned
from specviz.decoding.verify_cost import VerifyCostModel, measure_verify_cost
from specviz.errors import KnobError


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


def test_the_cost_curve_is_the_cost_of_every_batch_size():
    c = VerifyCostModel([1, 2, 5, 12], [0.011, 0.019, 0.030, 0.071])
    for n in (1, 3, 12, 13, 40):
        assert c.curve(n) == [c(b) for b in range(1, n + 1)]  # the same numbers, not merely close
    assert c.curve(14)[-2:] == pytest.approx([0.071 + 0.041 / 7, 0.071 + 2 * 0.041 / 7])  # the last slope, extended
    c.update(7, 0.05)
    assert c.curve(8)[6] == 0.05


@pytest.mark.slow
def test_the_cost_table_after_updates_is_the_table_of_its_points():
    """What update() keeps up to date in place (the blended size's stretch of the table, up to the measured
    sizes on either side) equals the table a fresh model of the same points builds, and both equal numpy's
    interpolation: sizes with gaps, updates at measured sizes, at new ones between and beyond them."""
    import numpy as np

    rng = np.random.default_rng(3)
    for _ in range(200):
        sizes = sorted({1, *rng.choice(np.arange(2, 40), size=int(rng.integers(1, 8)), replace=False).tolist()})
        c = VerifyCostModel(sizes, rng.uniform(1e-3, 5e-3, len(sizes)).tolist())
        for _ in range(12):
            known = [int(b) for b in c.sizes]
            b = int(rng.choice(known)) if rng.random() < 0.7 else int(rng.integers(1, 48))
            c.update(b, float(rng.uniform(1e-3, 6e-3)))
            n = int(c.sizes[-1]) + 5
            fresh = VerifyCostModel(c.sizes.tolist(), c.seconds.tolist())
            assert c.curve(n) == fresh.curve(n)
            last = int(c.sizes[-1])
            want = np.interp(np.arange(1, last + 1), c.sizes, c.seconds)
            assert c.curve(last) == pytest.approx(want.tolist(), rel=1e-12, abs=0)


def _brute_force_length(p: CostPolicy, draft_min: int, draft_max: int, tile: int) -> int:
    """The class docstring's choice written out with no shortcut: every length the tile keeps, its expected
    tokens over its expected seconds, against plain decoding's rate times the margin."""
    assert p.cost is not None
    plain = 1.0 / (p.cost(1) + p.plain_upkeep_seconds)
    rate_p = max(p.proposal_rate, p.MIN_PROPOSAL)
    declined = (1.0 - rate_p) / rate_p * p.decline_seconds
    best_k, best = 0, plain * p.MARGIN
    for k in range(max(draft_min, 1), draft_max + 1):
        if tile_aligned(k, tile) != k:
            continue
        e = p.expected_tokens(k)
        rate = e / (p.cost(k + 1) + p.draft_tok_seconds * k + p.upkeep_tok_seconds * e + declined)
        if rate > best:
            best_k, best = k, rate
    return best_k


@pytest.mark.slow
def test_the_cost_policys_choice_is_the_brute_force_choice():
    """length() skips the lengths when none can beat plain decoding and keeps the tile's lengths between
    rounds: on random states (acceptance from hopeless to sure, flat GPU-like and steep CPU-like verify
    costs, noisy ones that are not increasing, tiles, minimum lengths) it picks what trying every length
    picks."""
    import numpy as np

    rng = np.random.default_rng(11)
    chose_plain = chose_draft = 0
    for _ in range(3000):
        n = int(rng.integers(2, 26))
        base = float(rng.uniform(1e-3, 2e-2))
        slope = base * float(rng.choice([0.0, 0.01, 0.1, 1.0]))
        secs = [base + slope * b + float(rng.normal(0, base * 0.03)) for b in range(1, n + 1)]
        p = CostPolicy(VerifyCostModel(list(range(1, n + 1)), [max(t, 1e-5) for t in secs]))
        # one acceptance for every run position, or each bucket its own (a first token seldom right, the
        # ones after a run nearly always: only the long drafts pay)
        levels = [0.0, 0.02, 0.05, 0.3, 0.7, 0.95, 1.0]
        accept = [float(rng.choice(levels))] * p.BUCKETS if rng.random() < 0.5 else rng.choice(levels, p.BUCKETS)
        p.tries = [float(rng.integers(0, 30)) for _ in range(p.BUCKETS)]
        p.hits = [t * min(1.0, max(0.0, float(a) + float(rng.normal(0, 0.05)))) for t, a in zip(p.tries, accept)]
        p.run = int(rng.integers(0, 40))
        p.draft_tok_seconds = float(rng.choice([0.0, base * 0.01, base * 0.2]))
        p.upkeep_tok_seconds = float(rng.choice([0.0, base * 0.05]))
        p.proposal_rate = float(rng.choice([1.0, 0.5, 0.1]))
        p.decline_seconds = float(rng.choice([0.0, base * 0.02]))
        p.probe_every = p.PROBE_MAX  # no probe: the choice alone is compared
        tile = int(rng.choice([1, 2, 4]))
        for draft_min, draft_max in ((0, n - 1), (int(rng.integers(0, 4)), int(rng.integers(0, n)))):
            p.rounds_since_evidence = 0
            want = _brute_force_length(p, draft_min, draft_max, tile)
            got, expected = p.length(draft_min, draft_max, tile)
            assert got == want, (draft_min, draft_max, tile)
            assert expected == pytest.approx(p.expected_tokens(got))
            chose_plain += want == 0
            chose_draft += want > 0
    assert chose_plain > 500 and chose_draft > 500  # both sides of the shortcut were exercised


def test_a_cost_policy_that_keeps_its_curve_between_rounds_chooses_as_a_fresh_copy_of_its_state():
    """length() keeps the expected-token curve while the run and the counts stand: through random rounds
    (verified drafts, shadow hits and misses, idle rounds, a state loaded over it, its counts set by hand) a
    policy that kept it chooses and expects what a fresh policy with the same state does."""
    import numpy as np

    rng = np.random.default_rng(5)
    cost = VerifyCostModel(list(range(1, 18)), [0.01 + 0.0004 * b for b in range(1, 18)])
    kept = CostPolicy(cost)
    for i in range(600):
        what = rng.choice(["draft", "hit", "miss", "idle", "load", "set"], p=[0.3, 0.2, 0.2, 0.2, 0.05, 0.05])
        if what == "draft":
            n = int(rng.integers(1, 17))
            kept.observe(n, int(rng.integers(0, n + 1)), 1e-4)
        elif what in ("hit", "miss"):
            kept.observe_shadow(what == "hit")
        elif what == "idle":
            kept.observe_idle()
        elif what == "load":
            other = CostPolicy(cost)
            other.observe(4, int(rng.integers(0, 5)), 1e-4)
            kept.load(other.state())
        else:
            kept.tries = [float(rng.integers(0, 9)) for _ in range(kept.BUCKETS)]
            kept.hits = [float(rng.integers(0, int(t) + 1)) for t in kept.tries]
        fresh = CostPolicy(cost)
        fresh.load(kept.state())
        draft_max = int(rng.choice([4, 8, 16]))
        assert kept.expected_tokens(draft_max) == fresh.expected_tokens(draft_max), i
        assert kept.length(0, draft_max)[0] == fresh.length(0, draft_max)[0], (i, what)
        kept.rounds_since_evidence = fresh.rounds_since_evidence = 0


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
    assert restored == original[len(original) - len(restored) :]
    r.ctx.close()


def test_tile_aligned_rounds_long_verify_batches_down_to_the_tile():
    # k draft tokens make a verify batch of k + 1 rows
    assert [tile_aligned(k, 4) for k in range(1, 20)] == [
        1,
        2,
        3,
        3,
        3,
        3,
        7,
        7,
        7,
        7,
        11,
        11,
        11,
        11,
        15,
        15,
        15,
        15,
        19,
    ]
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
    assert [CostPolicy.bucket(r) for r in (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 500)] == [
        0,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
        5,
        5,
        6,
        6,
    ]
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
        d.begin(history[: e.position])
        proposal = d.draft(history[: e.position], 1).tokens
        if proposal and e.position < len(history):
            tries += 1
            hits += proposal[0] == history[e.position]
    assert tries > 0 and hits > 0
    assert (s.generation.policy.shadow_tries, s.generation.policy.shadow_hits) == (tries, hits)


@pytest.mark.parametrize(
    ("strategy", "knobs"),
    [
        ("ngram-map-k", {"size_n": 2, "size_m": 4}),
        ("ngram-map-k4v", {"size_n": 2, "size_m": 4}),
        ("ngram-mod", {"n_match": 2, "n_min": 1, "n_max": 8}),
        ("ngram-cache", {}),
    ],
)
def test_the_stateful_ngram_drafters_teach_plain_rounds_too(tiny_session, tiny_model, strategy, knobs):
    """Their peeks (tested against a copy's draft in test_strategies_draftless) reach the policy: plain
    rounds are tried and hit, and the output is plain greedy's."""
    s = tiny_session
    prompt = "the a of the a of the a of the a of"
    ref = plain_reference(tiny_model, tiny_model.tokenize(prompt, add_special=True), 40)
    s.cost_model = VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0])  # drafting never pays: plain rounds
    s.start(prompt, 40, strategy, draft_policy="cost", draft_max=8, **knobs)
    s.run()
    assert s.tokens == ref
    assert s.generation.policy.shadow_tries > 0 and s.generation.policy.shadow_hits > 0


def test_a_strategy_without_peek_breaks_the_run_in_plain_rounds(tiny_session):
    s = tiny_session
    s.cost_model = VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0])
    s.start("the a of the a of the a of", 20, "ngram-cache", draft_policy="cost", draft_max=8)
    s.drafter.can_peek = False  # every draftless strategy can peek; the model-backed ones cannot
    s.generation.policy.run = 5
    s.step()
    assert s.generation.policy.shadow_tries == 0 and s.generation.policy.run == 0


def test_telemetry_says_what_the_policy_works_from(tiny_session):
    import json

    s = tiny_session
    s.start("the a of the a of the a of", 30, "prompt-lookup", draft_policy="cost", max_ngram=2, draft_max=8)
    s.run()
    d = json.loads(json.dumps(s.telemetry_dict()))["policy"]
    assert d["name"] == "cost" and d["run"] == s.generation.policy.run
    assert list(d["acceptance_by_run_position"]) == ["0", "1", "2-3", "4-7", "8-15", "16-31", "32+"]
    assert list(d["acceptance_by_run_position"].values()) == pytest.approx(s.generation.policy.bucket_estimates())
    assert sum(d["tries_by_run_position"].values()) > 0
    assert d["verify_cost"]["sizes"][0] == 1 and (d["shadow_tries"], d["shadow_hits"]) == (
        s.generation.policy.shadow_tries,
        s.generation.policy.shadow_hits,
    )
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


# ------------------------------------------------------------------------------------------------------
# hand-worked figures for each rule (the mutation run found these unpinned)
# ------------------------------------------------------------------------------------------------------


def test_adaptive_steps_floor_and_state():
    p = AdaptivePolicy()
    assert p.length(0, 10) == (10, None)
    for _ in range(5):
        p.observe(10, 3, 0.0)  # -1 each
    assert p.length(0, 10)[0] == 5
    p.observe(5, 5, 0.0)  # +2
    assert p.length(0, 10)[0] == 7
    for _ in range(10):
        p.observe(7, 0, 0.0)
    assert p.length(0, 10)[0] == 1  # never below one token, even with draft_min 0
    assert p.state() == {"current": 1}
    assert p.describe() == {"name": "adaptive", "current": 1}
    q = AdaptivePolicy()
    q.load({"current": 4})
    assert q.length(0, 10)[0] == 4
    q.load({})  # nothing saved yet: start at draft_max
    assert q.length(0, 10)[0] == 10


def test_cost_model_interpolates_between_and_extends_the_last_segment_beyond_measured_sizes():
    c = VerifyCostModel([1, 2, 4, 8], [1.0, 1.5, 2.0, 6.0])
    assert c(3) == 1.75  # halfway between sizes 2 (1.5 s) and 4 (2.0 s)
    assert c(6) == 4.0  # halfway between 4 (2.0 s) and 8 (6.0 s)
    assert c(8) == 6.0
    assert c(10) == 8.0  # beyond 8: the last segment's slope, (6 - 2) / (8 - 4) = 1 s per token
    adjacent = VerifyCostModel([1, 2, 3], [1.0, 2.0, 4.0])
    assert adjacent(5) == 8.0  # last segment 2 s per token: 4 + 2 * 2


def test_cost_model_update_blends_in_a_fifth_of_a_new_time_and_inserts_new_sizes():
    c = VerifyCostModel([1, 2, 4], [1, 2, 4])  # integer seconds are fine
    c.update(2, 3.0)
    assert c(2) == pytest.approx(2.2)  # 2 + 0.2 * (3 - 2)
    c.update(8, 9.0)  # beyond the last size: appended
    assert c(8) == 9.0 and c(6) == pytest.approx(6.5)
    d = c.to_dict()
    assert set(d) == {"sizes", "seconds"}
    assert json.dumps(d["sizes"]) == "[1, 2, 4, 8]"  # whole numbers in telemetry and snapshots
    assert d["seconds"] == pytest.approx([1.0, 2.2, 4.0, 9.0])


def test_cost_measurement_warms_up_then_keeps_the_fastest_of_interleaved_timings(monkeypatch):
    clock = [100.0]
    # seconds each call takes: the warm-up, then two interleaved passes over sizes 1, 2, 3
    takes = iter([8.0, 0.5, 0.75, 1.5, 0.25, 1.0, 1.25])
    calls = []

    def evaluate(b):
        calls.append(b)
        clock[0] += next(takes)

    monkeypatch.setattr(verify_cost_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    c = VerifyCostModel.measure(evaluate, 3)
    assert calls == [1, 1, 2, 3, 1, 2, 3]  # by default: no tile, two repeats
    assert c.to_dict() == {"sizes": [1, 2, 3], "seconds": [0.25, 0.75, 1.25]}


def test_cost_measurement_spreads_sizes_geometrically_beyond_32():
    c = VerifyCostModel.measure(lambda b: None, 1100, repeats=1)
    assert c.to_dict()["sizes"] == list(range(1, 33)) + [48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1100]


class FakeMemory:
    """An attention context's memory: no checkpoint is ever needed, a cut is a truncation."""

    def __init__(self, ctx):
        self.ctx = ctx

    def checkpoint_for(self, n_draft):
        return None

    def cut(self, n, tokens):
        self.ctx.truncate(n)


class FakeContext:
    """Records the batches ``measure_verify_cost`` evaluates (no model)."""

    def __init__(self, n_ctx, n_batch, n_ubatch):
        self.capacity = SimpleNamespace(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch)
        self.batches = []
        self.truncated = []
        self.memory = FakeMemory(self)

    def eval(self, tokens, start, rows="all"):
        self.batches.append((list(tokens), start, rows))

    def truncate(self, n):
        self.truncated.append(n)


def test_verify_cost_is_measured_for_the_batch_sizes_a_round_can_use():
    history = [5, 6, 7, 8]  # three positions cached, 8 pending

    def sizes(knobs, n_ctx=64, n_batch=32, n_ubatch=8):
        ctx = FakeContext(n_ctx, n_batch, n_ubatch)
        c = measure_verify_cost(ctx, history, knobs)
        # each batch repeats the pending token after the cached positions, and is removed again
        assert all(toks == [8] * len(toks) and start == 3 and rows == "all" for toks, start, rows in ctx.batches)
        assert ctx.truncated == [3] * len(ctx.batches)
        return c.to_dict()["sizes"]

    # draft_max tokens are verified with the pending one: batches up to draft_max + 1
    assert sizes({"draft_max": 5, "align": True, "verify_tile": 1}) == [1, 2, 3, 4, 5, 6]
    # with alignment a verify fits one micro-batch (n_ubatch = 8), without it one batch (n_batch = 32)
    assert sizes({"draft_max": 20, "align": True, "verify_tile": 1}) == list(range(1, 9))
    assert sizes({"draft_max": 20, "align": False}) == list(range(1, 22))
    # and the free context: n_ctx 10 minus 3 cached positions
    assert sizes({"draft_max": 20, "align": False}, n_ctx=10) == list(range(1, 8))
    # the knobs' defaults when they are not given: draft_max 16, alignment on
    assert sizes({}) == list(range(1, 9))
    assert sizes({"align": False}) == list(range(1, 18))
    # with a verify tile, only the sizes a tile-aligned round can use
    assert sizes({"draft_max": 16, "align": True, "verify_tile": 4}, n_ubatch=32) == [1, 2, 3, 4, 8, 12, 16]
    # always two sizes at least, so the curve has a slope to extend
    assert sizes({"draft_max": 16, "align": True, "verify_tile": 1}, n_ubatch=1) == [1, 2]


def test_cost_policy_fresh_estimates_and_expected_tokens():
    p = CostPolicy()
    assert p.bucket_estimates() == [0.5] * CostPolicy.BUCKETS  # the Beta(1, 1) prior everywhere
    assert p.expected_tokens(0) == 1.0
    assert p.expected_tokens(3) == 1.875  # 1 + 1/2 + 1/4 + 1/8
    p.observe(2, 1, 0.0)  # run position 0 accepted, 1 rejected: tries [1, 1, 0 ...], hits [1, 0, 0 ...]
    # pooled (1 + 1) / (2 + 2) = 1/2; bucket 0 (1 + 2 * 1/2) / (1 + 2) = 2/3; bucket 1 (0 + 2 * 2/3) / 3 = 4/9;
    # the untried buckets borrow 4/9 from bucket 1
    assert p.bucket_estimates() == pytest.approx([2 / 3, 4 / 9, 4 / 9, 4 / 9, 4 / 9, 4 / 9, 4 / 9])
    # a draft's depth d after a run of r sits at run position r + d
    assert p.acceptance(1, run=1) == pytest.approx(4 / 9)  # position 2
    assert p.acceptance(0, run=0) == pytest.approx(2 / 3)
    assert p.expected_tokens(2) == pytest.approx(1 + 2 / 3 + 2 / 3 * 4 / 9)


def test_cost_policy_length_maximises_expected_tokens_per_second_on_hand_made_numbers():
    # fresh: acceptance 1/2 everywhere, so k draft tokens are expected to commit 1, 1.5, 1.75, 1.875, 1.9375
    # tokens; a verify of 1..5 tokens costs 1.0, 1.4, 2.0, 3.0, 4.0 s
    p = CostPolicy(VerifyCostModel([1, 2, 3, 4, 5], [1.0, 1.4, 2.0, 3.0, 4.0]))
    # tokens per second: k=0 1.0, k=1 1.5/1.4 = 1.07, k=2 0.875, k=3 0.625, k=4 0.48
    assert p.length(0, 4) == (1, 1.5)
    # with draft_min 3 the choice is 0 or 3..4, and neither 3 nor 4 beats plain decoding
    assert p.length(3, 4) == (0, 1.0)
    # a tie with plain decoding keeps the round plain: 1.5 tokens in 1.5 s is no better than 1 in 1 s
    tie = CostPolicy(VerifyCostModel([1, 2], [1.0, 1.5]))
    assert tie.length(0, 1) == (0, 1.0)


def test_cost_policy_charges_the_drafters_seconds_per_token():
    p = CostPolicy(VerifyCostModel([1, 8], [1.0, 1.0]))  # a flat verify cost
    assert p.length(0, 3) == (3, 1.875)  # nothing known about drafting time yet: the longest draft
    p.load({"draft_tok_seconds": 0.25})
    # tokens per second: k=0 1/1, k=1 1.5/1.25 = 1.2, k=2 1.75/1.5 = 1.17, k=3 1.875/1.75 = 1.07
    assert p.length(0, 3) == (1, 1.5)


def test_cost_policy_draft_seconds_per_token_is_a_running_mean_then_weighs_a_twentieth():
    p = CostPolicy()
    p.observe(4, 0, 1.0)  # 0.25 s per token
    assert p.draft_tok_seconds == 0.25
    p.observe(2, 2, 1.5)  # 0.75 s per token: the mean of two calls is 0.5
    assert p.draft_tok_seconds == 0.5
    for _ in range(18):
        p.observe(1, 1, 0.5)  # twenty calls in all, mean 0.5
    assert p.draft_tok_seconds == pytest.approx(0.5) and p.draft_calls == 20
    p.observe(1, 0, 2.5)  # from the 21st call on a new figure weighs 1/20: 0.5 + (2.5 - 0.5) / 20
    assert p.draft_tok_seconds == pytest.approx(0.6) and p.draft_calls == 21
    p.observe(0, 0, 0.3)  # a round without a draft is not a draft call
    assert p.draft_calls == 21


def test_cost_policy_probes_with_one_draft_after_eight_plain_rounds_and_backs_off_while_probes_fail():
    p = CostPolicy(VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0]))  # drafting never pays
    assert [p.length(0, 4)[0] for _ in range(16)] == ([0] * 7 + [1]) * 2  # no verdict came back: every 8
    p.observe(1, 0, 0.0)  # the probe was rejected: the next one after 16 plain rounds
    assert p.probe_every == 16
    assert [p.length(0, 4)[0] for _ in range(16)] == [0] * 15 + [1]
    p.observe(1, 0, 0.0)  # rejected again: capped at PROBE_MAX (a longer wait misses a copyable span too long)
    assert p.probe_every == CostPolicy.PROBE_MAX == 16
    assert [p.length(3, 4)[0] for _ in range(16)] == [0] * 15 + [3]  # a probe is draft_min tokens long
    p.observe(1, 1, 0.0)  # an accepted probe: back to every 8
    assert p.probe_every == CostPolicy.PROBE_EVERY
    assert [p.length(0, 4)[0] for _ in range(8)] == [0] * 7 + [1]
    # a rejected draft the policy chose (not a probe) leaves the interval alone; shadow evidence too
    q = CostPolicy(VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0]))
    q.observe(4, 0, 0.0)
    q.observe_shadow(False)
    assert q.probe_every == CostPolicy.PROBE_EVERY


def test_cost_policy_refines_its_cost_curve_with_real_verify_times():
    p = CostPolicy(VerifyCostModel([1, 2, 4], [1.0, 2.0, 4.0]))
    p.observe_verify(2, 3.0)
    assert p.cost is not None and p.cost(2) == pytest.approx(2.2)
    CostPolicy().observe_verify(2, 3.0)  # nothing measured yet: nothing to refine


def test_cost_policy_state_and_description_carry_every_counter():
    p = CostPolicy(VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0]))
    p.observe(2, 1, 0.5)  # tries [1, 1, 0 ...], hits [1, 0 ...], 0.25 s per token, one draft call
    p.observe_shadow(True)  # decayed by 0.98, then run position 0 tried and hit; the run is 1
    assert p.length(0, 4)[0] == 0  # one plain round without evidence
    p.observe_upkeep(0.002, 1)  # what the drafter spent in that plain round
    # asked for a promise: the plain rounds before the probe that is due 64 rounds after the evidence (the
    # floor below), this round being the first
    assert p.promise_plain() == 62
    s = p.state()
    assert s["tries"] == pytest.approx([1.98, 0.98, 0, 0, 0, 0, 0])
    assert s["hits"] == pytest.approx([1.98, 0, 0, 0, 0, 0, 0])
    assert {k: v for k, v in s.items() if k not in ("tries", "hits")} == {
        "run": 1,
        "draft_tok_seconds": 0.25,
        "draft_calls": 1,
        "shadow_tries": 1,
        "shadow_hits": 1,
        "rounds_since_evidence": 1,
        "probe_every": 8,
        "probing": False,
        "upkeep_tok_seconds": 0.0,
        "upkeep_calls": 0,
        "plain_upkeep_seconds": 0.002,
        "plain_upkeep_calls": 1,
        "last_length": 0,
        "asked": 1,
        "proposal_rate": 1.0,
        "declines": 0,
        "decline_seconds": 0.0,
        "resumes": 0,
        "resume_seconds": 0.0,
        "quiet": 62,
    }
    d = p.describe()
    assert d == {
        "name": "cost",
        "run": 1,
        "acceptance_by_run_position": dict(zip(CostPolicy.BUCKET_LABELS, p.bucket_estimates())),
        "tries_by_run_position": dict(zip(CostPolicy.BUCKET_LABELS, p.tries)),
        "shadow_tries": 1,
        "shadow_hits": 1,
        "probe_every": 8,
        "draft_seconds_per_token": 0.25,
        "upkeep_seconds_per_token": 0.0,
        "plain_round_upkeep_seconds": 0.002,
        "proposal_rate": 1.0,
        "declined_round_seconds": 0.0,
        "resume_seconds": 0.0,
        "promised_plain_rounds": 62,
        "probe_floor": 64,  # a draft step of 0.25 s against plain rounds of 1 ms
        "verify_cost": {"sizes": [1, 2, 16], "seconds": [0.001, 1.0, 10.0]},
    }
    assert CostPolicy().describe()["verify_cost"] is None
    # the state brings every counter back
    q = CostPolicy(VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0]))
    q.load(json.loads(json.dumps(s)))
    assert q.state() == s and q.describe() == d
    # (a restore loads into a fresh policy) counters missing from a state start at zero ...
    q = CostPolicy()
    q.load({})
    assert q.state() == CostPolicy().state()
    q = CostPolicy()
    q.load({"tries": [0.5] * 7, "hits": [0.5] * 7})
    assert q.run == 0 and q.tries == [0.5] * 7
    # ... and estimates of another bucket layout are not taken (a fresh start), nor the run with them
    q = CostPolicy()
    q.load({"tries": [1.0, 2.0, 3.0], "hits": [1.0, 1.0, 1.0], "run": 4})
    assert q.tries == [0.0] * CostPolicy.BUCKETS and q.run == 0


def test_cost_policy_drafts_only_when_it_beats_plain_decoding_by_the_margin():
    # fresh: one draft token is expected to commit 1.5 tokens; plain decoding commits 1 token in 1.0 s
    assert CostPolicy.MARGIN == 1.05
    barely = CostPolicy(VerifyCostModel([1, 2], [1.0, 1.45]))  # 1.5 / 1.45 s = 1.034 tokens/s: 3% better
    assert barely.length(0, 1) == (0, 1.0)
    clearly = CostPolicy(VerifyCostModel([1, 2], [1.0, 1.40]))  # 1.5 / 1.40 s = 1.071 tokens/s: 7% better
    assert clearly.length(0, 1) == (1, 1.5)
    # among drafts the best rate wins, as before: k=2 (1.75 / 1.5 s = 1.17) over k=1 (1.5 / 1.4 s = 1.07)
    longer = CostPolicy(VerifyCostModel([1, 2, 3], [1.0, 1.4, 1.5]))
    assert longer.length(0, 2) == (2, 1.75)


@pytest.mark.parametrize("name", policy_module.POLICIES)
def test_every_named_policy_is_a_drafting_policy_and_its_state_round_trips(name):
    p = policy_module.make_policy(name, VerifyCostModel([1, 2, 16], [0.001, 0.0015, 0.01]))
    assert isinstance(p, policy_module.DraftingPolicy) and p.name == name
    p.length(0, 8)
    p.observe(4, 2, 0.001)
    p.observe_shadow(True)
    p.observe_idle()
    again = policy_module.make_policy(name)
    again.load(json.loads(json.dumps(p.state())))
    assert again.state() == p.state() and again.describe()["name"] == name


def _even_odds_policy() -> CostPolicy:
    """Every run position estimated at exactly 0.5 (half of every bucket's tries hit; the pooled
    Beta(1, 1) prior is 0.5 too), a verify of 1, 2, 3 rows costing 10, 11, 12 ms, 0.5 ms per draft step."""
    p = CostPolicy(VerifyCostModel([1, 2, 3], [0.010, 0.011, 0.012]))
    p.tries, p.hits = [10.0] * 7, [5.0] * 7
    p.draft_tok_seconds = 0.0005
    return p


def test_the_drafters_upkeep_flips_the_cost_policy_to_plain_rounds():
    p = _even_odds_policy()
    assert p.bucket_estimates() == pytest.approx([0.5] * 7)
    # expected tokens 1.5 (k=1) and 1.75 (k=2). Without upkeep: plain 100 t/s x 1.05 = 105 to beat;
    # k=1: 1.5 / (11 + 0.5) ms = 130.4 t/s, k=2: 1.75 / (12 + 1) ms = 134.6 t/s -> k=2
    assert p.length(0, 2) == (2, pytest.approx(1.75))
    # the drafter fed 2 committed tokens in 6 ms in that round: 3 ms a token, over the expected tokens
    p.observe_upkeep(0.006, 2)
    assert p.upkeep_tok_seconds == pytest.approx(0.003)
    # k=1: 1.5 / (11.5 + 4.5) ms = 93.75 t/s, k=2: 1.75 / (13 + 5.25) ms = 95.9 t/s: both below 105 -> plain
    assert p.length(0, 2) == (0, pytest.approx(1.0))
    # a plain round that still cost the drafter 3 ms (it does not pause): plain is 1 / 13 ms = 76.9 t/s,
    # x 1.05 = 80.8 to beat, and k=2 (95.9 t/s) drafts again
    p.observe_upkeep(0.003, 1)
    assert p.plain_upkeep_seconds == pytest.approx(0.003) and p.upkeep_tok_seconds == pytest.approx(0.003)
    assert p.length(0, 2) == (2, pytest.approx(1.75))


def test_the_cost_policy_attributes_upkeep_by_the_length_it_chose():
    p = _even_odds_policy()
    p.observe_upkeep(1.0, 1)  # before any length(): nothing to attribute it to
    assert (p.upkeep_calls, p.plain_upkeep_calls) == (0, 0)
    assert p.length(0, 2)[0] == 2
    p.observe_upkeep(0.5, 0)  # a drafting round that committed nothing new to feed: no per-token figure
    assert p.upkeep_calls == 0 and p.upkeep_tok_seconds == 0.0
    p.observe_upkeep(0.004, 4)
    p.observe_upkeep(0.002, 1)  # moving average: (1 ms + 2 ms) / 2
    assert p.upkeep_calls == 2 and p.upkeep_tok_seconds == pytest.approx(0.0015)
    assert p.plain_upkeep_calls == 0
    # the figures travel with the state (rewinds and snapshots) and show in the description
    q = CostPolicy(VerifyCostModel([1, 2, 3], [0.010, 0.011, 0.012]))
    q.load(json.loads(json.dumps(p.state())))
    assert q.state() == p.state()
    assert q.describe()["upkeep_seconds_per_token"] == pytest.approx(0.0015)


def test_rounds_that_ask_for_a_draft_and_get_none_count_against_drafting():
    p = _even_odds_policy()
    assert p.length(0, 2)[0] == 2  # 1.75 / 13 ms = 134.6 t/s against 105 (see the upkeep test above)
    # half the asking rounds got a draft, and a round that got none cost 4 ms: each draft comes with one
    # such round, k=1: 1.5 / (11.5 + 4) ms = 96.8 t/s, k=2: 1.75 / (13 + 4) ms = 102.9 t/s -> plain
    p.proposal_rate, p.decline_seconds = 0.5, 0.004
    assert p.length(0, 2)[0] == 0
    # four in five got a draft: a quarter of a declined round per draft, k=2: 1.75 / 14 ms = 125 t/s
    p.proposal_rate = 0.8
    assert p.length(0, 2)[0] == 2


def test_a_declined_round_is_learnt_and_a_declined_probe_backs_the_probes_off():
    p = CostPolicy(VerifyCostModel([1, 2, 16], [0.010, 1.0, 10.0]))  # drafting never pays: probes only
    p.observe(1, 1, 0.0)  # a draft: asked once, proposed once
    assert (p.asked, p.proposal_rate) == (1, 1.0)
    assert [p.length(0, 4)[0] for _ in range(8)] == [0] * 7 + [1]
    p.observe(0, 0, 0.003)  # the probe asked and the drafter proposed nothing
    assert (p.asked, p.proposal_rate, p.declines, p.decline_seconds) == (2, 0.5, 1, 0.003)
    assert p.draft_calls == 1 and p.run == 0 and p.probe_every == 16  # not a draft call; interval doubled
    assert p.probe_floor() == 30  # 3 ms within 1% of 10 ms rounds: above the interval of 16
    assert [p.length(0, 4)[0] for _ in range(30)] == [0] * 29 + [1]
    q = CostPolicy(VerifyCostModel([1, 2, 16], [0.010, 1.0, 10.0]))
    q.load(json.loads(json.dumps(p.state())))
    assert q.state() == p.state() and q.describe()["proposal_rate"] == 0.5


def test_probes_wait_longer_when_they_cost_the_drafter_more_than_a_small_share_of_plain_rounds():
    p = CostPolicy(VerifyCostModel([1, 2, 16], [0.010, 1.0, 10.0]))  # a plain round 10 ms; drafting never pays
    assert p.probe_floor() == 0  # nothing measured: the probe schedule as it was
    assert [p.length(0, 4)[0] for _ in range(8)] == [0] * 7 + [1]
    p.observe(1, 1, 0.0)  # the probe was accepted (interval back to 8)
    # a resume of 2 ms and a declined ask of 1 ms: 3 ms within 1% of plain rounds of 10 ms takes 30 rounds
    p.observe_upkeep(0.0, 0, 0.002)
    p.decline_seconds = 0.001
    assert p.resume_seconds == 0.002 and p.probe_floor() == 30
    assert [p.length(0, 4)[0] for _ in range(30)] == [0] * 29 + [1]
    p.observe(1, 1, 0.0)
    p.observe_upkeep(0.0, 0, 0.100)  # moving average of two resumes: 51 ms; the floor stops at 64 rounds
    assert p.probe_floor() == CostPolicy.PROBE_FLOOR_MAX == 64
