"""Chained drafters (``strategy="draft-mtp,ngram-mod"``): names, knobs, priority, events and state."""

from __future__ import annotations

import pytest
from test_session import plain_reference

from specviz import Session
from specviz.decoding.events import event_from_dict
from specviz.errors import KnobError, StrategyError, StrategyUnavailableError
from specviz.strategies import (
    CHAIN_PRIORITY,
    SPEC_TYPES,
    make_drafter,
    resolve_strategy,
    spec_type,
    strategy_class,
    strategy_schema,
)
from specviz.testing.tiny_models import write_tiny_llama, write_tiny_nextn


@pytest.fixture(scope="module")
def nextn_path(tmp_path_factory):
    return write_tiny_nextn(
        tmp_path_factory.mktemp("chain") / "nextn.gguf", seed=1, block_scale=0.05, binary=(300, 301)
    )


@pytest.fixture()
def session(nextn_path):
    s = Session(nextn_path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    yield s
    s.close()


CHAIN = {"draft_p_min": 0.0, "draft_max": 4, "n_match": 2, "n_min": 1}


# -- names --------------------------------------------------------------------------------------------------


def test_a_comma_list_resolves_to_llama_cpps_priority_order():
    assert resolve_strategy("draft-mtp,ngram-mod") == "ngram-mod,mtp"  # llama.cpp asks the n-gram types first
    assert resolve_strategy("mtp, ngram-mod , mtp") == "ngram-mod,mtp"  # spaces and repeats
    assert resolve_strategy("draft-dflash") == "dflash" and resolve_strategy("draft-dspark") == "dspark"
    assert resolve_strategy("ngram-cache,ngram-simple,prompt-lookup") == "ngram-simple,ngram-cache,prompt-lookup"
    assert resolve_strategy("ngram-mod,none") == "none"  # llama.cpp: a list naming none means none
    assert resolve_strategy("ngram-mod,ngram-mod") == "ngram-mod"
    assert spec_type("ngram-mod,mtp") == "ngram-mod,draft-mtp" and spec_type("prompt-lookup") is None
    assert set(CHAIN_PRIORITY) == set(SPEC_TYPES) - {"none"} | {"prompt-lookup", "grammar"}


@pytest.mark.parametrize(
    "name,why",
    [
        ("ngram-mod,bogus", "'bogus' is not one"),
        ("ngram-mod,", "an empty name"),
        ("draft,eagle3", "both draft with a model"),
        ("draft-dflash,draft-mtp", "at most one"),
    ],
)
def test_bad_chains_are_refused_typed(session, name, why):
    with pytest.raises(StrategyError, match=why):
        resolve_strategy(name)
    session.start([1, 50], 5, "none")
    with pytest.raises(StrategyError, match=why):
        session.configure(name)
    with pytest.raises(StrategyError, match=why):
        session.start([1, 50], 5, name)
    session.run()
    assert session.finished == "max_tokens" and session.strategy == "none"


# -- knobs --------------------------------------------------------------------------------------------------


def test_the_knob_schema_comes_from_the_members_declarations():
    own = {k.name: k for k in strategy_class("ngram-simple,ngram-map-k").knobs}
    # size_n / size_m are declared differently by the two members: one knob each, with the member's spelling
    assert own["ngram_simple_size_n"].aliases == ("--spec-ngram-simple-size-n",)
    assert own["ngram_map_k_size_m"].flag == "--ngram-map-k-size-m"
    assert own["ngram_map_k_size_m"].aliases == ("--spec-ngram-map-k-size-m",)
    assert own["ngram_map_k_size_n"].help.startswith("ngram-map-k: ")
    assert "size_n" not in own and "check_rate" in own  # check_rate is declared alike: one knob
    # the member-specific knobs reach each member under its own name
    d = make_drafter("ngram-simple,ngram-map-k", {"ngram_simple_size_n": 2, "ngram_map_k_size_n": 3})
    assert [x.config["size_n"] for x in d.drafters] == [2, 3]
    schema = strategy_schema("draft-mtp,ngram-mod")
    names = schema.names()
    assert names[:5] == ["draft_max", "draft_min", "draft_policy", "align", "verify_tile"]
    assert {"n_match", "draft_model", "draft_p_min"} <= set(names)
    with pytest.raises(KnobError, match="unknown knob 'size_n'"):
        strategy_schema("ngram-simple,ngram-map-k").validate({"size_n": 2})


# -- drafting -----------------------------------------------------------------------------------------------


def test_the_first_member_that_drafts_wins_and_the_events_name_it(session, nextn_path):
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(session.model, prompt, 60)
    session.start(prompt, 60, "draft-mtp,ngram-mod", **CHAIN)
    assert session.strategy == "ngram-mod,mtp"
    by_round, asked = [], 0
    while session.finished is None:
        rnd = session.step()
        d = rnd.of_kind("draft_proposed")[0]
        assert event_from_dict(d.to_dict()) == d
        by_round.append(d.drafter)
        asked += d.limit > 0
        if not d.tokens:  # nobody drafted: the chain itself is named
            assert d.drafter == "ngram-mod,mtp"
        assert session.kv_length == session.committed and session.drafter.kv_length() == session.committed
    assert session.tokens == ref
    assert {"ngram-mod", "mtp"} <= set(by_round)
    t = session.telemetry_dict()
    per = t["by_drafter"]
    assert sum(v["drafted"] for v in per.values()) == t["drafted"]
    assert sum(v["accepted"] for v in per.values()) == t["accepted"]
    stats = t["chain"]["stats"]
    # ngram-mod is asked every round; mtp only when ngram-mod drafted nothing
    assert stats["ngram-mod"]["calls"] == asked
    assert stats["mtp"]["calls"] == stats["ngram-mod"]["calls"] - stats["ngram-mod"]["drafts_generated"]
    # only the winner hears how many of its tokens were accepted
    for name in ("ngram-mod", "mtp"):
        assert stats[name]["tokens_accepted"] == per[name]["accepted"]
        assert stats[name]["tokens_generated"] == per[name]["drafted"]


def test_a_chain_of_draftless_members_drafts_without_a_model(tiny_model):
    s = Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    prompt = "the cat of the dog and the cat of the dog and the"
    s.start(prompt, 50, "ngram-map-k,ngram-simple", ngram_simple_size_n=2, ngram_map_k_size_n=3, ngram_simple_size_m=6)
    s.run()
    assert s.drafter.drafters[0].config["size_n"] == 2 and s.drafter.drafters[1].config["size_n"] == 3
    assert s.telemetry_dict()["drafted"] > 0
    assert s.tokens == plain_reference(s.model, s.prompt_tokens, len(s.tokens))
    s.close()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_chain_snapshot_and_rewind_repeat_the_run(session, temperature):
    session.start([1, 50, 60], 50, "ngram-mod,mtp", temperature=temperature, seed=4, **CHAIN)
    session.run(max_rounds=6)
    blob = session.snapshot()
    session.run()
    original, tel = list(session.tokens), session.telemetry_dict()
    r = Session.restore(blob, model=session.model, n_threads=1)
    assert r.strategy == "ngram-mod,mtp" and r.drafter.kv_length() == r.committed
    r.run()
    assert r.tokens == original and r.telemetry_dict()["by_drafter"] == tel["by_drafter"]
    r.close()
    session.rewind(3)
    session.run()
    assert session.tokens == original and session.telemetry_dict()["by_drafter"] == tel["by_drafter"]


def test_switching_to_a_chain_mid_generation_and_back(session):
    prompt = [1, 90, 91]
    ref = plain_reference(session.model, prompt, 40)
    session.start(prompt, 40, "none")
    session.run(max_rounds=8)
    session.configure("draft-mtp,ngram-mod", **CHAIN)
    session.run(max_rounds=6)
    assert session.strategy == "ngram-mod,mtp"
    session.configure("mtp")
    session.run()
    assert session.tokens == ref


def test_a_chain_refuses_an_unusable_model_member_at_configure(tmp_path):
    llama = write_tiny_llama(tmp_path / "llama.gguf")
    s = Session(llama, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    s.start([1, 5], 5, "none")
    with pytest.raises(StrategyUnavailableError, match="no NextN"):
        s.configure("ngram-mod,draft-mtp")
    with pytest.raises(KnobError, match="needs a DFlash draft"):
        s.configure("ngram-mod,draft-dflash")
    s.run()
    assert s.finished == "max_tokens"
    s.close()


def test_the_inspector_form_comes_from_a_chains_declarations(tiny_session):
    pytest.importorskip("anywidget")
    from specviz.ui.core import InspectorCore

    sent: list[dict] = []
    tiny_session.start("the cat of the dog and the cat of the dog", 20, "ngram-simple,ngram-map-k")
    core = InspectorCore(sent.append, tiny_session)
    st = core.state()
    assert st["strategy"] == "ngram-simple,ngram-map-k"
    names = [k["name"] for k in st["schema"]]
    assert "ngram_map_k_size_n" in names and "size_n" not in names
    flags = {k["name"]: k["flag"] for k in st["schema"]}
    assert flags["ngram_map_k_size_n"] == "--ngram-map-k-size-n"
    # the form's text goes through the chain's declarations: a per-member knob applies at the boundary
    assert core.configure_from_form("ngram-simple,ngram-map-k", {"ngram_map_k_size_n": "2"}) == {}
    assert "unknown knob 'size_n'" in core.configure_from_form("ngram-simple,ngram-map-k", {"size_n": "2"})["size_n"]
    core.step(1)
    assert tiny_session.knobs["ngram_map_k_size_n"] == 2 and tiny_session.drafter.drafters[1].config["size_n"] == 2


def test_a_chain_reports_its_recurrent_draft_members_memory_work(tmp_path):
    # the chain hands the round its model member's checkpoints and cuts, and the telemetry its context
    from specviz.testing.memory_models import write_tiny_mamba

    target = write_tiny_mamba(tmp_path / "mamba.gguf", block_scale=0.02)
    draft = write_tiny_mamba(tmp_path / "mamba_draft.gguf", block_scale=0.02, n_layer=1)
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    prompt = [1, 50, 60, 70, 80]
    ref = plain_reference(s.model, prompt, 30)
    s.start(prompt, 30, "ngram-mod,draft", draft_model=str(draft), draft_p_min=0.0, draft_max=5)
    while s.finished is None:
        s.step()
        assert s.kv_length == s.committed and s.drafter.kv_length() == s.committed
    assert s.tokens == ref
    events = s.events
    assert any(e.kind == "memory_checkpoint" and e.context == "draft" for e in events)
    cuts = [e for e in events if e.kind == "kv_rollback" and e.context == "draft"]
    assert cuts and all(e.path == "checkpoint" for e in cuts)
    assert s.telemetry_dict()["memory"]["draft"]["kind"] == "recurrent"
    s.close()
