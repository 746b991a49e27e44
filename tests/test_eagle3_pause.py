"""EAGLE-3's feeding pauses in rounds kept plain and resumes when a round drafts again (issue 26).

A scripted policy decides which rounds are plain, so every test knows where the pauses are. The reference
for "correct after a resume" is the same drafter with pausing switched off (``pause_when_plain = False``),
run through the same rounds: the same verify batches, so the same target rows; only the head's feeding
differs (round by round against one batch at the resume).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_eagle3 import binary_pair, knobs  # noqa: F401 - fixtures
from test_session import plain_reference

from specviz import Session
from specviz.backends.binding import llama_lib
from specviz.decoding.policy import QuietPolicy
from specviz.decoding.verify_cost import VerifyCostModel

PROMPT = [1, 50, 60, 70, 80, 90, 100]


class Scripted(QuietPolicy):
    """Draft ``draft_max`` tokens, except in the rounds listed in ``plain`` (1-based), which stay plain."""

    name = "scripted"

    def __init__(self, plain: set[int]) -> None:
        self.plain = plain
        self.round = 0

    def length(self, draft_min: int, draft_max: int, tile: int = 1) -> tuple[int, float | None]:
        self.round += 1
        return (0 if self.round in self.plain else draft_max), None


class Recording(Scripted):
    """A scripted policy that records what the session teaches it."""

    def __init__(self, plain: set[int]) -> None:
        super().__init__(plain)
        self.upkeep: list[tuple[float, int]] = []
        self.draft_seconds: list[float] = []
        self.resumed: list[float] = []

    def observe_upkeep(self, seconds: float, tokens: int, resume_seconds: float = 0.0) -> None:
        self.upkeep.append((seconds, tokens))
        self.resumed.append(resume_seconds)

    def observe(self, n_drafted: int, n_accepted: int, draft_seconds: float) -> None:
        self.draft_seconds.append(draft_seconds)


def _session(target) -> Session:
    return Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)


def _run(target, head, plain: set[int], *, pause: bool, n_tokens: int = 60, window: int | None = None):
    """Greedy eagle3 with ``plain`` rounds kept plain; returns the session and, per round, the draft
    and the head's first-step logits over the draft vocabulary."""
    s = _session(target)
    s.start(PROMPT, n_tokens, "eagle3", **knobs(head))
    s.generation.policy = Scripted(plain)
    d = s.drafter
    d.pause_when_plain = pause
    if window is not None:
        d.resume_window = window
    drafts, paused = [], []
    while s.finished is None:
        rnd = s.step()
        drafts.append(tuple(rnd.of_kind("draft_proposed")[0].tokens) if rnd.of_kind("draft_proposed") else ())
        paused.append(d.paused)
    return s, drafts, paused


def test_plain_rounds_pause_the_feeding_and_the_next_draft_resumes_it_exactly(binary_pair):  # noqa: F811
    target, head = binary_pair
    plain = set(range(3, 13))  # ten plain rounds: a pause of nine, shorter than the window
    s, drafts, paused = _run(target, head, plain, pause=True)
    ref, ref_drafts, ref_paused = _run(target, head, plain, pause=False)
    assert s.tokens == ref.tokens == plain_reference(s.model, PROMPT, 60)
    # the first plain round feeds (pausing for one round would save nothing), the nine after it pause
    assert paused[2:12] == [False] + [True] * 9 and not any(paused[12:]) and not any(ref_paused)
    assert drafts == ref_drafts and any(drafts[12:])  # the same drafts after the resume as fed every round
    up = s.telemetry_dict()["upkeep"]
    assert (up["pauses"], up["resumes"], up["restarts"], up["skipped_tokens"]) == (1, 1, 0, 0)
    rup = ref.telemetry_dict()["upkeep"]
    assert (rup["pauses"], rup["resumes"]) == (0, 0)
    # the paused rounds fed nothing: nine committed tokens fewer through sync than the reference
    assert up["feed_tokens"] == rup["feed_tokens"] - 9
    # the head's context holds the same pairs: its next step from the same input gives the same logits
    assert s.drafter.kv_length() == ref.drafter.kv_length() == len(s.history) - 2
    g = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    at = len(s.history) - 2
    rows = []
    for sess in (s, ref):
        sess.drafter.dctx.decode([PROMPT[1]], g, at, outputs=[0])
        rows.append(sess.drafter.dctx.logits(0)[np.asarray(sorted(set(range(0, 320, 2)) | {300, 301}))].copy())
    np.testing.assert_allclose(rows[0], rows[1], rtol=1e-4, atol=1e-4)
    s.close()
    ref.close()


