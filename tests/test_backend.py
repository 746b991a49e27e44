"""The llama.cpp backend on tiny real GGUF models: batches, rows, tails, state, bad files."""

from __future__ import annotations

import numpy as np
import pytest

from specviz.backends import LlamaContext, LlamaModel, check_gguf
from specviz.errors import ContextError, ModelFormatError, ModelNotFoundError


def test_tiny_model_loads_and_reports_capacity(tiny_model):
    assert tiny_model.n_vocab == 320
    assert tiny_model.n_layer == 2
    ctx = LlamaContext(tiny_model, n_ctx=256, n_batch=32, n_ubatch=16, n_threads=1)
    cap = ctx.capacity
    assert (cap.n_ctx, cap.n_batch, cap.n_ubatch, cap.n_swa) == (256, 32, 16, 0)
    ctx.close()


def test_tokenize_and_pieces_round_trip(tiny_model):
    ids = tiny_model.tokenize("the cat")
    assert ids[0] == tiny_model.bos
    # SentencePiece adds a space prefix; the text round-trips through the tokenizer
    text = tiny_model.detokenize(ids)
    assert text.strip() == "the cat"
    assert tiny_model.tokenize(text.strip()) == ids
    assert "".join(tiny_model.pieces(ids[1:])) == " the cat"
    # byte tokens render to their byte; a newline is a real newline
    nl = tiny_model.tokenize("\n", add_special=False)
    assert tiny_model.detokenize(nl).endswith("\n")
    assert tiny_model.piece(nl[-1]) == "\n"


