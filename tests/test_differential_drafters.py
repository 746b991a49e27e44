"""Differential tests of the model drafters and chains against llama.cpp's own ``llama-speculative-simple``.

The tool (built by ``make llama-tools`` from the llama.cpp that llama-cpp-python vendors) generates greedily
on the same tiny f32 fixtures with ``--spec-type draft-dflash`` / ``draft-dspark`` / ``draft-mtp`` and a
comma list, and a specviz session is driven to the same batches (see ``tests/test_differential.py``: the
tool's per-round cap, alignment off, the fixed policy; here also the model drafters' ``--spec-draft-n-max``,
which caps each round's draft before the tool's cap does). The generated text, the number of tokens and the
drafted and accepted counts must be equal, and every case must draft, accept and reject.

specviz's p_min reads the draft's full softmax where llama.cpp reads a top-10 sampler's (a documented
departure), so the cases run with ``p_min`` 0; DFlash's block is the trained one in both when
``--spec-draft-n-max`` is at least the block's capacity (the other documented departure).
"""

from __future__ import annotations

import numpy as np
import pytest
from native_util import native_tool
from test_dflash import A, B, binary_head_output, binary_weights, rule_head_output

from specviz import Session
from specviz.analysis.native import run_tool, tool_draft_cap
from specviz.backends import LlamaModel
from specviz.testing.tiny_dflash import write_tiny_dflash
from specviz.testing.tiny_models import write_tiny_llama, write_tiny_nextn

N_CTX = 512
N_PREDICT = 60
PROMPT = "the cat of the dog and the"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """name -> (target path, draft path or None, strategy, knobs)."""
    d = tmp_path_factory.mktemp("diffd")
    target = write_tiny_llama(d / "target.gguf", n_layer=4, layers_from=binary_weights())
    common = dict(target_layers=(1, 2, 3), own_output=True, block_size=6)
    dflash = write_tiny_dflash(d / "dflash.gguf", seed=6, output_weight=binary_head_output(), **common)
    dspark = write_tiny_dflash(
        d / "dspark.gguf", seed=7, dspark=True, markov_scale=0.01, output_weight=rule_head_output(), **common
    )
    dflash2 = write_tiny_dflash(
        d / "dflash2.gguf", seed=8, selector_top_k=3, output_weight=binary_head_output(scale=0.05), **common
    )
    nextn = write_tiny_nextn(d / "nextn.gguf", seed=1, block_scale=0.05, binary=(A, B))
    p0 = {"draft_p_min": 0.0}
    return {
        "dflash": (target, "dflash", {"draft_model": str(dflash), "draft_max": 5, **p0}),
        "dspark": (target, "dspark", {"draft_model": str(dspark), "draft_max": 6, **p0}),
        "dflash2": (target, "dflash", {"draft_model": str(dflash2), "draft_max": 5, **p0}),
        "mtp": (nextn, "mtp", {"draft_max": 4, **p0}),
        # llama.cpp's --spec-draft-n-max caps its model types only; specviz's draft_max caps the chain: the
        # n-gram member's own cap is set to the same length, so both cap every member alike
        "chain": (nextn, "draft-mtp,ngram-mod", {"draft_max": 3, "n_match": 2, "n_min": 1, "n_max": 3, **p0}),
        "dflash-chain": (
            target,
            "ngram-simple,draft-dflash",
            {"draft_model": str(dflash), "draft_max": 4, "size_n": 2, "size_m": 4, **p0},
        ),
    }


def run_like_the_tool(model: LlamaModel, prompt: str, strategy: str, knobs: dict, n_predict: int) -> Session:
    """A greedy session run to the batches ``llama-speculative-simple -n n_predict`` verifies: each round's draft
    capped by the model drafters' ``--spec-draft-n-max`` and the tool's own cap."""
    n_max = knobs["draft_max"]
    s = Session(model, n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_threads=1)
    s.start(prompt, max_tokens=n_predict + 2048, strategy=strategy, align=False, draft_policy="fixed", **knobs)
    while s.finished is None and len(s.tokens) <= n_predict:
        cap = tool_draft_cap(N_CTX, len(s.history) - 1, n_predict, len(s.tokens))
        s.configure(draft_max=min(n_max, cap) if cap is not None else n_max)
        s.step()
    return s


@pytest.mark.parametrize("case", ["dflash", "dspark", "dflash2", "mtp", "chain", "dflash-chain"])
@pytest.mark.tools
def test_generation_equals_llama_speculative_simple(pairs, case):
    tool = native_tool("llama-speculative-simple")
    target, strategy, knobs = pairs[case]
    report = run_tool(tool, target, PROMPT, strategy, knobs, n_predict=N_PREDICT, threads=1, n_ctx=N_CTX)
    model = LlamaModel(target)
    try:
        s = run_like_the_tool(model, PROMPT, strategy, knobs, N_PREDICT)
        t = s.telemetry_dict()
        expected_text = b"".join(model.piece_bytes(tok) for tok in s.history)
        by = {k: v["drafted"] for k, v in t["by_drafter"].items()}
        s.close()
    finally:
        model.close()
    assert report.output.startswith(b"\n\n" + expected_text + b"\n\n"), "the generated text differs"
    assert (len(s.tokens), t["drafted"], t["accepted"]) == (report.n_predict, report.n_drafted, report.n_accept)
    assert report.n_drafted > report.n_accept > 0  # it drafted, accepted and rejected
    if "chain" in case:  # both members drafted in some rounds: the priority order was exercised
        assert len(by) == 2 and all(v > 0 for v in by.values()), by
    assert np.isfinite(t["acceptance_rate"])
