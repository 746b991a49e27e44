"""Sweeps on this machine: rows, pairing, one model load per worker, resuming, killed workers, chat templates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from specviz.sweep import GridSpec, LocalExecutor, build_grid, load_dataset, read_results, run_sweep  # noqa: E402
from specviz.sweep.execution import plan_tasks  # noqa: E402
from specviz.sweep.results import journal_path  # noqa: E402
from specviz.sweep.worker import RunConfig  # noqa: E402
from specviz.testing.tiny_models import write_tiny_llama  # noqa: E402

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Once upon a time, in a village", "And then the"]},
    {"question_id": 2, "category": "writing", "turns": ["def add(a, b): return a + b\ndef add(a, b):"]},
    {"question_id": 3, "category": "math", "turns": ["1, 2, 3, 4, 5, 6, 7, 8,"]},
]


@pytest.fixture()
def questions(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    return path


def small_grid(**kw):
    spec = dict(
        strategies=["prompt-lookup", "ngram-simple"], knobs={"draft_max": [2, 6]}, temperatures=[0, 0.8], max_tokens=40
    )
    spec.update(kw)
    return build_grid(GridSpec(**spec))


def sweep(dataset, grid, out, model, workers=1, **kw):
    """run_sweep on local worker processes, one llama.cpp thread each (the machine's cores are shared)."""
    return run_sweep(
        dataset,
        grid,
        out,
        model=model,
        executor=kw.pop("executor", None) or LocalExecutor(workers),
        threads=1,
        progress=False,
        **kw,
    )


def keys(df):
    return sorted(zip(df["question_id"], df["setting_key"], df["repeat"]))


@pytest.mark.slow
def test_local_sweep_rows_pairing_and_one_model_load_per_worker(tiny_model_path, questions, tmp_path):
    grid = small_grid(repeats=2)
    ds = load_dataset(str(questions))
    out = tmp_path / "r.parquet"
    summary = sweep(ds, grid, out, tiny_model_path, workers=2)
    df = read_results(out)
    assert summary.complete and not summary.failures and summary.new_rows == len(df) == 3 * 10 * 2
    assert len(set(keys(df))) == len(df)
    assert not journal_path(out).exists()  # a finished sweep leaves only the Parquet file
    # each worker process loaded the model once, and ran several tasks with it
    assert summary.tasks == 3 * 2 * 2 and set(summary.model_loads.values()) == {1}
    assert set(df["worker"]) == set(summary.model_loads) and os.getpid() not in {
        int(w.split(":")[1]) for w in df["worker"]
    }
    for (qid, _rep, temp), g in df.groupby(["question_id", "repeat", "temperature"]):
        none = g[g["strategy"] == "none"].iloc[0]
        # every run of a task is paired with the none run taken just before it on the same worker
        assert (g["none_tokens_per_second"] == none["tokens_per_second"]).all()
        assert g["speedup"].tolist() == pytest.approx((g["tokens_per_second"] / none["tokens_per_second"]).tolist())
        assert g["worker"].nunique() == 1 and g["seed"].nunique() == 1
        assert (g["turns"] == len(QUESTIONS[int(qid) - 1]["turns"])).all()
        assert all(sum(tl) == len(t) == n for tl, t, n in zip(g["turn_lengths"], g["tokens"], g["n_generated"]))
        if temp == 0:  # greedy speculative decoding is exact on the tiny fixture: every setting gives none's tokens
            assert all(list(t) == list(none["tokens"]) for t in g["tokens"])
    assert (df["prompt_format"] == "plain").all()  # the fixture has no chat template
    assert df[df["strategy"] != "none"]["drafted"].sum() > 0
    assert df.groupby(["question_id", "repeat"])["seed"].nunique().eq(1).all()
    assert df.groupby("question_id")["seed"].nunique().eq(2).all()  # repeats draw different samples
    # every run's CPU share, pooled over its turns: known, and within what one thread's time can read (a
    # quiet tiny-model run reads about 1; scheduler-tick accounting lets a short run pass it a little)
    assert (df["n_threads"] == 1).all()
    assert df["cpu_share"].notna().all() and df["cpu_share"].between(0, 4).all(), df["cpu_share"].describe()


def test_plan_runs_none_again_for_pairing_but_keeps_only_missing_rows(tiny_model_path, questions):
    grid = small_grid(temperatures=[0])
    ds = load_dataset(str(questions))
    cfg = RunConfig(str(tiny_model_path), 40, None)  # type: ignore[arg-type]
    none, pl2 = grid.settings[0], grid.settings[1]
    done = {("1", none.key, 0), ("1", pl2.key, 0)}
    tasks = plan_tasks(ds, grid, cfg, lambda k: k in done)
    first = tasks[0]
    assert first.prompt.id == "1" and first.settings[0] == none and pl2 not in first.settings
    assert none.key not in first.keep and len(first.keep) == len(grid.settings) - 2
    assert [t.prompt.id for t in tasks] == ["1", "2", "3"]
    every = {("1", s.key, 0) for s in grid.settings} | {("2", s.key, 0) for s in grid.settings}
    assert [t.prompt.id for t in plan_tasks(ds, grid, cfg, lambda k: k in every)] == ["3"]


@pytest.mark.slow
def test_resume_after_an_interruption_runs_only_what_is_missing(tiny_model_path, questions, tmp_path):
    grid = small_grid(temperatures=[0])
    ds = load_dataset(str(questions))
    out = tmp_path / "r.parquet"
    seen = []

    def stop(result):
        seen.append(result)
        raise KeyboardInterrupt  # as Ctrl-C right after the first task finished

    with pytest.raises(KeyboardInterrupt):
        sweep(ds, grid, out, tiny_model_path, on_result=stop)
    first = read_results(out)
    assert len(first) == len(seen[0].rows) == len(grid.settings)  # that task's rows, nothing else
    summary = sweep(ds, grid, out, tiny_model_path)
    assert summary.resumed_rows == len(first) and summary.tasks == 2 and summary.complete
    df = read_results(out)
    assert len(df) == 3 * len(grid.settings) and len(set(keys(df))) == len(df)
    kept = df.set_index(["question_id", "setting_key", "repeat"]).loc[keys(first)]
    assert (
        kept["finished_at"].tolist()
        == first.set_index(["question_id", "setting_key", "repeat"]).loc[keys(first)]["finished_at"].tolist()
    )  # the stored rows were not run again


def test_resume_refuses_a_file_made_with_another_budget(tiny_model_path, questions, tmp_path):
    from specviz.sweep import ResumeError

    ds = load_dataset(str(questions))
    out = tmp_path / "r.parquet"
    sweep(ds, small_grid(temperatures=[0], strategies=["none"], knobs={}), out, tiny_model_path)
    with pytest.raises(ResumeError, match="max_tokens 40, not 41"):
        sweep(ds, small_grid(temperatures=[0], strategies=["none"], knobs={}, max_tokens=41), out, tiny_model_path)


def _sweep_cmd(dataset, out, model, *extra):
    return [
        sys.executable,
        "-m",
        "specviz.cli",
        "sweep",
        str(dataset),
        "-o",
        str(out),
        "--model",
        str(model),
        "--strategy",
        "prompt-lookup",
        "--max-tokens",
        "300",
        "--workers",
        "1",
        "--threads",
        "1",
        "--no-progress",
        *extra,
    ]


@pytest.mark.slow
def test_a_killed_sweep_resumes_from_its_journal(tiny_model_path, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Story number {i}: once upon a time" for i in range(8)) + "\n")
    out = tmp_path / "r.parquet"
    # the driver and its worker processes, in a process group of their own so the test can kill them all
    p = subprocess.Popen(
        _sweep_cmd(prompts, out, tiny_model_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    journal = journal_path(out)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and p.poll() is None:
            if journal.exists() and journal.read_text().count("\n") >= 2:
                break
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        p.stderr.close()
    assert p.returncode == -signal.SIGKILL, "the sweep ended before it could be killed"
    before = read_results(out)
    assert 2 <= len(before) < 16
    done = subprocess.run(_sweep_cmd(prompts, out, tiny_model_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"16 of 16 runs stored ({len(before)} from before, {16 - len(before)} new)" in done.stderr
    df = read_results(out)
    assert len(df) == 16 and len(set(keys(df))) == 16
    assert not journal.exists()


@pytest.mark.slow
def test_a_killed_local_worker_is_replaced_and_its_task_runs_again(tiny_model_path, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Chapter {i}. It was a dark and stormy night" for i in range(6)) + "\n")
    grid = build_grid(GridSpec(strategies=["prompt-lookup"], max_tokens=600))
    killed = []

    def kill_one(result):
        if not killed:
            pid = int(result.worker.split(":")[1])
            os.kill(pid, signal.SIGKILL)  # a worker process of the pool this test's sweep started
            killed.append(pid)

    executor = LocalExecutor(2)
    out = tmp_path / "r.parquet"
    summary = sweep(load_dataset(str(prompts)), grid, out, tiny_model_path, executor=executor, on_result=kill_one)
    df = read_results(out)
    assert killed and executor.restarts >= 1
    assert summary.complete and not summary.failures
    assert len(df) == 12 and len(set(keys(df))) == 12
    assert set(summary.model_loads.values()) == {1}  # the new pool's workers loaded the model once each too


def test_a_failing_task_is_reported_and_the_others_kept(tiny_model_path, tmp_path, capsys):
    from specviz.cli import main as cli

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("short prompt\n" + "a long prompt " * 40 + "\nanother short one\n")
    out = tmp_path / "r.parquet"
    code = cli.main(
        [
            "sweep",
            str(prompts),
            "-o",
            str(out),
            "--model",
            str(tiny_model_path),
            "--strategy",
            "none",
            "--max-tokens",
            "8",
            "--n-ctx",
            "64",
            "--workers",
            "1",
            "--threads",
            "1",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "failed line-2|r0|T0: ContextError" in err and "2 of 3 runs stored" in err
    assert sorted(read_results(out)["question_id"]) == ["line-1", "line-3"]


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from conftest import TINY

    return write_tiny_llama(tmp_path_factory.mktemp("chat") / "tiny-chat.gguf", chat_template=CHATML, **TINY)


def test_chat_template_is_read_and_applied_by_llama_cpp(chat_model, tiny_model_path):
    from specviz.errors import ModelError
    from specviz.sweep.chat import conversation_text, decide_format, probe_format

    fmt = probe_format(str(chat_model), "auto")
    assert fmt.kind == "chat" and fmt.template == CHATML
    text = conversation_text(fmt, ["Q1", "Q2"], ["A1"], completion=False)
    assert text == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n"
    )
    assert conversation_text(fmt, ["Continue this"], [], completion=True) == "Continue this"  # workloads stay plain
    assert probe_format(str(chat_model), "plain").kind == "plain"
    assert probe_format(str(tiny_model_path), "auto").describe() == "plain (the model has no chat template)"
    with pytest.raises(ModelError, match="no chat template"):
        probe_format(str(tiny_model_path), "chat")
    odd = decide_format("{{ something llama.cpp does not know }}", "auto")
    assert odd.kind == "plain" and "does not recognise" in odd.note
    with pytest.raises(ModelError, match="does not recognise"):
        decide_format("{{ something llama.cpp does not know }}", "chat")


@pytest.mark.slow
def test_sweep_turns_go_through_the_chat_template(chat_model, questions, tmp_path):
    from specviz import Session
    from specviz.sweep.chat import conversation_text, probe_format, prompt_tokens

    out = tmp_path / "r.parquet"
    grid = build_grid(GridSpec(strategies=["prompt-lookup"], max_tokens=24))
    sweep(load_dataset(str(questions)), grid, out, chat_model)
    df = read_results(out)
    assert (df["prompt_format"] == "chat").all()
    row = df[(df["question_id"] == "1") & (df["strategy"] == "prompt-lookup")].iloc[0]
    # the same two turns, templated here and run in this process, give the row's tokens
    fmt = probe_format(str(chat_model), "auto")
    s = Session(chat_model, n_ctx=4096, n_threads=1)
    turns, answers, tokens, n_prompt = QUESTIONS[0]["turns"], [], [], 0
    for i in range(2):
        ids = prompt_tokens(s.model, fmt, conversation_text(fmt, turns[: i + 1], answers, False), False)
        assert ids[0] == s.model.bos and ids.count(s.model.bos) == 1
        s.start(ids, 24, "none")
        s.run()
        answers.append(s.text)
        tokens += s.tokens
        n_prompt += len(ids)
    s.close()
    assert list(row["tokens"]) == tokens and list(row["turn_lengths"]) == [
        len(t) for t in (tokens[: row["turn_lengths"][0]], tokens[row["turn_lengths"][0] :])
    ]
    assert row["prompt_tokens"] == n_prompt


def test_draft_models_are_settings_of_the_draft_strategy(tiny_model_path, questions, tmp_path):
    from specviz.models.derive import derive_draft

    draft = tmp_path / "draft.gguf"
    derive_draft(tiny_model_path, "0-1", draft)  # every layer kept: the target itself, so it drafts well
    grid = build_grid(GridSpec(strategies=["none"], draft_models=[str(draft)], max_tokens=24))
    out = tmp_path / "r.parquet"
    summary = sweep(load_dataset(str(questions)), grid, out, tiny_model_path)
    df = read_results(out)
    assert summary.complete and len(df) == 6
    drafted = df[df["strategy"] == "draft"]
    assert (drafted["knobs"].map(json.loads).map(lambda k: k["draft_model"]) == str(draft)).all()
    assert drafted["drafted"].sum() > 0 and drafted["accepted"].sum() == drafted["drafted"].sum()
    for _, g in df.groupby("question_id"):
        by = {s: list(g[g["strategy"] == s]["tokens"].iloc[0]) for s in ("draft", "none")}
        assert by["draft"] == by["none"]  # greedy: the same text as none
