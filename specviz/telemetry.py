"""Cumulative telemetry of a session, updated once per round.

Figures (all in :meth:`Telemetry.to_dict`):

* ``rounds``, ``drafted`` (draft tokens proposed), ``accepted`` (draft tokens accepted),
  ``acceptance_rate`` = accepted / drafted;
* ``mean_accepted_length`` as vLLM reports it: 1 + accepted / rounds-with-a-draft (the bonus or
  correction token included); ``tokens_per_round`` = generated / rounds;
* ``per_position_acceptance``: for draft depth i, the fraction of drafts reaching depth i whose token
  there was accepted;
* ``accepted_length_histogram``: how many rounds accepted 0, 1, 2 … draft tokens;
* ``draft_seconds``, ``verify_seconds``, ``seconds`` (decode wall time, prompt excluded),
  ``prompt_seconds``, ``tokens_per_second`` = generated / seconds;
* ``draft_buckets``: acceptance by draft-probability bucket (when the drafter reports probabilities);
* ``strategy_stats``: the drafter's own counters as llama.cpp prints them (added by the session);
* ``policy``: what the drafting policy works from (added by the session); for ``cost``, the current
  run of accepted tokens, acceptance by run position, the plain rounds' predictions and the verify
  cost curve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Upper edges of the draft-probability buckets.
PROB_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass
class Telemetry:
    """Running totals; call :meth:`record_round` after each round."""

    rounds: int = 0
    rounds_with_draft: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    seconds: float = 0.0
    prompt_seconds: float = 0.0
    prompt_tokens: int = 0
    position_tries: list = field(default_factory=list)
    position_hits: list = field(default_factory=list)
    length_hist: list = field(default_factory=list)
    bucket_tries: list = field(default_factory=lambda: [0] * len(PROB_BUCKETS))
    bucket_hits: list = field(default_factory=lambda: [0] * len(PROB_BUCKETS))
    expected_tokens: float = 0.0  # sum of the policy's expected tokens per round (cost policy)
    last_round: dict = field(default_factory=dict)

    def record_round(self, *, n_drafted: int, n_accepted: int, n_committed: int, draft_seconds: float,
                     verify_seconds: float, round_seconds: float, draft_probs=None,
                     expected_tokens: float | None = None) -> None:
        """Add one round's figures."""
        self.rounds += 1
        self.generated += n_committed
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds
        self.seconds += round_seconds
        if n_drafted > 0:
            self.rounds_with_draft += 1
            self.drafted += n_drafted
            self.accepted += n_accepted
            while len(self.position_tries) < n_drafted:
                self.position_tries.append(0)
                self.position_hits.append(0)
            for i in range(n_drafted):
                self.position_tries[i] += 1
                if i < n_accepted:
                    self.position_hits[i] += 1
            while len(self.length_hist) <= n_accepted:
                self.length_hist.append(0)
            self.length_hist[n_accepted] += 1
            if draft_probs:
                for i, p in enumerate(draft_probs[:n_drafted]):
                    if p is None:
                        continue
                    b = min(int(p * 10), len(PROB_BUCKETS) - 1)
                    self.bucket_tries[b] += 1
                    if i < n_accepted:
                        self.bucket_hits[b] += 1
        if expected_tokens is not None:
            self.expected_tokens += expected_tokens
        self.last_round = {"drafted": n_drafted, "accepted": n_accepted, "committed": n_committed,
                           "draft_seconds": draft_seconds, "verify_seconds": verify_seconds,
                           "seconds": round_seconds, "expected_tokens": expected_tokens}

    def to_dict(self) -> dict[str, Any]:
        """Every figure as a JSON-serialisable dictionary."""
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "mean_accepted_length": (1.0 + self.accepted / self.rounds_with_draft) if self.rounds_with_draft else 1.0,
            "tokens_per_round": self.generated / self.rounds if self.rounds else 0.0,
            "per_position_acceptance": [h / t if t else 0.0 for h, t in zip(self.position_hits, self.position_tries)],
            "per_position_tries": list(self.position_tries),
            "accepted_length_histogram": list(self.length_hist),
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "seconds": self.seconds,
            "prompt_seconds": self.prompt_seconds,
            "prompt_tokens": self.prompt_tokens,
            "n_generated": self.generated,
            "tokens_per_second": self.generated / self.seconds if self.seconds > 0 else 0.0,
            "expected_tokens_per_round": self.expected_tokens / self.rounds if self.rounds and self.expected_tokens else None,
            "draft_buckets": [
                {"lo": round(hi - 0.1, 1), "hi": hi, "tries": t, "accepted": h, "rate": h / t if t else None}
                for hi, t, h in zip(PROB_BUCKETS, self.bucket_tries, self.bucket_hits)
            ],
            "last_round": dict(self.last_round),
        }

    def state(self) -> dict[str, Any]:
        """Raw counters for snapshots."""
        return {k: (list(v) if isinstance(v, list) else (dict(v) if isinstance(v, dict) else v))
                for k, v in self.__dict__.items()}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "Telemetry":
        """Rebuild from :meth:`state`."""
        t = cls()
        for k, v in d.items():
            if hasattr(t, k):
                setattr(t, k, v)
        return t
