"""Chat requests: the model's own chat template (from its GGUF) applied by llama.cpp.

:func:`apply_chat_template` reads the template with ``llama_model_chat_template`` and formats the
messages with ``llama_chat_apply_template`` (both through llama-cpp-python's low-level bindings), ending
with the assistant's turn. llama.cpp recognises the templates it has built in (chatml, llama3, gemma,
mistral …) by their text; a model without a template, or with one llama.cpp does not recognise, is
refused with :class:`~specviz.errors.ChatTemplateError`, and ``chat_template=`` can then name a
built-in template instead (:func:`builtin_templates`).

The formatted text is tokenized with special tokens parsed (``<start_of_turn>`` becomes that token,
not its characters), as llama.cpp's server does.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

from ..errors import ChatTemplateError

#: Roles a message may have.
ROLES = ("system", "user", "assistant", "tool")


def _lc() -> Any:
    import llama_cpp

    return llama_cpp


def model_chat_template(model: Any) -> str | None:
    """The chat template stored in the model's GGUF (``tokenizer.chat_template``), or None."""
    t = _lc().llama_model_chat_template(model.ptr, None)
    return t.decode("utf-8", "replace") if t else None


def builtin_templates() -> list[str]:
    """Names of the chat templates llama.cpp has built in."""
    lc = _lc()
    n = int(lc.llama_chat_builtin_templates(None, 0))
    arr = (ctypes.c_char_p * max(n, 1))()
    lc.llama_chat_builtin_templates(arr, n)
    return sorted(a.decode() for a in arr[:n] if a)


def check_messages(messages: Any) -> list[dict[str, str]]:
    """``messages`` as a list of ``{"role", "content"}`` with known roles and text content, or
    :class:`~specviz.errors.ChatTemplateError` naming the first bad one."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("messages: expected a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ChatTemplateError(f"messages[{i}]: expected {{'role': str, 'content': str}}; got {m!r:.80}")
        if m["role"] not in ROLES:
            raise ChatTemplateError(f"messages[{i}]: role {m['role']!r} is not one of {', '.join(ROLES)}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def apply_chat_template(
    model: Any, messages: Sequence[dict[str, str]], *, template: str | None = None, add_generation_prompt: bool = True
) -> str:
    """The prompt text for ``messages`` under the model's chat template (or the built-in ``template``),
    ending with the assistant's turn when ``add_generation_prompt``."""
    msgs = check_messages(messages)
    if template is None:
        template = model_chat_template(model)
        if template is None:
            raise ChatTemplateError(
                f"the model {getattr(model, 'path', '')} has no chat template in its GGUF "
                "(tokenizer.chat_template); give the prompt as text, or name one of llama.cpp's built-in templates "
                f"with chat_template= ({', '.join(builtin_templates()[:8])} …)"
            )
    lc = _lc()
    keep = [(m["role"].encode(), m["content"].encode()) for m in msgs]  # alive while llama.cpp reads them
    arr = (lc.llama_chat_message * len(keep))()
    for i, (r, c) in enumerate(keep):
        arr[i].role, arr[i].content = r, c
    tmpl = template.encode()
    size = 256 + sum(len(r) + len(c) for r, c in keep) * 2
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = int(lc.llama_chat_apply_template(tmpl, arr, len(keep), add_generation_prompt, buf, size))
        if n < 0:
            raise ChatTemplateError(
                "llama.cpp does not recognise this chat template (it formats only the templates it has built in); "
                f"name a built-in one with chat_template= ({', '.join(builtin_templates()[:8])} …)"
            )
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n + 1
    raise ChatTemplateError("the formatted chat did not fit its buffer")  # pragma: no cover
