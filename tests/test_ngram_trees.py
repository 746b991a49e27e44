"""Draft trees from the n-gram strategies (``tree_width`` > 1): ``ngram-map-k`` / ``ngram-map-k4v`` propose the
key's stored values as a trie, ``ngram-cache`` its followers at each step as branches. Hand-worked trees, the
bookkeeping after a round that followed a non-main branch, properties over random histories, and sessions
whose greedy output is plain greedy while a round follows a non-main branch."""

from __future__ import annotations

import random

import pytest

from specviz import Session
from specviz.decoding.draft_tree import ROOT
from specviz.strategies import strategy_class
from specviz.strategies.ngram_tree import followed, trie_of
from specviz.testing.tiny_models import write_tiny_llama

MapK = strategy_class("ngram-map-k")
MapK4V = strategy_class("ngram-map-k4v")
Cache = strategy_class("ngram-cache")

# key [1, 2] (size_n 2) three times with values A = [10, 11, 12] (at 1 and 13) and B = [20, 21, 22] (at 7); the
# look-up finds the occurrence at 13 (the newest with size_m tokens after it before the end)
TWO_VALUES = [9, 1, 2, 10, 11, 12, 8, 1, 2, 20, 21, 22, 7, 1, 2, 10, 11, 12, 6, 5, 4, 3, 1, 2]
# key [1, 2] four times, once each with A = [10, 11, 12], B = [10, 11, 13], C = [10, 14, 15], D = [20, 21, 22];
# the look-up finds D's occurrence (at 19)
FOUR_VALUES = [9, 1, 2, 10, 11, 12, 8, 1, 2, 10, 11, 13, 7, 1, 2, 10, 14, 15, 6, 1, 2, 20, 21, 22, 5, 4, 3, 3, 3, 1, 2]
# the 4-gram [3, 9, 1, 2] followed by 4 twice and by 5 once
CACHE_HISTORY = [3, 9, 1, 2, 4, 8, 3, 9, 1, 2, 4, 8, 3, 9, 1, 2, 5, 7, 3, 9, 1, 2]


def fresh(cls, history, **knobs):
    d = cls(**knobs)
    d.begin(history)
    return d


def leaf_paths(tree) -> list[list[int]]:
    return [[tree.tokens[i] for i in b] for b in tree.branches]


def check_shape(tree, width: int, n_max: int) -> None:
    tree.check()  # parents before children, no two siblings with one token
    assert 1 < tree.width <= width
    assert len(tree) <= n_max
    for node in [ROOT, *range(len(tree))]:
        kids = [tree.tokens[c] for c in tree.children(node)]
        assert len(set(kids)) == len(kids)


# -- the trie -----------------------------------------------------------------------------------------
def test_trie_shares_prefixes_admits_by_width_and_fills_depth_by_depth():
    paths = [[20, 21, 22], [10, 11, 12], [10, 11, 13], [10, 14, 15], [20, 21]]
    tree, held = trie_of(paths, width=4, max_nodes=16)
    assert leaf_paths(tree) == [[20, 21, 22], [10, 11, 12], [10, 11, 13], [10, 14, 15]]
    assert held == [3, 3, 3, 3, 2]  # the last lies along branch 0: held, no new branch
    tree, held = trie_of(paths, width=3, max_nodes=16)
    assert leaf_paths(tree) == [[20, 21, 22], [10, 11, 12], [10, 11, 13]] and held[3] == 0
    # depth by depth: every admitted path's first token, then every second, until the budget is spent
    tree, held = trie_of(paths, width=4, max_nodes=5)
    assert tree.tokens == [20, 10, 21, 11, 14] and tree.parents == [ROOT, ROOT, 0, 1, 1]
    assert held == [2, 2, 2, 2, 2]
    # a path that extends a leaf adds no branch
    tree, _ = trie_of([[1, 2], [1, 2, 3]], width=1, max_nodes=8)
    assert leaf_paths(tree) == [[1, 2, 3]]


def test_followed_reads_the_whole_accepted_path():
    paths = [[10, 11, 12], [20, 21, 22], [20, 21]]
    assert followed(paths, [20, 21, 99], 2) == [False, True, True]
    assert followed(paths, [10, 99], 1) == [True, False, False]
    assert followed(paths, [99], 0) == [True, True, True]  # every first token refused: each was wholly refused


