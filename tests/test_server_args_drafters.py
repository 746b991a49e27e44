"""A llama-server command line with the newer drafters (``--spec-type draft-dflash`` / ``draft-dspark``, comma
lists: chains) read by specviz.analysis.server_args and run through ``session_from_server_args`` and
``specviz run --server-args``, on tiny models the tests write. Each becomes the configuration the CLI's own
``--spec-type`` builds, llama.cpp's defaults apart, and every run is lossless (greedy equals plain greedy)."""

from __future__ import annotations

import json

import pytest
from test_cli import run_cli
from test_dflash import binary_head_output, binary_weights, rule_head_output

from specviz.analysis.server_args import parse_server_args, session_from_server_args
from specviz.analysis.server_repro import run_like_the_server
from specviz.testing.tiny_dflash import write_tiny_dflash
from specviz.testing.tiny_models import write_tiny_llama

PROMPT = "the cat of the dog and the"
SETTINGS = "-c 512 -b 64 -ub 64 -t 1"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("srvd")
    target = write_tiny_llama(d / "target.gguf", n_layer=4, layers_from=binary_weights())
    common = dict(target_layers=(1, 2, 3), own_output=True, block_size=6)
    return {
        "target": target,
        "dflash": write_tiny_dflash(d / "dflash.gguf", seed=6, output_weight=binary_head_output(), **common),
        "dspark": write_tiny_dflash(d / "dspark.gguf", seed=7, dspark=True, output_weight=rule_head_output(), **common),
    }


def run_json(*args):
    p = run_cli("run", "--prompt", PROMPT, "--max-tokens", "30", "--json", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


@pytest.fixture(scope="module")
def plain(models):
    return run_json("--model", str(models["target"]), "--strategy", "none")[0]["tokens"]


@pytest.mark.slow
def test_a_line_without_a_spec_type_runs_plain_decoding(models, plain):
    """The plainest server line (no --spec-type) once failed: the loop gave strategy none a draft_max knob."""
    s, cfg = session_from_server_args(f"llama-server -m {models['target']} {SETTINGS}")
    try:
        assert cfg.strategy == "none" and cfg.knobs == {}
        run = run_like_the_server(s, PROMPT, 30, cfg.strategy, cfg.knobs)
        assert run.tokens == plain and run.draft_n == run.verify_steps == 0
    finally:
        s.close()
    out, _ = run_json("--server-args", f"-m {models['target']} {SETTINGS}")
    assert out["tokens"] == plain and out["strategy"] == "none"


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_a_block_drafter_line_runs_through_the_servers_loop(models, plain, kind):
    line = f"llama-server -m {models['target']} --spec-type draft-{kind} -md {models[kind]} --spec-draft-n-max 2 "
    with pytest.warns(UserWarning, match="trained block"):  # specviz decodes the whole trained block
        s, cfg = session_from_server_args(line + SETTINGS)
    try:
        assert cfg.strategy == kind and cfg.knobs["draft_model"] == str(models[kind])
        assert (cfg.knobs["draft_max"], cfg.knobs["draft_min"], cfg.knobs["align"]) == (2, 0, False)
        run = run_like_the_server(s, PROMPT, 30, cfg.strategy, cfg.knobs)
        assert run.tokens == plain
        assert run.draft_n > run.draft_n_accepted > 0
        assert len(run.accepted_per_pos) == 2, run  # --spec-draft-n-max caps the block's drafted positions
        assert s.telemetry_dict()["dflash"]["kind"] == kind
    finally:
        s.close()


def test_a_chain_line_runs_both_members_through_the_servers_loop(models, plain):
    line = (
        f"-m {models['target']} --spec-type draft-dflash,ngram-map-k -md {models['dflash']} "
        f"--spec-ngram-map-k-size-n 2 --spec-ngram-map-k-size-m 4 {SETTINGS}"
    )
    with pytest.warns(UserWarning) as said:
        s, cfg = session_from_server_args(line)
    text = "\n".join(str(w.message) for w in said)
    assert "caps every member of a chain" in text and "ngram-map-k up to 4" in text  # llama.cpp caps dflash only
    assert "trained block" in text
    try:
        # llama.cpp's priority: the n-gram types before the model drafters, whatever order the line says
        assert cfg.strategy == "ngram-map-k,dflash"
        assert (cfg.knobs["size_n"], cfg.knobs["size_m"]) == (2, 4)
        assert cfg.knobs["draft_model"] == str(models["dflash"]) and cfg.knobs["draft_max"] == 3
        run = run_like_the_server(s, PROMPT, 30, cfg.strategy, cfg.knobs)
        assert run.tokens == plain and run.draft_n > 0
        by = s.telemetry_dict()["by_drafter"]
        # both members drafted (ngram-map-k first, dflash where it proposed nothing)
        assert set(by) == {"ngram-map-k", "dflash"} and all(v["drafted"] > 0 for v in by.values())
        assert sum(v["drafted"] for v in by.values()) == run.draft_n
    finally:
        s.close()


@pytest.mark.slow
def test_run_server_args_builds_what_the_clis_spec_type_builds(models, plain):
    """The same chain through ``--server-args`` and through the CLI's own flags: the same strategy and the
    same per-member knobs (a knob both members declare differently is set per member)."""
    flags = "--spec-type ngram-map-k,ngram-simple --spec-ngram-map-k-size-n 3 --spec-ngram-simple-size-n 2"
    via_line, err = run_json("--server-args", f"-m {models['target']} {flags} {SETTINGS}")
    via_cli, _ = run_json("--model", str(models["target"]), *flags.split())
    assert via_line["strategy"] == via_cli["strategy"] == "ngram-simple,ngram-map-k"
    for k in ("ngram_simple_size_n", "ngram_map_k_size_n", "ngram_simple_size_m", "ngram_map_k_size_m", "min_hits"):
        assert via_line["knobs"][k] == via_cli["knobs"][k], k
    assert "size_n" not in via_line["knobs"]
    assert via_line["tokens"] == via_cli["tokens"] == plain
    assert "drafts with" not in err  # the chain runs whole, nothing about a first type only


@pytest.mark.slow
def test_run_server_args_with_a_dflash_line(models, plain):
    out, err = run_json(
        "--server-args", f"-m {models['target']} --spec-type draft-dflash -md {models['dflash']} {SETTINGS}"
    )
    assert out["strategy"] == "dflash" and out["tokens"] == plain
    c = out["server_counts"]
    assert c["draft_n"] > c["draft_n_accepted"] > 0 and out["telemetry"]["dflash"]["kind"] == "dflash"
    # llama.cpp's --spec-draft-n-max default caps every block at 3 positions (specviz's own default is 16)
    assert len(c["accepted_per_pos"]) == 3, c
    assert "trained block" in err


def test_a_draft_model_alone_is_read_as_its_architecture_says(models):
    """Without --spec-type llama.cpp infers the type from the draft GGUF (common_speculative_types_from_gguf)."""
    assert parse_server_args(f"-md {models['dflash']}").strategy == "dflash"
    assert parse_server_args(f"-md {models['dspark']}").strategy == "dspark"
    assert parse_server_args(f"-md {models['target']}").strategy == "draft"
