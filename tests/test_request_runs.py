"""A deployment's request log through ``specviz run --requests`` and ``specviz replay`` (analysis.request_runs)."""

from __future__ import annotations

import json

import pytest
from conftest import TINY
from test_cli import run_cli
from test_request_log import LOG
from test_sweep_run import CHATML

from specviz import Session, read_events
from specviz.analysis.request_runs import RequestRun, pooled_cpu_share, request_start_args, run_requests
from specviz.sweep.request_log import read_request_log
from specviz.testing.tiny_models import write_tiny_llama


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("reqs") / "chat.gguf", chat_template=CHATML, **TINY)


@pytest.fixture()
def request_log(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in LOG) + "\n")
    return path


def test_each_request_runs_with_its_own_options(chat_model, request_log):
    requests, _ = read_request_log(request_log)
    assert request_start_args(requests[1], max_tokens=99) == (16, {"stop": ["\n\n"]})
    assert request_start_args(requests[2], max_tokens=99, sampling={"temperature": 0.0}) == (99, {"temperature": 0.0})
    s = Session(chat_model, n_ctx=1024, n_threads=1)
    runs = run_requests(s, requests, "ngram-simple", {"size_n": 2, "size_m": 4}, max_tokens=20)
    assert [r.id for r in runs] == ["request-1", "req-7", "request-3"]
    assert all(r.n_threads == 1 and r.cpu_seconds >= 0 and "CPU share" in r.cpu_text() for r in runs)
    assert len(runs[0].tokens) == 32 or runs[0].finish != "max_tokens"
    assert len(runs[2].tokens) == 20 or runs[2].finish != "max_tokens"
    # the same conversation started by hand gives the same tokens
    s.start(None, 16, "ngram-simple", messages=requests[1].message_dicts(), stop=["\n\n"], size_n=2, size_m=4)
    s.run()
    assert s.tokens == runs[1].tokens and s.n_prompt == runs[1].prompt_tokens
    s.close()


@pytest.mark.slow
def test_run_requests_on_the_command_line(chat_model, request_log, tmp_path):
    rec = tmp_path / "rec.jsonl"
    p = run_cli(
        "run", "--model", str(chat_model), "--requests", str(request_log), "--strategy", "ngram-simple",
        "--max-tokens", "20", "--json", "--record", str(rec),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert [r["id"] for r in out["requests"]] == ["request-1", "req-7", "request-3"]
    assert out["totals"]["requests"] == 3 and out["totals"]["n_generated"] == sum(
        len(r["tokens"]) for r in out["requests"]
    )
    assert sum(1 for e in read_events(rec) if e.kind == "session_started") == 3
    for r in out["requests"]:  # each request's share, from its telemetry (None when too short to judge)
        assert r["n_threads"] >= 1 and r["cpu_seconds"] >= 0
        assert r["cpu_share"] is None or r["cpu_share"] == pytest.approx(
            r["cpu_seconds"] / r["seconds"] / r["n_threads"]
        )
    assert "cpu_share" in out["totals"]
    p = run_cli("advise", str(rec), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["llama_cpp_flags"].startswith("--spec-type")
    p = run_cli("run", "--model", str(chat_model), "--requests", str(request_log), "--max-tokens", "8")
    assert p.returncode == 0 and "req-7: " in p.stderr and "3 requests" in p.stdout
    assert p.stderr.count("; CPU share ") == 3 and "; CPU share " in p.stdout


@pytest.mark.slow
def test_run_requests_through_the_servers_loop(chat_model, request_log):
    line = f"-m {chat_model} --spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 4 -c 1024"
    p = run_cli("run", "--requests", str(request_log), "--server-args", line, "--max-tokens", "20", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert all(r["server_counts"] is not None for r in out["requests"])
    assert all(r["n_threads"] >= 1 and "cpu_share" in r for r in out["requests"])
    assert out["settings"]["n_ctx"] == 1024


@pytest.mark.parametrize(
    "extra,words",
    [(["--prompt", "x"], "option --prompt conflicts with --requests"), (["--chat"], "option --chat conflicts")],
)
def test_requests_refuse_a_prompt_beside_them(request_log, extra, words):
    p = run_cli("run", "--requests", str(request_log), *extra)
    assert p.returncode == 2 and words in p.stderr


def test_a_malformed_log_is_refused_naming_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(LOG[0]) + "\n{oops\n")
    p = run_cli("run", "--requests", str(bad))
    assert p.returncode == 2 and f"{bad}:2: not valid JSON" in p.stderr


@pytest.mark.slow
def test_replay_of_a_request_log_runs_records_and_replays(chat_model, request_log, tmp_path, monkeypatch):
    import specviz.server.app as app
    from specviz.cli.main import main

    shown = []
    monkeypatch.setattr(app, "replay", lambda path, port, **kw: shown.append(path))
    rec = tmp_path / "kept.jsonl"
    argv = ["replay", str(request_log), "--model", str(chat_model), "--max-tokens", "8", "--record", str(rec)]
    assert main(argv) == 0
    assert shown == [str(rec)]
    assert sum(1 for e in read_events(rec) if e.kind == "session_started") == 3
    assert main(["replay", str(rec)]) == 0 and shown[-1] == str(rec)  # a recording replays as it is
    assert main(["replay", str(rec), "--model", str(chat_model)]) == 2


def _request(seconds, cpu_seconds, n_threads=2):
    return RequestRun("r", 5, [1, 2], "ab", 4, 2, seconds, "max_tokens", cpu_seconds=cpu_seconds, n_threads=n_threads)


def test_a_requests_cpu_share_is_judged_over_its_own_rounds():
    busy = _request(1.0, 0.6)
    assert busy.cpu_share == pytest.approx(0.3) and busy.to_dict()["cpu_share"] == pytest.approx(0.3)
    assert busy.cpu_text() == "CPU share 30% of 2 threads: the machine was busy"
    assert _request(1.0, 1.9).cpu_text() == "CPU share 95% of 2 threads"
    short = _request(0.05, 0.1)
    assert short.cpu_share is None and short.to_dict()["cpu_share"] is None
    assert short.cpu_text() == "CPU share not judged (0.05 s)"
    assert _request(1.0, 0.5, n_threads=None).cpu_text() == "CPU share not available"
    # short requests pooled: judged over their seconds together
    share, words = pooled_cpu_share([short] * 4)
    assert share == pytest.approx(1.0) and words == "CPU share 100% of 2 threads"
    assert pooled_cpu_share([short]) == (None, "CPU share not judged (0.05 s)")
