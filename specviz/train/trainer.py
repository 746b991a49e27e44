"""Training an EAGLE-3 head on a corpus: the loss, the schedule, checkpoints and resuming.

Objective. At every anchor and drafting depth ``j`` (``steps`` of them, EAGLE-3's training-time test; see
:mod:`specviz.train.model`) the head's distribution over its draft vocabulary is fitted to the target's:
a cross-entropy against the target's top-k next tokens at that position, their probabilities
renormalised over the ids the draft vocabulary holds. Positions whose label lies wholly outside the
vocabulary are skipped (nothing can be learned there). Depth ``j`` weighs ``depth_decay ** j``: the first
drafted token decides whether the others count at all.

Accuracy. A depth-``j`` prediction is right when its argmax is the target's top choice. On greedily
decoded sequences the chain's tokens are the target's own choices, so the accuracy at depth ``j`` estimates
the acceptance of the ``j``-th draft token given the ones before it, and
``1 + a0 + a0 a1 + a0 a1 a2`` the tokens a 3-token draft commits per round (shown as ``τ``).

Schedule. AdamW, a short warm-up, then the learning rate falls linearly to a tenth over the time budget
(``train_seconds``, counted across resumed runs), so a run of any length ends annealed; an optional
``max_steps`` stops earlier (short runs, tests). Matrices are multiplied in bfloat16 where the CPU does that
faster (measured at start; the weights stay float32).

Checkpoints. Every ``checkpoint_seconds`` and at the end, ``checkpoint.pt`` (written to a temporary name and
renamed): the head's weights and shape, the optimizer, the step, the seconds and tokens so far, the metrics.
A ``KeyboardInterrupt`` saves one before it propagates, so Ctrl-C leaves a checkpoint that
``--resume`` continues and that exports to a working head.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..models.eagle3_gguf import Eagle3HeadConfig
from .dataset import Batch, Corpus, batches, make_batch
from .embeddings import read_embedding_rows
from .model import Eagle3Head

__all__ = ["TrainConfig", "TrainState", "Trainer", "load_checkpoint"]

CHECKPOINT_FORMAT = "specviz-eagle3-checkpoint-1"


@dataclass
class TrainConfig:
    """The head's shape and the optimisation settings."""

    n_head: int = 0  # 0: heads of width 64 where the width allows (see head_shape)
    n_head_kv: int = 0
    n_ff: int = 1536
    steps: int = 3
    depth_decay: float = 0.8
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 40
    batch_tokens: int = 4096
    max_len: int = 768
    grad_clip: float = 1.0
    norm_before_fc: bool = True
    norm_before_residual: bool = True
    init_output_from_target: bool = True
    seed: int = 0
    bf16: str = "auto"  # "auto": measured at start; "on"; "off"


@dataclass
class TrainState:
    """What the loop has done so far (kept in checkpoints)."""

    step: int = 0
    epoch: int = 0
    seconds: float = 0.0
    tokens: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


def _bf16_faster(n_embd: int, n_vocab: int) -> bool:
    """Whether a training-sized matrix product runs at least 1.5 times faster in bfloat16 on this CPU."""
    a32 = torch.randn(1024, n_embd)
    b32 = torch.randn(n_embd, min(n_vocab, 8192))
    times = {}
    for dt in (torch.float32, torch.bfloat16):
        a, b = a32.to(dt), b32.to(dt)
        a @ b
        t0 = time.perf_counter()
        for _ in range(3):
            a @ b
        times[dt] = time.perf_counter() - t0
    return times[torch.bfloat16] * 1.5 < times[torch.float32]


