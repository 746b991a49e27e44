"""The sessions of ``specviz serve``: the session cap, parking idle sessions, and what a page may name.

Real llama.cpp sessions on the tiny fixture model, driven through :class:`ManagedSession` directly and
through the inspector's :class:`InspectorCore` (which is what a page talks to), without a browser.
"""

from __future__ import annotations

import json
import threading

import pytest
from conftest import TINY

from specviz import Session
from specviz.server.catalog import DraftCatalog
from specviz.server.pool import ManagedSession, SessionPool, SharedDraftModels
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama
from specviz.ui.core import InspectorCore

PROMPT = "the cat sat on the mat and the cat sat"
SECRET = "TOP-SECRET-LINE do not show me"


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory):
    """A one-layer draft sharing the tiny target's vocabulary."""
    w = tiny_weights(**{"seed": TINY["seed"], "block_scale": TINY["block_scale"]})
    return str(write_tiny_llama(tmp_path_factory.mktemp("draft") / "good-draft.gguf", n_layer=1, layers_from=w))


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
    """A file that is not a model, whose bytes must never reach a page."""
    p = tmp_path_factory.mktemp("secret") / "secret.txt"
    p.write_text(SECRET + "\n" + "x" * 100)
    return str(p)


@pytest.fixture(scope="module")
def other_vocab_path(tmp_path_factory):
    """A GGUF whose vocabulary differs from the tiny target's (token texts that must not be quoted)."""
    return str(
        write_tiny_llama(
            tmp_path_factory.mktemp("other") / "other-vocab.gguf",
            seed=5,
            token_overrides={300: "▁zzzsecret", 301: "▁yyysecret"},
        )
    )


def make_factory(model):
    return lambda: Session(model, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1)


class Sink:
    """The messages an inspector core sent to its page."""

    def __init__(self):
        self.msgs: list[dict] = []

    def __call__(self, msg):
        self.msgs.append(msg)

    def text(self) -> str:
        return json.dumps(self.msgs)


def test_the_session_cap_turns_pages_away_and_a_closed_page_frees_its_place(tiny_model):
    pool = SessionPool(make_factory(tiny_model), max_sessions=2)
    try:
        a, b = pool.open(), pool.open()
        assert a is not None and b is not None
        assert pool.open() is None and pool.refused == 1  # the third page is told the server is busy
        assert pool.live == 2
        pool.close(a)
        c = pool.open()
        assert c is not None and pool.live == 2
        assert pool.open() is None and pool.refused == 2
    finally:
        pool.close_all()
    with pytest.raises(ValueError):
        SessionPool(make_factory(tiny_model), max_sessions=0)


def test_a_parked_session_frees_its_context_and_continues_exactly_where_it_was(tiny_model, draft_path):
    """Park mid-generation (draft model and all), queue a change while parked, then step: the tokens are
    those of a session that was never parked."""
    catalog = DraftCatalog([draft_path])
    drafts = SharedDraftModels(tiny_model)
    ms = ManagedSession(make_factory(tiny_model), catalog=catalog, drafts=drafts)
    ref = make_factory(tiny_model)()
    ref.draft_models = drafts
    try:
        ms.start(PROMPT, max_tokens=300, strategy="draft", draft_model=catalog.names[0])
        ref.start(PROMPT, max_tokens=300, strategy="draft", draft_model=draft_path)
        for _ in range(6):
            ms.step()
            ref.step()
        inner = ms._inner
        assert ms.release() and ms.released
        assert inner.ctx._ctx is None, "the llama.cpp context was freed"
        assert not ms.release(), "parking a parked session does nothing"
        # what the page reads while parked comes from the parked session, without waking it
        assert ms.started and ms.finished is None and ms.strategy == "draft"
        assert ms.knobs["draft_model"] == catalog.names[0]
        assert ms.released
        ms.configure(draft_max=3)  # queued while parked, applied after the restore
        ref.configure(draft_max=3)
        while ref.finished is None:
            ms.step()
            ref.step()
        assert ms.finished == ref.finished
        assert ms.tokens == ref.tokens
        assert ms.knobs["draft_max"] == 3
        assert (ms.releases, ms.restores) == (1, 1)
    finally:
        ms.close()
        ref.close()
        drafts.close_all()


