"""``specviz run --requests LOG -np N``: a request log run N requests at a time in llama-server's slots
(analysis.request_runs.run_requests_batched over decoding.batch.BatchRun), ``-np`` in ``--server-args``
applied, ``--chat-template`` with ``--requests``, and the refusals."""

from __future__ import annotations

import json

import pytest
from conftest import TINY
from test_cli import run_cli

from specviz import read_events
from specviz.analysis.server_args import parse_server_args
from specviz.cli import main as cli
from specviz.errors import KnobError
from specviz.testing.tiny_models import write_tiny_llama

#: chat requests of different lengths (requests finish, and queued ones take the free slot, at different
#: steps); the tiny model has no chat template of its own, so every run names a built-in one
LOG = [
    {"messages": [{"role": "user", "content": "the a of the a of the a of"}], "max_tokens": 40},
    {"custom_id": "two", "body": {"messages": [{"role": "user", "content": "of of the a the of of"}], "n_predict": 12}},
    {"messages": [{"role": "system", "content": "a a"}, {"role": "user", "content": "a a a of the the a"}]},
    {"messages": [{"role": "user", "content": "the the of a"}], "max_tokens": 20},
]
NGRAM = ["--strategy", "ngram-simple", "--size-n", "1", "--size-m", "4"]


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    """A tiny model without a chat template."""
    return write_tiny_llama(tmp_path_factory.mktemp("np") / "plain.gguf", **TINY)


def write_log(path, lines) -> str:
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


