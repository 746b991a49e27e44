"""Diagnosis and advice broken down per drafter: chains of drafters (hand-made rounds and a real session),
the drafter finding, chain prefixes scored exactly, and the llama.cpp flags of a chain and of DFlash."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_advise import linear
from test_diagnose import Rounds

from specviz.analysis.advise import Candidate, advise, llama_flags
from specviz.analysis.diagnose import diagnose
from specviz.analysis.diagnosis import DRAFTER_GAP, MIN_SUPPORT, Diagnosis, Examined, drafter_rule
from specviz.decoding.events import DraftProposed

CHAIN = "ngram-mod,mtp"
KNOBS = {"align": False, "draft_max": 6, "draft_min": 0, "draft_p_min": 0.0, "n_match": 2, "n_min": 1, "n_max": 64}


def chain_round(R, drafter, draft, n_acc, chosen=None, **kw):
    """One round of ``R`` whose draft was proposed by ``drafter`` (a chain's member)."""
    R.round(draft, n_acc, chosen, **kw)
    i = max(j for j, e in enumerate(R.events) if isinstance(e, DraftProposed))
    R.events[i] = dataclasses.replace(R.events[i], drafter=drafter)


def chain_events(n_ngram=10, n_mtp=10):
    """ngram-mod drafts 6 tokens, all accepted; where it had nothing, mtp drafts 3 and 1 is accepted."""
    R = Rounds(list(range(1, 30)), knobs=dict(KNOBS), strategy=CHAIN)
    for _ in range(n_ngram):
        chain_round(R, "ngram-mod", [60 + j for j in range(6)], 6, draft_seconds=0.0)
    for _ in range(n_mtp):
        chain_round(R, "mtp", [70, 71, 72], 1, 5, probs=[0.9, 0.5, 0.5], rank=2, draft_seconds=0.003)
    return R.events


def test_the_diagnosis_breaks_acceptance_down_per_drafter():
    dg = diagnose(chain_events())
    by = dg.by_drafter()
    assert by["ngram-mod"]["examined"] == 60 and by["ngram-mod"]["acceptance"] == 1.0
    assert by["mtp"]["examined"] == 20 and by["mtp"]["acceptance"] == pytest.approx(0.5)
    assert by["mtp"]["rounds"] == 10 and by["mtp"]["by_depth"][0]["acceptance"] == 1.0
    assert sum(v["examined"] for v in by.values()) == dg.examined
    assert {r.drafter for r in dg.rejections} == {"mtp"}
    f = [x for x in dg.findings() if x["key"] == "drafter"]
    assert len(f) == 1 and "the chain's mtp drafts are accepted 50%" in f[0]["text"]
    assert "acceptance by drafter:" in dg.text()
    json.dumps(dg.to_dict())


def test_the_drafter_rule_names_a_weak_member_only_past_its_threshold_and_support():
    def dg_with(acc_a, acc_b, n=10):
        d = Diagnosis()
        for name, acc in (("a", acc_a), ("b", acc_b)):
            for i in range(n):
                d.tokens.append(Examined(i, 0, "other", None, False, i < round(acc * n), "a,b", name))
        d.examined = len(d.tokens)
        return d

    assert [f["key"] for f in drafter_rule(dg_with(1.0, 1.0 - DRAFTER_GAP))] == ["drafter"]
    assert drafter_rule(dg_with(1.0, 1.0 - DRAFTER_GAP + 0.13)) == []  # below the gap
    assert drafter_rule(dg_with(1.0, 0.0, n=MIN_SUPPORT - 1)) == []  # too few tokens
    single = Diagnosis(tokens=[Examined(0, 0, "other", None, False, False, "mtp", "mtp")] * 20, examined=20)
    assert drafter_rule(single) == []


def test_the_advisor_scores_the_chain_and_its_first_members_exactly():
    cost = linear(0.010, 0.002)
    adv = advise(chain_events(), cost=cost)
    assert set(adv.per_strategy) == {CHAIN, "ngram-mod (of ngram-mod,mtp)"}
    assert adv.by_drafter["mtp"]["acceptance"] == pytest.approx(0.5)
    # the chain as run, at draft_max 6: ngram rounds commit 7 tokens in a 7-row verify, mtp rounds 2 in a 4-row one
    chain = adv.current[CHAIN]
    t_ngram, t_mtp = 0.010 + 0.002 * 6, 0.010 + 0.002 * 3 + 0.003
    assert chain.tokens_per_second == pytest.approx((10 * 7 + 10 * 2) / (10 * t_ngram + 10 * t_mtp))
    # ngram-mod alone: the rounds mtp drafted are plain (1 token in a 1-row verify; drafting time of an idle
    # round, none recorded here)
    alone = adv.current["ngram-mod (of ngram-mod,mtp)"]
    assert alone.strategy == "ngram-mod"
    assert alone.tokens_per_second == pytest.approx((10 * 7 + 10 * 1) / (10 * t_ngram + 10 * 0.010))
    assert "acceptance by drafter: ngram-mod 100% of 60, mtp 50% of 20" in adv.report()


def test_the_advice_may_be_a_chain_with_each_members_flags():
    adv = advise(chain_events(), cost=linear(0.010, 0.001))
    assert adv.best.strategy == CHAIN  # mtp's rounds pay at this cost: keep it in the chain
    assert adv.flags.startswith("--spec-type ngram-mod,draft-mtp --spec-ngram-mod-n-match 2 ")
    assert f"--spec-draft-n-max {adv.best.draft_max}" in adv.flags and "-md" not in adv.flags
    # when mtp's drafts cost more than they return, the chain without it wins
    R = Rounds(list(range(1, 30)), knobs=dict(KNOBS), strategy=CHAIN)
    for _ in range(10):
        chain_round(R, "ngram-mod", [60 + j for j in range(6)], 6)
        chain_round(R, "mtp", [70, 71, 72], 0, 5, probs=[0.9, 0.9, 0.9], rank=9, draft_seconds=0.02)
    adv = advise(R.events, cost=linear(0.010, 0.002))
    assert adv.best.strategy == "ngram-mod" and adv.best_label == "ngram-mod (of ngram-mod,mtp)"
    assert adv.flags.startswith("--spec-type ngram-mod --spec-ngram-mod-n-match 2 ")


def test_llama_flags_of_dflash_dspark_and_a_chain_of_n_gram_members():
    c = Candidate("dflash", 7, 0, 0.5, 100.0, 3.0, 1.5)
    flags, _ = llama_flags(c, {"draft_model": "/d/dflash.gguf", "draft_p_min": 0.5})
    want = (
        "--spec-type draft-dflash -md /d/dflash.gguf --spec-draft-n-max 7 --spec-draft-n-min 0 --spec-draft-p-min 0.5"
    )
    assert flags == want
    flags, _ = llama_flags(dataclasses.replace(c, strategy="dspark", draft_p_min=0.0), {"draft_model": "/d/s.gguf"})
    assert flags.startswith("--spec-type draft-dspark -md /d/s.gguf")
    c2 = Candidate("ngram-simple,ngram-map-k", 4, 0, None, 100.0, 3.0, 1.5)
    flags, _ = llama_flags(c2, {"ngram_simple_size_n": 2, "ngram_map_k_size_n": 3, "min_hits": 1})
    assert flags.startswith("--spec-type ngram-simple,ngram-map-k --spec-ngram-simple-size-n 2 ")
    assert "--spec-ngram-map-k-size-n 3" in flags and "--spec-ngram-map-k-min-hits 1" in flags


def test_a_real_chain_session_is_diagnosed_and_advised_per_drafter(tmp_path):
    from specviz import Session
    from specviz.testing.tiny_models import write_tiny_nextn

    p = write_tiny_nextn(tmp_path / "nextn.gguf", seed=1, block_scale=0.05, binary=(300, 301))
    s = Session(p, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start([1, 50, 60, 70, 80], 60, "draft-mtp,ngram-mod", draft_p_min=0.0, draft_max=4, n_match=2, n_min=1)
    s.run()
    tel = s.telemetry_dict()["by_drafter"]
    dg = diagnose(s)
    by = dg.by_drafter()
    assert set(by) == set(tel) == {"ngram-mod", "mtp"}
    adv = advise(s, cost=linear(0.010, 0.002))
    assert "ngram-mod (of ngram-mod,mtp)" in adv.per_strategy and set(adv.by_drafter) == {"ngram-mod", "mtp"}
    s.close()


def test_advice_for_a_chains_first_member_is_predicted_on_another_recording_of_the_chain():
    """Advice to run ngram-mod alone (learnt where mtp's drafts did not pay), predicted on another recording
    of the chain: its ngram-mod rounds as drafted, mtp's rounds plain, as advise scores that prefix."""
    from specviz.analysis.advise import predict

    R = Rounds(list(range(1, 30)), knobs=dict(KNOBS), strategy=CHAIN)
    for _ in range(10):
        chain_round(R, "ngram-mod", [60 + j for j in range(6)], 6)
        chain_round(R, "mtp", [70, 71, 72], 0, 5, probs=[0.9, 0.9, 0.9], rank=9, draft_seconds=0.02)
    cost = linear(0.010, 0.002)
    adv = advise(R.events, cost=cost)
    assert adv.best_label == "ngram-mod (of ngram-mod,mtp)" and (adv.best.draft_max, adv.best.draft_min) == (6, 0)
    p = predict(adv, chain_events(), cost=cost)
    t_ngram = 0.010 + 0.002 * 6
    assert p.strategy == "ngram-mod"
    assert p.tokens_per_second == pytest.approx((10 * 7 + 10 * 1) / (10 * t_ngram + 10 * 0.010))
