"""Grammars and JSON schemas through llama.cpp's grammar sampler, and lossless verification under them.

A grammar refused by llama.cpp (or a schema its converter refuses) is a typed error with llama.cpp's reason
and line, before any model loads; under a grammar, greedy speculation gives exactly plain constrained greedy
decoding (a reference loop here masks every row over the whole vocabulary), sampled speculation keeps the
constrained distribution, and the grammar's state follows rewinds and snapshots.
"""

from __future__ import annotations

import numpy as np
import pytest
from stat_helpers import chi2_critical, chi2_stat

from specviz import Session
from specviz.backends.grammar import GrammarSampler, check_gbnf, gbnf_from_json_schema
from specviz.decoding.acceptor import accept
from specviz.decoding.constrained import GrammarState
from specviz.decoding.request import request_grammar
from specviz.decoding.sampling import SamplingParams, probs_from_logits
from specviz.errors import GrammarError, SessionStateError

#: Words of the tiny model's vocabulary (SentencePiece pieces: "▁the" is " the"), in a loop the n-gram
#: drafters can follow.
WORDS = 'root ::= (" the" | " a" | " of" | " and" | " to" | " in" | " cat" | " dog")+'
PROMPT = "the cat of the dog and the a the cat of the"


@pytest.mark.parametrize(
    "gbnf,reason,line",
    [
        ('root ::= "a" |\n  foo', "Undefined rule identifier 'foo'", 2),
        ('root ::= "a" (\nb ::= "c"', "expecting ')'", 2),
        ('root ::= "a"\nb ::= "c" )\nc ::= "x"', "expecting newline or end", 2),
        ('x ::= "a"', "grammar does not contain a 'root' symbol", None),
    ],
)
def test_a_grammar_llama_cpp_refuses_is_a_typed_error_with_its_reason_and_line(gbnf, reason, line):
    with pytest.raises(GrammarError) as e:
        check_gbnf(gbnf)
    assert reason in e.value.reason and e.value.line == line
    assert reason in str(e.value) and e.value.knob == "grammar"


@pytest.mark.parametrize(
    "schema,reason,line",
    [
        ('{"type": "object",\n "properties": {', "Expecting property name", 2),
        ('{"$ref": "https://example.com/s.json"}', "Fetching remote schemas is not allowed", None),
        ("[1, 2]", "not an object", None),
    ],
)
def test_a_schema_the_converter_refuses_is_a_typed_error(schema, reason, line):
    with pytest.raises(GrammarError) as e:
        gbnf_from_json_schema(schema)
    assert reason in e.value.reason and e.value.line == line and e.value.knob == "json_schema"


def test_a_request_takes_one_grammar_or_one_schema():
    assert request_grammar(None, None) is None
    assert request_grammar(WORDS, None) == WORDS
    assert "root ::=" in (request_grammar(None, {"type": "string"}) or "")
    with pytest.raises(GrammarError, match="not both"):
        request_grammar(WORDS, {"type": "string"})


def word(model, w: str) -> int:
    """The tiny vocabulary's token of the word `` w`` (the piece ``▁w``)."""
    return next(t for t in range(model.n_vocab) if model.token_text(t) == "\u2581" + w)


def test_the_sampler_masks_accepts_and_clones(tiny_model):
    g = GrammarSampler(tiny_model.vocab, tiny_model.n_vocab, 'root ::= " the" " cat"')
    row = np.zeros(tiny_model.n_vocab, np.float32)
    assert g.mask(row)
    allowed = {int(t) for t in np.flatnonzero(np.isfinite(row))}
    the = [word(tiny_model, "the")]
    assert the[0] in allowed and all(g.allows(t) for t in allowed)
    assert not any(g.allows(t) for t in range(tiny_model.n_vocab) if t not in allowed)
    copy = g.clone()
    copy.accept(the[0])
    assert g.allows(the[0]) and not copy.allows(the[0])  # the copy moved on, the original did not
    with pytest.raises(GrammarError, match="not allowed"):
        copy.accept(the[0])  # refused in Python: llama.cpp would abort
    copy.close()
    g.close()


def constrained_greedy(s: Session, gbnf: str, prompt: str, n: int) -> list[int]:
    """Plain grammar-constrained greedy decoding, one token a batch, every row masked over the whole
    vocabulary: the reference the speculative runs must equal."""
    model, ctx = s.model, s.ctx
    ids = model.tokenize(prompt, add_special=True)
    state = GrammarState(model, gbnf)
    ctx.clear()
    ctx.eval_prompt(ids[:-1], 0)
    out: list[int] = []
    pending = ids[-1]
    for _ in range(n):
        ctx.eval([pending], len(ids) - 1 + len(out), rows="all")
        row = np.array(ctx.row(0))
        assert state.sampler.mask(row)
        tok = int(np.argmax(row))
        if model.is_eog(tok):
            break
        state.advance([tok])
        out.append(tok)
        pending = tok
    state.close()
    return out


@pytest.mark.parametrize("strategy", ["ngram-simple", "prompt-lookup", "ngram-cache"])
def test_greedy_speculation_under_a_grammar_is_plain_constrained_greedy(tiny_session, strategy):
    s = tiny_session
    s.start(PROMPT, 40, "none", grammar=WORDS)
    s.run()
    plain = list(s.tokens)
    s.start(PROMPT, 40, strategy, grammar=WORDS)
    s.run()
    assert s.tokens == plain
    assert s.telemetry_dict()["drafted"] > 0, "the scenario drafts nothing"
    assert plain == constrained_greedy(s, WORDS, PROMPT, 40)
    words = s.text.split()[:-1]  # the last may be cut by the token limit (" c" of " cat")
    assert words and all(w in {"the", "a", "of", "and", "to", "in", "cat", "dog"} for w in words)


