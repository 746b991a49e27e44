"""The ``mtp`` strategy on a tiny ``glm4moe`` model with one NextN layer, written by the tests."""

from __future__ import annotations

import time

import pytest
from test_session import plain_reference

from specviz import Session
from specviz.backends import LlamaModel
from specviz.backends.mtp import mtp_problems
from specviz.errors import KnobError, StrategyUnavailableError
from specviz.testing.tiny_models import write_tiny_llama, write_tiny_nextn

A, B = 300, 301


@pytest.fixture(scope="module")
def nextn_path(tmp_path_factory):
    """Trunk of two dense blocks plus one NextN block; output head limited to A/B (partly accepted drafts)."""
    return write_tiny_nextn(tmp_path_factory.mktemp("mtp") / "nextn.gguf", seed=1, block_scale=0.05, binary=(A, B))


@pytest.fixture()
def session(nextn_path):
    s = Session(nextn_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    yield s
    s.close()


def test_tiny_nextn_model_is_written_quickly_and_loads_with_its_nextn_layer(tmp_path):
    t0 = time.perf_counter()
    p = write_tiny_nextn(tmp_path / "m.gguf")
    assert time.perf_counter() - t0 < 1.0
    m = LlamaModel(p)
    try:
        assert (m.info.architecture, m.n_layer, m.n_layer_nextn) == ("glm4moe", 2, 1)
        assert mtp_problems(m.info) == []
    finally:
        m.close()


def test_greedy_with_mtp_equals_plain_greedy_and_keeps_both_caches_right(session):
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(session.model, prompt, 60)
    session.start(prompt, 60, "mtp", draft_p_min=0.0, draft_max=4)
    draft_rollbacks = 0
    while session.finished is None:
        rnd = session.step()
        assert session.kv_length == session.committed
        # MTP pairs sit one position later than EAGLE-3's: the drafter holds positions 1 .. L-2
        assert session.drafter.kv_length() == len(session.history) - 1
        draft_rollbacks += len([e for e in rnd.of_kind("kv_rollback") if e.context == "draft"])
    assert session.tokens == ref
    t = session.telemetry_dict()
    assert 0 < t["accepted"] < t["drafted"] and draft_rollbacks > 0 and t["catch_up_tokens"] == 0


def test_mtp_snapshot_restores_both_contexts(session):
    session.start([1, 50, 60], 50, "mtp", temperature=0.8, seed=5, draft_p_min=0.0, draft_max=3)
    session.run(max_rounds=5)
    blob = session.snapshot()
    session.run()
    original = list(session.tokens)
    r = Session.restore(blob, model=session.model, n_threads=1)
    assert r.drafter.kv_length() == len(r.history) - 1
    r.run()
    assert r.tokens == original
    r.close()


def test_switching_to_mtp_mid_generation_catches_up(session):
    prompt = [1, 90, 91]
    ref = plain_reference(session.model, prompt, 40)
    session.start(prompt, 40, "none")
    session.run(max_rounds=10)
    session.configure("mtp", draft_p_min=0.0, draft_max=3)
    session.run()
    assert session.tokens == ref and session.telemetry_dict()["catch_up_tokens"] >= 10


def test_models_without_usable_nextn_layers_are_refused(tmp_path):
    llama = write_tiny_llama(tmp_path / "llama.gguf")
    trunk = write_tiny_nextn(tmp_path / "trunk.gguf", nextn=False)
    for path, why in ((llama, "no NextN"), (trunk, "no NextN")):
        s = Session(path, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
        s.start([1, 5], 5, "none")
        with pytest.raises(StrategyUnavailableError, match=why):
            s.configure("mtp")
        with pytest.raises(StrategyUnavailableError, match=why):
            s.start([1, 5], 5, "mtp")
        s.run()
        assert s.finished == "max_tokens"
        s.close()
    s = Session(llama, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    with pytest.raises(KnobError, match="does not exist"):
        s.start([1], 5, "mtp", draft_model=str(tmp_path / "missing.gguf"))
    s.close()


def test_nextn_layers_in_another_gguf_can_draft(session, nextn_path):
    prompt = [1, 40, 41]
    ref = plain_reference(session.model, prompt, 30)
    session.start(prompt, 30, "mtp", draft_model=str(nextn_path), draft_p_min=0.0)
    session.run()
    assert session.tokens == ref and session.telemetry_dict()["drafted"] > 0


def test_mtp_sampled_runs_are_seeded(session):
    outs = []
    for seed in (3, 3, 4):
        session.generate([1, 70], 30, "mtp", temperature=1.0, seed=seed, draft_p_min=0.0)
        outs.append(list(session.tokens))
    assert outs[0] == outs[1] and session.telemetry_dict()["drafted"] > 0


def test_a_switch_to_mtp_does_not_carry_another_strategys_draft_model(session, tmp_path):
    """configure("mtp") after a strategy that drafts with a GGUF of its own: that file is no MTP model, so MTP
    drafts with the target's own NextN layers (it was refused, naming the other file); output stays greedy."""
    other = write_tiny_nextn(tmp_path / "trunk.gguf", seed=1, nextn=False)  # the same vocabulary, no NextN
    prompt = [1, 50, 60]
    ref = plain_reference(session.model, prompt, 40)
    session.start(prompt, 40, "draft", draft_model=str(other), draft_max=3, draft_p_min=0.0)
    session.run(max_rounds=4)
    with pytest.raises(StrategyUnavailableError, match="trunk.gguf"):  # named, the file is checked as before
        session.configure("mtp", draft_model=str(other))
    with pytest.raises(KnobError, match="needs an EAGLE-3 head") as refused:  # what eagle3 lacks, not the old file
        session.configure("eagle3")
    assert refused.value.__context__ is None
    assert session.configure("mtp", draft_p_min=0.0, draft_max=3)["draft_model"] == ""
    session.run()
    assert session.strategy == "mtp" and session.tokens == ref
    assert session.telemetry_dict()["drafted"] > 0