def head_shape(n_embd: int, n_head: int = 0, n_head_kv: int = 0) -> tuple[int, int]:
    """(heads, key/value heads): given ones, or heads of width 64 (32, 16, 8 for narrow models) with at
    least four heads, and two key/value heads where the head count is even."""
    if n_head <= 0:
        n_head = next((n_embd // hd for hd in (64, 32, 16, 8) if n_embd % hd == 0 and n_embd // hd >= 4), 1)
    if n_head_kv <= 0:
        n_head_kv = 2 if n_head % 2 == 0 else 1
    return n_head, n_head_kv


def build_head(
    cfg: TrainConfig,
    *,
    target: str | Path,
    corpus: Corpus,
    d2t: tuple[int, ...],
    n_vocab: int,
    target_layers: tuple[int, int, int],
    n_embd: int,
    rms_eps: float,
    state: dict[str, torch.Tensor] | None = None,
    train_idx: np.ndarray | None = None,
) -> Eagle3Head:
    """A head of shape ``cfg`` for this corpus: the target's embedding rows of every corpus token (and of
    the draft vocabulary), weights from ``state`` or a fresh initialisation (see :func:`init_head`)."""
    # every corpus token, the draft vocabulary, and id 0 (the batches' padding)
    ids = np.unique(np.concatenate([corpus.tokens.astype(np.int64), np.asarray(d2t, dtype=np.int64), [0]]))
    rows = torch.from_numpy(read_embedding_rows(target, ids))
    index = torch.full((n_vocab,), -1, dtype=torch.int64)
    index[torch.from_numpy(ids)] = torch.arange(len(ids))
    n_head, n_head_kv = head_shape(n_embd, cfg.n_head, cfg.n_head_kv)
    hc = Eagle3HeadConfig(
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=cfg.n_ff,
        target_hidden=n_embd,
        target_layers=target_layers,
        d2t=d2t,
        n_vocab=n_vocab,
        norm_before_fc=cfg.norm_before_fc,
        norm_before_residual=cfg.norm_before_residual,
        rms_eps=rms_eps,
    )
    head = Eagle3Head(hc, rows, index, seed=cfg.seed)
    if state is not None:
        head.load_state_dict(state)
    else:
        init_head(head, cfg, corpus, train_idx if train_idx is not None else np.arange(corpus.n_sequences))
    return head


def init_head(head: Eagle3Head, cfg: TrainConfig, corpus: Corpus, train_idx: np.ndarray) -> None:
    """Start from the target where it helps: ``enc.output_norm`` rescales the three captured layers to equal
    weight (their sizes differ by orders of magnitude: Gemma's residual stream grows with depth), and the
    output rows start as the target's embedding rows of the draft vocabulary (the target's output head is
    tied to them), scaled to unit-variance logits."""
    with torch.no_grad():
        if head.enc_norm is not None and corpus.feats.shape[0]:
            rows = np.concatenate([np.arange(corpus.feat_start[s], corpus.feat_start[s + 1]) for s in train_idx[:200]])
            f = corpus.feats[rows].astype(np.float32)  # rows divided by their RMS already
            e = head.cfg.target_hidden
            block_rms = [float(np.sqrt(np.mean(f[:, k * e : (k + 1) * e] ** 2)) + 1e-6) for k in range(3)]
            w = torch.cat([torch.full((e,), 1.0 / r) for r in block_rms])
            head.enc_norm.copy_(w / w.pow(2).mean().sqrt())
        if cfg.init_output_from_target:
            out = head.embed(head.d2t)
            out = out / out.norm(dim=-1, keepdim=True).mean()
            head.output.copy_(out)  # rows of mean norm 1: initial logits of order 1


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint's contents (``torch.load`` with tensors only)."""
    ck = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain data, no other object
    if ck.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a specviz EAGLE-3 checkpoint")
    return ck


def _step_loss(
    head: Eagle3Head, h: torch.Tensor, b: dict[str, torch.Tensor], j: int, T: int, start: int = 0
) -> tuple[torch.Tensor, int, int, int, int, int]:
    """Depth ``j``: (summed loss, positions learned from, correct, labelled, correct greedy, labelled greedy);
    ``h`` holds the anchors ``start … T-1``.

    Only labelled rows reach the output matrix (prompt positions and padding have no label, and the output
    matrix is most of a step's cost). The soft cross-entropy ``-sum_k w_k log q(id_k)`` is computed as
    ``logsumexp(logits) - sum_k w_k logits[id_k]`` (the weights sum to one), which never materialises a
    log-softmax of the whole row.
    """
    top = b["label_top"][:, start + j + 1 : j + 1 + T]
    valid = top != -2
    hv = h[valid]
    ids = b["label_ids"][:, start + j + 1 : j + 1 + T][valid]
    lp = b["label_lp"][:, start + j + 1 : j + 1 + T][valid]
    greedy = b["greedy"][:, None].expand_as(valid)[valid]
    logits = head.logits(hv)
    learn = (ids >= 0).any(-1)
    w = torch.softmax(lp[learn], dim=-1)  # -inf entries (outside the vocabulary) get weight 0
    ll = logits[learn].float()
    loss = (torch.logsumexp(ll, dim=-1) - (w * ll.gather(-1, ids[learn].clamp(min=0))).sum(-1)).sum()
    correct = logits.argmax(-1) == top[valid]
    return (
        loss,
        int(learn.sum()),
        int(correct.sum()),
        int(valid.sum()),
        int((correct & greedy).sum()),
        int(greedy.sum()),
    )


def _to_torch(batch: Batch) -> dict[str, torch.Tensor]:
    return {
        "tokens": torch.from_numpy(batch.tokens),
        "feats": torch.from_numpy(batch.feats),
        "label_ids": torch.from_numpy(batch.label_ids),
        "label_lp": torch.from_numpy(batch.label_lp),
        "label_top": torch.from_numpy(batch.label_top),
        "positions": torch.from_numpy(batch.positions),
        "greedy": torch.from_numpy(batch.greedy),
    }


def tau(acc: list[float]) -> float:
    """Tokens a draft of ``len(acc)`` tokens commits per round, from conditional acceptances by depth."""
    e, p = 1.0, 1.0
    for a in acc:
        p *= a
        e += p
    return e


class Trainer:
    """Trains ``head`` on the sequences ``train_idx`` of ``corpus`` (see the module docstring)."""

    def __init__(
        self,
        head: Eagle3Head,
        cfg: TrainConfig,
        corpus: Corpus,
        train_idx: np.ndarray,
        val_idx: np.ndarray,
        *,
        checkpoint: Path,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.head, self.cfg, self.corpus = head, cfg, corpus
        self.train_idx, self.val_idx = train_idx, val_idx
        self.checkpoint_path = Path(checkpoint)
        self.extra = dict(extra or {})
        self.state = TrainState()
        params = [p for p in head.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            betas=(0.9, 0.95),
        )
        self.t2d = head.t2d.numpy()
        self.rng = np.random.default_rng(cfg.seed)
        if cfg.bf16 == "auto":
            self.bf16 = _bf16_faster(head.cfg.n_embd, head.cfg.n_draft_vocab)
        else:
            self.bf16 = cfg.bf16 == "on"
        self._epoch_iter: Any = None
        self.running: dict[str, float] = {}

    # -- checkpoints -----------------------------------------------------------------------------------
    def save(self) -> Path:
        """Write the checkpoint (atomically)."""
        ck = {
            "format": CHECKPOINT_FORMAT,
            "head_config": self.head.config_dict(),
            "state": {k: v.detach().clone() for k, v in self.head.state_dict().items()},
            "optim": self.opt.state_dict(),
            "train": asdict(self.state),
            "train_config": asdict(self.cfg),
            "rng": self.rng.bit_generator.state,
            "extra": self.extra,
        }
        part = self.checkpoint_path.with_name(self.checkpoint_path.name + ".part")
        torch.save(ck, part)
        part.replace(self.checkpoint_path)
        return self.checkpoint_path

    def restore(self, ck: dict[str, Any]) -> None:
        """Continue from a checkpoint's optimizer, counters and generator."""
        self.opt.load_state_dict(ck["optim"])
        self.state = TrainState(**ck["train"])
        self.rng.bit_generator.state = ck["rng"]

    # -- the loop --------------------------------------------------------------------------------------
    def lr_at(self, frac: float) -> float:
        """The learning rate at a fraction of the budget (warm-up by steps, then linear to a tenth)."""
        warm = min(1.0, (self.state.step + 1) / max(1, self.cfg.warmup_steps))
        return self.cfg.lr * warm * (1.0 - 0.9 * min(1.0, max(0.0, frac)))

    def _next_batch(self) -> Batch:
        while True:
            if self._epoch_iter is None:
                self._epoch_iter = batches(
                    self.corpus,
                    self.train_idx,
                    batch_tokens=self.cfg.batch_tokens,
                    steps=self.cfg.steps,
                    max_len=self.cfg.max_len,
                    t2d=self.t2d,
                    rng=self.rng,
                )
            try:
                return next(self._epoch_iter)
            except StopIteration:
                self._epoch_iter = None
                self.state.epoch += 1

    def forward_batch(
        self, b: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, list[tuple[int, int]], list[tuple[int, int]]]:
        """(loss, [(correct, valid)] by depth over all sequences, the same over greedy sequences)."""
        T = b["feats"].shape[1]
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else torch.autocast("cpu", enabled=False)
        total = torch.zeros(())
        counted = 0
        accs, accs_g = [], []
        # the first anchor any depth can learn from: earlier anchors (prompt) are context only
        labelled = (b["label_top"] != -2).any(0).nonzero()
        first = int(labelled[0]) if len(labelled) else T
        start = min(max(0, first - self.cfg.steps), T - 1)
        with ctx:
            outs = self.head.forward_steps(b["tokens"], b["feats"], self.cfg.steps, b["positions"], start=start)
            for j, h in enumerate(outs):
                loss, n, correct, valid, correct_g, valid_g = _step_loss(self.head, h, b, j, T, start)
                total = total + (self.cfg.depth_decay**j) * loss
                counted = n if j == 0 else counted
                accs.append((correct, valid))
                accs_g.append((correct_g, valid_g))
        norm = sum(self.cfg.depth_decay**j for j in range(self.cfg.steps))
        return total / (max(1, counted) * norm), accs, accs_g

    def evaluate(self, max_batches: int = 40) -> dict[str, Any]:
        """Accuracy by depth on the validation split (all sequences and greedy ones) and the loss."""
        rng = np.random.default_rng(123)
        it = batches(
            self.corpus,
            self.val_idx,
            batch_tokens=self.cfg.batch_tokens,
            steps=self.cfg.steps,
            max_len=self.cfg.max_len,
            t2d=self.t2d,
            rng=rng,
        )
        sums = np.zeros((self.cfg.steps, 2))
        sums_g = np.zeros((self.cfg.steps, 2))
        loss = 0.0
        n = 0
        with torch.no_grad():
            for i, batch in enumerate(it):
                if i >= max_batches:
                    break
                lo, a, ag = self.forward_batch(_to_torch(batch))
                loss += float(lo)
                n += 1
                sums += np.asarray(a, dtype=float)
                sums_g += np.asarray(ag, dtype=float)
        acc = [float(c / v) if v else 0.0 for c, v in sums]
        acc_g = [float(c / v) if v else 0.0 for c, v in sums_g]
        return {
            "loss": loss / max(1, n),
            "acc": acc,
            "acc_greedy": acc_g,
            "tau_greedy": tau(acc_g),
            "positions": int(sums[0, 1]),
        }

    def train(
        self,
        *,
        seconds: float,
        max_steps: int | None = None,
        checkpoint_seconds: float = 180.0,
        progress: Callable[[Trainer, dict[str, Any]], None] | None = None,
    ) -> TrainState:
        """Train until ``seconds`` of training (counted across resumes) or ``max_steps``; checkpoint regularly
        and at the end (also on ``KeyboardInterrupt``, which then propagates)."""
        st = self.state
        t_start = time.perf_counter()
        base = st.seconds
        last_ck = t_start
        ema: dict[str, float] = {}
        self.head.train()
        try:
            while True:
                elapsed = base + (time.perf_counter() - t_start)
                if elapsed >= seconds or (max_steps is not None and st.step >= max_steps):
                    break
                lr = self.lr_at(elapsed / seconds if seconds > 0 else 1.0)
                for grp in self.opt.param_groups:
                    grp["lr"] = lr
                t0 = time.perf_counter()
                batch = self._next_batch()
                b = _to_torch(batch)
                loss, accs, _ = self.forward_batch(b)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                if self.cfg.grad_clip:
                    torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.cfg.grad_clip)
                self.opt.step()
                dt = time.perf_counter() - t0
                n_tok = batch.n_tokens
                st.step += 1
                st.tokens += n_tok
                st.seconds = base + (time.perf_counter() - t_start)
                a = 0.1 if ema else 1.0
                ema["loss"] = (1 - a) * ema.get("loss", 0.0) + a * float(loss.detach())
                ema["tok_s"] = (1 - a) * ema.get("tok_s", 0.0) + a * (n_tok / dt if dt > 0 else 0.0)
                for j, (c, v) in enumerate(accs):
                    if v:
                        ema[f"acc{j}"] = (1 - a) * ema.get(f"acc{j}", c / v) + a * (c / v)
                self.running = dict(ema, lr=lr, step=st.step, seconds=st.seconds, tokens=st.tokens, epoch=st.epoch)
                if progress is not None:
                    progress(self, self.running)
                if time.perf_counter() - last_ck >= checkpoint_seconds:
                    st.history.append({"step": st.step, "seconds": st.seconds, **{k: v for k, v in ema.items()}})
                    self.save()
                    last_ck = time.perf_counter()
        except KeyboardInterrupt:
            self.save()
            raise
        self.head.eval()
        self.save()
        return st


def make_eval_batch(corpus: Corpus, seqs: list[int], steps: int, max_len: int, t2d: np.ndarray) -> Batch:
    """One batch of the given sequences (for tests and notebooks)."""
    return make_batch(corpus, seqs, steps, max_len, t2d)
