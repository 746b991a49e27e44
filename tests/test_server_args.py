"""A llama-server command line read into specviz's configuration (specviz.analysis.server_args), and the
context settings' rules (specviz.backends.context_settings). No model is loaded here."""

from __future__ import annotations

import pytest

from specviz.analysis.server_args import (
    LLAMA_DRAFT_DEFAULTS,
    parse_server_args,
    server_spec_args,
)
from specviz.backends.context_settings import CACHE_TYPES, ContextSettings, flash_attn_mode, head_sizes
from specviz.errors import KnobError, StrategyError

DEPLOYMENT = (
    "llama-server -m /models/target.gguf --spec-type ngram-map-k4v --spec-ngram-map-k4v-size-n 3 "
    "--spec-ngram-map-k4v-size-m 8 -c 8192 -b 1024 -ub 256 -fa on -ctk q8_0 -ctv q8_0 -t 4 "
    "-np 4 --port 8080 --host 0.0.0.0 --metrics --min-p 0.1 --frobnicate 3"
)


def test_a_deployment_line_becomes_the_strategy_knobs_and_settings():
    c = parse_server_args(DEPLOYMENT)
    assert c.model == "/models/target.gguf"
    assert c.strategy == "ngram-map-k4v"
    assert (c.knobs["size_n"], c.knobs["size_m"], c.knobs["min_hits"]) == (3, 8, 1)
    assert c.settings == ContextSettings(
        n_ctx=8192, n_batch=1024, n_ubatch=256, n_threads=4, flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0"
    )
    assert set(c.given) == {"n_ctx", "n_batch", "n_ubatch", "n_threads", "flash_attn", "cache_type_k", "cache_type_v"}


def test_every_flag_specviz_does_not_honour_is_named_in_a_warning():
    c = parse_server_args(DEPLOYMENT)
    text = "\n".join(c.warnings)
    for flag in ("--port 8080", "--host 0.0.0.0", "--metrics", "--min-p 0.1", "--frobnicate 3"):
        assert flag in text, flag
    assert len(c.warnings) == 5
    # and what was honoured is not warned about (-np: the slots a request log runs in)
    for flag in ("-ctk", "-fa", "--spec-ngram-map-k4v-size-n", "-m ", "-np"):
        assert flag not in text
    assert c.n_parallel == 4


def test_an_ngram_type_drafts_up_to_its_own_length_without_alignment():
    """llama.cpp's --spec-draft-n-max caps model drafts only; verify-tile alignment is specviz's own."""
    c = parse_server_args("--spec-type ngram-simple --spec-ngram-simple-size-m 40 --spec-draft-n-max 4")
    assert c.knobs["draft_max"] == 40 and c.knobs["align"] is False and c.knobs["draft_policy"] == "fixed"
    assert any("--spec-draft-n-max 4" in w and "model drafts only" in w for w in c.warnings)
    assert parse_server_args("--spec-type ngram-cache").knobs["draft_max"] == 8
    assert parse_server_args("--spec-type ngram-mod --spec-ngram-mod-n-max 20").knobs["draft_max"] == 20


def test_a_model_draft_takes_llama_cpps_defaults_not_specvizs():
    c = parse_server_args(["-m", "t.gguf", "-md", "d.gguf", "--spec-type", "draft-simple"])
    assert c.strategy == "draft" and c.knobs["draft_model"] == "d.gguf"
    assert {k: c.knobs[k] for k in LLAMA_DRAFT_DEFAULTS} == {"draft_max": 3, "draft_min": 0, "draft_p_min": 0.0}
    assert c.warnings == []
    c = parse_server_args("-md d.gguf --spec-draft-n-max 6 --spec-draft-n-min 2 --spec-draft-p-min 0.4")
    assert c.strategy == "draft"  # a draft model without --spec-type: llama.cpp infers the type
    assert (c.knobs["draft_max"], c.knobs["draft_min"], c.knobs["draft_p_min"]) == (6, 2, 0.4)
    assert any("top 10 candidates" in w for w in c.warnings)  # p_min is measured differently


