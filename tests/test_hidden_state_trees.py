"""Draft trees of the hidden-state drafters (``eagle3``, ``mtp``): SGLang's three settings (``tree_topk``,
``tree_depth``, ``tree_nodes``), the head's frontier in sequences of its context, lossless verification.

The tree growth is checked against a plain re-statement of SGLang's rule on a fake head whose logits depend on
the path a row was decoded on (so a wrong sequence or a wrong parent state shows); the drafters on tiny real
pairs: an EAGLE-3 head that can only say A or B before a target that alternates them (a tree of top-2 holds the
target's choice at every node, so rounds accept along branches other than the head's main line), and the tiny
NextN model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from stat_helpers import chi2_critical
from test_session import plain_reference

from specviz import Session
from specviz.backends import LlamaContext
from specviz.decoding.draft_tree import ROOT
from specviz.decoding.rowscan import ScoredRow
from specviz.decoding.sampling import SamplingParams, probs_from_logits
from specviz.errors import KnobError
from specviz.models.eagle3_gguf import Eagle3HeadConfig, random_eagle3_weights, write_eagle3_head
from specviz.strategies.hidden_state_tree import Expander, TreeSettings, grow_tree
from specviz.strategies.knobs import hidden_tree_width, tree_width_of
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama, write_tiny_nextn

A, B = 300, 301
V = 12  # the fake head's vocabulary


# -- the growth rule on a fake head ---------------------------------------------------------------------------


def _fake_logits(path: tuple[int, ...], salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([salt, len(path), *path])
    return (rng.standard_normal(V) * 2.0).astype(np.float32)


def _state(path: tuple[int, ...]) -> np.ndarray:
    out = np.full(8, -1.0, dtype=np.float32)
    out[: len(path)] = path[:8]
    return out


class FakeHead:
    """A head context whose sequences hold token paths: a row's logits are a function of its sequence's path,
    and decode_nodes checks each pair's state is its parent's (the path before it) at the next position."""

    def __init__(self, n_seq: int, pos: int) -> None:
        self.n_seq, self.pos = n_seq, pos
        self.paths: dict[int, tuple[int, ...]] = {0: ()}
        self.out: list[tuple[int, ...]] = [()]  # row 0: the root's pair, just decoded
        self.decodes = 0

    def logits(self, i: int) -> np.ndarray:
        return _fake_logits(self.out[i])

    def prenorm(self, i: int) -> np.ndarray:
        return _state(self.out[i])

    def copy_sequence(self, src: int, dst: int) -> None:
        self.paths[dst] = self.paths[src]

    def decode_nodes(self, tokens, rows, position, seqs) -> None:
        assert len(set(seqs)) == len(seqs) <= self.n_seq
        self.out = []
        for t, r, s in zip(tokens, rows, seqs):
            path = self.paths[s]
            assert position == self.pos + len(path) + 1  # the node's pair follows its parent's
            assert np.array_equal(r, _state(path))  # fed its parent's state
            self.paths[s] = path + (int(t),)
            self.out.append(self.paths[s])
        self.decodes += 1


def _sglang_tree(topk: int, depth: int, nodes: int, p_min: float) -> set[tuple[int, ...]]:
    """SGLang's rule restated: each level expands the top-k of the one before by cumulative probability, the tree
    is the best ``nodes`` of every candidate (the shallower, then the earlier made, first among equals)."""
    cands: list[tuple[tuple[int, ...], float]] = []

    def expand(path: tuple[int, ...], score: float) -> list[int]:
        ranked = ScoredRow(_fake_logits(path)).top(topk)
        if ranked[0][1] < p_min:
            return []
        for t, p in ranked:
            cands.append((path + (int(t),), score * p))
        return list(range(len(cands) - len(ranked), len(cands)))

    level = expand((), 1.0)
    for _ in range(2, depth + 1):
        front = sorted(level, key=lambda c: (-cands[c][1], c))[:topk]
        level = [k for c in front for k in expand(*cands[c])]
    order = sorted(range(len(cands)), key=lambda c: (-cands[c][1], len(cands[c][0]), c))
    return {cands[c][0] for c in order[:nodes]}


def _paths(tree) -> set[tuple[int, ...]]:
    return {tuple(tree.tokens[i] for i in tree.path(n)) for n in range(len(tree))}


@pytest.mark.parametrize(
    "topk,depth,nodes,p_min",
    [(4, 5, 8, 0.0), (2, 4, 6, 0.0), (3, 6, 20, 0.0), (4, 3, 30, 0.0), (3, 5, 10, 0.3), (4, 5, 1, 0.0), (8, 4, 2, 0.0)],
)
def test_a_greedy_tree_is_sglangs_best_nodes_of_the_top_k_expansion(topk, depth, nodes, p_min):
    head = FakeHead(topk, pos=7)
    params = SamplingParams(temperature=0.0)
    got = grow_tree(
        head, 7, TreeSettings(topk, depth, nodes, p_min), Expander(params, np.random.default_rng(0), None, V)
    )
    tree = got.tree
    assert tree is not None
    tree.check()
    assert _paths(tree) == _sglang_tree(topk, depth, nodes, p_min)
    assert len(tree) <= nodes and tree.max_depth <= depth
    assert all(len(tree.children(n)) <= topk for n in [ROOT, *range(len(tree))])
    assert tree.width <= hidden_tree_width(topk, depth, nodes)
    main = tree.branches[0]
    assert main == list(range(len(main)))  # branch 0 numbered first: its verify rows are a chain's
    for n in main:  # the main line is the head's greedy choice at every node
        parent = tree.parents[n]
        path = () if parent == ROOT else tuple(tree.tokens[i] for i in tree.path(parent))
        assert tree.tokens[n] == int(np.argmax(_fake_logits(path)))
    assert got.decoded <= topk * (depth - 1)


def test_a_sampled_tree_keeps_every_draw_and_its_q_within_the_budget():
    head = FakeHead(3, pos=0)
    params = SamplingParams(temperature=1.5)
    got = grow_tree(head, 0, TreeSettings(3, 4, 7, 0.0), Expander(params, np.random.default_rng(5), None, V))
    tree = got.tree
    assert tree is not None and tree.dists is not None and len(tree) <= 7
    for n in [ROOT, *range(len(tree))]:
        kids = tree.children(n)
        assert (n in tree.dists) == bool(kids)
        for k in kids:  # each child's probability is its q at the parent
            assert tree.probs[k] == pytest.approx(tree.dists[n].prob(tree.tokens[k]))


def test_tree_widths_bound_the_target_sequences():
    assert hidden_tree_width(1, 5, 8) == 1
    assert hidden_tree_width(4, 5, 8) == 8
    assert hidden_tree_width(2, 1, 8) == 2
    assert hidden_tree_width(2, 3, 100) == 4 + 2
    assert tree_width_of({"tree_width": 3}) == (3, "tree_width")
    assert tree_width_of({"tree_topk": 4, "tree_depth": 5, "tree_nodes": 8}) == (8, "tree_topk")


# -- EAGLE-3 on a tiny pair -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ab_pair(tmp_path_factory):
    """(target, head): the target alternates A and B; the head's vocabulary is A and B alone (d2t), so its top 2
    at every node are both, one of them the target's choice."""
    d = tmp_path_factory.mktemp("ab")
    w = tiny_weights(seed=3, n_layer=4, block_scale=0.05)
    e = w["token_embd.weight"]
    u = (e[B] - e[A]).astype(np.float32)
    out = np.zeros_like(w["output.weight"])
    out[A], out[B] = u, -u
    w["output.weight"] = out
    target = write_tiny_llama(d / "target.gguf", n_layer=4, layers_from=w)
    cfg = Eagle3HeadConfig(
        n_embd=64,
        n_head=4,
        n_head_kv=2,
        n_ff=128,
        target_hidden=64,
        target_layers=(1, 2, 3),
        d2t=(A, B),
        n_vocab=320,
        rms_eps=1e-5,
    )
    head = write_eagle3_head(d / "head.gguf", target, cfg, random_eagle3_weights(cfg, seed=4))
    return target, head


