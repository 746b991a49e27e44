"""How much of the machine a run had: the CPU share's arithmetic, the busy rule at its boundary, the run
line's wording, the per-round counters on a real round, and their recording (old recordings still load)."""

from __future__ import annotations

import pytest

from specviz import Recorder, read_events
from specviz.cli.generate import cpu_line
from specviz.decoding.events import Finished, SessionStarted, Verified, event_from_dict
from specviz.decoding.machine import MachineSampler
from specviz.decoding.machine_load import BUSY_SHARE, is_busy, judged_share_text, load_average, share_text
from specviz.decoding.telemetry import Telemetry, cpu_share, figures


def test_cpu_share_is_cpu_over_wall_times_threads():
    assert cpu_share(3.0, 2.0, 2) == 0.75  # 3 CPU seconds of the 4 two threads had in 2 s
    assert cpu_share(0.76, 1.0, 2) == pytest.approx(0.38)
    assert cpu_share(1.0, 0.76, 2) == pytest.approx(0.6579, abs=1e-4)  # cpu and wall swapped: another figure
    assert cpu_share(2.0, 1.0, 1) == 2.0  # not clamped: spinning workers can pass 1
    assert cpu_share(1.0, 0.0, 2) is None  # no wall time
    assert cpu_share(1.0, 2.0, None) is None  # threads not known
    assert cpu_share(1.0, 2.0, 0) is None


def test_the_busy_rule_at_its_boundary():
    assert not is_busy(BUSY_SHARE)
    assert is_busy(BUSY_SHARE - 1e-9)
    assert not is_busy(0.95)
    assert not is_busy(None)  # an unknown share is not called busy


def test_share_text_says_busy_only_below_the_threshold():
    assert share_text(0.38, 2) == "CPU share 38% of 2 threads: the machine was busy"
    assert share_text(0.92, 2) == "CPU share 92% of 2 threads"
    assert share_text(0.9, 1) == "CPU share 90% of 1 thread"
    assert share_text(None, 2) == share_text(0.5, None) == "CPU share not available"


def _figures(cpu: float, wall: float, threads: int | None) -> dict:
    t = Telemetry()
    for _ in range(2):  # two rounds of half the times each
        t.record_round(
            n_drafted=0,
            n_accepted=0,
            n_committed=1,
            draft_seconds=0.0,
            verify_seconds=wall / 4,
            round_seconds=wall / 2,
            cpu_seconds=cpu / 2,
            n_threads=threads,
        )
    return figures(t)


def test_telemetry_sums_the_raw_cpu_seconds_and_derives_the_share():
    f = _figures(0.76, 1.0, 2)
    assert f["cpu_seconds"] == pytest.approx(0.76) and f["seconds"] == pytest.approx(1.0)
    assert f["n_threads"] == 2
    assert f["cpu_share"] == pytest.approx(0.38) and f["cpu_busy"] is True
    assert f["last_round"]["cpu_seconds"] == pytest.approx(0.38)
    quiet = _figures(1.9, 1.0, 2)
    assert quiet["cpu_share"] == pytest.approx(0.95) and quiet["cpu_busy"] is False
    unknown = _figures(0.5, 1.0, None)
    assert unknown["n_threads"] is None and unknown["cpu_share"] is None and unknown["cpu_busy"] is False


def test_the_run_line_words_the_share_and_the_load_average():
    busy = _figures(0.76, 1.0, 2)
    busy["machine"] = {"load_average": {"start": [2.5, 1.0, 0.5], "latest": [3.25, 1.5, 0.75]}}
    assert cpu_line(busy) == (
        "CPU share 38% of 2 threads: the machine was busy; load average 2.50 at the start, 3.25 at the end"
    )
    quiet = _figures(1.9, 1.0, 2)
    assert cpu_line(quiet) == "CPU share 95% of 2 threads"  # no machine figures: no load average
    quiet["machine"] = {"load_average": {"start": None, "latest": None}}
    assert cpu_line(quiet) == "CPU share 95% of 2 threads"
    assert cpu_line(_figures(0.5, 1.0, None)) == "CPU share not available"


