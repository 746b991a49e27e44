"""``specviz train-eagle3`` end to end: corpus, vocabulary, training, export, evaluation, within a time budget.

The budget (``minutes``, 40 by default) is shared out before anything starts: 35% for generating the corpus,
45% for training, and the rest for loading, exporting and the evaluation (which ends the run; on two cores
the full evaluation takes about five minutes). Both timed phases count their seconds across resumed runs.

Everything a run makes lives in its work folder (``--work-dir``; by default under
``~/.cache/specviz/train/``, named after the output): ``corpus/`` (:mod:`specviz.train.generate`) and
``checkpoint.pt`` (:mod:`specviz.train.trainer`). ``resume`` continues from them — the corpus until its
budget, then training from the checkpoint — and without it an old work folder is cleared first. Ctrl-C
during generation keeps the finished sequences; during training it saves a checkpoint and writes the head
from it, so the run leaves something usable either way; both say how to resume.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = ["TrainOptions", "TrainResult", "train_eagle3", "default_work_dir"]


@dataclass
class TrainOptions:
    """Everything ``specviz train-eagle3`` takes (see the command's help)."""

    output: Path
    target: Path | None = None
    prompts: Path | None = None
    minutes: float = 40.0
    draft_vocab: int = 8192
    resume: bool = False
    work_dir: Path | None = None
    threads: int | None = None
    evaluate: str = "full"  # full, quick, none
    seed: int = 0
    corpus_tokens: int | None = None
    train_steps: int | None = None
    max_new: int = 160
    slots: int = 16
    dtype: str = "auto"
    builtin_corpus: bool = True
    checkpoint_minutes: float = 3.0
    progress: bool = True
    eval_repeats: int = 1
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides

    @property
    def budget(self) -> dict[str, float]:
        """Seconds for each timed phase."""
        total = 60.0 * self.minutes
        return {"corpus": 0.35 * total, "train": 0.45 * total}


@dataclass
class TrainResult:
    """What a run produced."""

    output: Path
    work_dir: Path
    coverage: str
    validation: dict[str, Any]
    export: str
    evaluation: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def default_work_dir(output: Path) -> Path:
    """``<specviz cache>/train/<output name>-<hash of its absolute path>``."""
    from ..models.embedded import cache_dir

    h = hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:10]
    return cache_dir() / "train" / f"{output.stem}-{h}"


