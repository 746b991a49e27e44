"""A deployment's context settings in a session: flash attention, KV cache types, sizes and threads, checked
before llama.cpp sees them, honoured by the target's and a draft model's contexts, carried by snapshots."""

from __future__ import annotations

import pytest
from conftest import TINY

from specviz import Session
from specviz.errors import ContextError, ContextSettingsError, KnobError, SnapshotError
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """A tiny llama whose heads are 32 wide (two heads of a 64-wide model): quantized caches fit it."""
    return write_tiny_llama(tmp_path_factory.mktemp("heads") / "wide.gguf", n_head=2, n_head_kv=1, **TINY)


def test_the_settings_are_the_contexts(tiny_model_path):
    s = Session(tiny_model_path, n_ctx=256, n_batch=64, n_ubatch=32, n_threads=1, flash_attn="off")
    assert s.settings.flash_attn == "off" and (s.settings.n_ctx, s.settings.n_ubatch) == (256, 32)
    assert s.settings.cache_type_k == s.settings.cache_type_v == "f16"
    s.start("1, 2, 3, 4", 8, "ngram-simple")
    s.run()
    assert len(s.tokens) == 8
    s.close()


def test_a_refused_setting_is_refused_before_the_model_loads(tmp_path):
    missing = tmp_path / "missing.gguf"  # a model load would raise ModelNotFoundError
    for kwargs, words in (
        ({"cache_type_v": "q8_0", "flash_attn": "off"}, "needs flash attention"),
        ({"cache_type_k": "q3_k"}, "not a KV cache type"),
        ({"flash_attn": "sometimes"}, "on, off or auto"),
        ({"n_batch": 64, "n_ubatch": 128}, "larger than n_batch"),
    ):
        with pytest.raises(ContextSettingsError, match=words) as e:
            Session(missing, **kwargs)
        assert isinstance(e.value, KnobError) and isinstance(e.value, ContextError)