def test_a_rewind_and_a_snapshot_carry_the_grammars_state(tiny_session, tiny_model):
    s = tiny_session
    started = s.start(PROMPT, 40, "ngram-simple", grammar=WORDS)
    assert started.grammar == WORDS  # recordings say which grammar the tokens obey
    s.run()
    whole = list(s.tokens)
    s.rewind(3)
    assert s.generation.grammar is not None
    assert s.generation.grammar.n_tokens == len(s.tokens)
    s.run()
    assert s.tokens == whole
    s.rewind(2)
    fork = s.fork()  # a fork is a snapshot restored beside the session: its grammar state goes with it
    try:
        fork.run()
        assert fork.tokens == whole
    finally:
        fork.close()
    blob = s.snapshot()
    other = Session.restore(blob, model=tiny_model)
    try:
        assert other.generation.grammar is not None and other.generation.grammar.gbnf == WORDS
        other.run()
        assert other.tokens == whole
    finally:
        other.close()


def test_a_refused_grammar_leaves_the_generation_as_it_was(tiny_session):
    s = tiny_session
    s.start(PROMPT, 6, "none", grammar=WORDS)
    s.run()
    before = (list(s.history), s.generation.grammar)
    with pytest.raises(GrammarError, match="Undefined rule identifier 'y'"):
        s.start(PROMPT, 6, "none", grammar="root ::= y")
    with pytest.raises(GrammarError, match="not both"):
        s.check_start(PROMPT, 6, "none", grammar=WORDS, json_schema={"type": "string"})
    assert (list(s.history), s.generation.grammar) == before


def test_a_grammar_with_no_allowed_token_ends_with_the_position_and_the_session_usable(tiny_session):
    s = tiny_session
    # after " the" the grammar asks for a NUL character, which no token gives (llama.cpp refuses a piece that
    # starts with one): the round after " the" has no allowed token
    gbnf = 'root ::= " the" [\\x00]'
    s.start(PROMPT, 8, "none", grammar=gbnf)
    with pytest.raises(GrammarError) as e:
        s.run()  # " the" (in one token or in several), then the dead end
    at = e.value.position
    assert at == len(s.history) and s.tokens and s.text == " the"  # the position after " the"
    assert s.finished == "error" and s.events[-1].kind == "finished"
    assert s.kv_length == len(s.history) - 1  # the cache holds what the history says: nothing was committed
    assert s.round_index == s.events[-1].round  # the refused round is not counted
    with pytest.raises(SessionStateError):
        s.step()
    s.rewind(1)  # the session is usable: back to an earlier round, and a new generation
    assert s.finished is None and s.generation.grammar is not None
    s.start(PROMPT, 4, "none")
    s.run()
    assert len(s.tokens) > 0


def _sampled_counts(tiny_model, gbnf: str, rows, draft, draws: int):
    """Committed tokens over ``draws`` sampled rounds of ``draft`` on copies of ``rows``, constrained by
    ``gbnf``: the first committed token's counts, and the second's given the first."""
    n = tiny_model.n_vocab
    params = SamplingParams(1.0)
    state = GrammarState(tiny_model, gbnf)
    rng = np.random.default_rng(7)
    first = np.zeros(n, np.int64)
    second = np.zeros((n, n), np.int64)
    for _ in range(draws):
        fresh = [r.copy() for r in rows]
        out = accept(draft, state.rows(draft, fresh.__getitem__, False), params, rng)
        first[out.tokens[0]] += 1
        if len(out.tokens) >= 2:
            second[out.tokens[0], out.tokens[1]] += 1
    return first, second


def _masked_probs(tiny_model, gbnf: str, row, before=()):
    state = GrammarState(tiny_model, gbnf, before)
    r = row.copy()
    state.sampler.mask(r)
    return probs_from_logits(r, SamplingParams(1.0)).to_dense()


@pytest.mark.slow
def test_sampled_speculation_under_a_grammar_keeps_the_constrained_distribution(tiny_model):
    n = tiny_model.n_vocab
    gbnf = 'root ::= (" the" | " a" | " of") (" and" | " to" | " in")'
    the, to, of = (word(tiny_model, w) for w in ("the", "to", "of"))
    gen = np.random.default_rng(3)
    rows = [(gen.standard_normal(n) * 1.5).astype(np.float32) for _ in range(3)]
    for r in rows:  # the words' tokens likely enough that every case is seen often
        r[[the, to, of]] += 4.0
    # a deterministic draft: its first token allowed, its second forbidden after it (" of" after " the")
    first, second = _sampled_counts(tiny_model, gbnf, rows, [the, of], 20000)
    stat, df = chi2_stat(first, _masked_probs(tiny_model, gbnf, rows[0]))
    assert stat < chi2_critical(df), (stat, df)
    # after the draft's first token, the correction at the forbidden second follows row 1 under the grammar
    # (the draft token " of" has no mass there: every second token is an allowed one)
    assert second[the].sum() > 2000
    stat, df = chi2_stat(second[the], _masked_probs(tiny_model, gbnf, rows[1], [the]))
    assert stat < chi2_critical(df), (stat, df)
