"""Turning a question's turns into prompt tokens: the model's chat template, or plain text.

The chat path uses llama.cpp itself, through llama-cpp-python's low-level bindings:
``llama_model_chat_template`` reads the template stored in the GGUF (``tokenizer.chat_template``) and
``llama_chat_apply_template`` formats a conversation with it. That function is llama.cpp's built-in
formatter: it recognises the common templates (ChatML, Llama 2/3, Gemma, Mistral, Phi ...) by their
markers and writes the layout itself instead of running the Jinja text, and it returns -1 for a
template it does not know. Such a model is treated as having no usable template.

The plain path, for models without a (usable) template and for the built-in workloads (completion
prompts written for a base model), is specviz's own: the first turn is the prompt as given; a later
turn is the conversation so far — each user turn and each generated answer — joined by blank lines.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ModelError

#: ``--prompt-format`` values: ``auto`` uses the chat template when the model has a usable one.
PROMPT_FORMATS = ("auto", "chat", "plain")


@dataclass(frozen=True)
class PromptFormat:
    """How a sweep's prompts are built: ``chat`` (with the model's ``template``) or ``plain``; ``note`` says why."""

    kind: str
    template: str | None = None
    note: str = ""

    def describe(self) -> str:
        """One line for the terminal and the report."""
        return f"{self.kind} ({self.note})" if self.note else self.kind


def model_chat_template(model_ptr) -> str | None:
    """The chat template stored in a loaded model's GGUF metadata, or None."""
    import llama_cpp

    raw = llama_cpp.llama_model_chat_template(model_ptr, None)
    return raw.decode("utf-8", "replace") if raw else None


def apply_chat_template(
    template: str, messages: Sequence[tuple[str, str]], *, add_assistant: bool = True
) -> str | None:
    """``messages`` ((role, content) pairs) formatted by llama.cpp's ``llama_chat_apply_template``.

    Returns None when llama.cpp does not recognise ``template``.
    """
    import llama_cpp

    keep = [(r.encode("utf-8"), c.encode("utf-8")) for r, c in messages]  # alive while llama.cpp reads them
    chat = (llama_cpp.llama_chat_message * len(keep))()
    for i, (r, c) in enumerate(keep):
        chat[i].role = r
        chat[i].content = c
    tmpl = template.encode("utf-8")
    size = max(256, 2 * sum(len(r) + len(c) for r, c in keep) + 256)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(tmpl, chat, len(keep), add_assistant, buf, size)
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n + 1
    return None  # pragma: no cover - the second call always has room


def decide_format(template: str | None, requested: str) -> PromptFormat:
    """The prompt format for a model whose stored template is ``template``, given ``--prompt-format``.

    Raises :class:`~specviz.errors.ModelError` when ``chat`` is requested and the model has no usable
    template.
    """
    if requested not in PROMPT_FORMATS:
        raise ValueError(f"prompt format {requested!r}; expected one of {PROMPT_FORMATS}")
    if requested == "plain":
        return PromptFormat("plain", note="as requested")
    if not template:
        if requested == "chat":
            raise ModelError(
                "the model has no chat template (no tokenizer.chat_template in its GGUF); "
                "use --prompt-format plain or auto"
            )
        return PromptFormat("plain", note="the model has no chat template")
    if apply_chat_template(template, [("user", "x")]) is None:
        if requested == "chat":
            raise ModelError(
                "llama.cpp's llama_chat_apply_template does not recognise the model's chat "
                "template; use --prompt-format plain or auto"
            )
        return PromptFormat("plain", note="llama.cpp does not recognise the model's chat template")
    return PromptFormat("chat", template, note="the model's template, via llama_chat_apply_template")


def probe_format(model_path: str, requested: str) -> PromptFormat:
    """:func:`decide_format` for the GGUF at ``model_path``, loading only its vocabulary and metadata."""
    if requested == "plain":
        return decide_format(None, "plain")
    import llama_cpp

    from ..backends.binding import ensure_backend as _ensure_backend
    from ..backends.gguf_check import check_gguf

    check_gguf(model_path)  # a broken file is refused here, before llama.cpp could abort on it
    _ensure_backend()  # the backend's quiet logger and one-time initialisation
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    ptr = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
    if not ptr:
        raise ModelError(f"llama.cpp could not read {model_path}; pass the path of a GGUF model")
    try:
        return decide_format(model_chat_template(ptr), requested)
    finally:
        llama_cpp.llama_model_free(ptr)


def conversation_text(fmt: PromptFormat, turns: Sequence[str], answers: Sequence[str], completion: bool) -> str:
    """The text to generate the answer to ``turns[-1]``, given the answers to the earlier turns.

    A ``completion`` prompt (a built-in workload) is always plain: it is text for a model to continue.
    """
    if fmt.kind == "chat" and not completion:
        messages: list[tuple[str, str]] = []
        for i, t in enumerate(turns):
            messages.append(("user", t))
            if i < len(answers):
                messages.append(("assistant", answers[i]))
        text = apply_chat_template(fmt.template or "", messages, add_assistant=True)
        if text is None:  # decide_format checked the template; this would be a llama.cpp change
            raise ModelError("llama_chat_apply_template refused the model's template")
        return text
    parts: list[str] = []
    for i, t in enumerate(turns):
        parts.append(t)
        if i < len(answers):
            parts.append(answers[i])
    return "\n\n".join(parts)


def logged_conversation_text(fmt: PromptFormat, messages: Sequence[tuple[str, str]]) -> str:
    """The text to generate the next answer of a logged conversation (a request log's ``messages``): the
    chat template over every message as logged, or — plain — the contents joined by blank lines."""
    if fmt.kind == "chat":
        text = apply_chat_template(fmt.template or "", list(messages), add_assistant=True)
        if text is None:  # decide_format checked the template; this would be a llama.cpp change
            raise ModelError("llama_chat_apply_template refused the model's template")
        return text
    return "\n\n".join(c for _, c in messages)


def prompt_tokens(model, fmt: PromptFormat, text: str, completion: bool) -> list[int]:
    """Token ids of a conversation text built by :func:`conversation_text`.

    Templated text carries the template's special markers as text, so it is tokenized with special
    tokens parsed and without adding BOS again when the template already wrote one (llama.cpp's server
    does the same check); plain text is tokenized as ``Session.start`` would.
    """
    if fmt.kind == "chat" and not completion:
        ids = model.tokenize(text, add_special=False, parse_special=True)
        if model.add_bos and (not ids or ids[0] != model.bos):
            ids = [model.bos] + ids
        return ids
    return model.tokenize(text)
