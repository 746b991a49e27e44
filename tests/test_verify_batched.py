"""``specviz verify -np N``: every request of a batched run against the same request alone
(:mod:`specviz.analysis.batch_equivalence`): the verdict rule worked by hand, the command on the tiny model, a
broken batch caught, and the refusals."""

from __future__ import annotations

import json

import pytest
from test_cli import run_cli
from test_parallel_requests import LOG, write_log

from specviz.analysis.batch_equivalence import (
    NEAR_TIE_BOUND,
    check_batched_equivalence,
    overall_verdict,
    ranks_alone,
    verdict_of,
)
from specviz.analysis.equivalence import Divergence, first_divergence
from specviz.cli import main as cli
from specviz.errors import BatchError

NGRAM = ["--strategy", "ngram-simple", "--size-n", "1", "--size-m", "4"]


def parting(alone: tuple[float, int, int] | None, batched: tuple[float, int, int] | None, ta=7, tb=9) -> Divergence:
    """Runs alone ``[1, ta]`` and batched ``[1, tb]``: they part at token 1 with these top twos there."""
    m_a = [(5.0, 1, 2), alone] if alone else [(5.0, 1, 2)]
    m_b = [(5.0, 1, 2), batched] if batched else [(5.0, 1, 2)]
    div = first_divergence([1, ta], m_a, [1, tb], m_b)  # type: ignore[arg-type]
    assert div is not None
    return div


def test_the_verdict_rule_by_hand():
    assert verdict_of(None) == "identical"
    # both runs' top two are {7, 9}: the batch shape moved the logits between them, whatever the margin
    same = parting((0.1, 7, 9), (0.3, 9, 7))
    assert same.same_pair and verdict_of(same) == "numerics"
    assert verdict_of(parting((2.5, 7, 9), (3.0, 9, 7))) == "numerics"
    # a threshold also asks both margins below it (the larger is 0.3 here)
    assert verdict_of(same, threshold=0.5) == "numerics"
    assert verdict_of(same, threshold=0.3) == "mismatch"
    assert verdict_of(same, threshold=0.2) == "mismatch"
    # not on the same pair: the row alone again decides, by how far below the top the batched token stands
    other = parting((0.1, 7, 4), (0.2, 9, 4))
    assert not other.same_pair
    assert verdict_of(other, {"alone": (1, 0.0), "batched": (3, 0.4)}) == "numerics"
    assert verdict_of(other, {"alone": (1, 0.0), "batched": (2, NEAR_TIE_BOUND - 0.01)}) == "numerics"
    assert verdict_of(other, {"alone": (1, 0.0), "batched": (2, NEAR_TIE_BOUND)}) == "mismatch"
    assert verdict_of(other, {"alone": (1, 0.0), "batched": (40, 6.0)}) == "mismatch"
    assert verdict_of(other) == "mismatch"  # nothing evaluated: nothing explains it
    # a threshold replaces the bound
    assert verdict_of(other, {"batched": (3, 0.4)}, threshold=0.3) == "mismatch"
    assert verdict_of(other, {"batched": (3, 1.5)}, threshold=2.0) == "numerics"
    # a run that stopped where the other went on is never a near-tie
    stopped = first_divergence([1, 7], [(5.0, 1, 2), (0.1, 7, 9)], [1], [(5.0, 1, 2)])
    assert stopped is not None and stopped.token_b is None and verdict_of(stopped) == "mismatch"
    assert NEAR_TIE_BOUND == 1.2


def test_the_run_verdict_is_the_worst_request_verdict():
    assert overall_verdict([]) == "identical"
    assert overall_verdict(["identical", "identical"]) == "identical"
    assert overall_verdict(["identical", "numerics", "identical"]) == "numerics"
    assert overall_verdict(["numerics", "mismatch", "identical"]) == "mismatch"


@pytest.mark.slow
def test_a_row_alone_again_ranks_the_alone_run_token_first(tiny_session):
    from specviz.analysis.equivalence import greedy_run

    tokens, margins, _ = greedy_run(tiny_session, "the a of the a of", 6, "none", {})
    context = list(tiny_session.prompt_tokens) + tokens[:3]
    runner_up = margins[3][2]
    ranks = ranks_alone(tiny_session.model, context, {"alone": tokens[3], "other": runner_up}, n_ctx=512, n_threads=1)
    assert ranks["alone"] == (1, 0.0)
    assert ranks["other"][0] == 2 and ranks["other"][1] == pytest.approx(margins[3][0], abs=1e-3)


