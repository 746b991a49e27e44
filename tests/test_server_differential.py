"""Differential tests against ``llama-server``, built by ``make llama-tools`` from the llama.cpp that
llama-cpp-python vendors: the same prompt through the server's completion API (greedy, temperature 0,
with the same ``--spec-*`` flags) and through a specviz session with the same settings gives the same
tokens and text and the same drafted and accepted counts (``timings.draft_n`` / ``draft_n_accepted``).

The session gets the server's context settings (``-c -b -ub -t -fa -ctk -ctv``) and is driven through the
server's generation loop (:func:`specviz.analysis.server_repro.run_like_the_server`:
the first token after the prompt is sampled without a draft, each round capped as
``server_slot::get_n_draft_max`` caps it) and configured from the server's own command line
(:func:`specviz.analysis.server_args.parse_server_args`: n-gram types draft up to their own length, a
model draft takes llama.cpp's defaults). The fixtures are tiny f32 models, whose batch and one-token
logits agree to about 1e-6, so greedy output does not depend on the batch. Every case must draft,
accept and reject, so none can pass vacuously.

Deliberate differences, each asserted below: the text of control and unknown tokens, which the server's
``content`` leaves out (``--special`` keeps it) and specviz's pieces render; ngram-cache's two departures (undone with
:class:`UpstreamNgramCache`, as in ``test_differential.py``); a model draft's ``p_min`` (specviz compares
it with the top probability over the whole vocabulary, llama.cpp over its top 10 candidates); and the
server's n-gram statistics of ngram-mod and ngram-cache outliving a request (a specviz session starts
every request afresh).
"""

from __future__ import annotations

import pytest
from native_util import UpstreamNgramCache, native_tool
from test_differential import FIXTURES, GENERATION_CASES, N_CTX

import specviz.strategies as strategies
from specviz import Session
from specviz.analysis.llama_server import LlamaServer, live_servers
from specviz.analysis.server_args import parse_server_args, server_spec_args
from specviz.analysis.server_repro import run_like_the_server, server_draft_cap
from specviz.backends import LlamaModel
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

N_PREDICT = 120
#: the server's context, as the session's: one slot, batches as the session's, one thread
CONTEXT_ARGS = ["-c", str(N_CTX), "-b", "512", "-ub", "512", "-t", "1", "-tb", "1", "-np", "1"]

assert UpstreamNgramCache  # used through the registry (monkeypatched below)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """name -> (model path, loaded model, prompt ids): the prompt is the start plus the fixture's own
    greedy continuation, so that the generation repeats what the prompt holds and every strategy drafts."""
    out = {}
    for name, (seed, block_scale, start) in FIXTURES.items():
        path = write_tiny_llama(tmp_path_factory.mktemp("srv") / f"{name}.gguf", seed=seed, block_scale=block_scale)
        model = LlamaModel(path)
        s = Session(model, n_ctx=N_CTX, n_threads=1)
        s.start(start, max_tokens=60, strategy="none")
        s.run()
        ids = list(s.history)
        s.close()
        out[name] = (path, model, ids)
    yield out
    for _, model, _ in out.values():
        model.close()


@pytest.fixture(scope="module")
def server_bin():
    return native_tool("llama-server")


def through_the_server(binary, path, args, prompt, n_predict=N_PREDICT, repeat=1):
    """The completions of ``prompt`` (``repeat`` times, one server) and the server's /metrics text."""
    with LlamaServer(path, [*args, "--metrics"], binary=binary) as srv:
        outs = [srv.complete(prompt, n_predict) for _ in range(repeat)]
        metrics = srv.metrics()
    assert live_servers() == []
    return outs, metrics


def as_the_server_renders(model, tokens) -> bytes:
    """The text of ``tokens`` as the server's ``content`` holds it: the text of control and unknown tokens
    (``<unk>``) is left out unless the server runs with ``--special``; specviz's pieces render it."""
    import llama_cpp

    hidden = llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN | llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    return b"".join(model.piece_bytes(t) for t in tokens if not llama_cpp.llama_vocab_get_attr(model.vocab, t) & hidden)


