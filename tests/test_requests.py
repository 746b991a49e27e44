"""Real requests: chat templates from the GGUF, and stop strings equal to plain decoding's."""

from __future__ import annotations

import pytest
from conftest import TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specviz import Session
from specviz.backends import LlamaModel
from specviz.errors import ChatTemplateError, KnobError
from specviz.testing.tiny_models import write_tiny_llama

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat of the dog"}]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The tiny fixture with a chat template in its GGUF."""
    path = write_tiny_llama(tmp_path_factory.mktemp("chat") / "chat.gguf", chat_template=CHATML, **TINY)
    m = LlamaModel(path)
    yield m
    m.close()


def test_chat_uses_the_models_own_template(chat_model):
    from specviz.decoding.chat import apply_chat_template, model_chat_template

    assert model_chat_template(chat_model) == CHATML
    text = apply_chat_template(chat_model, MESSAGES)
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nthe cat of the dog<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    s = Session(chat_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        ev = s.start(messages=MESSAGES, max_tokens=12, strategy="prompt-lookup")
        assert s.prompt_tokens == chat_model.tokenize(text, add_special=True, parse_special=True)
        assert list(ev.prompt_tokens) == s.prompt_tokens and "".join(ev.prompt_pieces).endswith("assistant\n")
        assert ev.chat_template == "model" and [dict(m) for m in ev.messages] == MESSAGES
        s.run()
        assert s.finished is not None
    finally:
        s.close()


def test_a_model_without_a_template_is_refused_and_nothing_changes(tiny_session):
    s = tiny_session
    s.start("the cat", 5, "none")
    before = (list(s.history), len(s.events))
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        s.start(messages=MESSAGES, max_tokens=5)
    with pytest.raises(ChatTemplateError, match="does not recognise"):
        s.start(messages=MESSAGES, max_tokens=5, chat_template="no-such-template")
    with pytest.raises(ChatTemplateError, match="role 'robot'"):
        s.start(messages=[{"role": "robot", "content": "x"}], chat_template="chatml")
    with pytest.raises(KnobError, match="not both"):
        s.start("text", messages=MESSAGES, chat_template="chatml")
    with pytest.raises(KnobError, match="give a prompt"):
        s.start(max_tokens=4)
    assert (list(s.history), len(s.events)) == before
    # a built-in template by name works on a model without one
    ev = s.start(messages=MESSAGES, max_tokens=4, chat_template="gemma")
    assert "<start_of_turn>user\n" in "".join(ev.prompt_pieces) and ev.chat_template == "gemma"


# -- stop strings ------------------------------------------------------------------------------------


def generate(s, prompt, strategy, n, stop=None, **knobs):
    s.start(prompt, n, strategy, stop=stop, **knobs)
    rounds = s.run()
    assert s.kv_length == s.committed
    if s.drafter.has_context:
        assert s.drafter.kv_length() == s.committed
    return list(s.tokens), s.text, s.finished, rounds


def expected_cut(model, tokens, stop):
    """Independent reference: the first token after which the text holds the stop string, and the text
    before it."""
    text = b""
    for j, t in enumerate(tokens):
        text += model.piece_bytes(t) if not (t == model.bos or model.is_eog(t)) else b""
        at = text.find(stop.encode())
        if at >= 0:
            return tokens[: j + 1], text[:at].decode("utf-8", "replace")
    return tokens, text.decode("utf-8", "replace")


SPECULATIVE = ["prompt-lookup", "ngram-simple", "ngram-map-k4v", "ngram-cache"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.text(alphabet="the cat of dog and a 12,.", min_size=4, max_size=40),
    start=st.integers(0, 200),
    length=st.integers(1, 6),
    strategy=st.sampled_from(SPECULATIVE),
)
@pytest.mark.slow
def test_stop_strings_equal_plain_decoding(tiny_session, tiny_model, prompt, start, length, strategy):
    s = tiny_session
    plain, text, _, _ = generate(s, prompt, "none", 60)
    # a stop string taken from the plain text (so it occurs), often spanning two tokens or more
    clean = text.replace("\ufffd", "")
    if not clean.strip():
        return
    i = start % len(clean)
    stop = clean[i : i + length]
    ref_tokens, ref_text = expected_cut(tiny_model, plain, stop)
    p_tokens, p_text, p_fin, _ = generate(s, prompt, "none", 60, stop=[stop])
    assert (p_tokens, p_text) == (ref_tokens, ref_text)
    kn = {"size_n": 2, "size_m": 8} if strategy.startswith("ngram-") and strategy != "ngram-cache" else {}
    tokens, out, fin, _ = generate(s, prompt, strategy, 60, stop=[stop, "\u2603never"], draft_max=8, **kn)
    assert tokens == p_tokens and out == p_text and fin == p_fin
    if fin == "stop":
        assert stop not in out and out + stop in text


def test_a_stop_string_spanning_a_draft_boundary_and_two_tokens(tiny_session, tiny_model):
    """Stop strings whose first occurrence crosses a token boundary inside a speculative round: across
    the round's start (the previous round's last token and a drafted one) and between two drafted tokens."""
    s = tiny_session
    cases = {"boundary": 0, "inside": 0}
    for prompt in ("def f(x): return x + x + x", "the cat of the dog and the a the cat of the"):
        plain, text, _, _ = generate(s, prompt, "none", 60)
        _, _, _, rounds = generate(s, prompt, "prompt-lookup", 60, draft_max=8)
        pieces = [tiny_model.piece(t) for t in plain]
        n_prompt = len(s.prompt_tokens)
        for r in rounds:
            a = r.of_kind("accepted")[0]
            k = a.position - n_prompt  # the round's first generated token
            for j in range(max(k, 1), k + len(a.tokens)):
                if len(a.tokens) < 2:
                    continue
                # "boundary": from the last character before the round to token j; "inside": tokens j-1, j
                for kind, first in (("boundary", k - 1), ("inside", j - 1)):
                    if cases[kind] >= 3 or first < 0 or (kind == "inside" and first < k):
                        continue
                    body = "".join(pieces[first:j])
                    if "\ufffd" in body + pieces[j] or not pieces[first] or not pieces[j]:
                        continue
                    stop = body[-(len(body) - len(pieces[first]) + 1) :] + pieces[j][:1]
                    ref_tokens, ref_text = expected_cut(tiny_model, plain, stop)
                    if len(ref_tokens) != j + 1:
                        continue  # it occurs earlier: not the case wanted
                    tokens, out, fin, got = generate(s, prompt, "prompt-lookup", 60, stop=stop, draft_max=8)
                    assert fin == "stop" and tokens == ref_tokens and out == ref_text, (prompt, stop)
                    assert s.events[-1].message == f"stop string {stop!r}"
                    last = got[-1].of_kind("draft_proposed")[0]
                    assert last.tokens, "the round that met the stop string had drafted"
                    cases[kind] += 1
    assert cases["boundary"] >= 1 and cases["inside"] >= 1, cases


def test_stop_then_rewind_and_continue(tiny_session, tiny_model):
    s = tiny_session
    prompt = "the cat of the dog and the a the cat of the"
    plain, text, _, _ = generate(s, prompt, "none", 60)
    i = next(
        i for i in range(len(text) // 2, len(text)) if "\ufffd" not in text[i : i + 3] and len(text[i : i + 3]) == 3
    )
    stop = text[i : i + 3]
    tokens, out, fin, _ = generate(s, prompt, "prompt-lookup", 60, stop=stop)
    assert fin == "stop"
    n = s.round_index
    s.rewind(max(n - 2, 0))
    assert s.finished is None and len(s.tokens) < len(tokens)
    s.run()
    assert s.tokens == tokens and s.text == out and s.finished == "stop"
    s.rewind(n)
    assert s.finished == "stop" and s.text == out
    blob = s.snapshot()
    r = Session.restore(blob, model=tiny_model)
    try:
        assert r.generation.stop == (stop,) and r.text == out
    finally:
        r.close()


def test_bad_stop_values_are_refused(tiny_session):
    for bad in ([""], [1], ["x" * 300], ["a"] * 20, 5):
        with pytest.raises(KnobError):
            tiny_session.start("the cat", 5, "none", stop=bad)
