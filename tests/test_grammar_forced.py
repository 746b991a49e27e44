"""Forced tokens under a grammar and the ``grammar`` drafter.

The forced-token test (:mod:`specviz.decoding.forced`) reads a few hundred texts, never the whole vocabulary;
here it is checked against the whole-vocabulary mask (llama.cpp's grammar over every token) at every state
of walks through small grammars on the tiny model's byte-fallback vocabulary, and on a hand-worked grammar.
The drafter drafts the forced continuation, chains in front of the n-gram drafters, and leaves greedy
output exactly plain constrained greedy; forced positions and grammar-forbidden rejections reach the events.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_grammar import PROMPT, WORDS, constrained_greedy, word
from test_grammar_server import PROMPT as JSON_PROMPT
from test_grammar_server import SCHEMA as JSON_SCHEMA

from specviz import Session
from specviz.analysis.diagnose import diagnose
from specviz.backends.grammar import GrammarSampler, gbnf_from_json_schema
from specviz.decoding.batch import check_batchable
from specviz.decoding.constrained import GrammarState
from specviz.decoding.events import Accepted, DraftProposed, Rejected, event_from_dict
from specviz.decoding.forced import forced_bytes, forced_token, tokens_of, vocab_index
from specviz.strategies import resolve_strategy, spec_type, strategy_class
from specviz.strategies.grammar import GrammarDrafter, give_grammar

#: A grammar whose first three tokens are forced on the tiny vocabulary: "Q" has no token of its own (only
#: the byte token <0x51>), "é" is two bytes with byte tokens only; then free words, then " end" to finish.
LITERAL = 'root ::= "Qé" (" the" | " cat" | " dog")+ " end"'
SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "tag": {"type": "string", "enum": ["cat", "dog"]}},
    "required": ["id", "tag"],
}


def byte_token(b: int) -> int:
    """The tiny vocabulary's byte-fallback token of byte ``b`` (after <unk>, <s>, </s>)."""
    return 3 + b


def allowed_by_mask(g: GrammarSampler, n_vocab: int) -> list[int]:
    """Every token the grammar allows, through llama.cpp's grammar over the whole vocabulary."""
    row = np.zeros(n_vocab, np.float32)
    g.mask(row)
    return [int(t) for t in np.flatnonzero(np.isfinite(row))]


def test_hand_worked_forced_positions(tiny_model):
    g = GrammarSampler(tiny_model.vocab, tiny_model.n_vocab, 'root ::= "Qé" " the"')
    index = vocab_index(tiny_model)
    forced = []
    for tok in [byte_token(0x51), byte_token(0xC3), byte_token(0xA9), word(tiny_model, "the")]:
        forced.append(forced_token(g, index))
        g.accept(tok)
    # Q, then é's two bytes, each the only token allowed; " the" can be written " the", " t" + "he" ...
    assert forced == [byte_token(0x51), byte_token(0xC3), byte_token(0xA9), None]
    assert forced_token(g, index) == tiny_model.eos  # only the end is left
    g.close()


def test_the_forced_continuation_is_the_literal_written_longest_first(tiny_model):
    state = GrammarState(tiny_model, 'root ::= "Qé" " the"')
    the = word(tiny_model, "the")
    assert forced_bytes(state.sampler.clone(), state.index, 64) == "Qé the".encode()
    assert tokens_of(" the".encode(), state.index) == [the]
    assert state.forced_continuation(8) == [byte_token(0x51), byte_token(0xC3), byte_token(0xA9), the]
    assert state.forced_continuation(2) == [byte_token(0x51), byte_token(0xC3)]
    state.advance([byte_token(0x51)])
    assert state.forced_continuation(8) == [byte_token(0xC3), byte_token(0xA9), the]
    state.close()


def test_a_last_forced_token_the_target_could_write_longer_is_not_drafted(tiny_model):
    # after "Q" the grammar forces " t", then "he" or "o": the target may write " the" or " to" in one token
    state = GrammarState(tiny_model, 'root ::= "Q t" ("he" | "o")')
    assert state.forced_continuation(8) == [byte_token(0x51)]
    state.close()


def walk(model, gbnf: str, steps: int, seed: int):
    """States along a random walk of allowed tokens through ``gbnf``: (state, the mask's allowed tokens)."""
    rng = np.random.default_rng(seed)
    g = GrammarSampler(model.vocab, model.n_vocab, gbnf)
    for _ in range(steps):
        allowed = allowed_by_mask(g, model.n_vocab)
        yield g, allowed
        free = [t for t in allowed if not model.is_eog(t)]
        if not free:
            break
        g.accept(int(rng.choice(free)))
    g.close()