def test_idle_sessions_are_parked_by_the_pool_and_come_back_on_the_next_action(tiny_model):
    now = [1000.0]
    pool = SessionPool(make_factory(tiny_model), max_sessions=3, idle_timeout=60, clock=lambda: now[0])
    try:
        a, b = pool.open(), pool.open()
        for ms in (a, b):
            ms.start(PROMPT, max_tokens=100, strategy="prompt-lookup")
        now[0] += 30
        b.step()  # b acts; a stays idle
        now[0] += 40  # a idle 70 s, b 40 s
        assert pool.release_idle() == 1
        assert a.released and not b.released and pool.live == 1
        before = list(a.tokens)
        a.step()  # the next action brings it back
        assert not a.released and a.restores == 1 and len(a.tokens) > len(before) and a.tokens[: len(before)] == before
        # the background reaper does the same on its own
        pool.start_reaper(interval=0.01)
        now[0] += 120
        done = threading.Event()
        for _ in range(6000):
            if a.released and b.released:
                break
            done.wait(0.01)
        assert a.released and b.released and pool.live == 0
    finally:
        pool.close_all()


def test_a_page_naming_a_path_is_refused_and_the_file_is_never_opened(tiny_model, draft_path, secret_file, monkeypatch):
    """The knob form's draft_model with a server path (and a path given to Reset's strategy): refused
    with the names on offer; the reply holds none of the file's bytes; nothing changed."""
    import specviz.backends.llama as llama

    opened: list[str] = []
    real = llama.check_gguf
    monkeypatch.setattr(llama, "check_gguf", lambda p: (opened.append(str(p)), real(p))[1])
    catalog = DraftCatalog([draft_path])
    ms = ManagedSession(make_factory(tiny_model), catalog=catalog, drafts=SharedDraftModels(tiny_model))
    sink = Sink()
    try:
        ms.start(PROMPT, max_tokens=100, strategy="prompt-lookup")
        core = InspectorCore(sink, ms, prompt=PROMPT, draft_models=catalog.names)
        core.handle({"type": "cmd", "cmd": "step"})
        core.wait(30)
        before = (list(ms.tokens), ms.strategy, dict(ms.knobs), list(core.log))
        sink.msgs.clear()
        for value in (secret_file, "../../etc/passwd", "/etc/shadow", "x" * 1000):
            core.handle({"type": "configure", "strategy": "draft", "knobs": {"draft_model": value}})
        errors = [m for m in sink.msgs if m["type"] == "knob_errors"]
        assert len(errors) == 4 and all("draft_model" in m["errors"] for m in errors)
        assert "not one of the server's draft models" in errors[0]["errors"]["draft_model"]
        assert catalog.names[0] in errors[0]["errors"]["draft_model"]  # what may be picked
        assert SECRET not in sink.text() and "x" * 100 not in sink.text()
        assert opened == [], f"files were opened for a page: {opened}"
        assert (list(ms.tokens), ms.strategy, dict(ms.knobs), list(core.log)) == before
        assert ms._inner.generation.pending is None  # nothing queued
        # picking by name (or position) works, and only then is the catalogued file opened
        sink.msgs.clear()
        core.handle({"type": "configure", "strategy": "draft", "knobs": {"draft_model": catalog.names[0]}})
        assert sink.msgs[0] == {"type": "knob_errors", "errors": {}, "general": None}
        assert opened == [draft_path]
        sink.msgs.clear()
        core.handle({"type": "configure", "strategy": "draft", "knobs": {"draft_model": "0"}})
        assert [m["errors"] for m in sink.msgs if m["type"] == "knob_errors"] == [{}]
    finally:
        ms.close()


