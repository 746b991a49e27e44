"""The replay of a speculative greedy run (specviz/analysis/replay.py) and the equivalence check's use of it:
a flip that the verify batches' own numerics make is ``numerics`` however wide its margin, a round that
decided a row wrong is ``mismatch`` and the replay names it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specviz.analysis.equivalence import check_equivalence
from specviz.analysis.replay import first_max, replay_greedy
from specviz.decoding.round import RoundResult

PROMPT = "the a of the a of the cat"
KNOBS = {"max_ngram": 2, "min_ngram": 1, "draft_max": 4, "draft_min": 0}


def _run(session, strategy="prompt-lookup", knobs=KNOBS, n=40) -> tuple[list[int], list[RoundResult]]:
    session.start(PROMPT, n, strategy, **knobs)
    rounds: list[RoundResult] = []
    while session.finished is None:
        session.step()
        if session.generation.last_result is not None and (
            not rounds or rounds[-1] is not session.generation.last_result
        ):
            rounds.append(session.generation.last_result)
    return list(session.prompt_tokens), rounds


def test_first_max_is_the_first_maximum_with_nan_as_minus_infinity():
    assert first_max(np.array([1.0, 3.0, 3.0, 2.0], dtype=np.float32)) == 1
    assert first_max(np.array([np.nan, 0.5, np.nan, 0.5], dtype=np.float32)) == 1


@pytest.mark.parametrize("strategy", ["prompt-lookup", "ngram-simple", "ngram-cache"])
def test_a_correct_run_replays_token_for_token(tiny_session, strategy):
    knobs = {"prompt-lookup": KNOBS, "ngram-simple": {"size_n": 2, "size_m": 4, "draft_max": 4}}.get(
        strategy, {"draft_max": 4}
    )
    prompt, rounds = _run(tiny_session, strategy, knobs)
    assert sum(len(r.draft) for r in rounds) > 0  # the run drafted, so its batches had several rows
    got = replay_greedy(tiny_session.ctx, prompt, rounds, prefill=tiny_session.prefill, upto=10**6)
    assert got.reproduced and got.tokens == len(tiny_session.tokens)
    assert tiny_session.ctx.kv_len() == len(prompt) + got.tokens - 1  # the cache holds the replayed history


def test_a_committed_token_the_rule_does_not_give_is_named(tiny_session):
    prompt, rounds = _run(tiny_session)
    k = next(i for i, r in enumerate(rounds) if len(r.committed) >= 2)
    r = rounds[k]
    wrong = (r.committed[1] + 1) % tiny_session.model.n_vocab
    rounds[k] = dataclasses.replace(r, committed=[r.committed[0], wrong, *r.committed[2:]])
    got = replay_greedy(tiny_session.ctx, prompt, rounds, prefill=tiny_session.prefill, upto=10**6)
    assert not got.reproduced
    assert (got.round, got.row, got.expected, got.committed) == (r.index, 1, r.committed[1], wrong)
    assert got.tokens == sum(len(x.committed) for x in rounds[:k]) + 1


def test_a_round_that_commits_less_than_the_rule_is_named(tiny_session):
    prompt, rounds = _run(tiny_session)
    k = next(i for i, r in enumerate(rounds) if len(r.committed) >= 2 and r.finish is None)
    r = rounds[k]
    rounds[k] = dataclasses.replace(r, committed=r.committed[:1])  # dropped an accepted token
    got = replay_greedy(tiny_session.ctx, prompt, rounds, prefill=tiny_session.prefill, upto=10**6)
    assert not got.reproduced
    assert (got.round, got.row, got.expected, got.committed) == (r.index, 1, r.committed[1], None)


def test_nothing_may_follow_a_correction(tiny_session):
    """A round whose row refused its draft token commits the correction and stops there."""
    prompt, rounds = _run(tiny_session)
    k = next(i for i, r in enumerate(rounds) if r.draft and r.n_accepted < len(r.draft))
    r = rounds[k]
    j = r.n_accepted  # the refusing row: committed[j] is the correction
    rounds[k] = dataclasses.replace(r, committed=[*r.committed, r.draft[j]])
    got = replay_greedy(tiny_session.ctx, prompt, rounds, prefill=tiny_session.prefill, upto=10**6)
    assert not got.reproduced
    assert (got.round, got.row, got.expected, got.committed) == (r.index, j + 1, None, r.draft[j])


def test_nothing_may_follow_the_bonus(tiny_session):
    """A round without a draft reads one row: it commits that row's token and nothing more."""
    prompt, rounds = _run(tiny_session)
    k = next(i for i, r in enumerate(rounds) if not r.draft)
    r = rounds[k]
    rounds[k] = dataclasses.replace(r, committed=[*r.committed, r.committed[-1]])
    got = replay_greedy(tiny_session.ctx, prompt, rounds, prefill=tiny_session.prefill, upto=10**6)
    assert not got.reproduced
    assert (got.round, got.row, got.expected, got.committed) == (r.index, 1, None, r.committed[-1])


