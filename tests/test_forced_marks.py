"""The tokens a grammar forced (the only token it allowed there), marked wherever a run's tokens are shown:
``specviz run --json``'s ``forced`` (their indexes in ``tokens``) and its text mode's grammar line, and a
recording replayed in the inspector, whose events carry the marks the page draws."""

from __future__ import annotations

import json

from declared_messages import sent_messages_are_declared  # noqa: F401 (an autouse fixture)
from test_grammar_forced import LITERAL, byte_token
from test_ui_messages import Sink

from specviz.cli import main as cli
from specviz.decoding.recorder import read_events
from specviz.ui.core import InspectorCore

#: "Qé" has byte tokens only on the tiny vocabulary: its three tokens are forced.
QE = [byte_token(0x51), byte_token(0xC3), byte_token(0xA9)]


def _run(tiny_model_path, *extra):
    args = ["run", "--model", str(tiny_model_path), "--prompt", "the cat", "--max-tokens", "12", "-t", "1"]
    return cli.main([*args, "--grammar", LITERAL, "--strategy", "ngram-simple", *extra])


def test_run_json_gives_the_indexes_of_the_forced_tokens(tiny_model_path, capsys):
    assert _run(tiny_model_path, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["forced"][:3] == [0, 1, 2] and [out["tokens"][i] for i in range(3)] == QE
    assert len(out["forced"]) == out["telemetry"]["forced"]
    assert all(0 <= i < len(out["tokens"]) for i in out["forced"])


def test_run_says_what_the_grammar_forced_and_a_run_without_one_says_nothing(tiny_model_path, capsys):
    assert _run(tiny_model_path) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("grammar: "))
    assert "tokens forced (the only token it allowed there" in line and "impossible under it" in line
    args = ["run", "--model", str(tiny_model_path), "--prompt", "the cat", "--max-tokens", "6", "-t", "1"]
    assert cli.main(args) == 0
    assert "grammar: " not in capsys.readouterr().err


def test_a_recording_replays_with_the_marks(tiny_model_path, tmp_path, capsys):
    rec = tmp_path / "run.jsonl"
    assert _run(tiny_model_path, "--record", str(rec)) == 0
    capsys.readouterr()
    sink = Sink()
    core = InspectorCore(sink, events=read_events(rec))
    try:
        core.handle({"type": "hello", "epoch": -1, "have": 0})
        sent = [ev for m in sink.msgs if m["type"] == "events" for ev in m["events"]]
        started = next(ev for ev in sent if ev["kind"] == "session_started")
        assert started["grammar"] == LITERAL  # the page's legend shows the forced key under a grammar
        n = len(started["prompt_tokens"])
        forced = [ev["position"] - n + i for ev in sent if ev["kind"] == "accepted" for i in ev["forced"]]
        assert forced[:3] == [0, 1, 2]
    finally:
        core.close()
