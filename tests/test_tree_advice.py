"""Would a draft tree pay (specviz.analysis.tree_advice, ``specviz advise REC --tree``): rank shares counted by
hand on built rounds, the predicted accepted length of known shapes, a cheap-row curve where a tree pays and a
CPU-like one where none does (with the ratio it would need), the candidates the draft model records against
a top-k of its own logits, the event's round trip, and the CLI's text, JSON and refusal."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import TINY

from specviz.analysis.tree_advice import (
    NODE_BUDGET,
    PAYS_MARGIN,
    Shape,
    TreeCosts,
    accepted_length,
    best_pair,
    extended,
    linear_curve,
    rank_shares,
    run_knobs,
    score_all,
    shapes,
    tree_advice,
)
from specviz.cli.main import main
from specviz.decoding.events import Accepted, DraftProposed, SessionStarted, Verified, event_from_dict
from specviz.decoding.recorder import Recorder
from specviz.decoding.verify_cost import VerifyCostModel
from specviz.errors import RecordingError
from specviz.strategies.base import DRAFT_ALTERNATIVES
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

A, A2, B, B2, C, X = 10, 11, 20, 21, 30, 99  # A2, B2: the draft's rank-2 candidates; X: outside its top 2
DRAFT_DECODE = 0.001  # seconds of one draft decode in the built rounds


class Built:
    """A chain recording built event by event: two-token drafts with the draft's top two at each position."""

    def __init__(self, verify=None) -> None:
        self.events: list = [SessionStarted(0, model="m.gguf", strategy="draft", knobs={"draft_max": 2})]
        self.n = 0
        self.verify = verify or (lambda b: 0.01)  # the recorded verify seconds of a batch of b rows

    def round(self, picks: list[int], alternatives=((A, A2), (B, B2)), draft=(A, B), reason=None, block=None) -> None:
        """A round whose target picked ``picks`` (accepted draft tokens, then its own)."""
        self.n += 1
        n_acc = len(picks) - 1
        self.events += [
            DraftProposed(
                self.n,
                tokens=tuple(draft),
                seconds=DRAFT_DECODE * (len(draft) + (reason == "p-min")),
                drafter="draft",
                alternatives=tuple(tuple(a) for a in alternatives),
                reason=reason,
                block=block,
            ),
            Verified(self.n, tokens=tuple(picks), seconds=self.verify(1 + len(draft)), batch_size=1 + len(draft)),
            Accepted(self.n, tokens=tuple(picks), n_accepted=n_acc),
        ]


def hand_worked(verify=None) -> list:
    """Twenty rounds, worked by hand (the draft proposes A, B; its rank 2 are A2, B2):

    =====  ===========  =========================================
    times  target       depth 1 / depth 2
    =====  ===========  =========================================
    6      A, B, C      rank 1 / rank 1
    6      A, B2        rank 1 / rank 2
    4      A2           rank 2 / not reached
    4      X            outside / not reached
    =====  ===========  =========================================

    Depth 1: 20 reached, shares 0.6 / 0.2 / 0.2. Depth 2: 12 reached, 0.5 / 0.5 / 0. A chain of two: 1 + 0.6 +
    0.6 x 0.5 = 1.9 tokens a round; 2x1: 1 + 0.8 + 0.8 x 0.5 = 2.2; 2x2: 1 + 0.8 + 0.8 x 1.0 = 2.6. ``verify``:
    the recorded verify seconds of a batch of b rows (the curve the advice is given, unless a test says).
    """
    R = Built(verify)
    for picks, times in (([A, B, C], 6), ([A, B2], 6), ([A2], 4), ([X], 4)):
        for _ in range(times):
            R.round(picks)
    return R.events


def test_rank_shares_are_counted_over_the_depths_the_target_reached():
    sh = rank_shares(hand_worked())
    assert (sh.k, sh.rounds, sh.reached) == (2, 20, (20, 12))
    assert sh.counts == ((12, 4, 4), (6, 6, 0))
    assert sh.share(0) == pytest.approx((0.6, 0.2, 0.2)) and sh.share(1) == pytest.approx((0.5, 0.5, 0.0))
    assert sh.caught(0, 2) == pytest.approx(0.8) and sh.usable_depths == 2
    assert sh.draft_decode_seconds == pytest.approx(DRAFT_DECODE)
    assert sh.accepted_length == pytest.approx(1 + (6 * 2 + 6 * 1) / 20)


