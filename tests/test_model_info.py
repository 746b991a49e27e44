"""`specviz info` and specviz.model_info(): facts and per-strategy verdicts for models and pairs."""

from __future__ import annotations

import json

import pytest

from specviz import model_info
from specviz.cli.main import main
from specviz.models.derive import derive_draft
from specviz.testing.tiny_models import write_tiny_eagle3, write_tiny_llama, write_tiny_nextn


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("info")
    target = write_tiny_llama(d / "target.gguf", seed=2, n_layer=4)
    head = write_tiny_eagle3(d / "head.gguf", target, n_draft_vocab=64)
    derived = derive_draft(target, "0-1", d / "derived.gguf").path
    nextn = write_tiny_nextn(d / "nextn.gguf")
    other = write_tiny_llama(d / "other.gguf", seed=5, vocab_size=300)
    return {"target": target, "head": head, "derived": derived, "nextn": nextn, "other": other}


def fits(info):
    return {f.strategy: f for f in info.strategies}


def test_info_on_a_tiny_target_alone(models):
    info = model_info(models["target"])
    assert (info.architecture, info.n_layer, info.n_embd, info.n_vocab) == ("llama", 4, 64, 320)
    assert info.sliding_window == 0 and info.nextn_layers == 0 and not info.chat_template
    assert info.layer_capture == "api"
    f = fits(info)
    assert f["none"].ok and f["prompt-lookup"].ok and f["ngram-cache"].ok
    assert not f["draft"].ok and f["draft"].needs.startswith("--draft-model")
    assert not f["eagle3"].ok and "EAGLE-3 head" in f["eagle3"].needs and f["eagle3"].why is None
    assert not f["mtp"].ok and "no NextN" in f["mtp"].why


def test_info_with_an_eagle3_head_a_derived_draft_and_a_foreign_draft(models):
    f = fits(model_info(models["target"], models["head"]))
    assert f["eagle3"].ok and not f["draft"].ok and "EAGLE-3 head" in f["draft"].why
    info = model_info(models["target"], models["derived"])
    assert info.draft_model["n_layer"] == 2
    f = fits(info)
    assert f["draft"].ok and not f["eagle3"].ok and "not an EAGLE-3 head" in f["eagle3"].why
    f = fits(model_info(models["target"], models["other"]))
    assert not f["draft"].ok and "vocabularies differ" in f["draft"].why


def test_info_on_a_head_and_on_a_nextn_model(models):
    info = model_info(models["head"])
    assert info.architecture == "eagle3" and info.eagle3_head["n_draft_vocab"] == 64
    assert info.eagle3_head["target_layers"] == [2, 2, 1]
    assert not any(f.ok for f in info.strategies)
    info = model_info(models["nextn"])
    assert info.nextn_layers == 1 and fits(info)["mtp"].ok
    assert info.layer_capture is None and "does not record" in info.layer_capture_why
    assert not fits(info)["eagle3"].ok


def test_info_command_text_and_json(models, capsys):
    assert main(["info", str(models["target"]), "--draft-model", str(models["head"])]) == 0
    out = capsys.readouterr().out
    assert "architecture    llama" in out and "layer capture   yes, through llama.cpp layer-input taps" in out
    assert "  eagle3         yes" in out and "  mtp            no: " in out
    assert main(["info", str(models["nextn"]), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["nextn_layers"] == 1 and {s["strategy"]: s["ok"] for s in d["strategies"]}["mtp"] is True
    assert main(["info", str(models["target"].with_name("missing.gguf"))]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_run_with_llama_cpp_spellings_and_an_eagle3_head(models, capsys):
    base = ["run", "--model", str(models["target"]), "--prompt", "the cat", "--max-tokens", "12", "--json"]
    assert (
        main(
            [
                *base,
                "--spec-type",
                "draft-eagle3",
                "-md",
                str(models["head"]),
                "--spec-draft-n-max",
                "3",
                "--spec-draft-p-min",
                "0",
                "--spec-draft-n-min",
                "1",
            ]
        )
        == 0
    )
    a = json.loads(capsys.readouterr().out)
    assert a["strategy"] == "eagle3" and a["knobs"]["draft_max"] == 3 and a["knobs"]["draft_min"] == 1
    assert a["telemetry"]["drafted"] > 0
    # a head given with --draft-model alone selects eagle3 (read from the file's architecture)
    assert main([*base, "--draft-model", str(models["head"]), "--draft-p-min", "0"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert b["strategy"] == "eagle3" and b["tokens"] == a["tokens"]
    # a model without NextN layers: mtp is refused with the reason, status 1
    assert main([*base, "--spec-type", "draft-mtp"]) == 1
    assert "no NextN" in capsys.readouterr().err


@pytest.mark.embedded
def test_info_on_the_embedded_model(capsys):
    info = model_info()
    assert (info.architecture, info.n_layer, info.n_embd, info.n_vocab) == ("gemma3", 18, 640, 262144)
    assert info.sliding_window == 512 and info.nextn_layers == 0 and info.file_type == "Q4_K_M"
    assert info.layer_capture == "callback" and info.chat_template is False
    f = fits(info)
    assert f["eagle3"].needs and not f["mtp"].ok and f["ngram-mod"].ok
    assert main(["info"]) == 0
    assert "architecture    gemma3 (Gemma 3 270m)" in capsys.readouterr().out


def test_info_names_the_cache_types_the_heads_allow_and_checks_settings(models, tmp_path, capsys):
    from specviz import ContextSettings

    info = model_info(models["target"])  # heads of 16: no quantized cache type fits
    assert info.head_sizes == (16, 16) and info.cache_types == ["f32", "f16", "bf16"]
    wide = write_tiny_llama(tmp_path / "wide.gguf", n_head=2, n_head_kv=1)
    info = model_info(wide, settings=ContextSettings.make(flash_attn="on", cache_type_v="q4_0"))
    assert info.head_sizes == (32, 32) and "q8_0" in info.cache_types and info.settings_why is None
    info = model_info(models["target"], settings=ContextSettings.make(cache_type_k="q8_0"))
    assert "head size 16" in info.settings_why
    assert main(["info", str(models["target"]), "-ctk", "q8_0", "-fa", "off"]) == 0
    out = capsys.readouterr().out
    assert "KV cache types    f32, f16, bf16 (no quantized type" in out
    assert "context settings  -c 4096 -b 512 -ub 512 -fa off -ctk q8_0 -ctv f16: refused: " in out
    assert main(["info", str(wide), "-ctv", "q8_0", "-fa", "off"]) == 2  # refused before the model loads
    assert "needs flash attention" in capsys.readouterr().err