@pytest.mark.slow
def test_a_batch_without_margins_is_refused(tiny_model, tiny_session):
    from specviz.decoding.batch import BatchRun

    with BatchRun(tiny_model, n_parallel=2, n_ctx=512, n_threads=1) as b:
        with pytest.raises(BatchError, match="record_margins=True"):
            check_batched_equivalence(b, tiny_session, ["the a"], 4, "none", {})
        assert not b.pending  # nothing was queued


def verify_json(*args: str) -> tuple[int, dict, str]:
    p = run_cli("verify", *args, "--json")
    return p.returncode, json.loads(p.stdout) if p.stdout else {}, p.stderr


@pytest.mark.slow
def test_verify_np_3_requests_are_identical_to_alone(tiny_model_path, tmp_path):
    log = write_log(tmp_path / "log.jsonl", LOG)
    common = ["--model", str(tiny_model_path), "--requests", log, "--chat-template", "chatml", "-t", "1"]
    rc, out, err = verify_json(*common, *NGRAM, "--max-tokens", "30", "-np", "3", "-c", "1536")
    assert rc == 0, err
    assert out["verdict"] == "identical" and out["n_parallel"] == 3 and out["kv_unified"] is False
    assert out["strategy"] == "ngram-simple" and out["bound"] == 1.2
    reqs = out["requests"]
    assert [r["id"] for r in reqs] == ["request-1", "two", "request-3", "request-4"]
    assert [r["verdict"] for r in reqs] == ["identical"] * 4
    assert [r["tokens"] for r in reqs] == [r["alone_tokens"] for r in reqs] == [40, 12, 30, 20]
    assert all(r["divergence"] is None and r["error"] is None for r in reqs)
    assert {r["slot"] for r in reqs} == {0, 1, 2}
    # the people's form: a line per request and a total
    p = run_cli("verify", *common, *NGRAM, "--max-tokens", "30", "-np", "3", "-c", "1536", "-kvu")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0].startswith("request-1: identical") and lines[1].startswith("two: identical")
    assert lines[-1].startswith("identical: 4 requests, 3 at a time (a unified cache)")


@pytest.mark.slow
def test_verify_np_with_a_prompt_runs_n_identical_requests(tiny_model_path):
    args = ["--model", str(tiny_model_path), "--prompt", "the a of the a of", "--max-tokens", "24", "-t", "1"]
    rc, out, err = verify_json(*args, *NGRAM, "-np", "2", "-c", "1024")
    assert rc == 0, err
    assert out["verdict"] == "identical" and [r["id"] for r in out["requests"]] == ["0", "1"]
    assert [r["tokens"] for r in out["requests"]] == [24, 24]


@pytest.mark.slow
def test_a_broken_batch_is_a_mismatch(tiny_model, tiny_session, monkeypatch):
    """A slot whose tokens go wrong after a few must be caught: the check can fail."""
    from specviz.decoding import batch as batch_mod
    from specviz.decoding.batch import BatchRun

    orig_end = batch_mod.BatchRun._end

    def corrupting_end(self, slot, error=None, *, started=True):
        req = self.busy[slot]
        orig_end(self, slot, error, started=started)
        res = self.results[req.id]
        if res.slot == 1 and len(res.tokens) > 5:  # slot 1's request: token 5 replaced by one far off the top
            res.tokens[5] = (res.tokens[5] + 101) % tiny_model.n_vocab
            res.margins[5] = (res.margins[5][0], res.tokens[5], res.margins[5][2])

    monkeypatch.setattr(batch_mod.BatchRun, "_end", corrupting_end)
    prompts = ["the a of the a of", "of of the a the of of", "a a a of the the a"]
    knobs = {"size_n": 1, "size_m": 4}
    with BatchRun(tiny_model, n_parallel=2, n_ctx=1024, n_threads=1, record_margins=True) as b:
        res = check_batched_equivalence(b, tiny_session, prompts, 16, "ngram-simple", knobs)
    assert res["verdict"] == "mismatch"
    bad = [r for r in res["requests"] if r["verdict"] != "identical"]
    assert len(bad) == 1 and bad[0]["verdict"] == "mismatch" and bad[0]["slot"] == 1
    d = bad[0]["divergence"]
    assert d["index"] == 5 and d["alone_margin"] is not None and d["batched_margin"] is not None
    # the corrupted token sits in the batched run's recorded top two, not the alone run's: off the same pair, the
    # row alone again shows how far below the top it is
    assert d["same_pair"] is False
    rank, below = bad[0]["ranks_alone"]["batched"]
    assert rank > 2 and below >= NEAR_TIE_BOUND
    assert bad[0]["ranks_alone"]["alone"] == [1, 0.0]


