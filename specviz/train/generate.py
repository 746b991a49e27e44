"""The training corpus: the target's own generations, with the features an EAGLE-3 head reads, from the same GGUF.

The target generates for many prompts at once: one llama.cpp context with ``slots`` sequences (separate KV
streams), each decoding step one batch holding the next token of every active sequence. On two cores this
is about ten times the tokens per second of one sequence: a one-token decode of Gemma 3 270M is dominated
by its 262,144-row output head, which a batch of rows shares. When a sequence ends (end of generation or
``max_new`` tokens) its slot is cleared and the next prompt is evaluated into it.

For every evaluated position ``p`` (prompt and generated tokens alike) the corpus keeps the features the
head reads — the inputs of the head's three target layers, captured by
:class:`~specviz.backends.capture.LayerCapture` exactly as the ``eagle3`` strategy reads them at inference
(llama.cpp's own taps, or the C eval callback on ``gemma3``) — and, for every position whose logits the
target computed (the last prompt position and every generated one), the target's ``top_k`` most likely next
tokens with their log-probabilities relative to the most likely one (the training labels). Half the prompts
(by default) are decoded greedily, the others sampled (top-64) at a temperature, so the corpus holds both
the text greedy decoding produces and the variety sampling gives; the labels are always the target's own
distribution at that position.

Features are stored as float16 rows divided by their RMS (kept as a float32 scale per row): Gemma's
hidden states reach 1e5 at the first position, beyond float16's range.

When the budget (seconds or tokens) runs out, the sequences in flight end where they are: a generation
cut short is as good a training sequence as any, and waiting for them would overrun the budget.

A corpus is a folder of shards (``shard-NNNNN.npz``, written to a temporary name and renamed) and
``corpus.json`` (the target, the layers, the prompts done, the tokens and seconds so far), so a run that
is interrupted loses only the sequences in flight, and ``--resume`` continues with the next prompts.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..backends.binding import llama_lib
from ..backends.context_base import ContextBase
from ..backends.llama import Capacity, LlamaModel
from ..errors import ContextError

__all__ = ["BatchContext", "CorpusInfo", "GenConfig", "generate_corpus", "load_corpus_info", "GenSequence"]

CORPUS_FORMAT = "specviz-eagle3-corpus-1"


class BatchContext(ContextBase):
    """A llama.cpp context over ``n_slots`` sequences with separate KV streams, for batched generation.

    It offers what :class:`~specviz.backends.capture.LayerCapture` needs of a context (``model``, ``ptr``,
    ``capacity``, ``eval_count``, ``tap``, ``before_eval``), so features are captured exactly as for the
    ``eagle3`` strategy. Rows of a batch are given in ascending slot order. It is freed as every context is
    (:class:`~specviz.backends.context_base.ContextBase`).
    """

    what = "batched generation"

    def __init__(
        self, model: LlamaModel, n_slots: int, n_ctx_per_slot: int, *, n_batch: int = 512, n_threads: int | None = None
    ) -> None:
        from .. import backends  # noqa: F401 - initialises llama.cpp's backend through LlamaModel
        from ..backends.capture import CALLBACK_ARCHS, CallbackTap, capture_method

        lc = llama_lib()
        self.model = model
        threads = n_threads or max(1, os.cpu_count() or 1)
        p = lc.llama_context_default_params()
        p.n_ctx = n_slots * n_ctx_per_slot
        p.n_batch = n_batch
        p.n_ubatch = n_batch
        p.n_seq_max = n_slots
        p.n_threads = threads
        p.n_threads_batch = threads
        p.no_perf = True
        p.kv_unified = False  # one KV stream per sequence: attention reads only its own sequence's cells
        self.tap = None
        self.before_eval: Callable[[], None] | None = None
        self.eval_count = 0
        arch = model.info.architecture
        if capture_method(arch) == "callback" and arch in CALLBACK_ARCHS:
            self.tap = CallbackTap()
            p.cb_eval = lc.ggml_backend_sched_eval_callback(self.tap.callback_address)
            p.cb_eval_user_data = ctypes.c_void_p(self.tap.user_data)
        ctx = lc.llama_init_from_model(model.ptr, p)
        if not ctx:
            raise ContextError(f"llama.cpp could not create a context of {n_slots} sequences x {n_ctx_per_slot}")
        self._adopt(ctx)
        self.n_slots = n_slots
        self.n_ctx_per_slot = n_ctx_per_slot
        self.capacity = Capacity(
            int(lc.llama_n_ctx(ctx)), int(lc.llama_n_batch(ctx)), int(lc.llama_n_ubatch(ctx)), model.n_swa
        )
        self._batch = lc.llama_batch_init(self.capacity.n_batch, 0, 1)
        self.n_vocab = model.n_vocab

    def _free_batch(self) -> None:
        llama_lib().llama_batch_free(self._batch)

    def decode(
        self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int], logits: Sequence[bool]
    ) -> None:
        """Evaluate one batch: ``tokens[i]`` at ``positions[i]`` of sequence ``slots[i]``."""
        n = len(tokens)
        if n > self.capacity.n_batch:
            raise ContextError(f"batch of {n} exceeds n_batch={self.capacity.n_batch}")
        b = self._batch
        for i in range(n):
            b.token[i] = int(tokens[i])
            b.pos[i] = int(positions[i])
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = int(slots[i])
            b.logits[i] = 1 if logits[i] else 0
        b.n_tokens = n
        if self.before_eval is not None:
            self.before_eval()
        self.eval_count += 1
        rc = llama_lib().llama_decode(self._ctx, b)
        if rc != 0:
            raise ContextError(f"llama_decode failed with code {rc} for a batch of {n}")

    def output_logits(self, n_out: int) -> np.ndarray:
        """The last batch's output rows' logits ``[n_out, n_vocab]`` in batch order (a zero-copy view)."""
        ptr = llama_lib().llama_get_logits(self._ctx)
        if not ptr:
            raise ContextError("the last batch kept no logits")
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))

    def clear_slot(self, slot: int) -> None:
        """Forget every position of sequence ``slot``."""
        llama_lib().llama_memory_seq_rm(self._mem, slot, -1, -1)


@dataclass
class GenConfig:
    """How the corpus is generated.

    ``max_new``: tokens generated per prompt at most; ``slots``: sequences decoded together;
    ``greedy_share``: the share of prompts decoded greedily (the others are sampled at one of
    ``temperatures``); ``top_k``: labels kept per position; ``max_prompt``: longer prompts are skipped.
    """

    max_new: int = 160
    slots: int = 16
    greedy_share: float = 0.5
    temperatures: tuple[float, ...] = (0.6, 0.8, 1.0)
    top_k: int = 8
    max_prompt: int = 768
    shard_tokens: int = 16384
    seed: int = 0
    n_threads: int | None = None


@dataclass
class GenSequence:
    """One generated sequence in memory: its tokens, features and labels (see the module docstring)."""

    prompt_id: int
    n_prompt: int
    temperature: float
    tokens: list[int] = field(default_factory=list)
    feats: list[np.ndarray] = field(default_factory=list)  # per evaluated batch: [rows, F] float32
    top_ids: list[np.ndarray] = field(default_factory=list)  # per labelled position: [K] int32
    top_lp: list[np.ndarray] = field(default_factory=list)  # per labelled position: [K] float32


@dataclass
class CorpusInfo:
    """``corpus.json``: what a corpus folder holds."""

    target: str
    target_fingerprint: str
    target_layers: list[int]
    n_embd: int
    top_k: int
    shards: list[str] = field(default_factory=list)
    prompts_done: list[int] = field(default_factory=list)
    n_prompts: int = 0
    sequences: int = 0
    tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    skipped_long: int = 0
    format: str = CORPUS_FORMAT

    def save(self, folder: Path) -> None:
        """Write ``corpus.json`` atomically."""
        tmp = folder / "corpus.json.part"
        tmp.write_text(json.dumps(self.__dict__))
        tmp.replace(folder / "corpus.json")


def load_corpus_info(folder: str | Path) -> CorpusInfo | None:
    """The corpus folder's ``corpus.json``, or None when there is none."""
    p = Path(folder) / "corpus.json"
    if not p.is_file():
        return None
    d = json.loads(p.read_text())
    if d.get("format") != CORPUS_FORMAT:
        return None
    return CorpusInfo(**d)


