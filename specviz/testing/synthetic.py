"""Synthetic event streams for front-end tests and the append benchmark (no model needed).

The events are built from the real dataclasses of :mod:`specviz.decoding.events` with a fixed seed, in the order
a :class:`~specviz.decoding.session.Session` publishes them, so the front-end sees exactly what a session sends.
"""

from __future__ import annotations

import random
from typing import Any

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
    rng = random.Random(seed)
    vocab = {w: 1000 + i for i, w in enumerate(_WORDS)}

    def tok():
        w = rng.choice(_WORDS)
        return vocab[w], w

    prompt_pieces = ["<bos>"] + [c for c in prompt.replace("    ", "\t")]
    prompt_ids = [2] + [vocab.get(p, 300 + ord(p[0]) % 200) for p in prompt_pieces[1:]]
    strategy = "draft" if draft_model else "prompt-lookup"
    knobs: dict[str, Any] = (
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
    b_tries = [0] * 10
    b_hits = [0] * 10
    expected_sum = 0.0
    groups: list[list[dict]] = [
        [
            SessionStarted(
                0,
                model="/models/synthetic.gguf",
                strategy=strategy,
                draft_model="/models/draft.gguf" if draft_model else None,
                knobs=knobs,
                prompt_tokens=tuple(prompt_ids),
                prompt_pieces=tuple(prompt_pieces),
                max_tokens=n_tokens,
                n_ctx=8192,
                n_batch=512,
                n_ubatch=512,
                n_swa=n_swa,
                n_vocab=262144,
            ).to_dict()
        ]
    ]
    n_gen = 0
    r = 0
    drafted = accepted = rounds_with = 0
    pos_tries: list[int] = []
    pos_hits: list[int] = []
    dsec = vsec = secs = 0.0
    while n_gen < n_tokens:
        r += 1
        g: list[dict] = []
        if r == 6:
            new = dict(knobs, draft_max=max(1, draft_max // 2))
            g.append(
                KnobsChanged(
                    r - 1, strategy=strategy, knobs=new, previous_strategy=strategy, previous_knobs=knobs
                ).to_dict()
            )
            knobs = new
        n_hist = len(prompt_ids) + n_gen
        n_draft = 0 if rng.random() < 0.12 else rng.randint(1, knobs["draft_max"])
        n_draft = min(n_draft, max(0, n_tokens - n_gen - 1))
        draft = [tok() for _ in range(n_draft)]
        dprobs = [round(rng.uniform(0.2, 1.0), 3) for _ in draft]
        ds = rng.uniform(0.0002, 0.002) if not draft_model else 0.004 * (n_draft + 1) + rng.uniform(0, 0.002)
        expected = round(1 + sum(0.8 ** (i + 1) for i in range(n_draft)), 3) if draft_model else None
        expected_sum += expected or 0.0
        g.append(
            DraftProposed(
                r,
                tokens=tuple(t for t, _ in draft),
                pieces=tuple(p for _, p in draft),
                probs=tuple(dprobs),
                seconds=ds,
                requested=knobs["draft_max"],
                limit=knobs["draft_max"],
                reason=None if n_draft else ("p-min" if draft_model else "no-match"),
                position=n_hist,
                policy="cost" if draft_model else "fixed",
                expected_tokens=expected,
            ).to_dict()
        )
        n_acc = n_draft if rng.random() < 0.35 else rng.randint(0, max(0, n_draft - 1)) if n_draft else 0
        targets = list(draft[:n_acc]) + [tok() for _ in range(n_draft - n_acc + 1)]
        if n_acc < n_draft and targets[n_acc][0] == draft[n_acc][0]:
            other = " verify" if draft[n_acc][1] != " verify" else " cache"
            targets[n_acc] = (vocab[other], other)
        tprobs = [round(rng.uniform(0.3, 0.99), 3) for _ in targets]
        vs = 0.018 + 0.004 * (n_draft + 1) + rng.uniform(0, 0.004)
        kv_before = n_hist - 1
        kv_peak = kv_before + n_draft + 1
        g.append(
            Verified(
                r,
                tokens=tuple(t for t, _ in targets),
                pieces=tuple(p for _, p in targets),
                probs=tuple(tprobs),
                seconds=vs,
                batch_size=n_draft + 1,
                kv_before=kv_before,
                kv_peak=kv_peak,
                draft_kv_before=kv_before if draft_model else None,
                draft_kv_peak=kv_before + max(1, n_draft) if draft_model else None,
            ).to_dict()
        )
        committed = [t for t in draft[:n_acc]] + [targets[n_acc]]
        kind = "plain" if n_draft == 0 else ("bonus" if n_acc == n_draft else "correction")
        g.append(
            Accepted(
                r,
                tokens=tuple(t for t, _ in committed),
                pieces=tuple(p for _, p in committed),
                n_accepted=n_acc,
                draft_probs=tuple(dprobs[:n_acc]),
                target_probs=tuple(tprobs[: n_acc + 1]),
                bonus_token=targets[n_acc][0],
                bonus_piece=targets[n_acc][1],
                bonus_prob=tprobs[n_acc],
                bonus_kind=kind,
                position=n_hist,
            ).to_dict()
        )
        if n_acc < n_draft:
            alts = [Alternative(targets[n_acc][0], targets[n_acc][1], tprobs[n_acc]).to_dict()]
            for _ in range(4):
                t, p = tok()
                alts.append(Alternative(t, p, round(rng.uniform(0.0, tprobs[n_acc] / 2), 3)).to_dict())
            rej = draft[n_acc:]
            g.append(
                Rejected(
                    r,
                    depth=n_acc,
                    tokens=tuple(t for t, _ in rej),
                    pieces=tuple(p for _, p in rej),
                    draft_probs=tuple(dprobs[n_acc:]),
                    target_token=targets[n_acc][0],
                    target_piece=targets[n_acc][1],
                    target_prob=tprobs[n_acc],
                    draft_token_target_prob=round(rng.uniform(0.0, 0.2), 3),
                    alternatives=tuple(alts),
                    position=n_hist + n_acc,
                ).to_dict()
            )
        keep = n_hist + len(committed) - 1
        if kv_peak > keep:
            g.append(KVRollback(r, context="target", from_pos=kv_peak, to_pos=keep).to_dict())
        if draft_model and kv_before + max(1, n_draft) > keep:
            g.append(KVRollback(r, context="draft", from_pos=kv_before + max(1, n_draft), to_pos=keep).to_dict())
        for i, pr in enumerate(dprobs):
            b = min(int(pr * 10), 9)
            b_tries[b] += 1
            b_hits[b] += 1 if i < n_acc else 0
        n_gen += len(committed)
        rounds_with += 1 if n_draft else 0
        drafted += n_draft
        accepted += n_acc
        while len(pos_tries) < n_draft:
            pos_tries.append(0)
            pos_hits.append(0)
        for i in range(n_draft):
            pos_tries[i] += 1
            pos_hits[i] += 1 if i < n_acc else 0
        dsec += ds
        vsec += vs
        secs += ds + vs + 0.001
        g.append(
            TelemetryEvent(
                r,
                data={
                    "rounds": r,
                    "drafted": drafted,
                    "accepted": accepted,
                    "acceptance_rate": accepted / drafted if drafted else 0.0,
                    "mean_accepted_length": 1 + accepted / rounds_with if rounds_with else 1.0,
                    "per_position_acceptance": [h / t if t else 0.0 for h, t in zip(pos_hits, pos_tries)],
                    "draft_seconds": dsec,
                    "verify_seconds": vsec,
                    "seconds": secs,
                    "tokens_per_second": n_gen / secs,
                    "n_generated": n_gen,
                    "kv": keep,
                    "tokens_per_round": n_gen / r,
                    "expected_tokens_per_round": expected_sum / r if draft_model else None,
                    "draft_buckets": [
                        {
                            "lo": round(i / 10, 1),
                            "hi": round((i + 1) / 10, 1),
                            "tries": t if draft_model else 0,
                            "accepted": hh if draft_model else 0,
                            "rate": (hh / t if t else None) if draft_model else None,
                        }
                        for i, (t, hh) in enumerate(zip(b_tries, b_hits))
                    ],
                    **(
                        {"draft_model_seconds": dsec, "draft_model_tokens_per_second": (drafted + r) / dsec}
                        if draft_model
                        else {}
                    ),
                    "policy": _cost_policy_view(r, n_draft, n_acc) if draft_model else {"name": "fixed"},
                },
            ).to_dict()
        )
        if n_gen >= n_tokens:
            g.append(Finished(r, reason="max_tokens", n_generated=n_gen).to_dict())
        groups.append(g)
    return groups


def _cost_policy_view(r: int, n_draft: int, n_acc: int) -> dict:
    """A plausible ``policy`` telemetry entry of the cost policy after round ``r``."""
    from ..decoding.policy import CostPolicy

    labels = CostPolicy.BUCKET_LABELS
    return {
        "name": "cost",
        "run": n_acc if n_acc == n_draft else 0,
        "acceptance_by_run_position": {k: round(0.35 + 0.1 * i, 2) for i, k in enumerate(labels)},
        "tries_by_run_position": {k: float(r) / (i + 1) for i, k in enumerate(labels)},
        "shadow_tries": r // 3,
        "shadow_hits": r // 6,
    }
