"""What a running ``llama-server`` has counted, read from its Prometheus ``/metrics`` (``--metrics``).

The counters of the vendored llama.cpp (``tools/server/server-task.cpp``, ``to_metrics``) that matter for
speculative decoding:

* ``llamacpp:spec_decode_num_drafts_total`` — verification steps (rounds that verified a draft);
* ``llamacpp:spec_decode_num_draft_tokens_total`` — draft tokens verified;
* ``llamacpp:spec_decode_num_accepted_tokens_total`` — of which accepted;
* ``llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` — verification steps whose
  draft was accepted at least up to position ``i`` (0-based);
* ``llamacpp:tokens_predicted_total`` / ``tokens_predicted_seconds_total`` — the generation's tokens and
  time; ``prompt_tokens_total`` + ``prompt_tokens_cached_total`` — the prompts' tokens (processed, and
  reused from the prompt cache);
* ``llamacpp:n_decode_total`` — the target's ``llama_decode`` calls of the server's main loop (prompt
  batches and generation batches alike; a verify batch is one of them, holding every busy slot's rows);
* ``llamacpp:n_busy_slots_per_decode`` — a gauge: over those calls, the slots that were busy (processing a
  request, prompt or generation) at each, on average (``n_busy_slots / max(n_decode, 1)``).

The speculative counters and the per-position ones are added when a request finishes
(``metrics_on_prediction``); the per-position series has one sample per position up to the server's draft
length (``common_speculative_n_max``) and is left out until a request that speculated has finished.

They count every request since the server started. :func:`metrics_delta` subtracts two readings, to count
only the requests sent in between; the busy slots per decode between them come from the gauge times
``n_decode_total`` at each reading (the server's running sum, which it does not print; the gauge's six
printed digits bound the error).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_SAMPLE = re.compile(r"^llamacpp:(?P<name>[a-z_]+)(?:\{position=\"(?P<pos>\d+)\"\})?\s+(?P<value>\S+)\s*$")


@dataclass
class ServerMetrics:
    """The speculative-decoding counters of one ``/metrics`` reading."""

    drafts: int = 0  #: verification steps (``spec_decode_num_drafts_total``)
    draft_tokens: int = 0  #: draft tokens verified
    accepted: int = 0  #: draft tokens accepted
    accepted_per_pos: list[int] = field(default_factory=list)  #: steps accepted at least up to position i
    tokens_predicted: int = 0
    predicted_seconds: float = 0.0
    prompt_tokens: int = 0  #: prompt tokens, processed or reused from the cache
    decodes: int | None = None  #: the main loop's ``llama_decode`` calls (``n_decode_total``; None: not known)
    #: busy slots per decode over those calls (``n_busy_slots_per_decode``; None: not known)
    busy_slots_per_decode: float | None = None
    raw: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def acceptance(self) -> float:
        """Accepted over drafted tokens (0 without drafts)."""
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_draft_length(self) -> float:
        """Draft tokens per verification step."""
        return self.draft_tokens / self.drafts if self.drafts else 0.0

    def per_position(self) -> list[float]:
        """Per draft position, the share of verification steps whose draft was accepted up to it (the
        server's own ``acc per pos`` figure: counts over *all* steps, not over the drafts that reached it)."""
        return [n / self.drafts for n in self.accepted_per_pos] if self.drafts else []

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over the generation seconds the server counted."""
        return self.tokens_predicted / self.predicted_seconds if self.predicted_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (with the derived figures)."""
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "accepted_per_pos": list(self.accepted_per_pos),
            "acceptance": self.acceptance,
            "mean_draft_length": self.mean_draft_length,
            "per_position": self.per_position(),
            "tokens_predicted": self.tokens_predicted,
            "predicted_seconds": self.predicted_seconds,
            "prompt_tokens": self.prompt_tokens,
            "decodes": self.decodes,
            "busy_slots_per_decode": self.busy_slots_per_decode,
        }


def parse_metrics(text: str) -> ServerMetrics:
    """Read the counters from ``/metrics`` text (comment lines and other metrics are skipped)."""
    raw: dict[str, float] = {}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None:
            continue
        try:
            v = float(m.group("value"))
        except ValueError:
            continue
        if m.group("pos") is not None:
            per_pos[int(m.group("pos"))] = int(v)
        else:
            raw[m.group("name")] = v
    n = max(per_pos) + 1 if per_pos else 0
    return ServerMetrics(
        drafts=int(raw.get("spec_decode_num_drafts_total", 0)),
        draft_tokens=int(raw.get("spec_decode_num_draft_tokens_total", 0)),
        accepted=int(raw.get("spec_decode_num_accepted_tokens_total", 0)),
        accepted_per_pos=[per_pos.get(i, 0) for i in range(n)],
        tokens_predicted=int(raw.get("tokens_predicted_total", 0)),
        predicted_seconds=float(raw.get("tokens_predicted_seconds_total", 0.0)),
        prompt_tokens=int(raw.get("prompt_tokens_total", 0) + raw.get("prompt_tokens_cached_total", 0)),
        decodes=int(raw["n_decode_total"]) if "n_decode_total" in raw else None,
        busy_slots_per_decode=raw.get("n_busy_slots_per_decode"),
        raw=raw,
    )


def metrics_delta(after: ServerMetrics, before: ServerMetrics) -> ServerMetrics:
    """What was counted between two readings of the same server."""
    n = max(len(after.accepted_per_pos), len(before.accepted_per_pos))

    def at(lst: list[int], i: int) -> int:
        return lst[i] if i < len(lst) else 0

    return ServerMetrics(
        drafts=after.drafts - before.drafts,
        draft_tokens=after.draft_tokens - before.draft_tokens,
        accepted=after.accepted - before.accepted,
        accepted_per_pos=[at(after.accepted_per_pos, i) - at(before.accepted_per_pos, i) for i in range(n)],
        tokens_predicted=after.tokens_predicted - before.tokens_predicted,
        predicted_seconds=after.predicted_seconds - before.predicted_seconds,
        prompt_tokens=after.prompt_tokens - before.prompt_tokens,
        decodes=None if after.decodes is None or before.decodes is None else after.decodes - before.decodes,
        busy_slots_per_decode=_busy_between(after, before),
        raw={k: after.raw.get(k, 0.0) - before.raw.get(k, 0.0) for k in after.raw},
    )


def _busy_between(after: ServerMetrics, before: ServerMetrics) -> float | None:
    """Busy slots per decode over the decodes between two readings: each reading's gauge times its decodes
    is the server's running sum of busy slots (None when a reading lacks one, or no decode came between)."""
    n_a, n_b, g_a, g_b = after.decodes, before.decodes, after.busy_slots_per_decode, before.busy_slots_per_decode
    if n_a is None or n_b is None or g_a is None or g_b is None or n_a <= n_b:
        return None
    return (g_a * n_a - g_b * n_b) / (n_a - n_b)