def run_json(*args) -> tuple[dict, str]:
    p = run_cli("run", *args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


@pytest.mark.slow
def test_np_2_gives_every_request_its_one_at_a_time_tokens(plain_model, tmp_path):
    log = write_log(tmp_path / "log.jsonl", LOG)
    common = ["--model", str(plain_model), "--requests", log, "--chat-template", "chatml", "-c", "1024", "-t", "1"]
    one, _ = run_json(*common, *NGRAM, "--max-tokens", "30")
    rec = tmp_path / "rec.jsonl"
    two, _ = run_json(*common, *NGRAM, "--max-tokens", "30", "-np", "2", "--record", str(rec))
    assert (
        [r["id"] for r in two["requests"]]
        == [r["id"] for r in one["requests"]]
        == ["request-1", "two", "request-3", "request-4"]
    )
    assert [r["tokens"] for r in two["requests"]] == [r["tokens"] for r in one["requests"]]
    assert [len(r["tokens"]) for r in two["requests"]] == [40, 12, 30, 20]
    assert [r["prompt_tokens"] for r in two["requests"]] == [r["prompt_tokens"] for r in one["requests"]]
    assert all(r["error"] is None and r["finish"] == "max_tokens" for r in two["requests"])
    # one at a time: one slot holding the whole cache, every decode one sequence (the requests' rounds)
    t1, t2 = one["totals"], two["totals"]
    assert (one["n_parallel"], one["n_ctx_seq"]) == (1, 1024) and {r["slot"] for r in one["requests"]} == {0}
    assert t1["mean_sequences_per_decode"] == 1.0 and t1["decodes"] == sum(r["decodes"] for r in one["requests"])
    # two slots of half the cache each; most decodes held both, and every request's rounds are in them
    assert (two["n_parallel"], two["n_ctx_seq"], two["kv_unified"]) == (2, 512, False)
    assert two["settings"]["n_ctx"] == 1024 and {r["slot"] for r in two["requests"]} == {0, 1}
    assert 1.0 < t2["mean_sequences_per_decode"] <= 2.0 and t2["decodes"] < t1["decodes"]
    assert t2["decodes"] * t2["mean_sequences_per_decode"] == pytest.approx(sum(r["decodes"] for r in two["requests"]))
    assert [r["decodes"] for r in two["requests"]] == [r["decodes"] for r in one["requests"]]
    assert t2["drafted"] == t1["drafted"] > 0 and t2["n_generated"] == t1["n_generated"] and t2["failed"] == 0
    assert t2["wall_seconds"] > 0 and t2["tokens_per_wall_second"] > 0
    assert all(r["n_threads"] == 1 and "cpu_share" in r for r in two["requests"])  # each its own session's
    # the recording: every request in submission order, one session_started each
    started = [e for e in read_events(rec) if e.kind == "session_started"]
    assert [len(e.prompt_tokens) for e in started] == [r["prompt_tokens"] for r in two["requests"]]


@pytest.mark.slow
def test_the_server_lines_np_runs_the_log_batched_in_its_slots(plain_model, tmp_path):
    log = write_log(tmp_path / "log.jsonl", LOG)
    line = f"-m {plain_model} --spec-type ngram-simple --spec-ngram-simple-size-n 1 --spec-ngram-simple-size-m 4 "
    line += "--chat-template chatml -t 1 --temp 0 --metrics"
    one, _ = run_json("--requests", log, "--server-args", line + " -c 1024", "--max-tokens", "24")
    two, err = run_json("--requests", log, "--server-args", line + " -np 2 -c 1024", "--max-tokens", "24")
    assert "-np" not in err and "--metrics: serving only" in err  # -np applied, nothing said about it
    assert (two["n_parallel"], two["n_ctx_seq"]) == (2, 512)  # -c split over the slots as llama.cpp splits it
    assert [r["tokens"] for r in two["requests"]] == [r["tokens"] for r in one["requests"]]
    # each request through the server's loop, counted as the server counts it, the same as one at a time
    assert [r["server_counts"] for r in two["requests"]] == [r["server_counts"] for r in one["requests"]]
    assert sum(r["server_counts"]["draft_n"] for r in two["requests"]) > 0
    assert 1.0 < two["totals"]["mean_sequences_per_decode"] <= 2.0
    # -kvu: one pool, each slot may hold the whole cache
    uni, _ = run_json("--requests", log, "--server-args", line + " -np 2 -kvu -c 1024", "--max-tokens", "24")
    assert (uni["n_parallel"], uni["kv_unified"], uni["n_ctx_seq"]) == (2, True, 1024)
    assert [r["tokens"] for r in uni["requests"]] == [r["tokens"] for r in one["requests"]]


def test_the_server_lines_slots_are_read_as_llama_server_reads_them():
    cfg = parse_server_args("llama-server -m m.gguf -np 4 -kvu -c 2048")
    assert (cfg.n_parallel, cfg.kv_unified, cfg.settings.n_ctx) == (4, True, 2048) and not cfg.warnings
    assert parse_server_args("--parallel 3 --no-kv-unified").to_dict()["n_parallel"] == 3
    auto = parse_server_args("-m m.gguf -np -1")
    assert auto.n_parallel == 1 and any("-np -1: llama-server's auto" in w for w in auto.warnings)
    assert parse_server_args("-m m.gguf").n_parallel == 1
    for bad in ("0", "x", "257"):
        with pytest.raises(KnobError, match="llama-server option -np"):
            parse_server_args(f"-m m.gguf -np {bad}")


@pytest.mark.slow
def test_chat_template_runs_a_log_on_a_model_without_one(plain_model, tmp_path):
    log = write_log(tmp_path / "log.jsonl", LOG[:2])
    p = run_cli("run", "--model", str(plain_model), "--requests", log, "--max-tokens", "4")
    assert p.returncode == 1 and p.stderr.count("has no chat template") == 2  # each request ends with it
    assert "2 of 2 requests ended with an error" in p.stderr
    p = run_cli("run", "--model", str(plain_model), "--requests", log, "--max-tokens", "4", "--chat-template", "llama3")
    assert p.returncode == 0 and "2 requests, " in p.stdout, p.stderr


@pytest.mark.parametrize(
    "extra,words",
    [
        (["-np", "0"], "option -np: parallel (-np) must be an integer of at least 1"),
        (["--parallel", "-3"], "option -np: parallel (-np) must be an integer of at least 1"),
        (["-np", "two"], "option -np: 'two' is not allowed"),
        (["-np", "999"], "at most 256 sequences"),
        (["--chat-template", "no-such-template"], "option --chat-template: 'no-such-template' is not one of"),
        (["--server-args", "-np 0"], "llama-server option -np 0"),
        (["--server-args", "-np 2", "-np", "2"], "option -np conflicts with --server-args"),
        (["--draft-schedule", "1-2:0"], "option --draft-schedule: only with -np N above 1"),
        (["-np", "2", "--draft-schedule", "1-2"], "option --draft-schedule: draft schedule '1-2': entry '1-2' is not"),
        (["-np", "2", "--draft-schedule", "1-3:4,2-4:0"], "option --draft-schedule: draft schedule entries"),
    ],
)
def test_refused_before_the_model_loads(tmp_path, capsys, extra, words):
    not_a_model = tmp_path / "not-a-model.gguf"
    not_a_model.write_text("loading this would fail otherwise")
    log = write_log(tmp_path / "log.jsonl", LOG[:1])
    assert cli.main(["run", "--model", str(not_a_model), "--requests", log, *extra]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("np_", ["1", "2"])
def test_a_request_refused_by_its_own_line_ends_with_its_error_and_the_others_run(plain_model, tmp_path, np_):
    good = write_log(tmp_path / "good.jsonl", [LOG[0], LOG[1], LOG[3]])
    bad_line = {"messages": [{"role": "user", "content": "the a"}], "top_p": 5, "temperature": 0.5}
    bad = write_log(tmp_path / "bad.jsonl", [LOG[0], LOG[1], bad_line, LOG[3]])
    common = ["--model", str(plain_model), "--chat-template", "chatml", "-c", "1024", *NGRAM, "-np", np_]
    ref, _ = run_json("--requests", good, *common)
    p = run_cli("run", "--requests", bad, *common, "--json")
    assert p.returncode == 1 and "1 of 4 requests ended with an error" in p.stderr
    out = json.loads(p.stdout)
    failed = out["requests"][2]
    assert failed["finish"] == "error" and failed["tokens"] == [] and "top_p" in failed["error"]
    assert out["totals"]["failed"] == 1 and out["totals"]["requests"] == 4
    others = [r for r in out["requests"] if r["error"] is None]
    assert [r["tokens"] for r in others] == [r["tokens"] for r in ref["requests"]]


@pytest.mark.slow
def test_a_draft_schedule_caps_every_requests_draft_by_the_busy_slots(plain_model, tmp_path):
    log = write_log(tmp_path / "log.jsonl", LOG)
    common = ["--model", str(plain_model), "--requests", log, "--chat-template", "chatml", "-c", "1024", "-t", "1"]
    common += [*NGRAM, "--max-tokens", "24", "-np", "2"]
    free, _ = run_json(*common)
    capped, _ = run_json(*common, "--draft-schedule", "1-2:0")  # no draft while one or two slots are busy
    assert free["totals"]["drafted"] > 0 and capped["totals"]["drafted"] == 0
    assert "draft_schedule" not in free and capped["draft_schedule"] == [[1, 2, 0]]
    assert [r["tokens"] for r in capped["requests"]] == [r["tokens"] for r in free["requests"]]


@pytest.mark.slow
def test_a_single_prompt_with_np_is_a_batch_of_one_in_its_slots_share(plain_model):
    common = ["--model", str(plain_model), "--prompt", "the a of the a of", "--max-tokens", "16", "-c", "1024"]
    one, _ = run_json(*common, *NGRAM)
    two, _ = run_json(*common, *NGRAM, "-np", "2")
    assert two["tokens"] == one["tokens"] and len(two["tokens"]) == 16
    assert (one["n_parallel"], one["n_ctx_seq"]) == (1, 1024) and (two["n_parallel"], two["n_ctx_seq"]) == (2, 512)


@pytest.mark.slow
def test_a_server_line_without_swa_full_runs_its_slots_on_the_full_size_cache(tmp_path):
    from specviz.testing.memory_models import write_tiny_gemma3_swa

    model = write_tiny_gemma3_swa(tmp_path / "gemma3.gguf", sliding_window=8)
    log = write_log(tmp_path / "log.jsonl", LOG[:2])
    line = f"-m {model} --spec-type ngram-simple --chat-template chatml -np 2 -c 512 -t 1"
    ring, err = run_json("--requests", log, "--server-args", line, "--max-tokens", "12")
    assert "without --swa-full: llama-server's slots keep the ring-sized sliding-window cache" in err
    full, err = run_json("--requests", log, "--server-args", line + " --swa-full", "--max-tokens", "12")
    assert "without --swa-full" not in err
    assert [r["tokens"] for r in ring["requests"]] == [r["tokens"] for r in full["requests"]]
    assert ring["totals"]["failed"] == 0 and ring["n_parallel"] == 2
    # asked for by name, the ring is refused when the context opens
    p = run_cli("run", "--model", str(model), "--requests", log, "--chat-template", "chatml", "-np", "2", "--swa-ring")
    assert p.returncode == 1 and "ring-sized sliding-window cache" in p.stderr


@pytest.mark.slow
def test_replay_of_a_log_names_the_lines_np_it_does_not_apply(plain_model, tmp_path, monkeypatch, capsys):
    import specviz.server.app as app

    monkeypatch.setattr(app, "replay", lambda path, port, **kw: None)
    log = write_log(tmp_path / "log.jsonl", LOG[:2])
    line = f"-m {plain_model} --chat-template chatml -np 2"
    rec = tmp_path / "rec.jsonl"
    assert cli.main(["replay", log, "--server-args", line, "--max-tokens", "4", "--record", str(rec)]) == 0
    err = capsys.readouterr().err
    assert "--server-args -np 2: replay runs one request at a time; not applied" in err
    # the line's --chat-template reaches every request (the model has no template of its own)
    assert "ended with an error" not in err
    assert sum(1 for e in read_events(rec) if e.kind == "session_started") == 2


def test_where_one_request_runs_at_a_time_the_lines_np_is_named(plain_model):
    from specviz import Session
    from specviz.ui.deployment import read_deployment

    cfg = parse_server_args("-np 3 --port 8080")
    assert cfg.warnings_one_at_a_time("replay")[-1].startswith("-np 3: replay runs one request at a time; not")
    assert parse_server_args("-np 1").warnings_one_at_a_time("replay") == []
    with Session(plain_model, n_ctx=256, n_threads=1) as s:
        d = read_deployment(s, None, "-np 3 -c 256")
    assert any("-np 3: a page runs one request at a time" in w for w in d.warnings)
