"""Draft trees in a session: a draft model branching (``tree_width``, ``p_split``), every branch verified in one
target batch, the kept branch back in sequence 0, and greedy output equal to plain greedy."""

from __future__ import annotations

import pytest

from specviz import Session
from specviz.errors import ContextSettingsError, KnobError
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama

TINY = {"seed": 1, "block_scale": 0.1}  # the shared tiny fixture model's parameters (conftest.TINY)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The shared tiny target and a one-layer draft cut from it (they agree often, not always)."""
    d = tmp_path_factory.mktemp("tree")
    target = write_tiny_llama(d / "target.gguf", **TINY)
    draft = write_tiny_llama(d / "draft.gguf", n_layer=1, layers_from=tiny_weights(**TINY))
    return target, draft


def _session(target, n_seq_max: int = 4) -> Session:
    return Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=n_seq_max)


def _run(s: Session, draft, **knobs) -> tuple[list[int], list]:
    events: list = []
    s.subscribe(events.append)
    s.start("The quick brown fox", max_tokens=40, strategy="draft", draft_model=str(draft), draft_p_min=0.0, **knobs)
    while s.finished is None:
        s.step()
        # after every round the cache holds the history but the pending token, in sequence 0 alone
        assert s.ctx.kv_len() == len(s.history) - 1
        assert all(s.ctx.seq_len(q) == 0 for q in range(1, s.ctx.n_seq_max))
    return list(s.tokens), events


def _plain(target) -> list[int]:
    s = _session(target, 1)
    s.start("The quick brown fox", max_tokens=40, strategy="none")
    while s.finished is None:
        s.step()
    out = list(s.tokens)
    s.close()
    return out


def test_greedy_tree_equals_plain_greedy_and_branches(pair):
    target, draft = pair
    s = _session(target)
    got, events = _run(s, draft, tree_width=3, p_split=0.0, draft_max=6)
    s.close()
    assert got == _plain(target)
    trees = [e for e in events if e.kind == "draft_proposed" and e.tree is not None]
    assert trees, "no round drafted a tree"
    assert max(len(e.tree["branches"]) for e in trees) == 3
    paths = [e.tree_path for e in events if e.kind == "accepted" and e.tree_path]
    # the target followed a branch other than the drafter's main line at least once: the tree earned a token
    tree_of = {e.round: e.tree for e in trees}
    off_main = [
        e
        for e in events
        if e.kind == "accepted" and e.tree_path and any(n not in tree_of[e.round]["branches"][0] for n in e.tree_path)
    ]
    assert paths and off_main
    verified = [e for e in events if e.kind == "verified" and e.tree_choices]
    assert verified and all(len(e.tree_choices) >= 1 for e in verified)


def test_a_tree_that_never_splits_drafts_the_chain(pair):
    target, draft = pair
    a = _session(target)
    chain, chain_events = _run(a, draft, tree_width=1, draft_max=6)
    a.close()
    b = _session(target)
    tree, tree_events = _run(b, draft, tree_width=3, p_split=1.0, draft_max=6)
    b.close()
    assert tree == chain
    assert not any(e.kind == "draft_proposed" and e.tree for e in tree_events)
    drafted = [e.tokens for e in chain_events if e.kind == "draft_proposed"]
    assert drafted == [e.tokens for e in tree_events if e.kind == "draft_proposed"]


def test_sampled_tree_is_reproducible_from_its_seed(pair):
    target, draft = pair
    out = []
    for _ in range(2):
        s = _session(target)
        got, events = _run(s, draft, tree_width=3, p_split=0.0, draft_max=6, temperature=0.9, seed=7)
        s.close()
        out.append(got)
        assert any(e.kind == "draft_proposed" and e.tree for e in events)
    assert out[0] == out[1]


def test_rewind_after_tree_rounds_continues_as_before(pair):
    target, draft = pair
    s = _session(target)
    whole, _ = _run(s, draft, tree_width=3, p_split=0.0, draft_max=6)
    s.rewind(2)
    assert s.ctx.kv_len() == len(s.history) - 1
    while s.finished is None:
        s.step()
    assert list(s.tokens) == whole
    s.close()


def test_a_tree_wider_than_the_contexts_sequences_is_refused(pair):
    target, draft = pair
    s = _session(target, 2)
    with pytest.raises(KnobError, match="n_seq_max=3"):
        s.start("x", strategy="draft", draft_model=str(draft), tree_width=3)
    s.start("x", max_tokens=2, strategy="draft", draft_model=str(draft), tree_width=2)  # still usable
    s.close()


