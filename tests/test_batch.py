"""Several requests in one verify batch (specviz.decoding.batch): each request's tokens equal its one-at-a-time
tokens, requests start and finish at different steps, the decode counts, and every refusal."""

from __future__ import annotations

import pytest

from specviz import Session
from specviz.decoding.batch import BatchRun, check_parallel
from specviz.errors import BatchError, SequenceError
from specviz.testing.memory_models import write_tiny_mamba

PROMPTS = ["the a of the a of the a of", "of of the a the of of the a the", "a a a of the the a", "the the of a"]
STRATEGIES = ["prompt-lookup", "ngram-simple", "none", "ngram-map-k"]
SLOT = dict(n_batch=64, n_ubatch=64, n_threads=1)


def alone(path, prompts, lengths, strategies, **options) -> list[list[int]]:
    """Each request run by itself in a session of its own, as the reference."""
    out = []
    with Session(path, n_ctx=512, **SLOT, prefill=options.pop("prefill", "all-but-last")) as s:
        for p, n, st in zip(prompts, lengths, strategies):
            s.start(p, n, st, **options)
            s.run()
            out.append(list(s.tokens))
    return out


@pytest.mark.parametrize("prefill", ["all-but-last", "whole"])
def test_each_batched_request_equals_its_one_at_a_time_tokens_and_slots_are_reused(tiny_model_path, prefill):
    lengths = [80, 30, 60, 45]  # different lengths: requests finish, and queued ones start, at different steps
    ref = alone(tiny_model_path, PROMPTS, lengths, STRATEGIES, prefill=prefill)
    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, prefill=prefill, **SLOT) as b:
        ids = [b.submit(p, n, st) for p, n, st in zip(PROMPTS, lengths, STRATEGIES)]
        results = b.run()
        assert [r.id for r in results] == ids
        assert [r.tokens for r in results] == ref
        assert all(r.finished == "max_tokens" and r.error is None for r in results)
        # two slots: the third and fourth requests waited for a free one, each slot served two requests
        assert sorted(r.slot for r in results) == [0, 0, 1, 1]
        assert results[0].started_step == results[1].started_step == 1
        assert results[2].started_step > 1 and results[3].started_step > 1
        # every decode held one or two sequences, and most held two
        assert 1.0 < b.mean_sequences_per_decode <= 2.0
        rounds = sum(sum(1 for e in r.events if e.kind == "verified" and e.batch_size > 0) for r in results)
        assert b.sequences_per_decode <= rounds
        # drafts were verified in the shared decodes, and some of their tokens accepted (and some rejected)
        accepted = [e.n_accepted for r in results for e in r.events if e.kind == "accepted"]
        drafted = [e.batch_size - 1 for r in results for e in r.events if e.kind == "verified"]
        assert sum(accepted) > 0 and sum(drafted) > sum(accepted)


def test_batched_requests_record_the_top_two_margin_at_each_token_as_alone(tiny_model_path):
    from specviz.analysis.equivalence import first_divergence, greedy_run

    with Session(tiny_model_path, n_ctx=512, **SLOT) as s:
        ref = [greedy_run(s, p, 30, "ngram-simple", {}) for p in PROMPTS[:3]]
    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, record_margins=True, **SLOT) as b:  # a slot reused
        for p in PROMPTS[:3]:
            b.submit(p, 30, "ngram-simple")
        results = b.run()
    for (tokens, margins, _), r in zip(ref, results):
        assert r.tokens == tokens and len(r.margins) == len(r.tokens) == 30
        # each margin is the row's own top two, the first of them the committed (greedy) token
        assert [m[1] for m in r.margins] == r.tokens
        assert [m[1:] for m in r.margins] == [m[1:] for m in margins]
        assert [m[0] for m in r.margins] == pytest.approx([m[0] for m in margins], abs=1e-3)
        assert first_divergence(tokens, margins, r.tokens, r.margins) is None
    with BatchRun(tiny_model_path, n_parallel=1, n_ctx=512, **SLOT) as b:  # off unless asked: nothing kept
        b.submit(PROMPTS[0], 5, "ngram-simple")
        assert b.run()[0].margins == []


