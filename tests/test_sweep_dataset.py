"""Sweep inputs: MT-bench / Spec-Bench JSONL, text files and workload kinds; malformed lines refused by line."""

from __future__ import annotations

import json

import pytest

from specviz.analysis.workloads import WORKLOADS
from specviz.sweep.dataset import DatasetError, load_dataset


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = [
    json.dumps({"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now make it rhyme."]}),
    json.dumps({"question_id": "qa-2", "category": "qa", "turns": ["What is a lighthouse?"], "reference": ["x"]}),
    "",
    json.dumps({"question_id": 3, "turns": ["No category here."]}),
]


def test_spec_bench_jsonl_is_read_with_ids_categories_and_turns(tmp_path):
    ds = load_dataset(str(_write(tmp_path / "q.jsonl", GOOD)))
    assert [(p.id, p.category, p.turns) for p in ds.prompts] == [
        ("81", "writing", ("Write a haiku.", "Now make it rhyme.")),
        ("qa-2", "qa", ("What is a lighthouse?",)),
        ("3", "uncategorised", ("No category here.",)),
    ]
    assert not any(p.completion for p in ds.prompts)


BAD_LINES = [
    ("{not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    (json.dumps({"category": "x", "turns": ["t"]}), "question_id None"),
    (json.dumps({"question_id": True, "turns": ["t"]}), "question_id True"),
    (json.dumps({"question_id": 9, "turns": []}), "turns []"),
    (json.dumps({"question_id": 9, "turns": "just a string"}), "turns 'just a string'"),
    (json.dumps({"question_id": 9, "turns": ["ok", ""]}), "non-empty strings"),
    (json.dumps({"question_id": 9, "category": 4, "turns": ["t"]}), "category 4"),
    (json.dumps({"question_id": 81, "turns": ["a repeated id"]}), "repeats line 1"),
]


@pytest.mark.parametrize("line,reason", BAD_LINES, ids=[r for _, r in BAD_LINES])
def test_a_malformed_line_is_refused_with_file_and_line(tmp_path, line, reason):
    path = _write(tmp_path / "q.jsonl", [GOOD[0], GOOD[1], line, GOOD[3]])
    with pytest.raises(DatasetError) as e:
        load_dataset(str(path))
    assert f"{path}:3:" in str(e.value) and reason in str(e.value)
    assert e.value.problems == [str(e.value).split("; fix the line")[0]]


def test_skip_bad_lines_keeps_the_other_lines_untouched(tmp_path):
    lines = [GOOD[0], "{broken", GOOD[1], json.dumps({"question_id": 7}), GOOD[3]]
    path = _write(tmp_path / "q.jsonl", lines)
    with pytest.raises(DatasetError) as e:
        load_dataset(str(path))
    assert len(e.value.problems) == 2 and "(and 1 more)" in str(e.value)
    assert [p.split(": ")[0] for p in e.value.problems] == [f"{path}:2", f"{path}:4"]
    ds = load_dataset(str(path), skip_bad_lines=True)
    assert [p.id for p in ds.prompts] == ["81", "qa-2", "3"]
    assert ds.prompts == load_dataset(str(_write(tmp_path / "good.jsonl", GOOD))).prompts
    assert [r.split(": ")[0] for r in ds.refused] == [f"{path}:2", f"{path}:4"]
    assert path.read_text(encoding="utf-8") == "\n".join(lines) + "\n"  # the file itself is never changed


def test_text_file_has_one_prompt_per_non_blank_line(tmp_path):
    path = _write(tmp_path / "prompts.txt", ["first prompt", "", "  ", "# a heading is a prompt too"])
    ds = load_dataset(str(path))
    assert [(p.id, p.category, p.turns) for p in ds.prompts] == [
        ("line-1", "prompts", ("first prompt",)),
        ("line-4", "prompts", ("# a heading is a prompt too",)),
    ]


def test_workload_kinds_and_all_workloads():
    quote = load_dataset("quote")
    assert [p.turns[0] for p in quote.prompts] == WORKLOADS["quote"]
    assert all(p.completion and p.category == "quote" for p in quote.prompts)
    every = load_dataset("workloads")
    assert [p.category for p in every.prompts] == [k for k in WORKLOADS for _ in WORKLOADS[k]]
    assert len({p.id for p in every.prompts}) == len(every.prompts)


@pytest.mark.parametrize(
    "spec,detail",
    [("poetry", "one of: code-rewrite"), ("x.csv", "expected a .jsonl"), ("/nonexistent/q.jsonl", "no such file")],
)
def test_unknown_dataset_is_refused(spec, detail):
    with pytest.raises(DatasetError, match=detail):
        load_dataset(spec)


def test_empty_dataset_is_refused(tmp_path):
    with pytest.raises(DatasetError, match="holds no prompt"):
        load_dataset(str(_write(tmp_path / "empty.txt", ["", " "])))