def test_an_unusable_draft_on_offer_is_reported_without_the_files_contents(tiny_model, secret_file, other_vocab_path):
    """The operator offered a file that is no GGUF and a model of another vocabulary: a page that picks
    them learns what is wrong, never the bytes (the magic) or the token texts."""
    catalog = DraftCatalog([secret_file, other_vocab_path])
    ms = ManagedSession(make_factory(tiny_model), catalog=catalog, drafts=SharedDraftModels(tiny_model))
    sink = Sink()
    try:
        ms.start(PROMPT, max_tokens=100, strategy="prompt-lookup")
        core = InspectorCore(sink, ms, prompt=PROMPT, draft_models=catalog.names)
        for name in catalog.names:
            core.handle({"type": "configure", "strategy": "draft", "knobs": {"draft_model": name}})
        errs = [m["errors"]["draft_model"] for m in sink.msgs if m["type"] == "knob_errors"]
        assert len(errs) == 2
        assert "is not a usable GGUF file" in errs[0]
        assert "does not share the target's vocabulary" in errs[1]
        text = sink.text()
        for leak in ("TOP-SECRET", "TOP-", "zzzsecret", "yyysecret", "magic b'"):
            assert leak not in text
        # a Reset with the draft strategy is refused the same way
        sink.msgs.clear()
        with pytest.raises(Exception) as e:
            ms.start(PROMPT, max_tokens=10, strategy="draft", draft_model=catalog.names[0])
        assert "TOP-" not in str(e.value) and secret_file not in str(e.value)
        assert ms.strategy == "prompt-lookup"
    finally:
        ms.close()


def test_pages_are_sent_model_names_never_server_paths(tiny_model, draft_path):
    catalog = DraftCatalog([draft_path])
    ms = ManagedSession(make_factory(tiny_model), catalog=catalog, drafts=SharedDraftModels(tiny_model))
    sink = Sink()
    try:
        core = InspectorCore(sink, ms, prompt=PROMPT, draft_models=catalog.names)
        ms.start(PROMPT, max_tokens=60, strategy="draft", draft_model=catalog.names[0])
        core.handle({"type": "cmd", "cmd": "run", "n": 3})
        core.wait(30)
        core.handle({"type": "configure", "strategy": "draft", "knobs": {"draft_max": "2"}})
        core.handle({"type": "cmd", "cmd": "step"})
        core.wait(30)
        core.handle({"type": "hello", "epoch": -1, "have": 0})
        text = sink.text()
        kinds = {e["kind"] for m in sink.msgs if m["type"] == "events" for e in m["events"]}
        assert {"session_started", "knobs_changed", "telemetry"} <= kinds
        assert str(tiny_model.path.parent) not in text and "/tmp" not in text and draft_path not in text
        started = next(
            e for m in sink.msgs if m["type"] == "events" for e in m["events"] if e["kind"] == "session_started"
        )
        assert started["model"] == tiny_model.path.name
        assert started["draft_model"] == catalog.names[0] and started["knobs"]["draft_model"] == catalog.names[0]
        assert ms.telemetry_dict()["draft_model"] == catalog.names[0]
    finally:
        ms.close()


def test_the_draft_catalog_names_and_positions():
    cat = DraftCatalog(["/a/x.gguf", "/b/x.gguf", "/a/x.gguf", "/c/y.gguf"])
    assert cat.names == ["x", "x-2", "y"]
    assert cat.path_for("x-2") == "/b/x.gguf" and cat.path_for(2) == "/c/y.gguf" and cat.path_for("0") == "/a/x.gguf"
    assert cat.name_for("/b/x.gguf") == "x-2" and cat.name_for("y") == "y"
    assert cat.name_for("/somewhere/else/z.gguf") == "z.gguf"  # never a directory
    for bad in ("/a/x.gguf", "3", -1, True, None, "", "x" * 300, {"path": "/a/x.gguf"}):
        with pytest.raises(Exception, match="not one of the server's draft models"):
            cat.path_for(bad)


def test_gguf_check_never_quotes_the_files_bytes(secret_file):
    from specviz.backends.gguf_check import check_gguf
    from specviz.errors import ModelFormatError

    with pytest.raises(ModelFormatError) as e:
        check_gguf(secret_file)
    assert "TOP-" not in str(e.value) and "not a GGUF file" in str(e.value)