# -- ngram-map-k / ngram-map-k4v ----------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [MapK, MapK4V])
def test_map_tree_holds_exactly_the_keys_values(cls):
    chain = fresh(cls, TWO_VALUES, size_n=2, size_m=3).draft(TWO_VALUES, 16)
    assert chain.tokens == [10, 11, 12] and chain.tree is None and chain.alternatives is None
    d = fresh(cls, TWO_VALUES, size_n=2, size_m=3, tree_width=3).draft(TWO_VALUES, 16)
    assert d.tokens == [10, 11, 12]  # branch 0 is the chain's draft
    assert d.tree is not None and d.tree.dists is None
    assert d.tree.tokens == [10, 20, 11, 21, 12, 22] and d.tree.parents == [ROOT, ROOT, 0, 1, 2, 3]
    assert leaf_paths(d.tree) == [[10, 11, 12], [20, 21, 22]]
    assert d.alternatives == [[10, 20], [11], [12]]
    check_shape(d.tree, 3, 16)


def test_k4v_tree_drafts_values_no_single_one_dominates():
    # four values counted once each: no chain draft; a tree drafts where the values it holds have twice the
    # count of those it leaves out
    assert fresh(MapK4V, FOUR_VALUES, size_n=2, size_m=3).draft(FOUR_VALUES, 16).reason == "ambiguous"
    narrow = fresh(MapK4V, FOUR_VALUES, size_n=2, size_m=3, tree_width=2).draft(FOUR_VALUES, 16)
    assert narrow.tokens == [] and narrow.reason == "ambiguous"  # two held, two left out
    d = fresh(MapK4V, FOUR_VALUES, size_n=2, size_m=3, tree_width=3).draft(FOUR_VALUES, 16)
    assert leaf_paths(d.tree) == [[20, 21, 22], [10, 11, 12], [10, 11, 13]]  # three held, one left out
    d = fresh(MapK4V, FOUR_VALUES, size_n=2, size_m=3, tree_width=4).draft(FOUR_VALUES, 16)
    assert leaf_paths(d.tree) == [[20, 21, 22], [10, 11, 12], [10, 11, 13], [10, 14, 15]]
    assert d.tokens == [20, 21, 22]
    check_shape(d.tree, 4, 16)
    # the round's limit is the node budget, filled depth by depth
    d = fresh(MapK4V, FOUR_VALUES, size_n=2, size_m=3, tree_width=4).draft(FOUR_VALUES, 5)
    assert d.tree.tokens == [20, 10, 21, 11, 14] and d.tokens == [20, 21]
    check_shape(d.tree, 4, 5)


def test_a_tree_that_does_not_branch_is_a_chain():
    one = [9, 1, 2, 10, 11, 12, 8, 7, 6, 5, 4, 1, 2]  # key [1, 2] once
    d = fresh(MapK4V, one, size_n=2, size_m=3, tree_width=3).draft(one, 16)
    assert d.tokens == [10, 11, 12] and d.tree is None
    assert d.tokens == fresh(MapK4V, one, size_n=2, size_m=3).draft(one, 16).tokens


def _state_values(d) -> list[list[int]]:
    (key,) = d.state()["keys"]
    return key["values"]


def test_k4v_caps_after_a_round_that_followed_a_non_main_branch():
    d = fresh(MapK4V, TWO_VALUES, size_n=2, size_m=3, tree_width=2)
    d.draft(TWO_VALUES, 16)
    # the target took B (branch 1) for two tokens: B's cap is 2, A (the main line, left at the root) keeps 3
    d.accept(2, [*TWO_VALUES, 20, 21, 99])
    assert _state_values(d)[:2] == [[3, 2, 3], [9, 1, 2]]
    # the main line followed one token: A's cap is 1, B keeps its cap
    d = fresh(MapK4V, TWO_VALUES, size_n=2, size_m=3, tree_width=2)
    d.draft(TWO_VALUES, 16)
    d.accept(1, [*TWO_VALUES, 10, 99])
    assert _state_values(d)[:2] == [[3, 2, 1], [9, 1, 3]]
    # each is drafted as far as its cap allows next time
    later = [*TWO_VALUES, 10, 99, 1, 2]
    assert leaf_paths(d.draft(later, 16).tree) == [[10], [20, 21, 22]]


def test_k4v_caps_after_a_tree_round_survive_a_state_round_trip():
    d = fresh(MapK4V, TWO_VALUES, size_n=2, size_m=3, tree_width=2)
    d.draft(TWO_VALUES, 16)
    saved = d.state()
    other = fresh(MapK4V, TWO_VALUES, size_n=2, size_m=3, tree_width=2)
    other.load_state(saved)
    other.accept(2, [*TWO_VALUES, 20, 21, 99])
    assert _state_values(other)[:2] == [[3, 2, 3], [9, 1, 2]]