class _Bar:
    """A time-based tqdm bar (or plain lines when tqdm is missing or progress is off)."""

    def __init__(self, desc: str, total: float, enabled: bool) -> None:
        self.bar: Any = None
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.desc = desc
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(
                    total=int(total),
                    desc=desc,
                    unit="s",
                    file=sys.stderr,
                    dynamic_ncols=True,
                    bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} s {postfix}",
                )
            except ImportError:
                self.bar = None

    def update(self, seconds: float, postfix: str) -> None:
        now = time.perf_counter()
        if self.bar is not None:
            if now - self.last < 0.5:
                return
            self.last = now
            self.bar.n = min(int(seconds), self.bar.total)
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.refresh()
        elif now - self.last > 30:
            self.last = now
            print(f"{self.desc}: {seconds:.0f} s {postfix}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _clear(work: Path) -> None:
    for name in ("corpus", "checkpoint.pt", "run.json"):
        p = work / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def train_eagle3(opts: TrainOptions, log: Callable[[str], None] | None = None) -> TrainResult:
    """Run the whole pipeline (see the module docstring)."""
    import torch

    from ..backends import LlamaModel
    from ..backends.capture import capture_unavailable_reason
    from ..errors import CaptureUnavailableError
    from ..models.eagle3_gguf import default_target_layers
    from ..models.embedded import default_model_path
    from .corpus import read_prompts_jsonl, training_prompts
    from .dataset import choose_draft_vocab, load_corpus
    from .export import export_head
    from .generate import GenConfig, generate_corpus, load_corpus_info
    from .trainer import TrainConfig, Trainer, build_head, load_checkpoint, tau

    say = log or (lambda m: print(m, file=sys.stderr))
    target = Path(opts.target) if opts.target is not None else default_model_path()
    output = Path(opts.output)
    work = Path(opts.work_dir) if opts.work_dir is not None else default_work_dir(output)
    work.mkdir(parents=True, exist_ok=True)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    if not opts.resume and any((work / n).exists() for n in ("corpus", "checkpoint.pt")):
        say(f"starting afresh in {work} (pass --resume to continue the run kept there)")
        _clear(work)
    elif opts.resume and not (work / "corpus").exists():
        say(f"nothing to resume in {work}: starting afresh")
    budget = opts.budget
    user = read_prompts_jsonl(opts.prompts) if opts.prompts is not None else None
    prompts = [p.text for p in training_prompts(user, seed=opts.seed, builtin=opts.builtin_corpus)]
    if not prompts:
        raise ValueError("no training prompts: give --prompts FILE.jsonl or keep the built-in corpus")
    seconds: dict[str, float] = {}
    t_all = time.perf_counter()

    model = LlamaModel(target)
    try:
        arch = model.info.architecture
        why = capture_unavailable_reason(arch)
        if why is not None:
            raise CaptureUnavailableError(f"cannot train an EAGLE-3 head for {target.name}: {why}")
        layers = default_target_layers(model.n_layer)
        n_vocab, n_embd = model.n_vocab, model.n_embd
        eps = float(model.info.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6) or 1e-6)
        # -- 1. the corpus -------------------------------------------------------------------------------
        corpus_dir = work / "corpus"
        info = load_corpus_info(corpus_dir)
        closed = bool(info is not None and (work / "checkpoint.pt").exists())
        if not closed:
            gen = GenConfig(max_new=opts.max_new, slots=opts.slots, seed=opts.seed, n_threads=opts.threads)
            bar = _Bar("corpus", budget["corpus"], opts.progress)
            t0 = time.perf_counter()
            last = [t0, 0]

            def gen_progress(ci: Any, active: int) -> None:
                now = time.perf_counter()
                if now - last[0] >= 1.0:
                    rate = (ci.generated_tokens - last[1]) / (now - last[0])
                    last[0], last[1] = now, ci.generated_tokens
                    bar.update(
                        base_s + (now - t0),
                        f"{ci.generated_tokens} tokens generated, {rate:.0f} tok/s, {ci.sequences} sequences, "
                        f"{active} in flight",
                    )

            base_s = info.seconds if info is not None else 0.0
            say(
                f"generating the corpus with {target.name} ({len(prompts)} prompts, layers {list(layers)}) "
                f"into {corpus_dir}"
            )
            try:
                info = generate_corpus(
                    target,
                    prompts,
                    corpus_dir,
                    layers,
                    gen,
                    seconds=budget["corpus"],
                    max_tokens=opts.corpus_tokens,
                    progress=gen_progress,
                    model=model,
                )
            except KeyboardInterrupt:
                bar.close()
                say(
                    f"interrupted: the finished sequences are kept in {corpus_dir}; run the same command with "
                    "--resume to continue"
                )
                raise
            bar.close()
            seconds["corpus"] = time.perf_counter() - t0
        assert info is not None
        say(
            f"corpus: {info.sequences} sequences, {info.tokens} tokens ({info.generated_tokens} generated by the "
            f"target) in {info.seconds:.0f} s"
            + (f"; {info.skipped_long} prompts too long, skipped" if info.skipped_long else "")
        )
    finally:
        model.close()

    # -- 2. data, vocabulary, head ----------------------------------------------------------------------
    corpus = load_corpus(work / "corpus")
    train_idx, val_idx = corpus.split()
    ck_path = work / "checkpoint.pt"
    cfg = TrainConfig(seed=opts.seed, **opts.train)
    ck = load_checkpoint(ck_path) if (opts.resume and ck_path.exists()) else None
    if ck is not None:
        cfg = TrainConfig(**ck["train_config"])
        d2t = tuple(int(x) for x in ck["head_config"]["d2t"])
        coverage = ck["extra"].get("coverage", "")
        say(f"resuming training from {ck_path} (step {ck['train']['step']}, {ck['train']['seconds']:.0f} s)")
    else:
        d2t, cov = choose_draft_vocab(corpus, train_idx, val_idx, opts.draft_vocab, n_vocab)
        coverage = cov.describe()
    say(coverage)
    head = build_head(
        cfg,
        target=target,
        corpus=corpus,
        d2t=d2t,
        n_vocab=n_vocab,
        target_layers=layers,
        n_embd=n_embd,
        rms_eps=eps,
        state=ck["state"] if ck else None,
        train_idx=train_idx,
    )
    trainer = Trainer(
        head,
        cfg,
        corpus,
        train_idx,
        val_idx,
        checkpoint=ck_path,
        extra={"coverage": coverage, "target": str(target), "output": str(output)},
    )
    if ck is not None:
        trainer.restore(ck)
    say(
        f"training: {sum(p.numel() for p in head.parameters()):,} parameters, {len(train_idx)} training and "
        f"{len(val_idx)} validation sequences, {cfg.steps} drafting steps, "
        f"{'bfloat16' if trainer.bf16 else 'float32'} matrix products, {torch.get_num_threads()} threads"
    )

    # -- 3. training --------------------------------------------------------------------------------------
    bar = _Bar("training", budget["train"], opts.progress)

    def train_progress(tr: Trainer, r: dict[str, Any]) -> None:
        accs = [r.get(f"acc{j}", 0.0) for j in range(cfg.steps)]
        bar.update(
            r["seconds"],
            f"{r['tok_s']:.0f} tok/s, accuracy by depth "
            + " ".join(f"{a:.2f}" for a in accs)
            + f", τ≈{tau(accs):.2f}, loss {r['loss']:.2f}, "
            f"epoch {r['epoch']}, step {r['step']}",
        )

    t0 = time.perf_counter()
    try:
        trainer.train(
            seconds=budget["train"],
            max_steps=opts.train_steps,
            checkpoint_seconds=60.0 * opts.checkpoint_minutes,
            progress=train_progress,
        )
    except KeyboardInterrupt:
        bar.close()
        export_head(head, target, output, dtype="f16", metadata={"steps": trainer.state.step})
        say(
            f"interrupted: checkpoint saved to {ck_path} (step {trainer.state.step}) and the head so far written "
            f"to {output}; run the same command with --resume to continue training"
        )
        raise
    bar.close()
    seconds["train"] = time.perf_counter() - t0
    val = trainer.evaluate()
    say(
        f"validation: accuracy by depth {' '.join(f'{a:.3f}' for a in val['acc'])} (all sequences), "
        f"{' '.join(f'{a:.3f}' for a in val['acc_greedy'])} (greedy ones) → τ≈{val['tau_greedy']:.2f} tokens per "
        f"{cfg.steps}-token draft round, over {val['positions']} positions"
    )

    # -- 4. export ----------------------------------------------------------------------------------------
    t0 = time.perf_counter()
    pairs = _real_pairs(head, corpus, val_idx)
    res = export_head(
        head,
        target,
        output,
        dtype=opts.dtype,
        work=work,
        n_threads=opts.threads,
        metadata={"steps": trainer.state.step, "train_seconds": float(trainer.state.seconds)},
        pairs=pairs or None,
    )
    seconds["export"] = time.perf_counter() - t0
    say(res.describe())
    (work / "run.json").write_text(
        json.dumps(
            {
                "coverage": coverage,
                "validation": val,
                "export": res.describe(),
                "train_config": asdict(cfg),
                "state": asdict(trainer.state),
            },
            default=str,
        )
    )
    result = TrainResult(output, work, coverage, val, res.describe(), seconds=seconds)

    # -- 5. evaluation ------------------------------------------------------------------------------------
    if opts.evaluate != "none":
        from .evaluate import evaluate_head

        say(f"evaluating {output.name} on the held-out free and summarise prompts ({opts.evaluate}) …")
        t0 = time.perf_counter()
        rep = evaluate_head(
            target,
            output,
            mode=opts.evaluate,
            repeats=opts.eval_repeats,
            n_threads=opts.threads,
            progress=say if opts.progress else None,
        )
        seconds["evaluate"] = time.perf_counter() - t0
        result.evaluation = rep.text
    seconds["total"] = time.perf_counter() - t_all
    return result


def _real_pairs(head: Any, corpus: Any, seqs: np.ndarray, n: int = 64) -> list[tuple[int, np.ndarray]]:
    """Step-0 pairs ``(t[P+1], g[P])`` of the first validation sequence long enough (g from the trained encoder)."""
    import torch

    for s in seqs:
        L = corpus.length(int(s))
        if L - 1 < 8:
            continue
        t0, f0 = int(corpus.seq_start[s]), int(corpus.feat_start[s])
        k = min(n, L - 1)
        f = corpus.feats[f0 : f0 + k].astype(np.float32) * corpus.feat_scale[f0 : f0 + k, None]
        with torch.no_grad():
            g = head.encode(torch.from_numpy(f)).numpy()
        toks = corpus.tokens[t0 + 1 : t0 + 1 + k]
        return [(int(t), g[i]) for i, t in enumerate(toks)]
    return []