@pytest.mark.slow
def test_verify_np_exits_1_on_a_mismatch(tiny_model_path, tmp_path):
    """The command's exit status follows the verdict: a broken acceptor in the batch makes it 1."""
    hook = tmp_path / "sitecustomize.py"
    hook.write_text(BROKEN_ACCEPTOR)
    args = ["--model", str(tiny_model_path), "--prompt", "the a of the a of the cat", "--max-tokens", "40"]
    p = run_cli(
        "verify", *args, "-t", "1", "-c", "1024", "-np", "2", *NGRAM, "--json", env={"PYTHONPATH": str(tmp_path)}
    )
    assert p.returncode == 1, p.stderr
    out = json.loads(p.stdout)
    assert out["verdict"] == "mismatch" and {r["verdict"] for r in out["requests"]} == {"mismatch"}


@pytest.mark.slow
def test_a_request_that_fails_alone_is_refused(tiny_model_path, tmp_path):
    """The tiny model has no chat template: its requests cannot run, which is bad input, not a mismatch."""
    log = write_log(tmp_path / "log.jsonl", LOG[:2])
    p = run_cli("verify", "--model", str(tiny_model_path), "--requests", log, "-np", "2", "-t", "1", "-c", "1024")
    assert p.returncode == 2 and p.stdout == ""
    assert "request 'request-1' cannot be compared, as it fails run alone: " in p.stderr
    assert "chat template" in p.stderr


#: A sitecustomize that breaks acceptance in batched sessions only (a slot's session runs in a SequenceContext;
#: the alone session does not): where the target refuses a draft token, it commits the row's least likely token in
#: place of the target's correction (far below the top: no near-tie explains it).
BROKEN_ACCEPTOR = """
import dataclasses

import numpy as np

from specviz.backends.sequence_context import SequenceContext
from specviz.decoding import round as round_mod
from specviz.decoding import session as session_mod

_orig_accept = round_mod.accept
_orig_finish = session_mod.Session.finish_step
_batched = [False]


def finish_step(self, *a, **kw):
    _batched[0] = isinstance(self.ctx, SequenceContext)
    try:
        return _orig_finish(self, *a, **kw)
    finally:
        _batched[0] = False


def accept(draft, rows, params, rng, draft_dists=None, **kw):
    v = _orig_accept(draft, rows, params, rng, draft_dists, **kw)
    n = v.n_accepted
    if _batched[0] and draft and n < len(draft):
        worst = int(np.argmin(rows(n)))
        return dataclasses.replace(v, tokens=(*v.tokens[:-1], worst))
    return v


round_mod.accept = accept
session_mod.Session.finish_step = finish_step
"""


@pytest.mark.parametrize(
    "extra,words",
    [
        (["-np", "0"], "option -np: parallel (-np) must be an integer of at least 1"),
        (["-np", "two"], "option -np: 'two' is not allowed"),
        (["-np", "2", "--strategy", "eagle3", "--draft-model", "MODEL"], "cannot run batched"),
        (["-np", "2", "--strategy", "ngram-cache", "--tree-width", "2"], "with -np 2"),
        (["-np", "2", "--requests", "/nonexistent/log.jsonl"], "option --requests: '/nonexistent/log.jsonl' does not"),
        (["--requests", "LOG"], "option --requests: only with -np N above 1"),
        (["-np", "2", "--requests", "LOG", "--stop", "x"], "specviz verify compares"),
        (["-np", "2", "--threshold", "0"], "option --threshold: '0'"),
    ],
)
def test_verify_np_refused_before_the_model_loads(tmp_path, capsys, extra, words):
    not_a_model = tmp_path / "not-a-model.gguf"
    not_a_model.write_text("loading this would fail otherwise")
    log = write_log(tmp_path / "log.jsonl", LOG[:1])
    extra = [{"LOG": log, "MODEL": str(not_a_model)}.get(x, x) for x in extra]
    prompt = [] if "--requests" in extra else ["--prompt", "x"]
    assert cli.main(["verify", "--model", str(not_a_model), *prompt, *extra]) == 2
    assert words in capsys.readouterr().err
