"""The deployment's settings on the command line (-fa, -ctk, -ctv, -c, -b, -ub, -t) and ``run --server-args``:
checked before a model loads, honoured by the session, every flag not honoured named in a warning."""

from __future__ import annotations

import json

import pytest
from conftest import TINY
from test_cli import run_cli

from specviz.testing.tiny_models import write_tiny_llama

PROMPT = "1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2,"


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("cli-wide") / "wide.gguf", n_head=2, n_head_kv=1, **TINY)


@pytest.mark.parametrize(
    "args,words",
    [
        (
            ["-ctv", "q8_0", "-fa", "off"],
            "option -ctv/--cache-type-v: a quantized V cache (q8_0) needs flash attention",
        ),
        (["-ctk", "q9"], "option -ctk/--cache-type-k: 'q9' is not a KV cache type"),
        (["-fa", "maybe"], "option -fa/--flash-attn: 'maybe' is not allowed"),
        (["-b", "64", "-ub", "128"], "option -ub/--ubatch-size: 128 is larger than n_batch"),
        (["-t", "0"], "option -t/--threads: 0 is outside"),
        (["-c", "4"], "option --n-ctx: '4' is not allowed"),
    ],
)
@pytest.mark.slow
def test_a_bad_setting_is_refused_before_a_model_loads(args, words):
    p = run_cli("run", "--prompt", "x", "--model", "/nonexistent.gguf", *args)
    assert p.returncode == 2 and words in p.stderr, p.stderr


def test_a_cache_type_the_models_heads_do_not_fit_is_refused_from_its_header(tiny_model_path):
    p = run_cli("run", "--prompt", "x", "--model", str(tiny_model_path), "-ctk", "q8_0")
    assert p.returncode == 2 and "option -ctk/--cache-type-k" in p.stderr and "head size 16" in p.stderr


@pytest.mark.slow
def test_settings_reach_the_session(wide):
    p = run_cli(
        "run", "--model", str(wide), "--prompt", PROMPT, "--max-tokens", "12", "--json",
        "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-c", "512", "-b", "64", "-ub", "32", "-t", "1",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["settings"] == {
        "n_ctx": 512, "n_batch": 64, "n_ubatch": 32, "n_threads": 1,
        "flash_attn": "on", "cache_type_k": "q8_0", "cache_type_v": "q8_0",
    }  # fmt: skip
    assert len(out["tokens"]) == 12


@pytest.mark.slow
def test_run_server_args_runs_the_lines_configuration(wide):
    line = (
        f"llama-server -m {wide} --spec-type ngram-map-k4v --spec-ngram-map-k4v-size-n 2 -fa off -c 512 -np 4 --metrics"
    )
    p = run_cli("run", "--prompt", PROMPT, "--max-tokens", "24", "--json", "--server-args", line)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["settings"]["flash_attn"] == "off" and out["settings"]["n_ctx"] == 512
    assert out["knobs"]["size_n"] == 2 and out["knobs"]["size_m"] == 48 and out["knobs"]["align"] is False
    assert out["strategy"] == "ngram-map-k4v" and len(out["tokens"]) == 24
    assert set(out["server_counts"]) == {"draft_n", "draft_n_accepted", "verify_steps", "accepted_per_pos"}
    assert "--server-args --metrics: serving only" in p.stderr and "-np 4" not in p.stderr  # -np applied:
    assert out["n_parallel"] == 4 and out["n_ctx_seq"] == 256  # a batch of one, in its slot's share of -c
    p = run_cli("run", "--prompt", PROMPT, "--max-tokens", "8", "--server-args", line)
    assert p.returncode == 0 and "as llama-server counts it: draft_n = " in p.stderr


@pytest.mark.parametrize(
    "extra,flag",
    [
        (["--strategy", "ngram-mod"], "--strategy"),
        (["-fa", "on"], "-fa"),
        (["--size-n", "3"], "--size-n"),
        (["-c", "64"], "--n-ctx"),
    ],
)
@pytest.mark.slow
def test_server_args_refuse_options_that_set_the_same(wide, extra, flag):
    p = run_cli("run", "--prompt", "x", "--server-args", f"-m {wide} --spec-type ngram-simple", *extra)
    assert p.returncode == 2 and f"option {flag} conflicts with --server-args" in p.stderr


@pytest.mark.slow
def test_server_args_values_are_checked(wide):
    p = run_cli("run", "--prompt", "x", "--server-args", f"-m {wide} -ctv q8_0 -fa off")
    assert p.returncode == 2 and "needs flash attention" in p.stderr
    p = run_cli("run", "--prompt", "x", "--server-args", "-m /nonexistent.gguf")
    assert p.returncode == 2 and "--server-args -m" in p.stderr
    p = run_cli("run", "--prompt", "x", "--model", str(wide), "--server-args", "-m /other.gguf")
    assert p.returncode == 2 and "conflicts with the model of --server-args" in p.stderr


@pytest.mark.slow
def test_gpu_layers_reach_the_session_and_a_cpu_build_says_nothing_is_offloaded(wide):
    from specviz.backends.devices import gpu_devices

    p = run_cli("run", "--model", str(wide), "--prompt", PROMPT, "--max-tokens", "6", "--json", "-ngl", "99")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["n_gpu_layers"] == 99
    if not gpu_devices():  # this build (the CPU one of `make test`): llama.cpp runs the layers on the CPU
        assert "option -ngl 99 is accepted but puts nothing on a GPU" in p.stderr, p.stderr
    p = run_cli("run", "--model", str(wide), "--prompt", PROMPT, "--max-tokens", "6", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["n_gpu_layers"] == 0
    assert "-ngl" not in p.stderr


@pytest.mark.parametrize("command", ["run", "verify", "serve"])
@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_gpu_layer_count_is_refused_before_a_model_loads(wide, command, value):
    extra = ["--prompt", "x"] if command != "serve" else ["--port", "5999"]  # refused before it serves
    p = run_cli(command, "--model", str(wide), *extra, "--n-gpu-layers", value)
    assert p.returncode == 2 and "option -ngl" in p.stderr and repr(value) in p.stderr, p.stderr


@pytest.mark.slow
def test_the_server_lines_gpu_layers_reach_the_session_unless_the_option_gives_another(wide):
    from specviz.backends.devices import auto_gpu_layers

    def placed(line: str, *extra: str) -> tuple[int, str]:
        p = run_cli("run", "--prompt", PROMPT, "--max-tokens", "4", "--json", "--server-args", line, *extra)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["n_gpu_layers"], p.stderr

    n, err = placed(f"-m {wide} -ngl 7")
    assert n == 7 and "serving only" not in err
    assert placed(f"-m {wide} -ngl 7", "-ngl", "7")[0] == 7  # the same placement twice is one
    assert placed(f"-m {wide}")[0] == auto_gpu_layers()  # llama-server's default, auto
    assert placed(f"-m {wide}", "-ngl", "all")[0] == 999
    p = run_cli("run", "--prompt", "x", "--server-args", f"-m {wide} -ngl 7", "-ngl", "3")
    assert p.returncode == 2 and "option -ngl 3 conflicts with the --server-args line's -ngl 7" in p.stderr, p.stderr
