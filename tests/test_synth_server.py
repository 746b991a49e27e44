"""llama-server with synthetic acceptance (specviz.analysis.synth_server): the flags ``advise --synth-rates``
prints are the ones the server accepts, its own check of them is the one specviz makes, and its counters
under the rates are consistent with them."""

from __future__ import annotations

import json
import math
import shlex

import pytest
from native_util import native_tool
from test_synth_rates import hand_worked, record

from specviz.analysis.llama_server import LlamaServer
from specviz.analysis.synth_rates import synth_rates
from specviz.analysis.synth_server import measure_synthetic, synthetic_args, synthetic_curve
from specviz.cli.main import main
from specviz.errors import KnobError, LlamaServerError

CONTEXT = ["-c", "2048", "-t", "1", "-np", "1"]
#: every ordinary token of the tiny vocabulary, twice: a one-token n-gram always finds a full draft
PROMPT = list(range(3, 300)) * 2


def test_bad_rates_and_drafting_flags_are_refused_before_a_server_starts(tmp_path):
    model = tmp_path / "never-read.gguf"
    with pytest.raises(KnobError, match="must not increase"):
        measure_synthetic(model, [0.5, 0.6])
    with pytest.raises(KnobError, match="at least one"):
        measure_synthetic(model, [])
    with pytest.raises(KnobError, match="--spec-type"):
        measure_synthetic(model, [0.5], args=["--spec-type", "ngram-mod"])
    with pytest.raises(KnobError, match="-md"):
        measure_synthetic(model, [0.5], args=["-md", "draft.gguf"])
    assert synthetic_args([0.91, 0.5]) == [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "1",
        "--spec-ngram-simple-size-m",
        "2",
        "--spec-synth-rates",
        "0.91,0.5",
    ]


@pytest.mark.tools
@pytest.mark.slow
def test_the_server_accepts_the_printed_line_and_refuses_a_wrong_count_as_specviz_says(tiny_model_path):
    binary = native_tool("llama-server")
    sr = synth_rates(hand_worked())
    with LlamaServer(tiny_model_path, [*CONTEXT, *shlex.split(sr.server_flags())], binary=binary) as srv:
        assert srv.complete(PROMPT, 16).predicted_n == 16
        assert "synthetic acceptance: n_max = 4" in srv.log()
    # the server's own check: one rate per draft position
    wrong = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "5", sr.rates_flag.split()[0]]
    with pytest.raises(LlamaServerError, match="must contain 5 values, got 4"):
        LlamaServer(tiny_model_path, [*CONTEXT, *wrong, sr.rates_flag.split()[1]], binary=binary).start()
    with pytest.raises(LlamaServerError, match="mutually exclusive"):
        both = [*CONTEXT, *shlex.split(sr.server_flags()), *shlex.split(sr.len_flag)]
        LlamaServer(tiny_model_path, both, binary=binary).start()


@pytest.mark.tools
@pytest.mark.slow
def test_the_servers_counters_under_the_rates_are_consistent_with_them(tiny_model_path):
    binary = native_tool("llama-server")
    rates = list(synth_rates(hand_worked()).rates)  # 0.8, 0.6, 0.6, 0.6
    every, recorded, none = synthetic_curve(
        tiny_model_path, [[1.0] * 4, rates, [0.0] * 4], prompt=PROMPT, n_predict=200, args=CONTEXT, binary=binary
    )
    assert every.metrics.accepted == every.metrics.draft_tokens > 0  # rate 1: every drafted token accepted
    assert none.metrics.accepted == 0 and none.metrics.draft_tokens > 0  # rate 0: none
    m = recorded.metrics
    assert m.drafts >= 20 and recorded.full_share >= 0.9  # the drafter drafts full length nearly always
    seen = recorded.observed
    assert len(seen) == 4 and all(seen[i] <= seen[i - 1] for i in range(1, 4))
    for r, x in zip(rates, seen):  # within four standard deviations of the coin, less what short drafts lost
        assert abs(x - r) <= 4 * math.sqrt(r * (1 - r) / m.drafts) + (1 - recorded.full_share) + 0.02, (r, x)
    assert recorded.plain_tokens_per_second > 0 and recorded.synthetic_tokens_per_second > 0
    assert recorded.speedup > 0 and "--spec-synth-rates 0.8,0.6,0.6,0.6" in recorded.report()
    json.dumps(recorded.to_dict())


def test_the_command_line_refuses_a_missing_model_before_a_server_starts(tmp_path, capsys):
    path = record(hand_worked(), tmp_path / "rec.jsonl")
    assert main(["advise", path, "--synth-rates", "--check-server"]) == 2
    assert "option --model" in capsys.readouterr().err


@pytest.mark.tools
@pytest.mark.slow
def test_the_command_line_measures_the_recordings_rates_in_the_server(tiny_model_path, tmp_path, capsys):
    native_tool("llama-server")
    path = record(hand_worked(), tmp_path / "rec.jsonl")
    argv = ["advise", path, "--synth-rates", "--check-server", "--model", str(tiny_model_path), "-t", "1"]
    assert main([*argv, "--max-tokens", "64", "--server-args", "-c 1024", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    chk = d["server_check"]
    assert d["synth_rates"] == pytest.approx(chk["rates"]) and chk["metrics"]["drafts"] > 0 and chk["speedup"] > 0
    assert "-c" in chk["args"] and chk["args"][chk["args"].index("-c") + 1] == "1024"
    assert main([*argv, "--max-tokens", "32"]) == 0
    out = capsys.readouterr().out
    assert "--spec-synth-rates 0.8,0.6,0.6,0.6" in out and "in llama-server on this machine" in out
    assert main([*argv, "--server-args", "--spec-type ngram-mod"]) == 2
    assert "synthetic server's drafting is set by specviz" in capsys.readouterr().err
