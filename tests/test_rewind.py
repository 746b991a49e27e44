"""Rewind and fork (specviz.decoding.rewind) on tiny real GGUF models: every strategy, refused rewinds, independence."""

from __future__ import annotations

import pytest
from conftest import TINY
from test_session import plain_reference

from specviz import Session, strategy_names
from specviz.decoding.events import Rewound, event_from_dict
from specviz.decoding.rewind import effective_events
from specviz.errors import RewindError, SessionStateError
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

PROMPT = "the cat of the dog and the a the cat of the"


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory):
    """A one-layer draft that reuses the tiny target's embedding, output and first block."""
    w = tiny_weights(seed=TINY["seed"], block_scale=TINY["block_scale"])
    return write_tiny_llama(tmp_path_factory.mktemp("draft") / "draft.gguf", n_layer=1, layers_from=w)


def knobs_for(strategy, draft_path):
    k = {"draft_max": 6}
    if strategy == "draft":
        k.update(draft_model=str(draft_path), draft_p_min=0.0)
    if strategy in ("ngram-simple", "ngram-map-k", "ngram-map-k4v"):
        k.update(size_n=2, size_m=6, check_rate=2)
    if strategy == "ngram-mod":
        k.update(n_match=3, n_min=1, n_max=8, pool_size=4096, low_accept_streak=2)
    return {} if strategy == "none" else k


def round_view(rnd):
    """What a round did, without timings: draft, verdict tokens, committed tokens, rollbacks."""
    d = rnd.of_kind("draft_proposed")[0]
    a = rnd.of_kind("accepted")[0]
    return (
        tuple(d.tokens),
        d.limit,
        tuple(a.tokens),
        a.n_accepted,
        tuple((e.context, e.from_pos, e.to_pos) for e in rnd.of_kind("kv_rollback")),
    )


def check_caches(s):
    assert s.kv_length == s.committed
    if s.drafter.has_context and s.strategy not in HIDDEN_STATE:  # those catch up at their next draft
        assert s.drafter.kv_length() == s.committed


#: Drafters of the target's own hidden states need a target of their kind (below); the rest run on the fixture.
HIDDEN_STATE = ("eagle3", "mtp")
#: Block drafters read the target's layer inputs too (the eagle3 target, a DFlash draft); their cache keeps the
#: common prefix through a rewind, so it holds every committed position at once.
BLOCK = ("dflash", "dspark")


@pytest.fixture(scope="module")
def eagle3_pair(tmp_path_factory):
    """A 4-layer tiny target and a random EAGLE-3 head for it."""
    from specviz.testing.tiny_models import write_tiny_eagle3

    d = tmp_path_factory.mktemp("e3")
    target = write_tiny_llama(d / "target.gguf", seed=2, n_layer=4, block_scale=0.1)
    return target, write_tiny_eagle3(d / "head.gguf", target, seed=1)


@pytest.fixture(scope="module")
def nextn_path(tmp_path_factory):
    """A tiny model with a NextN layer whose output head is limited to two tokens (partly accepted drafts)."""
    from specviz.testing.tiny_models import write_tiny_nextn

    return write_tiny_nextn(tmp_path_factory.mktemp("mtp") / "nextn.gguf", seed=1, block_scale=0.05, binary=(300, 301))


@pytest.fixture(scope="module")
def dflash_heads(eagle3_pair):
    """A DFlash and a DSpark draft (with its confidence head) for the eagle3 pair's 4-layer target."""
    from specviz.testing.tiny_dflash import write_tiny_dflash

    target = eagle3_pair[0]
    return {
        "dflash": write_tiny_dflash(target.with_name("dflash.gguf"), seed=3, target_layers=(1, 3), block_size=6),
        "dspark": write_tiny_dflash(
            target.with_name("dspark.gguf"), seed=4, target_layers=(0, 2), block_size=5, dspark=True
        ),
    }


