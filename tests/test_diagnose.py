"""Diagnosis (specviz.analysis.diagnose) on hand-made rounds, the acceptor's rank and margin, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specviz.analysis.diagnose import diagnose, token_class
from specviz.decoding.acceptor import accept
from specviz.decoding.events import Accepted, DraftProposed, Rejected, Rewound, SessionStarted, TelemetryEvent, Verified
from specviz.decoding.sampling import SamplingParams
from specviz.decoding.verify_cost import VerifyCostModel


def test_token_classes():
    assert (
        token_class(" ") == "whitespace" and token_class("\n\n") == "whitespace" and token_class("\t") == "whitespace"
    )
    assert (
        token_class(",") == "punctuation" and token_class(" ):") == "punctuation" and token_class(" +") == "punctuation"
    )
    assert token_class("12") == "digits" and token_class(" 3") == "digits" and token_class("1,000") == "digits"
    assert token_class(" the") == "word start" and token_class("▁cat") == "word start"
    assert token_class("ing") == "word continuation" and token_class("x1") == "word continuation"
    assert token_class("<eos>") == "special" and token_class("<|im_end|>") == "special"
    assert token_class("<s>") == "special" and token_class("<") == "punctuation"
    assert token_class("a:b") == "other" and token_class("") == "other"


class Rounds:
    """Hand-made events: a prompt, then rounds with a draft, the accepted count and the rejection."""

    def __init__(self, prompt, knobs=None, strategy="draft"):
        self.events = [
            SessionStarted(
                0,
                strategy=strategy,
                knobs=knobs or {},
                prompt_tokens=tuple(prompt),
                prompt_pieces=tuple(f"t{t}" for t in prompt),
            )
        ]
        self.history = list(prompt)
        self.r = 0

    def round(
        self,
        draft,
        n_acc,
        chosen=None,
        *,
        probs=None,
        pieces=None,
        rank=None,
        margin=None,
        tprob=0.1,
        reason=None,
        draft_seconds=0.0,
        verify_seconds=0.01,
    ):
        self.r += 1
        r, pos = self.r, len(self.history)
        pieces = pieces or [f"t{t}" for t in draft]
        probs = probs or [None] * len(draft)
        self.events.append(
            DraftProposed(
                r,
                tokens=tuple(draft),
                pieces=tuple(pieces),
                probs=tuple(probs),
                position=pos,
                reason=reason,
                limit=8,
                requested=8,
                seconds=draft_seconds,
            )
        )
        self.events.append(Verified(r, batch_size=len(draft) + 1, seconds=verify_seconds))
        final = chosen if n_acc < len(draft) else 999
        chosen = 998 if chosen is None else chosen
        committed = list(draft[:n_acc]) + [final]
        kind = "plain" if not draft else ("bonus" if n_acc == len(draft) else "correction")
        self.events.append(
            Accepted(
                r,
                tokens=tuple(committed),
                pieces=tuple(f"t{t}" for t in committed),
                n_accepted=n_acc,
                position=pos,
                bonus_token=final,
                bonus_kind=kind,
            )
        )
        if n_acc < len(draft):
            self.events.append(
                Rejected(
                    r,
                    depth=n_acc,
                    tokens=tuple(draft[n_acc:]),
                    pieces=tuple(pieces[n_acc:]),
                    draft_probs=tuple(probs[n_acc:]),
                    target_token=chosen,
                    target_piece=f"t{chosen}",
                    target_prob=0.8,
                    draft_token_target_prob=tprob,
                    draft_token_target_rank=rank,
                    target_margin=margin,
                    position=pos + n_acc,
                )
            )
        self.events.append(TelemetryEvent(r, data={}))
        self.history += committed


def test_figures_on_hand_made_rounds():
    R = Rounds([1, 2, 3, 4, 5, 6, 1, 2, 3], knobs={"draft_p_min": 0.0})
    # round 1: copies 4 5 6 1 (the prompt continues itself): all four accepted, inside a copied span
    R.round([4, 5, 6, 1], 4, probs=[0.9, 0.9, 0.8, 0.7])
    # round 2: drafted ". ," rejected at depth 0 (near miss, rank 2), draft confidence 0.2
    R.round([50, 51], 0, 60, probs=[0.2, 0.1], pieces=[".", ","], rank=2, margin=0.3)
    # round 3: " the" accepted, "ing" rejected (rank 40), confidence 0.15
    R.round([70, 71, 72], 1, 61, probs=[0.95, 0.15, 0.1], pieces=[" the", "ing", "x"], rank=40, margin=4.0)
    # round 4: no draft
    R.round([], 0, reason="no-match")
    dg = diagnose(R.events)
    assert (dg.rounds, dg.drafting_rounds, dg.drafted, dg.examined, dg.accepted) == (4, 3, 9, 7, 5)
    assert len(dg.rejections) == 2 and dg.empty_reasons == {"no-match": 1}
    rows = {r.round: r for r in dg.rejections}
    assert rows[2].drafted == 50 and rows[2].chosen == 60 and rows[2].depth == 0 and rows[2].target_rank == 2
    assert rows[3].position == 9 + 5 + 1 + 1 and rows[3].draft_prob == 0.15 and rows[3].margin == 4.0
    assert dg.near_miss_share() == 0.5
    depth = {d["depth"]: (d["examined"], d["accepted"]) for d in dg.by_depth()}
    assert depth == {0: (3, 2), 1: (2, 1), 2: (1, 1), 3: (1, 1)}
    conf = {round(b["lo"], 1): (b["examined"], b["accepted"]) for b in dg.by_confidence()}
    assert conf == {0.9: (3, 3), 0.8: (1, 1), 0.7: (1, 1), 0.2: (1, 0), 0.1: (1, 0)}
    cls = dg.by_class()
    assert cls["punctuation"] == {"examined": 1, "accepted": 0, "acceptance": 0.0}
    assert cls["word start"] == {"examined": 1, "accepted": 1, "acceptance": 1.0}
    assert cls["word continuation"]["examined"] == 5 and cls["word continuation"]["accepted"] == 4
    cp = dg.copied()
    assert cp["inside copied spans"]["examined"] == 4 and cp["inside copied spans"]["acceptance"] == 1.0
    assert cp["elsewhere"] == {"examined": 3, "accepted": 1, "acceptance": pytest.approx(1 / 3)}
    pairs = dg.top_pairs()
    assert {(p["drafted"], p["chosen"], p["count"]) for p in pairs} == {(50, 60, 1), (71, 61, 1)}
    d = dg.to_dict()
    json.dumps(d)
    assert d["medians"]["target_rank"] == 21.0 and d["medians"]["margin"] == pytest.approx(2.15)


def test_findings_state_their_thresholds():
    R = Rounds(list(range(100, 120)), knobs={"draft_p_min": 0.3})
    for i in range(12):
        # confident tokens at depth 0..1 are accepted, depth 2 is rejected; confidence there is 0.35
        R.round(
            [200 + i, 300 + i, 400, 500 + i],
            2,
            600,
            probs=[0.9, 0.8, 0.35, 0.3],
            pieces=[" word", "s", ".", " x"],
            rank=1 + i % 3,
            margin=0.2,
        )
    dg = diagnose(R.events)
    f = {x["key"]: x for x in dg.findings()}
    assert "100% of rejections are at depth 3 and beyond" in f["depth"]["text"]
    assert "drafts past 2 tokens cost more than they return" in f["depth"]["text"] and f["depth"]["threshold"] == 0.4
    assert f["confidence"]["text"].startswith(
        "draft_p_min 0.3 cuts nothing: drafts below 0.4 confidence are accepted 0% of the time (12 tokens"
    )
    assert "100% of rejections are near misses" in f["near-miss"]["text"]
    assert "makes 100% of rejections" in f["pair"]["text"]
    assert f["class"]["text"].startswith("punctuation tokens are accepted 0% of the time against 67% overall")
    # with a measured cost curve the break-even comes from it: 1 extra token costs (9-1)/8 of a 1-token decode
    dg2 = diagnose(R.events, cost=VerifyCostModel([1, 9], [0.010, 0.090]))
    assert dg2.break_even == pytest.approx(1.0) and "from the measured verify cost" in dg2.findings()[0]["text"]


def test_no_drafts_finding():
    R = Rounds([1, 2, 3])
    for _ in range(3):
        R.round([], 0, reason="no-match")
    f = diagnose(R.events).findings()
    assert f == [
        {
            "key": "no-drafts",
            "text": "no draft token was verified (the drafter stopped: no-match 3).",
            "threshold": None,
        }
    ]


def test_rewound_rounds_are_left_out():
    R = Rounds([1, 2, 3, 4])
    R.round([9, 9], 0, 5, rank=3)
    n_events = len(R.events)
    R.round([7, 7], 0, 6, rank=9)
    R.events.append(Rewound(1, position=6, n_events=n_events))
    dg = diagnose(R.events)
    assert dg.rounds == 1 and [r.drafted for r in dg.rejections] == [9]


# -- the acceptor records rank and margin ------------------------------------------------------------


def test_greedy_verdict_has_rank_and_margin():
    row0 = np.array([0.0, 5.0, 3.0, 4.0, 3.0, -1.0, np.nan], dtype=np.float32)
    # drafted 4: logits above it: 5, 4 → rank 3, but 2 ties with it at a lower id → rank 4
    v = accept([4], [row0, row0], SamplingParams(), np.random.default_rng(0), top_n=2)
    assert v.n_accepted == 0 and v.tokens == (1,)
    assert v.rejected_rank == 4 and v.margin == pytest.approx(1.0)
    # drafted 3: among the top two → rank 2 from the alternatives
    v = accept([3], [row0, row0], SamplingParams(), np.random.default_rng(0), top_n=2)
    assert v.rejected_rank == 2
    v = accept([1], [row0, row0], SamplingParams(), np.random.default_rng(0))
    assert v.rejected_rank is None and v.margin is None  # nothing rejected


def test_sampled_verdict_has_rank_in_the_sampling_distribution():
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    rng = np.random.default_rng(3)
    for _ in range(50):
        v = accept([3], [row, row], SamplingParams(temperature=1.0), rng, top_n=2)
        if v.n_accepted == 0:
            assert v.rejected_rank == 4 and v.margin == pytest.approx(np.log(0.5 / 0.3), rel=1e-5)
            break
    else:
        raise AssertionError("a 5% token was never rejected")
    v = accept([3], [row, row], SamplingParams(temperature=1.0, top_k=2), np.random.default_rng(0))
    assert v.n_accepted == 0 and v.rejected_rank == 3  # outside the top-k support: after all of it


def test_session_rejections_carry_rank_margin_and_diagnose_runs(tiny_session):
    s = tiny_session
    s.start("the cat of the dog and the a the cat of the", 80, "prompt-lookup", draft_max=6)
    s.run()
    rej = [e for e in s.events if e.kind == "rejected"]
    assert rej and all(e.draft_token_target_rank is not None and e.draft_token_target_rank >= 2 for e in rej)
    assert all(e.target_margin is not None and e.target_margin >= 0 for e in rej)
    for e in rej:
        alts = [a["token"] for a in e.alternatives]
        if e.tokens[0] in alts:
            assert e.draft_token_target_rank == alts.index(e.tokens[0]) + 1
    dg = diagnose(s)
    t = s.telemetry_dict()
    assert dg.drafted == t["drafted"] and dg.accepted == t["accepted"] and len(dg.rejections) == len(rej)
    assert dg.text().startswith(f"{t['rounds']} rounds")
