"""A paused EAGLE-3 head holds the target's layer capture while the policy promises plain rounds (issue 26).

While paused the drafter keeps the last ``resume_window`` positions' layer inputs to resume from. Rows of
rounds further than that from the next draft would leave the window before it, so when the policy
promises enough plain rounds (``promise_plain``), the capture shim is held (it copies nothing) and reads
again for the promise's last window of rounds. These tests run the capture through the shim on the tiny
llama (llama.cpp's own taps are preferred for ``llama``; the shim is what the embedded Gemma 3 uses, and
only the shim can be held between rounds).

The reference for "the same drafts" is the same run with a policy that promises nothing: the pause is
then longer than the window too, and the head restarts from the same window's rows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_eagle3 import binary_pair, knobs  # noqa: F401 - fixtures
from test_eagle3_pause import PROMPT, Scripted
from test_session import plain_reference

from specviz import Session
from specviz.backends import LlamaContext, LlamaModel
from specviz.backends import capture as capture_mod
from specviz.backends.capture import LayerCapture
from specviz.decoding.cost_policy import CostPolicy
from specviz.decoding.verify_cost import VerifyCostModel
from specviz.errors import CaptureUnavailableError, KnobError


@pytest.fixture
def through_the_shim(monkeypatch):
    """Read the tiny llama's layer inputs through the capture shim, as the embedded Gemma 3's are read."""
    monkeypatch.setattr(capture_mod, "API_ARCHS", capture_mod.API_ARCHS - {"llama"})


class Promising(Scripted):
    """:class:`Scripted`, promising in each plain round the plain rounds that follow it (``promised``: the
    rounds it says are plain, by default those it keeps plain)."""

    name = "promising"

    def __init__(self, plain: set[int], promised: set[int] | None = None) -> None:
        super().__init__(plain)
        self.promised = plain if promised is None else promised

    def promise_plain(self) -> int | None:
        n = 0
        while self.round + n + 1 in self.promised:
            n += 1
        return n


def _run(target, head, policy, n_tokens: int = 70, window: int | None = None, hold: bool = True):
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, n_tokens, "eagle3", **knobs(head))
    s.generation.policy = policy
    s.drafter.hold_when_promised = hold
    if window is not None:
        s.drafter.resume_window = window
    drafts, held = [], []
    while s.finished is None:
        rnd = s.step()
        proposed = rnd.of_kind("draft_proposed")
        drafts.append(tuple(proposed[0].tokens) if proposed else ())
        held.append(s.drafter.capture.held)
    return s, drafts, held


def test_a_held_capture_copies_nothing_and_reads_again_when_released(e3_target_path):
    m = LlamaModel(e3_target_path)
    held_ctx = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, capture=True)
    ref_ctx = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, capture=True)
    api_ctx = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        cap = LayerCapture(held_ctx, [0, 1, 3], method="callback")
        ref = LayerCapture(ref_ctx, [0, 1, 3], method="callback")
        api = LayerCapture(api_ctx, [0, 1, 3])
        toks = list(range(5, 25))
        for ctx in (held_ctx, ref_ctx):
            ctx.eval(toks[:10], 0, rows="last")
        assert np.array_equal(cap.features(10), ref.features(10))
        assert cap.can_hold and cap.hold(True) and cap.held
        calls = held_ctx.tap.state.calls
        for ctx in (held_ctx, ref_ctx):
            ctx.eval(toks[10:12], 10, rows="all")
        assert held_ctx.tap.state.calls == calls  # the shim looked at no tensor of the held batch
        with pytest.raises(CaptureUnavailableError, match="held"):
            cap.features(2)
        assert cap.hold(False) is False and not cap.held
        for ctx in (held_ctx, ref_ctx):
            ctx.eval(toks[12:15], 12, rows="all")
        f = cap.features(3)
        assert held_ctx.tap.state.calls > calls and np.abs(f).max() > 0
        assert np.array_equal(f, ref.features(3))  # read again, exactly as a capture never held
        # llama.cpp's own taps are not switched between rounds (that rebuilds the scheduler): never held
        assert not api.can_hold and api.hold(True) is False and not api.held
        api_ctx.eval(toks[:4], 0, rows="last")
        assert api.features(4).shape == (4, 192)
        cap.close()
        assert cap.hold(True) is False  # closed: nothing to hold
    finally:
        for ctx in (held_ctx, ref_ctx, api_ctx):
            ctx.close()
        m.close()


def test_cost_policy_promises_the_plain_rounds_up_to_its_next_probe():
    def never_pays() -> VerifyCostModel:
        return VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0])

    asked, unasked = CostPolicy(never_pays()), CostPolicy(never_pays())
    lengths, promises = [], []
    for _ in range(24):
        k = asked.length(0, 4)[0]
        lengths.append(k)
        promises.append(asked.promise_plain() if k == 0 else None)
    # a probe every 8 rounds (no verdict comes back here): the first plain round promises the six after it,
    # each later one what is left, and the rounds and probes are those of a policy never asked
    assert lengths == [unasked.length(0, 4)[0] for _ in range(24)] == ([0] * 7 + [1]) * 3
    assert promises == [6, 5, 4, 3, 2, 1, 0, None] * 3
    assert asked.promise_plain() is None  # the last round was a probe: no promise


def test_cost_policy_keeps_a_promise_when_drafting_starts_to_pay_and_weighs_again_after_it():
    p = CostPolicy(VerifyCostModel([1, 2, 16], [0.001, 1.0, 10.0]))
    assert p.length(0, 4)[0] == 0 and p.promise_plain() == 6
    p.cost = VerifyCostModel([1, 2, 16], [1.0, 1.0, 1.0])  # now every draft length pays
    assert CostPolicy(VerifyCostModel([1, 2, 16], [1.0, 1.0, 1.0])).length(0, 4)[0] == 4  # unpromised: drafts
    mid = json.loads(json.dumps(p.state()))
    assert [p.length(0, 4)[0] for _ in range(6)] == [0] * 6  # promised: kept plain
    assert p.length(0, 4)[0] == 4 and p.promise_plain() is None  # over: weighed again
    # a snapshot taken during the promise brings the rest of it back
    q = CostPolicy(VerifyCostModel([1, 2, 16], [1.0, 1.0, 1.0]))
    q.load(mid)
    assert q.quiet == 6 and [q.length(0, 4)[0] for _ in range(7)] == [0] * 6 + [4]


def test_promised_plain_rounds_hold_the_capture_and_the_head_drafts_as_without(through_the_shim, binary_pair):  # noqa: F811
    target, head = binary_pair
    plain = set(range(3, 43))  # forty plain rounds: paused from the second, a window of sixteen
    s, drafts, held = _run(target, head, Promising(plain))
    ref, ref_drafts, ref_held = _run(target, head, Scripted(plain))
    assert s.drafter.capture.method == "callback"
    assert s.tokens == ref.tokens == plain_reference(s.model, PROMPT, 70)
    # held from the pause's first round (4) while at least a window of promised plain rounds follows (the
    # round's own position and the next 15 are the window before round 43's draft): rounds 4 … 26
    assert [i + 1 for i, h in enumerate(held) if h] == list(range(4, 27)) and not any(ref_held)
    up, ref_up = s.telemetry_dict()["upkeep"], ref.telemetry_dict()["upkeep"]
    assert up["held_rounds"] == 23 and ref_up["held_rounds"] == 0
    # the same restart from the same window's rows, no re-evaluation of the target, the same drafts
    for key in ("pauses", "resumes", "restarts", "skipped_tokens"):
        assert up[key] == ref_up[key], key
    assert s.telemetry_dict()["catch_up_tokens"] == ref.telemetry_dict()["catch_up_tokens"]
    assert drafts == ref_drafts and any(drafts[42:])
    # switched off, a promise holds nothing
    kept, kept_drafts, kept_held = _run(target, head, Promising(plain), hold=False)
    assert not any(kept_held) and kept_drafts == drafts and kept.tokens == s.tokens
    for x in (s, ref, kept):
        x.close()


class Revised(Promising):
    """Plain in rounds 3 … 22; promises only up to round 10 before round 10, then up to round 42: a promise
    that grows (rows kept before it) and is then broken (round 23 asks for a draft)."""

    def __init__(self) -> None:
        super().__init__(set(range(3, 23)))

    def promise_plain(self) -> int | None:
        self.promised = set(range(3, 11)) if self.round < 10 else set(range(3, 43))
        return super().promise_plain()


def test_a_broken_promise_resumes_by_re_evaluating_the_target_and_stays_lossless(through_the_shim, binary_pair):  # noqa: F811
    target, head = binary_pair
    s, drafts, held = _run(target, head, Revised())
    ref, _, _ = _run(target, head, Scripted(set(range(3, 23))))
    # rounds 4 … 9 keep their rows (the promise ends within a window), 10 … 22 hold, 23 drafts
    assert [i + 1 for i, h in enumerate(held) if h] == list(range(10, 23))
    assert s.tokens == plain_reference(s.model, PROMPT, 70)
    # the held rounds' rows were never read, and those kept before them are not the window's: the window's
    # positions are evaluated again
    extra = s.telemetry_dict()["catch_up_tokens"] - ref.telemetry_dict()["catch_up_tokens"]
    assert extra == 16 and any(drafts[22:])
    s.close()
    ref.close()


def test_the_cost_policy_holds_a_paused_heads_capture_and_stays_lossless(
    through_the_shim, e3_target_path, e3_head_path
):  # noqa: E501
    s = Session(e3_target_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    # a second row as dear as the first: with a head that is never right, the policy keeps rounds plain
    s.cost_model = VerifyCostModel([1, 2, 9], [0.010, 0.020, 0.090])
    s.start(PROMPT, 90, "eagle3", **knobs(e3_head_path, draft_policy="cost", draft_max=8))
    s.drafter.resume_window = 4
    s.run()
    assert s.tokens == plain_reference(s.model, PROMPT, 90)
    t = s.telemetry_dict()
    assert t["upkeep"]["pauses"] >= 1 and t["upkeep"]["held_rounds"] > 0
    assert "promised_plain_rounds" in t["policy"]
    s.close()


def test_a_snapshot_taken_while_held_restores_and_drafts_the_same(through_the_shim, binary_pair):  # noqa: F811
    target, head = binary_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, 70, "eagle3", **knobs(head))
    s.generation.policy = Promising(set(range(3, 43)))
    s.run(max_rounds=15)
    assert s.drafter.paused and s.drafter.capture.held
    blob = s.snapshot()
    drafts = [tuple(r.of_kind("draft_proposed")[0].tokens) for r in s.run() if r.of_kind("draft_proposed")]
    r = Session.restore(blob, model=s.model, n_threads=1)
    r.generation.policy = Promising(set(range(1, 28)))  # rounds 16 … 42 of the original
    r_drafts = [tuple(x.of_kind("draft_proposed")[0].tokens) for x in r.run() if x.of_kind("draft_proposed")]
    assert r.tokens == s.tokens and r_drafts == drafts and any(drafts)
    # held again until a window before the draft (rounds 16 … 26), then resumed from the rows read after
    assert r.telemetry_dict()["upkeep"]["held_rounds"] == 23 and r.telemetry_dict()["catch_up_tokens"] == 0
    s.close()
    r.close()


def test_a_window_below_one_position_is_refused_and_one_position_resumes_losslessly(through_the_shim, binary_pair):  # noqa: F811
    # a window of 0 kept no row at all: the first draft step after a resume had no state for the last
    # position (ContextError); 0 is refused, and 1, the least a resume needs, holds and drafts as without
    target, head = binary_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, 8, "eagle3", **knobs(head))
    for bad in (0, -3, 1.5, True):
        with pytest.raises(KnobError, match="resume_window"):
            s.drafter.resume_window = bad
    assert s.drafter.resume_window == 16
    s.run()
    s.close()
    plain = set(range(3, 43))
    one, drafts, held = _run(target, head, Promising(plain), window=1)
    ref, ref_drafts, _ = _run(target, head, Scripted(plain), window=1)
    assert one.tokens == ref.tokens == plain_reference(one.model, PROMPT, 70)
    # held from the pause's first round up to the last promised one, which reads the row the resume needs
    assert [i + 1 for i, h in enumerate(held) if h] == list(range(4, 42))
    assert drafts == ref_drafts and any(drafts[42:])
    one.close()
    ref.close()