def test_map_k_key_cap_is_the_kept_branchs_accepted_count():
    d = fresh(MapK, TWO_VALUES, size_n=2, size_m=3, tree_width=2)
    d.draft(TWO_VALUES, 16)
    d.accept(2, [*TWO_VALUES, 20, 21, 99])
    assert _state_values(d)[0][2] == 2  # the key's cap, in value 0 as upstream
    later = [*TWO_VALUES, 20, 21, 99, 1, 2]
    assert leaf_paths(d.draft(later, 16).tree) == [[10, 11], [20, 21]]


@pytest.mark.parametrize("cls", [MapK4V, Cache])
def test_peek_is_the_trees_first_token_and_changes_nothing(cls):
    history = FOUR_VALUES if cls is MapK4V else CACHE_HISTORY
    knobs = {"size_n": 2, "size_m": 3} if cls is MapK4V else {}
    d = fresh(cls, history, tree_width=3, **knobs)
    before = d.state()
    first = d.peek(history)
    assert d.state() == before
    assert first == d.draft(history, 16).tokens[0]


# -- ngram-cache ----------------------------------------------------------------------------------------
def test_cache_tree_branches_to_the_next_most_counted_followers():
    chain = fresh(Cache, CACHE_HISTORY).draft(CACHE_HISTORY, 5)
    assert chain.tokens == [4, 8, 3, 9, 1] and chain.tree is None and chain.alternatives is None
    d = fresh(Cache, CACHE_HISTORY, tree_width=2).draft(CACHE_HISTORY, 5)
    # depth by depth: 4 (the most counted follower) and 5, then 8 after 4 and 7 after 5, then 3 after 4 8
    assert d.tree.tokens == [4, 5, 8, 7, 3] and d.tree.parents == [ROOT, ROOT, 0, 1, 2]
    assert d.tokens == [4, 8, 3] and d.alternatives == [[4, 5], [8], [3]]
    check_shape(d.tree, 2, 5)
    # wider: branch 0 reaches the 4-gram again at depth 7 and splits there (the third branch); the budget of
    # 16 nodes is spent at depth 8 on branch 0's own follower
    d = fresh(Cache, CACHE_HISTORY, tree_width=3).draft(CACHE_HISTORY, 16)
    assert d.tokens == [4, 8, 3, 9, 1, 2, 4, 8]  # n_draft deep
    assert leaf_paths(d.tree) == [
        [4, 8, 3, 9, 1, 2, 4, 8],
        [4, 8, 3, 9, 1, 2, 5],
        [5, 7, 3, 9, 1, 2, 4],
    ]
    assert len(d.tree) == 16
    check_shape(d.tree, 3, 16)


# -- properties over random histories ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ngram-map-k", "ngram-map-k4v", "ngram-cache"])
def test_trees_are_well_formed_and_hold_what_the_drafter_stores(name):
    cls = strategy_class(name)
    rng = random.Random(5)
    n_trees = 0
    for _ in range(60):
        history = [rng.randrange(6) for _ in range(rng.randrange(20, 80))]
        width, n_max = rng.randrange(2, 5), rng.randrange(2, 12)
        knobs = {} if name == "ngram-cache" else {"size_n": 1, "size_m": 4}
        d = fresh(cls, history, tree_width=width, **knobs).draft(history, n_max)
        if d.tree is None:
            continue
        n_trees += 1
        check_shape(d.tree, width, n_max)
        assert d.tokens == leaf_paths(d.tree)[0]
        for path in leaf_paths(d.tree):
            if name == "ngram-cache":  # each step is a follower seen after the tail's last tokens
                seq = history + path
                for i in range(len(history), len(seq)):
                    assert any(seq[j - 1] == seq[i - 1] and seq[j] == seq[i] for j in range(1, len(history)))
            else:  # each branch is a prefix of a value stored for the key: the tokens after one of its occurrences
                key = history[-1:]
                starts = [j + 1 for j in range(len(history) - 1) if history[j : j + 1] == key]
                assert any(history[s : s + len(path)] == path for s in starts)
    assert n_trees >= 5


# -- sessions -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("ngram-trees") / "target.gguf", seed=1, block_scale=0.1)


def _session(target, n_seq_max: int = 3) -> Session:
    return Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=n_seq_max)