def test_sampled_batched_requests_keep_their_own_generators(tiny_model_path):
    options = dict(temperature=0.9, seed=7)
    ref = alone(tiny_model_path, PROMPTS[:3], [20] * 3, STRATEGIES[:3], **options)
    with BatchRun(tiny_model_path, n_parallel=3, n_ctx=1536, **SLOT) as b:
        for p, st in zip(PROMPTS[:3], STRATEGIES[:3]):
            b.submit(p, 20, st, **options)
        assert [r.tokens for r in b.run()] == ref
        assert b.mean_sequences_per_decode == 3.0


def test_a_request_refused_at_its_start_ends_with_its_error_and_the_others_run(tiny_model_path):
    ref = alone(tiny_model_path, PROMPTS[:2], [16, 16], STRATEGIES[:2])
    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, **SLOT) as b:
        b.submit(PROMPTS[0], 16, STRATEGIES[0])
        bad = b.submit(PROMPTS[1], 16, "ngram-simple", size_n=0)  # outside the knob's range
        long = b.submit(list(range(1, 5)) * 200, 16, "none")  # 800 tokens: longer than its slot's 512
        b.submit(PROMPTS[1], 16, STRATEGIES[1])
        results = b.run()
    assert [r.tokens for r in results if r.error is None] == ref
    for i in (bad, long):
        assert results[i].finished == "error" and results[i].tokens == [] and results[i].error is not None
    assert "size_n" in str(results[bad].error)


def test_refusals_before_the_model_loads_and_at_submit(tiny_model_path, tmp_path):
    for n in (0, -1, 1.5, True, "2"):
        with pytest.raises(BatchError, match="parallel"):
            BatchRun(str(tmp_path / "absent.gguf"), n_parallel=n)  # refused before the (absent) model is read
    assert check_parallel(3) == 3
    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, **SLOT) as b:
        for strategy in ("eagle3", "mtp", "ngram-simple,eagle3"):
            with pytest.raises(BatchError, match="cannot run batched"):
                b.submit("the a", 8, strategy)
        assert not b.pending  # nothing was queued
        b.submit("the a", 4, "none")
        assert b.run()[0].finished == "max_tokens"  # the run is still usable


def test_memory_that_cannot_cut_one_sequence_alone_is_refused_when_the_run_opens(tmp_path):
    path = tmp_path / "mamba.gguf"
    write_tiny_mamba(path)
    with pytest.raises(SequenceError) as got:
        BatchRun(str(path), n_parallel=2, n_ctx=512, **SLOT)
    assert got.value.kind == "recurrent"


def test_a_batched_request_cannot_be_snapshotted_alone(tiny_model_path):
    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, **SLOT) as b:
        b.submit("the a of", 8, "none")
        b.step()
        with pytest.raises(SequenceError, match="cannot be saved alone"):
            b.slots[0].snapshot()
        b.run()


def test_every_step_is_published_as_the_lanes_of_one_decode(tiny_model_path):
    from specviz.decoding.events import BatchStepped, event_from_dict

    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, **SLOT) as b:
        for p, n, st in zip(PROMPTS[:3], [40, 10, 20], STRATEGIES[:3]):
            b.submit(p, n, st)
        results = b.run()
        steps = [e for e in b.events if isinstance(e, BatchStepped)]
    assert [e.round for e in steps] == list(range(1, len(steps) + 1)) and all(e.n_parallel == 2 for e in steps)
    # each request's lanes are its rounds: its committed tokens, drafts and acceptance add up to its own events'
    for r in results:
        lanes = [lane for e in steps for lane in e.lanes if lane["request"] == r.id]
        assert sum(lane["committed"] for lane in lanes) == len(r.tokens)
        assert [lane["round"] for lane in lanes] == list(range(1, len(lanes) + 1))
        assert {lane["slot"] for lane in lanes} == {r.slot} and lanes[-1]["finished"] == "max_tokens"
        own = [e.n_accepted for e in r.events if e.kind == "accepted"]
        assert [lane["accepted"] for lane in lanes] == own
    # the decodes: one per step with a busy sequence, each holding every lane's rows
    assert sum(1 for e in steps if e.busy) == b.decodes and sum(e.busy for e in steps) == b.sequences_per_decode
    assert steps[0].queued == 1 and steps[-1].queued == 0  # the third request waited for a slot
    assert [event_from_dict(e.to_dict()) for e in steps] == steps


