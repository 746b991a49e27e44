"""The rules of the diagnosis's findings (specviz.analysis.diagnosis), each on hand-made figures: it fires at
its threshold, stays silent just on the other side of it and below its minimum support.

The thresholds are written here as numbers on purpose: a changed constant must fail these tests."""

from __future__ import annotations

from specviz.analysis.diagnosis import (
    Diagnosis,
    Examined,
    RejectionRow,
    class_rule,
    confidence_rule,
    copied_rule,
    depth_rule,
    empty_rounds_rule,
    low_confidence_cut,
    near_miss_rule,
    nothing_verified,
    pair_rule,
)


def toks(n, accepted, *, depth=0, cls="word start", prob=None, copied=False):
    """``n`` examined tokens of which the first ``accepted`` were accepted."""
    return [Examined(1, depth, cls, prob, copied, i < accepted, "draft") for i in range(n)]


def rej(*, depth=0, rank=None, margin=None, drafted=(1, "a"), chosen=(2, "b")):
    """One rejection row."""
    return RejectionRow(
        round=1,
        position=10,
        depth=depth,
        drafted=drafted[0],
        drafted_piece=drafted[1],
        draft_prob=None,
        target_prob=None,
        target_rank=rank,
        margin=margin,
        chosen=chosen[0],
        chosen_piece=chosen[1],
        chosen_prob=0.5,
        token_class="word start",
        copied=False,
    )


def figures(tokens=(), rejections=(), *, rounds=0, drafting_rounds=0, knobs=None, empty_reasons=None, **kw):
    """A diagnosis holding these rows, its counters consistent with them."""
    tokens = list(tokens)
    return Diagnosis(
        rounds=rounds,
        drafting_rounds=drafting_rounds,
        examined=len(tokens),
        accepted=sum(t.accepted for t in tokens),
        knobs=knobs or {},
        empty_reasons=empty_reasons or {},
        tokens=tokens,
        rejections=list(rejections),
        **kw,
    )


# -- nothing verified ------------------------------------------------------------------------------


def test_nothing_verified_names_why_the_drafter_stopped_and_is_the_only_finding():
    dg = figures(rounds=10, empty_reasons={"no-match": 3, "p-min": 7})
    assert nothing_verified(dg) == {
        "key": "no-drafts",
        "text": "no draft token was verified (the drafter stopped: p-min 7, no-match 3).",
        "threshold": None,
    }
    assert dg.findings() == [nothing_verified(dg)]  # not also "100% of rounds proposed no draft"
    assert nothing_verified(figures())["text"] == "no draft token was verified."


# -- depth -----------------------------------------------------------------------------------------


def test_depth_rule_names_the_first_depth_below_the_break_even():
    dg = figures(toks(8, 8, depth=0) + toks(8, 3, depth=1) + toks(4, 1, depth=2), [rej(depth=1)] * 5 + [rej(depth=0)])
    assert depth_rule(dg) == [
        {
            "key": "depth",
            "threshold": 0.4,
            "text": "83% of rejections are at depth 2 and beyond, where 33% of draft tokens are accepted "
            "(break-even 40%, default): drafts past 1 token cost more than they return",
        }
    ]


def test_depth_rule_is_silent_at_the_break_even_and_below_the_support():
    assert depth_rule(figures(toks(8, 8, depth=0) + toks(10, 4, depth=1), [rej(depth=1)] * 6)) == []  # 40%
    assert depth_rule(figures(toks(8, 8, depth=0) + toks(7, 0, depth=1), [rej(depth=1)] * 7)) == []  # 7 tokens
    # no rejection recorded: the deeper cut cannot be named
    assert depth_rule(figures(toks(8, 8, depth=0) + toks(8, 0, depth=1))) == []


