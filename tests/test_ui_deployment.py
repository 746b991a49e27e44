"""The new-session form's deployment settings (specviz.ui.deployment) through the inspector core, as a page
sends them: the context settings chosen in fields, or a whole llama-server command line, on a live session
of the page's own; refused, changing nothing, where they do not apply (a bad value, a prompt the new
context cannot hold, another model's -m, a page of ``specviz serve``)."""

from __future__ import annotations

import pytest
from conftest import TINY
from declared_messages import sent_messages_are_declared  # noqa: F401 (an autouse fixture)
from test_ui_messages import Sink, error_shown, notices, snapshot

from specviz import Session
from specviz.server.pool import ManagedSession
from specviz.testing.tiny_models import write_tiny_llama
from specviz.ui.core import InspectorCore

PROMPT = "the cat of the dog and the a the cat of the"


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """A tiny llama whose heads are 32 wide: quantized KV caches fit it."""
    return write_tiny_llama(tmp_path_factory.mktemp("heads") / "wide.gguf", n_head=2, n_head_kv=1, **TINY)


@pytest.fixture()
def live(wide_heads):
    s = Session(wide_heads, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    s.start(PROMPT, max_tokens=12, strategy="prompt-lookup", draft_max=6)
    sink = Sink()
    core = InspectorCore(sink, s)
    yield core, sink
    core.close()
    s.close()


def last_state(sink):
    return [m for m in sink.msgs if m["type"] == "state"][-1]


def refused(core, sink, msg, text):
    before, settings = snapshot(core), core.session.settings
    n = len(sink.msgs)
    core.handle(msg)
    answer = sink.msgs[n:]
    assert error_shown(answer) and any(text in x for x in notices(answer)), (msg, answer)
    assert snapshot(core) == before and core.session.settings == settings


def test_the_state_offers_the_settings_and_the_cache_types_the_heads_allow(live, tiny_model):
    core, sink = live
    core.handle({"type": "hello", "epoch": -1, "have": 0})
    st = last_state(sink)
    assert st["settings"] == core.session.settings.to_dict()
    assert st["setting_choices"]["flash_attn"] == ["auto", "on", "off"]
    assert "q8_0" in st["setting_choices"]["cache_types"]
    # the conftest's tiny model has 16-wide heads: no quantized type fits it
    s = Session(tiny_model, n_ctx=256, n_threads=1)
    other = Sink()
    c = InspectorCore(other, s)
    c.handle({"type": "hello", "epoch": -1, "have": 0})
    assert last_state(other)["setting_choices"]["cache_types"] == ["f32", "f16", "bf16"]
    c.close()
    s.close()


def test_a_reset_with_chosen_settings_makes_the_context_anew(live):
    core, sink = live
    core.step(2)
    context = {"flash_attn": "on", "cache_type_k": "q8_0", "cache_type_v": "q8_0", "n_ctx": 1024, "n_ubatch": 32}
    core.handle({"type": "cmd", "cmd": "reset", "context": context})
    s = core.session
    assert (s.settings.flash_attn, s.settings.cache_type_k, s.settings.cache_type_v) == ("on", "q8_0", "q8_0")
    assert (s.settings.n_ctx, s.settings.n_batch, s.settings.n_ubatch, s.settings.n_threads) == (1024, 64, 32, 1)
    assert core.log[0]["kind"] == "session_started" and core.log[0]["n_ctx"] == 1024
    assert s.strategy == "prompt-lookup" and s.knobs["draft_max"] == 6  # the same generation again
    assert last_state(sink)["settings"]["cache_type_k"] == "q8_0"
    core.step(20)
    assert len(s.tokens) == 12
    # a blank field keeps its setting; the same settings again make nothing new
    ctx = s.ctx
    core.handle({"type": "cmd", "cmd": "reset", "context": {"flash_attn": "", "n_ctx": None, "cache_type_k": "q8_0"}})
    assert s.ctx is ctx and s.started and s.round_index == 0


def test_a_refused_setting_or_start_changes_nothing(live):
    core, sink = live
    core.step(2)
    for context, text in (
        ({"flash_attn": "off", "cache_type_v": "q8_0"}, "needs flash attention"),
        ({"cache_type_k": "q3_k"}, "not a KV cache type"),
        ({"n_ctx": "lots"}, "is not an integer"),
        ({"n_batch": 32}, "larger than n_batch"),  # n_ubatch stays 64
        ({"n_ctl": 1024}, "unknown context setting 'n_ctl'"),
        ({"n_ctx": 8}, "the context holds 8"),  # the prompt and a token would not fit the new context
    ):
        refused(core, sink, {"type": "cmd", "cmd": "reset", "context": context}, text)
    refused(core, sink, {"type": "cmd", "cmd": "reset", "context": {"n_ctx": 1024}, "top_p": 1.5}, "top_p")
    refused(
        core,
        sink,
        {"type": "cmd", "cmd": "reset", "context": {"n_ctx": 1024}, "server_args": "-fa on"},
        "either in the fields or in the llama-server line",
    )
    core.step(1)  # still usable
    assert core.session.round_index == 3


@pytest.mark.slow
def test_a_reset_with_a_server_command_line_runs_its_configuration(live, wide_heads, tiny_model_path):
    core, sink = live
    line = (
        f"llama-server -m {wide_heads} --spec-type ngram-simple --spec-ngram-simple-size-n 2 -fa off -c 1024 "
        "-ctk q8_0 --port 8081 --min-p 0.1"
    )
    n = len(sink.msgs)
    core.handle({"type": "cmd", "cmd": "reset", "server_args": line, "max_tokens": 10})
    s = core.session
    assert s.strategy == "ngram-simple" and s.knobs["size_n"] == 2
    assert (s.settings.flash_attn, s.settings.cache_type_k, s.settings.n_ctx) == ("off", "q8_0", 1024)
    assert s.settings.n_batch == 512  # where the line gives none: what `specviz run --server-args` takes
    warned = [m["text"] for m in sink.msgs[n:] if m["type"] == "notice" and m["level"] == "warning"]
    assert any("--port" in w for w in warned) and any("--min-p" in w for w in warned), warned
    # the page's session was made before the line came: its prompt layout is its own, and that is said
    assert any("speculative-simple" in w and "near-tie" in w for w in warned), warned
    assert not error_shown(sink.msgs[n:])
    core.step(30)
    assert len(s.tokens) == 10 and s.strategy == "ngram-simple"
    for line, text in (
        (f"-m {tiny_model_path} --spec-type ngram-simple", "is not this session's model"),
        ("--spec-type ngram-nothing", "ngram-nothing"),
        ("-ctv q8_0 -fa off", "needs flash attention"),
        ("x" * 4001, "at most 4000 characters"),
    ):
        refused(core, sink, {"type": "cmd", "cmd": "reset", "server_args": line}, text)


@pytest.mark.slow
def test_a_lines_other_gpu_placement_is_said_and_the_pages_model_stays(live):
    """A page never reloads its model: a line's -ngl other than the page's placement is named in a warning
    (with the inspector's own -ngl that would match), the same one is not."""
    core, sink = live
    assert core.session.model.n_gpu_layers == 0
    n = len(sink.msgs)
    core.handle({"type": "cmd", "cmd": "reset", "server_args": "-ngl 5 -c 1024", "max_tokens": 6})
    warned = [m["text"] for m in sink.msgs[n:] if m["type"] == "notice" and m["level"] == "warning"]
    assert any("-ngl 5 puts 5 layers on the GPU" in w and "open the inspector with -ngl 5" in w for w in warned)
    assert not error_shown(sink.msgs[n:]) and core.session.model.n_gpu_layers == 0
    n = len(sink.msgs)
    core.handle({"type": "cmd", "cmd": "reset", "server_args": "-ngl 0 -c 1024", "max_tokens": 6})
    warned = [m["text"] for m in sink.msgs[n:] if m["type"] == "notice" and m["level"] == "warning"]
    assert not any("-ngl" in w for w in warned), warned
    refused(core, sink, {"type": "cmd", "cmd": "reset", "server_args": "-ngl lots"}, "-ngl: 'lots' is not allowed")


def test_a_served_page_gets_no_settings_and_may_not_change_them(tiny_model):
    ms = ManagedSession(lambda: Session(tiny_model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1))
    sink = Sink()
    try:
        ms.start(PROMPT, max_tokens=8, strategy="prompt-lookup")
        core = InspectorCore(sink, ms)
        core.handle({"type": "hello", "epoch": -1, "have": 0})
        assert "settings" not in last_state(sink) and "setting_choices" not in last_state(sink)
        for msg in (
            {"type": "cmd", "cmd": "reset", "context": {"n_ctx": 1024}},
            {"type": "cmd", "cmd": "reset", "server_args": "--spec-type ngram-mod"},
        ):
            refused(core, sink, msg, "runs with the server's context settings")
        n = len(sink.msgs)
        core.handle({"type": "cmd", "cmd": "reset", "context": {"flash_attn": ""}})  # nothing chosen: a plain reset
        assert ms.started and ms.round_index == 0 and not error_shown(sink.msgs[n:])
        core.close()
    finally:
        ms.close()


@pytest.mark.slow
def test_the_inspector_resets_with_a_deployment_from_python(wide_heads):
    from specviz import Inspector

    s = Session(wide_heads, n_ctx=512, n_threads=1)
    s.start(PROMPT, max_tokens=8, strategy="prompt-lookup")
    insp = Inspector(s)
    try:
        insp.reset(context={"flash_attn": "on", "cache_type_v": "q8_0"})
        assert (s.settings.flash_attn, s.settings.cache_type_v) == ("on", "q8_0") and s.started
        insp.reset(server_args="--spec-type ngram-mod -fa off -c 1024")
        assert s.strategy == "ngram-mod" and (s.settings.flash_attn, s.settings.n_ctx) == ("off", 1024)
    finally:
        insp.close()
        s.close()
