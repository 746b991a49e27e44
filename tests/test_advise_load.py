"""The advisor's check of its own timings (specviz.analysis.advise_load): recordings with synthetic timings
for each rule (a burst, a steady load, a quiet run), the never-decline rule, a fresh curve that disagrees
with the recorded times, and recordings made before the CPU figures were recorded."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_advise import NO_TILE, linear
from test_diagnose import Rounds

from specviz.analysis.advise import advise
from specviz.analysis.advise_load import BURST_SHARE, CPU_WINDOW_SECONDS, SLOW_FACTOR, check_load, cpu_windows, verdict
from specviz.analysis.advise_rounds import collect
from specviz.decoding.events import Finished, SessionStarted, Verified
from specviz.decoding.machine_load import BUSY_SHARE


def recording(plain=0.010, drafted=0.014, rounds=40, slow=(), factor=3.0, share=None, n_threads=2, plain_also=True):
    """Rounds alternating a draft of 8 (2 accepted: a batch of 9, ``drafted`` seconds) with a plain round
    (``plain`` seconds); rounds in ``slow`` take ``factor`` times as long. ``share``: each round's CPU share
    over its verify seconds (None: a recording without CPU figures)."""
    R = Rounds(list(range(1, 30)), knobs=dict(NO_TILE), strategy="ngram-simple")
    for i in range(rounds):
        k = factor if i in slow else 1.0
        if plain_also and i % 2:
            R.round([], 0, verify_seconds=plain * k)
        else:
            R.round([100 + j for j in range(8)], 2, 7, rank=2, verify_seconds=drafted * k)
    if share is None:
        return R.events
    return with_shares(R.events, [share] * rounds, n_threads)


def test_a_quiet_run_flags_nothing():
    events = recording(share=0.95)
    check = check_load(collect(events))
    assert check.verdict == "quiet" and check.flagged == () and not check.under_load
    assert check.cpu_share == pytest.approx(0.95) and check.n_threads == 2 and check.rounds == 40
    adv = advise(events)
    assert adv.load.verdict == "quiet" and adv.load.notes == []
    assert adv.pays and "load: quiet: 0 of 40 rounds flagged" in adv.report() and "outside load" not in adv.text
    assert json.loads(json.dumps(adv.to_dict()))["load"]["verdict"] == "quiet"


def test_a_burst_flags_the_slow_rounds_and_leaves_their_verify_times_out_of_the_fit():
    slow = tuple(range(10, 20))  # ten rounds in a row, three times as long
    events = recording(slow=slow, share=None)
    check = check_load(collect(events))
    assert check.flagged == slow and check.by_spread == 10 and check.by_cpu == 0
    assert check.verdict == "burst" and check.share_flagged == pytest.approx(0.25)
    adv = advise(events)
    # the curve is fitted to the quiet rounds only (the medians of a burst this short are a quiet round's too)
    assert adv.cost_curve["seconds"][0] == pytest.approx(0.010) and adv.cost_curve["seconds"][8] == pytest.approx(0.014)
    assert any("left out" in n for n in adv.load.notes)
    assert adv.pays and adv.text.endswith(
        "; the timings were taken under outside load (a burst: 10 of 40 rounds flagged): confirm it on a quiet "
        "machine or with a fresh measurement"
    )
    assert "load: burst: 10 of 40 rounds flagged (0 by CPU share, 10 by a verify above" in adv.report()


def test_a_burst_of_only_a_round_or_two_is_noise():
    assert check_load(collect(recording(slow=(5,)))).verdict == "quiet"
    assert 2 / 100 < BURST_SHARE and verdict(100, 2, None) == "quiet"
    assert verdict(20, 2, None) == "burst" and verdict(10, 1, None) == "quiet"  # two rounds at least


def test_a_verify_just_under_the_factor_is_not_flagged():
    events = recording(slow=(4, 6), factor=SLOW_FACTOR * 0.95)
    assert check_load(collect(events)).flagged == ()


def test_a_steady_load_is_seen_by_the_cpu_share_not_by_the_spread():
    events = recording(plain=0.020, drafted=0.028, share=0.35)  # every round slowed alike
    check = check_load(collect(events))
    assert check.by_spread == 0 and check.by_cpu == 40 and check.verdict == "steady load"
    assert check.cpu_share == pytest.approx(0.35) and check.cpu_share < BUSY_SHARE
    adv = advise(events)
    assert any("too few rounds were not flagged" in n for n in adv.load.notes)
    assert "CPU share 35% of 2 threads: the machine was busy" in adv.report()


def test_speculation_is_never_declined_on_flagged_timings():
    # an extra token costs nearly a decode: on these times speculation does not pay
    quiet = recording(plain=0.010, drafted=0.090)
    loaded = recording(plain=0.010, drafted=0.090, share=0.35)
    declined = advise(quiet)
    assert not declined.pays and declined.text.startswith("speculation does not pay here")
    adv = advise(loaded)
    assert not adv.pays and adv.flags == "--spec-type none"
    assert adv.text.startswith("the timings were taken under outside load (a steady load: 40 of 40 rounds flagged)")
    assert "record again on a quiet machine, or measure the verify cost afresh" in adv.text
    assert "does not pay" not in adv.text and "cannot be judged" in adv.reason
    assert adv.to_dict()["load"]["verdict"] == "steady load"


def test_a_fresh_curve_the_recorded_times_disagree_with_scores_the_advice_and_both_figures_are_shown():
    fresh = linear(0.010, 0.0005)  # this machine now: an extra token is cheap
    # recorded under load: a one-token verify 1.6x as long, a nine-token one 3x (the load hit the longer batches)
    events = recording(plain=0.016, drafted=3 * fresh(9))
    adv = advise(events, cost=fresh, scale_to_rounds=True, fresh=True)
    assert adv.load.fresh_level > 1.3 and adv.load.scored_fresh and adv.load.verdict == "steady load"
    assert adv.cost_source == "measured" and adv.baseline_tokens_per_second == pytest.approx(100.0)
    assert adv.pays and adv.as_recorded is not None
    assert adv.as_recorded.speedup < adv.best.speedup
    assert (
        f"on this machine now: {adv.best.speedup:.2f}x; as recorded, under load: {adv.as_recorded.speedup:.2f}x"
        in adv.text
    )
    assert "as recorded, under load:" in adv.report() and adv.to_dict()["as_recorded"] is not None
    # the same curve not said to be fresh (a file measured elsewhere): scaled to the rounds as before
    plain = advise(events, cost=fresh, scale_to_rounds=True)
    assert plain.as_recorded is None and "scaled by" in plain.cost_source


def test_a_fresh_curve_that_agrees_changes_nothing():
    fresh = linear(0.010, 0.0005)
    events = recording(plain=0.0105, drafted=1.05 * fresh(9))
    adv = advise(events, cost=fresh, fresh=True)
    assert adv.load.fresh_level == pytest.approx(1.05) and not adv.load.scored_fresh
    assert adv.load.verdict == "quiet" and adv.as_recorded is None and "on this machine now" not in adv.text


def test_a_recording_without_the_cpu_figures_or_load_averages():
    events = recording(share=None)
    rec = collect(events)
    assert all(t.cpu_seconds is None and t.n_threads is None for t in rec.timings)
    check = check_load(rec)
    assert check.cpu_share is None and check.load_start is None and check.by_cpu == 0
    assert check.verdict == "quiet"
    d = advise(events).to_dict()["load"]
    assert d["cpu_share"] is None and d["load_average_start"] is None
    assert "; no CPU share recorded" in advise(events).load.text()


def test_the_load_averages_at_the_start_and_the_end():
    events = recording(share=0.9)
    events[0] = dataclasses.replace(events[0], load_average=(0.5, 0.4, 0.3))
    events.append(Finished(41, reason="max_tokens", load_average=(2.5, 1.0, 0.5)))
    assert isinstance(events[0], SessionStarted)
    check = check_load(collect(events))
    assert check.load_start == (0.5, 0.4, 0.3) and check.load_end == (2.5, 1.0, 0.5)
    assert "load average 0.50 at the start, 2.50 at the end" in check.text()


def test_a_recordings_verify_cost_measured_afresh_with_its_model(tiny_session, tiny_model_path):
    from specviz.analysis.advise_fresh import measure_recorded
    from specviz.analysis.sources import events_of

    s = tiny_session
    s.start("the cat of the dog and the a the cat of the", 40, "prompt-lookup", draft_max=8)
    s.run()
    events = events_of(s)
    longest = max(len(e.tokens) for e in events if type(e).__name__ == "DraftProposed")
    cost = measure_recorded(events, str(tiny_model_path))
    assert cost is not None and cost.sizes[-1] >= min(longest + 1, 9)
    adv = advise(events, cost=cost, fresh=True)
    assert adv.load.fresh_level is not None and adv.to_dict()["load"]["fresh_level"] is not None
    assert measure_recorded(events, "/nonexistent.gguf") is None
    assert measure_recorded([]) is None


@pytest.mark.slow
def test_advise_fresh_on_the_command_line(tiny_model_path, tmp_path):
    from test_cli import run_cli

    rec = tmp_path / "rec.jsonl"
    p = run_cli(
        "run",
        "--model",
        str(tiny_model_path),
        "--prompt",
        "the cat of the dog",
        "--max-tokens",
        "30",
        "--record",
        str(rec),
    )
    assert p.returncode == 0, p.stderr
    p = run_cli("advise", str(rec), "--fresh", "--json")
    assert p.returncode == 0, p.stderr
    load = json.loads(p.stdout)["load"]
    assert load["fresh_level"] is not None and load["verdict"] in ("quiet", "burst", "steady load")
    p = run_cli("advise", str(rec))
    assert p.returncode == 0 and "load: " in p.stdout
    p = run_cli("advise", str(rec), "--fresh", "--model", str(tmp_path / "missing.gguf"))
    assert p.returncode == 2 and "option --fresh" in p.stderr


def test_a_fresh_curve_slower_than_the_recording_says_the_machine_may_be_busy_now():
    fresh = linear(0.020, 0.001)  # measured now, twice the recorded times: something holds the machine now
    events = recording(plain=0.010, drafted=0.5 * fresh(9))
    adv = advise(events, cost=fresh, scale_to_rounds=True, fresh=True)
    assert adv.load.fresh_level == pytest.approx(0.5) and not adv.load.scored_fresh and adv.load.verdict == "quiet"
    assert "the fresh measurement is 2.00x slower than the recorded verify times: the machine may be busy now" in (
        adv.report()
    )
    assert "scaled by 0.50" in adv.cost_source and adv.as_recorded is None


def with_shares(events, shares, n_threads=2):
    """``events`` with each verified round's CPU seconds set from ``shares`` (one per round, in order)."""
    it = iter(shares)
    return [
        dataclasses.replace(
            e, round_seconds=e.seconds, cpu_seconds=next(it) * e.seconds * n_threads, n_threads=n_threads
        )
        if isinstance(e, Verified)
        else e
        for e in events
    ]