def test_the_predicted_accepted_length_of_known_shapes():
    sh = rank_shares(hand_worked())
    assert accepted_length(sh, Shape(())) == 1.0
    assert accepted_length(sh, Shape((1,))) == pytest.approx(1.6)
    assert accepted_length(sh, Shape((1, 1))) == pytest.approx(1.9)
    assert accepted_length(sh, Shape((2, 1))) == pytest.approx(2.2)
    assert accepted_length(sh, Shape((2, 2))) == pytest.approx(2.6)
    assert Shape((2, 2)).per_depth == (2, 4) and Shape((2, 2)).nodes == 6 and Shape((4, 2, 1)).nodes == 20


def test_the_grid_never_widens_with_depth_and_keeps_the_budget():
    grid = shapes(4, 3, budget=8)
    labels = {s.label for s in grid}
    assert {"plain", "chain of 1", "chain of 3", "tree 2x1x1", "tree 2x2", "tree 4", "tree 4x1"} <= labels
    assert "tree 1x2" not in labels and "tree 4x2" not in labels  # widening; 4 + 8 nodes
    assert all(s.nodes <= 8 and len(s.widths) <= 3 for s in grid)
    assert len(labels) == len(grid)


def cheap_rows(b: int) -> float:
    """A GPU-like verify: 10 ms, and 0.1 ms a row more."""
    return 0.010 + 0.0001 * (b - 1)


def cpu_rows(b: int) -> float:
    """A CPU-like verify: every row costs as much as the first."""
    return 0.010 * b


def curve(f) -> VerifyCostModel:
    sizes = list(range(1, 65))
    return VerifyCostModel(sizes, [f(b) for b in sizes])


def test_a_tree_pays_where_rows_are_nearly_free():
    adv = tree_advice(hand_worked(cheap_rows), cost=curve(cheap_rows))
    # 2x2 (6 nodes): drafting 1 ms + 1 ms x cost(2)/cost(1), verify of 7 rows 10.6 ms; 2.6 tokens a round
    assert adv.tree is not None and adv.tree.shape.widths == (2, 2)
    assert adv.tree.accepted_length == pytest.approx(2.6)
    assert adv.tree.round_seconds == pytest.approx(0.001 + 0.001 * 0.0101 / 0.010 + 0.0106)
    # the best chain: two deep, 1.9 tokens for two draft decodes and a 3-row verify
    assert adv.chain.shape.widths == (1, 1) and adv.chain.round_seconds == pytest.approx(0.002 + 0.0102)
    assert adv.pays and adv.needed_ratio is None
    assert adv.measured_ratio == pytest.approx(cheap_rows(NODE_BUDGET + 1) / cheap_rows(1))
    assert "a tree pays" in adv.verdict() and "tree 2x2" in adv.verdict()
    assert not any("draft_p_min" in n for n in adv.notes) and not any("curve reaches" in n for n in adv.notes)


def test_no_tree_pays_where_every_row_costs_a_decode_and_the_ratio_it_would_need():
    adv = tree_advice(hand_worked(cpu_rows), cost=curve(cpu_rows))
    assert not adv.pays and adv.chain.shape.widths == ()  # plain decoding beats every draft here
    assert adv.measured_ratio == pytest.approx(NODE_BUDGET + 1)
    r = adv.needed_ratio
    assert r is not None and 1.0 < r < adv.measured_ratio

    def margin(ratio: float) -> float:
        costs = TreeCosts(linear_curve(cpu_rows(1), ratio), (0.0, 0.0), DRAFT_DECODE)
        chain, tree = best_pair(score_all(adv.shares, costs, [s.shape for s in adv.scored]))
        assert tree is not None
        return tree.tokens_per_second / chain.tokens_per_second

    # at the ratio found a tree just pays; a little dearer, it does not
    assert margin(r) == pytest.approx(PAYS_MARGIN, rel=1e-3) and margin(r * 1.01) < PAYS_MARGIN
    assert f"{r:.2f}x" in adv.verdict() and "no tree pays" in adv.verdict()