def test_depth_rule_on_the_first_token_and_with_a_measured_break_even():
    assert depth_rule(figures(toks(10, 3, depth=0), [rej()] * 7)) == [
        {
            "key": "depth",
            "threshold": 0.4,
            "text": "the first draft token is accepted only 30% of the time (break-even 40%, default): drafting "
            "does not pay here at any length",
        }
    ]
    assert depth_rule(figures(toks(10, 4, depth=0), [rej()] * 6)) == []
    measured = figures(
        toks(10, 4, depth=0), [rej()] * 6, break_even=0.5, break_even_source="from the measured verify cost"
    )
    (f,) = depth_rule(measured)
    assert f["threshold"] == 0.5 and "(break-even 50%, from the measured verify cost)" in f["text"]


# -- confidence ------------------------------------------------------------------------------------


def test_low_confidence_cut_is_the_lowest_cut_removing_what_the_highest_removes():
    conf = [(0.15, False)] * 8 + [(0.45, False)] * 8 + [(0.9, True)] * 16
    assert low_confidence_cut(conf) == (0.5, 0.0, 16)
    assert low_confidence_cut([(0.15, False)] * 7 + [(0.9, True)] * 8) is None  # 7 below any cut


def test_confidence_rule_fires_below_a_quarter_accepted():
    low = toks(25, 6, prob=0.15) + toks(8, 8, prob=0.9)  # 24% of the tokens below 0.2 accepted
    assert confidence_rule(figures(low, knobs={"draft_p_min": 0.0})) == [
        {
            "key": "confidence",
            "threshold": 0.25,
            "text": "draft_p_min 0 cuts nothing: drafts below 0.2 confidence are accepted 24% of the time "
            "(25 tokens; threshold 25%), so draft_p_min 0.2 would stop them",
        }
    ]
    at = toks(8, 2, prob=0.15) + toks(8, 8, prob=0.9)  # 25%: not below the threshold
    assert confidence_rule(figures(at)) == []


def test_confidence_rule_against_the_session_draft_p_min_and_the_support():
    low = toks(4, 0, prob=0.05) + toks(8, 0, prob=0.15) + toks(8, 8, prob=0.9)
    (f,) = confidence_rule(figures(low, knobs={"draft_p_min": 0.1}))
    assert f["text"].startswith("draft_p_min 0.1 cuts too little: drafts below 0.2 confidence")
    assert confidence_rule(figures(low, knobs={"draft_p_min": 0.2})) == []  # already cut there
    assert confidence_rule(figures(toks(7, 0, prob=0.15) + toks(30, 30))) == []  # 7 tokens with a probability


# -- near misses -----------------------------------------------------------------------------------


def test_near_miss_rule_names_close_calls_from_half_the_rejections():
    rows = [rej(rank=5, margin=0.5)] * 4 + [rej(rank=6, margin=0.5)] * 4  # rank 5 is in the top 5, 6 is not
    assert near_miss_rule(figures(toks(8, 0), rows)) == [
        {
            "key": "near-miss",
            "threshold": 0.5,
            "text": "50% of rejections are near misses (the drafted token was in the target's top 5, median "
            "top-two margin 0.50): the drafter guesses the right kind of token and loses close calls",
        }
    ]
    assert near_miss_rule(figures(toks(8, 0), [rej(rank=2)] * 3 + [rej(rank=40)] * 5)) == []  # 37.5%


def test_near_miss_rule_names_far_guesses_up_to_a_fifth():
    rows = [rej(rank=2)] * 2 + [rej(rank=40)] * 8
    assert near_miss_rule(figures(toks(10, 0), rows)) == [
        {
            "key": "near-miss",
            "threshold": 0.2,
            "text": "only 20% of rejections are near misses (median rank 40): the drafted tokens are far from "
            "what the target wants",
        }
    ]
    assert near_miss_rule(figures(toks(10, 0), [rej(rank=2)] * 3 + [rej(rank=40)] * 7)) == []  # 30%
    assert near_miss_rule(figures(toks(7, 0), [rej(rank=40)] * 7)) == []  # 7 rejections


