"""The specviz command: validation before any model loads, --json output, verify verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specviz.cli import main as cli


def run_cli(*args, env=None):
    """Run the real console entry point in a subprocess (no model hub, no network)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "specviz.cli", *args], capture_output=True, text=True, env=e, timeout=300
    )


BAD_OPTIONS = [
    (["run", "--prompt", "x", "--max-tokens", "0"], "--max-tokens", "'0'"),
    (["run", "--prompt", "x", "--max-tokens", "lots"], "--max-tokens", "'lots'"),
    (["run", "--prompt", "x", "--strategy", "magic"], "--strategy", "'magic'"),
    (["run", "--prompt", "x", "--draft-max", "0"], "--draft-max", "[1, 1024]"),
    (["run", "--prompt", "x", "--num-draft-tokens", "2000"], "--draft-max", "[1, 1024]"),
    (["run", "--prompt", "x", "--prompt-lookup", "0"], "--prompt-lookup", "[1, 64]"),
    (["run", "--prompt", "x", "--prompt-lookup", "--prompt-lookup-min-ngram", "0"], "--min-ngram", "[1, 64]"),
    (["run", "--prompt", "x", "--prompt-lookup", "2", "--prompt-lookup-min-ngram", "3"], "min_ngram", "max_ngram"),
    (["run", "--prompt", "x", "--strategy", "ngram-simple", "--size-n", "0"], "--size-n", "[1, 1024]"),
    (["run", "--prompt", "x", "--seed", "-4"], "--seed", "'-4'"),
    (["run", "--prompt", "x", "--model", "/nonexistent/model.gguf"], "--model", "does not exist"),
    (["run", "--prompt-file", "/nonexistent/prompt.txt"], "--prompt-file", "not a readable file"),
    (["run"], "--prompt", "required"),
    (["run", "--prompt", "x", "--prompt-file", "y"], "--prompt-file", "not allowed with"),
    (["run", "--prompt", "x", "--frobnicate"], "--frobnicate", "unrecognized"),
    (["verify", "--prompt", "x", "--threshold", "-1"], "--threshold", "'-1'"),
    (["run", "--prompt", "x", "--strategy", "none", "--prompt-lookup"], "--prompt-lookup", "conflicts"),
    (["run", "--prompt", "x", "--temperature", "0.7", "--greedy"], "--temperature", "--greedy"),
    (["run", "--prompt", "x", "--top-k", "5", "--greedy"], "--top-k", "--greedy"),
    (["verify", "--prompt", "x", "--temperature", "0.7"], "--temperature", "specviz verify"),
    (["run", "--prompt", "x", "--temperature", "-1"], "--temperature", "[0, 100]"),
    (["run", "--prompt", "x", "--temperature", "hot"], "--temperature", "'hot'"),
    (["run", "--prompt", "x", "--top-p", "0"], "--top-p", "(0, 1]"),
    (["run", "--prompt", "x", "--top-k", "-3"], "--top-k", "-3"),
    (["run", "--prompt", "x", "--draft-model", "/nonexistent.gguf"], "--draft-model", "does not exist"),
    (
        ["run", "--prompt", "x", "--draft-model", "/nonexistent.gguf", "--prompt-lookup"],
        "--draft-model",
        "--prompt-lookup",
    ),
    (["run", "--prompt", "x", "--strategy", "draft"], "--draft-model", "needs a draft model"),
    (
        ["run", "--prompt", "x", "--strategy", "draft", "--draft-model", "/", "--draft-p-min", "2"],
        "--draft-p-min",
        "[0, 1]",
    ),
    (
        ["run", "--prompt", "x", "--adaptive-draft-count", "--draft-policy", "cost"],
        "--adaptive-draft-count",
        "--draft-policy",
    ),
    (["run", "--prompt", "x", "--draft-policy", "sometimes"], "--draft-policy", "fixed, adaptive, cost"),
    (["run", "--prompt", "x", "--spec-type", "magic"], "--spec-type", "'magic'"),
    # a comma list is a chain of drafters (issue 24); one that cannot be built is refused
    (["run", "--prompt", "x", "--spec-type", "ngram-mod,magic"], "--spec-type", "'magic' is not one"),
    (["run", "--prompt", "x", "--spec-type", "draft-simple,draft-eagle3"], "--spec-type", "at most one"),
    (["run", "--prompt", "x", "--spec-type", "ngram-simple,ngram-map-k", "--size-n", "2"], "--size-n", "each have"),
    (["run", "--prompt", "x", "--spec-type", "ngram-mod", "--strategy", "none"], "--spec-type", "conflicts"),
    (["run", "--prompt", "x", "--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "0"], "--size-n", "[1, 1024]"),
    (
        ["run", "--prompt", "x", "--spec-type", "ngram-simple", "--size-n", "3", "--spec-ngram-simple-size-n", "2"],
        "--spec-ngram-simple-size-n",
        "conflicts",
    ),
    (["run", "--prompt", "x", "--spec-draft-n-max", "0"], "--draft-max", "[1, 1024]"),
    (["run", "--prompt", "x", "--draft-min", "9", "--draft-max", "4"], "--draft-min", "9 is larger than draft_max=4"),
    (["bench", "--kinds", "poetry"], "--kinds", "'poetry'"),
    (["bench", "--strategies", "draft"], "--strategies", "'draft'"),
    (["bench", "--repeats", "0"], "--repeats", "'0'"),
    (["bench", "--draft-policy", "greedy"], "--draft-policy", "fixed, adaptive, cost"),
    (["derive-draft", "/nonexistent.gguf", "--keep-layers", "0-3", "-o", "/tmp/x.gguf"], "TARGET", "does not exist"),
]


@pytest.mark.parametrize("argv,option,detail", BAD_OPTIONS)
def test_bad_options_exit_2_with_one_line_before_loading(argv, option, detail, tmp_path, capsys):
    # in-process: a bad option must never reach model loading, so poison the embedded model lookup
    import specviz.models.embedded as models

    orig = models.default_model_path
    models.default_model_path = lambda: (_ for _ in ()).throw(AssertionError("model loaded"))
    try:
        code = cli.main(argv)
    finally:
        models.default_model_path = orig
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    assert option in err and detail in err, err


def test_bad_option_in_a_real_subprocess_has_no_traceback():
    p = run_cli("run", "--prompt", "x", "--draft-max", "5000")
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0
    assert "--draft-max" in p.stderr and "5000" in p.stderr and "[1, 1024]" in p.stderr


@pytest.mark.slow
def test_run_json_on_a_tiny_model(tiny_model_path):
    p = run_cli(
        "run",
        "--model",
        str(tiny_model_path),
        "--prompt",
        "the a the a the a",
        "--max-tokens",
        "24",
        "--prompt-lookup",
        "3",
        "--prompt-lookup-min-ngram",
        "1",
        "--num-draft-tokens",
        "5",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["strategy"] == "prompt-lookup"
    assert out["knobs"] == {
        "draft_max": 5,
        "draft_min": 0,
        "max_ngram": 3,
        "min_ngram": 1,
        "draft_policy": "fixed",
        "align": True,
        "verify_tile": 4,
    }
    assert len(out["tokens"]) == 24 and out["finish_reason"] == "max_tokens"
    assert isinstance(out["text"], str) and out["prompt_tokens"] > 0
    t = out["telemetry"]
    for key in (
        "rounds",
        "drafted",
        "accepted",
        "acceptance_rate",
        "mean_accepted_length",
        "per_position_acceptance",
        "draft_seconds",
        "verify_seconds",
        "seconds",
        "tokens_per_second",
    ):
        assert key in t, key
    assert t["accepted"] <= t["drafted"]
    assert t["tokens_per_second"] == pytest.approx(24 / t["seconds"])
    st = t["strategy_stats"]
    for key in (
        "calls",
        "drafts_generated",
        "drafts_accepted",
        "tokens_generated",
        "tokens_accepted",
        "begin_seconds",
        "draft_seconds",
        "accept_seconds",
    ):
        assert key in st, key
    assert st["tokens_generated"] == t["drafted"] and st["tokens_accepted"] == t["accepted"]


@pytest.mark.slow
def test_knob_of_another_strategy_is_warned_not_applied(tiny_model_path):
    p = run_cli(
        "run",
        "--model",
        str(tiny_model_path),
        "--prompt",
        "the a",
        "--max-tokens",
        "4",
        "--strategy",
        "prompt-lookup",
        "--size-n",
        "3",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    assert "--size-n" in p.stderr and "not applied" in p.stderr
    assert "size_n" not in json.loads(p.stdout)["knobs"]


@pytest.mark.slow
def test_prompt_file_and_text_output(tiny_model_path, tmp_path):
    pf = tmp_path / "p.txt"
    pf.write_text("the a the a the a")
    p = run_cli(
        "run",
        "--model",
        str(tiny_model_path),
        "--prompt-file",
        str(pf),
        "--max-tokens",
        "8",
        "--strategy",
        "ngram-simple",
        "--size-n",
        "2",
        "--size-m",
        "4",
    )
    assert p.returncode == 0, p.stderr
    assert "acceptance" in p.stderr and "tokens/s" in p.stderr
    assert "statistics ngram-simple: #calls = " in p.stderr and "#acc tokens = " in p.stderr


@pytest.mark.parametrize("strategy", ["prompt-lookup", "ngram-simple"])
@pytest.mark.slow
def test_verify_on_tiny_model_is_identical(tiny_model_path, strategy):
    p = run_cli(
        "verify",
        "--model",
        str(tiny_model_path),
        "--strategy",
        strategy,
        "--prompt",
        "the a of the a of",
        "--max-tokens",
        "40",
        "--json",
        "--size-n",
        "2",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["verdict"] == "identical"


def test_verify_reports_a_mismatch_when_drafting_is_broken(tiny_session, monkeypatch):
    """A deliberately broken acceptor must be caught: verify can fail."""
    import dataclasses

    from specviz.analysis.equivalence import check_equivalence
    from specviz.decoding import round as round_mod
    from specviz.decoding.rowscan import ScoredRow

    orig = round_mod.accept

    def broken(draft, rows, params, rng, draft_dists=None, **kw):
        v = orig(draft, rows, params, rng, draft_dists, **kw)
        n = v.n_accepted
        if draft and n < len(draft):
            # accept one token the target refused: commit the draft token instead of the correction
            extra = ScoredRow(rows(n + 1)).best
            return dataclasses.replace(v, n_accepted=n + 1, tokens=(*draft[: n + 1], extra), probs=(*v.probs, 1.0))
        return v

    monkeypatch.setattr(round_mod, "accept", broken)
    res = check_equivalence(
        tiny_session,
        "the a of the a of the cat",
        40,
        "prompt-lookup",
        {"max_ngram": 2, "min_ngram": 1, "draft_max": 4, "draft_min": 0},
    )
    assert res["verdict"] == "mismatch"
    assert res["divergence"]["plain_margin"] is not None


@pytest.mark.slow
def test_sampling_run_is_reproducible_and_warns_about_unapplied_options(tiny_model_path):
    args = (
        "run",
        "--model",
        str(tiny_model_path),
        "--prompt",
        "the a the a",
        "--max-tokens",
        "20",
        "--strategy",
        "ngram-simple",
        "--size-n",
        "2",
        "--temperature",
        "0.9",
        "--top-k",
        "40",
        "--seed",
        "5",
        "--json",
    )
    a, b = run_cli(*args), run_cli(*args)
    assert a.returncode == 0, a.stderr
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert ja["tokens"] == jb["tokens"] and ja["seed"] == 5
    assert ja["sampling"] == {"temperature": 0.9, "top_k": 40, "top_p": 1.0}
    g = run_cli(
        "run",
        "--model",
        str(tiny_model_path),
        "--prompt",
        "the a",
        "--max-tokens",
        "4",
        "--top-p",
        "0.5",
        "--seed",
        "3",
        "--json",
    )
    assert g.returncode == 0, g.stderr
    assert "--top-p is accepted but not applied" in g.stderr and "--seed is accepted but not applied" in g.stderr


@pytest.mark.slow
def test_derive_draft_and_run_with_it(tiny_model_path, tmp_path):
    from specviz.testing.tiny_models import write_tiny_llama

    four = write_tiny_llama(tmp_path / "four.gguf", n_layer=4, seed=2)
    out = tmp_path / "draft.gguf"
    p = run_cli("derive-draft", str(four), "--keep-layers", "0,2", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert out.is_file()
    bad = run_cli("derive-draft", str(four), "--keep-layers", "0-9", "-o", str(tmp_path / "bad.gguf"))
    assert bad.returncode == 2 and "9" in bad.stderr and bad.stderr.count("\n") == 1
    r = run_cli(
        "run",
        "--model",
        str(four),
        "--draft-model",
        str(out),
        "--prompt",
        "the a the a",
        "--max-tokens",
        "16",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["strategy"] == "draft" and len(j["tokens"]) == 16
    assert j["telemetry"]["draft_model_tokens_per_second"] > 0


def test_strategies_lists_every_strategy(capsys):
    assert cli.main(["strategies", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"none", "prompt-lookup", "ngram-simple"} <= set(out)
    assert any(k["name"] == "draft_max" for k in out["prompt-lookup"])


@pytest.mark.slow
def test_a_reader_that_goes_away_is_not_an_error():
    # `specviz strategies | head -1` where head has already gone: every write meets a closed pipe
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        p = subprocess.run(
            [sys.executable, "-W", "error::ResourceWarning", "-m", "specviz.cli", "strategies"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr and "ResourceWarning" not in p.stderr, p.stderr


@pytest.mark.slow
def test_llama_cpp_spellings_select_the_strategy_and_its_knobs(tiny_model_path):
    p = run_cli(
        "run",
        "--model",
        str(tiny_model_path),
        "--prompt",
        "the a of the a of",
        "--max-tokens",
        "12",
        "--spec-type",
        "ngram-map-k",
        "--spec-ngram-map-k-size-n",
        "2",
        "--spec-ngram-map-k-min-hits",
        "3",
        "--spec-draft-n-max",
        "5",
        "--spec-draft-n-min",
        "2",
        "--spec-ngram-simple-size-m",
        "7",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["strategy"] == "ngram-map-k"
    assert (out["knobs"]["size_n"], out["knobs"]["min_hits"], out["knobs"]["draft_max"], out["knobs"]["draft_min"]) == (
        2,
        3,
        5,
        2,
    )
    assert out["knobs"]["size_m"] == 48  # the ngram-simple spelling does not reach ngram-map-k ...
    assert "--spec-ngram-simple-size-m is accepted but not applied" in p.stderr  # ... and says so
