"""The cost policy under a burst of outside load: windows of rounds judged by their CPU share
(:class:`~specviz.decoding.load_watch.LoadWatch`), and the timings learnt during a burst forgotten once it
passes (:meth:`~specviz.decoding.cost_policy.CostPolicy.observe_load`). Synthetic timings throughout."""

from __future__ import annotations

import pytest

from specviz.decoding import cost_policy
from specviz.decoding.cost_policy import CostPolicy
from specviz.decoding.load_watch import LoadWatch
from specviz.decoding.machine_load import BUSY_SHARE, JUDGED_SECONDS
from specviz.decoding.policy import make_policy
from specviz.decoding.verify_cost import VerifyCostModel

QUIET, BUSY = 0.95, 0.35  # CPU shares either side of BUSY_SHARE
assert BUSY < BUSY_SHARE < QUIET


def rounds(watch_or_policy, share: float, seconds: float, n: int, threads: int = 2) -> list:
    """Feed ``n`` rounds of ``seconds`` wall time at CPU share ``share``; what each returned (or None)."""
    out = []
    for _ in range(n):
        r = watch_or_policy.observe_load(share * seconds * threads, seconds, threads)
        out.append(r)
    return out


class Watch(LoadWatch):
    """A LoadWatch fed like a policy (the tests' ``rounds`` helper)."""

    def observe_load(self, cpu: float, wall: float, threads: int | None):
        return self.observe(cpu, wall, threads)


def test_a_window_is_judged_only_once_it_spans_the_judged_seconds():
    w = Watch()
    per = JUDGED_SECONDS / 4
    assert rounds(w, BUSY, per, 3) == [None, None, None]  # 0.75 of a window: not judged yet
    assert rounds(w, BUSY, per, 1) == ["busy"] and w.busy and w.windows == 1
    assert rounds(w, QUIET, per, 4) == [None, None, None, "passed"] and not w.busy and w.bursts == 1
    assert rounds(w, QUIET, per, 4)[-1] == "quiet" and w.bursts == 1


def test_a_window_is_judged_by_its_pooled_share_not_round_by_round():
    w = Watch()
    # one long starved round and three short full ones: pooled (0.1*0.2 + 3*1.0*0.0333) / 0.3 = 0.40, busy
    assert w.observe(0.1 * 0.2 * 2, 0.2 * 0.5, 2) is None
    assert w.observe(0.2 * 0.1 * 2, 0.1, 2) == "busy"


def test_rounds_without_cpu_figures_are_not_judged_and_a_change_of_threads_starts_the_window_again():
    w = Watch()
    assert w.observe(0.1, 0.5, None) is None and w.observe(0.1, 0.0, 2) is None and w.windows == 0
    assert w.observe(0.0, JUDGED_SECONDS / 2, 2) is None  # half a window at share 0
    # four threads now: the half window of two threads is dropped, this full quiet one judged alone
    assert w.observe(QUIET * JUDGED_SECONDS * 4, JUDGED_SECONDS, 4) == "quiet"


def learnt(p: CostPolicy, draft_seconds: float, verify_seconds: float, n: int = 30) -> None:
    """Rounds that draft 4 tokens, all accepted, at ``draft_seconds`` a draft and ``verify_seconds`` a verify."""
    for _ in range(n):
        p.observe(4, 4, draft_seconds)
        p.observe_verify(5, verify_seconds)
        p.observe_upkeep(0.001, 5)


def test_a_burst_that_passes_puts_back_the_quiet_timings_and_the_choice_made_from_them():
    p = CostPolicy(VerifyCostModel([1, 2, 5, 8], [0.010, 0.012, 0.015, 0.020]))
    learnt(p, 0.004, 0.015)
    rounds(p, QUIET, 0.05, 4)  # a quiet window: the timings kept aside
    quiet_timings, quiet_points, quiet_choice = p.timings(), p.cost_points(), p.length(0, 7)
    assert quiet_choice[0] > 0
    # a burst: drafting and the 5-token verify look dear, plain rounds win
    learnt(p, 0.200, 0.150)
    rounds(p, BUSY, 0.05, 8)
    assert p.length(0, 7)[0] == 0 and p.watch.busy and p.relearnt == 0
    assert p.draft_tok_seconds > 10 * quiet_timings["draft_tok_seconds"]
    # the burst passes: the quiet timings and curve come back, and with them the choice
    rounds(p, QUIET, 0.05, 4)
    assert p.relearnt == 1 and p.watch.bursts == 1 and not p.watch.busy
    assert p.timings() == quiet_timings and p.cost_points() == quiet_points
    assert p.length(0, 7)[0] == quiet_choice[0]  # the same length (acceptance, learnt meanwhile, is kept)


def test_acceptance_learnt_during_a_burst_is_kept():
    p = CostPolicy(VerifyCostModel([1, 2, 5, 8], [0.010, 0.012, 0.015, 0.020]))
    rounds(p, QUIET, 0.05, 4)
    rounds(p, BUSY, 0.05, 4)
    learnt(p, 0.2, 0.2, n=10)  # ten fully accepted drafts during the burst
    tries, hits = list(p.tries), list(p.hits)
    rounds(p, QUIET, 0.05, 4)
    assert p.relearnt == 1 and p.tries == tries and p.hits == hits


def test_a_run_that_began_under_load_learns_its_timings_again_and_measures_the_curve_again(monkeypatch):
    measured = []

    def measure(ctx, history, knobs):
        measured.append(len(history))
        return VerifyCostModel([1, 2], [0.01, 0.012])

    monkeypatch.setattr(cost_policy, "measure_verify_cost", measure)
    p = CostPolicy()
    assert p.prepare(None, [1, 2, 3], {}) is not None and p.prepare(None, [1, 2, 3], {}) is None
    rounds(p, BUSY, 0.05, 4)
    learnt(p, 0.2, 0.2, n=5)
    rounds(p, QUIET, 0.05, 4)  # passed, with no quiet window before it
    assert p.relearnt == 1
    assert all(v == 0 for v in p.timings().values())  # the moving averages start again
    again = p.prepare(None, [1, 2, 3, 4], {})
    assert again is not None and again is p.cost and measured == [3, 4]
    assert p.prepare(None, [1, 2, 3, 4], {}) is None  # once


def test_the_load_watch_is_no_part_of_the_state_a_rewind_restores():
    p = CostPolicy(VerifyCostModel([1, 2], [0.01, 0.012]))
    state = p.state()
    rounds(p, BUSY, 0.05, 4)
    p.load(state)
    assert p.watch.busy and "busy" not in state


@pytest.mark.parametrize("name", ["fixed", "adaptive"])
def test_policies_that_learn_no_timings_ignore_the_load(name):
    p = make_policy(name)
    before = p.state()
    rounds(p, BUSY, 0.05, 8)
    assert p.state() == before


def test_every_round_tells_the_policy_its_cpu_and_wall_seconds(tiny_session):
    s = tiny_session
    s.start("the a of the a of the a of", 24, "prompt-lookup", draft_policy="cost", max_ngram=2, min_ngram=1)
    seen: list[tuple] = []
    policy = s.generation.policy
    real = policy.observe_load
    policy.observe_load = lambda cpu, wall, threads: (seen.append((cpu, wall, threads)), real(cpu, wall, threads))
    s.run()
    verified = [(e.cpu_seconds, e.round_seconds, e.n_threads) for e in s.events if e.kind == "verified"]
    assert seen and seen == verified[-len(seen) :] and all(t == 1 for _, _, t in seen)
