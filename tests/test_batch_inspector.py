"""A batched run in the inspector (specviz/ui/batch_stream.py, specviz/ui/parallel_advice.py): a batched
recording is replayed as its followed request's rounds beside every step's ``batch_step`` event, one step a
replay step; the advice of a batched recording adds the advice under load (``parallel``) from a batch-cost table
given or measured on Advise, or says why it has none; a one-request recording is replayed as before."""

from __future__ import annotations

import json

import pytest
from batch_recording import record_batched_run
from test_advise_parallel import KNEE

from specviz.decoding.events import BatchStepped, SessionStarted
from specviz.decoding.recorder import read_events
from specviz.errors import KnobError
from specviz.ui.batch_stream import batched_groups, followed_request, is_batched, sessions_of
from specviz.ui.core import InspectorCore
from specviz.ui.parallel_advice import chart_parallels, read_batch_cost
from specviz.ui.protocol import outgoing_problem


@pytest.fixture(scope="module")
def batched(tiny_model_path, tmp_path_factory):
    """A recorded batched run: the file and its steps."""
    path = tmp_path_factory.mktemp("batched") / "batched.jsonl"
    steps = record_batched_run(tiny_model_path, path)
    return path, steps


def test_a_batched_recording_is_laid_out_as_the_followed_requests_rounds_and_every_step(batched):
    path, steps = batched
    events = read_events(path)
    assert is_batched(events) and followed_request(events) == 0
    groups = batched_groups(events)
    own = sessions_of(events)[0]
    assert len(sessions_of(events)) == 4
    assert groups[0] == [e for e in own if e.round == 0] and isinstance(groups[0][0], SessionStarted)
    # one group per step, in step order, each ending with its step's event
    assert [g[-1].round for g in groups[1:]] == [s["round"] for s in steps]
    assert all(isinstance(g[-1], BatchStepped) for g in groups[1:])
    # the followed request's events all appear once, in order, each round beside the step that ran it
    shown = [e for g in groups for e in g if not isinstance(e, BatchStepped)]
    assert shown == own
    for g in groups[1:]:
        mine = {e.round for e in g[:-1]}
        lane = next((x for x in g[-1].lanes if x["request"] == 0), None)
        assert mine == ({lane["round"]} if lane is not None else set())


def test_the_inspector_replays_a_batched_recording_step_by_step(batched):
    path, steps = batched
    sent: list[dict] = []
    core = InspectorCore(sent.append, events=read_events(path))
    kinds = [e["kind"] for e in core.log]
    assert kinds.count("session_started") == 1 and kinds[0] == "session_started"
    assert kinds.count("batch_step") == len(steps) and core.epoch == 0
    assert core.batched_events() is not None and len(core.batched_events()) == len(read_events(path))
    core.handle({"type": "hello", "epoch": -1, "have": 0})
    msgs = [m for m in sent if m["type"] == "events"]
    assert msgs and all(outgoing_problem(m) is None for m in msgs)
    # Reset rewinds the replay to the start; each Step shows one step of the run
    core.handle({"type": "cmd", "cmd": "reset"})
    assert [e["kind"] for e in core.log] == ["session_started"]
    assert core.step(1) == 1
    assert core.log[-1]["kind"] == "batch_step" and core.log[-1]["round"] == 1
    assert [e["kind"] for e in core.log].count("draft_proposed") == 1  # the followed request's first round


def test_a_one_request_recording_is_replayed_as_before(tiny_session, tmp_path):
    from specviz.decoding.recorder import Recorder

    path = tmp_path / "one.jsonl"
    with Recorder(path) as rec:
        tiny_session.subscribe(rec)
        tiny_session.start("the a of the a of", 12, "prompt-lookup")
        tiny_session.run()
    core = InspectorCore(lambda m: None, events=read_events(path))
    assert core.batched_events() is None
    assert [e["kind"] for e in core.log] == [e.kind for e in read_events(path)]
    core.handle({"type": "advise"})
    assert "parallel" not in core.workbench.advice and "parallel_note" not in core.workbench.advice


def test_the_advice_of_a_batched_recording_adds_the_advice_under_load_from_a_given_table(batched):
    path, steps = batched
    sent: list[dict] = []
    core = InspectorCore(sent.append, events=read_events(path), batch_cost=KNEE)
    core.handle({"type": "advise"})
    advice = [m for m in sent if m["type"] == "advice"][-1]["data"]
    par = advice["parallel"]
    busy = {sum(1 for x in s["lanes"] if x["rows"] > 0) for s in steps} - {0}
    assert [r["parallel"] for r in par["by_parallel"]] == chart_parallels({p: 1.0 for p in busy})
    assert set(par["load"]) == {str(p) for p in busy}  # the best single setting is for the load the run held
    assert par["cost_source"] == "given" and "break_even_parallel" in par
    assert all(set(s["speedups"]) >= {"1", "8"} for s in par["settings"].values())
    assert core.workbench.batch_cost is KNEE
    json.dumps(advice)


def test_without_a_table_or_the_recorded_model_the_advice_says_why(batched, tmp_path):
    path, _ = batched
    moved = tmp_path / "moved.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for d in lines:
        if d["kind"] == "session_started":
            d["model"] = str(tmp_path / "absent.gguf")
    moved.write_text("".join(json.dumps(d) + "\n" for d in lines))
    core = InspectorCore(lambda m: None, events=read_events(moved))
    core.handle({"type": "advise"})
    advice = core.workbench.advice
    assert "parallel" not in advice and "--batch-cost" in advice["parallel_note"]
    assert advice["best"] is not None or advice["text"]  # the advice itself is still given