def test_the_replay_stops_after_the_asked_token(tiny_session):
    prompt, rounds = _run(tiny_session)
    bad = dataclasses.replace(rounds[-1], committed=[(t + 1) % 320 for t in rounds[-1].committed])
    got = replay_greedy(tiny_session.ctx, prompt, [*rounds[:-1], bad], prefill=tiny_session.prefill, upto=3)
    assert got.reproduced and 3 < got.tokens < len(tiny_session.tokens)


@pytest.fixture()
def batch_dependent(tiny_session, monkeypatch):
    """The tiny model made batch-dependent, as llama.cpp's CPU kernels are: in a batch of more than one
    token every row's runner-up gains 2 logits over its best, so a verify batch picks the token a
    one-token decode ranks second, with a wide margin. Rows are read through ``ctx.row`` (the kernel's
    direct read is off) so that every reader sees the same logits."""
    ctx = tiny_session.ctx
    real_eval, real_row = ctx.eval, ctx.row
    size = {"n": 1}

    def evaluate(tokens, start, rows="all"):
        size["n"] = len(tokens)
        return real_eval(tokens, start, rows)

    def row(i):
        x = np.array(real_row(i))
        if size["n"] > 1:
            a, b = np.argsort(-x, kind="stable")[:2]
            x[b] = x[a] + 2.0
        return x

    monkeypatch.setattr(ctx, "eval", evaluate)
    monkeypatch.setattr(ctx, "row", row)
    monkeypatch.setattr(ctx, "native_rows", lambda: None)
    return tiny_session


def test_a_wide_flip_made_by_the_batches_is_numerics(batch_dependent):
    res = check_equivalence(batch_dependent, PROMPT, 40, "prompt-lookup", KNOBS)
    d = res["divergence"]
    assert res["verdict"] == "numerics", res
    assert d["speculative_margin"] == pytest.approx(2.0, abs=1e-4)  # far above the old 0.5 bound
    assert set(d["plain_top_two"]) == set(d["speculative_top_two"]) == {d["plain_token"], d["speculative_token"]}
    assert res["replay"]["reproduced"] and res["replay"]["tokens"] > d["index"]
    # the old rule (a near tie in both runs) would have called it a bug; a threshold still can
    strict = check_equivalence(batch_dependent, PROMPT, 40, "prompt-lookup", KNOBS, threshold=0.5)
    assert strict["verdict"] == "mismatch" and strict["replay"] is None


def test_a_wrong_acceptor_is_a_mismatch_even_where_the_batches_flip_tokens(batch_dependent, monkeypatch):
    """The same batch-dependent model with an acceptor that commits one refused draft token: the replay
    decides that row by the rule and names the round."""
    from specviz.decoding import round as round_mod

    orig = round_mod.accept

    def broken(draft, rows, params, rng, draft_dists=None, **kw):
        v = orig(draft, rows, params, rng, draft_dists, **kw)
        n = v.n_accepted
        if draft and n < len(draft):
            tokens = (*draft[: n + 1], first_max(rows(n + 1)))
            return dataclasses.replace(v, n_accepted=n + 1, tokens=tokens, probs=(*v.probs, 1.0))
        return v

    monkeypatch.setattr(round_mod, "accept", broken)
    res = check_equivalence(batch_dependent, PROMPT, 40, "prompt-lookup", KNOBS)
    assert res["verdict"] == "mismatch", res