@pytest.mark.slow
@pytest.mark.parametrize("gbnf", [LITERAL, WORDS, "json", 'root ::= [a-c]+ "xé" | "x" [0-9] "q"'])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forced_tokens_and_text_equal_the_whole_vocabulary_mask(tiny_model, gbnf, seed):
    if gbnf == "json":
        gbnf = gbnf_from_json_schema(SCHEMA)
    index = vocab_index(tiny_model)
    for g, allowed in walk(tiny_model, gbnf, 30, seed):
        assert forced_token(g, index) == (allowed[0] if len(allowed) == 1 else None)
        text = forced_bytes(g.clone(), index, 32)
        pieces = [tiny_model.piece_bytes(t) for t in allowed if not tiny_model.is_eog(t)]
        if text:  # every allowed token agrees with the forced text as far as both go; the grammar may not end
            assert not any(tiny_model.is_eog(t) for t in allowed)
            assert all(p[: len(text)] == text[: len(p)] for p in pieces)
        elif pieces and not any(tiny_model.is_eog(t) for t in allowed):
            assert len({p[:1] for p in pieces}) > 1  # the next byte is not forced


def test_the_drafter_drafts_the_forced_continuation_and_nothing_without_a_grammar(tiny_model):
    d = GrammarDrafter()
    assert d.draft([1, 2, 3], 4).reason == "no-grammar"
    state = GrammarState(tiny_model, LITERAL)
    give_grammar(d, lambda: state)
    assert d.draft([1, 2, 3], 8).tokens == state.forced_continuation(8) == [84, 198, 172]
    state.advance([84, 198, 172])
    drafted = d.draft([1, 2, 3], 8)
    assert drafted.tokens == [] and drafted.reason == "not-forced"
    state.close()


def test_the_chain_puts_the_grammar_drafter_first_and_runs_batched():
    assert resolve_strategy("ngram-mod,grammar") == "grammar,ngram-mod"
    assert spec_type("grammar,ngram-mod") is None  # llama.cpp has no such drafter
    assert check_batchable("grammar,ngram-simple") == "grammar,ngram-simple"
    chain = strategy_class("grammar,ngram-simple")
    drafter = chain()
    state_of = []
    give_grammar(drafter, lambda: state_of[0] if state_of else None)
    assert isinstance(drafter.drafters[0], GrammarDrafter) and drafter.drafters[0].source is not None


@pytest.mark.parametrize("strategy", ["grammar", "grammar,ngram-simple", "grammar,prompt-lookup"])
def test_greedy_with_the_grammar_drafter_is_plain_constrained_greedy(tiny_session, strategy):
    s = tiny_session
    gbnf = 'root ::= "Qé" (" the" | " cat" | " of" | " dog" | " a")+'
    s.start(PROMPT, 30, "none", grammar=gbnf)
    s.run()
    plain = list(s.tokens)
    events = []
    s.start(PROMPT, 30, strategy, grammar=gbnf)
    s.subscribe(events.append)
    s.run()
    assert s.tokens == plain == constrained_greedy(s, gbnf, PROMPT, 30)
    drafts = [e for e in events if isinstance(e, DraftProposed) and e.drafter == "grammar"]
    assert drafts and drafts[0].tokens == (84, 198, 172)  # the forced "Qé", drafted in the first round
    accepted = [e for e in events if isinstance(e, Accepted)]
    assert accepted[0].n_accepted == 3 and accepted[0].forced == (0, 1, 2)


def test_forced_positions_and_grammar_rejections_reach_the_events_and_the_diagnosis(tiny_session):
    s = tiny_session
    events = []
    s.subscribe(events.append)
    # prompt-lookup copies the prompt's words; after "Qé" the grammar allows only " cat" and " dog" words
    s.start("Qé the of the a of the and" * 3, 30, "prompt-lookup", grammar='root ::= "Qé" (" cat" | " dog")+')
    s.run()
    accepted = [e for e in events if isinstance(e, Accepted)]
    assert accepted[0].forced == (0, 1, 2)
    rejected = [e for e in events if isinstance(e, Rejected)]
    forbidden = [e for e in rejected if e.grammar_forbidden]
    assert forbidden, "no draft token was forbidden by the grammar"
    for e in accepted + rejected:
        assert event_from_dict(json.loads(json.dumps(e.to_dict()))) == e
    dg = diagnose(events)
    impossible = sum(len(e.tokens) for e in forbidden)
    assert dg.grammar_impossible == impossible
    assert dg.to_dict()["grammar_impossible_share"] == pytest.approx(impossible / dg.drafted)
    assert any(f["key"] == "grammar" for f in dg.findings())
    assert "impossible under the grammar" in dg.text()


def test_events_without_a_grammar_mark_nothing(tiny_session):
    s = tiny_session
    events = []
    s.subscribe(events.append)
    s.start(PROMPT, 12, "ngram-simple")
    s.run()
    assert all(e.forced == () for e in events if isinstance(e, Accepted))
    assert all(e.grammar_forbidden is None for e in events if isinstance(e, Rejected))
    assert "grammar" not in diagnose(events).text()