def test_bad_sequence_counts_are_refused_before_the_model_loads():
    with pytest.raises(ContextSettingsError, match="n_seq_max"):
        Session("/no/such/model.gguf", n_seq_max=0)


def test_tree_knobs_are_checked(pair):
    target, draft = pair
    s = _session(target)
    for bad in ({"tree_width": 0}, {"tree_width": 17}, {"p_split": 1.5}):
        with pytest.raises(KnobError):
            s.start("x", strategy="draft", draft_model=str(draft), **bad)
    s.close()


@pytest.mark.slow
def test_cli_tree_width_opens_the_sequences_and_reports_the_tree(pair):
    import json

    from test_cli import run_cli

    target, draft = pair
    common = ("run", "--model", str(target), "--prompt", "The quick brown fox", "--max-tokens", "30")
    plain = run_cli(*common, "--strategy", "none", "--json")
    tree = run_cli(
        *common,
        "--strategy",
        "draft",
        "--draft-model",
        str(draft),
        "--draft-p-min",
        "0",
        "--tree-width",
        "3",
        "--spec-draft-p-split",
        "0",
        "--json",
    )
    assert plain.returncode == 0 and tree.returncode == 0, tree.stderr
    got = json.loads(tree.stdout)
    assert got["tokens"] == json.loads(plain.stdout)["tokens"]
    assert got["telemetry"]["tree"]["rounds_with_branches"] > 0
    assert got["telemetry"]["tree"]["max_branches"] == 3
    people = run_cli(
        *common,
        "--strategy",
        "draft",
        "--draft-model",
        str(draft),
        "--tree-width",
        "3",
        "--draft-p-min",
        "0",
        "--spec-draft-p-split",
        "0",
    )
    assert people.returncode == 0 and "tree: " in people.stderr and "branched" in people.stderr


@pytest.mark.slow
def test_cli_refuses_a_tree_in_a_batched_run_and_bad_widths(pair):
    from test_cli import run_cli

    target, draft = pair
    common = ("run", "--model", str(target), "--prompt", "x", "--strategy", "draft", "--draft-model", str(draft))
    batched = run_cli(*common, "--tree-width", "3", "-np", "2")
    assert batched.returncode == 2 and "--tree-width 3 with -np 2" in batched.stderr
    lookup = run_cli("run", "--model", str(target), "--prompt", "x", "--strategy", "prompt-lookup", "--tree-width", "3")
    assert lookup.returncode == 2 and "cannot draft a tree" in lookup.stderr and "draft" in lookup.stderr
    zero = run_cli(*common, "--tree-width", "0")
    assert zero.returncode == 2 and "tree_width" in zero.stderr.replace("-", "_")


def test_memory_that_cannot_hold_a_tree_is_refused_by_name(tmp_path, pair):
    from specviz.testing.memory_models import write_tiny_mamba

    mamba = write_tiny_mamba(tmp_path / "mamba.gguf")
    with pytest.raises(ContextSettingsError, match="draft tree"):
        Session(mamba, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_seq_max=3)
    s = Session(mamba, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    with pytest.raises(KnobError, match="no draft tree here"):
        s.start("x", strategy="draft", draft_model=str(pair[1]), tree_width=2)
    s.close()


def _first_rounds(target, draft, n: int) -> Session:
    s = _session(target)
    s.start(
        "The quick brown fox",
        max_tokens=40,
        strategy="draft",
        draft_model=str(draft),
        draft_p_min=0.0,
        tree_width=3,
        p_split=0.0,
        draft_max=6,
    )
    for _ in range(n):
        s.step()
    return s


def _finish(s: Session) -> list[int]:
    while s.finished is None:
        s.step()
    return list(s.tokens)


def test_fork_and_snapshot_after_tree_rounds_continue_as_the_original(pair):
    target, draft = pair
    s = _first_rounds(target, draft, 3)
    assert s.telemetry_dict()["tree"]["rounds_with_branches"] > 0
    blob = s.snapshot()
    b = s.fork()
    whole = _finish(s)
    assert _finish(b) == whole
    b.close()
    r = Session.restore(blob, target)
    assert r.ctx.n_seq_max == s.ctx.n_seq_max  # the restored target holds the tree's sequences again
    assert _finish(r) == whole
    assert r.telemetry_dict()["tree"] == s.telemetry_dict()["tree"]  # the same rounds, counted alike
    r.close()
    s.close()