# -- copied spans ----------------------------------------------------------------------------------


def test_copied_rule_fires_from_a_thirty_point_gap():
    tokens = toks(10, 6, copied=True) + toks(10, 3)  # 0.6 - 0.3 is 0.3 exactly in floating point
    assert copied_rule(figures(tokens)) == [
        {
            "key": "copied",
            "threshold": 0.3,
            "text": "acceptance is 60% inside copied spans and 30% elsewhere (gap over 30 points): the drafter "
            "pays where the output copies; draft_policy=cost keeps drafts short elsewhere",
        }
    ]
    assert copied_rule(figures(toks(10, 8, copied=True) + toks(40, 21))) == []  # 27.5 points
    assert copied_rule(figures(toks(7, 7, copied=True) + toks(10, 0))) == []  # 7 copied tokens


# -- token classes ---------------------------------------------------------------------------------


def test_class_rule_names_classes_a_quarter_below_the_rest():
    tokens = toks(10, 10, cls="word start") + toks(10, 5, cls="punctuation")  # 75% overall, 50% punctuation
    assert class_rule(figures(tokens)) == [
        {
            "key": "class",
            "threshold": 0.25,
            "text": "punctuation tokens are accepted 50% of the time against 75% overall (10 examined; a gap "
            "over 25 points)",
        }
    ]
    assert class_rule(figures(toks(30, 30) + toks(10, 7, cls="punctuation"))) == []  # 22.5 points
    assert class_rule(figures(toks(30, 30) + toks(7, 0, cls="punctuation"))) == []  # 7 examined


def test_class_rule_lists_classes_in_display_order():
    tokens = toks(40, 40) + toks(8, 0, cls="other") + toks(8, 0, cls="whitespace")
    assert [f["text"].split(" tokens")[0] for f in class_rule(figures(tokens))] == ["whitespace", "other"]


# -- one pair --------------------------------------------------------------------------------------


def test_pair_rule_names_a_pair_from_a_tenth_of_the_rejections():
    rows = [rej(drafted=(i, f"d{i}"), chosen=(100 + i, f"c{i}")) for i in range(10)]
    assert pair_rule(figures(toks(10, 0), rows)) == [
        {
            "key": "pair",
            "threshold": 0.1,
            "text": "“d0” drafted where the target chose “c0” makes 10% of rejections (1; at least 10% to be named)",
        }
    ]
    eleven = [rej(drafted=(i, f"d{i}"), chosen=(100 + i, f"c{i}")) for i in range(11)]  # 9% each
    assert pair_rule(figures(toks(11, 0), eleven)) == []
    assert pair_rule(figures(toks(7, 0), [rej()] * 7)) == []  # 7 rejections


# -- rounds without a draft ------------------------------------------------------------------------


def test_empty_rounds_rule_names_them_from_half_the_rounds():
    reasons = {"no-match": 3, "p-min": 1, "check-rate": 2, "min-hits": 1}
    assert empty_rounds_rule(figures(toks(4, 4), rounds=8, drafting_rounds=4, empty_reasons=reasons)) == [
        {
            "key": "no-draft",
            "threshold": 0.5,
            "text": "50% of rounds proposed no draft (no-match 3, check-rate 2, p-min 1): those rounds are plain "
            "decoding (at least half to be named)",
        }
    ]
    assert empty_rounds_rule(figures(toks(5, 5), rounds=9, drafting_rounds=5)) == []  # 44%
    assert empty_rounds_rule(figures(toks(1, 1), rounds=7, drafting_rounds=1)) == []  # 7 rounds


def test_findings_list_the_rules_in_order():
    rows = [rej(depth=1, rank=40)] * 10
    dg = figures(toks(10, 0, depth=1, cls="punctuation") + toks(30, 30), rows, rounds=40, drafting_rounds=10)
    assert [f["key"] for f in dg.findings()] == ["depth", "near-miss", "class", "pair", "no-draft"]