def test_several_spec_types_make_a_chain_in_llama_cpps_priority_order():
    c = parse_server_args("--spec-type ngram-mod,ngram-simple")
    assert c.strategy == "ngram-simple,ngram-mod" and c.warnings == []
    # each n-gram member drafts up to its own length, so the chain's cap is the longest of them
    assert c.knobs["draft_max"] == 64 and c.knobs["align"] is False and c.knobs["draft_policy"] == "fixed"
    # a repeated --spec-type adds its types, as llama.cpp's parser does; a "none" value adds nothing
    assert parse_server_args("--spec-type ngram-mod --spec-type ngram-simple").strategy == "ngram-simple,ngram-mod"
    assert parse_server_args("--spec-type ngram-mod --spec-type none").strategy == "ngram-mod"
    assert parse_server_args("--spec-type none,ngram-mod").strategy == "none"  # llama.cpp: none in a list


def test_a_chains_per_type_flags_set_each_members_own_knob():
    c = parse_server_args(
        "--spec-type ngram-simple,ngram-map-k --spec-ngram-map-k-size-n 3 --spec-ngram-simple-size-n 2 "
        "--spec-ngram-simple-size-m 6 --spec-ngram-mod-n-max 9"
    )
    assert (c.knobs["ngram_simple_size_n"], c.knobs["ngram_map_k_size_n"], c.knobs["ngram_simple_size_m"]) == (2, 3, 6)
    assert c.knobs["draft_max"] == 48  # ngram-map-k's own size_m
    assert [w for w in c.warnings if "not applied" in w] == [
        "--spec-ngram-mod-n-max 9: for --spec-type ngram-mod, not ngram-simple,ngram-map-k; not applied"
    ]
    with pytest.raises(KnobError, match="--spec-ngram-map-k-size-n"):
        parse_server_args("--spec-type ngram-map-k,ngram-simple --spec-ngram-map-k-size-n 0")


def test_a_chain_with_a_model_drafter_names_where_it_departs():
    c = parse_server_args("-md d.gguf --spec-type draft-simple,ngram-mod --spec-draft-n-min 2")
    assert c.strategy == "ngram-mod,draft" and c.knobs["draft_model"] == "d.gguf"
    assert (c.knobs["draft_max"], c.knobs["draft_min"], c.knobs["n_max"]) == (3, 2, 64)
    text = "\n".join(c.warnings)
    assert "caps every member of a chain at --spec-draft-n-max 3" in text and "ngram-mod up to 64" in text
    assert "--spec-draft-n-min 2: specviz applies it to whichever member drafts" in text


def test_block_drafters_are_read_with_llama_cpps_defaults():
    c = parse_server_args("-m t.gguf --spec-type draft-dflash -md f.gguf")
    assert c.strategy == "dflash" and c.knobs["draft_model"] == "f.gguf"
    assert {k: c.knobs[k] for k in LLAMA_DRAFT_DEFAULTS} == {"draft_max": 3, "draft_min": 0, "draft_p_min": 0.0}
    assert c.knobs["align"] is False and c.knobs["draft_policy"] == "fixed"
    assert len(c.warnings) == 1 and "trained block" in c.warnings[0]  # specviz decodes the whole block
    c = parse_server_args("--spec-type draft-dspark --spec-draft-p-min 0.5 --spec-draft-n-max 8")
    assert c.strategy == "dspark" and (c.knobs["draft_max"], c.knobs["draft_p_min"]) == (8, 0.5)
    assert any("without -md: llama-server leaves draft-dspark out" in w for w in c.warnings)
    assert not any("top 10 candidates" in w for w in c.warnings)  # dspark's p_min is its confidence head's


def test_a_knob_for_another_type_is_named():
    c = parse_server_args("--spec-type ngram-simple --spec-ngram-mod-n-max 9")
    assert any(w.startswith("--spec-ngram-mod-n-max 9") and "not applied" in w for w in c.warnings)