@pytest.mark.slow
def test_advise_on_a_batched_recording_measures_the_table_once(batched):
    path, _ = batched
    charged: list[int] = []
    core = InspectorCore(lambda m: None, events=read_events(path), charge=charged.append)
    core.handle({"type": "advise"})
    par = core.workbench.advice["parallel"]
    table = core.workbench.batch_cost
    assert par["cost_source"] == "measured now on the recorded model" and table is not None
    assert set(chart_parallels({})) <= set(table.sequences)
    core.handle({"type": "advise"})  # kept: the second press does not measure again
    assert core.workbench.batch_cost is table and core.workbench.advice["parallel"]["by_parallel"] == par["by_parallel"]
    assert max(charged) > 100  # the measurement was charged as work


def test_a_batch_cost_table_file_is_read_or_refused_naming_it(tmp_path):
    good = tmp_path / "table.json"
    good.write_text(json.dumps(KNEE.to_dict()))
    assert read_batch_cost(good).sequences == KNEE.sequences and read_batch_cost(None) is None
    wrapped = tmp_path / "advice.json"
    wrapped.write_text(json.dumps({"by_parallel": [], "batch_cost": KNEE.to_dict()}))  # advise --parallel --json
    assert read_batch_cost(wrapped).draft_lengths == KNEE.draft_lengths
    for name, text in (("bad.json", "{"), ("empty.json", "{}"), ("list.json", "[1]")):
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(KnobError, match=name):
            read_batch_cost(p)
    with pytest.raises(KnobError, match="absent.json"):
        read_batch_cost(tmp_path / "absent.json")


@pytest.mark.slow
def test_replay_refuses_a_bad_batch_cost_table_before_serving(batched, tmp_path):
    from test_cli import run_cli

    path, _ = batched
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    p = run_cli("replay", str(path), "--batch-cost", str(bad), "--port", "1")
    assert p.returncode == 2 and "option --batch-cost" in p.stderr and "bad.json" in p.stderr


@pytest.mark.slow
def test_a_request_log_run_n_at_a_time_records_its_steps_for_the_inspector(tiny_model_path, tmp_path):
    from test_cli import run_cli

    log = tmp_path / "log.jsonl"
    prompts = ["the a of the a of the a of", "of of the a the of of", "a a a of the the a"]
    log.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n" for p in prompts))
    rec = tmp_path / "rec.jsonl"
    args = ["--model", str(tiny_model_path), "--requests", str(log), "--chat-template", "chatml", "-np", "2"]
    p = run_cli("run", *args, "--max-tokens", "16", "-c", "1024", "-t", "1", "--record", str(rec), "--json")
    assert p.returncode == 0, p.stderr
    events = read_events(rec)
    steps = [e for e in events if isinstance(e, BatchStepped)]
    assert steps and sum(1 for e in events if isinstance(e, SessionStarted)) == 3
    assert {lane["request"] for s in steps for lane in s.lanes} == {0, 1, 2} and max(s.busy for s in steps) == 2
    core = InspectorCore(lambda m: None, events=events)
    assert [e["kind"] for e in core.log].count("batch_step") == len(steps)
    assert [e["kind"] for e in core.log].count("session_started") == 1


def test_a_live_batched_run_is_stepped_by_the_inspector_as_its_recording_is_replayed(tiny_model_path):
    from batch_recording import PROMPTS

    from specviz.decoding.batch import BatchRun

    sent: list[dict] = []
    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1) as run:
        for prompt, n in zip(PROMPTS[:3], [20, 12, 16]):
            run.submit(prompt, n, "prompt-lookup", draft_max=4, max_ngram=2, min_ngram=1)
        core = InspectorCore(sent.append, batch=run, batch_cost=KNEE)
        st = core.state()
        assert core.log == [] and st["can_step"] and not st["can_control"] and not st["can_reset"]
        assert core.step(1) == 1  # the first step: the followed request's start and round, then the step
        assert core.log[0]["kind"] == "session_started" and core.log[-1]["kind"] == "batch_step"
        assert core.step(10_000) > 1 and not run.pending
        assert core.state()["finished"] == "all 3 requests" and not core.state()["can_step"]
        # the page saw what a replay of the run's recording shows, in one epoch
        whole = core.batched_events()
        assert core.log == [e.to_dict() for g in batched_groups(whole) for e in g] and core.epoch == 0
        assert sum(isinstance(e, SessionStarted) for e in whole) == 3
        assert all(outgoing_problem(m) is None for m in sent)
        core.handle({"type": "advise"})
        assert core.workbench.advice["parallel"]["cost_source"] == "given"
        # nothing on the page resets or reconfigures the run's requests
        before = list(core.log)
        for msg in ({"type": "cmd", "cmd": "reset"}, {"type": "configure", "strategy": "none", "knobs": {}}):
            core.handle(msg)
            assert sent[-1]["type"] in ("notice", "knob_errors") and core.log == before
        core.close()


def test_the_notebook_widget_shows_a_live_batched_run(tiny_model_path):
    from specviz import Inspector
    from specviz.decoding.batch import BatchRun

    with BatchRun(tiny_model_path, n_parallel=2, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1) as run:
        run.submit("the a of the a of", 8, "prompt-lookup")
        run.submit("of of the a the", 8, "none")
        w = Inspector.batched(run, batch_cost=KNEE)
        assert w.session is None and w.step(100) >= 2 and not run.pending
        assert [e["kind"] for e in w.log].count("batch_step") == len(run.events)
        assert "parallel" in w.advise()
        w.close()
