"""The stepping decoder on tiny real GGUF models: exact greedy equivalence, KV invariants, validation,
snapshots, and the event stream."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specviz import Session, strategy_class, strategy_names
from specviz.backends import LlamaContext
from specviz.decoding.events import TelemetryEvent, event_from_dict
from specviz.errors import ContextError, KnobError, SessionStateError, SnapshotError, StrategyError

# Knobs that make each strategy draft often on short tiny-model histories.
EAGER = {
    "none": {},
    "prompt-lookup": {"max_ngram": 3, "min_ngram": 1, "draft_max": 6},
    "ngram-simple": {"size_n": 2, "size_m": 6, "draft_max": 8},
    "ngram-map-k": {"size_n": 2, "size_m": 6, "min_hits": 1, "draft_max": 8},
    "ngram-map-k4v": {"size_n": 2, "size_m": 6, "min_hits": 1, "draft_max": 8},
    "ngram-mod": {"n_match": 2, "n_min": 1, "n_max": 8, "draft_max": 8},
    "ngram-cache": {"n_draft": 8, "draft_max": 8},
}


def eager(name: str) -> dict:
    """Eager knobs for ``name`` restricted to what its schema has (strategies may name knobs differently)."""
    from specviz.strategies import strategy_schema

    names = set(strategy_schema(name).names())
    return {k: v for k, v in EAGER.get(name, {"draft_max": 8}).items() if k in names}


DRAFTLESS = [n for n in strategy_names() if not strategy_class(n).needs_model]


def plain_reference(model, prompt_ids, n):
    """Independent plain greedy: one token per decode, numpy argmax with NaN as -inf."""
    ctx = LlamaContext(model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    ctx.eval(prompt_ids, 0, rows="last")
    out = []
    pos = len(prompt_ids)
    row = ctx.row(len(prompt_ids) - 1)
    for _ in range(n):
        r = np.where(np.isnan(row), -np.inf, row)
        t = int(np.argmax(r))
        if model.is_eog(t):
            break
        out.append(t)
        ctx.eval([t], pos, rows="all")
        pos += 1
        row = ctx.row(0)
    ctx.close()
    return out


def generate(session, prompt, n, strategy, **knobs):
    session.start(prompt, n, strategy, **knobs)
    session.run()
    return list(session.tokens)


def test_plain_session_equals_independent_reference(tiny_session, tiny_model):
    prompt = tiny_model.tokenize("the cat and the dog")
    ref = plain_reference(tiny_model, prompt, 60)
    assert generate(tiny_session, prompt, 60, "none") == ref
    assert len(ref) > 0


@pytest.mark.parametrize("strategy", DRAFTLESS)
def test_speculative_greedy_equals_plain_greedy(tiny_session, tiny_model, strategy):
    prompt = tiny_model.tokenize("the a the a the a of and the a the a")
    ref = plain_reference(tiny_model, prompt, 80)
    got = generate(tiny_session, prompt, 80, strategy, **eager(strategy))
    assert got == ref
    if strategy not in ("none", "grammar"):  # the grammar drafter drafts only under a grammar (test_grammar_forced)
        # the fixture loops, so every draftless strategy must have drafted and had tokens accepted
        t = tiny_session.telemetry_dict()
        assert t["drafted"] > 0 and t["accepted"] > 0, (strategy, t)


token_lists = st.lists(st.integers(3, 319), min_size=1, max_size=12)


@st.composite
def prompts(draw):
    """Prompts with repeated token histories: a random motif repeated, with random noise around it."""
    motif = draw(st.lists(st.integers(3, 319), min_size=1, max_size=6))
    reps = draw(st.integers(1, 6))
    head = draw(st.lists(st.integers(3, 319), max_size=5))
    tail = draw(st.lists(st.integers(3, 319), max_size=3))
    return [1] + head + motif * reps + tail


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts(), strategy=st.sampled_from(DRAFTLESS), n=st.integers(1, 48))
def test_equivalence_over_generated_prompts(tiny_session, tiny_model, prompt, strategy, n):
    ref = plain_reference(tiny_model, prompt, n)
    assert generate(tiny_session, prompt, n, strategy, **eager(strategy)) == ref


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=prompts(), data=st.data())
@pytest.mark.slow
def test_equivalence_with_knobs_and_strategies_changed_between_steps(tiny_session, tiny_model, prompt, data):
    n = 40
    ref = plain_reference(tiny_model, prompt, n)
    tiny_session.start(prompt, n, "prompt-lookup", **eager("prompt-lookup"))
    while tiny_session.finished is None:
        if data.draw(st.booleans()):
            name = data.draw(st.sampled_from(DRAFTLESS))
            knobs = dict(eager(name))
            if name != "none":
                knobs["draft_max"] = data.draw(st.integers(1, 12))
            tiny_session.configure(strategy=name, **knobs)
        tiny_session.step()
        assert tiny_session.kv_length == tiny_session.committed
    assert tiny_session.tokens == ref


@pytest.mark.parametrize("strategy", DRAFTLESS)
def test_kv_length_equals_committed_tokens_after_every_round(tiny_session, tiny_model, strategy):
    tiny_session.start("the a the a the a of the a", 60, strategy, **eager(strategy))
    assert tiny_session.kv_length == tiny_session.committed
    while tiny_session.finished is None:
        rnd = tiny_session.step()
        assert tiny_session.kv_length == tiny_session.committed == len(tiny_session.history) - 1
        ver = rnd.of_kind("verified")
        if ver:
            assert ver[0].kv_before + ver[0].batch_size == ver[0].kv_peak
            for rb in rnd.of_kind("kv_rollback"):
                assert rb.from_pos == ver[0].kv_peak and rb.to_pos == tiny_session.kv_length


def test_round_events_are_ordered_and_consistent(tiny_session):
    tiny_session.start("the a the a the a the a", 40, "prompt-lookup", **eager("prompt-lookup"))
    seen_reject = False
    while tiny_session.finished is None:
        rnd = tiny_session.step()
        kinds = [e.kind for e in rnd.events]
        assert kinds[0] == "draft_proposed" and kinds[1] == "verified" and kinds[2] == "accepted"
        assert "telemetry" in kinds
        d, v, a = rnd.events[0], rnd.events[1], rnd.events[2]
        assert len(v.tokens) == a.n_accepted + 1 or rnd.finished == "eos"
        assert list(a.tokens[: a.n_accepted]) == list(d.tokens[: a.n_accepted])
        rej = rnd.of_kind("rejected")
        if rej:
            seen_reject = True
            assert rej[0].depth == a.n_accepted
            assert list(rej[0].tokens) == list(d.tokens[a.n_accepted :])
            assert rej[0].target_token == a.bonus_token and a.bonus_kind == "correction"
            assert rej[0].target_token != rej[0].tokens[0]
            assert rej[0].alternatives[0]["token"] == rej[0].target_token
            alts = rej[0].alternatives  # each with its own token's text, best first
            assert [x["piece"] for x in alts] == tiny_session.model.pieces([x["token"] for x in alts])
            assert [x["prob"] for x in alts] == sorted((x["prob"] for x in alts), reverse=True)
        for e in rnd.events:
            back = event_from_dict(json.loads(json.dumps(e.to_dict())))
            assert back.to_dict() == e.to_dict()
    assert tiny_session.events[0].kind == "session_started"
    assert tiny_session.events[-1].kind == "finished"
    assert seen_reject


def test_subscribers_see_every_event_in_order(tiny_session):
    seen = []
    unsubscribe = tiny_session.subscribe(seen.append)
    tiny_session.start("the a the a", 20, "ngram-simple", **eager("ngram-simple"))
    tiny_session.run()
    assert seen == tiny_session.events
    unsubscribe()
    tiny_session.start("the", 3, "none")
    assert len(seen) != len(tiny_session.events) or seen != tiny_session.events


def test_draft_length_caps_are_reported(tiny_model):
    s = Session(tiny_model, n_ctx=256, n_batch=8, n_ubatch=8, n_threads=1)
    s.start("the a the a the a the a the a", 30, "prompt-lookup", max_ngram=2, min_ngram=1, draft_max=50)
    caps = set()
    while s.finished is None:
        rnd = s.step()
        d = rnd.events[0]
        assert len(d.tokens) <= d.limit <= 7
        if d.cap:
            caps.add(d.cap)
        assert d.limit <= s.max_tokens
    assert "batch" in caps
    # budget: near the end the draft is capped by the remaining tokens
    s.start("the a the a the a the a the a", 5, "prompt-lookup", max_ngram=2, draft_max=6)
    limits = []
    while s.finished is None:
        rnd = s.step()
        limits.append((rnd.events[0].limit, rnd.events[0].cap))
    assert any(c == "budget" for _, c in limits)
    assert len(s.tokens) == 5
    # context: a context nearly full of prompt
    n_ctx = s.ctx.capacity.n_ctx  # llama.cpp pads n_ctx (to 256 here)
    prompt = [1] + [40, 41] * ((n_ctx - 10) // 2)
    s.start(prompt, 30, "prompt-lookup", max_ngram=2, draft_max=6)
    s.run()
    assert s.finished == "context"
    assert any(e.kind == "draft_proposed" and e.cap == "context" for e in s.events)
    assert len(s.history) == n_ctx
    s.ctx.close()


def _drafts(session, prompt, n, strategy, **knobs):
    """Every round's verified draft and its reason, and the tokens, of one generation."""
    session.start(prompt, n, strategy, **knobs)
    rounds = []
    while session.finished is None:
        d = session.step().events[0]
        rounds.append((list(d.tokens), d.reason))
    return rounds, list(session.tokens)


