"""The synthetic tree rounds (issue 56's tree view is tested and shown with them) are what a session publishes: a
well-formed tree, the accepted path a walk down it, the chain fields the kept branch, one target choice per row
read; and a recording of them replays unchanged."""

from __future__ import annotations

from specviz.decoding.draft_tree import ROOT, DraftTree
from specviz.decoding.events import event_from_dict
from specviz.decoding.recorder import Recorder, read_events
from specviz.testing.synthetic import TREE_CHAIN_EVERY, synthetic_tree_rounds


def _by_kind(group: list[dict]) -> dict[str, dict]:
    return {e["kind"]: e for e in group}


def test_each_tree_round_is_a_walk_down_a_well_formed_tree_with_the_kept_branch_as_its_chain():
    groups = synthetic_tree_rounds(12, seed=5, tree_width=3, draft_max=4)
    assert groups[0][0]["kind"] == "session_started" and groups[0][0]["knobs"]["tree_width"] == 3
    assert len(groups) == 13 and groups[-1][-1]["kind"] == "finished"
    fates = set()
    for g in groups[1:]:
        ev = _by_kind(g)
        d, v, a = ev["draft_proposed"], ev["verified"], ev["accepted"]
        if d["round"] % TREE_CHAIN_EVERY == 0:  # a chain round: no tree fields
            assert d["tree"] is None and v["tree_choices"] == [] and a["tree_path"] == [] and d["tokens"]
            continue
        t = d["tree"]
        tree = DraftTree(list(t["tokens"]), list(t["parents"]), list(t["probs"]))
        tree.check()
        assert tree.to_dict() == {k: t[k] for k in ("tokens", "parents", "probs", "depths", "branches")}
        assert len(t["pieces"]) == len(tree) and 1 < tree.width <= 3 and tree.max_depth == 4
        path = a["tree_path"]
        assert path == tree.path(path[-1]) if path else path == []  # a path from the root down
        last = path[-1] if path else ROOT
        kept = tree.branches[tree.branch_through(last)]
        assert d["tokens"] == [tree.tokens[i] for i in kept]  # the chain fields: the kept branch
        assert a["n_accepted"] == len(path) and a["tokens"][:-1] == [tree.tokens[i] for i in path]
        choices = v["tree_choices"]
        assert len(choices) == len(path) + 1  # the pending token's row, then each accepted node's
        assert [c["token"] for c in choices] == a["tokens"]
        final = choices[-1]["token"]
        assert final not in {tree.tokens[c] for c in tree.children(last)}  # the target refused every child there
        assert a["bonus_kind"] == ("bonus" if not tree.children(last) else "correction")
        for c in choices:  # the row's next most probable tokens other than the choice, best first
            assert c["token"] not in [x[0] for x in c["alternatives"]] and len(c["alternatives"]) == 4
            assert [x[2] for x in c["alternatives"]] == sorted((x[2] for x in c["alternatives"]), reverse=True)
        assert v["batch_size"] == len(tree) + 1 and v["kv_peak"] - v["kv_before"] == len(tree) + 1
        if len(path) < len(kept):
            assert ev["rejected"]["depth"] == len(path) and ev["rejected"]["target_token"] == final
        else:
            assert "rejected" not in ev
        read = {ROOT, *path}
        fates |= {
            "accepted" if i in path else "rejected" if p in read else "unreached" for i, p in enumerate(tree.parents)
        }
        assert ev["telemetry"]["data"]["tree"]["max_branches"] >= tree.width
    assert fates == {"accepted", "rejected", "unreached"}
    # the scripted first rounds: a side branch to its leaf, nothing accepted, a stop inside the main line
    first = [_by_kind(g)["accepted"] for g in groups[1:4]]
    assert first[0]["bonus_kind"] == "bonus" and first[1]["tree_path"] == [] and first[2]["bonus_kind"] == "correction"


def test_a_recording_of_tree_rounds_replays_unchanged(tmp_path):
    groups = synthetic_tree_rounds(6, seed=2)
    events = [e for g in groups for e in g]
    path = tmp_path / "tree.jsonl"
    with Recorder(path) as rec:
        for e in events:
            rec(event_from_dict(e))
    assert [e.to_dict() for e in read_events(path)] == events


def test_the_same_seed_gives_the_same_rounds():
    assert synthetic_tree_rounds(5, seed=9) == synthetic_tree_rounds(5, seed=9)
    assert synthetic_tree_rounds(5, seed=9) != synthetic_tree_rounds(5, seed=10)