def _generate(target, prompt, strategy: str, max_tokens: int, n_seq_max: int = 1, **knobs):
    s = _session(target, n_seq_max)
    events: list = []
    s.subscribe(events.append)
    s.start(prompt, max_tokens=max_tokens, strategy=strategy, **knobs)
    while s.finished is None:
        s.step()
        assert s.ctx.kv_len() == len(s.history) - 1  # in sequence 0 alone, as after a chain round
        assert all(s.ctx.seq_len(q) == 0 for q in range(1, s.ctx.n_seq_max))
    out = list(s.tokens)
    prompt_tokens = list(s.history)[: len(s.history) - len(out)]
    s.close()
    return out, events, prompt_tokens


# the key block K (ids the prompt holds nowhere else), a fake continuation B, a gap G
KEY, FAKE, GAP = [300, 310, 311, 312], [301, 302, 303, 304], [305, 306]


def _two_continuations(target) -> list[int]:
    """A prompt where the key block is followed once by the model's own greedy continuation A and twice by a
    made-up one B, ending with the key block: its drafts hold B as the main line (the more counted, and the
    newest occurrence) and A as a branch, while the target goes on with A. A is found as a fixpoint: the model's
    continuation of the prompt that holds it."""
    _, _, head = _generate(target, "The quick brown fox", "none", 1)
    cont = [0, 0, 0, 0]
    for _ in range(6):
        prompt = [*head, *KEY, *cont, *GAP, *KEY, *FAKE, *GAP, *KEY, *FAKE, *GAP, *KEY]
        out, _, _ = _generate(target, prompt, "none", 4)
        if out == cont:
            return prompt
        cont = out
    raise AssertionError("the model's continuation did not settle")


def _off_main_rounds(events) -> list[int]:
    trees = {e.round: e.tree for e in events if e.kind == "draft_proposed" and e.tree is not None}
    return [
        e.round
        for e in events
        if e.kind == "accepted" and e.tree_path and any(n not in trees[e.round]["branches"][0] for n in e.tree_path)
    ]


@pytest.mark.parametrize(
    "strategy,knobs",
    [
        ("ngram-map-k", {"size_n": 1, "size_m": 4}),
        ("ngram-map-k4v", {"size_n": 1, "size_m": 4}),
        ("ngram-cache", {}),
    ],
)
def test_greedy_tree_is_plain_greedy_and_follows_a_non_main_branch(target, strategy, knobs):
    prompt = _two_continuations(target)
    plain, _, _ = _generate(target, prompt, "none", 24)
    chain, chain_events, _ = _generate(target, prompt, strategy, 24, 3, **knobs)
    tree, events, _ = _generate(target, prompt, strategy, 24, 3, tree_width=3, **knobs)
    assert tree == plain == chain
    assert not any(e.kind == "draft_proposed" and e.tree for e in chain_events)  # tree_width 1: chains
    trees = [e.tree for e in events if e.kind == "draft_proposed" and e.tree is not None]
    assert trees and all(1 < len(t["branches"]) <= 3 for t in trees)
    assert _off_main_rounds(events), "no round followed a branch other than the main line"
    # the first round's tree holds the made-up continuation as branch 0, the model's own as a branch
    first = trees[0]
    paths = [[first["tokens"][i] for i in b] for b in first["branches"]]
    assert paths[0][:4] == FAKE and any(p[:4] == plain[:4] for p in paths[1:])


@pytest.mark.parametrize("strategy,knobs", [("ngram-map-k4v", {"size_n": 1, "size_m": 4}), ("ngram-cache", {})])
def test_sampled_trees_have_no_distributions_and_reproduce_from_their_seed(target, strategy, knobs):
    # no draft distribution: each child is tested by the point-mass rule; one seed, one generation
    prompt = _two_continuations(target)
    runs = []
    for _ in range(2):
        out, events, _ = _generate(target, prompt, strategy, 24, 3, tree_width=3, temperature=0.9, seed=3, **knobs)
        trees = [e.tree for e in events if e.kind == "draft_proposed" and e.tree is not None]
        assert trees and all(all(p is None for p in t["probs"]) for t in trees)
        runs.append(out)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("strategy,knobs", [("ngram-map-k4v", {"size_n": 1, "size_m": 4}), ("ngram-cache", {})])
def test_rewind_after_tree_rounds_continues_as_before(target, strategy, knobs):
    prompt = _two_continuations(target)
    s = _session(target)
    s.start(prompt, max_tokens=24, strategy=strategy, tree_width=3, **knobs)
    while s.finished is None:
        s.step()
    whole = list(s.tokens)
    s.rewind(2)
    assert s.ctx.kv_len() == len(s.history) - 1
    while s.finished is None:
        s.step()
    assert list(s.tokens) == whole
    s.close()
