"""A deployment's request log: OpenAI chat-format requests, one JSON object a line.

Two shapes are read, as servers and gateways log them:

* ``{"messages": [{"role": "user", "content": "..."}, ...], "max_tokens": 128, ...}`` — the request body;
* ``{"custom_id": "...", "body": {"messages": [...], ...}}`` — the OpenAI batch API's line (and logs that
  wrap the body with other fields).

A message's ``content`` is a string or a list of parts of which the ``text`` parts are read (a line with
an image or audio part is refused: specviz runs text models). Roles are ``system``, ``user``, ``assistant``
(``developer`` is read as ``system``, as OpenAI defines it); the last message must be the user's (the
request asks for the assistant's next answer). From the body, ``max_tokens`` / ``max_completion_tokens`` /
``n_predict``, ``temperature``, ``top_p``, ``top_k``, ``seed`` and ``stop`` are kept, so a reproduction can
use what the request asked for, and llama-server's structured-output fields: ``grammar`` (GBNF),
``json_schema`` and ``response_format`` (``{"type": "json_object", "schema": ...}`` or ``{"type":
"json_schema", "json_schema": {"schema": ...}}``; ``json_object`` without a schema is any JSON value, as the
server reads it), each checked by llama.cpp's parser and kept as the GBNF grammar ``grammar``; every other
field is ignored.

A malformed line is refused with the file and line number (:class:`~specviz.sweep.dataset.DatasetError`
lists every one); the caller may keep the good lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..decoding.request import request_grammar
from ..errors import GrammarError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: body fields kept, under specviz's names
_KEPT = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "n_predict": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "stop": "stop",
}


@dataclass(frozen=True)
class LoggedRequest:
    """One logged chat request: its id, its messages as (role, content) pairs, and the generation
    options it asked for (``max_tokens``, ``temperature`` ... where given)."""

    id: str
    messages: tuple[tuple[str, str], ...]
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    model: str | None = None

    def message_dicts(self) -> list[dict[str, str]]:
        """The messages as ``[{"role": ..., "content": ...}]`` (:meth:`specviz.Session.start`'s ``messages``)."""
        return [{"role": r, "content": c} for r, c in self.messages]

    @property
    def user_turns(self) -> tuple[str, ...]:
        """The user messages' contents, in order."""
        return tuple(c for r, c in self.messages if r == "user")


def is_request_line(obj: Any) -> bool:
    """Whether a parsed JSON line is a chat request (``messages`` at the top or under ``body``), not a
    recorded event (which has a ``kind``: a chat session's ``session_started`` carries ``messages`` too)."""
    return (
        isinstance(obj, dict)
        and "kind" not in obj
        and ("messages" in obj or (isinstance(obj.get("body"), dict) and "messages" in obj["body"]))
    )


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"a content part of type {kind!r}: specviz runs text models; only text parts are read")
        return "".join(parts)
    raise ValueError(f"content {value!r} is not a string or a list of text parts")


def _grammar_of(body: dict[str, Any]) -> str | None:
    """The checked GBNF of a request's ``grammar``, ``json_schema`` or ``response_format`` (as llama-server
    reads them: a schema in ``response_format`` takes the place of ``json_schema``), or None; ``ValueError``
    for two of them, a malformed ``response_format`` or a grammar llama.cpp refuses."""
    schema = body.get("json_schema")
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            schema = fmt.get("schema", {})
        elif kind == "json_schema":
            wrapper = fmt.get("json_schema")
            schema = wrapper.get("schema", {}) if isinstance(wrapper, dict) else {}
        elif kind != "text":
            raise ValueError(f'response_format {fmt!r}: its type must be "text", "json_object" or "json_schema"')
    grammar = body.get("grammar")
    if grammar is not None and schema is not None:
        raise ValueError("a request gives a grammar and a JSON schema: llama-server takes one of them")
    try:
        return request_grammar(grammar, schema)
    except GrammarError as exc:
        raise ValueError(str(exc)) from None


def parse_request(obj: Any, default_id: str) -> LoggedRequest:
    """One request from a parsed JSON line; ``ValueError`` saying what is wrong."""
    if not is_request_line(obj):
        raise ValueError('expected a chat request: {"messages": [...]} or {"body": {"messages": [...]}}')
    body = obj["body"] if "messages" not in obj else obj
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ValueError("messages must be a non-empty list")
    out: list[tuple[str, str]] = []
    for j, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise ValueError(f"message {j} is not an object")
        role = ROLES.get(str(m.get("role")))
        if role is None:
            raise ValueError(f"message {j} has role {m.get('role')!r}; expected system, user or assistant")
        out.append((role, _content(m.get("content", ""))))
    if out[-1][0] != "user":
        raise ValueError(f"the last message is the {out[-1][0]}'s; a request ends with the user's message")
    if not any(c.strip() for r, c in out if r == "user"):
        raise ValueError("every user message is empty")
    options: dict[str, Any] = {}
    for key, name in _KEPT.items():
        if key in body and body[key] is not None and name not in options:
            options[name] = body[key]
    grammar = _grammar_of(body)
    if grammar is not None:
        options["grammar"] = grammar
    rid = obj.get("custom_id") or obj.get("id") or body.get("id") or default_id
    model = body.get("model") if isinstance(body.get("model"), str) else None
    return LoggedRequest(str(rid), tuple(out), options, model)


def read_request_log(path: str | Path) -> tuple[list[LoggedRequest], list[str]]:
    """The requests of a log file and the refusals (``FILE:LINE: reason``), blank lines skipped. Repeated
    ids get a ``#N`` suffix (logs often repeat a request)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    requests: list[LoggedRequest] = []
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
        try:
            req = parse_request(obj, f"request-{n}")
        except ValueError as e:
            problems.append(f"{where}: {e}")
            continue
        count = seen.get(req.id, 0)
        seen[req.id] = count + 1
        if count:
            req = LoggedRequest(f"{req.id}#{count + 1}", req.messages, req.options, req.model)
        requests.append(req)
    return requests, problems


def looks_like_request_log(path: str | Path) -> bool:
    """Whether the first non-blank line of a ``.jsonl`` file is a chat request (not a question, not a
    recorded event)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    return is_request_line(json.loads(line))
    except (OSError, ValueError):
        return False
    return False
