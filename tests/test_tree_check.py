"""The tree advice checked by running it (specviz.analysis.tree_check, ``specviz advise REC --tree --check``): the
recorded chain rerun gives the recorded rounds, the tree runs as shaped (every drafting round branches, its rows
the shape's), the CLI's text, JSON and refusals; and once on the embedded model with a derived draft."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import TINY

from specviz import Session
from specviz.analysis.tree_advice import Shape, rank_shares, tree_advice
from specviz.analysis.tree_check import check_shapes, check_tree
from specviz.cli.main import main
from specviz.decoding.recorder import Recorder
from specviz.decoding.verify_cost import VerifyCostModel
from specviz.errors import RecordingError
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

PROMPT = "the cat of the dog and the a"
DEPTH = 3  # the recorded chain's draft length


def flat(b: int) -> float:
    """A verify whose rows cost almost nothing past the first (a GPU's)."""
    return 0.010 + 0.0001 * (b - 1)


def cost_file(path) -> str:
    sizes = list(range(1, 33))
    path.write_text(json.dumps({"sizes": sizes, "seconds": [flat(b) for b in sizes]}))
    return str(path)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A greedy chain of ``DEPTH`` drafted by a one-layer draft of the tiny target (p_min 0, alignment off),
    recorded; the recording's path and events."""
    d = tmp_path_factory.mktemp("treecheck")
    target = write_tiny_llama(d / "target.gguf", **TINY)
    draft = write_tiny_llama(d / "draft.gguf", n_layer=1, layers_from=tiny_weights(**TINY))
    path = d / "chain.jsonl"
    with Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1) as s, Recorder(path) as rec:
        s.subscribe(rec)
        s.start(PROMPT, 60, "draft", draft_model=str(draft), draft_p_min=0.0, draft_max=DEPTH, align=False)
        s.run()
        events = list(s.events)
    return path, events


def pinned(events, chain: tuple[int, ...], tree: tuple[int, ...]):
    """The advice with its best chain and runnable tree pinned to these shapes (the test decides what runs)."""
    adv = tree_advice(events, cost=VerifyCostModel(list(range(1, 33)), [flat(b) for b in range(1, 33)]))
    by = {s.shape.widths: s for s in adv.scored}
    return dataclasses.replace(adv, chain=by[chain], runnable=by[tree])


def test_the_recorded_chain_reruns_its_rounds_and_the_tree_runs_as_shaped(recording):
    _, events = recording
    adv = pinned(events, (1,) * DEPTH, (2, 1, 1))
    assert [s.shape.widths for s in check_shapes(adv)] == [(1, 1, 1), (2, 1, 1)]
    got = check_tree(events, adv, repeats=1)
    chain, tree = got.rows
    # greedy, the same knobs, the same prompt: the recorded rounds again
    assert chain.accepted_length == pytest.approx(rank_shares(events).accepted_length)
    # the rank shares were counted on those rounds: the prediction misses only the end's shortened drafts
    assert chain.predicted_accepted_length == pytest.approx(chain.accepted_length, abs=0.15)
    assert chain.branched == 0 and chain.knobs == {
        "draft_max": 3,
        "draft_p_min": 0.0,
        "align": False,
        "draft_policy": "fixed",
    }
    assert tree.knobs["tree_width"] == 2 and tree.knobs["p_split"] == 0.0 and tree.knobs["draft_max"] == 6
    # p_split 0 splits the root into two every round; the generation's end shortens the last few
    assert tree.branched >= tree.rounds - 2 > 0
    assert 1 + 6 - 1 <= tree.rows_per_round <= 1 + 6
    assert tree.predicted_accepted_length == pytest.approx(adv.runnable.accepted_length)  # type: ignore[union-attr]
    assert got.max_tokens == 60 and got.repeats == 1 and "measured: tree 2x1x1" in got.verdict()