def test_batch_rows_match_one_token_decoding(tiny_model):
    toks = tiny_model.tokenize("the a of and to in is it")
    ctx = LlamaContext(tiny_model, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    ctx.eval(toks, 0, rows="all")
    batch_rows = np.stack([ctx.row(i).copy() for i in range(len(toks))])
    ctx.clear()
    single = []
    for i, t in enumerate(toks):
        ctx.eval([t], i, rows="all")
        single.append(ctx.row(0).copy())
    assert np.max(np.abs(batch_rows - np.stack(single))) < 2e-3  # typical 1e-6, f32 reduction order
    ctx.close()


def test_logits_only_for_requested_rows(tiny_model):
    ctx = LlamaContext(tiny_model, n_ctx=64, n_batch=16, n_ubatch=16, n_threads=1)
    ctx.eval([1, 5, 6, 7], 0, rows=[3])
    assert ctx.row(3).shape == (320,)
    with pytest.raises(ContextError, match="not requested"):
        ctx.row(1)  # not requested
    ctx.close()


def test_row_is_a_view_not_a_copy(tiny_model):
    ctx = LlamaContext(tiny_model, n_ctx=64, n_batch=16, n_ubatch=16, n_threads=1)
    ctx.eval([1, 5], 0, rows="last")
    r = ctx.row(1)
    assert not r.flags.owndata
    ctx.close()


def test_truncate_removes_the_tail_and_state_round_trips(tiny_model):
    ctx = LlamaContext(tiny_model, n_ctx=64, n_batch=16, n_ubatch=16, n_threads=1)
    ctx.eval([1, 5, 6, 7, 8], 0, rows="none")
    assert ctx.kv_len() == 5
    ctx.truncate(3)
    assert ctx.kv_len() == 3
    saved = ctx.state()
    ctx.eval([9], 3, rows="all")
    after = ctx.row(0).copy()
    ctx.clear()
    assert ctx.kv_len() == 0
    ctx.load_state(saved)
    assert ctx.kv_len() == 3
    ctx.eval([9], 3, rows="all")
    assert np.array_equal(ctx.row(0), after)
    ctx.close()


def test_batch_larger_than_n_batch_is_refused(tiny_model):
    ctx = LlamaContext(tiny_model, n_ctx=64, n_batch=8, n_ubatch=8, n_threads=1)
    with pytest.raises(ContextError, match="n_batch"):
        ctx.eval(list(range(3, 13)), 0)
    ctx.close()


def test_missing_model_is_a_typed_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        LlamaModel(tmp_path / "nope.gguf")


def test_non_gguf_file_is_a_typed_error(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("this is not a model, just some text long enough to read a header from")
    with pytest.raises(ModelFormatError, match="not a GGUF"):
        LlamaModel(p)


def test_directory_is_a_typed_error(tmp_path):
    with pytest.raises(ModelFormatError, match="directory"):
        LlamaModel(tmp_path)


@pytest.mark.parametrize("fraction", [0.02, 0.3, 0.6, 0.95, 0.999])
def test_truncated_gguf_is_a_typed_error_and_the_process_survives(tiny_model_path, tmp_path, fraction):
    data = tiny_model_path.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelFormatError, match="truncated|corrupt"):
        LlamaModel(p)


def test_check_gguf_reads_the_tiny_model(tiny_model_path):
    info = check_gguf(tiny_model_path)
    assert info.architecture == "llama"
    assert info.n_tensors == 3 + 2 * 9


def test_context_parameters_are_validated(tiny_model):
    with pytest.raises(ContextError, match="n_ubatch"):
        LlamaContext(tiny_model, n_ctx=64, n_batch=16, n_ubatch=32, n_threads=1)
    with pytest.raises(ContextError, match="n_ctx"):
        LlamaContext(tiny_model, n_ctx=0)


def test_a_context_is_freed_once_by_close_or_by_leaving_a_with_block(tiny_model):
    with LlamaContext(tiny_model, n_ctx=64, n_batch=16, n_ubatch=16, n_threads=1) as ctx:
        ctx.eval([1, 2, 3], 0, rows="last")
        assert ctx.kv_len() == 3 and not ctx.closed
    assert ctx.closed
    with pytest.raises(ContextError, match="the context was closed"):
        ctx.ptr  # noqa: B018 - the property refuses a freed context instead of handing llama.cpp NULL
    ctx.close()  # idempotent


@pytest.mark.slow
def test_an_eval_callback_sees_the_graph_and_refuses_to_share_with_the_capture_shim(tiny_model):
    import llama_cpp.llama_cpp as lc

    seen: list[int] = []

    @lc.ggml_backend_sched_eval_callback
    def count(t, ask, user_data):  # noqa: ARG001 - signature fixed by ggml
        seen.append(1)
        return not ask

    ctx = LlamaContext(tiny_model, n_ctx=64, n_batch=16, n_ubatch=16, capture=False, eval_callback=count)
    ctx.eval([1, 2, 3], 0, rows="last")
    assert seen and ctx.eval_callback is count  # kept alive as long as the context
    ctx.close()
    with pytest.raises(ContextError, match="either the layer-capture shim or an eval_callback"):
        LlamaContext(tiny_model, n_ctx=64, n_batch=16, n_ubatch=16, capture=True, eval_callback=count)


@pytest.mark.slow
def test_the_shim_builds_from_its_own_command_without_a_runpy_warning():
    """``python -m specviz.backends.build_capture`` (what ``make install`` and the GPU check run) prints the
    built shim's path; with warnings as errors it still runs: it is not a module the package imports first,
    which ``-m`` would run as a second copy (runpy's RuntimeWarning, as ``-m specviz.backends.capture`` did)."""
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run(
        [sys.executable, "-W", "error", "-m", "specviz.backends.build_capture"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Warning" not in r.stderr, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines and Path(lines[-1]).is_file(), r.stdout


class DeviceWait:
    """A stand-in for ``llama_synchronize`` that takes ``seconds`` (as a GPU finishing a queued graph
    would) and records which context it waited for and what had been called before it."""

    def __init__(self, monkeypatch, seconds: float) -> None:
        import llama_cpp.llama_cpp as lc

        self.seconds = seconds
        self.calls: list[tuple[int, list[str]]] = []
        self.seen: list[str] = []
        real_sync = lc.llama_synchronize
        for name in ("llama_decode", "llama_process"):
            real = getattr(lc, name)

            def queued(*args, _real=real, _name=name):
                self.seen.append(_name)
                return _real(*args)

            monkeypatch.setattr(lc, name, queued)

        def wait(ctx):
            import time

            time.sleep(seconds)
            self.calls.append((int(ctx or 0), list(self.seen)))
            return real_sync(ctx)

        monkeypatch.setattr(lc, "llama_synchronize", wait)

    def check(self, context, decode, call: str) -> None:
        """``decode()`` on ``context`` waited for the device once, after its ``call``, inside the time the
        context reports (``decode_seconds``)."""
        before = context.decode_seconds
        decode()
        assert [c for c, _ in self.calls] == [int(context.ptr)]
        assert self.calls[0][1] == [call]  # after the decode (or process) call, once
        assert context.decode_seconds - before >= self.seconds


def test_a_decode_waits_for_the_device_inside_the_time_it_reports(tiny_model, monkeypatch):
    # On a GPU backend llama_decode returns once the graph is queued: without the wait, decode_seconds (and
    # the cost policy's verify timings) counted the queueing alone (seen on an H200: 0.17 ms of a 1.2 ms
    # decode), and the device's compute landed on the first logits read
    ctx = LlamaContext(tiny_model, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    try:
        DeviceWait(monkeypatch, 0.05).check(
            ctx, lambda: ctx.eval(tiny_model.tokenize("the a of"), 0, rows="last"), "llama_decode"
        )
        assert ctx.last_row().shape == (tiny_model.n_vocab,)
    finally:
        ctx.close()


def test_a_tied_heads_decode_waits_for_the_device_too(e3_target_path, e3_head_path, monkeypatch):
    from specviz.backends.eagle3 import Eagle3Context

    m = LlamaModel(e3_target_path)
    head = LlamaModel(e3_head_path)
    ctx = LlamaContext(m, n_ctx=128, n_batch=32, n_ubatch=32, n_threads=1)
    dctx = Eagle3Context(head, ctx, n_threads=1)
    try:
        g = np.zeros((3, dctx.n_embd), dtype=np.float32)
        DeviceWait(monkeypatch, 0.05).check(dctx, lambda: dctx.decode([1, 40, 41], g, 0, outputs=[2]), "llama_process")
    finally:
        dctx.close()
        head.close()
        ctx.close()
        m.close()