def test_no_tree_pays_even_with_free_rows_when_rank_two_never_catches_the_pick():
    R = Built()
    for picks, times in (([A, B, C], 10), ([X], 10)):
        for _ in range(times):
            R.round(picks)
    adv = tree_advice(R.events, cost=curve(cheap_rows))
    assert not adv.pays and adv.needed_ratio is None
    assert "even where extra verify rows cost nothing" in adv.verdict() and "catch 0% " in adv.verdict()


def test_where_a_draft_decode_costs_more_than_a_verify_the_advice_says_so():
    fast = curve(lambda b: 0.0005 + 0.00001 * (b - 1))
    adv = tree_advice(hand_worked(fast), cost=fast)
    assert not adv.pays and adv.needed_ratio is None and adv.chain.shape.widths == ()
    assert "a one-row draft decode (1.0 ms) costs as much as the target's one-row verify (0.5 ms)" in adv.verdict()
    assert "catch 20% of the target's picks at depth 1" in adv.verdict()


def test_a_recording_without_candidates_is_refused():
    R = Built()
    R.round([A, B, C], alternatives=())
    with pytest.raises(RecordingError, match="no draft candidates"):
        rank_shares(R.events)


def test_the_alternatives_round_trip_through_the_event_dictionary():
    e = DraftProposed(3, tokens=(A, B), alternatives=((A, A2), (B, B2)))
    d = json.loads(json.dumps(e.to_dict()))
    assert d["alternatives"] == [[A, A2], [B, B2]] and event_from_dict(d) == e
    assert event_from_dict({"kind": "draft_proposed", "round": 1}).alternatives == ()


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory):
    """A one-layer draft that reuses the tiny target's embedding, output and first block."""
    w = tiny_weights(**{"seed": TINY["seed"], "block_scale": TINY["block_scale"]})
    return write_tiny_llama(tmp_path_factory.mktemp("draft") / "draft.gguf", n_layer=1, layers_from=w)


def top_k_reference(row: np.ndarray, k: int) -> list[int]:
    """Numpy's top k of a row, largest first, ties to the lower id, NaN as -inf."""
    r = np.where(np.isnan(row), -np.inf, row)
    return [int(i) for i in np.lexsort((np.arange(r.shape[0]), -r))[:k]]