def test_the_advice_for_llama_server_leaves_the_grammar_drafter_out_and_says_what_to_set():
    from specviz.analysis.advise_flags import GRAMMAR_NOTE, llama_flags
    from specviz.analysis.advise_search import Candidate

    flags, notes = llama_flags(Candidate("grammar,ngram-mod", 6, 1, None, 1, 1, 1), {"n_match": 24})
    assert flags.startswith("--spec-type ngram-mod ") and "grammar" not in flags
    assert GRAMMAR_NOTE in notes
    assert llama_flags(Candidate("grammar", 6, 0, None, 1, 1, 1), {}) == ("--spec-type none", [GRAMMAR_NOTE])


def test_the_telemetry_counts_forced_tokens_and_impossible_drafts(tiny_session):
    s = tiny_session
    events = []
    s.subscribe(events.append)
    s.start("Qé the of the a of the and" * 3, 30, "prompt-lookup", grammar='root ::= "Qé" (" cat" | " dog")+')
    s.run()
    t = s.telemetry_dict()
    forced = sum(len(e.forced) for e in events if isinstance(e, Accepted))
    impossible = sum(len(e.tokens) for e in events if isinstance(e, Rejected) and e.grammar_forbidden)
    assert t["forced"] == forced >= 3 and t["grammar_impossible"] == impossible > 0
    assert t["grammar_impossible_share"] == pytest.approx(impossible / t["drafted"])


def test_the_advice_on_a_recording_under_a_grammar_says_what_the_grammar_drafter_would_add(tiny_session):
    from specviz.analysis.advise import advise

    s = tiny_session
    events = []
    s.subscribe(events.append)
    s.start("Qé the of the a of the and" * 3, 30, "prompt-lookup", grammar='root ::= "Qé" (" cat" | " dog")+')
    s.run()
    notes = advise(events).flag_notes
    assert any("impossible" in n and "--spec-type grammar,prompt-lookup" in n for n in notes), notes


@pytest.mark.slow
@pytest.mark.embedded
def test_on_the_embedded_model_the_grammar_drafter_drafts_json_keys_and_leaves_greedy_output_as_it_was(
    embedded_model,
):
    s = Session(embedded_model, n_ctx=1024, n_threads=2)
    try:
        s.start(JSON_PROMPT, 64, "none", json_schema=JSON_SCHEMA)
        s.run()
        plain = list(s.tokens)
        events = []
        s.subscribe(events.append)
        s.start(JSON_PROMPT, 64, "grammar,ngram-simple", json_schema=JSON_SCHEMA, size_n=3, size_m=8, draft_max=8)
        s.run()
        assert s.tokens == plain
        by = s.telemetry_dict()["by_drafter"]["grammar"]
        assert by["drafted"] > 0 and by["accepted"] > 0
        drafted = {e.pieces for e in events if isinstance(e, DraftProposed) and e.drafter == "grammar"}
        assert any("age" in "".join(p) for p in drafted), drafted  # a key's name, once its quote is out
    finally:
        s.ctx.close()


def test_after_a_rewind_and_a_restore_the_grammar_drafter_reads_the_generations_state(tiny_session, tiny_model):
    s = tiny_session
    gbnf = 'root ::= "Qé" (" the" | " cat" | " of")+ " endQ"'
    s.start(PROMPT, 30, "grammar,ngram-simple", grammar=gbnf)
    s.run()
    whole = list(s.tokens)
    s.rewind(0)
    s.run()
    assert s.tokens == whole
    assert s.telemetry_dict()["by_drafter"]["grammar"]["accepted"] >= 3
    s.rewind(2)
    other = Session.restore(s.snapshot(), model=tiny_model)
    try:
        source = other.drafter.drafters[0].source
        assert source is not None and source() is other.generation.grammar
        other.run()
        assert other.tokens == whole
    finally:
        other.ctx.close()


def test_batched_requests_each_draft_their_own_grammars_forced_text(tiny_model_path):
    from specviz.decoding.batch import BatchRun

    grammars = ['root ::= "Qé" (" the" | " of")+', 'root ::= "é" (" cat" | " a")+ "Q"']
    ref = []
    with Session(tiny_model_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1) as s:
        for g in grammars:
            s.start(PROMPT, 20, "none", grammar=g)
            s.run()
            ref.append(list(s.tokens))
    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1) as b:
        for g in grammars:
            b.submit(PROMPT, 20, "grammar,ngram-simple", grammar=g)
        results = b.run()
    assert [r.tokens for r in results] == ref
    first = [next(e for e in r.events if isinstance(e, DraftProposed)).tokens for r in results]
    assert first == [(84, 198, 172), (198, 172)]  # each request's own forced bytes: "Qé" and "é"
