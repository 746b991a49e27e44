"""The corpus as training data: sequences, the draft vocabulary, the validation split and batches.

Layout of one sequence of length ``L`` (see :mod:`specviz.train.generate`): tokens ``t[0 … L-1]``, features
``f[0 … L-2]`` (row ``p`` from evaluating ``t[p]``) and, from the last prompt position on, the target's
top-k next tokens with their log-probabilities relative to the top one, ``D[p]`` (the distribution of
``t[p+1]``). A drafting step at anchor ``P`` and depth ``j``
(:meth:`~specviz.train.model.Eagle3Head.forward_steps`) reads ``f[P]``, ``t[P+1 … P+j+1]`` and is scored
against ``D[P+j+1]``; it counts when that label exists.

The draft vocabulary (:func:`choose_draft_vocab`) is the ``n`` target ids the target *generated* most
often in the training split (prompt tokens are the user's, not the target's); its coverage — the share of
generated tokens it can express — is reported on the training and the validation split. A drafter can
never propose a token outside it, so coverage bounds acceptance.

The validation split is a fixed share of the sequences (by a hash of the prompt's index), never trained on.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .generate import CorpusInfo, load_corpus_info

__all__ = ["Batch", "Corpus", "Coverage", "choose_draft_vocab", "load_corpus"]


@dataclass
class Corpus:
    """Every sequence of a corpus folder, concatenated (features as float16 rows times a float32 scale)."""

    info: CorpusInfo
    tokens: np.ndarray  # int32 [N]
    seq_start: np.ndarray  # int64 [S + 1] into tokens
    feat_start: np.ndarray  # int64 [S + 1] into the feature rows (L - 1 rows per sequence)
    n_prompt: np.ndarray  # int32 [S]
    prompt_id: np.ndarray  # int32 [S]
    temperature: np.ndarray  # float32 [S]
    feats: np.ndarray  # float16 [R, F]
    feat_scale: np.ndarray  # float32 [R]
    top_ids: np.ndarray  # int32 [R, K] (-1: no label)
    top_lp: np.ndarray  # float16 [R, K]

    @property
    def n_sequences(self) -> int:
        """Number of sequences."""
        return int(len(self.n_prompt))

    def length(self, s: int) -> int:
        """Tokens of sequence ``s``."""
        return int(self.seq_start[s + 1] - self.seq_start[s])

    def generated(self, seqs: np.ndarray) -> np.ndarray:
        """The generated tokens (prompt excluded) of the sequences ``seqs``, concatenated."""
        parts = [self.tokens[self.seq_start[s] + self.n_prompt[s] : self.seq_start[s + 1]] for s in seqs]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)

    def split(self, val_share: float = 0.04) -> tuple[np.ndarray, np.ndarray]:
        """(training, validation) sequence indices: a sequence is in validation when a hash of its prompt
        index falls below ``val_share`` (so a prompt's sequences never straddle the split)."""
        h = np.asarray([zlib.crc32(int(p).to_bytes(4, "little")) % 10000 for p in self.prompt_id])
        val = h < int(round(val_share * 10000))
        idx = np.arange(self.n_sequences)
        if self.n_sequences >= 2 and not val.any():
            val[-1] = True
        if val.all():
            val[0] = False
        return idx[~val], idx[val]


def load_corpus(folder: str | Path) -> Corpus:
    """Load every shard of the corpus in ``folder``."""
    folder = Path(folder)
    info = load_corpus_info(folder)
    if info is None or not info.shards:
        raise FileNotFoundError(f"no corpus in {folder}")
    parts: dict[str, list[np.ndarray]] = {}
    seq_start = [np.zeros(1, dtype=np.int64)]
    feat_start = [np.zeros(1, dtype=np.int64)]
    tok_off = row_off = 0
    for name in info.shards:
        with np.load(folder / name) as z:
            d = {k: z[k] for k in z.files}
        lengths = np.diff(d["seq_start"])
        seq_start.append(d["seq_start"][1:] + tok_off)
        feat_start.append(np.cumsum(lengths - 1) + row_off)
        tok_off += int(d["seq_start"][-1])
        row_off += int(d["feats"].shape[0])
        for k in ("tokens", "n_prompt", "prompt_id", "temperature", "feats", "feat_scale", "top_ids", "top_lp"):
            parts.setdefault(k, []).append(d[k])
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return Corpus(
        info,
        cat["tokens"],
        np.concatenate(seq_start),
        np.concatenate(feat_start),
        cat["n_prompt"],
        cat["prompt_id"],
        cat["temperature"],
        cat["feats"],
        cat["feat_scale"],
        cat["top_ids"],
        cat["top_lp"],
    )


@dataclass(frozen=True)
class Coverage:
    """How much of the generated text a draft vocabulary can express."""

    draft_vocab: int
    distinct_generated: int
    train_share: float
    val_share: float

    def describe(self) -> str:
        """One line for the report."""
        return (
            f"draft vocabulary: {self.draft_vocab} of the {self.distinct_generated} distinct tokens the target "
            f"generated; it covers {self.train_share:.1%} of the generated tokens (training), {self.val_share:.1%} "
            "(validation)"
        )


def choose_draft_vocab(
    corpus: Corpus, train: np.ndarray, val: np.ndarray, n: int, n_vocab: int
) -> tuple[tuple[int, ...], Coverage]:
    """The ``n`` target ids generated most often in ``train`` (ties by id), ascending, and their coverage
    (fewer when the target generated fewer distinct tokens).

    The target's greedy choices (each labelled position's top id) are counted too, so a token the target
    prefers but the sampled sequences happened to skip is not lost.
    """
    gen = corpus.generated(train)
    counts = np.bincount(gen, minlength=n_vocab).astype(np.int64)
    top1 = corpus.top_ids[:, 0]
    rows = (
        np.concatenate([np.arange(corpus.feat_start[s], corpus.feat_start[s + 1]) for s in train])
        if len(train)
        else np.zeros(0, dtype=np.int64)
    )
    t1 = top1[rows]
    counts += np.bincount(t1[t1 >= 0], minlength=n_vocab)
    distinct = int((counts > 0).sum())
    # never more ids than the target produced: an id it never chose is one the head cannot learn to propose
    n = max(1, min(int(n), n_vocab, max(distinct, 1)))
    order = np.lexsort((np.arange(n_vocab), -counts))[:n]
    d2t = np.sort(order)
    inv = np.zeros(n_vocab, dtype=bool)
    inv[d2t] = True

    def share(seqs: np.ndarray) -> float:
        g = corpus.generated(seqs)
        return float(inv[g].mean()) if g.size else 0.0

    cov = Coverage(len(d2t), distinct, share(train), share(val))
    return tuple(int(x) for x in d2t), cov


@dataclass
class Batch:
    """Padded training inputs of a few sequences (numpy; the trainer moves them to torch).

    ``tokens``: ``[B, T + steps]``; ``feats``: ``[B, T, F]`` float32; ``label_ids``: ``[B, T + steps, K]``
    draft ids (-1: not expressible or no label) of ``D[p]`` at column ``p``; ``label_lp``: their
    log-probabilities; ``label_top``: ``[B, T + steps]`` the draft id of the target's top choice
    (-1: outside the draft vocabulary, -2: no label); ``greedy``: ``[B]`` whether the sequence was
    decoded greedily; ``positions``: ``[B, T]`` the anchors' positions.
    """

    tokens: np.ndarray
    feats: np.ndarray
    label_ids: np.ndarray
    label_lp: np.ndarray
    label_top: np.ndarray
    greedy: np.ndarray
    positions: np.ndarray

    @property
    def n_tokens(self) -> int:
        """Anchors with a label at depth 0."""
        return int((self.label_top[:, 1 : 1 + self.feats.shape[1]] != -2).sum())


def make_batch(corpus: Corpus, seqs: list[int], steps: int, max_len: int, t2d: np.ndarray) -> Batch:
    """The padded batch of sequences ``seqs`` (each cut to its last ``max_len`` anchors)."""
    K = corpus.top_ids.shape[1]
    spans = []
    for s in seqs:
        L = corpus.length(s)
        n_anchor = L - 1
        a0 = max(0, n_anchor - max_len)
        spans.append((s, a0, n_anchor))
    T = max(n - a0 for _, a0, n in spans)
    B = len(seqs)
    F = corpus.feats.shape[1]
    tokens = np.zeros((B, T + steps), dtype=np.int64)
    feats = np.zeros((B, T, F), dtype=np.float32)
    label_ids = np.full((B, T + steps, K), -1, dtype=np.int64)
    label_lp = np.full((B, T + steps, K), -np.inf, dtype=np.float32)
    label_top = np.full((B, T + steps), -2, dtype=np.int64)
    positions = np.zeros((B, T), dtype=np.int64)
    greedy = np.zeros(B, dtype=bool)
    for b, (s, a0, n_anchor) in enumerate(spans):
        t0, f0 = int(corpus.seq_start[s]), int(corpus.feat_start[s])
        L = n_anchor + 1
        n = n_anchor - a0
        toks = corpus.tokens[t0 + a0 : t0 + L]
        tokens[b, : len(toks)] = toks
        rows = slice(f0 + a0, f0 + n_anchor)
        feats[b, :n] = corpus.feats[rows].astype(np.float32) * corpus.feat_scale[rows, None]
        ids = corpus.top_ids[rows]
        have = ids[:, 0] >= 0
        mapped = np.where(ids >= 0, t2d[np.maximum(ids, 0)], -1)
        label_ids[b, :n] = mapped
        label_lp[b, :n] = np.where(mapped >= 0, corpus.top_lp[rows].astype(np.float32), -np.inf)
        label_top[b, :n] = np.where(have, mapped[:, 0], -2)
        positions[b, :n] = np.arange(a0, n_anchor)
        positions[b, n:] = np.arange(n_anchor, n_anchor + T - n)
        greedy[b] = corpus.temperature[s] == 0
    return Batch(tokens, feats, label_ids, label_lp, label_top, greedy, positions)


def batches(
    corpus: Corpus,
    seqs: np.ndarray,
    *,
    batch_tokens: int,
    steps: int,
    max_len: int,
    t2d: np.ndarray,
    rng: np.random.Generator,
) -> Iterator[Batch]:
    """One epoch of batches over ``seqs``: sequences with prompts of similar length together (so the prompt
    anchors, which are context only, can be skipped together; generations are of similar length), about
    ``batch_tokens`` padded anchors per batch, batches in random order."""
    key = np.asarray([corpus.n_prompt[int(s)] + min(corpus.length(int(s)), max_len) / 1e4 for s in seqs])
    order = seqs[np.argsort(key + rng.random(len(seqs)) * 1e-5, kind="stable")]
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for s in order:
        n = min(corpus.length(int(s)) - 1, max_len)
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(int(s))
        longest = max(longest, n)
    if cur:
        groups.append(cur)
    for i in rng.permutation(len(groups)):
        yield make_batch(corpus, groups[i], steps, max_len, t2d)
