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
    """Run the whole pipeline (see the module docstring): the corpus, the head and its trainer, training,
    export, and the evaluation, each phase a function below."""
    import torch

    say = log or (lambda m: print(m, file=sys.stderr))
    target = Path(opts.target) if opts.target is not None else _default_target()
    output = Path(opts.output)
    work = Path(opts.work_dir) if opts.work_dir is not None else default_work_dir(output)
    work.mkdir(parents=True, exist_ok=True)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    _fresh_or_resumed(opts, work, say)
    prompts = _prompts(opts)
    seconds: dict[str, float] = {}
    t_all = time.perf_counter()
    shape = _corpus_phase(opts, target, work, prompts, say, seconds)
    trainer, coverage = _trainer_phase(opts, target, output, work, shape, say)
    val = _training_phase(opts, trainer, target, output, say, seconds)
    result = _export_phase(opts, trainer, target, output, work, coverage, val, say, seconds)
    if opts.evaluate != "none":
        result.evaluation = _evaluation_phase(opts, target, output, say, seconds)
    seconds["total"] = time.perf_counter() - t_all
    return result


def _default_target() -> Path:
    """The embedded model (assembled on first use)."""
    from ..models.embedded import default_model_path

    return default_model_path()


def _fresh_or_resumed(opts: TrainOptions, work: Path, say: Callable[[str], None]) -> None:
    """Without ``resume``, clear what an earlier run left in ``work``; say which way the run starts."""
    if not opts.resume and any((work / n).exists() for n in ("corpus", "checkpoint.pt")):
        say(f"starting afresh in {work} (pass --resume to continue the run kept there)")
        _clear(work)
    elif opts.resume and not (work / "corpus").exists():
        say(f"nothing to resume in {work}: starting afresh")


def _prompts(opts: TrainOptions) -> list[str]:
    """The training prompts: the user's file (if any) and the built-in corpus (unless turned off)."""
    from .corpus import read_prompts_jsonl, training_prompts

    user = read_prompts_jsonl(opts.prompts) if opts.prompts is not None else None
    prompts = [p.text for p in training_prompts(user, seed=opts.seed, builtin=opts.builtin_corpus)]
    if not prompts:
        raise ValueError("no training prompts: give --prompts FILE.jsonl or keep the built-in corpus")
    return prompts


@dataclass(frozen=True)
class _TargetShape:
    """What the head is built for: the target layers it reads, the vocabulary, the width and the RMS-norm
    epsilon of the target."""

    layers: tuple[int, int, int]
    n_vocab: int
    n_embd: int
    eps: float


def _corpus_phase(
    opts: TrainOptions,
    target: Path,
    work: Path,
    prompts: list[str],
    say: Callable[[str], None],
    seconds: dict[str, float],
) -> _TargetShape:
    """1. The corpus: load the target, refuse one whose features cannot be captured, and generate (or
    continue) the corpus unless a finished one is kept with a checkpoint; returns the target's shape."""
    from ..backends import LlamaModel
    from ..backends.capture import capture_unavailable_reason
    from ..errors import CaptureUnavailableError
    from ..models.eagle3_gguf import default_target_layers
    from .generate import load_corpus_info

    model = LlamaModel(target)
    try:
        arch = model.info.architecture
        why = capture_unavailable_reason(arch)
        if why is not None:
            raise CaptureUnavailableError(f"cannot train an EAGLE-3 head for {target.name}: {why}")
        layers = default_target_layers(model.n_layer)
        shape = _TargetShape(
            layers,
            model.n_vocab,
            model.n_embd,
            float(model.info.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6) or 1e-6),
        )
        corpus_dir = work / "corpus"
        info = load_corpus_info(corpus_dir)
        closed = bool(info is not None and (work / "checkpoint.pt").exists())
        if not closed:
            t0 = time.perf_counter()
            info = _generate(opts, model, target, corpus_dir, prompts, layers, info, say)
            seconds["corpus"] = time.perf_counter() - t0
        assert info is not None
        say(
            f"corpus: {info.sequences} sequences, {info.tokens} tokens ({info.generated_tokens} generated by the "
            f"target) in {info.seconds:.0f} s"
            + (f"; {info.skipped_long} prompts too long, skipped" if info.skipped_long else "")
        )
    finally:
        model.close()
    return shape


