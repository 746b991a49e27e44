"""``specviz train-eagle3`` on tiny real llama.cpp models: the corpus, batched generation with feature capture,
the draft vocabulary, a short training run whose head the ``eagle3`` strategy loads and drafts with (and which
beats a random head on a learnable toy target), resuming, and Ctrl-C.

The toy target is a tiny llama whose blocks are scaled down, so its next token depends mostly on the current
one: a head that sees the current token's embedding can learn to predict it, a random head cannot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the training extra (pip install 'specviz[train]') is not installed")

from specviz import Session  # noqa: E402
from specviz.analysis.workloads import WORKLOADS  # noqa: E402
from specviz.backends import LlamaContext, LlamaModel  # noqa: E402
from specviz.backends.capture import LayerCapture  # noqa: E402
from specviz.models.eagle3_gguf import default_target_layers  # noqa: E402
from specviz.testing.tiny_models import write_tiny_eagle3, write_tiny_llama  # noqa: E402
from specviz.train.corpus import (  # noqa: E402
    PromptFileError,
    builtin_prompts,
    held_out_prompts,
    read_prompts_jsonl,
    training_prompts,
)
from specviz.train.dataset import choose_draft_vocab, load_corpus  # noqa: E402
from specviz.train.generate import GenConfig, generate_corpus  # noqa: E402
from specviz.train.run import TrainOptions, train_eagle3  # noqa: E402
from specviz.train.trainer import load_checkpoint  # noqa: E402

#: Short prompts for the tiny byte-vocabulary targets (the built-in corpus is written for real models).
TOY_PROMPTS = [
    f"the {w} of a {v} is"
    for w in ("cat", "dog", "sea", "sun", "map", "cup", "hat", "box")
    for v in ("red", "big", "old", "new", "hot", "wet")
]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The learnable toy target and a prompt file of short prompts."""
    d = tmp_path_factory.mktemp("toy")
    target = write_tiny_llama(d / "toy.gguf", seed=3, n_layer=4, block_scale=0.1)
    prompts = d / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in TOY_PROMPTS) + "\n")
    return target, prompts


def _options(toy, tmp_path, **kw):
    target, prompts = toy
    base = dict(
        output=tmp_path / "head.gguf",
        target=target,
        prompts=prompts,
        builtin_corpus=False,
        minutes=30,
        corpus_tokens=3000,
        train_steps=120,
        max_new=40,
        slots=8,
        threads=1,
        evaluate="none",
        work_dir=tmp_path / "work",
        draft_vocab=160,
        progress=False,
        dtype="f32",
        train={"n_ff": 128, "lr": 3e-3, "warmup_steps": 10, "batch_tokens": 1024, "bf16": "off"},
    )
    base.update(kw)
    return TrainOptions(**base)


# -- the corpus ---------------------------------------------------------------------------------------------


def test_the_builtin_corpus_is_large_varied_and_keeps_the_evaluation_prompts_out():
    prompts = builtin_prompts()
    assert len(prompts) >= 2000 and len(set(prompts)) == len(prompts)
    assert builtin_prompts(seed=1) != prompts and sorted(builtin_prompts(seed=1)) == sorted(prompts)
    held = held_out_prompts()
    assert held == WORKLOADS["free"] + WORKLOADS["summarise"]
    train = [p.text for p in training_prompts()]
    assert not any(h in t for h in held for t in train)
    # nor a near copy: the corpus avoids the held-out free prompts' subjects
    assert not any(t.startswith(("The weather", "Here are some tips for learning a new language")) for t in train)
    # no training prompt quotes a held-out prompt's passage (the quote workloads over the same texts are out)
    from specviz.analysis import workloads as w

    passages = [getattr(w, n) for n in ("_MINUTES", "_PHOTOSYNTHESIS", "_LIGHTHOUSE", "_NOTICE")]
    assert all(x in " ".join(held) for x in passages)
    assert not any(x in t for x in passages for t in train)
    assert WORKLOADS["code-rewrite"][0] in train  # workloads that are not held out are trained on