def test_plain_decoding_as_the_best_chain_adds_the_chain_as_deep_as_the_tree(recording):
    _, events = recording
    adv = pinned(events, (), (2, 1))
    assert [s.shape.widths for s in check_shapes(adv)] == [(), (1, 1), (2, 1)]
    got = check_tree(events, adv, repeats=1, max_tokens=12)
    assert got.rows[0].knobs == {} and got.rows[0].rows_per_round == 1.0 and got.rows[0].accepted_length == 1.0
    assert got.max_tokens == 12 and got.rows[0].rounds == 0


def test_no_runnable_tree_is_refused(recording):
    _, events = recording
    adv = dataclasses.replace(pinned(events, (1,), (2, 1)), runnable=None)
    with pytest.raises(RecordingError, match="no tree to check"):
        check_shapes(adv)
    assert Shape((2, 2)).label == "tree 2x2"


def test_cli_prints_the_check_and_its_json(recording, tmp_path, capsys):
    path, _ = recording
    cost = cost_file(tmp_path / "cost.json")
    args = ["advise", str(path), "--tree", "--check", "--verify-cost", cost, "--repeats", "1", "--max-tokens", "20"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "checked on the recording's prompt (20 tokens, median of 1" in out and "measured: tree " in out
    assert main([*args, "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)["tree"]
    check = tree["check"]
    assert check["repeats"] == 1 and check["max_tokens"] == 20 and set(check["load_average"]) == {"before", "after"}
    first, last = check["rows"][0], check["rows"][-1]
    assert all(w == 1 for w in first["widths"]) and last["knobs"]["tree_width"] >= 2
    assert last["widths"] == tree["runnable_tree"]["widths"] and last["rounds_with_branches"] > 0
    assert {"predicted_accepted_length", "accepted_length", "tokens_per_second", "rows_per_round"} <= set(last)


def test_cli_refuses_check_without_tree_and_a_missing_draft(recording, tmp_path, capsys):
    path, events = recording
    assert main(["advise", str(path), "--check"]) == 2
    assert "option --check: only with --tree" in capsys.readouterr().err
    moved = [
        dataclasses.replace(e, draft_model=str(tmp_path / "gone.gguf")) if e.kind == "session_started" else e
        for e in events
    ]
    rec = tmp_path / "moved.jsonl"
    with Recorder(rec) as r:
        for e in moved:
            r(e)
    assert main(["advise", str(rec), "--tree", "--check", "--verify-cost", cost_file(tmp_path / "c.json")]) == 2
    assert "gone.gguf' is not a file here" in capsys.readouterr().err


@pytest.mark.embedded
@pytest.mark.slow
def test_the_advised_tree_runs_on_the_embedded_model(embedded_model_path, tmp_path, capsys):
    from specviz.models.derive import derive_draft

    # a weak draft (layers 0-11): its rank 2 catches the target's pick often enough for trees to be scored
    draft = derive_draft(embedded_model_path, "0-11", tmp_path / "draft-0-11.gguf").path
    rec = tmp_path / "chain.jsonl"
    with Session(embedded_model_path, n_ctx=1024) as s, Recorder(rec) as r:
        s.subscribe(r)
        s.start(
            "Once upon a time, in a village",
            64,
            "draft",
            draft_model=str(draft),
            draft_p_min=0.0,
            draft_max=3,
            align=False,
        )
        s.run()
    assert main(["advise", str(rec), "--tree", "--fresh", "--check", "--repeats", "1", "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)["tree"]
    rows = tree["check"]["rows"]
    last = rows[-1]
    assert last["widths"] == tree["runnable_tree"]["widths"] and last["knobs"]["tree_width"] >= 2
    assert last["rounds_with_branches"] >= last["rounds"] - 2 > 0
    assert last["rows_per_round"] <= 1 + last["knobs"]["draft_max"]
    chain = next(r for r in rows if r["widths"] == [1] * len(last["widths"]))
    assert chain["rounds_with_branches"] == 0 and chain["accepted_length"] >= 1.0