@pytest.mark.parametrize("strategy", ["prompt-lookup", "ngram-cache"])
def test_a_draft_shorter_than_its_limit_is_cut_to_suit_the_verify_tile(tiny_session, strategy):
    """A proposal that stops short of the limit (the copy runs out, the cache's draft is 8) would make a
    verify batch of leftover rows; with alignment it is cut to its longest prefix that suits the tile."""
    prompt, n = "a b c d e f a b c d e f a b", 64
    free, plain = _drafts(tiny_session, prompt, n, strategy, draft_max=16, align=False)
    # without alignment these drafts do make batches of leftover rows, so there is something to cut
    assert any(len(t) + 1 > 4 and (len(t) + 1) % 4 for t, _ in free)
    cut, tokens = _drafts(tiny_session, prompt, n, strategy, draft_max=16, align=True, verify_tile=4)
    assert all(len(t) + 1 <= 4 or (len(t) + 1) % 4 == 0 for t, _ in cut), cut
    assert any(r == "tile" and t for t, r in cut)
    assert tokens == plain  # lossless either way
    # draft_min: a cut that would leave fewer tokens than draft_min keeps the proposal whole instead
    kept, tokens = _drafts(tiny_session, prompt, n, strategy, draft_max=16, draft_min=8, verify_tile=4)
    assert all(not t or len(t) >= 8 for t, _ in kept)
    assert any(len(t) + 1 > 4 and (len(t) + 1) % 4 for t, _ in kept)  # kept whole, leftover rows and all
    assert tokens == plain


