"""A running llama-server's counters beside specviz's reproduction of the same requests
(specviz.analysis.server_metrics, specviz.analysis.compare_server, ``specviz compare-server``)."""

from __future__ import annotations

import json

import pytest
from conftest import TINY
from native_util import native_tool
from test_sweep_run import CHATML

from specviz.analysis.compare_server import compare_server
from specviz.analysis.llama_server import LlamaServer
from specviz.analysis.server_args import server_spec_args
from specviz.analysis.server_metrics import metrics_delta, parse_metrics
from specviz.cli.main import main
from specviz.errors import LlamaServerError
from specviz.testing.tiny_models import write_tiny_llama

METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 30
llamacpp:prompt_tokens_cached_total 10
llamacpp:tokens_predicted_total 64
llamacpp:tokens_predicted_seconds_total 0.5
llamacpp:spec_decode_num_draft_tokens_total 40
llamacpp:spec_decode_num_accepted_tokens_total 25
llamacpp:spec_decode_num_drafts_total 10
llamacpp:predicted_tokens_seconds 128
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 7
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 6
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 4
"""


def test_the_prometheus_counters_are_read():
    m = parse_metrics(METRICS)
    assert (m.drafts, m.draft_tokens, m.accepted) == (10, 40, 25)
    assert m.accepted_per_pos == [8, 7, 6, 4] and m.per_position() == [0.8, 0.7, 0.6, 0.4]
    assert (m.tokens_predicted, m.prompt_tokens) == (64, 40)  # processed and cached prompt tokens
    assert m.acceptance == 25 / 40 and m.mean_draft_length == 4.0 and m.tokens_per_second == 128.0
    d = metrics_delta(m, parse_metrics(METRICS.replace(" 40\n", " 30\n").replace('"3"} 4', '"3"} 1')))
    assert d.draft_tokens == 10 and d.accepted_per_pos == [0, 0, 0, 3]
    assert parse_metrics("") == parse_metrics("# nothing\n")


# as tools/server/server-task.cpp's to_metrics writes them: a counter and a gauge (six digits, stringstream)
BUSY = (
    (
        "# HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative decoding and "
        "multimodal decoding\n"
    )
    + """# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 300
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 2.33333
"""
)


def test_the_decodes_and_the_busy_slots_per_decode_are_read():
    m = parse_metrics(METRICS + BUSY)
    assert m.decodes == 300 and m.busy_slots_per_decode == 2.33333
    assert m.to_dict()["busy_slots_per_decode"] == 2.33333 and m.to_dict()["decodes"] == 300
    # 100 decodes with one busy slot each, then 200 with three: 3 per decode in between
    before = parse_metrics(BUSY.replace(" 300", " 100").replace("2.33333", "1"))
    d = metrics_delta(m, before)
    assert d.decodes == 200 and d.busy_slots_per_decode == pytest.approx(3.0, rel=1e-5)
    assert metrics_delta(m, m).busy_slots_per_decode is None  # no decode in between
    old = parse_metrics(METRICS)  # a server that does not print them
    assert old.decodes is None and old.busy_slots_per_decode is None
    assert metrics_delta(m, old).busy_slots_per_decode is None


REQUESTS = [
    {
        "messages": [{"role": "user", "content": "1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4,"}],
        "max_tokens": 48,
        "temperature": 0,
    },
    {
        "custom_id": "b",
        "body": {
            "messages": [
                {"role": "system", "content": "Repeat."},
                {"role": "user", "content": "def add(a, b): return a + b\ndef add(a, b):"},
            ],
            "max_tokens": 40,
            "temperature": 0,
        },
    },
]
SPEC = server_spec_args("ngram-simple", {"size_n": 2, "size_m": 6})
CONTEXT = ["-c", "1024", "-b", "512", "-ub", "512", "-t", "1", "-tb", "1", "-np", "1"]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("cmp") / "chat.gguf", chat_template=CHATML, **TINY)


@pytest.fixture()
def request_log(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in REQUESTS) + "\n")
    return path


@pytest.fixture()
def server(chat_model):
    native_tool("llama-server")
    with LlamaServer(chat_model, [*CONTEXT, *SPEC, "--metrics"]) as srv:
        yield srv


@pytest.mark.tools
def test_the_same_requests_give_the_same_counters(server, chat_model, request_log):
    cmp = compare_server(server.url, request_log, model=chat_model, server_args=[*CONTEXT, *SPEC], send=True)
    assert cmp.findings == [], cmp.report()
    a, b = cmp.server, cmp.specviz
    for name in ("drafts", "draft_tokens", "accepted", "tokens_predicted", "accepted_per_pos", "prompt_tokens"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.draft_tokens > a.accepted > 0 and a.tokens_predicted == 88
    assert a.decodes and a.decodes > 0 and a.busy_slots_per_decode == b.busy_slots_per_decode == 1.0  # one by one
    text = cmp.report()
    assert "acceptance rate" in text and "accepted at position 0" in text and "they agree" in text
    assert "busy slots per decode" in text
    assert "<table>" in cmp._repr_html_()


@pytest.mark.tools
def test_a_difference_is_named_with_the_setting_that_explains_it(server, chat_model, request_log):
    other = server_spec_args("ngram-simple", {"size_n": 2, "size_m": 2})
    cmp = compare_server(server.url, request_log, model=chat_model, server_args=[*CONTEXT, *other], send=True)
    assert any("tokens per step" in f and "--spec-draft-n-max" in f for f in cmp.findings), cmp.findings


@pytest.mark.tools
def test_counters_of_other_requests_are_named(server, chat_model, request_log):
    compare_server(server.url, request_log, model=chat_model, server_args=[*CONTEXT, *SPEC], send=True)
    server.complete("1, 2, 3, 1, 2, 3, 1, 2, 3,", 32)  # a request the log does not hold
    cmp = compare_server(server.url, request_log, model=chat_model, server_args=[*CONTEXT, *SPEC], send=False)
    assert any("other requests" in f and "--send" in f for f in cmp.findings), cmp.findings


@pytest.mark.tools
def test_without_the_command_line_the_server_tells_its_type(server, chat_model, request_log):
    server.complete("1, 2, 3", 8)  # a task, so /slots shows the speculative types
    cmp = compare_server(server.url, request_log, model=chat_model, send=True)
    assert cmp.config.strategy == "ngram-simple" and cmp.config.settings.n_ctx == 1024
    assert any("not exposed over HTTP" in f for f in cmp.findings)


@pytest.mark.tools
def test_a_server_without_metrics_is_refused_saying_so(chat_model, request_log):
    native_tool("llama-server")
    with LlamaServer(chat_model, [*CONTEXT, *SPEC]) as srv:
        with pytest.raises(LlamaServerError, match="--metrics"):
            compare_server(srv.url, request_log, model=chat_model)


@pytest.mark.tools
def test_compare_server_on_the_command_line(server, chat_model, request_log, capsys):
    line = " ".join([*CONTEXT, *SPEC])
    argv = ["compare-server", server.url, "--requests", str(request_log), "--model", str(chat_model)]
    assert main([*argv, "--server-args", line, "--send"]) == 0
    out = capsys.readouterr().out
    assert "draft tokens per step" in out and "they agree" in out
    assert main([*argv, "--server-args", line, "--send", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["agree"] and d["server"]["draft_tokens"] == d["specviz"]["draft_tokens"] > 0
    assert main(["compare-server", "localhost:1", "--requests", str(request_log)]) == 2
    assert main(["compare-server", server.url, "--requests", "missing.jsonl"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.tools
def test_a_text_that_parts_from_the_servers_is_named_first(server, chat_model, request_log, tmp_path):
    """The reproduction on other weights (the same vocabulary and template): with --send the server's answers
    are compared with the reproduction's texts, and the parting is named before the counts it explains."""
    other = write_tiny_llama(tmp_path / "other.gguf", chat_template=CHATML, seed=TINY["seed"] + 5, block_scale=0.1)
    cmp = compare_server(server.url, request_log, model=other, server_args=[*CONTEXT, *SPEC], send=True)
    assert len(cmp.parted) == 2 and "b" in cmp.parted, cmp.parted
    assert "parts from the server's" in cmp.findings[0] and "2 of 2 requests" in cmp.findings[0], cmp.findings
    same = compare_server(server.url, request_log, model=chat_model, server_args=[*CONTEXT, *SPEC], send=True)
    assert same.parted == [] and same.findings == []
    unsent = compare_server(server.url, request_log, model=other, server_args=[*CONTEXT, *SPEC])
    assert unsent.parted == []  # without --send there are no answers to compare