def _tree_knobs(head, **extra):
    return {"draft_model": str(head), "draft_p_min": 0.0, "draft_max": 8, "tree_topk": 2, **extra}


def _run_checked(s: Session, pairs_behind: int) -> dict:
    """Step to the end checking both caches after every round; count the tree rounds and those whose accepted
    path left branch 0."""
    seen = {"tree_rounds": 0, "off_main": 0, "accepted_in_trees": 0}
    while s.finished is None:
        rnd = s.step()
        assert s.kv_length == s.committed
        assert s.drafter.kv_length() == len(s.history) - pairs_behind
        d = rnd.of_kind("draft_proposed")[0]
        acc = rnd.of_kind("accepted")
        if d.tree is not None:
            seen["tree_rounds"] += 1
            path = acc[0].tree_path if acc else []
            seen["accepted_in_trees"] += len(path)
            seen["off_main"] += any(n >= len(d.tree["branches"][0]) for n in path)
            assert len(d.tree["tokens"]) <= 6 and max(d.tree["depths"]) <= 4
    return seen


@pytest.mark.slow
def test_greedy_eagle3_tree_equals_plain_greedy_and_accepts_off_the_main_line(ab_pair):
    target, head = ab_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=8)
    prompt = [1, 50, 60, 70, 80, 90, 100]
    ref = plain_reference(s.model, prompt, 60)
    s.start(prompt, 60, "eagle3", **_tree_knobs(head, tree_depth=4, tree_nodes=6))
    seen = _run_checked(s, pairs_behind=2)
    assert s.tokens == ref
    assert seen["tree_rounds"] > 0 and seen["off_main"] > 0
    t = s.telemetry_dict()
    assert t["tree"]["rounds_with_branches"] == seen["tree_rounds"] and t["catch_up_tokens"] == 0
    # the same generation as a chain: the tree accepts at least as much per round here (the head's choice
    # is right or its sibling is)
    s.start(prompt, 60, "eagle3", **_tree_knobs(head, tree_topk=1, draft_max=4))
    s.run()
    assert s.tokens == ref
    assert t["accepted"] / t["rounds"] > s.telemetry_dict()["accepted"] / s.telemetry_dict()["rounds"]
    s.close()