def test_prompt_files_name_every_malformed_line(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "a"}\n\n{"text": "b"}\n{"turns": ["c", "d"], "question_id": 1}\n')
    assert read_prompts_jsonl(good) == ["a", "b", "c"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\nnot json\n{"prompt": ""}\n')
    with pytest.raises(PromptFileError) as e:
        read_prompts_jsonl(bad)
    assert "bad.jsonl:2" in str(e.value) and "bad.jsonl:3" in str(e.value)
    # user prompts come first and held-out prompts never enter
    tp = training_prompts(["mine", WORKLOADS["free"][0]], builtin=False)
    assert tp[0].text == "mine" and tp[0].source == "user"
    assert WORKLOADS["free"][0] not in [p.text for p in tp]


# -- generation -----------------------------------------------------------------------------------------------


def test_batched_generation_captures_what_a_single_sequence_evaluation_captures(toy, tmp_path):
    target, _ = toy
    layers = default_target_layers(4)
    info = generate_corpus(
        target,
        TOY_PROMPTS[:12],
        tmp_path / "c",
        layers,
        GenConfig(slots=5, max_new=24, greedy_share=0.5, n_threads=1, shard_tokens=200),
    )
    assert info.sequences == 12 and len(info.shards) >= 2 and sorted(info.prompts_done) == list(range(12))
    c = load_corpus(tmp_path / "c")
    m = LlamaModel(target)
    ctx = LlamaContext(m, n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    cap = LayerCapture(ctx, layers)
    try:
        for s in range(c.n_sequences):
            t0, f0 = int(c.seq_start[s]), int(c.feat_start[s])
            toks = c.tokens[t0 : int(c.seq_start[s + 1])].tolist()
            n = len(toks) - 1
            ctx.clear()
            ctx.eval(toks[:-1], 0, rows="all")
            want = cap.features(n)
            got = c.feats[f0 : f0 + n].astype(np.float32) * c.feat_scale[f0 : f0 + n, None]
            scale = np.abs(want).max()
            assert np.abs(got - want).max() < 2e-3 * scale, s  # float16 storage
            first = int(c.n_prompt[s]) - 1
            ids = c.top_ids[f0 + first : f0 + n]
            rows = [ctx.row(i) for i in range(first, n)]
            assert [int(np.argmax(r)) for r in rows] == ids[:, 0].tolist()  # labels: the target's own top choice
            assert (c.top_ids[f0 : f0 + first] == -1).all()  # no labels inside the prompt
            if c.temperature[s] == 0:  # greedy sequences follow the target's top choice
                assert toks[first + 1 :] == ids[:, 0].tolist()
    finally:
        cap.close()
        ctx.close()
        m.close()
    d2t, cov = choose_draft_vocab(c, np.arange(c.n_sequences), np.arange(2), 50, 320)
    assert len(d2t) == 50 and list(d2t) == sorted(d2t)
    gen = c.generated(np.arange(c.n_sequences))
    assert cov.train_share == pytest.approx(np.isin(gen, d2t).mean())
    assert 0 < cov.train_share <= 1 and cov.distinct_generated >= 50


# -- training ---------------------------------------------------------------------------------------------------


def _acceptance(target, head, prompts):
    s = Session(target, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1)
    try:
        acc, drafted = [], 0
        for p in prompts:
            s.start(p, 32, "eagle3", draft_model=str(head), draft_p_min=0.0, draft_max=3)
            s.run()
            t = s.telemetry_dict()
            acc.append(t["acceptance_rate"])
            drafted += t["drafted"]
        return float(np.mean(acc)), drafted
    finally:
        s.close()


@pytest.mark.slow
def test_a_short_training_run_makes_a_head_that_drafts_and_beats_a_random_one(toy, tmp_path):
    res = train_eagle3(_options(toy, tmp_path))
    target = toy[0]
    head = res.output
    assert head.is_file() and "draft vocabulary: 160 of the" in res.coverage
    ck = load_checkpoint(res.work_dir / "checkpoint.pt")
    assert ck["train"]["step"] == 120
    held = ["the sun of a cold day is", "a box of the hat is", "the cup is on"]
    trained, drafted = _acceptance(target, head, held)
    rnd = write_tiny_eagle3(tmp_path / "random.gguf", target, n_draft_vocab=160, n_ff=128)
    random_acc, random_drafted = _acceptance(target, rnd, held)
    assert drafted > 0 and random_drafted > 0
    assert trained > random_acc + 0.2, (trained, random_acc)
    assert res.validation["acc"][0] > 0.2


@pytest.mark.slow
def test_resume_continues_training_from_the_checkpoint_without_regenerating(toy, tmp_path):
    train_eagle3(_options(toy, tmp_path, train_steps=30))
    work = tmp_path / "work"
    corpus_before = (work / "corpus" / "corpus.json").read_text()
    w1 = load_checkpoint(work / "checkpoint.pt")["state"]["output"].clone()
    res = train_eagle3(_options(toy, tmp_path, train_steps=50, resume=True))
    ck = load_checkpoint(work / "checkpoint.pt")
    assert ck["train"]["step"] == 50  # 30 + 20 more, not 50 from scratch
    assert (work / "corpus" / "corpus.json").read_text() == corpus_before
    assert not torch.equal(ck["state"]["output"], w1)
    assert res.output.is_file()
    # without --resume the same work folder starts afresh
    train_eagle3(_options(toy, tmp_path, train_steps=5))
    assert load_checkpoint(work / "checkpoint.pt")["train"]["step"] == 5


@pytest.mark.slow
def test_ctrl_c_during_training_leaves_a_usable_checkpoint_and_head(toy, tmp_path):
    target, prompts = toy
    out, work = tmp_path / "head.gguf", tmp_path / "work"
    cmd = [
        sys.executable,
        "-m",
        "specviz.cli",
        "train-eagle3",
        str(target),
        "-o",
        str(out),
        "--prompts",
        str(prompts),
        "--no-builtin-corpus",
        "--minutes",
        "60",
        "--corpus-tokens",
        "2000",
        "--max-new",
        "40",
        "--threads",
        "1",
        "--evaluate",
        "none",
        "--work-dir",
        str(work),
        "--draft-vocab",
        "160",
        "--ffn",
        "128",
        "--dtype",
        "f32",
        "--checkpoint-minutes",
        "600",
        "--no-progress",
    ]
    # A job started in the background by a non-interactive shell (`.ci/run &`) inherits SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler: give the child Ctrl-C's default disposition, as a
    # terminal would.
    p = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines = []
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            line = p.stderr.readline()
            lines.append(line)
            if line.startswith("training:") or not line:
                break
        assert any(x.startswith("training:") for x in lines), "".join(lines)
        assert not (work / "checkpoint.pt").exists()  # the periodic checkpoint is an hour away
        time.sleep(3)  # some steps
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, "".join(lines) + err
    assert "--resume" in err and "Traceback" not in err
    ck = load_checkpoint(work / "checkpoint.pt")
    assert ck["train"]["step"] > 0
    acc, drafted = _acceptance(target, out, ["the sun of a cold day is"])
    assert drafted > 0
    # and the run resumes from it
    r = subprocess.run(
        cmd + ["--resume", "--train-steps", str(ck["train"]["step"] + 3)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert load_checkpoint(work / "checkpoint.pt")["train"]["step"] == ck["train"]["step"] + 3
    assert f"resuming training from {work / 'checkpoint.pt'} (step {ck['train']['step']}" in r.stderr


# -- command-line errors ------------------------------------------------------------------------------------------

BAD = [
    (["train-eagle3"], "-o", "required"),
    (["train-eagle3", "-o", "/nonexistent/dir/h.gguf"], "-o", "does not exist"),
    (["train-eagle3", "/nonexistent/t.gguf", "-o", "{tmp}/h.gguf"], "TARGET", "does not exist"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--minutes", "0"], "--minutes", "'0'"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--minutes", "soon"], "--minutes", "'soon'"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--draft-vocab", "1"], "--draft-vocab", "'1'"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--prompts", "/nonexistent.jsonl"], "--prompts", "not a readable"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--prompts", "{tmp}/bad.jsonl"], "--prompts", "bad.jsonl:2"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--no-builtin-corpus"], "--no-builtin-corpus", "--prompts"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--evaluate", "later"], "--evaluate", "full, quick, none"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--dtype", "q4_0"], "--dtype", "auto, f32, f16, q8_0"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--threads", "0"], "--threads", "'0'"),
    (["train-eagle3", "-o", "{tmp}/h.gguf", "--depth", "0"], "--depth", "'0'"),
    (["train-eagle3", "-o", "{tmp}", "--seed", "1"], "-o", "is a folder"),
    (["bench", "--strategy", "eagle3"], "--strategy", "needs an EAGLE-3 head"),
    (["bench", "--strategy", "magic"], "--strategy", "'magic'"),
    (["bench", "--draft-model", "/nonexistent.gguf"], "--draft-model", "does not exist"),
    (["bench", "--derived-draft", "3-1"], "--derived-draft", "3-1"),
    (["bench", "--draft-p-min", "2"], "--draft-p-min", "[0, 1]"),
]


@pytest.mark.parametrize("argv,option,detail", BAD)
def test_bad_options_exit_2_with_one_line_before_any_model_loads(argv, option, detail, tmp_path, capsys, monkeypatch):
    import specviz.models.embedded as models
    from specviz.backends import llama
    from specviz.cli import main as cli

    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]

    def poisoned(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "default_model_path", poisoned)
    monkeypatch.setattr(llama.LlamaModel, "__init__", poisoned)
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert option in err and detail in err, err
    assert not list(Path(tmp_path).glob("*.gguf"))