def test_a_draft_schedule_caps_drafts_by_the_busy_sequences_as_vllms_does(tiny_model_path):
    from specviz.decoding.batch import check_schedule, scheduled_length

    assert check_schedule([[3, 8, 2], (1, 2, 8)]) == ((1, 2, 8), (3, 8, 2))
    assert scheduled_length(((1, 2, 8), (3, 8, 2)), 5) == 2 and scheduled_length(((1, 2, 8),), 9) is None
    for bad in ([(0, 2, 4)], [(2, 1, 4)], [(1, 2, -1)], [(1, 2)], [(1, 4, 2), (3, 8, 1)], [(1, 2, True)]):
        with pytest.raises(BatchError, match="schedule"):
            check_schedule(bad)
    ref = alone(tiny_model_path, PROMPTS[:2], [60, 20], STRATEGIES[:2])
    # two busy: no draft at all; one left: drafts of up to 8
    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, draft_schedule=[(2, 2, 0), (1, 1, 8)], **SLOT) as b:
        for p, n, st in zip(PROMPTS[:2], [60, 20], STRATEGIES[:2]):
            b.submit(p, n, st)
        results = b.run()
        steps = [e for e in b.events if e.kind == "batch_step"]
    assert [r.tokens for r in results] == ref
    # the first request's rounds taken while both requests were busy
    both = {lane["round"] for e in steps if len(e.lanes) == 2 for lane in e.lanes if lane["request"] == 0}
    drafts = [(e.round, e.limit, e.cap) for e in results[0].events if e.kind == "draft_proposed"]
    assert both and all(limit == 0 and cap == "load" for rnd, limit, cap in drafts if rnd in both)
    assert any(limit > 1 for rnd, limit, _ in drafts if rnd not in both)


def test_the_cost_policy_prices_the_whole_batch_with_a_batch_cost_table(tiny_model_path):
    from specviz.decoding.batch_cost import BatchCostTable

    seqs, drafts = (1, 2), (0, 2, 4, 8)

    def decode(s: int, d: int) -> float:  # alone every row is free; two at once, each draft row costs ten decodes
        return 0.001 if s == 1 else 0.002 + 0.01 * s * d

    grid = tuple(tuple(decode(s, d) for d in drafts) for s in seqs)
    table = BatchCostTable(seqs, drafts, grid, grid, 1)
    options = dict(draft_policy="cost", draft_max=8, max_ngram=2, min_ngram=1)
    # one cache the sequences share: the batch is one graph, priced as its sequences at their mean rows (in a
    # split cache a lone draft's rows would be a graph of one sequence, which this table prices free)
    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, batch_cost=table, kv_unified=True, **SLOT) as b:
        b.submit(PROMPTS[0], 80, "prompt-lookup", **options)
        b.submit(PROMPTS[1], 16, "prompt-lookup", **options)
        results = b.run()
        steps = [e for e in b.events if e.kind == "batch_step"]
    # the first request's rounds taken while both requests were busy
    both = {lane["round"] for e in steps if len(e.lanes) == 2 for lane in e.lanes if lane["request"] == 0}
    limits = [(e.round, e.limit) for e in results[0].events if e.kind == "draft_proposed"]
    # two at once, drafting never pays: plain rounds but for one-token probes; alone, long drafts pay again
    assert both and all(limit <= 1 for rnd, limit in limits if rnd in both)
    assert max(limit for rnd, limit in limits if rnd not in both) >= 4
    assert [r.tokens for r in results] == alone(
        tiny_model_path, PROMPTS[:2], [80, 16], ["prompt-lookup"] * 2, **options
    )
