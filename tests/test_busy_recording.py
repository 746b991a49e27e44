"""A recording made while bounded busy-loop processes hold the cores, advised afterwards on the quiet machine:
the load is flagged and the advised speedup is within 15% of a quiet recording's (issue: advice that a busy
machine cannot fool). The embedded model, as the advice is for; greedy, so both recordings hold the same text."""

from __future__ import annotations

import pytest

from specviz import Session
from specviz.analysis.advise import advise
from specviz.analysis.advise_fresh import measure_recorded
from specviz.analysis.workloads import WORKLOADS
from specviz.testing.outside_load import busy_loops

pytestmark = [pytest.mark.embedded, pytest.mark.slow]


def recorded(s: Session, prompt: str) -> list:
    s.start(prompt, 96, "ngram-simple", size_n=3)
    s.run()
    return list(s.events)


def best_speedup(adv) -> float:
    """The best setting's speedup, advised or declined as within the recording's uncertainty."""
    best = adv.best if adv.pays else adv.declined
    assert best is not None and best.strategy == "ngram-simple"
    return best.speedup


def test_a_recording_made_under_busy_loops_is_flagged_and_advised_as_a_quiet_one(embedded_model_path):
    prompt = WORKLOADS["code-rewrite"][2]
    with Session(embedded_model_path, n_ctx=2048, n_threads=2) as s:
        recorded(s, prompt)  # warm-up
        # the quiet recording, judged as the test judges it (against a fresh curve): a passing blip of other
        # work (the suite's own teardown) in its few rounds is given two more tries
        for _ in range(3):
            quiet = recorded(s, prompt)
            cost = measure_recorded(quiet)
            assert cost is not None
            if not advise(quiet, cost=cost, fresh=True).load.under_load:
                break
        with busy_loops(2, seconds=60):
            busy = recorded(s, prompt)
    assert [e.tokens for e in quiet if e.kind == "verified"] == [e.tokens for e in busy if e.kind == "verified"]
    # advised afterwards, the machine quiet again: one fresh measurement of the verify cost for both
    a_quiet, a_busy = advise(quiet, cost=cost, fresh=True), advise(busy, cost=cost, fresh=True)
    assert a_quiet.load is not None and a_busy.load is not None
    assert not a_quiet.load.under_load, a_quiet.load.text()
    assert a_busy.load.under_load, a_busy.load.text()
    # the advice says so: the verdict in its report, and both figures in its text
    assert "outside load" in a_busy.load.headline() and "the machine was busy" in a_busy.report()
    assert "as recorded, under load" in a_busy.text and "outside load" not in a_quiet.report()
    assert best_speedup(a_busy) == pytest.approx(best_speedup(a_quiet), rel=0.15)
