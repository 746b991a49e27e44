"""Synthetic event streams for front-end tests and the append benchmark (no model needed).

The events are built from the real dataclasses of :mod:`specviz.decoding.events` with a fixed seed, in the order
a :class:`~specviz.decoding.session.Session` publishes them, so the front-end sees exactly what a session sends.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from ..decoding.draft_tree import ROOT, DraftTree
from ..decoding.events import (
    Accepted,
    Alternative,
    DraftProposed,
    Finished,
    KnobsChanged,
    KVRollback,
    Rejected,
    SessionStarted,
    TelemetryEvent,
    Verified,
    event_from_dict,
)

_WORDS = [
    " the",
    " a",
    " speculative",
    " draft",
    " token",
    " is",
    " accepted",
    "\n",
    " model",
    " of",
    ",",
    ".",
    " verify",
    "\t",
    " cache",
    " round",
    " def",
    "(",
    ")",
    ":",
    "  ",
    " return",
    " x",
    " =",
    " 1",
]


def synthetic_rounds(
    n_tokens: int = 200,
    *,
    seed: int = 0,
    draft_max: int = 8,
    n_swa: int = 512,
    prompt: str = "def fib(n):\n    return",
    draft_model: bool = False,
) -> list[list[dict]]:
    """Event dictionaries grouped by round until ``n_tokens`` tokens are generated.

    Group 0 holds ``SessionStarted``; each later group is one round (draft → verify → accept →
    reject → rollback → telemetry), every kind of target token (bonus, correction, plain) and a
    mid-stream ``KnobsChanged`` included. With ``draft_model`` the stream is that of the ``draft``
    strategy under the cost policy: a draft context (its KV before/peak and rollbacks), draft
    probabilities bucketed in the telemetry, the draft model's own timing and expected tokens per round.
    """
    stream = _Stream(random.Random(seed), n_tokens, draft_max, draft_model, prompt)
    groups = [[stream.session_started(n_swa)]]
    while stream.n_gen < n_tokens:
        groups.append(stream.next_round())
    return groups


#: The round at whose start the synthetic session halves its draft_max (a ``KnobsChanged``).
KNOBS_CHANGE_ROUND = 6


@dataclass
class _Round:
    """One synthetic round as it is made: the draft, then the target's choices (see :class:`_Stream`)."""

    index: int
    n_hist: int  #: tokens of history (prompt and generated) before the round
    draft: list[tuple[int, str]]
    dprobs: list[float]
    draft_seconds: float
    expected: float | None
    n_acc: int = 0
    targets: list[tuple[int, str]] = field(default_factory=list)
    tprobs: list[float] = field(default_factory=list)
    verify_seconds: float = 0.0
    rows: int | None = None  #: rows of the verify batch, when not the draft and its pending token (a tree's)

    @property
    def n_draft(self) -> int:
        """Drafted tokens."""
        return len(self.draft)

    @property
    def committed(self) -> list[tuple[int, str]]:
        """The accepted draft prefix and the target's own token."""
        return list(self.draft[: self.n_acc]) + [self.targets[self.n_acc]]

    @property
    def kv_before(self) -> int:
        """The target cache's length before the verify batch."""
        return self.n_hist - 1

    @property
    def kv_peak(self) -> int:
        """The target cache's length right after the verify batch."""
        return self.kv_before + (self.n_draft + 1 if self.rows is None else self.rows)

    @property
    def keep(self) -> int:
        """The cache length the round leaves (every committed token but the last is in the cache)."""
        return self.n_hist + len(self.committed) - 1