def test_the_cpu_share_is_judged_over_windows_not_round_by_round():
    # a quiet run whose CPU time was counted at the scheduler's tick: one short round in four reads 0.2, the
    # next 1.8 (the tick's time counted there), so every window's pooled share is that of a quiet machine
    events = with_shares(recording(share=None), [(0.2, 1.8, 1.0, 1.0)[i % 4] for i in range(40)])
    rec = collect(events)
    windows = cpu_windows(rec.timings)
    assert [i for w in windows for i in w] == list(range(40))  # every round once, in order
    assert all(sum(rec.timings[i].wall_seconds for i in w) >= CPU_WINDOW_SECONDS for w in windows)
    check = check_load(rec)
    # pooled by time: a period of four rounds is 14 ms at 0.2, 10 at 1.8, 14 at 1.0 and 10 at 1.0
    assert check.by_cpu == 0 and check.verdict == "quiet"
    assert check.cpu_share == pytest.approx((0.2 * 14 + 1.8 * 10 + 14 + 10) / 48)


def test_a_load_that_lands_in_a_few_long_rounds_is_seen_by_the_pooled_share():
    # two busy loops on both cores: most rounds keep their cores (share 0.85), and the time lost waiting lands
    # in every fifth round, which takes five times as long with a share of 0.1. The rounds' median share is
    # 0.85 (not busy); the run's pooled share is below the threshold.
    slow = tuple(range(0, 40, 5))
    events = with_shares(recording(slow=slow, factor=5.0, share=None), [0.1 if i in slow else 0.85 for i in range(40)])
    check = check_load(collect(events))
    assert check.cpu_share is not None and check.cpu_share < BUSY_SHARE
    assert check.verdict == "steady load" and check.by_cpu == 40