def test_a_pause_longer_than_the_window_restarts_the_head_from_the_window(binary_pair):  # noqa: F811
    target, head = binary_pair
    plain = set(range(3, 13))  # ten plain rounds (a pause of nine), a window of four positions
    s, drafts, _ = _run(target, head, plain, pause=True, window=4)
    assert s.tokens == plain_reference(s.model, PROMPT, 60)  # lossless regardless
    up = s.telemetry_dict()["upkeep"]
    # the pause began with the state of one position pending and kept the rows of nine more, of which the
    # window held the last four: the six before them get no pair, and the pairs before those are dropped
    assert (up["skipped_tokens"], up["restarts"], up["resumes"]) == (6, 1, 1)
    # the reference: fed every round, then every pair before the window removed from the head's context
    ref = _session(target)
    ref.start(PROMPT, 60, "eagle3", **knobs(head))
    ref.generation.policy = Scripted(plain)
    ref.drafter.pause_when_plain = False
    ref_drafts = []
    while ref.finished is None:
        if ref.generation.policy.round == 12:  # the last plain round has run: cut the gap before the resume
            n = len(ref.history)  # the window kept the rows of positions n-5 … n-2
            mem = llama_lib().llama_get_memory(ref.drafter.dctx.ptr)
            assert llama_lib().llama_memory_seq_rm(mem, 0, 0, n - 5)
        rnd = ref.step()
        ref_drafts.append(tuple(rnd.of_kind("draft_proposed")[0].tokens) if rnd.of_kind("draft_proposed") else ())
    assert drafts == ref_drafts and any(drafts[12:])
    s.close()
    ref.close()


def test_a_restarted_head_differs_from_one_that_kept_its_context(binary_pair):  # noqa: F811
    """The restart test above can fail: the head's output depends on the pairs a restart drops."""
    target, head = binary_pair
    plain = set(range(3, 13))
    short, short_drafts, _ = _run(target, head, plain, pause=True, window=4)
    full, full_drafts, _ = _run(target, head, plain, pause=True)
    g = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    at = len(short.history) - 2
    rows = []
    for sess in (short, full):
        sess.drafter.dctx.decode([PROMPT[2]], g, at, outputs=[0])
        rows.append(sess.drafter.dctx.logits(0)[[300, 301]].copy())
    assert not np.allclose(rows[0], rows[1], rtol=1e-4, atol=1e-4)
    short.close()
    full.close()


def test_a_snapshot_taken_while_paused_restores_the_kept_rows(binary_pair):  # noqa: F811
    target, head = binary_pair
    s = _session(target)
    s.start(PROMPT, 50, "eagle3", **knobs(head))
    s.generation.policy = Scripted(set(range(3, 9)))
    s.run(max_rounds=6)
    assert s.drafter.paused
    blob = s.snapshot()
    drafts = [rnd.of_kind("draft_proposed")[0].tokens for rnd in s.run() if rnd.of_kind("draft_proposed")]
    r = Session.restore(blob, model=s.model, n_threads=1)
    assert r.drafter.paused
    r.generation.policy = Scripted(set(range(1, 3)))  # rounds 7 and 8 of the original
    r_drafts = [rnd.of_kind("draft_proposed")[0].tokens for rnd in r.run() if rnd.of_kind("draft_proposed")]
    assert r.telemetry_dict()["catch_up_tokens"] == 0  # resumed from the restored rows, not re-read
    assert r.tokens == s.tokens and r_drafts == drafts and any(drafts)
    assert r.drafter.kv_length() == s.drafter.kv_length()
    s.close()
    r.close()


