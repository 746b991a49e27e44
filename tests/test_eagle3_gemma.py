"""EAGLE-3 on the embedded Gemma 3 270M: features read through the C capture shim (llama.cpp's gemma3 graph
records no layer inputs, and asking it for them aborts the process), and the refusal when the shim is off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from specviz import Session
from specviz.analysis.equivalence import check_equivalence
from specviz.models.eagle3_gguf import Eagle3HeadConfig, default_target_layers, random_eagle3_weights, write_eagle3_head

pytestmark = pytest.mark.embedded


def _gemma_head_config() -> Eagle3HeadConfig:
    """A small head of Gemma 3 270M's width (640) that borrows its token embeddings."""
    return Eagle3HeadConfig(
        n_embd=640,
        n_head=4,
        n_head_kv=1,
        n_ff=256,
        target_hidden=640,
        target_layers=default_target_layers(18),
        d2t=tuple(range(0, 4096, 4)),
        n_vocab=262144,
    )


@pytest.fixture(scope="module")
def gemma_head(embedded_model_path, tmp_path_factory):
    """A small random head of Gemma 3 270M's width (640) that borrows its token embeddings."""
    cfg = _gemma_head_config()
    path = tmp_path_factory.mktemp("gemma-head") / "head.gguf"
    return write_eagle3_head(path, embedded_model_path, cfg, random_eagle3_weights(cfg, seed=0))


def test_eagle3_runs_on_gemma3_through_the_capture_shim(embedded_model, gemma_head):
    s = Session(embedded_model, n_ctx=1024, n_batch=64, n_ubatch=64)
    try:
        assert s.ctx.tap is not None  # installed at creation, switched off until a drafter arms it
        s.start("The capital of France is", 12, "eagle3", draft_model=str(gemma_head), draft_p_min=0.0, draft_max=3)
        while s.finished is None:
            s.step()
            assert s.kv_length == s.committed and s.drafter.kv_length() == len(s.history) - 2
        t = s.telemetry_dict()
        assert t["eagle3"]["capture"] == "callback" and t["eagle3"]["target_layers"] == [2, 9, 15]
        assert t["drafted"] > 0 and t["vocab_coverage"]["draft_vocab"] == 1024
        # a random head is refused nearly always, but greedy output must stay the target's own
        res = check_equivalence(
            s,
            "The capital of France is",
            24,
            "eagle3",
            {"draft_model": str(gemma_head), "draft_p_min": 0.0, "draft_max": 3},
        )
        assert res["verdict"] in ("identical", "numerics"), res
    finally:
        s.close()


def test_an_f16_head_drafts_on_gemma3_whose_layer_inputs_leave_f16s_range(embedded_model, tmp_path):
    cfg = _gemma_head_config()
    head = write_eagle3_head(
        tmp_path / "head-f16.gguf", embedded_model.path, cfg, random_eagle3_weights(cfg, seed=0), dtype="f16"
    )
    s = Session(embedded_model, n_ctx=1024, n_batch=64, n_ubatch=64)
    try:
        # before fc was kept f32, the first draft step raised: no finite value in the head's logits row
        s.start("The capital of France is", 8, "eagle3", draft_model=str(head), draft_p_min=0.0, draft_max=3)
        s.run()
        assert s.telemetry_dict()["drafted"] > 0
    finally:
        s.close()


_REFUSAL = """
import os, sys
from specviz import Session
from specviz.backends.capture import LayerCapture
from specviz.errors import CaptureUnavailableError
s = Session(None, n_ctx=256, n_batch=32, n_ubatch=32)
assert s.ctx.tap is None
try:
    s.start("Hello", 4, "eagle3", draft_model=sys.argv[1], draft_p_min=0.0)
except CaptureUnavailableError as e:
    print("refused:", e)
try:
    LayerCapture(s.ctx, [2, 9, 15], method="api")
except CaptureUnavailableError as e:
    print("refused api:", e)
s.start("Hello", 4, "none")
s.run()
print("still running:", s.finished)
"""


def test_gemma3_without_the_shim_refuses_eagle3_without_killing_the_process(gemma_head):
    env = dict(os.environ, SPECVIZ_CAPTURE_SHIM="0")
    r = subprocess.run(
        [sys.executable, "-c", _REFUSAL, str(gemma_head)], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: eagle3 cannot use" in r.stdout and "without the layer-capture callback" in r.stdout
    assert "refused api:" in r.stdout and "still running: max_tokens" in r.stdout


_RAW_ABORT = """
import llama_cpp.llama_cpp as lc
from specviz.backends import LlamaContext, LlamaModel
from specviz.backends.llama_ext import ext
from specviz.models.embedded import default_model_path
m = LlamaModel(default_model_path())
ctx = LlamaContext(m, n_ctx=64, n_batch=8, n_ubatch=8, capture=False)
ext().set_embeddings_layer_inp(ctx.ptr, 2, True)  # what the guard refuses to do
ctx.eval([2, 100, 200], 0, rows="last")
print("survived")
"""


def test_the_guarded_call_really_aborts_gemma3(tmp_path):
    """Why the guard matters: llama.cpp's own layer taps on gemma3 abort the whole process."""

    def no_core_dump() -> None:  # the child aborts on purpose; leave no core file behind
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_RAW_ABORT)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=no_core_dump,
    )
    assert r.returncode != 0 and "survived" not in r.stdout
    assert "layer input tensor is null" in r.stderr or r.returncode < 0