def test_a_correction_that_takes_the_runner_up_is_found_by_the_replay(tiny_session, monkeypatch):
    """An acceptor that commits a refusing row's second-best token: both runs then part between the same
    two tokens, which the margins alone would call numerics near a tie; the replay finds the round."""
    from specviz.decoding import round as round_mod

    orig = round_mod.accept

    def runner_up(draft, rows, params, rng, draft_dists=None, **kw):
        v = orig(draft, rows, params, rng, draft_dists, **kw)
        if v.bonus:
            return v
        x = np.asarray(rows(v.n_accepted))
        second = int(np.argsort(-x, kind="stable")[1])
        return dataclasses.replace(v, tokens=(*v.tokens[:-1], second))

    monkeypatch.setattr(round_mod, "accept", runner_up)
    res = check_equivalence(tiny_session, PROMPT, 40, "prompt-lookup", KNOBS)
    d, replay = res["divergence"], res["replay"]
    assert res["verdict"] == "mismatch", res
    assert replay is not None and not replay["reproduced"], res
    assert replay["expected"] == d["plain_token"] and replay["committed"] == d["speculative_token"]
    assert replay["tokens"] == d["index"]


def test_verify_says_what_the_replay_found():
    from specviz.cli.generate import _replay_words

    assert "no replay" in _replay_words(None)
    assert "gives the same 12 tokens" in _replay_words({"reproduced": True, "tokens": 12})
    parted = {"reproduced": False, "tokens": 7, "round": 3, "row": 1, "expected": 40, "committed": 41}
    assert _replay_words(parted).endswith("(round 3, row 1: the greedy rule gives token 40, the run committed 41)")
    parted.update(expected=None)
    assert "the greedy rule gives nothing more" in _replay_words(parted)


@pytest.mark.parametrize("prefill", ["all-but-last", "whole"])
@pytest.mark.slow
def test_the_replay_evaluates_the_runs_own_batches(tiny_model, prefill):
    """Batch for batch: the prompt as the session evaluates it (llama-server's whole-prompt layout, whose
    first round reads the prompt batch's last row, included), then every round's verify batch."""
    from specviz import Session

    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, prefill=prefill)
    calls: list[tuple] = []
    real_eval = s.ctx.eval

    def logged(tokens, start, rows="all"):
        calls.append((tuple(int(t) for t in tokens), start, rows))
        return real_eval(tokens, start, rows)

    s.ctx.eval = logged
    prompt, rounds = _run(s)
    assert rounds[0].prefilled == (prefill == "whole")
    ran, calls[:] = list(calls), []
    got = replay_greedy(s.ctx, prompt, rounds, prefill=s.prefill, upto=10**6)
    assert got.reproduced and calls == ran
    s.ctx.eval = real_eval
    s.close()


def test_first_divergence_tells_a_flip_between_one_pair_from_anything_else():
    from specviz.analysis.equivalence import first_divergence

    a, b = [5, 6, 7, 8], [5, 6, 9, 8]
    # both runs' top two at index 2 are the pair (7, 9): each chose one of them
    ma = [(1.0, 5, 1), (2.0, 6, 1), (0.1, 7, 9), (3.0, 8, 1)]
    mb = [(1.0, 5, 1), (2.0, 6, 1), (0.2, 9, 7), (3.0, 8, 1)]
    d = first_divergence(a, ma, b, mb)
    assert (d.index, d.token_a, d.token_b, d.same_pair) == (2, 7, 9, True)
    assert d.margin == pytest.approx(0.2)
    # the batched run chose a token outside the alone run's top two: not a near-tie
    mb_other = [*mb[:2], (0.2, 9, 4), mb[3]]
    assert not first_divergence(a, ma, b, mb_other).same_pair
    assert not first_divergence(a, [*ma[:2], (0.1, 7, 3), ma[3]], b, mb).same_pair
    # the same tokens: no divergence; one run stopped early: the divergence is at its end
    assert first_divergence(a, ma, list(a), ma) is None
    short = first_divergence(a, ma, a[:3], ma[:3])
    assert (short.index, short.token_a, short.token_b, short.margin) == (3, 8, None, None)
    assert not short.same_pair  # no margin recorded past the shorter run's end