def test_a_snapshot_a_page_gets_names_no_path_and_one_naming_a_file_is_refused_unopened(
    tiny_model, draft_path, secret_file, monkeypatch
):
    """The workbench lets a page download a snapshot and upload one: the download names the models without
    server paths and restores; an upload naming a file (the draft model's path) is refused before any file
    is opened, and the session is as it was."""
    import specviz.backends.llama as llama
    from specviz.decoding.snapshot import pack, unpack
    from specviz.errors import SnapshotError

    catalog = DraftCatalog([draft_path])
    ms = ManagedSession(make_factory(tiny_model), catalog=catalog, drafts=SharedDraftModels(tiny_model))
    try:
        ms.start(PROMPT, max_tokens=200, strategy="draft", draft_model=catalog.names[0])
        for _ in range(3):
            ms.step()
        ms.configure(draft_max=4)  # a pending change travels too
        blob = ms.snapshot()
        header, blobs = unpack(blob)
        text = json.dumps(header)
        assert draft_path not in text and str(tiny_model.path) not in text and "/tmp" not in text
        assert header["knobs"]["draft_model"] == catalog.names[0] and header["model"] == tiny_model.path.name
        ms.step()
        ms.restore_into(blob)  # back to where the snapshot was taken
        assert len(ms.tokens) == len(header["history"]) - header["n_prompt"]
        # the events a page is sent are the restored generation's, still without paths
        assert [e.kind for e in ms.events] == [e["kind"] for e in header["workbench"]["events"]]
        assert draft_path not in json.dumps([e.to_dict() for e in ms.events])
        ms.step()
        assert ms.knobs["draft_max"] == 4
        ms.rewind(1)  # a restored checkpoint reconfigures its draft model by the path the catalog maps back
        assert ms.round_index == 1 and ms.knobs["draft_model"] == catalog.names[0]
        ms.step()
        opened: list[str] = []
        real = llama.check_gguf
        monkeypatch.setattr(llama, "check_gguf", lambda p: (opened.append(str(p)), real(p))[1])
        before = list(ms.tokens)
        for field in ("knobs", "pending", "checkpoints"):
            h = dict(header)
            h.pop("blobs")
            if field == "knobs":
                h["knobs"] = {**h["knobs"], "draft_model": secret_file}
            elif field == "pending":
                h["pending"] = [h["pending"][0], {**h["pending"][1], "draft_model": secret_file}]
            else:
                wb = h["workbench"]
                h["workbench"] = {
                    **wb,
                    "checkpoints": [
                        {**c, "knobs": {**c["knobs"], "draft_model": secret_file}} for c in wb["checkpoints"]
                    ],
                }
            with pytest.raises(SnapshotError, match="not one of the server's draft models") as e:
                ms.restore_into(pack(h, list(blobs.items())))
            assert SECRET not in str(e.value)
        assert opened == [] and ms.tokens == before
    finally:
        ms.close()


def test_a_compare_lane_on_a_page_takes_turns_and_names_no_path(tiny_model, draft_path):
    """The workbench's second lane is a fork of the page's session: its rounds must take turns with the
    other sessions (the scheduler's one-decode-at-a-time promise) and its events must name no server path."""
    from specviz.server.scheduler import RoundScheduler

    catalog = DraftCatalog([draft_path])
    sched = RoundScheduler()
    ms = ManagedSession(
        make_factory(tiny_model), scheduler=sched, catalog=catalog, drafts=SharedDraftModels(tiny_model)
    )
    sink = Sink()
    try:
        core = InspectorCore(sink, ms, prompt=PROMPT, draft_models=catalog.names)
        ms.start(PROMPT, max_tokens=12, strategy="prompt-lookup")
        core.handle(
            {
                "type": "lane",
                "cmd": "compare",
                "strategy": "draft",
                "knobs": {"draft_model": catalog.names[0], "draft_max": "3"},
            }
        )
        core.wait(60)
        lane = core.workbench.lane
        assert isinstance(lane, ManagedSession) and lane is not ms
        assert lane.finished is not None and ms.finished is not None
        assert sched.grants[lane] >= 2  # the fork itself, then every round of the lane
        assert sched.grants[ms] >= 2
        comparisons = [m for m in sink.msgs if m["type"] == "comparison" and m.get("data")]
        assert comparisons, "the page was sent no comparison"
        text = sink.text()
        assert draft_path not in text and str(tiny_model.path.parent) not in text
        assert all(e.draft_model in (None, catalog.names[0]) for e in lane.events if e.kind == "session_started")
        # a path named for the lane is refused like any other: nothing is opened, the lane stays as it was
        core.handle({"type": "lane", "cmd": "configure", "strategy": "draft", "knobs": {"draft_model": draft_path}})
        assert sink.msgs[-1]["type"] in ("notice", "knob_errors")
        assert "not one of the server's draft models" in json.dumps(sink.msgs[-1])
        assert core.workbench.lane is lane and lane.knobs["draft_model"] == catalog.names[0]
    finally:
        core.workbench.close_lane()
        ms.close()
