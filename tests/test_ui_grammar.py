"""The new-session form's grammar and JSON schema through the inspector core, as a page sends them: a Reset
starts the generation under llama.cpp's grammar (a schema converted by llama-cpp-python's converter), the
tokens it forces are marked in the events the page gets, and a grammar llama.cpp cannot parse (or a schema
it cannot convert) is refused with llama.cpp's reason shown in the page, nothing changed, the page usable."""

from __future__ import annotations

import json

import pytest
from declared_messages import sent_messages_are_declared  # noqa: F401 (an autouse fixture)
from test_grammar import PROMPT, WORDS
from test_grammar_forced import LITERAL
from test_grammar_forced import SCHEMA as TINY_SCHEMA
from test_ui_messages import Sink, error_shown, notices, snapshot

from specviz import Session
from specviz.backends.grammar import gbnf_from_json_schema
from specviz.server.pool import ManagedSession
from specviz.ui.core import InspectorCore


@pytest.fixture()
def live(tiny_model):
    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, max_tokens=12, strategy="prompt-lookup", draft_max=6)
    sink = Sink()
    core = InspectorCore(sink, s)
    yield core, sink
    core.close()
    s.close()


def reset(core, sink, **fields):
    n = len(sink.msgs)
    core.handle({"type": "cmd", "cmd": "reset", "max_tokens": 12, **fields})
    return sink.msgs[n:]


def started(core):
    return next(e for e in core.log if e["kind"] == "session_started")


def test_a_reset_with_a_grammar_starts_under_it_and_marks_what_it_forced(live):
    core, sink = live
    answer = reset(core, sink, grammar=LITERAL)
    assert not error_shown(answer), notices(answer)
    assert started(core)["grammar"] == LITERAL and core.session.generation.grammar.gbnf == LITERAL
    core.step(4)
    # "Qé" has byte tokens only: the grammar forces the first three tokens, and the page is told which
    n_prompt = len(started(core)["prompt_tokens"])
    sent = [ev for m in sink.msgs if m["type"] == "events" for ev in m["events"] if ev["kind"] == "accepted"]
    forced = {e["position"] + i for e in sent for i in e["forced"]}
    assert {n_prompt, n_prompt + 1, n_prompt + 2} <= forced
    assert core.session.text.startswith("Qé")


def test_a_reset_with_a_json_schema_converts_it_and_a_schema_stands_instead_of_the_grammar(live):
    core, sink = live
    schema = json.dumps(TINY_SCHEMA)
    answer = reset(core, sink, grammar=WORDS, json_schema=schema)
    assert not error_shown(answer), notices(answer)
    assert started(core)["grammar"] == gbnf_from_json_schema(schema)
    core.step(3)
    assert core.session.text.startswith("{")


def test_a_reset_keeps_the_grammar_unless_the_page_changes_it(live):
    core, sink = live
    reset(core, sink, grammar=WORDS)
    reset(core, sink)  # left out (the Python API, an older page): the shown generation's grammar stays
    assert started(core)["grammar"] == WORDS
    reset(core, sink, grammar="")  # the form's blank field: no grammar
    assert started(core)["grammar"] is None and core.session.generation.grammar is None


@pytest.mark.parametrize(
    "fields,text",
    [
        ({"grammar": 'root ::= "a" |\n  foo'}, "Undefined rule identifier 'foo' (line 2"),
        ({"grammar": 'root ::= ("a"'}, "expecting ')'"),
        ({"json_schema": '{"type": "objec"}'}, "could not convert the schema"),
        ({"json_schema": "{not json"}, "the schema is not JSON"),
        ({"grammar": "x" * 16001}, "GBNF text of at most 16000 characters"),
    ],
)
def test_a_grammar_llama_cpp_refuses_is_shown_and_changes_nothing(live, fields, text):
    core, sink = live
    reset(core, sink, grammar=WORDS)
    before, grammar = snapshot(core), core.session.generation.grammar
    answer = reset(core, sink, **fields, prompt="another prompt")
    assert error_shown(answer) and any(text in x for x in notices(answer)), answer
    assert snapshot(core) == before and core.session.generation.grammar is grammar
    # the page is still usable: a step runs a round under the old grammar, a good Reset starts anew
    assert core.step(1) == 1
    assert not error_shown(reset(core, sink, grammar=LITERAL))
    assert started(core)["grammar"] == LITERAL


@pytest.mark.slow
def test_a_server_lines_grammar_stands_where_the_form_gives_none(live, tmp_path):
    core, sink = live
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(TINY_SCHEMA))
    answer = reset(core, sink, grammar="", server_args=f"-jf {schema} --spec-type ngram-simple -c 512")
    assert not error_shown(answer), notices(answer)
    assert started(core)["grammar"] == gbnf_from_json_schema(TINY_SCHEMA)
    reset(core, sink, grammar=WORDS, server_args=f"-jf {schema} -c 512")  # the form's own grammar wins
    assert started(core)["grammar"] == WORDS


def test_a_served_page_starts_its_session_under_a_grammar(tiny_model):
    ms = ManagedSession(lambda: Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1))
    sink = Sink()
    core = InspectorCore(sink, ms, prompt=PROMPT)
    try:
        assert not error_shown(reset(core, sink, grammar=WORDS))
        assert started(core)["grammar"] == WORDS
        answer = reset(core, sink, grammar='root ::= "a" | foo')
        assert error_shown(answer) and any("Undefined rule identifier" in x for x in notices(answer))
        assert started(core)["grammar"] == WORDS
    finally:
        core.close()
        ms.close()