@pytest.mark.parametrize(
    "strategy", [s for s in strategy_names() if s not in HIDDEN_STATE + BLOCK] + list(HIDDEN_STATE + BLOCK)
)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_rewind_then_step_repeats_the_original_continuation(tiny_model, draft_path, strategy, temperature, request):
    knobs = knobs_for(strategy, draft_path)
    model: object = tiny_model
    prompt: object = PROMPT
    if strategy == "eagle3":
        target, head = request.getfixturevalue("eagle3_pair")
        model, knobs = str(target), {"draft_model": str(head), "draft_p_min": 0.0, "draft_max": 5}
    elif strategy == "mtp":
        model, prompt = str(request.getfixturevalue("nextn_path")), [1, 50, 60, 70, 80]
        knobs = {"draft_p_min": 0.0, "draft_max": 4}
    elif strategy in BLOCK:
        target = request.getfixturevalue("eagle3_pair")[0]
        head = request.getfixturevalue("dflash_heads")[strategy]
        model, knobs = str(target), {"draft_model": str(head), "draft_p_min": 0.0, "draft_max": 5}
    s = Session(model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        s.start(prompt, 60, strategy, temperature=temperature, seed=7, **knobs)
        original = [round_view(r) for r in s.run()]
        tokens, tel = list(s.tokens), s.telemetry_dict()
        n_rounds = s.round_index
        assert n_rounds >= 4
        for back_to in (n_rounds // 2, 1, 0, n_rounds - 1):
            ev = s.rewind(back_to)
            assert isinstance(ev, Rewound) and ev.round == back_to and s.round_index == back_to
            assert s.finished is None
            check_caches(s)
            assert s.generation.telemetry.rounds == back_to
            assert all(e.round <= back_to for e in s.events[:-1]) and s.events[-1] is ev
            again = [round_view(r) for r in s.run()]
            assert again == original[back_to:], f"rewind to round {back_to} did not repeat the continuation"
            assert s.tokens == tokens
            t2 = s.telemetry_dict()
            for k in (
                "rounds",
                "drafted",
                "accepted",
                "n_generated",
                "per_position_tries",
                "draft_buckets",
                "accepted_length_histogram",
            ):
                assert t2[k] == tel[k], k
            assert t2["strategy_stats"]["tokens_generated"] == tel["strategy_stats"]["tokens_generated"]
            check_caches(s)
        if temperature == 0.0:
            assert tokens == plain_reference(s.model, s.prompt_tokens, len(tokens))
    finally:
        s.close()


@pytest.mark.parametrize("strategy", ["prompt-lookup", "draft", "ngram-map-k4v"])
def test_rewind_to_a_position_inside_a_round(tiny_model, draft_path, strategy):
    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        s.start(PROMPT, 50, strategy, **knobs_for(strategy, draft_path))
        rounds = s.run()
        tokens = list(s.tokens)
        # a round that committed several tokens: go to the middle of it
        r = next(r for r in rounds if len(r.new_tokens) >= 3)
        start = r.of_kind("accepted")[0].position
        ev = s.rewind(position=start + 1)
        assert ev.round == r.index - 1 and ev.position == start + 1 and list(ev.kept_tokens) == [r.new_tokens[0]]
        assert len(s.history) == start + 1 and s.round_index == r.index - 1
        check_caches(s)
        s.run()
        assert s.tokens == tokens  # greedy: the same text, whatever the rounds look like now
        check_caches(s)
    finally:
        s.close()


def test_rewind_restores_the_strategy_and_knobs_of_that_round(tiny_session, draft_path):
    s = tiny_session
    s.start(PROMPT, 40, "prompt-lookup", draft_max=4)
    s.run(3)
    s.configure("draft", draft_model=str(draft_path), draft_p_min=0.0, draft_max=5)
    s.run(3)
    assert s.strategy == "draft"
    s.configure("ngram-cache", n_draft=3)  # queued, then discarded by the rewind
    s.rewind(2)
    assert s.strategy == "prompt-lookup" and s.knobs["draft_max"] == 4 and s.generation.pending is None
    assert not s.drafter.has_context
    check_caches(s)
    s.rewind(2)  # the current round: nothing to cut, still fine
    s.run()
    assert s.tokens == plain_reference(s.model, s.prompt_tokens, len(s.tokens))


@pytest.mark.parametrize(
    "bad",
    [
        dict(round=-1),
        dict(round=99),
        dict(position=2),
        dict(position=10_000),
        dict(round=1.5),
        dict(round=True),
        dict(),
        dict(round=1, position=20),
    ],
)
def test_refused_rewinds_change_nothing(tiny_session, bad):
    s = tiny_session
    s.start(PROMPT, 30, "prompt-lookup")
    s.run(4)
    before = (
        list(s.history),
        s.round_index,
        len(s.events),
        s.kv_length,
        s.generation.telemetry.state(),
        s.strategy,
        dict(s.knobs),
        list(s.generation.checkpoints),
        s.drafter,
        s.rng.bit_generator.state,
    )
    with pytest.raises(RewindError):
        s.rewind(**bad)
    after = (
        list(s.history),
        s.round_index,
        len(s.events),
        s.kv_length,
        s.generation.telemetry.state(),
        s.strategy,
        dict(s.knobs),
        list(s.generation.checkpoints),
        s.drafter,
        s.rng.bit_generator.state,
    )
    assert after == before
    s.run()  # still usable
    assert s.finished is not None


def test_rewind_before_start_is_refused(tiny_model):
    s = Session(tiny_model, n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1)
    try:
        with pytest.raises(SessionStateError):
            s.rewind(0)
        with pytest.raises(SessionStateError):
            s.fork()
    finally:
        s.close()


def test_rewound_event_round_trips_and_effective_events_match_the_session(tiny_session):
    s = tiny_session
    published = []
    s.subscribe(published.append)
    s.start(PROMPT, 40, "prompt-lookup")
    s.run(6)
    ev = s.rewind(3)
    s.run(2)
    s.rewind(position=len(s.history) - 1)
    s.run(1)
    d = ev.to_dict()
    assert d["kind"] == "rewound" and event_from_dict(d) == ev
    import json

    assert event_from_dict(json.loads(json.dumps(d))) == ev
    # a recording (every event as published) folds into the session's own list
    assert effective_events(published) == s.events


def test_fork_is_independent_and_shares_the_models(tiny_model, draft_path):
    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        s.start(PROMPT, 40, "draft", draft_model=str(draft_path), draft_p_min=0.0, draft_max=4)
        s.run(4)
        f = s.fork()
        assert f.model is s.model and f.ctx is not s.ctx and f.drafter is not s.drafter
        assert f.drafter.model is s.drafter.model  # the draft model is loaded once
        assert f.history == s.history and f.round_index == s.round_index and len(f.events) == len(s.events)
        history, events = list(s.history), len(s.events)
        f.configure("prompt-lookup", draft_max=8)
        f.run()
        assert s.history == history and len(s.events) == events  # the original did not move
        check_caches(s)
        s.run()
        assert f.tokens == s.tokens  # greedy: both reach the same text, by different rounds
        assert f.strategy == "prompt-lookup" and s.strategy == "draft"
        f.rewind(1)  # the fork can go back before the branch point (it has the checkpoints)
        check_caches(f)
        f.close()
        s.rewind(2)
        s.run()  # the draft model still works after the fork was closed
        check_caches(s)
    finally:
        s.close()


def test_snapshot_carries_events_and_checkpoints(tiny_session, tiny_model):
    s = tiny_session
    s.start(PROMPT, 40, "ngram-map-k", size_n=2, size_m=6)
    s.run(5)
    blob = s.snapshot()
    r = Session.restore(blob, model=tiny_model)
    try:
        assert [e.to_dict() for e in r.events] == [e.to_dict() for e in s.events]
        r.rewind(2)
        s.rewind(2)
        assert [round_view(x) for x in r.run()] == [round_view(x) for x in s.run()]
    finally:
        r.close()


@pytest.mark.parametrize(
    ("strategy", "temperature", "shared"),
    [("prompt-lookup", 0.0, True), ("prompt-lookup", 0.8, False), ("draft", 0.0, False)],
)
def test_checkpoints_read_the_generator_unless_nothing_could_draw_from_it(
    tiny_model, draft_path, strategy, temperature, shared
):
    """A greedy round of a drafter without a model draws nothing from the session's generator, so its
    checkpoint shares the last one's state; a sampled round, or a drafter with a model of its own (which
    samples with the session's generator), reads it afresh. Either way every checkpoint holds the state
    the generator had after its round, which a rewind puts back."""
    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        s.start(PROMPT, 24, strategy, temperature=temperature, seed=3, **knobs_for(strategy, draft_path))
        states = []
        for _ in range(6):
            s.step()
            states.append(s.rng.bit_generator.state)
            assert s.generation.checkpoints[-1].rng == states[-1]
        cks = s.generation.checkpoints[-6:]
        assert all((a.rng is b.rng) == shared for a, b in zip(cks, cks[1:]))
        s.rewind(3)
        assert s.rng.bit_generator.state == states[2]
    finally:
        s.close()
