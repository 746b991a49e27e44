"""A generation request, checked: the prompt (text, token ids or chat messages) turned into token ids,
the budget, sampling, seed and stop strings, each validated before the session changes anything.

``prompt`` is text (tokenized with BOS) or a list of token ids. ``messages`` (instead of a prompt:
``[{"role": "user", "content": "..."}]``) is a chat request formatted with the model's own chat template, or
the llama.cpp built-in one named by ``chat_template`` (:mod:`specviz.decoding.chat`; a model without one
raises :class:`~specviz.errors.ChatTemplateError`). ``stop`` is a stop string or a list of them: the
generation ends where plain decoding with them would (:mod:`specviz.decoding.stops`). ``grammar`` (GBNF text,
root rule ``root``) or ``json_schema`` (a JSON schema, text or a parsed object, converted to GBNF by
llama-cpp-python's converter) constrains every generated token through llama.cpp's grammar sampler
(:mod:`specviz.decoding.constrained`); one that llama.cpp cannot parse or convert raises
:class:`~specviz.errors.GrammarError` with its reason and line. ``temperature`` 0 (the
default) is greedy and exact; above 0 every strategy samples losslessly (rejection sampling, the target's
distribution after ``top_k``/``top_p``) from a generator seeded with ``seed`` (a random seed is drawn and
recorded when ``seed`` is None).

:func:`prepare_request` is what :meth:`specviz.Session.start` calls first; every refusal is a typed
error naming the argument (:class:`~specviz.errors.KnobError`, :class:`~specviz.errors.ChatTemplateError`
or :class:`~specviz.errors.ContextError`), and since nothing has been touched yet, the previous
generation stays intact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.grammar import check_gbnf, gbnf_from_json_schema
from ..errors import ContextError, GrammarError, KnobError
from .chat import apply_chat_template, check_messages
from .knob_schema import Knob
from .sampling import SamplingParams
from .stops import check_stops

_TEMPERATURE = Knob("temperature", float, 0.0, "", lo=0.0, hi=100.0)


@dataclass(frozen=True)
class Request:
    """A checked request: ``ids`` is the whole prompt as token ids (after the chat template when
    ``messages`` were given), ``seed`` is always set (drawn at random when the caller gave none)."""

    ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    seed: int
    stop: tuple[str, ...]
    messages: list[dict[str, str]]
    #: The GBNF grammar every generated token obeys (a JSON schema's conversion), checked; None: none.
    grammar: str | None = None


#: The keywords of ``Session.start`` that make the request (the rest are the strategy's knobs).
REQUEST_KEYS = ("temperature", "top_k", "top_p", "seed", "messages", "chat_template", "stop", "grammar", "json_schema")
_REQUEST_DEFAULTS: dict[str, Any] = dict(
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    seed=None,
    messages=None,
    chat_template=None,
    stop=None,
    grammar=None,
    json_schema=None,
)


def split_request(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``Session.start``'s keywords split into the request's (every one of :data:`REQUEST_KEYS`, defaults
    filled in: what :func:`prepare_request` takes) and the strategy's knobs (the rest)."""
    request = {k: kwargs.get(k, _REQUEST_DEFAULTS[k]) for k in REQUEST_KEYS}
    return request, {k: v for k, v in kwargs.items() if k not in _REQUEST_DEFAULTS}


def _is_int(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, np.integer))


def prompt_ids(model: Any, prompt: object) -> list[int]:
    """``prompt`` (text, or a list of token ids in the model's vocabulary) as token ids; text is
    tokenized with the model's BOS as llama.cpp's tools do."""
    if isinstance(prompt, str):
        if not prompt:
            raise KnobError(
                "prompt: the prompt is empty; give at least one character of text", knob="prompt", value=prompt
            )
        return list(model.tokenize(prompt, add_special=True))
    if not isinstance(prompt, (list, tuple)) or not all(_is_int(t) for t in prompt):
        raise KnobError("prompt: expected text or a list of token ids", knob="prompt", value=prompt)
    ids = [int(t) for t in prompt]
    if not ids:
        raise KnobError("prompt: the prompt is empty; give at least one token", knob="prompt", value=prompt)
    bad = [t for t in ids if not 0 <= t < model.n_vocab]
    if bad:
        raise KnobError(
            f"prompt: token id {bad[0]} is outside the vocabulary [0, {model.n_vocab - 1}]", knob="prompt", value=bad[0]
        )
    return ids


