"""A deployment's OpenAI chat-format request log as a sweep's dataset (specviz.sweep.request_log)."""

from __future__ import annotations

import json

import pytest

from specviz.sweep.dataset import DatasetError, load_dataset
from specviz.sweep.request_log import looks_like_request_log, parse_request, read_request_log

LOG = [
    {"messages": [{"role": "user", "content": "1, 2, 3, 4,"}], "max_tokens": 32, "temperature": 0},
    {
        "custom_id": "req-7",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gemma-3-270m",
            "messages": [
                {"role": "developer", "content": "Answer briefly."},
                {"role": "user", "content": [{"type": "text", "text": "def add(a, b):"}]},
                {"role": "assistant", "content": "return a + b"},
                {"role": "user", "content": "and sub?"},
            ],
            "max_completion_tokens": 16,
            "stop": ["\n\n"],
            "stream": True,
        },
    },
    {"messages": [{"role": "user", "content": "1, 2, 3, 4,"}]},
]


@pytest.fixture()
def request_log(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in LOG) + "\n\n")
    return path


def test_both_shapes_are_read(request_log):
    reqs, problems = read_request_log(request_log)
    assert problems == []
    assert [r.id for r in reqs] == ["request-1", "req-7", "request-3"]
    assert reqs[0].messages == (("user", "1, 2, 3, 4,"),)
    assert reqs[0].options == {"max_tokens": 32, "temperature": 0}
    r = reqs[1]
    assert r.messages == (
        ("system", "Answer briefly."),
        ("user", "def add(a, b):"),
        ("assistant", "return a + b"),
        ("user", "and sub?"),
    )
    assert r.options == {"max_tokens": 16, "stop": ["\n\n"]}  # stream and the rest are ignored
    assert r.model == "gemma-3-270m" and r.user_turns == ("def add(a, b):", "and sub?")
    assert r.message_dicts()[0] == {"role": "system", "content": "Answer briefly."}
    assert looks_like_request_log(request_log)


def test_a_repeated_id_is_numbered(tmp_path):
    a = json.dumps({"custom_id": "x", "body": {"messages": [{"role": "user", "content": "hi"}]}})
    path = tmp_path / "log.jsonl"
    path.write_text(f"{a}\n{a}\n{a}\n")
    reqs, _ = read_request_log(path)
    assert [r.id for r in reqs] == ["x", "x#2", "x#3"]
    assert parse_request(json.loads(a), "request-1").id == "x"


@pytest.mark.parametrize(
    "line,why",
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role 'robot'"),
        ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, "last message"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "image_url"),
        ({"messages": [{"role": "user", "content": "  "}]}, "empty"),
        ({"prompt": "x"}, "expected a chat request"),
    ],
)
def test_a_malformed_request_is_refused_saying_why(line, why):
    with pytest.raises(ValueError, match=why):
        parse_request(line, "request-1")


def test_refusals_name_the_line_and_the_good_lines_can_be_kept(tmp_path):
    path = tmp_path / "log.jsonl"
    good = json.dumps(LOG[0])
    bad = json.dumps({"messages": [{"role": "assistant", "content": "x"}]})
    path.write_text("\n".join([good, "{not json", bad, good]))
    with pytest.raises(DatasetError) as e:
        load_dataset(str(path))
    assert f"{path}:2: not valid JSON" in e.value.problems[0] and f"{path}:3:" in e.value.problems[1]
    ds = load_dataset(str(path), skip_bad_lines=True)
    assert [p.id for p in ds.prompts] == ["request-1", "request-4"] and len(ds.refused) == 2


def test_a_request_log_is_a_dataset_of_logged_conversations(request_log, tmp_path):
    ds = load_dataset(str(request_log))
    assert [p.id for p in ds.prompts] == ["request-1", "req-7", "request-3"]
    p = ds.prompts[1]
    assert p.category == "gemma-3-270m" and p.messages[2] == ("assistant", "return a + b")
    assert ds.prompts[0].category == "requests" and not ds.prompts[0].completion
    # a question file is still read as questions
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "turns": ["x"]}) + "\n")
    assert not looks_like_request_log(q) and load_dataset(str(q)).prompts[0].messages == ()


@pytest.mark.slow
def test_a_sweep_generates_the_next_answer_of_each_logged_conversation(request_log, tmp_path):
    """The logged assistant message is kept as logged (not regenerated), through the model's template."""
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    from conftest import TINY
    from test_sweep_run import CHATML, sweep

    from specviz import Session
    from specviz.sweep import GridSpec, build_grid, read_results
    from specviz.sweep.chat import logged_conversation_text, probe_format, prompt_tokens
    from specviz.testing.tiny_models import write_tiny_llama

    model = write_tiny_llama(tmp_path / "chat.gguf", chat_template=CHATML, **TINY)
    out = tmp_path / "r.parquet"
    sweep(load_dataset(str(request_log)), build_grid(GridSpec(strategies=["ngram-simple"], max_tokens=12)), out, model)
    df = read_results(out)
    row = df[(df["question_id"] == "req-7") & (df["strategy"] == "ngram-simple")].iloc[0]
    fmt = probe_format(str(model), "auto")
    text = logged_conversation_text(fmt, load_dataset(str(request_log)).prompts[1].messages)
    assert text == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\ndef add(a, b):<|im_end|>\n"
        "<|im_start|>assistant\nreturn a + b<|im_end|>\n<|im_start|>user\nand sub?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    s = Session(model, n_ctx=4096, n_threads=1)
    ids = prompt_tokens(s.model, fmt, text, False)
    s.start(ids, 12, "none")
    s.run()
    assert list(row["tokens"]) == s.tokens and row["prompt_tokens"] == len(ids)
    s.close()


def test_a_recording_of_a_chat_session_is_not_a_request_log(tmp_path):
    """A chat session's session_started event carries messages too; a recorded event has a kind."""
    from specviz.sweep.request_log import is_request_line

    event = {"kind": "session_started", "messages": [{"role": "user", "content": "hi"}]}
    assert not is_request_line(event) and is_request_line({"messages": event["messages"]})
    rec = tmp_path / "rec.jsonl"
    rec.write_text(json.dumps(event) + "\n")
    assert not looks_like_request_log(rec)