def test_the_upkeep_is_reported_apart_from_drafting(binary_pair):  # noqa: F811
    target, head = binary_pair
    s = _session(target)
    s.start(PROMPT, 40, "eagle3", **knobs(head))
    policy = Recording({2, 3, 4})
    s.generation.policy = policy
    d = s.drafter
    s.step()  # a drafting round: sync feeds the committed positions
    (seconds, tokens), draft_seconds = policy.upkeep[-1], policy.draft_seconds[-1]
    assert seconds > 0 and tokens == len(s.history) - len(PROMPT) and draft_seconds > 0
    assert d.take_upkeep().tokens == 0  # the session took it: the counters started again
    s.step()  # the first plain round still feeds its token
    assert policy.upkeep[-1][1] == 1 and not d.paused
    s.step()
    s.step()  # two more: nothing fed, the rows kept
    assert [t for _, t in policy.upkeep[2:]] == [0, 0] and d.paused
    n = len(s.history)
    resumed_before = d.resume_seconds
    s.step()  # the resume happens inside draft(), before the first drafting step
    resume = d.resume_seconds - resumed_before
    assert resume > 0 and not d.paused and policy.upkeep[-1][1] == len(s.history) - n
    assert policy.resumed[-1] == pytest.approx(resume) and policy.resumed[:-1] == [0.0] * 4
    # the round's draft time less the resume is what the policy learns as drafting
    rnd = s.generation.last_result
    assert rnd is not None and policy.draft_seconds[-1] == pytest.approx(rnd.draft_seconds - resume)
    s.close()


def test_cost_policy_with_eagle3_pauses_and_stays_lossless(e3_target_path, e3_head_path):  # noqa: F811
    s = _session(e3_target_path)
    # a verify cost curve on which a second row costs as much as the first (a tiny model's measured one
    # is noise): with a head that is never right the policy keeps rounds plain, whatever the timings
    s.cost_model = VerifyCostModel([1, 2, 9], [0.010, 0.020, 0.090])
    ref = plain_reference(s.model, PROMPT, 80)
    s.start(PROMPT, 80, "eagle3", **knobs(e3_head_path, draft_policy="cost", draft_max=8))
    s.run()
    assert s.tokens == ref
    t = s.telemetry_dict()
    assert t["upkeep"]["pauses"] >= 1  # the random head is never right: the policy keeps rounds plain
    assert t["policy"]["upkeep_seconds_per_token"] > 0
    s.close()


@pytest.mark.parametrize("temperature", [0.9])
def test_sampled_runs_with_pauses_are_reproducible(binary_pair, temperature):  # noqa: F811
    target, head = binary_pair
    outs = []
    for _ in range(2):
        s = _session(target)
        s.start(PROMPT, 40, "eagle3", temperature=temperature, seed=5, **knobs(head))
        s.generation.policy = Scripted(set(range(2, 9)))
        s.run()
        outs.append(list(s.tokens))
        assert s.telemetry_dict()["upkeep"]["resumes"] == 1
        s.close()
    assert outs[0] == outs[1]


@pytest.mark.parametrize("p_min", [0.6])
def test_a_round_whose_draft_came_back_empty_pauses_and_the_next_resumes_exactly(binary_pair, p_min):  # noqa: F811
    target, head = binary_pair
    out = []
    for pause in (True, False):
        s = _session(target)
        s.start(PROMPT, 60, "eagle3", **knobs(head, draft_p_min=p_min))
        s.drafter.pause_when_plain = pause
        drafts, paused_after_empty = [], []
        while s.finished is None:
            rnd = s.step()
            d = rnd.of_kind("draft_proposed")
            drafts.append(tuple(d[0].tokens) if d else ())
            if d and not d[0].tokens and s.finished is None:
                paused_after_empty.append(s.drafter.paused)
        out.append((list(s.tokens), drafts, paused_after_empty, s.telemetry_dict()["upkeep"]))
        s.close()
    (tokens, drafts, paused, up), (ref_tokens, ref_drafts, ref_paused, ref_up) = out
    plain = _session(target)
    assert tokens == ref_tokens == plain_reference(plain.model, PROMPT, 60)
    plain.close()
    assert any(drafts) and () in drafts  # some rounds drafted, some came back empty below p_min
    assert drafts == ref_drafts  # resumed after each empty round, the head drafts as if always fed
    assert paused and all(paused) and not any(ref_paused)
    assert up["pauses"] >= len(paused) and up["pauses"] - up["resumes"] in (0, 1) and ref_up["pauses"] == 0