@pytest.mark.parametrize(
    "line,flag",
    [
        ("-ctk q7_0", "-ctk"),
        ("--cache-type-v nope", "--cache-type-v"),
        ("-fa sometimes", "-fa"),
        ("-c many", "-c"),
        ("-b 256 -ub 512", "-ub"),
        ("-ctv q8_0 -fa off", "-ctv"),
        ("--spec-type ngram-simple --spec-ngram-simple-size-n 0", "--spec-ngram-simple-size-n"),
        ("-t 0", "-t"),
        ("--temp hot", "--temp"),
    ],
)
def test_a_bad_value_is_refused_naming_the_flag(line, flag):
    with pytest.raises(KnobError) as e:
        parse_server_args(line)
    assert flag in str(e.value)


@pytest.mark.parametrize(
    "line,match",
    [
        ("--spec-type draft-medusa", "'draft-medusa' is not one of llama.cpp's types"),
        ("--spec-type draft", "'draft' is not one of llama.cpp's types"),  # specviz's name, not llama.cpp's
        ("--spec-type ngram-mod,prompt-lookup", "'prompt-lookup' is not one of"),
        ("--spec-type ngram-mod,", "'' is not one of"),
        ("--spec-type draft-simple,draft-mtp", "--spec-type draft-simple,draft-mtp: .*at most one"),
        ("--spec-type draft-eagle3 --spec-type draft-dflash", "--spec-type draft-eagle3,draft-dflash: .*at most one"),
    ],
)
def test_a_type_or_chain_specviz_does_not_run_is_refused(line, match):
    with pytest.raises(StrategyError, match=match):
        parse_server_args(line)


def test_the_program_name_and_equals_spellings_are_read():
    c = parse_server_args(["/opt/bin/llama-server", "--ctx-size=2048", "--flash-attn=off", "-ctk", "bf16"])
    assert (c.settings.n_ctx, c.settings.flash_attn, c.settings.cache_type_k) == (2048, "off", "bf16")
    assert c.warnings == []


def test_threads_batch_different_from_threads_is_named():
    assert any(w.startswith("-tb 8") for w in parse_server_args("-t 4 -tb 8").warnings)
    assert parse_server_args("-t 4 -tb 4").warnings == []


def test_sampling_and_length_defaults_are_read():
    c = parse_server_args("--temp 0 --top-k 5 --top-p 0.9 -s 7 -n 64 --chat-template chatml")
    assert c.sampling == {"temperature": 0.0, "top_k": 5, "top_p": 0.9, "seed": 7}
    assert c.n_predict == 64 and c.chat_template == "chatml"


@pytest.mark.parametrize(
    "strategy,knobs",
    [
        ("ngram-simple", {"size_n": 2, "size_m": 6}),
        ("ngram-map-k", {"size_n": 3, "size_m": 5, "min_hits": 2}),
        ("ngram-map-k4v", {"size_n": 1, "size_m": 4, "min_hits": 1}),
        ("ngram-mod", {"n_match": 4, "n_min": 2, "n_max": 12}),
        ("ngram-cache", {}),
        ("none", {}),
    ],
)
def test_server_spec_args_read_back_give_the_same_knobs(strategy, knobs):
    c = parse_server_args(server_spec_args(strategy, knobs))
    assert c.strategy == strategy and c.warnings == []
    assert {k: c.knobs[k] for k in knobs} == knobs


@pytest.mark.parametrize(
    "strategy,knobs",
    [
        ("ngram-simple,ngram-mod", {"size_n": 2, "size_m": 6, "n_max": 20}),
        ("ngram-simple,ngram-map-k", {"ngram_simple_size_n": 2, "ngram_map_k_size_n": 3, "min_hits": 2}),
        ("ngram-map-k4v,ngram-cache", {"size_m": 5}),
    ],
)
def test_server_spec_args_of_a_chain_read_back_give_the_same_knobs(strategy, knobs):
    c = parse_server_args(server_spec_args(strategy, knobs))
    assert c.strategy == strategy and c.warnings == []
    assert {k: c.knobs[k] for k in knobs} == knobs


