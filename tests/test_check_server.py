"""Advice checked in llama-server (specviz.analysis.check_server, ``specviz advise --check-server``) on the
tiny model: both servers run, the table holds the prediction beside the measurement and the server's own
counters. The figures mean nothing on the tiny model (no test depends on speed)."""

from __future__ import annotations

import json

import pytest
from native_util import native_tool
from test_cli import run_cli

from specviz import Recorder, Session
from specviz.analysis.advise import advise
from specviz.analysis.check_server import check_advice, recorded_prompts
from specviz.analysis.llama_server import live_servers
from specviz.backends.context_settings import ContextSettings
from specviz.decoding.recorder import read_events
from specviz.errors import LlamaServerError

PROMPTS = ["1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5,", "the cat of the dog and the a the cat of the"]


@pytest.fixture(scope="module")
def recording(tiny_model_path, tmp_path_factory):
    path = tmp_path_factory.mktemp("chk") / "rec.jsonl"
    s = Session(tiny_model_path, n_ctx=512, n_threads=1)
    rec = Recorder(path)
    s.subscribe(rec)
    for p in PROMPTS:
        s.start(p, 24, "ngram-simple", size_n=2, size_m=8, draft_max=8)
        s.run()
    rec.close()
    s.close()
    return path


def test_the_recorded_prompts_are_read_once_each(recording):
    events = read_events(recording)
    prompts, ctx = recorded_prompts(events + events)
    assert len(prompts) == 2 and all(p.max_tokens == 24 for p in prompts)
    assert ctx["n_ctx"] == 512 and ctx["model"].endswith(".gguf")


@pytest.mark.tools
def test_check_advice_runs_both_servers_and_stops_them(recording, tiny_model_path):
    native_tool("llama-server")
    events = read_events(recording)
    adv = advise(events)
    prompts, _ = recorded_prompts(events)
    settings = ContextSettings.make(n_ctx=512, n_threads=1)
    chk = check_advice(adv, prompts, tiny_model_path, settings=settings, repeats=2)
    assert live_servers() == []
    none, advised = chk.rows()
    assert none["setting"] == "none" and none["draft_n"] == 0 and none["predicted_n"] == 48
    assert advised["flags"] == adv.flags and advised["predicted_speedup"] == adv.best.speedup
    assert advised["predicted_n"] == 48 and len(chk.speedups) == 2
    if adv.best.strategy != "none":
        assert advised["draft_n"] > 0
    text = chk.report()
    assert "predicted" in text and "measured" in text and adv.flags in text
    assert json.loads(json.dumps(chk.to_dict()))["n_prompts"] == 2
    with pytest.raises(LlamaServerError, match="--spec"):
        check_advice(adv, prompts, tiny_model_path, extra_args=["--spec-type", "ngram-mod"])


@pytest.mark.tools
def test_advise_check_server_on_the_command_line(recording, tiny_model_path):
    native_tool("llama-server")
    p = run_cli("advise", str(recording), "--check-server", "--repeats", "1", "--threads", "1", "--max-tokens", "12")
    assert p.returncode == 0, p.stderr
    assert "advice checked in llama-server" in p.stdout and "measured" in p.stdout
    assert "llama-server flags:" in p.stdout  # the advice's own report comes first
    p = run_cli("advise", str(recording), "--check-server", "--repeats", "0")
    assert p.returncode == 2 and "--repeats" in p.stderr
    p = run_cli("advise", str(recording), "--check-server", "--server-args", "--spec-type ngram-mod")
    assert p.returncode == 2 and "leave out --spec" in p.stderr
    p = run_cli("advise", str(recording), "--check-server", "--server-args", "-ctv q8_0 -fa off")
    assert p.returncode == 2 and "needs flash attention" in p.stderr


@pytest.mark.slow
def test_advise_for_server_on_the_command_line(recording):
    p = run_cli("advise", str(recording), "--for-server", "--json")
    assert p.returncode == 0, p.stderr
    assert any("searched for llama-server" in x for x in json.loads(p.stdout)["limits"])
    p = run_cli("advise", str(recording), "--json")
    assert not any("searched for llama-server" in x for x in json.loads(p.stdout)["limits"])


@pytest.mark.tools
def test_a_prediction_for_the_prompts_sent_is_what_the_measurement_is_compared_with(recording, tiny_model_path):
    """Advice learnt on some prompts and checked on others: the prediction made for the prompts sent is the
    one beside the measurement, the advice's own is reported too."""
    native_tool("llama-server")
    events = read_events(recording)
    adv = advise(events)
    prompts, _ = recorded_prompts(events)
    with pytest.raises(LlamaServerError, match="predicted"):
        check_advice(adv, prompts, tiny_model_path, predicted=0.0)
    assert live_servers() == []
    settings = ContextSettings.make(n_ctx=512, n_threads=1)
    predicted = adv.best.speedup + 0.5
    chk = check_advice(
        adv, prompts[:1], tiny_model_path, settings=settings, repeats=1, max_tokens=8, predicted=predicted
    )
    assert chk.predicted_speedup == predicted and chk.advice_speedup == adv.best.speedup
    assert chk.error == pytest.approx(chk.measured_speedup / predicted - 1.0)
    assert chk.rows()[1]["predicted_speedup"] == predicted
    assert f"predicted for these prompts: {predicted:.2f}x" in chk.report()
    d = json.loads(json.dumps(chk.to_dict()))
    assert d["predicted_speedup"] == predicted and d["advice_speedup"] == adv.best.speedup
