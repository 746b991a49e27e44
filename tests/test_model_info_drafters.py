"""`specviz info` on DFlash / DSpark / DFlash-2 drafts, Qwen3.5-style NextN models and chains: the same checks
the strategies make at configure(), so info and start agree."""

from __future__ import annotations

import json

import pytest

from specviz import Session, model_info
from specviz.cli.main import main
from specviz.errors import StrategyUnavailableError
from specviz.testing.tiny_dflash import write_tiny_dflash
from specviz.testing.tiny_models import write_tiny_eagle3, write_tiny_llama, write_tiny_nextn
from specviz.testing.tiny_qwen35 import write_tiny_qwen35


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("infod")
    target = write_tiny_llama(d / "target.gguf", seed=2, n_layer=4)
    return {
        "target": target,
        "dflash": write_tiny_dflash(d / "dflash.gguf", target_layers=(1, 3)),
        "dspark": write_tiny_dflash(d / "dspark.gguf", dspark=True),
        "dspark0": write_tiny_dflash(d / "dspark0.gguf", dspark=True, confidence_head=False),
        "dflash2": write_tiny_dflash(d / "dflash2.gguf", selector_top_k=4),
        "deep": write_tiny_dflash(d / "deep.gguf", target_layers=(2, 5)),
        "head": write_tiny_eagle3(d / "head.gguf", target),
        "qwen35": write_tiny_qwen35(d / "q35.gguf"),
        "nextn": write_tiny_nextn(d / "nextn.gguf"),
    }


def fits(info):
    return {f.strategy: f for f in info.strategies}


def test_info_on_dflash_pairs_says_what_each_strategy_can_do(models):
    f = fits(model_info(models["target"]))
    for name in ("dflash", "dspark"):
        assert not f[name].ok and f[name].needs.startswith("--draft-model") and f[name].why is None
    info = model_info(models["target"], models["dflash"])
    f = fits(info)
    assert f["dflash"].ok and not f["dspark"].ok and "no Markov head" in f["dspark"].why
    assert not f["draft"].ok and "DFlash draft" in f["draft"].why and not f["eagle3"].ok
    h = info.draft_model["dflash_head"]
    assert (h["kind"], h["block_size"], h["max_draft"], h["mask_token"], h["target_layers"]) == (
        "dflash",
        8,
        7,
        319,
        [1, 3],
    )
    text = info.format()
    assert "DFlash (--spec-type draft-dflash); block 8 = 7 draft positions; mask token 319" in text
    assert info.chains.endswith("prompt-lookup, dflash; asked in that order, the first that drafts wins")
    f = fits(model_info(models["target"], models["dspark"]))
    assert f["dspark"].ok and not f["dflash"].ok and "use the dspark strategy" in f["dflash"].why
    assert "anchor-first" in model_info(models["target"], models["dspark"]).format()
    # DSpark without its confidence head runs at its default p_min (0); info says p_min must stay 0
    info = model_info(models["target"], models["dspark0"])
    assert fits(info)["dspark"].ok and "confidence head no (draft_p_min must stay 0)" in info.format()
    assert "selector over the top 4" in model_info(models["target"], models["dflash2"]).format()
    f = fits(model_info(models["target"], models["deep"]))
    assert not f["dflash"].ok and "target layer 5" in f["dflash"].why


def test_info_and_configure_agree(models):
    s = Session(models["target"], n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    try:
        for draft in ("dflash", "dspark", "deep", "head"):
            f = fits(model_info(models["target"], models[draft]))
            for name in ("dflash", "dspark", "draft"):
                if f[name].ok:
                    s.start([1, 2], 2, name, draft_model=str(models[draft]), draft_p_min=0.0)
                else:
                    with pytest.raises(StrategyUnavailableError):
                        s.start([1, 2], 2, name, draft_model=str(models[draft]), draft_p_min=0.0)
    finally:
        s.close()


def test_info_on_a_dflash_draft_alone_and_on_nextn_models(models):
    info = model_info(models["dflash"])
    assert info.dflash_head["kind"] == "dflash" and all(not f.ok for f in info.strategies)
    assert "cannot generate alone" in info.strategies[0].why
    q = model_info(models["qwen35"])
    # its NextN layer is checked, and its hybrid memory rolls a rejected draft back (specviz.backends.memory)
    assert fits(q)["mtp"].ok and q.nextn_layers == 1 and q.memory["kind"] == "hybrid"
    assert fits(model_info(models["nextn"]))["mtp"].ok
    # another GGUF's NextN layers: width and vocabulary are checked against the target
    f = fits(model_info(models["target"], models["nextn"]))
    assert not f["mtp"].ok and "glm4moe" in f["mtp"].why


def test_info_command_json_carries_the_dflash_facts(models, capsys):
    assert main(["info", str(models["target"]), "--draft-model", str(models["dspark"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["draft_model"]["dflash_head"]["kind"] == "dspark"
    assert {s["strategy"]: s["ok"] for s in out["strategies"]}["dspark"] is True
    assert out["chains"].startswith("any comma list of")