def test_max_tokens_is_exact_and_finish_reasons(tiny_session):
    for n in (1, 2, 7, 33):
        tiny_session.start("the a the a the a", n, "prompt-lookup", **eager("prompt-lookup"))
        tiny_session.run()
        assert len(tiny_session.tokens) == n
        assert tiny_session.finished == "max_tokens"


def test_cancel_stops_after_the_current_round(tiny_session):
    tiny_session.start("the a the a", 100, "none")
    tiny_session.step()
    tiny_session.cancel()
    rnd = tiny_session.step()
    assert rnd.finished == "cancelled" and tiny_session.finished == "cancelled"
    with pytest.raises(SessionStateError, match="finished"):
        tiny_session.step()


def test_eos_stops_generation(tmp_path):
    # a model whose final norm is zero scores every token 0: the first maximum (token 0) wins, and
    # token 0 is declared the end-of-sequence token
    from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

    w = tiny_weights(seed=3)
    w["output_norm.weight"][:] = 0.0
    p = write_tiny_llama(tmp_path / "eos.gguf", layers_from=w, eos_token_id=0)
    s = Session(p, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    s.start("the a", 20, "none")
    s.run()
    assert s.finished == "eos"
    assert s.tokens == []
    assert s.kv_length == s.committed
    assert s.events[-1].kind == "finished" and s.events[-1].reason == "eos"
    s.close()
    s.model.close()


# -- validation: every refusal is typed, names the problem, and changes nothing --------------------------


def _state(s):
    return (list(s.history), s.strategy, dict(s.knobs), s.finished, s.round_index, s.kv_length, len(s.events))


def test_validation_errors_leave_the_session_usable(tiny_session, tiny_model):
    s = tiny_session
    s.start("the a the a the a", 30, "prompt-lookup", **eager("prompt-lookup"))
    s.step()
    before = _state(s)
    bad_calls = [
        (lambda: s.configure(strategy="nope"), StrategyError, "nope"),
        (lambda: s.configure(draft_max=0), KnobError, r"draft_max.*0.*\[1, 1024\]"),
        (lambda: s.configure(draft_max=1025), KnobError, r"draft_max.*1025.*\[1, 1024\]"),
        (lambda: s.configure(draft_max="many"), KnobError, "draft_max"),
        (lambda: s.configure(draft_max=2.5), KnobError, "draft_max"),
        (lambda: s.configure(max_ngram=0), KnobError, "max_ngram"),
        (lambda: s.configure(min_ngram=5, max_ngram=2), KnobError, "min_ngram"),
        (lambda: s.configure(draft_min=9, draft_max=3), KnobError, "draft_min"),
        (lambda: s.configure(size_n=3), KnobError, "unknown knob 'size_n'"),
        (lambda: s.configure(strategy="ngram-simple", size_n=0), KnobError, "size_n"),
        (lambda: s.configure(strategy="ngram-simple", check_rate=2000), KnobError, "check_rate"),
        (lambda: s.start("x", 0), KnobError, "max_tokens"),
        (lambda: s.start("x", 10, "bogus"), StrategyError, "bogus"),
        (lambda: s.start("", 10), KnobError, "empty"),
        (lambda: s.start([1, 999], 10), KnobError, "vocabulary"),
        (lambda: s.start("x", 10, temperature=-1), KnobError, "temperature"),
        (lambda: s.start("x", 10, seed="abc"), KnobError, "seed"),
        (lambda: s.start([1] + [40] * 600, 10), ContextError, "n_ctx"),
        (lambda: Session.restore(b"garbage"), SnapshotError, "not a specviz snapshot"),
    ]
    for call, exc, match in bad_calls:
        with pytest.raises(exc, match=match):
            call()
        assert _state(s) == before, match
    s.run()
    assert s.finished == "max_tokens" and len(s.tokens) == 30


def test_step_before_start_is_refused(tiny_model):
    s = Session(tiny_model, n_ctx=64, n_batch=16, n_ubatch=16, n_threads=1)
    with pytest.raises(SessionStateError, match="start"):
        s.step()
    with pytest.raises(SessionStateError, match="start"):
        s.snapshot()
    s.ctx.close()


def test_configure_applies_at_the_next_round_boundary(tiny_session):
    s = tiny_session
    s.start("the a the a the a", 30, "prompt-lookup", **eager("prompt-lookup"))
    s.step()
    s.configure(draft_max=2)
    assert s.knobs["draft_max"] == 6  # not yet
    rnd = s.step()
    assert rnd.events[0].kind == "knobs_changed"
    assert rnd.events[0].knobs["draft_max"] == 2 and rnd.events[0].previous_knobs["draft_max"] == 6
    assert s.knobs["draft_max"] == 2
    assert len(rnd.of_kind("draft_proposed")[0].tokens) <= 2
    s.configure(strategy="ngram-simple", size_n=1)
    rnd = s.step()
    assert rnd.events[0].strategy == "ngram-simple" and s.strategy == "ngram-simple"
    assert s.knobs["draft_max"] == 2  # shared knobs carry over a strategy switch


# -- snapshots ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", DRAFTLESS)
def test_snapshot_round_trip_continues_identically(tiny_session, tiny_model, strategy):
    s = tiny_session
    s.start("the a of the a of the a of", 50, strategy, **eager(strategy))
    s.run(max_rounds=4)
    blob = s.snapshot()
    s.run()
    original = list(s.tokens)
    original_events = [e.to_dict() for e in s.events]
    n_before = len(original_events)
    r = Session.restore(blob, model=tiny_model)
    assert r.kv_length == r.committed
    r.run()
    assert r.tokens == original
    # the restored rounds publish the same drafts as the original's rounds did
    restored_drafts = [e.to_dict()["tokens"] for e in r.events if e.kind == "draft_proposed"]
    orig_drafts = [e["tokens"] for e in original_events if e["kind"] == "draft_proposed"]
    assert restored_drafts == orig_drafts[len(orig_drafts) - len(restored_drafts) :]
    assert n_before > 0
    r.ctx.close()


def test_snapshot_restore_into_same_session(tiny_session):
    s = tiny_session
    s.start("the a the a", 30, "prompt-lookup", **eager("prompt-lookup"))
    s.run(max_rounds=3)
    blob = s.snapshot()
    s.run()
    first = list(s.tokens)
    s.start("completely different", 5, "none")
    s.run()
    s.restore_into(blob)
    s.run()
    assert s.tokens == first


@pytest.mark.parametrize("where", ["header", "middle", "end", "truncate"])
def test_corrupted_snapshots_are_refused(tiny_session, tiny_model, where):
    s = tiny_session
    s.start("the a the a", 20, "prompt-lookup")
    s.step()
    blob = bytearray(s.snapshot())
    if where == "truncate":
        blob = blob[: len(blob) // 2]
    else:
        i = {"header": 30, "middle": len(blob) // 2, "end": len(blob) - 5}[where]
        blob[i] ^= 0x55
    with pytest.raises(SnapshotError):
        Session.restore(bytes(blob), model=tiny_model)
    with pytest.raises(SnapshotError):
        s.restore_into(bytes(blob))
    s.run()
    assert s.finished == "max_tokens"


def test_snapshot_from_another_model_is_refused(tiny_session, tmp_path):
    from specviz.testing.tiny_models import write_tiny_llama

    other = write_tiny_llama(tmp_path / "other.gguf", seed=9, vocab_size=300)
    s = tiny_session
    s.start("the a", 10, "none")
    blob = s.snapshot()
    with pytest.raises(SnapshotError, match="model"):
        Session.restore(blob, model=other)


def _steady(d: dict) -> dict:
    """A telemetry dictionary without the process's memory (read at slightly different moments)."""
    out = dict(d)
    out["memory"] = {k: v for k, v in d["memory"].items() if k not in ("rss_bytes", "peak_rss_bytes")}
    return out


@pytest.mark.parametrize("policy", ["fixed", "adaptive", "cost"])
def test_telemetry_events_read_later_say_what_held_after_their_round(tiny_session, policy):
    """A round's telemetry event builds its dictionary on first read (issue 26): read rounds later, it
    still says what telemetry_dict() said when the round ended, not what holds when it is read. The
    policy's part too: the cost policy's estimates, counters and verify cost change every round, and the
    event describes them from the state its checkpoint keeps and the cost's points taken then."""
    at_emit: dict[int, dict] = {}
    policy_at_emit: dict[int, dict] = {}

    def note(ev):
        if isinstance(ev, TelemetryEvent):
            at_emit[ev.round] = _steady(tiny_session.telemetry_dict())
            policy_at_emit[ev.round] = tiny_session.generation.policy.describe()  # now, not through the view

    tiny_session.subscribe(note)
    tiny_session.start(
        "the quick brown fox jumps over the lazy dog", 24, "prompt-lookup", draft_max=4, draft_policy=policy
    )
    tiny_session.run()
    events = [e for e in tiny_session.events if isinstance(e, TelemetryEvent)]
    assert len(events) == tiny_session.round_index >= 4
    described = [e.data["policy"] for e in events]
    assert all(d["name"] == policy for d in described)
    if policy != "fixed":  # what is described changed between rounds, so a stale description would differ
        assert len({repr(d) for d in described}) > 1
    assert [e.data["rounds"] for e in events] == list(range(1, len(events) + 1))
    for e in events:
        assert _steady(e.data) == at_emit[e.round]
        assert e.data["policy"] == policy_at_emit[e.round]
    if policy == "cost":
        assert all(d["verify_cost"] is not None for d in described[1:])
    last = events[-1]
    assert pickle.loads(pickle.dumps(events[0])).data == events[0].data  # pickling builds it first
    assert copy.deepcopy(last) == last and last.to_dict()["data"]["rounds"] == len(events)
    assert TelemetryEvent(3, data={"rounds": 3}).data == {"rounds": 3}  # made whole, as before
    with pytest.raises(AttributeError):
        _ = last.no_such_field


@pytest.mark.parametrize("strategy", ["none", "prompt-lookup"])
@pytest.mark.slow
def test_a_round_leaves_few_objects_for_the_garbage_collector(tiny_model, strategy):
    """What the session keeps of every round (its events, its checkpoint, its telemetry view) lives in
    CPython's oldest generation, which a full collection walks whole, and the next full collection comes
    once a quarter as much again has survived: each object a round keeps costs time in every later round.
    The telemetry view as closures and the counters' copies as lists kept 39 objects a round; now it is
    one per event, the checkpoint, the three views and the counters' dictionaries: 11.0 a round for
    ``none`` and 12.3 for prompt-lookup here. One more closure a round (a function, a cell, their tuple)
    takes either above the bound."""
    import gc

    s = Session(tiny_model, n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1)
    s.start("a b a b a b a b a b", 48, strategy, **EAGER[strategy])
    s.step()  # the first round sets up what every generation keeps once
    gc.collect()
    before = len(gc.get_objects())
    rounds = 0
    while s.finished is None:
        s.step()
        rounds += 1
    gc.collect()
    per_round = (len(gc.get_objects()) - before) / rounds
    assert rounds >= 8
    assert per_round <= 13, f"{per_round:.1f} objects tracked by the garbage collector kept a round"