def test_a_quantized_cache_needs_heads_its_blocks_divide(tiny_model_path, wide_heads):
    # the default fixture's heads are 16 wide: a q8_0 block (32) would straddle two heads
    with pytest.raises(ContextSettingsError, match="head size 16"):
        Session(tiny_model_path, n_ctx=256, n_threads=1, cache_type_k="q8_0")
    s = Session(wide_heads, n_ctx=256, n_threads=1, flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0")
    s.start("1, 2, 3, 4, 1, 2, 3, 4", 12, "ngram-simple", size_n=2, size_m=4)
    s.run()
    assert len(s.tokens) == 12 and s.settings.cache_type_v == "q8_0"
    s.close()


def test_snapshots_carry_the_settings_and_refuse_another_cache(wide_heads):
    s = Session(wide_heads, n_ctx=256, n_threads=1, flash_attn="on", cache_type_k="q8_0")
    s.start("1, 2, 3, 4, 1, 2, 3, 4", 12, "ngram-simple", size_n=2, size_m=4)
    s.step()
    blob = s.snapshot()
    other = Session(wide_heads, n_ctx=256, n_threads=1, flash_attn="on")
    with pytest.raises(SnapshotError, match="cache_type_k='q8_0'"):
        other.restore_into(blob)
    assert other.settings.cache_type_k == "f16"  # nothing changed
    again = Session.restore(blob)
    assert again.settings.cache_type_k == "q8_0" and again.settings.flash_attn == "on"
    s.run()
    again.run()
    assert again.tokens == s.tokens
    fork = again.fork()
    assert fork.settings == again.settings
    for x in (s, other, again, fork):
        x.close()


def test_a_draft_models_context_gets_the_targets_flash_attention(tmp_path):
    seed_kwargs = {"seed": TINY["seed"], "block_scale": TINY["block_scale"]}
    target = write_tiny_llama(tmp_path / "t.gguf", **TINY)
    draft = write_tiny_llama(tmp_path / "d.gguf", n_layer=1, layers_from=tiny_weights(**seed_kwargs))
    s = Session(target, n_ctx=256, n_threads=1, flash_attn="off")
    s.start("1, 2, 3, 4", 8, "draft", draft_model=str(draft), draft_max=3, draft_p_min=0.0)
    assert s.drafter is not None and s.drafter.ctx.settings.flash_attn == "off"
    assert s.drafter.ctx.settings.cache_type_k == "f16"
    s.run()
    s.close()


@pytest.mark.slow
def test_a_session_from_a_server_command_line(wide_heads):
    from specviz import run_like_the_server, session_from_server_args

    line = f"llama-server -m {wide_heads} --spec-type ngram-simple --spec-ngram-simple-size-n 2 -fa on -ctk q8_0 -np 2"
    with pytest.warns(UserWarning, match="-np 2: a session .* runs one request at a time; not applied"):
        s, cfg = session_from_server_args(line)
    assert s.settings.cache_type_k == "q8_0" and s.settings.flash_attn == "on"
    assert cfg.strategy == "ngram-simple" and cfg.knobs["size_n"] == 2
    run = run_like_the_server(s, "1, 2, 3, 4, 1, 2, 3, 4,", 16, cfg.strategy, cfg.knobs)
    assert len(run.tokens) == 16
    s.start("1, 2, 3", 4, **cfg.start_kwargs())
    assert s.strategy == "ngram-simple"
    s.close()
    with pytest.raises(ContextSettingsError, match="needs flash attention"):
        session_from_server_args(f"-m {wide_heads} -ctv q4_0 -fa off")


def test_the_context_can_be_created_anew_between_generations(wide_heads):
    s = Session(wide_heads, n_ctx=256, n_threads=1)
    s.start("1, 2, 3, 4", 6, "ngram-simple")
    s.run()
    before = list(s.tokens)
    with pytest.raises(ContextSettingsError, match="needs flash attention"):
        s.set_context_settings(flash_attn="off", cache_type_v="q8_0")
    assert s.settings.flash_attn == "auto" and s.tokens == before and s.started  # nothing changed
    new = s.set_context_settings(flash_attn="on", cache_type_k="q8_0", n_ctx=512)
    assert (new.flash_attn, new.cache_type_k, new.n_ctx, new.n_threads) == ("on", "q8_0", 512, 1)
    assert s.settings == new and s.context_args["cache_type_k"] == "q8_0" and not s.started
    assert s.ctx.capacity.n_ctx == 512
    s.start("1, 2, 3, 4", 6, "ngram-simple")
    s.run()
    assert len(s.tokens) == 6
    s.close()


def test_a_start_can_be_checked_against_a_context_about_to_be_made(wide_heads):
    s = Session(wide_heads, n_ctx=256, n_threads=1)
    s.start("1, 2", 4, "none")
    prompt = [5 + i % 7 for i in range(300)]  # token ids: more than 256 fit, fewer than 512
    with pytest.raises(ContextError, match="the context holds 256"):
        s.check_start(prompt, 4, "ngram-simple")
    s.check_start(prompt, 4, "ngram-simple", n_ctx=512)  # fits the larger context: no error
    with pytest.raises(KnobError, match="size_n"):
        s.check_start(prompt, 4, "ngram-simple", n_ctx=512, size_n=0)
    assert s.strategy == "none" and s.n_prompt < 100 and s.settings.n_ctx == 256  # nothing started
    s.close()


@pytest.mark.slow
def test_gpu_layers_place_the_model_the_session_loads_and_its_drafts(tmp_path):
    target = write_tiny_llama(tmp_path / "target.gguf", **TINY)
    w = tiny_weights(seed=TINY["seed"], block_scale=TINY["block_scale"])
    draft = write_tiny_llama(tmp_path / "draft.gguf", n_layer=1, layers_from=w)
    s = Session(target, n_ctx=256, n_gpu_layers=3)
    try:
        assert s.model.n_gpu_layers == 3
        s.start("the cat of the dog and the a", 12, "draft", draft_model=str(draft), draft_p_min=0.0)
        s.run()
        assert len(s.tokens) == 12
        assert s.draft_models.get(str(draft)).n_gpu_layers == 3  # placed as its target
        # a loaded model keeps its own placement, and another value beside it is refused
        other = Session(s.model, n_ctx=64)
        assert other.model.n_gpu_layers == 3
        other.close()
        with pytest.raises(ContextSettingsError, match=r"n_gpu_layers \(-ngl\) 0 differs from the 3"):
            Session(s.model, n_ctx=64, n_gpu_layers=0)
    finally:
        s.close()


@pytest.mark.parametrize("value", [-1, 2.5, "99", True])
def test_a_bad_gpu_layer_count_is_refused_before_the_model_loads(tmp_path, value):
    with pytest.raises(ContextSettingsError, match=r"n_gpu_layers \(-ngl\): .* expected an integer >= 0") as e:
        Session(tmp_path / "absent.gguf", n_gpu_layers=value)
    assert e.value.knob == "n_gpu_layers"
