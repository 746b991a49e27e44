"""The workbench on the command line: run --json diagnosis/advice, --chat, --stop, diagnose, advise."""

from __future__ import annotations

import json

import pytest
from conftest import TINY
from test_cli import run_cli
from test_requests import CHATML

from specviz.testing.tiny_models import write_tiny_llama

PROMPT = "the cat of the dog and the a the cat of the"


@pytest.mark.parametrize(
    "args, text",
    [
        (["--system", "be brief"], "only with --chat"),
        (["--stop", ""], "option --stop"),
        (["--chat-template", "chatml"], "only with --chat"),
    ],
)
def test_request_options_are_checked_before_a_model_loads(args, text):
    p = run_cli("run", "--prompt", "x", "--model", "/nonexistent.gguf", *args)
    assert p.returncode == 2 and text in p.stderr


@pytest.mark.slow
def test_run_json_has_diagnosis_and_advice_and_honours_stop(tiny_model_path, tmp_path):
    rec = tmp_path / "rec.jsonl"
    p = run_cli(
        "run",
        "--model",
        str(tiny_model_path),
        "--prompt",
        PROMPT,
        "--max-tokens",
        "60",
        "--json",
        "--draft-max",
        "8",
        "--record",
        str(rec),
    )
    assert p.returncode == 0, p.stderr
    full = json.loads(p.stdout)
    d, a = full["diagnosis"], full["advice"]
    assert d["drafted"] == full["telemetry"]["drafted"] and isinstance(d["findings"], list)
    assert a["cost_source"].startswith("measured") and a["llama_cpp_flags"].startswith("--spec-type ")
    # a stop string from the middle of that text
    text = full["text"]
    i = next(
        i for i in range(len(text) // 3, len(text)) if "\ufffd" not in text[i : i + 3] and len(text[i : i + 3]) == 3
    )
    stop = text[i : i + 3]
    p2 = run_cli(
        "run",
        "--model",
        str(tiny_model_path),
        "--prompt",
        PROMPT,
        "--max-tokens",
        "60",
        "--json",
        "--draft-max",
        "8",
        "--stop",
        stop,
    )
    cut = json.loads(p2.stdout)
    assert cut["finish_reason"] == "stop" and cut["text"] == text[: text.index(stop)]
    # the recording, diagnosed and advised without the model
    p3 = run_cli("diagnose", str(rec), "--json")
    assert p3.returncode == 0 and json.loads(p3.stdout)["drafted"] == full["telemetry"]["drafted"]
    p4 = run_cli("diagnose", str(rec))
    assert p4.returncode == 0 and "findings:" in p4.stdout and "acceptance by draft depth:" in p4.stdout
    p5 = run_cli("advise", str(rec))
    assert p5.returncode == 0 and "llama-server flags: --spec-type" in p5.stdout
    assert "fitted to the recorded verify times" in p5.stdout
    assert "\nwhy: " in p5.stdout  # why speculation was or was not advised, after the advice
    curve = tmp_path / "cost.json"
    curve.write_text(json.dumps([{"batch": b, "median_ms": 10 + 2 * b} for b in range(1, 20)]))
    p6 = run_cli("advise", str(rec), "--json", "--verify-cost", str(curve))
    adv6 = json.loads(p6.stdout)
    assert adv6["cost_source"].startswith("measured") and adv6["reason"] and isinstance(adv6["pays"], bool)
    assert adv6["pays"] == (adv6["best"]["strategy"] != "none")
    assert all("speedup_low" in c and "rounds" in c for c in adv6["per_strategy"].values())
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    p7 = run_cli("advise", str(rec), "--verify-cost", str(bad))
    assert p7.returncode == 2 and "--verify-cost" in p7.stderr
    assert run_cli("diagnose", str(tmp_path / "missing.jsonl")).returncode == 2


@pytest.mark.slow
def test_chat_on_the_command_line(tiny_model_path, tmp_path):
    p = run_cli("run", "--model", str(tiny_model_path), "--prompt", "hello", "--chat", "--max-tokens", "4")
    assert p.returncode == 1 and "has no chat template" in p.stderr
    chat = write_tiny_llama(tmp_path / "chat.gguf", chat_template=CHATML, **TINY)
    p = run_cli(
        "run",
        "--model",
        str(chat),
        "--prompt",
        "hello",
        "--chat",
        "--system",
        "be brief",
        "--max-tokens",
        "4",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["prompt_tokens"] > 20
