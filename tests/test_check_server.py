"""Advice checked in llama-server (specviz.analysis.check_server, ``specviz advise --check-server``) on the
tiny model: both servers run, the table holds the prediction beside the measurement and the server's own
counters. The figures mean nothing on the tiny model (no test depends on speed)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from native_util import native_tool
from test_cli import run_cli

from specviz import Recorder, Session
from specviz.analysis.advise import advise
from specviz.analysis.check_server import (
    STABLE_SPREAD,
    RepeatLoad,
    ServerCheck,
    ServerTime,
    check_advice,
    measure_repeats,
    needs_more_repeats,
    process_cpu_seconds,
    recorded_prompts,
    speedup_spread,
    stability,
)
from specviz.analysis.llama_server import Completion, live_servers
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
    chk = check_advice(adv, prompts, tiny_model_path, settings=settings, repeats=2, max_repeats=2)
    assert live_servers() == []
    none, advised = chk.rows()
    assert none["setting"] == "none" and none["draft_n"] == 0 and none["predicted_n"] == 48
    assert advised["flags"] == adv.flags and advised["predicted_speedup"] == adv.best.speedup
    assert advised["predicted_n"] == 48 and len(chk.speedups) == 2
    if adv.best.strategy != "none":
        assert advised["draft_n"] > 0
    text = chk.report()
    assert "predicted" in text and "measured" in text and adv.flags in text
    d = json.loads(json.dumps(chk.to_dict()))
    assert d["n_prompts"] == 2 and d["n_repeats"] == 2 and d["max_repeats"] == 2
    assert d["stable"] in (True, False) and d["spread"] >= 0 and chk.stability.text() in text
    assert len(d["repeat_load"]) == 2 and all(r["n_threads"] == 1 for r in d["repeat_load"])
    if os.path.exists(f"/proc/{os.getpid()}/stat"):  # the servers' CPU time read from /proc
        assert all(r["cpu_seconds"] is not None and r["cpu_seconds"] >= 0 for r in d["repeat_load"])
    with pytest.raises(LlamaServerError, match="--spec"):
        check_advice(adv, prompts, tiny_model_path, extra_args=["--spec-type", "ngram-mod"])


@pytest.mark.tools
def test_advise_check_server_on_the_command_line(recording, tiny_model_path):
    native_tool("llama-server")
    p = run_cli("advise", str(recording), "--check-server", "--repeats", "1", "--threads", "1", "--max-tokens", "12")
    assert p.returncode == 0, p.stderr
    assert "advice checked in llama-server" in p.stdout and "measured" in p.stdout
    assert "llama-server flags:" in p.stdout  # the advice's own report comes first
    assert "1 repeat: no spread measured" in p.stdout and "repeat 1: " in p.stdout
    p = run_cli("advise", str(recording), "--check-server", "--repeats", "3", "--max-repeats", "2")
    assert p.returncode == 2 and "--max-repeats" in p.stderr
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


def _fed(speedups, *, repeats=3, max_repeats=8):
    """The speedups a check would have measured, fed one repeat at a time until the rule stops it."""
    done: list[float] = []
    while needs_more_repeats(done, repeats=repeats, max_repeats=max_repeats):
        done.append(speedups[len(done)])
    return done


def test_repeats_that_agree_are_stable_after_the_repeats_asked_for():
    done = _fed([2.06, 2.03, 2.09, 9.0])
    assert done == [2.06, 2.03, 2.09]
    assert speedup_spread(done) == pytest.approx(0.03 / 2.06)  # three repeats: range over twice the median
    st = stability(done)
    assert st.stable is True and st.n_repeats == 3 and st.tolerance == STABLE_SPREAD
    assert st.text().startswith("stable after 3 repeats: the per-repeat speedups spread 1%")


def test_a_spoilt_repeat_is_measured_past_until_the_speedups_settle():
    """A burst of load in the first repeat: 1.2x beside 2.2x spreads 23%, then 11% over four repeats, then
    the fifth puts it outside the interquartile range."""
    assert speedup_spread([1.2, 2.2, 2.2]) == pytest.approx(0.5 / 2.2)
    assert speedup_spread([1.2, 2.2, 2.2, 2.2]) == pytest.approx(0.25 / 2.2)
    done = _fed([1.2, 2.2, 2.2, 2.2, 2.2, 2.2, 2.2, 2.2])
    assert len(done) == 5 and stability(done).stable is True


def test_speedups_that_never_settle_stop_at_the_most_repeats_and_say_so():
    done = _fed([1.0, 2.0] * 10)
    assert len(done) == 8
    st = stability(done)
    assert st.stable is False and (st.low, st.high) == (1.0, 2.0)
    assert st.text().startswith("not stable after 8 repeats: the per-repeat speedups spread 67% (1.00x-2.00x")
    assert "the machine may have been busy" in st.text()
    assert len(_fed([1.0, 2.0] * 10, repeats=4, max_repeats=4)) == 4  # max_repeats == repeats: no more


def test_a_single_repeat_has_no_spread_to_judge():
    assert not needs_more_repeats([1.5], repeats=1, max_repeats=8)
    assert speedup_spread([1.5]) is None and speedup_spread([0.0, 0.0]) is None
    st = stability([1.5])
    assert st.stable is None and "no spread measured" in st.text()
    assert stability([]).n_repeats == 0


class FakeServer:
    """A server answering from a script: each request 10 tokens in the next of ``ms`` milliseconds."""

    def __init__(self, ms, pid=None):
        self.args = ["--fake"]
        self.proc = None if pid is None else SimpleNamespace(pid=pid)
        self.ms = list(ms)
        self.calls = 0

    def complete(self, prompt, n_predict, **params):
        ms = self.ms[min(self.calls, len(self.ms) - 1)]
        self.calls += 1
        return Completion("", [1] * 10, {"predicted_n": 10, "predicted_ms": ms}, "limit")


def test_measure_repeats_sends_the_prompts_again_while_the_speedups_spread():
    plain = FakeServer([100.0], pid=os.getpid())
    advised = FakeServer([100.0 / x for x in (1.2, 2.2, 2.2, 2.2, 2.2, 2.2)], pid=os.getpid())
    said: list[str] = []
    out, loads = measure_repeats(
        plain, advised, [([1, 2, 3], 10)], repeats=3, max_repeats=8, n_threads=2, progress=said.append
    )
    assert len(out) == len(loads) == 5 and plain.calls == advised.calls == 5
    assert [round(a.tokens_per_second / n.tokens_per_second, 2) for n, a in out] == [1.2, 2.2, 2.2, 2.2, 2.2]
    assert said[2].startswith("repeat 3/3:") and said[3].startswith("repeat 4 (up to 8: the speedups spread over 10%)")
    assert all(set(ld.by_server) == {"none", "advised"} for ld in loads)
    assert all(t.n_threads == 2 and t.wall_seconds >= 0 for ld in loads for t in ld.by_server.values())
    if os.path.exists(f"/proc/{os.getpid()}/stat"):
        assert all(ld.total.cpu_seconds is not None and ld.total.cpu_seconds >= 0 for ld in loads)
    no_proc, _ = measure_repeats(
        FakeServer([100.0]), FakeServer([50.0]), [("a", 10), ("b", 10)], repeats=3, max_repeats=8
    )
    assert len(no_proc) == 3  # the same speedup every repeat: stable, nothing more sent


def test_the_check_reports_its_stability_and_each_repeats_load():
    out, loads = measure_repeats(
        FakeServer([100.0]), FakeServer([100.0, 50.0] * 4), [("a", 10)], repeats=2, max_repeats=6, n_threads=1
    )
    chk = ServerCheck(2.0, "--spec-type ngram-simple", [], out, 1, loads=loads, requested_repeats=2, max_repeats=6)
    text = chk.report()
    assert "not stable after 6 repeats" in text and "repeat 6: 2.00x; " in text
    assert "CPU share not available" in text  # the fake servers have no process to read
    d = json.loads(json.dumps(chk.to_dict()))
    assert d["stable"] is False and d["n_repeats"] == 6 and d["requested_repeats"] == 2
    assert d["spread"] == pytest.approx(chk.stability.spread) and d["stability"] == chk.stability.text()
    assert len(d["repeat_load"]) == 6 and set(d["repeat_load"][0]) >= {"load_average", "cpu_share", "cpu_busy"}


def test_a_repeats_cpu_share_is_judged_by_the_machine_load_rule():
    busy = ServerTime(0.3, 1.0, 2)
    assert busy.cpu_share == pytest.approx(0.15) and busy.to_dict()["cpu_busy"] is True
    assert busy.text() == "CPU share 15% of 2 threads: the machine was busy"
    quiet = ServerTime(1.9, 1.0, 2)
    assert quiet.text() == "CPU share 95% of 2 threads" and quiet.to_dict()["cpu_busy"] is False
    short = ServerTime(0.01, 0.1, 2)
    assert short.cpu_share is None and short.text() == "CPU share not judged (0.10 s)"
    assert ServerTime(None, 1.0, 2).text() == "CPU share not available"
    ld = RepeatLoad((3.9, 3.0, 2.0), (4.1, 3.1, 2.0), {"none": quiet, "advised": busy})
    assert ld.text() == (
        "load average 3.90 at the start, 4.10 at the end; none: CPU share 95% of 2 threads; "
        "advised: CPU share 15% of 2 threads: the machine was busy"
    )
    assert ld.cpu_share == pytest.approx(2.2 / 4)  # both servers pooled
    d = ld.to_dict()
    assert d["load_average"] == {"start": [3.9, 3.0, 2.0], "end": [4.1, 3.1, 2.0]}
    assert d["cpu_seconds"] == pytest.approx(2.2) and d["wall_seconds"] == 2.0 and d["cpu_busy"] is True
    assert d["by_server"]["advised"]["cpu_busy"] is True
    assert RepeatLoad(None, None, {"none": quiet, "advised": ServerTime(None, 1.0, 2)}).cpu_share is None


def test_a_process_cpu_seconds_are_read_from_proc():
    assert process_cpu_seconds(None) is None
    if os.path.exists(f"/proc/{os.getpid()}/stat"):
        assert process_cpu_seconds(os.getpid()) >= 0


def test_max_repeats_below_repeats_is_refused_before_a_server_starts():
    adv = SimpleNamespace(best=SimpleNamespace(speedup=1.5), text="", flags="--spec-type none")
    with pytest.raises(LlamaServerError, match="max_repeats"):
        check_advice(adv, ["a"], "model.gguf", repeats=3, max_repeats=2)
    assert live_servers() == []