class _Stream:
    """A synthetic session: its setting, its random draws (one generator, drawn in a fixed order, so a seed
    gives one stream) and the cumulative counters its telemetry reports."""

    def __init__(self, rng: random.Random, n_tokens: int, draft_max: int, draft_model: bool, prompt: str) -> None:
        self.rng = rng
        self.n_tokens = n_tokens
        self.draft_model = draft_model
        self.vocab = {w: 1000 + i for i, w in enumerate(_WORDS)}
        self.prompt_pieces = ["<bos>"] + [c for c in prompt.replace("    ", "\t")]
        self.prompt_ids = [2] + [self.vocab.get(p, 300 + ord(p[0]) % 200) for p in self.prompt_pieces[1:]]
        self.strategy = "draft" if draft_model else "prompt-lookup"
        self.knobs: dict[str, Any] = (
            {
                "draft_max": draft_max,
                "draft_min": 0,
                "draft_policy": "cost",
                "draft_model": "/models/draft.gguf",
                "draft_p_min": 0.3,
            }
            if draft_model
            else {"draft_max": draft_max, "draft_min": 0, "min_ngram": 1, "max_ngram": 3}
        )
        self.r = self.n_gen = 0
        self.drafted = self.accepted = self.rounds_with = 0
        self.b_tries, self.b_hits = [0] * 10, [0] * 10
        self.pos_tries: list[int] = []
        self.pos_hits: list[int] = []
        self.expected_sum = self.dsec = self.vsec = self.secs = 0.0

    def tok(self) -> tuple[int, str]:
        """A random token of the synthetic vocabulary."""
        w = self.rng.choice(_WORDS)
        return self.vocab[w], w

    def session_started(self, n_swa: int) -> dict:
        """The ``SessionStarted`` that opens the stream."""
        return SessionStarted(
            0,
            model="/models/synthetic.gguf",
            strategy=self.strategy,
            draft_model="/models/draft.gguf" if self.draft_model else None,
            knobs=self.knobs,
            prompt_tokens=tuple(self.prompt_ids),
            prompt_pieces=tuple(self.prompt_pieces),
            max_tokens=self.n_tokens,
            n_ctx=8192,
            n_batch=512,
            n_ubatch=512,
            n_swa=n_swa,
            n_vocab=262144,
        ).to_dict()

    def next_round(self) -> list[dict]:
        """The events of the next round, in the order a session publishes them."""
        self.r += 1
        g: list[dict] = []
        if self.r == KNOBS_CHANGE_ROUND:
            g.append(self.halve_draft_max())
        rd = self.draft()
        g.append(self.draft_proposed(rd))
        self.verify(rd)
        g += [self.verified(rd), self.accepted_event(rd)]
        if rd.n_acc < rd.n_draft:
            g.append(self.rejected(rd))
        g += self.rollbacks(rd)
        self.count(rd)
        g.append(self.telemetry(rd))
        if self.n_gen >= self.n_tokens:
            g.append(Finished(self.r, reason="max_tokens", n_generated=self.n_gen).to_dict())
        return g

    def halve_draft_max(self) -> dict:
        """Halve draft_max (at least 1) from this round on: the ``KnobsChanged``."""
        new = dict(self.knobs, draft_max=max(1, self.knobs["draft_max"] // 2))
        ev = KnobsChanged(
            self.r - 1, strategy=self.strategy, knobs=new, previous_strategy=self.strategy, previous_knobs=self.knobs
        )
        self.knobs = new
        return ev.to_dict()

    def draft(self) -> _Round:
        """Draw the round's draft: none 12% of the time, else 1 to draft_max tokens (never past the token
        budget), their probabilities, the drafting seconds and, for a draft model, the expected tokens."""
        rng = self.rng
        n_draft = 0 if rng.random() < 0.12 else rng.randint(1, self.knobs["draft_max"])
        n_draft = min(n_draft, max(0, self.n_tokens - self.n_gen - 1))
        draft = [self.tok() for _ in range(n_draft)]
        dprobs = [round(rng.uniform(0.2, 1.0), 3) for _ in draft]
        if not self.draft_model:
            ds = rng.uniform(0.0002, 0.002)
        else:
            ds = 0.004 * (n_draft + 1) + rng.uniform(0, 0.002)
        expected = round(1 + sum(0.8 ** (i + 1) for i in range(n_draft)), 3) if self.draft_model else None
        self.expected_sum += expected or 0.0
        return _Round(self.r, len(self.prompt_ids) + self.n_gen, draft, dprobs, ds, expected)

    def draft_proposed(self, rd: _Round) -> dict:
        """The round's ``DraftProposed``."""
        return DraftProposed(
            rd.index,
            tokens=tuple(t for t, _ in rd.draft),
            pieces=tuple(p for _, p in rd.draft),
            probs=tuple(rd.dprobs),
            seconds=rd.draft_seconds,
            requested=self.knobs["draft_max"],
            limit=self.knobs["draft_max"],
            reason=None if rd.n_draft else ("p-min" if self.draft_model else "no-match"),
            position=rd.n_hist,
            policy="cost" if self.draft_model else "fixed",
            expected_tokens=rd.expected,
        ).to_dict()

    def verify(self, rd: _Round) -> None:
        """Draw the target's verdict: the whole draft accepted 35% of the time, else a random prefix; its
        choices (a different token where it rejects), their probabilities and the verify seconds."""
        rng, n_draft = self.rng, rd.n_draft
        rd.n_acc = n_draft if rng.random() < 0.35 else rng.randint(0, max(0, n_draft - 1)) if n_draft else 0
        rd.targets = list(rd.draft[: rd.n_acc]) + [self.tok() for _ in range(n_draft - rd.n_acc + 1)]
        if rd.n_acc < n_draft and rd.targets[rd.n_acc][0] == rd.draft[rd.n_acc][0]:
            other = " verify" if rd.draft[rd.n_acc][1] != " verify" else " cache"
            rd.targets[rd.n_acc] = (self.vocab[other], other)
        rd.tprobs = [round(rng.uniform(0.3, 0.99), 3) for _ in rd.targets]
        rd.verify_seconds = 0.018 + 0.004 * (n_draft + 1) + rng.uniform(0, 0.004)

    def verified(self, rd: _Round) -> dict:
        """The round's ``Verified``."""
        return Verified(
            rd.index,
            tokens=tuple(t for t, _ in rd.targets),
            pieces=tuple(p for _, p in rd.targets),
            probs=tuple(rd.tprobs),
            seconds=rd.verify_seconds,
            batch_size=rd.n_draft + 1 if rd.rows is None else rd.rows,
            kv_before=rd.kv_before,
            kv_peak=rd.kv_peak,
            draft_kv_before=rd.kv_before if self.draft_model else None,
            draft_kv_peak=rd.kv_before + max(1, rd.n_draft) if self.draft_model else None,
        ).to_dict()

    def accepted_event(self, rd: _Round) -> dict:
        """The round's ``Accepted``: the accepted prefix and a bonus, correction or plain token."""
        n_acc, committed = rd.n_acc, rd.committed
        kind = "plain" if rd.n_draft == 0 else ("bonus" if n_acc == rd.n_draft else "correction")
        return Accepted(
            rd.index,
            tokens=tuple(t for t, _ in committed),
            pieces=tuple(p for _, p in committed),
            n_accepted=n_acc,
            draft_probs=tuple(rd.dprobs[:n_acc]),
            target_probs=tuple(rd.tprobs[: n_acc + 1]),
            bonus_token=rd.targets[n_acc][0],
            bonus_piece=rd.targets[n_acc][1],
            bonus_prob=rd.tprobs[n_acc],
            bonus_kind=kind,
            position=rd.n_hist,
        ).to_dict()

    def rejected(self, rd: _Round) -> dict:
        """The round's ``Rejected``, with the target's choice and four random alternatives."""
        rng, n_acc = self.rng, rd.n_acc
        alts = [Alternative(rd.targets[n_acc][0], rd.targets[n_acc][1], rd.tprobs[n_acc]).to_dict()]
        for _ in range(4):
            t, p = self.tok()
            alts.append(Alternative(t, p, round(rng.uniform(0.0, rd.tprobs[n_acc] / 2), 3)).to_dict())
        rej = rd.draft[n_acc:]
        return Rejected(
            rd.index,
            depth=n_acc,
            tokens=tuple(t for t, _ in rej),
            pieces=tuple(p for _, p in rej),
            draft_probs=tuple(rd.dprobs[n_acc:]),
            target_token=rd.targets[n_acc][0],
            target_piece=rd.targets[n_acc][1],
            target_prob=rd.tprobs[n_acc],
            draft_token_target_prob=round(rng.uniform(0.0, 0.2), 3),
            alternatives=tuple(alts),
            position=rd.n_hist + n_acc,
        ).to_dict()

    def rollbacks(self, rd: _Round) -> list[dict]:
        """The round's ``KVRollback`` events: the target's (and the draft context's) cut tails."""
        out = []
        if rd.kv_peak > rd.keep:
            out.append(KVRollback(rd.index, context="target", from_pos=rd.kv_peak, to_pos=rd.keep).to_dict())
        draft_peak = rd.kv_before + max(1, rd.n_draft)
        if self.draft_model and draft_peak > rd.keep:
            out.append(KVRollback(rd.index, context="draft", from_pos=draft_peak, to_pos=rd.keep).to_dict())
        return out

    def count(self, rd: _Round) -> None:
        """Add the round to the cumulative counters."""
        for i, pr in enumerate(rd.dprobs):
            b = min(int(pr * 10), 9)
            self.b_tries[b] += 1
            self.b_hits[b] += 1 if i < rd.n_acc else 0
        self.n_gen += len(rd.committed)
        self.rounds_with += 1 if rd.n_draft else 0
        self.drafted += rd.n_draft
        self.accepted += rd.n_acc
        while len(self.pos_tries) < rd.n_draft:
            self.pos_tries.append(0)
            self.pos_hits.append(0)
        for i in range(rd.n_draft):
            self.pos_tries[i] += 1
            self.pos_hits[i] += 1 if i < rd.n_acc else 0
        self.dsec += rd.draft_seconds
        self.vsec += rd.verify_seconds
        self.secs += rd.draft_seconds + rd.verify_seconds + 0.001

    def telemetry(self, rd: _Round) -> dict:
        """The ``Telemetry`` after the round, from the cumulative counters."""
        r, draft_model = self.r, self.draft_model
        return TelemetryEvent(
            r,
            data={
                "rounds": r,
                "drafted": self.drafted,
                "accepted": self.accepted,
                "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
                "mean_accepted_length": 1 + self.accepted / self.rounds_with if self.rounds_with else 1.0,
                "per_position_acceptance": [h / t if t else 0.0 for h, t in zip(self.pos_hits, self.pos_tries)],
                "draft_seconds": self.dsec,
                "verify_seconds": self.vsec,
                "seconds": self.secs,
                "tokens_per_second": self.n_gen / self.secs,
                "n_generated": self.n_gen,
                "kv": rd.keep,
                "tokens_per_round": self.n_gen / r,
                "expected_tokens_per_round": self.expected_sum / r if draft_model else None,
                "draft_buckets": self.draft_buckets(),
                **(
                    {
                        "draft_model_seconds": self.dsec,
                        "draft_model_tokens_per_second": (self.drafted + r) / self.dsec,
                    }
                    if draft_model
                    else {}
                ),
                "policy": _cost_policy_view(r, rd.n_draft, rd.n_acc) if draft_model else {"name": "fixed"},
            },
        ).to_dict()

    def draft_buckets(self) -> list[dict]:
        """The telemetry's acceptance by draft probability (0.1-wide buckets; zero without a draft model)."""
        dm = self.draft_model
        return [
            {
                "lo": round(i / 10, 1),
                "hi": round((i + 1) / 10, 1),
                "tries": t if dm else 0,
                "accepted": hh if dm else 0,
                "rate": (hh / t if t else None) if dm else None,
            }
            for i, (t, hh) in enumerate(zip(self.b_tries, self.b_hits))
        ]


def _cost_policy_view(r: int, n_draft: int, n_acc: int) -> dict:
    """A plausible ``policy`` telemetry entry of the cost policy after round ``r``."""
    from ..decoding.cost_policy import CostPolicy

    labels = CostPolicy.BUCKET_LABELS
    return {
        "name": "cost",
        "run": n_acc if n_acc == n_draft else 0,
        "acceptance_by_run_position": {k: round(0.35 + 0.1 * i, 2) for i, k in enumerate(labels)},
        "tries_by_run_position": {k: float(r) / (i + 1) for i, k in enumerate(labels)},
        "shadow_tries": r // 3,
        "shadow_hits": r // 6,
    }


def synthetic_tree_rounds(
    n_rounds: int = 8, *, seed: int = 0, tree_width: int = 3, draft_max: int = 4
) -> list[list[dict]]:
    """Event dictionaries grouped by round for the ``draft`` strategy drafting trees (issue 56), no model needed.

    Group 0 holds ``SessionStarted``; each later group is one round. Rounds verify a draft tree of up to
    ``tree_width`` branches (``DraftProposed.tree``, ``Verified.tree_choices``, ``Accepted.tree_path``; the
    chain fields describe the kept branch, as a session publishes them), except every :data:`TREE_CHAIN_EVERY`-th
    round, which drafts a chain (``tree`` None). The first rounds show each fate: round 1 accepts a side branch
    to its leaf (a bonus), round 2 accepts nothing (every child of the pending token rejected), round 3 stops
    inside the main line (a correction); later rounds pick a branch and a stop at random.
    """
    stream = _TreeStream(random.Random(seed), n_rounds, tree_width, draft_max)
    groups = [[stream.session_started(512)]]
    for _ in range(n_rounds):
        groups.append(stream.next_round())
    return groups


#: Every how many rounds the synthetic tree session drafts a chain instead of a tree.
TREE_CHAIN_EVERY = 4


class _TreeStream(_Stream):
    """A synthetic session of the ``draft`` strategy with ``tree_width`` over one: the chain rounds are
    :class:`_Stream`'s, the tree rounds are drafted and verified here (the target's walk down the tree)."""

    def __init__(self, rng: random.Random, n_rounds: int, tree_width: int, draft_max: int) -> None:
        super().__init__(rng, 10_000, draft_max, True, "the tree of the")
        self.knobs.update(tree_width=tree_width, p_split=0.1)
        self.width = tree_width
        self.n_rounds = n_rounds
        self.tree_rounds = self.max_branches = self.nodes_verified = 0

    def next_round(self) -> list[dict]:
        """The events of the next round: a tree round, or a chain round every :data:`TREE_CHAIN_EVERY`-th."""
        self.r += 1
        if self.r % TREE_CHAIN_EVERY == 0:
            rd = self.draft()
            while rd.n_draft == 0:  # a chain round that drafted, so the view has a chain to show
                rd = self.draft()
            self.verify(rd)
            g = [self.draft_proposed(rd), self.verified(rd), self.accepted_event(rd)]
            if rd.n_acc < rd.n_draft:
                g.append(self.rejected(rd))
            return self.close_round(rd, g)
        return self.tree_round()

    def grow(self) -> tuple[DraftTree, list[str]]:
        """A tree: the main line ``draft_max`` deep, then side branches forking off it (distinct siblings)."""
        rng, depth = self.rng, self.knobs["draft_max"]
        tree, pieces = DraftTree(), []

        def add(parent: int, prob: float) -> int:
            taken = {tree.tokens[c] for c in tree.children(parent)}
            t, p = self.tok()
            while t in taken:
                t, p = self.tok()
            pieces.append(p)
            return tree.add(t, parent, round(prob, 3))

        main = [ROOT]
        for _ in range(depth):
            main.append(add(main[-1], rng.uniform(0.5, 0.95)))
        for _ in range(self.width - 1):
            node = rng.choice(main[:-1])
            for _ in range(rng.randint(1, depth - tree.depth(node))):
                node = add(node, rng.uniform(0.11, 0.45))
        return tree, pieces

    def walk(self, tree: DraftTree) -> list[int]:
        """The accepted path: the scripted fates first (see :func:`synthetic_tree_rounds`), then at random."""
        branches, rng = tree.branches, self.rng
        if self.r == 1 and len(branches) > 1:
            return branches[1]
        if self.r == 2:
            return []
        if self.r == 3:
            return branches[0][: max(1, len(branches[0]) // 2)]
        b = rng.choice(branches)
        return b[: rng.randint(0, len(b))]

    def tree_round(self) -> list[dict]:
        """Draft a tree, walk the target down it and publish the round with the kept branch as its chain."""
        rng = self.rng
        tree, pieces = self.grow()
        path = self.walk(tree)
        last = path[-1] if path else ROOT
        kept = tree.branches[tree.branch_through(last)]
        refused = {tree.tokens[c] for c in tree.children(last)}
        final = self.tok()
        while final[0] in refused:
            final = self.tok()
        k = len(path)
        rd = self.draft()
        rd.draft = [(tree.tokens[i], pieces[i]) for i in kept]
        rd.dprobs = [float(tree.probs[i] or 0.0) for i in kept]
        rd.n_acc = k
        rd.targets = [rd.draft[j] for j in range(k)] + [final] + [self.tok() for _ in range(len(kept) - k)]
        rd.tprobs = [round(rng.uniform(0.3, 0.99), 3) for _ in rd.targets]
        rd.rows = len(tree) + 1
        rd.verify_seconds = 0.018 + 0.004 * rd.rows + rng.uniform(0, 0.004)
        choices = tuple(self.choice(tree, pieces, path, j, rd) for j in range(k + 1))
        g = [
            _with(self.draft_proposed(rd), tree={**tree.to_dict(), "pieces": pieces}),
            _with(self.verified(rd), tree_choices=choices),
            _with(self.accepted_event(rd), tree_path=tuple(path)),
        ]
        if k < len(kept):
            g.append(self.rejected(rd))
        self.tree_rounds += 1
        self.max_branches = max(self.max_branches, tree.width)
        self.nodes_verified += len(tree)
        return self.close_round(rd, g)

    def choice(self, tree: DraftTree, pieces: list[str], path: list[int], j: int, rd: _Round) -> dict:
        """The target's choice at the ``j``-th row read along ``path``: its token and, as its alternatives (the
        row's next most probable tokens other than its choice, best first, as a session reports them), the
        tree's other children there and other tokens."""
        token, piece = rd.targets[j]
        prob = rd.tprobs[j]
        at = tree.children(path[j - 1] if j else ROOT)
        alts: list[list[Any]] = []
        rest = 1.0 - prob
        for c in at:
            if tree.tokens[c] != token:
                alts.append([tree.tokens[c], pieces[c], round(rest * self.rng.uniform(0.1, 0.5), 3)])
        while len(alts) < 4:
            t, p = self.tok()
            if t != token and all(a[0] != t for a in alts):
                alts.append([t, p, round(rest * self.rng.uniform(0.0, 0.1), 3)])
        alts.sort(key=lambda a: -a[2])
        return {"token": token, "piece": piece, "prob": prob, "alternatives": alts}

    def close_round(self, rd: _Round, g: list[dict]) -> list[dict]:
        """The round's rollbacks and telemetry (with the tree figures), and the finish after the last round."""
        g += self.rollbacks(rd)
        self.count(rd)
        tel = self.telemetry(rd)
        tel["data"]["tree"] = {
            "rounds_with_branches": self.tree_rounds,
            "max_branches": self.max_branches,
            "nodes_verified": self.nodes_verified,
        }
        g.append(tel)
        if self.r >= self.n_rounds:
            g.append(Finished(self.r, reason="max_tokens", n_generated=self.n_gen).to_dict())
        return g


def _with(d: dict, **fields: Any) -> dict:
    """Event dictionary ``d`` with ``fields`` set, rebuilt through its dataclass (a field it lacks raises)."""
    ev = event_from_dict(d)
    return dataclasses.replace(ev, **fields).to_dict()