def _generate(
    opts: TrainOptions,
    model: Any,
    target: Path,
    corpus_dir: Path,
    prompts: list[str],
    layers: tuple[int, int, int],
    info: Any,
    say: Callable[[str], None],
) -> Any:
    """Generate (or continue) the corpus within its budget, with a progress bar; on Ctrl-C say how to resume."""
    from .generate import GenConfig, generate_corpus

    gen = GenConfig(max_new=opts.max_new, slots=opts.slots, seed=opts.seed, n_threads=opts.threads)
    budget = opts.budget["corpus"]
    bar = _Bar("corpus", budget, opts.progress)
    t0 = time.perf_counter()
    last = [t0, 0]
    base_s = info.seconds if info is not None else 0.0

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

    say(f"generating the corpus with {target.name} ({len(prompts)} prompts, layers {list(layers)}) into {corpus_dir}")
    try:
        info = generate_corpus(
            target,
            prompts,
            corpus_dir,
            layers,
            gen,
            seconds=budget,
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
    return info


def _trainer_phase(
    opts: TrainOptions, target: Path, output: Path, work: Path, shape: _TargetShape, say: Callable[[str], None]
) -> tuple[Any, str]:
    """2. Data, vocabulary, head: the corpus split, the draft vocabulary (or those of the checkpoint resumed
    from) and the head with its trainer; returns the trainer and the vocabulary's coverage."""
    import torch

    from .dataset import choose_draft_vocab, load_corpus
    from .trainer import TrainConfig, Trainer, build_head, load_checkpoint

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
        d2t, cov = choose_draft_vocab(corpus, train_idx, val_idx, opts.draft_vocab, shape.n_vocab)
        coverage = cov.describe()
    say(coverage)
    head = build_head(
        cfg,
        target=target,
        corpus=corpus,
        d2t=d2t,
        n_vocab=shape.n_vocab,
        target_layers=shape.layers,
        n_embd=shape.n_embd,
        rms_eps=shape.eps,
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
    return trainer, coverage


def _training_phase(
    opts: TrainOptions,
    trainer: Any,
    target: Path,
    output: Path,
    say: Callable[[str], None],
    seconds: dict[str, float],
) -> dict[str, Any]:
    """3. Training within its budget, with a progress bar (on Ctrl-C: a checkpoint, the head so far written
    to ``output``, and how to resume); returns the validation figures."""
    from .export import export_head
    from .trainer import tau

    cfg = trainer.cfg
    bar = _Bar("training", opts.budget["train"], opts.progress)

    def train_progress(tr: Any, r: dict[str, Any]) -> None:
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
            seconds=opts.budget["train"],
            max_steps=opts.train_steps,
            checkpoint_seconds=60.0 * opts.checkpoint_minutes,
            progress=train_progress,
        )
    except KeyboardInterrupt:
        bar.close()
        export_head(trainer.head, target, output, dtype="f16", metadata={"steps": trainer.state.step})
        say(
            f"interrupted: checkpoint saved to {trainer.checkpoint_path} (step {trainer.state.step}) and the head "
            f"so far written to {output}; run the same command with --resume to continue training"
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
    return val


def _export_phase(
    opts: TrainOptions,
    trainer: Any,
    target: Path,
    output: Path,
    work: Path,
    coverage: str,
    val: dict[str, Any],
    say: Callable[[str], None],
    seconds: dict[str, float],
) -> TrainResult:
    """4. Export: the head as a GGUF (checked on real step-0 pairs of a validation sequence) and ``run.json``
    in the work folder."""
    from .export import export_head

    head = trainer.head
    t0 = time.perf_counter()
    pairs = _real_pairs(head, trainer.corpus, trainer.val_idx)
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
                "train_config": asdict(trainer.cfg),
                "state": asdict(trainer.state),
            },
            default=str,
        )
    )
    return TrainResult(output, work, coverage, val, res.describe(), seconds=seconds)


def _evaluation_phase(
    opts: TrainOptions, target: Path, output: Path, say: Callable[[str], None], seconds: dict[str, float]
) -> str:
    """5. The evaluation on the held-out prompts; returns its report."""
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
    return rep.text


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
