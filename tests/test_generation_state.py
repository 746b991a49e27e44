"""Every piece of a generation's state survives a snapshot and comes back with a rewind.

A session keeps everything of one generation in a :class:`~specviz.decoding.generation.Generation`. These
tests go over its fields, so a field added there that snapshots or rewinds leave behind fails here, and a
field the scenarios do not exercise fails too (extend the scenario so the new state takes a non-default
value, or say below why a snapshot or a rewind leaves it alone).
"""

from __future__ import annotations

import dataclasses

import pytest

from specviz import Session
from specviz.decoding.events import Rewound
from specviz.decoding.generation import Generation

PROMPT = "the cat of the dog and the a the cat of the"
FIELDS = {f.name for f in dataclasses.fields(Generation)}

#: Fields a snapshot does not carry, and why.
NOT_IN_SNAPSHOTS = {
    "last_result": "the plain result of the last round run; a restored session has run none",
    "prefilled": "a snapshot holds the committed cache (the header says whether the pending token was in it); "
    "the restoring session's own prefill decides whether its first round reads the prompt's row again "
    "(tests/test_prefill_layout.py)",
}

#: Fields nothing changes after ``start`` (the request's settings): a rewind has nothing to bring back.
SET_AT_START = {"n_prompt", "max_tokens", "sampling", "seed", "started", "stop"}
#: Fields a rewind sets rather than restores, and why.
NOT_RESTORED_BY_REWIND = {
    "last_result": "a rewind leaves no last round (None)",
    "events": "the later rounds' events are dropped and the Rewound event is appended (checked apart)",
    "prefilled": "true only from a whole-prompt start to its first round; a rewind to the start sets it by "
    "evaluating the prompt again (tests/test_prefill_layout.py)",
}


def plain(v):
    """A comparable form of a field's value (objects by their saved state)."""
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    state = getattr(v, "state", None)
    if callable(state):
        return (type(v).__name__, state())
    to_dict = getattr(v, "to_dict", None)
    if callable(to_dict):
        return (type(v).__name__, to_dict())
    return v


def fields_of(g: Generation) -> dict:
    return {name: plain(getattr(g, name)) for name in FIELDS}


DEFAULTS = fields_of(Generation())


#: A grammar that allows every token with text (its state is the generation's too).
ANY_TEXT = "root ::= [^\\x00]*"


def start(s: Session) -> None:
    s.start(
        PROMPT,
        40,
        "ngram-simple",
        temperature=0.7,
        seed=5,
        stop=["zzz"],
        grammar=ANY_TEXT,
        draft_policy="adaptive",
        size_n=2,
        size_m=6,
    )


def test_a_snapshot_carries_every_field_of_the_generation(tiny_session, tiny_model):
    s = tiny_session
    start(s)
    s.run()  # to the end: the finish reason is state too
    s.configure("prompt-lookup", draft_max=3)  # a change queued for a round that has not come
    before = fields_of(s.generation)
    exercised = {k for k in FIELDS - set(NOT_IN_SNAPSHOTS) if before[k] != DEFAULTS[k]}
    assert exercised == FIELDS - set(NOT_IN_SNAPSHOTS), "the scenario leaves some fields at their defaults"
    restored = Session.restore(s.snapshot(), model=tiny_model)
    try:
        after = fields_of(restored.generation)
        lost = {k: (before[k], after[k]) for k in FIELDS - set(NOT_IN_SNAPSHOTS) if before[k] != after[k]}
        assert not lost, f"a snapshot does not carry {sorted(lost)}"
    finally:
        restored.close()


def test_a_rewind_brings_back_every_field_a_generation_changes(tiny_session):
    s = tiny_session
    start(s)
    s.run(2)
    at_round_2 = fields_of(s.generation)
    s.configure("ngram-cache", draft_policy="fixed")
    s.run(2)
    s.cancel()
    s.step()  # finished: cancelled
    s.configure(draft_max=2)  # queued, and discarded by the rewind
    moved = fields_of(s.generation)
    changing = FIELDS - SET_AT_START - set(NOT_RESTORED_BY_REWIND)
    assert not SET_AT_START & set(NOT_RESTORED_BY_REWIND)
    assert {k for k in SET_AT_START if moved[k] != at_round_2[k]} == set(), "a field set at start changed later"
    assert {k for k in changing if moved[k] == at_round_2[k]} == set(), "the scenario leaves some fields unchanged"
    ev = s.rewind(2)
    after = fields_of(s.generation)
    lost = {k: (at_round_2[k], after[k]) for k in changing | SET_AT_START if after[k] != at_round_2[k]}
    assert not lost, f"a rewind does not bring back {sorted(lost)}"
    assert s.events[-1] is ev and isinstance(ev, Rewound)
    assert plain(s.events[:-1]) == at_round_2["events"]
    assert s.generation.last_result is None


#: The fields a session shows as its own read-only attributes (what users read); the others are read on
#: ``session.generation``.
SHOWN = {"history", "n_prompt", "max_tokens", "strategy", "knobs", "round_index", "finished", "started", "events"}


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_each_field_is_the_sessions_read_only_attribute(tiny_session, name):
    # the session's public attributes of a generation are views of the generation, never a second copy
    start(tiny_session)
    if name not in SHOWN:
        assert not hasattr(tiny_session, name), f"{name} is the generation's: read it as session.generation.{name}"
        return
    assert getattr(tiny_session, name) is getattr(tiny_session.generation, name)
    with pytest.raises(AttributeError):
        setattr(tiny_session, name, getattr(tiny_session, name))


def test_a_session_keeps_no_generation_state_outside_its_generation(tiny_session):
    # a session's own attributes live as long as it does; anything of one generation belongs in Generation
    # (where snapshots and rewinds meet it). A new attribute here must be one or the other.
    s = tiny_session
    start(s)
    s.run(3)
    lifetime = {
        "model",
        "ctx",
        "_ctx_args",
        "_prefill",  # how the session evaluates a prompt: fixed when it is made, as the context is
        "draft_models",
        "_subscribers",
        "_lock",
        "_cancel",
        "record_margins",
        "cost_model",  # a measurement of the machine, kept across generations on purpose
        # the thermal and clock sampler: an instrument reading the machine's sensors over the session's running
        # time (start() restarts it); a rewind or a snapshot has no sensor reading to bring back
        "machine",
        "rng",  # one generator object (drafters hold it); its state is the generation's, in each checkpoint
        "drafter",
        "_scanner",  # a cache of the stop strings' scanner
        "generation",
    }
    assert set(vars(s)) == lifetime
