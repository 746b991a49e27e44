"""Telemetry: raw counters recorded per round, and every derived figure on hand-made numbers."""

from __future__ import annotations

import pytest

from specviz.decoding.telemetry import (
    Telemetry,
    acceptance_rate,
    bucket_rates,
    figures,
    mean_accepted_length,
    per_position_acceptance,
    tokens_per_round,
    tokens_per_second,
)


def test_acceptance_rate():
    assert acceptance_rate(3, 12) == 0.25
    assert acceptance_rate(0, 0) == 0.0


def test_mean_accepted_length_counts_the_targets_own_token():
    # vLLM's definition: 1 + accepted draft tokens per drafting round
    assert mean_accepted_length(6, 4) == 2.5
    assert mean_accepted_length(0, 3) == 1.0  # every draft rejected at once: one token per round
    assert mean_accepted_length(0, 0) == 1.0


def test_tokens_per_round_and_per_second():
    assert tokens_per_round(30, 12) == 2.5
    assert tokens_per_round(0, 0) == 0.0
    assert tokens_per_second(30, 1.5) == 20.0
    assert tokens_per_second(30, 0.0) == 0.0


def test_per_position_acceptance_divides_hits_by_tries_at_each_depth():
    assert per_position_acceptance([4, 2, 0], [5, 4, 1]) == [0.8, 0.5, 0.0]
    assert per_position_acceptance([0], [0]) == [0.0]


def test_bucket_rates_edges_and_empty_buckets():
    tries = [0] * 9 + [4]
    hits = [0] * 9 + [3]
    rates = bucket_rates(tries, hits)
    assert rates[-1] == {"lo": 0.9, "hi": 1.0, "tries": 4, "accepted": 3, "rate": 0.75}
    assert rates[0] == {"lo": 0.0, "hi": 0.1, "tries": 0, "accepted": 0, "rate": None}


def test_record_round_keeps_raw_counters():
    t = Telemetry()
    # round 1: 4 drafted, 2 accepted (depths 0 and 1), 3 committed; round 2: plain; round 3: 2 drafted, 2 accepted
    t.record_round(
        n_drafted=4,
        n_accepted=2,
        n_committed=3,
        draft_seconds=0.01,
        verify_seconds=0.1,
        round_seconds=0.2,
        draft_probs=[0.95, 0.55, 0.15, None],
    )
    t.record_round(n_drafted=0, n_accepted=0, n_committed=1, draft_seconds=0.0, verify_seconds=0.05, round_seconds=0.05)
    t.record_round(
        n_drafted=2,
        n_accepted=2,
        n_committed=3,
        draft_seconds=0.01,
        verify_seconds=0.1,
        round_seconds=0.25,
        expected_tokens=2.5,
    )
    assert (t.rounds, t.rounds_with_draft, t.drafted, t.accepted, t.generated) == (3, 2, 6, 4, 7)
    assert t.position_tries == [2, 2, 1, 1] and t.position_hits == [2, 2, 0, 0]
    assert t.length_hist == [0, 0, 2]  # two drafting rounds, each accepted two
    assert t.bucket_tries[9] == 1 and t.bucket_hits[9] == 1  # 0.95 accepted
    assert t.bucket_tries[5] == 1 and t.bucket_hits[5] == 1  # 0.55 accepted
    assert t.bucket_tries[1] == 1 and t.bucket_hits[1] == 0  # 0.15 rejected
    d = figures(t)
    assert d["acceptance_rate"] == pytest.approx(4 / 6)
    assert d["mean_accepted_length"] == pytest.approx(1 + 4 / 2)
    assert d["tokens_per_round"] == pytest.approx(7 / 3)
    assert d["per_position_acceptance"] == [1.0, 1.0, 0.0, 0.0]
    assert d["tokens_per_second"] == pytest.approx(7 / 0.5)
    assert d["expected_tokens_per_round"] == pytest.approx(2.5 / 3)
    assert d["last_round"]["committed"] == 3
    assert Telemetry.from_state(t.state()).to_dict() == d