def _write_shard(folder: Path, index: int, seqs: list[GenSequence], top_k: int) -> str:
    """Write finished sequences as one shard; returns its file name."""
    toks = np.concatenate([np.asarray(s.tokens, dtype=np.int32) for s in seqs])
    seq_start = np.concatenate([[0], np.cumsum([len(s.tokens) for s in seqs])]).astype(np.int64)
    feats = np.concatenate([np.concatenate(s.feats)[: len(s.tokens) - 1] for s in seqs]).astype(np.float32)
    rms = np.sqrt(np.mean(feats.astype(np.float64) ** 2, axis=1)).astype(np.float32)
    rms = np.maximum(rms, 1e-20)
    f16 = (feats / rms[:, None]).astype(np.float16)
    ids = np.full((feats.shape[0], top_k), -1, dtype=np.int32)
    lps = np.full((feats.shape[0], top_k), -np.inf, dtype=np.float16)
    row = 0
    for s in seqs:
        n_rows = len(s.tokens) - 1
        first = s.n_prompt - 1  # the first position whose logits the target computed
        k = len(s.top_ids)
        ids[row + first : row + first + k] = np.stack(s.top_ids)[:, :top_k]
        lps[row + first : row + first + k] = np.clip(np.stack(s.top_lp)[:, :top_k], -60, 0).astype(np.float16)
        row += n_rows
    name = f"shard-{index:05d}.npz"
    part = folder / (name + ".part.npz")
    np.savez(
        part,
        tokens=toks,
        seq_start=seq_start,
        n_prompt=np.asarray([s.n_prompt for s in seqs], np.int32),
        prompt_id=np.asarray([s.prompt_id for s in seqs], np.int32),
        temperature=np.asarray([s.temperature for s in seqs], np.float32),
        feats=f16,
        feat_scale=rms,
        top_ids=ids,
        top_lp=lps,
    )
    part.replace(folder / name)
    return name


