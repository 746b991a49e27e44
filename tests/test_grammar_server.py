"""Structured output against llama-server (built by ``make llama-tools`` from the llama.cpp that
llama-cpp-python vendors), on the embedded Gemma 3: the same JSON schema, greedy, with ``--spec-type none``
(llama.cpp's own grammar-constrained greedy decoding) and with ``--spec-type ngram-simple``, gives the same
tokens and the same ``draft_n`` / ``draft_n_accepted`` through a specviz session configured from the same
command line and driven through the server's generation loop
(:func:`specviz.analysis.server_repro.run_like_the_server`).

Comparable as the suite's other server differentials make it: ``context_args`` gives the server specviz's
context (``--swa-full``, one slot, the batch sizes, the threads) and ``parse_server_args`` gives specviz the
server's prompt layout (``prefill="whole"``, the first token sampled undrafted). The server gets the schema
itself (``json_schema``: its C++ converter, common/json-schema-to-grammar.cpp) and specviz converts it with
llama-cpp-python's Python port: on this schema the two grammars constrain alike, which the equal tokens
show (were they to differ, the server would be sent specviz's GBNF in the ``grammar`` field instead). The
server's tokens end with the end-of-generation token its ``stop_type`` ``eos`` reports; specviz's history
cuts before it, so it is left out of the comparison. The prompt shows one example of the JSON, so the n-gram
drafts both match (the keys and punctuation) and are refused (the prose the schema forbids): measured here,
40 drafted and 6 accepted under the schema, 64 and 23 without it (the same figures from both).
"""

from __future__ import annotations

import pytest

from specviz import Session
from specviz.analysis.server_args import parse_server_args
from specviz.analysis.server_repro import run_like_the_server
from specviz.backends.grammar import gbnf_from_json_schema

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 30},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "skills"],
}
PROMPT = (
    "Extract each person as JSON.\n"
    "Text: John Smith is 41 years old and lives in Paris; his skills are cooking and driving.\n"
    'JSON: {"name": "John Smith", "age": 41, "city": "Paris", "skills": ["cooking", "driving"]}\n'
    "Text: Maria Lopez is 34 years old and lives in Madrid. Maria Lopez works as a nurse in Madrid; "
    "her skills are first aid, triage and patient care.\nJSON: "
)
N_PREDICT = 64


@pytest.mark.slow
@pytest.mark.embedded
@pytest.mark.tools
@pytest.mark.parametrize(
    "spec",
    [
        ["--spec-type", "none"],
        ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"],
    ],
    ids=["none", "ngram-simple"],
)
def test_a_json_schema_request_equals_llama_server(embedded_model, spec):
    import json

    from native_util import native_tool

    from specviz.analysis.check_server import context_args
    from specviz.analysis.llama_server import LlamaServer
    from specviz.backends.context_settings import ContextSettings

    settings = ContextSettings.make(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=2)
    args = [*context_args(settings), *spec]
    cfg = parse_server_args(args)
    with LlamaServer(embedded_model.path, args, binary=native_tool("llama-server")) as srv:
        served = srv.complete(PROMPT, N_PREDICT, cache_prompt=False, json_schema=SCHEMA)
    s = Session(embedded_model, **cfg.session_kwargs())
    try:
        run = run_like_the_server(s, PROMPT, N_PREDICT, cfg.strategy, cfg.knobs, grammar=gbnf_from_json_schema(SCHEMA))
        text = s.text
    finally:
        s.close()
    want = [t for t in served.tokens if not embedded_model.is_eog(t)]
    assert list(run.tokens) == want
    assert text == served.content
    json.loads(text)  # the schema's JSON, whole (the limit leaves room)
    assert (run.draft_n, run.draft_n_accepted) == (served.draft_n, served.draft_n_accepted)
    if cfg.strategy != "none":  # not vacuous: drafts accepted and drafts refused
        assert 0 < run.draft_n_accepted < run.draft_n


@pytest.mark.tools
def test_compare_server_sends_and_runs_a_requests_grammar(tmp_path):
    """``compare-server`` with a request log whose request asks for a grammar: the server gets the GBNF
    specviz runs under (the request's ``grammar`` field), and the text and counters agree."""
    import json

    from native_util import native_tool
    from test_compare_server import CHATML, CONTEXT, SPEC

    from specviz.analysis.compare_server import compare_server
    from specviz.analysis.llama_server import LlamaServer
    from specviz.testing.tiny_models import write_tiny_llama

    model = write_tiny_llama(tmp_path / "chat.gguf", chat_template=CHATML, seed=1, block_scale=0.1)
    words = 'root ::= (" the" | " a" | " of" | " and" | " to" | " in" | " cat" | " dog")+'
    ask = [{"role": "user", "content": "the cat of the dog and the a the cat of the dog and the"}]
    log = tmp_path / "requests.jsonl"
    log.write_text(json.dumps({"messages": ask, "max_tokens": 40, "temperature": 0, "grammar": words}) + "\n")
    native_tool("llama-server")
    with LlamaServer(model, [*CONTEXT, *SPEC, "--metrics"]) as srv:
        cmp = compare_server(srv.url, log, model=model, server_args=[*CONTEXT, *SPEC], send=True)
    assert cmp.parted == [], cmp.report()
    assert cmp.findings == [], cmp.report()
    a, b = cmp.server, cmp.specviz
    for name in ("drafts", "draft_tokens", "accepted", "tokens_predicted"):
        assert getattr(a, name) == getattr(b, name), name
    words_out = cmp.runs[0].content.split()
    assert words_out and all(w in {"the", "a", "of", "and", "to", "in", "cat", "dog"} for w in words_out[:-1])
    assert a.draft_tokens > 0, "the request drafts nothing"
