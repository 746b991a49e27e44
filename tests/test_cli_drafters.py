"""The specviz command with llama.cpp's newer drafters: --spec-type draft-dflash / draft-dspark / draft-mtp and
comma lists (chains), on tiny models the tests write; every run is lossless (greedy equals plain greedy)."""

from __future__ import annotations

import json

import pytest
from test_cli import run_cli
from test_dflash import binary_head_output, binary_weights, rule_head_output

from specviz.testing.tiny_dflash import write_tiny_dflash
from specviz.testing.tiny_models import write_tiny_llama, write_tiny_nextn

PROMPT = "the cat of the dog and the"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("clid")
    target = write_tiny_llama(d / "target.gguf", n_layer=4, layers_from=binary_weights())
    common = dict(target_layers=(1, 2, 3), own_output=True, block_size=6)
    return {
        "target": target,
        "dflash": write_tiny_dflash(d / "dflash.gguf", seed=6, output_weight=binary_head_output(), **common),
        "dspark": write_tiny_dflash(d / "dspark.gguf", seed=7, dspark=True, output_weight=rule_head_output(), **common),
        "nextn": write_tiny_nextn(d / "nextn.gguf", seed=1, block_scale=0.05, binary=(300, 301)),
    }


def run_json(*args):
    p = run_cli("run", "--prompt", PROMPT, "--max-tokens", "30", "--json", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def plain(model):
    return run_json("--model", str(model), "--strategy", "none")["tokens"]


@pytest.mark.parametrize(
    "spec,strategy,head",
    [("draft-dflash", "dflash", "dflash"), ("draft-dspark", "dspark", "dspark"), (None, "dflash", "dflash")],
)
@pytest.mark.slow
def test_block_drafters_run_with_llama_cpps_spellings(models, spec, strategy, head):
    args = ["--model", str(models["target"]), "-md", str(models[head]), "--spec-draft-p-min", "0"]
    if spec is not None:
        args += ["--spec-type", spec]  # without it, the draft's architecture says which (as llama.cpp detects it)
    out = run_json(*args)
    assert out["strategy"] == strategy and out["tokens"] == plain(models["target"])
    t = out["telemetry"]
    assert t["drafted"] > t["accepted"] > 0 and t["dflash"]["kind"] == strategy


@pytest.mark.slow
def test_draft_mtp_and_a_chain_run_and_break_acceptance_down_per_drafter(models):
    ref = plain(models["nextn"])
    out = run_json("--model", str(models["nextn"]), "--spec-type", "draft-mtp", "--spec-draft-p-min", "0")
    assert out["strategy"] == "mtp" and out["tokens"] == ref
    out = run_json(
        "--model",
        str(models["nextn"]),
        "--spec-type",
        "draft-mtp,ngram-mod",
        "--spec-draft-p-min",
        "0",
        "--spec-ngram-mod-n-match",
        "2",
        "--spec-ngram-mod-n-min",
        "1",
    )
    assert out["strategy"] == "ngram-mod,mtp" and out["tokens"] == ref
    assert out["knobs"]["n_match"] == 2 and out["knobs"]["draft_p_min"] == 0.0
    by = out["telemetry"]["by_drafter"]
    assert set(by) == {"ngram-mod", "mtp"} and sum(v["drafted"] for v in by.values()) == out["telemetry"]["drafted"]


@pytest.mark.slow
def test_a_chains_clashing_knobs_are_set_per_member(models):
    out = run_json(
        "--model",
        str(models["target"]),
        "--spec-type",
        "ngram-simple,ngram-map-k",
        "--spec-ngram-map-k-size-n",
        "3",
        "--ngram-simple-size-n",
        "2",
        "--check-rate",
        "2",  # declared alike by both members: one knob
    )
    k = out["knobs"]
    assert (k["ngram_simple_size_n"], k["ngram_map_k_size_n"], k["check_rate"]) == (2, 3, 2)
    assert "size_n" not in k and "ngram_simple_size_m" in k
