"""The scripts in examples/ run, on the tiny fixture model (``--model``), and print what they claim."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from browser_util import ROOT

EXAMPLES = ROOT / "examples"


def run(script: str, *args: str) -> str:
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=300, cwd=str(ROOT)
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def load(script: str):
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), EXAMPLES / script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_compare_strategies_prints_a_row_per_strategy(tiny_model_path):
    out = run(
        "compare_strategies.py",
        "--model",
        str(tiny_model_path),
        "--threads",
        "1",
        "--max-tokens",
        "40",
        "--prompt",
        "the cat sat on the mat and the cat sat",
        "--strategies",
        "none,prompt-lookup,ngram-cache",
    )
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.split()[:1] and line.split()[0] in ("none", "prompt-lookup", "ngram-cache")
    }
    assert set(rows) == {"none", "prompt-lookup", "ngram-cache"}
    assert rows["none"][1] == "40" and rows["none"][2] == "0"  # no speculation: one token per round, nothing drafted
    assert int(rows["prompt-lookup"][2]) > 0  # prompt lookup drafts on this looping fixture
    assert rows["prompt-lookup"][-1] == "yes" and rows["ngram-cache"][-1] == "yes"  # greedy: the same text


@pytest.mark.slow
def test_compare_strategies_with_a_derived_draft(tiny_model_path, tmp_path):
    from specviz.models.derive import derive_draft

    draft = tmp_path / "draft.gguf"
    derive_draft(tiny_model_path, "0-1", draft)
    out = run(
        "compare_strategies.py",
        "--model",
        str(tiny_model_path),
        "--threads",
        "1",
        "--max-tokens",
        "24",
        "--strategies",
        "none",
        "--draft-model",
        str(draft),
    )
    row = next(line.split() for line in out.splitlines() if line.startswith("draft "))
    # a draft keeping every layer is the target itself: everything it drafts is accepted
    assert int(row[2]) > 0 and row[2] == row[3] and row[-1] == "yes"


@pytest.mark.slow
def test_record_and_replay_writes_jsonl_and_prints_every_round(tiny_model_path, tmp_path):
    out_file = tmp_path / "rec.jsonl"
    out = run(
        "record_and_replay.py",
        "--model",
        str(tiny_model_path),
        "--threads",
        "1",
        "--out",
        str(out_file),
        "--max-tokens",
        "30",
        "--prompt",
        "the cat sat on the mat and the cat sat",
    )
    events = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert events[0]["kind"] == "session_started" and events[-1]["kind"] == "finished"
    n_rounds = max(e["round"] for e in events)
    printed = [line for line in out.splitlines() if line.startswith("round ")]
    assert len(printed) == n_rounds
    assert "~" in out  # a rejected draft shown
    tel = [e for e in events if e["kind"] == "telemetry"][-1]["data"]
    assert f"{tel['rounds']} rounds, {tel['n_generated']} tokens" in out


def test_serve_inspector_derives_the_demo_drafts_once(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_MODEL_CACHE", str(tmp_path / "cache"))
    mod = load("serve_inspector.py")
    from specviz.server.app import draft_candidates

    paths = mod.derive_demo_drafts(tiny_model_path, {"0": "keep-0", "0-1": "keep-0-1", "0-16": "keep-0-16"})
    # the 2-layer fixture has no layer 16: that draft is skipped, the others are written and offered
    assert [p.name for p in paths] == ["tiny-keep-0.gguf", "tiny-keep-0-1.gguf"]
    mtime = paths[0].stat().st_mtime_ns
    assert mod.derive_demo_drafts(tiny_model_path, {"0": "keep-0"}) == paths[:1]
    assert paths[0].stat().st_mtime_ns == mtime  # not derived again
    assert draft_candidates(tiny_model_path) == [str(p) for p in sorted(paths)]