def test_machine_figures_carry_the_load_average_at_the_start_and_latest():
    m = MachineSampler(thermal_glob="/nonexistent/*", freq_glob="/nonexistent/*")
    load = m.figures()["load_average"]
    now = load_average()
    if now is None:
        assert load == {"start": None, "latest": None}
    else:
        assert len(load["start"]) == 3 and all(x >= 0 for x in load["start"])
        assert len(load["latest"]) == 3


def test_a_real_round_fills_the_counters(tiny_session):
    s = tiny_session
    s.start("the a the a the a", 12, "prompt-lookup", max_ngram=2, draft_max=4)
    s.run()
    verified = [e for e in s.events if isinstance(e, Verified)]
    assert verified
    for e in verified:
        assert e.cpu_seconds is not None and e.cpu_seconds >= 0
        assert e.round_seconds is not None and e.round_seconds >= e.seconds
        assert e.n_threads == 1  # the fixture's setting (this host has more cores)
    assert s.ctx.n_threads == 1
    t = s.telemetry_dict()
    assert t["cpu_seconds"] == pytest.approx(sum(e.cpu_seconds for e in verified))
    assert t["seconds"] == pytest.approx(sum(e.round_seconds for e in verified))
    assert t["n_threads"] == 1
    assert t["cpu_share"] == pytest.approx(t["cpu_seconds"] / t["seconds"])
    started = next(e for e in s.events if isinstance(e, SessionStarted))
    finished = next(e for e in s.events if isinstance(e, Finished))
    for ev in (started, finished):
        assert ev.load_average is None if load_average() is None else len(ev.load_average) == 3


def test_the_recording_round_trips_the_new_fields(tiny_session, tmp_path):
    path = tmp_path / "rec.jsonl"
    with Recorder(path) as rec:
        tiny_session.subscribe(rec)
        tiny_session.start("the a the a the a", 10, "prompt-lookup", max_ngram=2, draft_max=4)
        tiny_session.run()
    back = read_events(path)
    live = [e for e in tiny_session.events if isinstance(e, Verified)]
    read = [e for e in back if isinstance(e, Verified)]
    assert [(e.cpu_seconds, e.round_seconds, e.n_threads) for e in read] == [
        (e.cpu_seconds, e.round_seconds, e.n_threads) for e in live
    ]
    assert all(e.n_threads == 1 for e in read)
    started = next(e for e in back if isinstance(e, SessionStarted))
    finished = next(e for e in back if isinstance(e, Finished))
    live_started = next(e for e in tiny_session.events if isinstance(e, SessionStarted))
    assert started.load_average == live_started.load_average  # a tuple again after JSON's list
    assert finished.load_average is None or isinstance(finished.load_average, tuple)


def test_events_recorded_before_the_fields_still_load():
    v = event_from_dict({"kind": "verified", "round": 1, "seconds": 0.01, "batch_size": 3})
    assert isinstance(v, Verified) and (v.cpu_seconds, v.round_seconds, v.n_threads) == (None, None, None)
    s = event_from_dict({"kind": "session_started", "round": 0, "strategy": "none"})
    assert isinstance(s, SessionStarted) and s.load_average is None
    f = event_from_dict({"kind": "finished", "round": 3, "reason": "eos", "n_generated": 2})
    assert isinstance(f, Finished) and f.load_average is None
    # telemetry counters saved before the CPU counters existed: no share, not busy
    t = figures(Telemetry.from_state({"rounds": 2, "seconds": 1.0, "generated": 4}))
    assert t["cpu_seconds"] == 0.0 and t["cpu_share"] is None and t["cpu_busy"] is False


def test_a_share_taken_over_too_short_a_time_is_not_judged():
    assert judged_share_text(0.3, 0.5, 2) == "CPU share 30% of 2 threads: the machine was busy"
    assert judged_share_text(0.3, 0.05, 2) == "CPU share not judged (0.05 s)"
    assert judged_share_text(None, 0.05, 2) == judged_share_text(0.3, 0.5, None) == "CPU share not available"
