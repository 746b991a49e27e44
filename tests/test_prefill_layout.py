"""The prompt layouts of :class:`specviz.Session` (``prefill``): ``"all-but-last"`` as llama.cpp's
speculative-simple evaluates a prompt (the last token heads the first round's batch), ``"whole"`` as
llama-server does (the whole prompt in the prefill, the first token read from its last row, no draft).

On the tiny f32 fixtures the two give the same tokens (their logits agree far beyond any margin), so the
tests pin what the layout changes: the cache after the start, which round evaluates what, that the first
round cannot draft, and that rewinds, snapshots, the cost policy's measurement and ``verify_cost`` keep
the layout. On the embedded Gemma 3 (Q4_K_M), where llama.cpp's CPU kernels are not batch-invariant, the
whole layout and the server's ring-sized sliding-window cache are what makes a session's greedy text the
server's (``test_the_servers_layout_gives_the_servers_text_on_gemma``)."""

from __future__ import annotations

import pytest
from test_differential import FIXTURES

from specviz import Session
from specviz.errors import ContextSettingsError, StrategyError
from specviz.strategies.ngram_simple import NgramSimpleDrafter
from specviz.testing.tiny_models import write_tiny_llama

KNOBS = {"size_n": 2, "size_m": 4, "draft_max": 4}


@pytest.fixture(scope="module")
def fixture_path(tmp_path_factory):
    seed, block_scale, _ = FIXTURES["digits"]
    return write_tiny_llama(tmp_path_factory.mktemp("prefill") / "digits.gguf", seed=seed, block_scale=block_scale)


def session(path, prefill):
    return Session(path, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, prefill=prefill)


PROMPT = FIXTURES["digits"][2]


def test_a_whole_prefill_holds_the_whole_prompt_and_its_first_round_evaluates_nothing(fixture_path):
    s = session(fixture_path, "whole")
    s.start(PROMPT, 40, "ngram-simple", **KNOBS)
    n = s.n_prompt
    assert s.kv_length == n  # the pending (last prompt) token is already in the cache
    evals = s.ctx.eval_count
    s.step()
    res = s.generation.last_result
    assert res is not None and res.prefilled
    assert s.ctx.eval_count == evals  # the first token came from the prompt batch's last row
    assert res.draft == [] and res.budget.limit == 0 and res.budget.cap == "prompt"
    assert len(res.committed) == 1 and s.kv_length == n  # the invariant again: history minus the pending one
    s.step()
    assert s.ctx.eval_count == evals + 1 and not s.generation.last_result.prefilled
    s.close()


def test_all_but_last_evaluates_the_last_prompt_token_in_the_first_round(fixture_path):
    s = session(fixture_path, "all-but-last")
    s.start(PROMPT, 40, "ngram-simple", **KNOBS)
    assert s.kv_length == s.n_prompt - 1
    evals = s.ctx.eval_count
    s.step()
    assert s.ctx.eval_count == evals + 1 and not s.generation.last_result.prefilled
    s.close()


def test_both_layouts_give_the_same_tokens_on_a_batch_invariant_model(fixture_path):
    out = {}
    for prefill in ("all-but-last", "whole"):
        s = session(fixture_path, prefill)
        s.start(PROMPT, 60, "ngram-simple", **KNOBS)
        s.run()
        plain = session(fixture_path, prefill)
        plain.start(PROMPT, 60, "none")
        plain.run()
        assert s.tokens == plain.tokens  # lossless in either layout
        drafted = s.telemetry_dict()["drafted"]
        assert drafted > 0 and s.telemetry_dict()["accepted"] < drafted  # drafts accepted and rejected
        out[prefill] = s.tokens
        s.close()
        plain.close()
    assert out["whole"] == out["all-but-last"]


def test_the_cost_policy_measures_after_the_prefilled_round(fixture_path):
    ref = session(fixture_path, "whole")
    ref.start(PROMPT, 40, "none")
    ref.run()
    s = session(fixture_path, "whole")
    s.start(PROMPT, 40, "ngram-simple", draft_policy="cost", size_n=2, size_m=4)
    s.step()
    assert s.cost_model is None  # its batches would have replaced the prompt's last row
    s.run()
    assert s.cost_model is not None and s.tokens == ref.tokens
    ref.close()
    s.close()


def test_verify_cost_at_the_start_keeps_the_first_rounds_row(fixture_path):
    ref = session(fixture_path, "whole")
    ref.start(PROMPT, 20, "none")
    ref.run()
    s = session(fixture_path, "whole")
    s.start(PROMPT, 20, "none")
    assert s.verify_cost() is not None
    assert s.kv_length == s.n_prompt
    s.run()
    assert s.tokens == ref.tokens
    ref.close()
    s.close()