def through_specviz(model, args, prompt, n_predict=N_PREDICT):
    """The same request through a specviz session configured from the server's command line; the run and
    its text as the server renders it."""
    cfg = parse_server_args(args)
    s = Session(model, **cfg.session_kwargs())
    try:
        run = run_like_the_server(s, prompt, n_predict, cfg.strategy, cfg.knobs)
        text = as_the_server_renders(model, run.tokens)
    finally:
        s.close()
    return run, text


@pytest.mark.parametrize("fixture", list(FIXTURES))
@pytest.mark.parametrize(
    "strategy,knobs",
    GENERATION_CASES,
    ids=[f"{s}-{'-'.join(f'{k}{v}' for k, v in kn.items())}" for s, kn in GENERATION_CASES],
)
@pytest.mark.tools
def test_generation_equals_llama_server(fixtures, server_bin, fixture, strategy, knobs, monkeypatch):
    if strategy == "ngram-cache":  # compare the rest; the departures are shown in test_differential.py
        monkeypatch.setitem(strategies._REGISTRY, "ngram-cache", "native_util:UpstreamNgramCache")
    path, model, prompt = fixtures[fixture]
    args = [*CONTEXT_ARGS, *server_spec_args(strategy, knobs)]
    (out,), metrics = through_the_server(server_bin, path, args, prompt)
    run, text = through_specviz(model, args, prompt)
    assert out.tokens == run.tokens, "the generated tokens differ"
    assert out.content == text.decode("utf-8", "replace"), "the generated text differs"
    assert (out.draft_n, out.draft_n_accepted) == (run.draft_n, run.draft_n_accepted)
    assert out.draft_n > out.draft_n_accepted > 0  # it drafted, accepted and rejected
    assert out.predicted_n == N_PREDICT == len(run.tokens)
    # the Prometheus counters say the same, per draft position too
    assert f"llamacpp:spec_decode_num_drafts_total {run.verify_steps}\n" in metrics
    for i, n in enumerate(run.accepted_per_pos):
        assert f'accepted_tokens_per_pos_total{{position="{i}"}} {n}\n' in metrics


#: a chain whose members both draft on every fixture: llama-server takes the comma list, asks ngram-simple
#: first (its priority) and ngram-map-k in the rounds where ngram-simple proposes nothing
CHAIN = (
    "ngram-simple,ngram-map-k",
    {"ngram_simple_size_n": 3, "ngram_simple_size_m": 3, "ngram_map_k_size_n": 2, "ngram_map_k_size_m": 6},
)


@pytest.mark.parametrize("fixture", list(FIXTURES))
@pytest.mark.tools
def test_a_chain_equals_llama_server(fixtures, server_bin, fixture):
    path, model, prompt = fixtures[fixture]
    args = [*CONTEXT_ARGS, *server_spec_args(*CHAIN)]
    assert "ngram-simple,ngram-map-k" in args and "--spec-ngram-map-k-size-n" in args  # one --spec-type list
    (out,), metrics = through_the_server(server_bin, path, args, prompt)
    cfg = parse_server_args(args)
    s = Session(model, **cfg.session_kwargs())
    try:
        run = run_like_the_server(s, prompt, N_PREDICT, cfg.strategy, cfg.knobs)
        by = s.telemetry_dict()["by_drafter"]
    finally:
        s.close()
    assert out.tokens == run.tokens, "the generated tokens differ"
    assert (out.draft_n, out.draft_n_accepted) == (run.draft_n, run.draft_n_accepted)
    assert out.draft_n > out.draft_n_accepted > 0
    assert f"llamacpp:spec_decode_num_drafts_total {run.verify_steps}\n" in metrics
    # both members drafted: the counts above are the chain's, not one member's
    assert set(by) == {"ngram-simple", "ngram-map-k"} and all(v["drafted"] > 0 for v in by.values())