def test_the_draft_model_records_a_top_k_of_its_own_logits(tiny_session, tiny_model, draft_path):
    from specviz.backends import LlamaContext, LlamaModel

    tiny_session.start("the cat of the dog and the a", 40, "draft", draft_model=str(draft_path), draft_p_min=0.0)
    tiny_session.run()
    drafts = [e for e in tiny_session.events if e.kind == "draft_proposed" and e.tokens]
    assert drafts
    history = list(tiny_session.history)
    draft_model = LlamaModel(draft_path)
    ctx = LlamaContext(draft_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        for d in drafts:
            assert len(d.alternatives) == len(d.tokens)
            assert all(len(a) == DRAFT_ALTERNATIVES and a[0] == t for a, t in zip(d.alternatives, d.tokens))
            ctx.clear()
            seq = history[: d.position] + list(d.tokens[:-1])
            ctx.eval(seq, 0, rows="all")
            for i, alts in enumerate(d.alternatives):
                assert list(alts) == top_k_reference(ctx.row(d.position - 1 + i), DRAFT_ALTERNATIVES)
    finally:
        ctx.close()
        draft_model.close()
    adv = tree_advice(tiny_session.events, cost=curve(cheap_rows))
    assert adv.shares.rounds == len(drafts) and sum(adv.shares.counts[0]) == len(drafts)


def test_the_ngram_rounds_carry_no_alternatives(tiny_session):
    tiny_session.start("the a the a the a", 20, "ngram-simple")
    tiny_session.run()
    assert all(e.alternatives == () for e in tiny_session.events if e.kind == "draft_proposed")


def record(path, events) -> str:
    with Recorder(path) as rec:
        for e in events:
            rec(e)
    return str(path)


def cost_file(path, f) -> str:
    sizes = list(range(1, 65))
    path.write_text(json.dumps({"sizes": sizes, "seconds": [f(b) for b in sizes]}))
    return str(path)


def test_cli_prints_the_advice_and_its_json(tmp_path, capsys):
    rec = record(tmp_path / "rec.jsonl", hand_worked())
    cost = cost_file(tmp_path / "cost.json", cheap_rows)
    assert main(["advise", rec, "--tree", "--verify-cost", cost]) == 0
    out = capsys.readouterr().out
    assert "rank 2" in out and "a tree pays" in out and "--check measures it" in out
    # the best tree (2x2) branches below the first depth: no knob drafts it; the best tree that runs is named
    assert "the best tree the draft strategy drafts as shaped, tree 2x1" in out and "--tree-width 2" in out
    assert main(["advise", rec, "--tree", "--verify-cost", cost, "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)["tree"]
    assert tree["rank_share"][0] == pytest.approx([0.6, 0.2, 0.2]) and tree["pays"] is True
    assert tree["predicted_accepted_length"] == pytest.approx(2.6)
    assert tree["best_tree"]["widths"] == [2, 2] and any(s["shape"] == "chain of 2" for s in tree["shapes"])
    assert tree["verify_cost"]["one_row_seconds"] == pytest.approx(cheap_rows(1))
    assert tree["verify_cost"]["needed_ratio"] is None and tree["verify_cost"]["ratio_rows"] == NODE_BUDGET + 1
    run = tree["runnable_tree"]
    assert run["widths"] == [2, 1] and run["strategy"] == "draft"
    assert run["knobs"] == {
        "draft_max": 4,
        "draft_p_min": 0.0,
        "align": False,
        "draft_policy": "fixed",
        "tree_width": 2,
        "p_split": 0.0,
    }
    assert (
        run["flags"] == "--spec-draft-n-max 4 --spec-draft-p-min 0 --tree-width 2 --spec-draft-p-split 0 --align false"
    )


def test_cli_refuses_a_recording_without_candidates(tmp_path, capsys):
    R = Built()
    for _ in range(3):
        R.round([A, B, C], alternatives=())
    rec = record(tmp_path / "ngram.jsonl", R.events)
    assert main(["advise", rec, "--tree"]) == 2
    assert "no draft candidates" in capsys.readouterr().err


@pytest.mark.parametrize("other", [["--synth-rates"], ["--parallel", "1,2"], ["--check-server"], ["--for-server"]])
def test_cli_refuses_tree_beside_another_report(tmp_path, capsys, other):
    rec = record(tmp_path / "rec.jsonl", hand_worked())
    assert main(["advise", rec, "--tree", *other]) == 2
    assert f"option --tree: not with {other[0]}" in capsys.readouterr().err


def test_the_knobs_of_a_shape_for_the_draft_strategy_and_others():
    assert run_knobs(Shape(())) is None
    assert run_knobs(Shape((1, 1, 1))) == {"draft_max": 3, "draft_p_min": 0.0, "align": False, "draft_policy": "fixed"}
    assert run_knobs(Shape((4, 1))) == {**run_knobs(Shape((1,) * 8)), "tree_width": 4, "p_split": 0.0}  # type: ignore[dict-item]
    assert run_knobs(Shape((2, 2, 1))) is None  # a split below the first depth: no knob drafts it
    assert run_knobs(Shape((2, 1)), "eagle3") is None and run_knobs(Shape((1, 1)), "eagle3") is not None
    adv = tree_advice(hand_worked(cheap_rows), cost=curve(cheap_rows))
    assert adv.runnable is not None and adv.runnable.shape.widths == (2, 1)
    other = dataclasses.replace(adv, shares=dataclasses.replace(adv.shares, strategy="eagle3"), runnable=None)
    assert "no knob of the eagle3 strategy drafts these shapes" in other.how_to_run()
    assert other.to_dict()["runnable_tree"] is None
    assert all(
        s.tokens_per_second <= adv.runnable.tokens_per_second
        for s in adv.scored
        if s.shape.widths[:1] == (2,) and set(s.shape.widths[1:]) <= {1}
    )


def test_a_curve_measured_short_of_the_shapes_rows_is_extended_on_its_mean_cost_per_row():
    # the last segment falls (a tile's step): extending it would price 17 rows below nothing
    short = VerifyCostModel([1, 2, 3, 4], [0.010, 0.020, 0.030, 0.012])
    assert short(17) < 0
    verify, rows = extended(short)
    assert rows == 4 and verify(3) == pytest.approx(0.030) and verify(4) == pytest.approx(0.012)
    assert verify(17) == pytest.approx(0.012 + (0.012 - 0.010) / 3 * 13)
    adv = tree_advice(hand_worked(short), cost=short)  # its largest shape, 2x2, verifies 7 rows
    assert adv.measured_ratio == pytest.approx(verify(17) / 0.010)
    assert any("curve reaches 4 rows; the shapes' 7" in n for n in adv.notes)


def test_drafts_stopped_at_p_min_are_counted_and_named():
    R = Built()
    for _ in range(10):
        R.round([A, B, C])
    R.round([A, C], alternatives=((A, A2),), draft=(A,), reason="p-min")
    sh = rank_shares(R.events)
    assert sh.p_min_stops == 1 and sh.reached == (11, 10) and sh.draft_decodes == 10 * 2 + 2
    adv = tree_advice(R.events, cost=curve(cheap_rows))
    assert any("1 drafts stopped where the draft was unsure" in n for n in adv.notes)


def test_fresh_times_as_many_rows_as_the_largest_tree_verifies(tiny_session, draft_path):
    from specviz.analysis.advise_fresh import measure_recorded

    tiny_session.start("the cat of the dog", 12, "draft", draft_model=str(draft_path), draft_p_min=0.0, draft_max=3)
    tiny_session.run()
    events = list(tiny_session.events)
    recorded = measure_recorded(events)
    wide = measure_recorded(events, longest=NODE_BUDGET)
    assert recorded is not None and wide is not None
    # under the recorded verify-tile alignment (tiles of 4 rows) the sizes timed are the tile's multiples
    assert recorded.sizes[-1] <= 4 and wide.sizes[-1] >= NODE_BUDGET


def test_top_candidates_read_a_reduced_vocabulary_and_map_back_to_target_ids():
    from specviz.strategies.draft_choice import top_candidates

    row = np.full(10, -1.0, dtype=np.float32)
    row[[2, 4, 6, 8]] = [3.0, 5.0, 5.0, np.nan]
    ids = np.array([0, 2, 4, 6, 8], dtype=np.int64)
    # 4 and 6 tie (the lower index first), the NaN at 8 counts as -inf, 3 and 5 are not in the vocabulary
    assert top_candidates(row, ids, 4) == [4, 6, 2, 0]
    assert top_candidates(row, None, 2) == [4, 6]


def test_an_eagle3_head_records_its_candidates_in_its_own_vocabulary(e3_target_path, e3_head_path):
    from specviz import Session

    with Session(e3_target_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1) as s:
        s.start([1, 40, 41, 42, 43], 30, "eagle3", draft_model=str(e3_head_path), draft_p_min=0.0, draft_max=5)
        s.run()
        drafts = [e for e in s.events if e.kind == "draft_proposed" and e.tokens]
    assert drafts
    for d in drafts:
        assert len(d.alternatives) == len(d.tokens)
        for alts, tok in zip(d.alternatives, d.tokens):
            # the tiny head's draft vocabulary is the even ids; greedy drafts its first candidate
            assert len(set(alts)) == DRAFT_ALTERNATIVES and alts[0] == tok and all(a % 2 == 0 for a in alts)


def test_draft_decodes_recorded_under_load_are_priced_at_the_curves_level():
    # the rounds ran at twice the curve's verify times (a busier machine): their draft decodes count half
    adv = tree_advice(hand_worked(lambda b: 2 * cheap_rows(b)), cost=curve(cheap_rows))
    assert adv.draft_decode_seconds == pytest.approx(DRAFT_DECODE / 2)
    assert adv.chain.round_seconds == pytest.approx(0.001 + 0.0102)
    assert any("recorded verify times are 2.00x the curve's" in n for n in adv.notes)
    # without a curve given the advice fits the recorded times (one level, nothing moved): here every round
    # verified 3 rows, too few sizes for a curve
    with pytest.raises(RecordingError, match="fewer than two batch sizes"):
        tree_advice(hand_worked(cheap_rows))
    R = Built(cheap_rows)
    for picks in ([A, B, C], [X], [A, B2]) * 5:
        R.round(picks)
    R.round([A, C], alternatives=((A, A2),), draft=(A,))
    fitted = tree_advice(R.events)
    assert fitted.draft_decode_seconds == pytest.approx(DRAFT_DECODE)
    assert any("fitted to the recorded verify times of 2 batch sizes (2, 3 rows)" in n for n in fitted.notes)


def test_a_curve_dearer_in_between_than_its_ends_is_named_when_the_ratio_alone_would_pay():
    # 2 rows cheap, 3 rows and more dear, 17 rows back to 1.1x a row: its 17-row ratio is within what a
    # straight line would allow, but every tree verifies 3 rows or more
    stepped = VerifyCostModel([1, 2, 3, 4, 16, 17], [0.010, 0.0101, 0.015, 0.030, 0.030, 0.011])
    adv = tree_advice(hand_worked(stepped), cost=stepped)
    assert not adv.pays and adv.chain.shape.widths == (1,)
    assert adv.needed_ratio is not None and adv.needed_ratio >= adv.measured_ratio == pytest.approx(1.1)
    assert "on a straight-line curve: this machine's is 1.10x, but dearer in between" in adv.verdict()


def test_the_block_drafters_record_each_read_positions_candidates(e3_target_path, tmp_path):
    from specviz import Session
    from specviz.testing.tiny_dflash import write_tiny_dflash

    heads = {
        "dflash": write_tiny_dflash(tmp_path / "dflash.gguf", seed=1, target_layers=(1, 3)),
        "dspark": write_tiny_dflash(tmp_path / "dspark.gguf", seed=2, target_layers=(0, 2), dspark=True),
        "dflash2": write_tiny_dflash(tmp_path / "dflash2.gguf", seed=4, target_layers=(1, 2), selector_top_k=4),
    }
    with Session(e3_target_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1) as s:
        for kind, head in heads.items():
            strategy = "dspark" if kind == "dspark" else "dflash"
            s.start([1, 40, 41, 42, 43], 20, strategy, draft_model=str(head), draft_p_min=0.0)
            s.run()
            drafts = [e for e in s.events if e.kind == "draft_proposed" and e.tokens]
            assert drafts, kind
            for d in drafts:
                if kind == "dflash2":  # a lattice walk's candidates depend on the walk: none recorded
                    assert d.alternatives == ()
                    continue
                assert len(d.alternatives) == len(d.tokens), kind
                assert all(len(a) == DRAFT_ALTERNATIVES and a[0] == t for a, t in zip(d.alternatives, d.tokens))


def test_a_block_drafter_pays_one_pass_whatever_the_shape():
    R = Built(cheap_rows)
    for picks, times in (([A, B, C], 6), ([A, B2], 6), ([A2], 4), ([X], 4)):
        for _ in range(times):
            R.round(picks, block={"kind": "dflash", "size": 3, "positions": 2})
    adv = tree_advice(R.events, cost=curve(cheap_rows))
    assert adv.shares.block_rounds == 20
    by = {s.shape.widths: s for s in adv.scored}
    # the block's 2 ms (two positions' worth here) once a round, for a chain and a tree alike
    assert by[(1, 1)].round_seconds == pytest.approx(0.002 + cheap_rows(3))
    assert by[(2, 2)].round_seconds == pytest.approx(0.002 + cheap_rows(7))
    assert adv.pays and adv.tree is not None and adv.tree.shape.widths == (2, 2)


def test_too_few_rounds_for_any_shape_say_so():
    R = Built(cheap_rows)
    for picks in ([A, B, C], [A2], [A, B2]):
        R.round(picks)
    adv = tree_advice(R.events, cost=curve(cheap_rows))
    assert adv.tree is None and not adv.pays and adv.chain.shape.widths == ()
    assert "a depth needs 10 drafting rounds that reached it, and 3 reached the first" in adv.verdict()
    assert json.loads(json.dumps(adv.to_dict()))["predicted_accepted_length"] is None