def test_the_advice_dict_carries_the_load_in_words_and_both_figures_for_the_inspector():
    # the inspector's advice panel shows these as they are: the wording lives here, not in the front-end
    burst = json.loads(json.dumps(advise(with_shares(recording(slow=tuple(range(10, 20))), [0.95] * 40)).to_dict()))
    assert burst["load"]["headline"] == (
        "the timings were taken under outside load (a burst: 10 of 40 rounds flagged); CPU share 95% of 2 threads"
    )
    assert burst["load"]["text"].startswith("load: burst: 10 of 40 rounds flagged")
    assert burst["load"]["headline"].split(";")[0] in burst["text"]  # one wording: the advice's text says it too
    assert burst["both_figures"] == []  # no fresh curve
    steady = advise(recording(plain=0.020, drafted=0.028, share=0.35)).to_dict()["load"]
    assert steady["headline"].endswith(
        "(a steady load: 40 of 40 rounds flagged); CPU share 35% of 2 threads: the machine was busy"
    )
    quiet = advise(recording(share=None)).to_dict()["load"]
    assert quiet["headline"] == "the timings look quiet (0 of 40 rounds flagged)"  # no CPU share: none said
    fresh = linear(0.010, 0.0005)
    adv = advise(recording(plain=0.016, drafted=3 * fresh(9)), cost=fresh, scale_to_rounds=True, fresh=True)
    assert adv.to_dict()["load"]["headline"] == (
        f"the timings were taken under outside load (a steady load: 0 of 40 rounds flagged, the recorded verify "
        f"times {adv.load.fresh_level:.2f}x a fresh measurement's)"
    )
    figures = adv.to_dict()["both_figures"]
    assert [f["label"] for f in figures] == ["on this machine now", "as recorded, under load"]
    assert [f["speedup"] for f in figures] == [adv.best.speedup, adv.as_recorded.speedup]
    assert figures[1]["tokens_per_second"] == adv.as_recorded.tokens_per_second
    assert "; ".join(f"{f['label']}: {f['speedup']:.2f}x" for f in figures) in adv.text