class _Labeller:
    """Top-k labels and the next token from a batch of logits rows, with torch on one thread.

    One ``topk`` of 64 per row serves everything: the labels are its first ``top_k`` entries, stored as
    log-probabilities *relative to the top token* (``log p_k - log p_1``: the loss renormalises over the
    labels anyway, and skipping the full-row log-sum-exp saves most of the time), the greedy choice is its
    first entry, and sampled sequences draw from the 64 most likely tokens at their temperature (top-64
    sampling: the rest of a 262,144-token row carries little mass, and a full-row softmax per row would
    cost more than the batch's decode). One thread, because OpenMP workers spinning after a parallel torch
    call would take the cores llama.cpp's own threads are waiting for.
    """

    CANDIDATES = 64

    def __init__(self, top_k: int, seed: int) -> None:
        import torch

        self.torch = torch
        self.top_k = top_k
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, logits: np.ndarray, temperatures: Sequence[float]) -> tuple[np.ndarray, np.ndarray, list[int]]:
        torch = self.torch
        x = torch.from_numpy(logits)
        vals, ids = torch.topk(x, min(self.CANDIDATES, x.shape[-1]), dim=-1)
        rel = (vals[:, : self.top_k] - vals[:, :1]).numpy()
        nxt = ids[:, 0].tolist()
        for i, t in enumerate(temperatures):
            if t > 0:
                p = torch.softmax(vals[i] / t, dim=-1)
                nxt[i] = int(ids[i, int(torch.multinomial(p, 1, generator=self.gen).item())])
        return ids[:, : self.top_k].numpy().astype(np.int32), rel.astype(np.float32), nxt