def test_server_spec_args_of_a_chain_with_a_block_drafter():
    knobs = {"draft_model": "f.gguf", "draft_max": 6, "n_match": 3}
    args = server_spec_args("ngram-mod,dflash", knobs)
    assert args[:4] == ["--spec-type", "ngram-mod,draft-dflash", "-md", "f.gguf"]
    c = parse_server_args(args)
    assert c.strategy == "ngram-mod,dflash" and {k: c.knobs[k] for k in knobs} == knobs
    with pytest.raises(StrategyError, match="prompt-lookup"):
        server_spec_args("ngram-mod,prompt-lookup", {})


def test_server_spec_args_of_a_model_draft():
    args = server_spec_args("draft", {"draft_model": "d.gguf", "draft_max": 5, "draft_min": 1, "draft_p_min": 0.25})
    assert args == [
        "--spec-type",
        "draft-simple",
        "-md",
        "d.gguf",
        "--spec-draft-n-max",
        "5",
        "--spec-draft-n-min",
        "1",
        "--spec-draft-p-min",
        "0.25",
    ]
    with pytest.raises(StrategyError, match="prompt-lookup"):
        server_spec_args("prompt-lookup", {})
    with pytest.raises(KnobError, match="n_draft"):
        server_spec_args("ngram-cache", {"n_draft": 4})


# -- the context settings ----------------------------------------------------------------------------


def test_flash_attn_takes_llama_cpps_spellings():
    assert [flash_attn_mode(v) for v in ("on", "enabled", "1", "true", "OFF", "0", "auto", True, False)] == [
        "on",
        "on",
        "on",
        "on",
        "off",
        "off",
        "auto",
        "on",
        "off",
    ]
    with pytest.raises(KnobError, match="on, off or auto"):
        flash_attn_mode("maybe")


def test_a_quantized_v_cache_needs_flash_attention_and_auto_allows_it():
    with pytest.raises(KnobError, match="needs flash attention"):
        ContextSettings.make(cache_type_v="q4_0", flash_attn="off")
    s = ContextSettings.make(cache_type_v="q4_0")  # auto: llama.cpp turns flash attention on
    assert s.v_needs_flash_attn
    # a quantized K alone is fine without flash attention
    assert ContextSettings.make(cache_type_k="q8_0", flash_attn="off").cache_type_k == "q8_0"


def test_a_refused_setting_changes_nothing():
    base = ContextSettings.make(n_ctx=2048, flash_attn="on")
    with pytest.raises(KnobError):
        ContextSettings.make(base, n_ctx=1024, cache_type_k="q9")
    assert base == ContextSettings.make(n_ctx=2048, flash_attn="on")
    with pytest.raises(KnobError, match="unknown context setting 'swa'"):
        ContextSettings.make(swa=True)


def test_quantized_blocks_must_divide_the_head_size():
    s = ContextSettings.make(cache_type_k="q8_0", cache_type_v="q4_0", flash_attn="on")
    s.check_model(head_k=32, head_v=64)
    with pytest.raises(KnobError, match="head size 16"):
        s.check_model(head_k=16, head_v=64)
    with pytest.raises(KnobError, match="cache_type_v"):
        s.check_model(head_k=32, head_v=48)
    ContextSettings.make(cache_type_k="f16").check_model(head_k=16, head_v=16)  # not quantized: any size
    assert all(b in (1, 32) for b in CACHE_TYPES.values())


def test_head_sizes_from_metadata():
    assert head_sizes({"llama.embedding_length": 64, "llama.attention.head_count": 4}, "llama") == (16, 16)
    meta = {"gemma3.embedding_length": 640, "gemma3.attention.head_count": 4, "gemma3.attention.key_length": 256}
    assert head_sizes(meta, "gemma3") == (256, 256)


def test_settings_as_server_args():
    s = ContextSettings.make(n_ctx=1024, n_threads=2, flash_attn="off", cache_type_k="q8_0")
    args = s.server_args()
    assert args[args.index("-c") + 1] == "1024" and args[args.index("-fa") + 1] == "off"
    assert args[args.index("-t") + 1] == "2" and args[args.index("-tb") + 1] == "2"
    assert s.server_args(include_defaults=False) == ["-c", "1024", "-t", "2", "-tb", "2", "-fa", "off", "-ctk", "q8_0"]
    assert parse_server_args(args).settings == s


