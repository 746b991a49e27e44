"""The training forward is llama.cpp's ``eagle3`` graph: the same inputs through the torch module and through
llama.cpp running the exported GGUF give the same encoder output, draft logits and pre-norm outputs.

The head is random (random weights and random norm gains, so no norm can hide behind a weight of one),
exported as f32, on a tiny llama target whose layer inputs llama.cpp's own taps read. Compared:

* the encoder (``fc``, with and without ``norm_before_fc``) on the target's captured features;
* step 0 at every position (the true pairs written after a verify: ``(t[P+1], g[P])`` at ``P``);
* drafting chains of three more steps from several anchors (each step's token and the previous step's
  pre-norm output at the next position, as the drafter feeds them), against the unrolled training steps.

Tolerance: llama.cpp keeps the head's keys and values in an f16 cache; the torch side rounds its keys
and values through f16 the same way (``kv_f16``), and then every logit agrees within 2e-3 absolute
(logits here are of order 1-10; f32 accumulation order is the remaining difference), and every argmax
agrees.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the training extra (pip install 'specviz[train]') is not installed")

from specviz.backends import LlamaContext, LlamaModel  # noqa: E402
from specviz.backends.capture import LayerCapture  # noqa: E402
from specviz.backends.eagle3 import Eagle3Context  # noqa: E402
from specviz.models.eagle3_gguf import Eagle3HeadConfig, write_eagle3_head  # noqa: E402
from specviz.testing.tiny_models import tiny_weights, write_tiny_llama  # noqa: E402
from specviz.train.model import Eagle3Head  # noqa: E402

TOL = 2e-3


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("parity") / "target.gguf", seed=2, n_layer=4, block_scale=0.3)


def _random_head(target, *, nbf: bool, nbr: bool, seed: int) -> Eagle3Head:
    emb = torch.from_numpy(tiny_weights(seed=2, n_layer=4, block_scale=0.3)["token_embd.weight"])
    d2t = tuple(sorted(set(range(3, 320, 3)) | {5, 7, 11}))
    cfg = Eagle3HeadConfig(
        n_embd=64,
        n_head=4,
        n_head_kv=2,
        n_ff=96,
        target_hidden=64,
        target_layers=(0, 1, 3),
        d2t=d2t,
        n_vocab=320,
        norm_before_fc=nbf,
        norm_before_residual=nbr,
        rms_eps=1e-5,
        rope_freq_base=10000.0,
    )
    head = Eagle3Head(cfg, emb, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 1:  # norm gains away from one, so a wrong norm placement shows
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    return head


@pytest.mark.parametrize("nbf,nbr", [(False, False), (True, False), (False, True), (True, True)])
def test_torch_head_matches_llama_cpp(target, tmp_path, nbf, nbr):
    head = _random_head(target, nbf=nbf, nbr=nbr, seed=7 + 2 * nbf + nbr)
    head.kv_f16 = True
    path = write_eagle3_head(tmp_path / "head.gguf", target, head.cfg, head.gguf_weights())
    rng = np.random.default_rng(0)
    n, steps = 48, 4
    toks = rng.integers(3, 320, size=n + steps).tolist()

    tm = LlamaModel(target)
    hm = LlamaModel(path)
    ctx = LlamaContext(tm, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    dctx = None
    try:
        cap = LayerCapture(ctx, head.cfg.target_layers)
        ctx.eval(toks[:n], 0, rows="none")
        feats = cap.features(n)
        dctx = Eagle3Context(hm, ctx, n_threads=1)
        g_cpp = dctx.encode(feats)

        with torch.no_grad():
            ft = torch.from_numpy(feats)[None]
            g_t = head.encode(ft)[0].numpy()
            outs = head.forward_steps(torch.tensor([toks]), ft, steps)
            logits_t = [head.logits(o)[0].numpy() for o in outs]
            pre_t = [o[0].numpy() for o in outs]
        assert np.abs(g_cpp - g_t).max() < 1e-4 * max(1.0, np.abs(g_t).max())

        d2t = np.asarray(head.cfg.d2t)
        # step 0: every true pair (t[P+1], g[P]) at P, in one batch, every row an output
        dctx.decode(toks[1 : n + 1], g_cpp, 0, outputs=range(n))
        for p in range(n):
            row = dctx.logits(p)
            assert np.isneginf(np.delete(row, d2t)).all()  # llama.cpp scatters the draft vocabulary via d2t
            lc = row[d2t]
            assert np.abs(lc - logits_t[0][p]).max() < TOL, p
            assert int(np.argmax(lc)) == int(np.argmax(logits_t[0][p]))
            assert np.abs(dctx.prenorm(p) - pre_t[0][p]).max() < TOL * max(1.0, np.abs(pre_t[0][p]).max())
        # drafting chains: after the true pairs 0..P, steps j = 1..3 at P + j with the previous pre-norm output
        for anchor in (0, 5, 17, n - 1):
            dctx.clear()  # the true pairs 0..anchor-1, then the anchor's pair as the first drafting step
            dctx.decode(toks[1 : anchor + 1], g_cpp[:anchor], 0)
            dctx.decode([toks[anchor + 1]], g_cpp[anchor : anchor + 1], anchor, outputs=[0])
            prev = dctx.prenorm(0)
            for j in range(1, steps):
                dctx.decode([toks[anchor + j + 1]], prev[None, :], anchor + j, outputs=[0])
                lc = dctx.logits(0)[d2t]
                assert np.abs(lc - logits_t[j][anchor]).max() < TOL, (anchor, j)
                assert int(np.argmax(lc)) == int(np.argmax(logits_t[j][anchor]))
                prev = dctx.prenorm(0)
                assert np.abs(prev - pre_t[j][anchor]).max() < TOL * max(1.0, np.abs(prev).max())
    finally:
        if dctx is not None:
            dctx.close()
        ctx.close()
        hm.close()
        tm.close()


def test_skipping_context_anchors_changes_no_output():
    """``forward_steps(start=s)`` computes only anchors from ``s`` on, with the same results as the full pass."""
    emb = torch.from_numpy(tiny_weights(seed=2, n_layer=4)["token_embd.weight"])
    cfg = Eagle3HeadConfig(
        n_embd=64,
        n_head=4,
        n_head_kv=2,
        n_ff=96,
        target_hidden=64,
        target_layers=(0, 1, 3),
        d2t=tuple(range(0, 320, 2)),
        n_vocab=320,
        norm_before_fc=True,
        norm_before_residual=True,
    )
    head = Eagle3Head(cfg, emb, seed=3)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(0, 320, (2, 30 + 3), generator=g)
    feats = torch.randn(2, 30, 192, generator=g)
    pos = torch.arange(30).expand(2, 30)
    with torch.no_grad():
        full = head.forward_steps(toks, feats, 3, pos)
        part = head.forward_steps(toks, feats, 3, pos, start=11)
    for f, p in zip(full, part):
        assert p.shape == (2, 19, 64)
        assert torch.allclose(f[:, 11:], p, atol=1e-5)