@pytest.mark.slow
def test_sampled_eagle3_trees_are_seeded_and_keep_the_drafter_in_step(ab_pair):
    target, head = ab_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=8)
    runs = []
    for _ in range(2):
        s.start([1, 50, 60, A], 40, "eagle3", temperature=1.5, seed=9, **_tree_knobs(head, tree_depth=3, tree_nodes=6))
        seen = _run_checked(s, pairs_behind=2)
        runs.append(list(s.tokens))
    assert runs[0] == runs[1] and seen["tree_rounds"] > 0
    s.close()


@pytest.mark.slow
def test_first_token_distribution_with_an_eagle3_tree_matches_the_target(ab_pair):
    """Lossless sampling through the tree: the first generated token follows the target's distribution (the
    root's children are distinct draws from q, accepted by the multi-draft rule)."""
    target, head = ab_pair
    s = Session(target, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1, n_seq_max=8)
    params = SamplingParams(temperature=3.0)
    prompt = [1, 50, 60, A, B, A]
    ctx = LlamaContext(s.model, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    ctx.eval(prompt, 0, rows="last")
    p = probs_from_logits(ctx.row(len(prompt) - 1), params).to_dense()
    ctx.close()
    n = 800
    counts = np.zeros(s.model.n_vocab)
    trees = 0
    for i in range(n):
        s.start(prompt, 5, "eagle3", temperature=3.0, seed=2000 + i, **_tree_knobs(head, tree_depth=2, tree_nodes=3))
        rnd = s.step()
        counts[s.tokens[0]] += 1
        trees += rnd.of_kind("draft_proposed")[0].tree is not None
    assert trees > n // 4  # the root had two distinct children often
    keep = p > 0
    assert counts[~keep].sum() == 0
    stat = float(((counts[keep] - p[keep] * n) ** 2 / (p[keep] * n)).sum())
    assert stat < chi2_critical(int(keep.sum()) - 1), stat
    s.close()


def test_a_tree_without_the_target_sequences_is_refused_by_its_knob(ab_pair):
    target, head = ab_pair
    s = Session(target, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    with pytest.raises(KnobError) as e:
        s.start([1, 50], 5, "eagle3", **_tree_knobs(head))
    assert e.value.knob == "tree_topk" and "n_seq_max=" in str(e.value)
    s.close()


# -- MTP on the tiny NextN model ------------------------------------------------------------------------------


@pytest.mark.slow
def test_greedy_mtp_tree_equals_plain_greedy(tmp_path):
    path = write_tiny_nextn(tmp_path / "nextn.gguf", seed=1, block_scale=0.05, binary=(A, B))
    s = Session(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=8)
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(s.model, prompt, 60)
    s.start(prompt, 60, "mtp", draft_p_min=0.0, draft_max=8, tree_topk=2, tree_depth=4, tree_nodes=6)
    seen = _run_checked(s, pairs_behind=1)  # MTP pairs sit one position later than EAGLE-3's
    assert s.tokens == ref
    assert seen["tree_rounds"] > 0 and seen["accepted_in_trees"] > 0
    s.start(prompt, 30, "mtp", draft_p_min=0.0, tree_topk=2, tree_depth=4, tree_nodes=6, temperature=0.9, seed=4)
    _run_checked(s, pairs_behind=1)
    s.close()


# -- block drafters ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["dflash", "dspark"])
def test_block_drafters_refuse_a_tree_by_its_knob_and_nothing_changes(tiny_session, strategy):
    tiny_session.start([1, 50, 60], 5, "none")
    before = list(tiny_session.history)
    with pytest.raises(KnobError) as e:
        tiny_session.start([1, 50], 5, strategy, tree_topk=2)
    assert e.value.knob == "tree_topk" and "in parallel" in str(e.value)
    with pytest.raises(KnobError) as e:
        tiny_session.configure(strategy, tree_topk=3)
    assert e.value.knob == "tree_topk"
    assert tiny_session.history == before and tiny_session.strategy == "none"


# -- the command line ----------------------------------------------------------------------------------------


def test_the_tree_knobs_are_flags_and_open_the_targets_sequences():
    import argparse

    from specviz.cli.generation_options import add_generation_options, tree_sequences
    from specviz.cli.options import UsageError

    p = argparse.ArgumentParser()
    add_generation_options(p, strategy_default=None)
    args = p.parse_args(["--tree-topk", "4", "--speculative-num-steps", "3", "--tree-nodes", "6"])
    assert (args.knob_tree_topk, args.knob_tree_depth, args.knob_tree_nodes) == ("4", "3", "6")
    knobs = {"tree_topk": 4, "tree_depth": 3, "tree_nodes": 6}
    assert tree_sequences(knobs, {"n_parallel": 1}) == {"n_seq_max": 6}
    assert tree_sequences({"tree_topk": 1}, {"n_parallel": 1}) == {}
    with pytest.raises(UsageError, match="--tree-topk 4 with -np 2"):
        tree_sequences(knobs, {"n_parallel": 2})


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_snapshot_after_tree_rounds_restores_the_head_on_the_kept_branch(ab_pair, temperature):
    target, head = ab_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=8)
    s.start([1, 50, 60, 70], 50, "eagle3", temperature=temperature, seed=3, **_tree_knobs(head, tree_nodes=6))
    s.run(max_rounds=5)
    assert s.telemetry_dict()["tree"]["rounds_with_branches"] > 0
    blob = s.snapshot()
    kv_head = s.drafter.kv_length()
    s.run()
    original = list(s.tokens)
    r = Session.restore(blob, model=s.model, n_threads=1)
    assert r.drafter.kv_length() == kv_head == len(r.history) - 2 and r.kv_length == r.committed
    assert r.telemetry_dict()["catch_up_tokens"] == 0  # restored, not re-read
    r.run()
    assert r.tokens == original
    r.close()
    s.close()


@pytest.mark.slow
def test_rewinding_into_tree_rounds_and_going_on_stays_exact(ab_pair):
    target, head = ab_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=8)
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(s.model, prompt, 50)
    s.start(prompt, 50, "eagle3", **_tree_knobs(head, tree_depth=4, tree_nodes=6))
    s.run(max_rounds=8)
    s.rewind(3)  # the drafter is rebuilt there and catches up from the target at its first draft
    assert s.kv_length == s.committed
    seen = _run_checked(s, pairs_behind=2)
    assert s.tokens == ref and seen["tree_rounds"] > 0
    s.close()