def request_grammar(grammar: str | None, json_schema: str | dict[str, Any] | None) -> str | None:
    """The checked GBNF of a request's ``grammar`` or ``json_schema`` (at most one of them), or None; a grammar
    llama.cpp cannot parse or a schema its converter cannot convert raises
    :class:`~specviz.errors.GrammarError` (no model is needed: it is checked before one loads)."""
    if grammar is not None and json_schema is not None:
        raise GrammarError(
            "start: give either a grammar or a json_schema, not both", knob="json_schema", reason="both given"
        )
    if json_schema is not None:
        if not isinstance(json_schema, (str, dict)):
            raise GrammarError(
                f"json_schema: expected JSON text or a dict, not {type(json_schema).__name__}",
                knob="json_schema",
                reason="wrong type",
            )
        return gbnf_from_json_schema(json_schema)
    if grammar is not None:
        if not isinstance(grammar, str):
            raise GrammarError(
                f"grammar: expected GBNF text, not {type(grammar).__name__}", knob="grammar", reason="wrong type"
            )
        check_gbnf(grammar)
    return grammar


def prepare_request(
    model: Any,
    prompt: str | list[int] | None,
    max_tokens: int,
    *,
    temperature: float | str,
    top_k: int,
    top_p: float,
    seed: int | None,
    messages: list[dict[str, str]] | None,
    chat_template: str | None,
    stop: str | list[str] | None,
    n_ctx: int,
    grammar: str | None = None,
    json_schema: str | dict[str, Any] | None = None,
) -> Request:
    """Check every argument of a generation and build its :class:`Request` (see the module docstring).

    Exactly one of ``prompt`` and ``messages`` is given; ``messages`` go through the model's chat
    template (or ``chat_template``) and are tokenized with special tokens parsed, as llama.cpp's server
    does. The prompt must leave room for at least one generated token in ``n_ctx``.
    """
    if not _is_int(max_tokens) or max_tokens < 1:
        raise KnobError(
            f"max_tokens: {max_tokens!r} is not allowed; expected an integer >= 1", knob="max_tokens", value=max_tokens
        )
    temp = _TEMPERATURE.convert(temperature) if isinstance(temperature, str) else temperature
    sampling = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p)
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise KnobError(f"seed: {seed!r} is not allowed; expected an integer >= 0 or None", knob="seed", value=seed)
    stops = check_stops(stop)
    gbnf = request_grammar(grammar, json_schema)
    chat: list[dict[str, str]] = []
    if messages is not None:
        if prompt is not None:
            raise KnobError("start: give either a prompt or messages, not both", knob="messages", value=messages)
        chat = check_messages(messages)
        text = apply_chat_template(model, chat, template=chat_template)
        ids = list(model.tokenize(text, add_special=True, parse_special=True))
    elif prompt is None:
        raise KnobError("start: give a prompt (text or token ids) or messages", knob="prompt", value=None)
    else:
        ids = prompt_ids(model, prompt)
    if len(ids) + 1 > n_ctx:
        raise ContextError(
            f"the prompt has {len(ids)} tokens but the context holds {n_ctx}; "
            "shorten the prompt or create the Session with a larger n_ctx"
        )
    if seed is None:
        # A fresh random seed, recorded so the generation can be replayed exactly.
        seed = int(np.random.SeedSequence().generate_state(2, np.uint64)[0] % (2**63))
    return Request(
        ids=ids, max_tokens=int(max_tokens), sampling=sampling, seed=int(seed), stop=stops, messages=chat, grammar=gbnf
    )