def generate_corpus(
    target: str | Path,
    prompts: Sequence[str],
    folder: str | Path,
    target_layers: Sequence[int],
    cfg: GenConfig,
    *,
    seconds: float | None = None,
    max_tokens: int | None = None,
    progress: Callable[[CorpusInfo, int], None] | None = None,
    model: LlamaModel | None = None,
) -> CorpusInfo:
    """Generate (or continue) the corpus in ``folder`` from ``prompts`` until the prompts, ``seconds`` (of
    generation, counted over resumed runs) or ``max_tokens`` (generated) run out; returns its info.

    A ``KeyboardInterrupt`` writes the finished sequences and ``corpus.json`` before it propagates.
    """
    from ..backends.capture import LayerCapture

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    own_model = model is None
    m = model if model is not None else LlamaModel(target)
    info = _corpus_info(folder, target, m, target_layers, cfg)
    info.n_prompts = len(prompts)
    import torch

    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see _Labeller
    ctx = BatchContext(m, cfg.slots, cfg.max_prompt + cfg.max_new + 8, n_threads=cfg.n_threads)
    cap = LayerCapture(ctx, target_layers)
    run = _CorpusRun(m, ctx, cap, prompts, folder, info, cfg, seconds=seconds, max_tokens=max_tokens)
    try:
        run.generate(progress)
        run.flush()
    except BaseException:
        run.flush()  # the finished sequences are kept; those in flight are generated again on resume
        raise
    finally:
        cap.close()
        ctx.close()
        torch.set_num_threads(torch_threads)
        if own_model:
            m.close()
    return info


def _corpus_info(
    folder: Path, target: str | Path, m: LlamaModel, target_layers: Sequence[int], cfg: GenConfig
) -> CorpusInfo:
    """The info of the corpus in ``folder`` to continue, or a new one; ContextError when the corpus there
    was made with another target or other layers."""
    info = load_corpus_info(folder)
    if info is None:
        return CorpusInfo(
            target=str(target),
            target_fingerprint=m.fingerprint,
            target_layers=[int(x) for x in target_layers],
            n_embd=m.n_embd,
            top_k=cfg.top_k,
        )
    if info.target_fingerprint != m.fingerprint or info.target_layers != [int(x) for x in target_layers]:
        raise ContextError(
            f"the corpus in {folder} was made with another target or other layers; "
            "use another --work-dir or remove that folder"
        )
    return info