def test_from_state_refuses_counters_of_the_wrong_type():
    with pytest.raises(TypeError):
        Telemetry.from_state({"rounds": "many"})


def _one_round(drafter: str | None = None) -> Telemetry:
    """Counters after one round that drafted two tokens (probabilities 0.5) and accepted one."""
    t = Telemetry()
    t.record_round(
        n_drafted=2,
        n_accepted=1,
        n_committed=2,
        draft_seconds=0.0,
        verify_seconds=0.0,
        round_seconds=0.0,
        draft_probs=[0.5, 0.5],
        drafter=drafter,
    )
    return t


def test_state_is_a_copy_the_live_counters_do_not_share():
    t = _one_round()
    s = t.state()
    # the list counters are saved as tuples, which nothing can edit; editing a saved dictionary leaves the
    # session's counters alone ...
    assert isinstance(s["position_tries"], tuple) and isinstance(s["bucket_hits"], tuple)
    s["last_round"]["committed"] = 99
    s["rollback_paths"]["checkpoint"] = 5
    assert t.last_round["committed"] == 2 and t.rollback_paths == {}
    # ... and more rounds leave the saved state alone
    s = t.state()
    t.record_round(n_drafted=3, n_accepted=3, n_committed=4, draft_seconds=0.0, verify_seconds=0.0, round_seconds=0.0)
    assert s["position_tries"] == (1, 1) and s["length_hist"] == (0, 1) and s["last_round"]["committed"] == 2
    # ... and a counter rebuilt from the state is a list of its own again
    u = Telemetry.from_state(s)
    u.record_round(n_drafted=3, n_accepted=3, n_committed=4, draft_seconds=0.0, verify_seconds=0.0, round_seconds=0.0)
    assert u.position_tries == [2, 2, 1] and s["position_tries"] == (1, 1)


def test_state_keeps_no_list_the_garbage_collector_must_walk():
    """Each round's state lives as long as the session keeps the round: its list counters are tuples of
    numbers, which CPython's collector stops tracking once it has seen them (lists it would walk on every
    full collection), the drafters' included."""
    import gc

    s = _one_round("ngram-mod").state()
    gc.collect()
    counters = [v for v in s.values() if isinstance(v, (list, tuple))]
    counters += [v for c in s["by_drafter"].values() for v in c.values() if isinstance(v, (list, tuple))]
    assert len(counters) == 7
    assert not [v for v in counters if gc.is_tracked(v)]


def test_from_state_checks_each_counters_type():
    # an integer is a fine value for a float counter (JavaScript's JSON.stringify writes 2.0 as 2) ...
    t = Telemetry.from_state({"seconds": 2, "rounds": 3, "position_tries": [1, 0]})
    assert (t.seconds, t.rounds, t.position_tries) == (2, 3, [1, 0])
    # ... but a float counter refuses text, and a list counter refuses a number
    with pytest.raises(TypeError):
        Telemetry.from_state({"draft_seconds": "slow"})
    with pytest.raises(TypeError):
        Telemetry.from_state({"position_tries": 3})
    with pytest.raises(TypeError):
        Telemetry.from_state({"last_round": [1]})


def test_state_is_a_deep_copy_that_later_rounds_leave_alone():
    """Every round's checkpoint and telemetry event keep ``state()``: the next round must not reach it."""
    import copy

    t = Telemetry()
    kw = dict(n_committed=3, draft_seconds=0.1, verify_seconds=0.1, round_seconds=0.2, draft_probs=[0.9, 0.4, 0.1])
    t.record_round(n_drafted=3, n_accepted=2, drafter="ngram-simple", **kw)
    s = t.state()
    assert s.keys() == t.__dict__.keys() and Telemetry.from_state(s).__dict__ == t.__dict__
    frozen = copy.deepcopy(s)
    t.record_round(n_drafted=3, n_accepted=3, drafter="ngram-simple", **kw)
    t.record_memory(None, None)
    assert s == frozen and s != t.state()
    assert Telemetry.from_state(s).to_dict() == Telemetry.from_state(frozen).to_dict()