#: deployment settings (flash attention off; quantized KV caches, which need flash attention and heads
#: their blocks divide: the wide-heads fixture)
SETTINGS_CASES = [
    ("digits", ["-fa", "off"]),
    ("code", ["-fa", "off"]),
    ("wide", ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"]),
    ("wide", ["-fa", "auto", "-ctk", "q4_0"]),
    ("wide", ["-fa", "off", "-ctk", "q5_1"]),
]


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A digits-like fixture with heads 32 wide (quantized caches fit it), and its own greedy prompt."""
    seed, block_scale, start = FIXTURES["digits"]
    path = write_tiny_llama(
        tmp_path_factory.mktemp("srv-wide") / "wide.gguf", seed=seed, block_scale=block_scale, n_head=2, n_head_kv=1
    )
    model = LlamaModel(path)
    s = Session(model, n_ctx=N_CTX, n_threads=1)
    s.start(start, max_tokens=60, strategy="none")
    s.run()
    ids = list(s.history)
    s.close()
    yield path, model, ids
    model.close()


@pytest.mark.parametrize("fixture,settings", SETTINGS_CASES, ids=[f"{f}-{'-'.join(a)}" for f, a in SETTINGS_CASES])
@pytest.mark.parametrize(
    "strategy,knobs",
    [("ngram-map-k4v", {"size_n": 2, "size_m": 4}), ("ngram-mod", {"n_match": 2, "n_min": 1, "n_max": 8})],
)
@pytest.mark.tools
def test_generation_with_deployment_settings_equals_llama_server(
    fixtures, wide, server_bin, fixture, settings, strategy, knobs
):
    path, model, prompt = wide if fixture == "wide" else fixtures[fixture]
    args = [*CONTEXT_ARGS, *settings, *server_spec_args(strategy, knobs)]
    assert parse_server_args(args).session_kwargs()["flash_attn"] == settings[1]
    (out,), _ = through_the_server(server_bin, path, args, prompt)
    run, text = through_specviz(model, args, prompt)
    assert out.tokens == run.tokens and out.content == text.decode("utf-8", "replace")
    assert (out.draft_n, out.draft_n_accepted) == (run.draft_n, run.draft_n_accepted)
    assert out.draft_n > out.draft_n_accepted > 0


@pytest.mark.tools
def test_the_server_leaves_out_the_text_of_an_unknown_token(wide, server_bin):
    """A generation holding the unknown token (id 0): the server's content has no ``<unk>``, specviz's
    pieces render it; the tokens are the same."""
    path, model, prompt = wide
    args = [
        *CONTEXT_ARGS,
        "-fa",
        "auto",
        "-ctk",
        "q4_0",
        *server_spec_args("ngram-map-k4v", {"size_n": 2, "size_m": 4}),
    ]
    (out,), _ = through_the_server(server_bin, path, args, prompt)
    run, text = through_specviz(model, args, prompt)
    assert out.tokens == run.tokens and 0 in out.tokens
    assert b"<unk>" in b"".join(model.piece_bytes(t) for t in run.tokens) and "<unk>" not in out.content
    assert out.content == text.decode("utf-8", "replace")


@pytest.mark.tools
def test_a_text_prompt_is_tokenized_as_specviz_tokenizes_it(fixtures, server_bin):
    path, model, _ = fixtures["code"]
    text = " ".join([FIXTURES["code"][2]] * 4)
    args = [*CONTEXT_ARGS, *server_spec_args("ngram-simple", {"size_n": 2, "size_m": 4})]
    (by_text,), _ = through_the_server(server_bin, path, args, text)
    ids = model.tokenize(text)
    (by_ids,), _ = through_the_server(server_bin, path, args, ids)
    assert by_text.raw["tokens_evaluated"] == len(ids)
    assert (by_text.tokens, by_text.draft_n, by_text.draft_n_accepted) == (
        by_ids.tokens,
        by_ids.draft_n,
        by_ids.draft_n_accepted,
    )
    run, _ = through_specviz(model, args, text)
    assert (run.tokens, run.draft_n, run.draft_n_accepted) == (
        by_text.tokens,
        by_text.draft_n,
        by_text.draft_n_accepted,
    )
    assert by_text.draft_n > 0


@pytest.mark.tools
def test_the_first_token_after_the_prompt_is_not_drafted(fixtures, server_bin):
    """The reproduction matters: drafting from the first round, as a plain specviz session does, gives other
    counts than the server's on this case; the server's loop (the first token plain) gives its counts."""
    path, model, prompt = fixtures["digits"]
    strategy, knobs = "ngram-simple", {"size_n": 1, "size_m": 8}
    args = [*CONTEXT_ARGS, *server_spec_args(strategy, knobs)]
    (out,), _ = through_the_server(server_bin, path, args, prompt)
    cfg = parse_server_args(args)
    counts = {}
    for plain_first in (True, False):
        s = Session(model, n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_threads=1)
        run = run_like_the_server(s, prompt, N_PREDICT, cfg.strategy, cfg.knobs, plain_first=plain_first)
        s.close()
        counts[plain_first] = (run.draft_n, run.draft_n_accepted)
    assert counts[True] == (out.draft_n, out.draft_n_accepted)
    assert counts[False] != counts[True]
    assert server_draft_cap(N_CTX, len(prompt) - 1, N_PREDICT, 0) > 0  # not for want of room


# -- a draft model -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def draft_pair(tmp_path_factory, fixtures):
    """The digits target and a one-layer draft sharing its embedding, output and first block."""
    seed, block_scale, _ = FIXTURES["digits"]
    w = tiny_weights(seed=seed, block_scale=block_scale)
    draft = write_tiny_llama(tmp_path_factory.mktemp("srv-draft") / "draft.gguf", n_layer=1, layers_from=w)
    return fixtures["digits"], draft


@pytest.mark.parametrize("n_max,n_min", [(4, 0), (8, 2), (3, 0)])
@pytest.mark.tools
def test_generation_with_a_draft_model_equals_llama_server(draft_pair, server_bin, n_max, n_min):
    (path, model, prompt), draft = draft_pair
    knobs = {"draft_model": str(draft), "draft_max": n_max, "draft_min": n_min, "draft_p_min": 0.0}
    args = [*CONTEXT_ARGS, "-td", "1", *server_spec_args("draft", knobs)]
    (out,), _ = through_the_server(server_bin, path, args, prompt)
    run, text = through_specviz(model, args, prompt)
    assert out.tokens == run.tokens and out.content == text.decode("utf-8", "replace")
    assert (out.draft_n, out.draft_n_accepted) == (run.draft_n, run.draft_n_accepted)
    assert out.draft_n > out.draft_n_accepted > 0


@pytest.mark.tools
def test_draft_p_min_is_measured_over_the_top_ten_in_llama_cpp(draft_pair, server_bin):
    """llama.cpp's draft-simple renormalises the draft's distribution over its 10 most likely tokens before
    comparing with p_min; specviz compares the probability over the whole vocabulary, which is lower, so
    with the same p_min specviz drafts less. The generated text is the same (greedy either way)."""
    (path, model, prompt), draft = draft_pair
    knobs = {"draft_model": str(draft), "draft_max": 8, "draft_min": 0, "draft_p_min": 0.3}
    args = [*CONTEXT_ARGS, "-td", "1", *server_spec_args("draft", knobs)]
    assert any("top 10 candidates" in w for w in parse_server_args(args).warnings)
    (out,), _ = through_the_server(server_bin, path, args, prompt)
    run, _ = through_specviz(model, args, prompt)
    assert out.tokens == run.tokens
    assert out.draft_n > run.draft_n > 0


# -- state that outlives a request in the server -------------------------------------------------------


@pytest.mark.parametrize("strategy,knobs", [("ngram-mod", {"n_match": 2, "n_min": 1, "n_max": 8}), ("ngram-cache", {})])
@pytest.mark.tools
def test_the_servers_ngram_statistics_outlive_a_request(fixtures, server_bin, strategy, knobs, monkeypatch):
    """ngram-mod's pool is shared by every request of a server process, and ngram-cache's context statistics
    are never reset by a new request: a request sent after another drafts differently than when it is the
    server's first. A specviz session starts each request afresh, so its reproduction equals the latter."""
    if strategy == "ngram-cache":
        monkeypatch.setitem(strategies._REGISTRY, "ngram-cache", "native_util:UpstreamNgramCache")
    path, model, prompt = fixtures["code"]
    other = prompt[:1] + prompt[25:]  # the same text, shifted: it shares the first request's n-grams
    args = [*CONTEXT_ARGS, *server_spec_args(strategy, knobs)]
    with LlamaServer(path, args, binary=server_bin) as srv:
        srv.complete(prompt, N_PREDICT)
        after = srv.complete(other, N_PREDICT)
    (alone,), _ = through_the_server(server_bin, path, args, other)
    run, _ = through_specviz(model, args, other)
    assert after.tokens == alone.tokens == run.tokens
    assert (alone.draft_n, alone.draft_n_accepted) == (run.draft_n, run.draft_n_accepted)
    assert (after.draft_n, after.draft_n_accepted) != (alone.draft_n, alone.draft_n_accepted)
