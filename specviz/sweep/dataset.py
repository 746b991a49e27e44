"""Sweep inputs: an MT-bench / Spec-Bench JSONL question file, a deployment's request log, a text file of
prompts, or a workload kind.

Four sources, one shape (:class:`Prompt`: an id, a category and one or more user turns):

* ``*.jsonl``: one question per line in the MT-bench / Spec-Bench format, ``{"question_id": ...,
  "category": ..., "turns": ["first user message", "optional second", ...]}``. ``question_id`` and
  ``turns`` (a non-empty list of non-empty strings) are required; ``category`` defaults to
  ``uncategorised``; other keys (``reference`` ...) are ignored. Blank lines are skipped.
* ``*.jsonl`` whose first line is an OpenAI chat-format request (``{"messages": [...]}`` or
  ``{"body": {"messages": [...]}}``, :mod:`specviz.sweep.request_log`): one prompt per request, id the
  request's ``custom_id`` (else ``request-N``), category the requested model's name (else ``requests``);
  the prompt keeps the logged conversation (``messages``: system, user and earlier assistant messages
  as logged) and the sweep generates the assistant's next answer to it;
* ``*.txt``: one prompt per non-blank line (a single turn each), ids ``line-N``, category the file's stem.
* a workload kind of :mod:`specviz.analysis.workloads` (``code-rewrite``, ``quote``, ``summarise``, ``free``) or
  ``workloads`` for all of them: completion prompts written for a base model, with ids ``KIND-N`` and
  the kind as category.

A malformed line is refused with the file and line number (:class:`DatasetError` lists every one);
``skip_bad_lines`` keeps the good lines untouched and returns the refusals for the caller to report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.workloads import WORKLOADS
from ..errors import SpecvizError
from .request_log import looks_like_request_log, read_request_log

#: The name of the dataset made of every built-in workload kind.
ALL_WORKLOADS = "workloads"


class DatasetError(SpecvizError, ValueError):
    """The dataset cannot be read, or some of its lines are malformed (each named with file:line)."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


@dataclass(frozen=True)
class Prompt:
    """One question of a sweep: ``id`` (unique in its dataset), ``category`` and the user ``turns``.

    ``completion`` marks a raw completion prompt (the built-in workloads), which is never wrapped in a
    chat template: it was written for a base model to continue. ``messages`` holds a logged conversation
    ((role, content) pairs, from a request log): it is generated as one request, its earlier assistant
    messages as logged. ``grammar`` is the GBNF grammar the request asked its output to obey (a request log's
    ``grammar``, ``json_schema`` or ``response_format``), None without one.
    """

    id: str
    category: str
    turns: tuple[str, ...]
    completion: bool = False
    messages: tuple[tuple[str, str], ...] = ()
    grammar: str | None = None


@dataclass
class Dataset:
    """The prompts of a sweep, where they came from, and the lines refused (``skip_bad_lines``)."""

    name: str
    prompts: list[Prompt]
    refused: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompts)


def dataset_kinds() -> list[str]:
    """Every built-in dataset name: each workload kind, and ``workloads`` for all of them."""
    return [*WORKLOADS, ALL_WORKLOADS]


def is_builtin(spec: str) -> bool:
    """True when ``spec`` names a built-in workload dataset rather than a file."""
    return spec in WORKLOADS or spec == ALL_WORKLOADS


def check_dataset_spec(spec: str) -> str | None:
    """Why ``spec`` cannot be a dataset (without reading it), or None when it can."""
    if is_builtin(spec):
        return None
    p = Path(spec)
    if p.suffix.lower() not in (".jsonl", ".txt"):
        return f"expected a .jsonl file, a .txt file or one of: {', '.join(dataset_kinds())}"
    if not p.is_file():
        return "no such file; expected a .jsonl file, a .txt file or one of: " + ", ".join(dataset_kinds())
    return None


def load_dataset(spec: str, *, skip_bad_lines: bool = False) -> Dataset:
    """Read the dataset named by ``spec`` (see the module docstring).

    Raises :class:`DatasetError` naming every malformed line (``FILE:LINE: reason``), unless
    ``skip_bad_lines``, which returns the good prompts as they are and the refusals in ``refused``.
    A dataset left with no prompt is always an error.
    """
    if is_builtin(spec):
        kinds = list(WORKLOADS) if spec == ALL_WORKLOADS else [spec]
        prompts = [
            Prompt(f"{kind}-{i}", kind, (text,), completion=True)
            for kind in kinds
            for i, text in enumerate(WORKLOADS[kind])
        ]
        return Dataset(spec, prompts)
    why = check_dataset_spec(spec)
    if why:
        raise DatasetError(f"dataset {spec!r}: {why}")
    path = Path(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"dataset {spec!r} cannot be read ({e}); pass a UTF-8 text file") from None
    problems: list[str] = []
    if path.suffix.lower() == ".jsonl" and looks_like_request_log(path):
        requests, problems = read_request_log(path)
        prompts = [
            Prompt(r.id, r.model or "requests", r.user_turns, messages=r.messages, grammar=r.options.get("grammar"))
            for r in requests
        ]
    elif path.suffix.lower() == ".txt":
        prompts = [
            Prompt(f"line-{n}", path.stem, (line,)) for n, line in enumerate(text.splitlines(), start=1) if line.strip()
        ]
    else:
        prompts, problems = _parse_jsonl(path, text)
    if problems and not skip_bad_lines:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DatasetError(f"{problems[0]}{more}; fix the line(s) or pass --skip-bad-lines to run the others", problems)
    if not prompts:
        raise DatasetError(f"dataset {spec!r} holds no prompt; give at least one line")
    return Dataset(str(path), prompts, problems)


def _parse_jsonl(path: Path, text: str) -> tuple[list[Prompt], list[str]]:
    prompts: list[Prompt] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not valid JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{where}: expected a JSON object with question_id and turns, got {type(obj).__name__}")
            continue
        qid = obj.get("question_id")
        if isinstance(qid, bool) or not isinstance(qid, (int, str)) or qid == "":
            problems.append(f"{where}: question_id {qid!r} is not allowed; expected an integer or a non-empty string")
            continue
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            problems.append(f"{where}: turns {turns!r} is not allowed; expected a non-empty list of non-empty strings")
            continue
        category = obj.get("category", "uncategorised")
        if not isinstance(category, str) or not category:
            problems.append(f"{where}: category {category!r} is not allowed; expected a non-empty string")
            continue
        key = str(qid)
        if key in seen:
            problems.append(f"{where}: question_id {qid!r} repeats line {seen[key]}; ids must be unique")
            continue
        seen[key] = n
        prompts.append(Prompt(key, category, tuple(turns)))
    return prompts, problems