class _CorpusRun:
    """One generation run over a corpus folder: the prompts still to do, the sequences in the context's
    slots, the finished ones not yet written, and the budget (see :func:`generate_corpus`)."""

    def __init__(
        self,
        m: LlamaModel,
        ctx: BatchContext,
        cap: Any,
        prompts: Sequence[str],
        folder: Path,
        info: CorpusInfo,
        cfg: GenConfig,
        *,
        seconds: float | None,
        max_tokens: int | None,
    ) -> None:
        done = set(info.prompts_done)
        self.m, self.ctx, self.cap = m, ctx, cap
        self.prompts, self.folder, self.info, self.cfg = prompts, folder, info, cfg
        self.seconds, self.max_tokens = seconds, max_tokens
        self.queue = [i for i in range(len(prompts)) if i not in done]
        self.rng = np.random.default_rng(cfg.seed + len(done))
        self.label = _Labeller(cfg.top_k, cfg.seed + len(done))
        self.slots: list[GenSequence | None] = [None] * cfg.slots
        self.finished: list[GenSequence] = []
        self.pending_tokens = 0
        self.t_start = time.perf_counter()
        self.base_seconds = info.seconds

    def budget_left(self) -> bool:
        """Whether generation may go on: seconds (over resumed runs) and generated tokens both left."""
        if self.seconds is not None and self.base_seconds + (time.perf_counter() - self.t_start) >= self.seconds:
            return False
        return self.max_tokens is None or self.info.generated_tokens < self.max_tokens

    def generate(self, progress: Callable[[CorpusInfo, int], None] | None) -> None:
        """Fill the free slots and decode one batch at a time until the prompts or the budget run out."""
        cfg = self.cfg
        while True:
            if not self.budget_left():
                # out of time or tokens: the sequences in flight end here (a generation cut short is as good
                # a training sequence as any; waiting for them would overrun the budget)
                for i in range(cfg.slots):
                    if self.slots[i] is not None:
                        self.finish(i)
                break
            for i in range(cfg.slots):
                if self.slots[i] is None:
                    self.admit(i)
            active = [i for i in range(cfg.slots) if self.slots[i] is not None]
            if not active:
                break
            self.step(active)
            if self.pending_tokens >= cfg.shard_tokens:
                self.flush()
            if progress is not None:
                progress(self.info, len(active))

    def admit(self, slot: int) -> bool:
        """Evaluate the next prompt that fits into ``slot`` and draw its first token (prompts too long are
        skipped and counted); False when the prompts or the budget ran out first."""
        cfg, ctx, info = self.cfg, self.ctx, self.info
        while self.queue and self.budget_left():
            pid = self.queue.pop(0)
            toks = self.m.tokenize(self.prompts[pid], add_special=True)
            if len(toks) > cfg.max_prompt or len(toks) < 1:
                info.skipped_long += 1
                continue
            greedy = self.rng.random() < cfg.greedy_share
            temp = 0.0 if greedy else float(self.rng.choice(cfg.temperatures))
            s = GenSequence(pid, len(toks), temp, tokens=list(toks))
            nb = ctx.capacity.n_batch
            for a in range(0, len(toks), nb):
                chunk = toks[a : a + nb]
                last = a + nb >= len(toks)
                ctx.decode(chunk, range(a, a + len(chunk)), [slot] * len(chunk), [False] * (len(chunk) - 1) + [last])
                s.feats.append(self.cap.features(len(chunk)))
            ids, lp, nxt = self.label(ctx.output_logits(1), [temp])
            s.top_ids.append(ids[0])
            s.top_lp.append(lp[0])
            s.tokens.append(nxt[0])
            info.generated_tokens += 1
            self.slots[slot] = s
            if self.m.is_eog(nxt[0]) or cfg.max_new <= 1:
                self.finish(slot)
                continue
            return True
        return False

    def step(self, active: list[int]) -> None:
        """Decode the next token of every active sequence in one batch, keep its features and labels, and
        finish the sequences that reached the end of generation or ``max_new`` tokens."""
        seqs = [self.slots[i] for i in active]
        self.ctx.decode(
            [s.tokens[-1] for s in seqs if s], [len(s.tokens) - 1 for s in seqs if s], active, [True] * len(active)
        )
        feats = self.cap.features(len(active))
        ids, lp, nxt = self.label(self.ctx.output_logits(len(active)), [s.temperature for s in seqs if s])
        for r, i in enumerate(active):
            s = self.slots[i]
            assert s is not None
            s.feats.append(feats[r : r + 1])
            s.top_ids.append(ids[r])
            s.top_lp.append(lp[r])
            s.tokens.append(nxt[r])
            self.info.generated_tokens += 1
            n_gen = len(s.tokens) - s.n_prompt
            if self.m.is_eog(nxt[r]) or n_gen >= self.cfg.max_new:
                self.finish(i)

    def finish(self, slot: int) -> None:
        """Free ``slot``; its sequence joins the finished ones when it generated at least one token."""
        s = self.slots[slot]
        assert s is not None
        self.slots[slot] = None
        self.ctx.clear_slot(slot)
        if len(s.tokens) - s.n_prompt >= 1:
            self.finished.append(s)
            self.pending_tokens += len(s.tokens)

    def flush(self) -> None:
        """Write the finished sequences as a shard and save ``corpus.json`` (with the seconds so far)."""
        info = self.info
        if self.finished:
            info.shards.append(_write_shard(self.folder, len(info.shards), self.finished, self.cfg.top_k))
            info.prompts_done += [s.prompt_id for s in self.finished]
            info.sequences += len(self.finished)
            info.tokens += sum(len(s.tokens) for s in self.finished)
        self.finished, self.pending_tokens = [], 0
        info.seconds = self.base_seconds + (time.perf_counter() - self.t_start)
        info.save(self.folder)