def test_the_servers_sliding_window_cache_and_prompt_layout_are_honoured():
    """--swa-full changes a greedy text's numerics (it is no serving option): the session gets it, and
    the server's prompt layout, from the line; without it the server's ring."""
    ring = parse_server_args("llama-server --spec-type ngram-simple")
    full = parse_server_args("llama-server --spec-type ngram-simple --swa-full")
    assert (ring.swa_full, full.swa_full) == (False, True)
    assert not any("--swa-full" in w for w in full.warnings)
    assert full.session_kwargs()["swa_full"] is True and ring.session_kwargs()["swa_full"] is False
    assert ring.session_kwargs()["prefill"] == full.session_kwargs()["prefill"] == "whole"
    assert full.to_dict()["swa_full"] is True


def test_a_recording_of_the_other_prompt_layout_is_noted_in_the_server_check():
    from specviz.analysis.check_server import prefill_notes

    assert prefill_notes("whole") == [] and prefill_notes(None) == []
    (note,) = prefill_notes("all-but-last")
    assert "near-tie" in note and "--server-args" in note


@pytest.mark.parametrize(
    ("line", "want", "text"),
    [
        ("-ngl 12", 12, "12"),
        ("--n-gpu-layers=0", 0, "0"),
        ("--gpu-layers all", 999, "all"),
        ("-ngl auto", None, "auto"),
        ("", None, None),
    ],
)
def test_the_lines_gpu_layers_are_the_sessions_placement(line, want, text):
    """-ngl places the model as llama.cpp does (no serving option: a GPU's kernels change the numerics).
    Without it, or with auto, llama-server's default: every layer on a GPU build, none on this CPU build."""
    from specviz.backends.devices import auto_gpu_layers

    c = parse_server_args(f"llama-server -m m.gguf {line}")
    assert (c.n_gpu_layers, c.gpu_layers_text) == (want, text)
    assert c.session_kwargs()["n_gpu_layers"] == (auto_gpu_layers() if want is None else want)
    assert not any(w.startswith("-ngl") or "gpu-layers" in w for w in c.warnings if "auto" not in line)
    assert c.to_dict()["n_gpu_layers"] == want


def test_auto_gpu_layers_is_every_layer_on_a_gpu_build_and_none_on_a_cpu_build():
    from specviz.backends.devices import ALL_GPU_LAYERS, auto_gpu_layers, gpu_devices

    assert auto_gpu_layers() == (ALL_GPU_LAYERS if gpu_devices() else 0)
    c = parse_server_args("llama-server -ngl auto")
    assert any(w.startswith("-ngl auto: specviz puts every layer") for w in c.warnings), c.warnings


@pytest.mark.parametrize("value", ["-1", "many", "1.5", str((1 << 16) + 1)])
def test_a_bad_gpu_layer_count_in_the_line_is_refused_naming_the_flag(value):
    with pytest.raises(KnobError, match=rf"llama-server option -ngl: '{value}' is not allowed") as e:
        parse_server_args(f"llama-server -ngl {value}")
    assert e.value.knob == "n_gpu_layers"
    with pytest.raises(KnobError, match=rf"llama-server option -ngld: '{value}' is not allowed"):
        parse_server_args(f"llama-server -ngl 4 -ngld {value}")


def test_a_draft_placement_other_than_the_targets_is_named():
    """specviz puts a draft model where the target is: a different -ngld is named, the same one is not."""
    c = parse_server_args("llama-server -m t.gguf -md d.gguf -ngl 99 -ngld 0")
    assert any(w.startswith("-ngld 0: specviz puts a draft model where the target is (-ngl 99)") for w in c.warnings)
    c = parse_server_args("llama-server -m t.gguf -md d.gguf -ngl all --spec-draft-ngl all")
    assert not any("ngl" in w for w in c.warnings), c.warnings