def test_a_rewind_to_the_start_prefills_the_whole_prompt_again(fixture_path):
    s = session(fixture_path, "whole")
    s.start(PROMPT, 40, "ngram-simple", **KNOBS)
    s.run()
    first = list(s.tokens)
    s.rewind(0)
    assert s.kv_length == s.n_prompt
    s.step()
    assert s.generation.last_result.prefilled
    s.run()
    assert s.tokens == first
    s.close()


def test_a_snapshot_at_the_start_restores_into_the_whole_layout(fixture_path):
    s = session(fixture_path, "whole")
    s.start(PROMPT, 30, "ngram-simple", **KNOBS)
    blob = s.snapshot()
    s.run()
    first = list(s.tokens)
    other = s.fork()
    other.restore_into(blob)
    assert other.prefill == "whole" and other.kv_length == other.n_prompt
    other.step()
    assert other.generation.last_result.prefilled
    other.run()
    assert other.tokens == first
    other.close()
    s.close()


def test_an_unknown_layout_is_refused_by_name(fixture_path):
    with pytest.raises(ContextSettingsError, match="prefill 'server'.*'all-but-last' or 'whole'"):
        session(fixture_path, "server")


def test_a_drafter_that_reads_the_target_is_refused_at_a_whole_start(fixture_path, monkeypatch):
    s = session(fixture_path, "whole")
    s.start(PROMPT, 20, "none")
    s.step()
    before = (list(s.history), s.strategy)
    monkeypatch.setattr(NgramSimpleDrafter, "reads_target", True)
    with pytest.raises(StrategyError, match="reads the target's activations"):
        s.start(PROMPT, 20, "ngram-simple", **KNOBS)
    assert (list(s.history), s.strategy) == before  # the refused start changed nothing
    s.run()  # and the session goes on
    assert s.finished is not None
    s.close()


@pytest.mark.embedded
@pytest.mark.tools
def test_the_servers_layout_gives_the_servers_text_on_gemma(embedded_model):
    """The summarise prompts, whose greedy text can part from llama-server's (``--swa-full``, as specviz's
    cache) within 64 tokens when the last prompt token is evaluated on its own: with the server's layout
    (``session_from_server_args``: ``prefill="whole"``) every one gives the server's tokens exactly. Which
    prompts part with the last prompt token apart depends on the CPU's kernels (on an AVX-512 host #0 and
    #3, at tokens 61 and 5; on an AVX2-only EPYC one of those two), so the test asks that at least one
    does, which is what makes the equality above say something. (Against the server's default ring-sized
    cache, specviz's ring still parts on #0 and #3 — at tokens 61 and 5 with either of specviz's caches — a
    difference not explained yet.)"""
    from native_util import native_tool

    from specviz.analysis.check_server import context_args
    from specviz.analysis.llama_server import LlamaServer
    from specviz.analysis.server_args import parse_server_args
    from specviz.analysis.workloads import WORKLOADS
    from specviz.backends.context_settings import ContextSettings

    settings = ContextSettings.make(n_ctx=4096, n_batch=512, n_ubatch=512, n_threads=1)
    args = [*context_args(settings), "--spec-type", "none"]
    assert "--swa-full" in args
    cfg = parse_server_args(args)
    assert cfg.session_kwargs()["prefill"] == "whole" and cfg.swa_full
    prompts = list(WORKLOADS["summarise"])
    n = 64
    server_tokens = []
    with LlamaServer(embedded_model.path, args, binary=native_tool("llama-server")) as srv:
        for p in prompts:
            server_tokens.append(srv.complete(p, n, cache_prompt=False).tokens)
    like = Session(embedded_model, **cfg.session_kwargs())
    default = Session(embedded_model, **cfg.settings.to_dict())  # swa_full, the last prompt token apart
    parted = []
    for i, (p, want) in enumerate(zip(prompts, server_tokens)):
        like.start(p, n, "none")
        like.run()
        assert like.tokens == want, f"summarise #{i}"
        default.start(p, n, "none")
        default.run()
        if default.tokens != want:
            parted.append(i)
    assert parted, "the last prompt token's own batch parts from the server on no prompt here: pick other prompts"
    like.close()
    default.close()


def test_a_refused_first_round_keeps_the_prompts_row_for_the_next(fixture_path, monkeypatch):
    import specviz.decoding.session as session_module

    ref = session(fixture_path, "whole")
    ref.start(PROMPT, 20, "none")
    ref.run()
    s = session(fixture_path, "whole")
    s.start(PROMPT, 20, "none")
    real = session_module.plan

    def refuse(*a, **k):
        raise RuntimeError("the budget refused")

    monkeypatch.setattr(session_module, "plan", refuse)
    with pytest.raises(RuntimeError):
        s.step()
    monkeypatch.setattr(session_module, "plan", real)
    assert s.generation.prefilled  # the round never ran: the next one still reads the prompt's row
    s.run()
    assert s.tokens == ref.tokens
    ref.close()
    s.close()