def test_a_committed_path_the_tree_does_not_hold_makes_the_drafter_catch_up_exactly(ab_pair):
    """Never after a round that verified the tree; should the rows be unknown, the drafter re-reads the target."""
    target, head = ab_pair
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=8)
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(s.model, prompt, 30)
    s.start(prompt, 30, "eagle3", **_tree_knobs(head, tree_depth=4, tree_nodes=6))
    s.run(max_rounds=3)
    drafter = s.drafter
    drafter._committed_rows = lambda history, l_old, n: []  # one round's path not found in its tree
    s.step()
    del drafter._committed_rows
    seen = _run_checked(s, pairs_behind=2)
    assert s.tokens == ref and seen["tree_rounds"] > 0
    assert s.telemetry_dict()["catch_up_tokens"] > 0
    s.close()


@pytest.mark.slow
def test_specviz_run_drafts_eagle3_trees_from_the_tree_flags(ab_pair):
    from test_cli import run_cli

    target, head = ab_pair
    common = ["run", "--model", str(target), "--prompt", "the cat", "--max-tokens", "30"]
    plain = run_cli(*common, "--strategy", "none", "--json")
    assert plain.returncode == 0, plain.stderr
    flags = ["--strategy", "eagle3", "-md", str(head), "--draft-p-min", "0", "--speculative-eagle-topk", "2"]
    p = run_cli(*common, *flags, "--tree-depth", "4", "--tree-nodes", "6")
    assert p.returncode == 0, p.stderr
    assert "tree: " in p.stderr and "rounds branched" in p.stderr
    q = run_cli(*common, *flags, "--json")
    assert q.returncode == 0, q.stderr
    out = json.loads(q.stdout)
    assert out["tokens"] == json.loads(plain.stdout)["tokens"] and out["telemetry"]["tree"]["rounds_with_branches"] > 0
