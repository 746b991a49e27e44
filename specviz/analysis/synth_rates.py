"""A recording's acceptance by draft position in the form llama-server's synthetic acceptance reads it
(``--spec-synth-rates``, ``--spec-synth-len``): ``specviz advise REC --synth-rates``.

What the server does with them (the llama.cpp that llama-cpp-python 0.3.36 vendors). With synthetic
acceptance the server still drafts with its ``--spec-type`` but decides each drafted token by a coin
instead of the target (``tools/server/server-context.cpp``, ``server_sample_and_accept_synth``): position
``i`` of a draft is accepted with the *conditional* probability ``P_i / P_(i-1)`` (``P_(-1) = 1``; 0 where
``P_(i-1)`` is 0; ``common_speculative_init`` in ``common/speculative.cpp``), given positions ``0..i-1``
were, and the first refusal ends the round with the target's token. So ``P_i`` is the *unconditional*
probability that positions ``0..i`` of a draft are all accepted, *given the draft has a position i*: a
draft shorter than ``i + 1`` tokens is never decided at ``i`` (the server neither accepts nor refuses
there). A drafted end-of-generation token is never accepted, and the text generated is not valid (the
server's warning: benchmarking only).

``common_speculative_synth_rates_resolve`` checks the rates: exactly ``n_max`` values, where ``n_max`` is
the draft length of the speculative types the server runs (``--spec-draft-n-max`` for the model drafts,
``size_m`` for ngram-simple / ngram-map-k / ngram-map-k4v, ``--spec-ngram-mod-n-max``, 8 for ngram-cache;
the largest of a chain's), each finite and in ``[0, 1]``, non-increasing, and at least one speculative
token; the server refuses to start otherwise, and without a speculative type at all. ``--spec-synth-len L``
says the same with one number, the mean accepted length *including the target token*, ``1 + sum(P_i)``
(the server's own ``mean length`` of the rates); the server turns it into geometric rates ``p, p^2, ...``
with that sum, so it keeps the length and not the shape. The two flags are mutually exclusive.

From a recording (:func:`synth_rates`), one rule: the diagnosis's acceptance by depth
(:meth:`~specviz.analysis.diagnosis.Diagnosis.by_depth`), which counts a draft token where the target
judged it (every token up to and including a draft's first refused one). At depth ``i`` that is exactly the
server's conditional probability: of the drafts that reached position ``i`` with ``0..i-1`` accepted, the
share accepted at ``i``; a draft shorter than ``i + 1`` tokens (or cut by the end of the generation
before it) counts at no position past its end, as the server's synthetic acceptance never decides there.
``P_i`` is the product of the conditional rates up to ``i`` (so non-increasing and in ``[0, 1]`` by
construction), one per position up to the longest draft recorded; a position no recorded draft reached
(each one was refused before it, or ended) takes 0. The flag's numbers are rounded to
:data:`RATE_DIGITS` significant digits, which keeps them non-increasing and in ``[0, 1]``.

This differs from the server's own per-position counter in ``/metrics``
(``llamacpp:spec_decode_num_accepted_tokens_per_pos_total`` over ``spec_decode_num_drafts_total``, and
its log's ``acc per pos``): that one divides by every verification step, a draft shorter than position
``i`` counting as not accepted there. The two agree when every draft has the full length, as in the
server check (:func:`~specviz.analysis.synth_server.measure_synthetic`), whose drafter is arranged to draft
full length nearly always.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import KnobError, RecordingError
from .advise_flags import llama_flags
from .advise_rounds import collect
from .advise_search import Candidate
from .diagnose import diagnose
from .sources import EventSource, events_of

#: Significant digits of a rate in the flag (rounding keeps the rates non-increasing and in [0, 1]).
RATE_DIGITS = 4


@dataclass(frozen=True)
class SynthRates:
    """One strategy's recorded acceptance by draft position, as ``--spec-synth-rates`` reads it (see the
    module docstring): per position the drafts that reached it (``reached``), of them the accepted
    (``accepted``), the conditional rate and the unconditional one (``rates``)."""

    strategy: str
    knobs: dict[str, Any]
    reached: tuple[int, ...]
    accepted: tuple[int, ...]
    drafting_rounds: int  #: rounds that drafted at least one token (the server's verification steps)
    draft_tokens: int  #: tokens drafted in them
    accepted_tokens: int  #: of which accepted
    #: per position, the drafting rounds that accepted at least up to it: the server's ``/metrics`` counter
    #: (``spec_decode_num_accepted_tokens_per_pos_total``) for these drafts
    accepted_per_pos: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def conditional(self) -> tuple[float, ...]:
        """Per position, accepted over reached: the server's ``P_i / P_(i-1)`` (0 where none reached it)."""
        return tuple(a / r if r else 0.0 for a, r in zip(self.accepted, self.reached))

    @property
    def rates(self) -> tuple[float, ...]:
        """Per position ``i``, the probability that positions ``0..i`` of a draft are all accepted."""
        out, p = [], 1.0
        for c in self.conditional:
            p *= c
            out.append(p)
        return tuple(out)

    @property
    def per_step(self) -> tuple[float, ...]:
        """Per position, :attr:`accepted_per_pos` over every drafting round: the server's own per-position
        acceptance of these drafts (a draft shorter than the position counting as not accepted there)."""
        return tuple(n / self.drafting_rounds for n in self.accepted_per_pos)

    @property
    def synth_len(self) -> float:
        """``--spec-synth-len``: the mean accepted length including the target token, ``1 + sum(rates)``."""
        return 1.0 + sum(self.rates)

    @property
    def mean_accepted_length(self) -> float:
        """The recorded drafts' own mean accepted length including the target token, as the server's log
        counts it (``1 + accepted / verification steps``): :attr:`synth_len` less what short drafts lost."""
        return 1.0 + self.accepted_tokens / self.drafting_rounds

    @property
    def mean_draft_length(self) -> float:
        """Draft tokens per drafting round."""
        return self.draft_tokens / self.drafting_rounds

    @property
    def rates_flag(self) -> str:
        """``--spec-synth-rates P0,P1,...``."""
        return f"--spec-synth-rates {format_rates(self.rates)}"

    @property
    def len_flag(self) -> str:
        """``--spec-synth-len L``."""
        return f"--spec-synth-len {self.synth_len:.4f}"

    def server_flags(self) -> str:
        """The recorded strategy's llama-server flags with a draft length of exactly one position per rate
        (as the server requires) and the rates."""
        draft_min = int(self.knobs.get("draft_min", 0) or 0)
        c = Candidate(self.strategy, len(self.reached), min(draft_min, len(self.reached)), None, 0.0, 0.0, 0.0)
        return f"{llama_flags(c, self.knobs)[0]} {self.rates_flag}"

    def report(self) -> str:
        """The table, the two flags and the notes, as text."""
        lines = [
            f"acceptance by draft position of {self.strategy} ({self.drafting_rounds} drafting rounds, drafts of "
            f"{self.mean_draft_length:.2f} tokens on average, up to {len(self.reached)}), as llama-server's "
            "synthetic acceptance reads it:",
            f"  {'position':>8}  {'reached':>7}  {'accepted':>8}  {'conditional':>11}  {'unconditional':>13}  "
            f"{'of all drafts':>13}",
        ]
        rows = zip(self.reached, self.accepted, self.conditional, self.rates, self.per_step)
        for i, (r, a, c, p, q) in enumerate(rows):
            lines.append(f"  {i:>8}  {r:>7}  {a:>8}  {c:>11.1%}  {p:>13.1%}  {q:>13.1%}")
        lines += [
            self.rates_flag,
            self.len_flag,
            "either flag, not both (llama-server refuses the two together); --spec-synth-len keeps the mean length, "
            "not the shape (the server makes the rates geometric)",
            f"as a llama-server line (the draft length must be {len(self.reached)}): {self.server_flags()}",
            f"the recorded drafts accepted {self.mean_accepted_length:.2f} tokens per round with the target's "
            "(the server's 'mean len'; less than --spec-synth-len where drafts were shorter than the longest); "
            "'of all drafts' is the server's own per-position figure for them (/metrics)",
        ]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: ``synth_rates`` (list) and ``synth_len`` with the counts they come from."""
        return {
            "strategy": self.strategy,
            "synth_rates": list(self.rates),
            "synth_len": self.synth_len,
            "conditional": list(self.conditional),
            "reached": list(self.reached),
            "accepted": list(self.accepted),
            "drafting_rounds": self.drafting_rounds,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_pos": list(self.accepted_per_pos),
            "per_step": list(self.per_step),
            "mean_draft_length": self.mean_draft_length,
            "mean_accepted_length": self.mean_accepted_length,
            "flags": {"rates": self.rates_flag, "len": self.len_flag, "server": self.server_flags()},
            "notes": list(self.notes),
        }


def format_rates(rates: Sequence[float]) -> str:
    """The rates as ``--spec-synth-rates`` takes them: comma-separated, :data:`RATE_DIGITS` significant
    digits (rounding is monotone, so the order and the range ``[0, 1]`` are kept)."""
    return ",".join(f"{float(r):.{RATE_DIGITS}g}" for r in rates)


def check_rates(rates: Sequence[float]) -> tuple[float, ...]:
    """``rates`` as llama-server checks them (``common_speculative_synth_rates_resolve``): at least one,
    each finite and in ``[0, 1]``, non-increasing; else :class:`~specviz.errors.KnobError` naming the first
    one refused. Checked on the values the flag will carry (:func:`format_rates`)."""
    out = tuple(float(x) for x in format_rates(rates).split(",")) if len(rates) else ()
    if not out:
        raise KnobError("synthetic acceptance needs at least one rate (one per draft position)", knob="synth_rates")
    for i, r in enumerate(out):
        if not (math.isfinite(r) and 0.0 <= r <= 1.0):
            raise KnobError(f"synthetic rate {i} is {r!r}: each must be within [0, 1]", knob="synth_rates", value=r)
        if i and r > out[i - 1]:
            raise KnobError(
                f"synthetic rate {i} ({r:g}) is above rate {i - 1} ({out[i - 1]:g}): the rates are unconditional "
                "(positions 0..i all accepted) and must not increase",
                knob="synth_rates",
                value=r,
            )
    return out


def synth_rates(source: EventSource, strategy: str | None = None) -> SynthRates:
    """The recorded acceptance by draft position of ``strategy`` (default: the strategy with the most
    drafting rounds) in a :class:`~specviz.decoding.session.Session` or a list of events (rewinds
    honoured); see the module docstring for the rule.

    Raises :class:`~specviz.errors.RecordingError` when the recording holds no drafted token (of
    ``strategy``, when given)."""
    events = events_of(source)
    lengths: dict[str, list[int]] = {}
    accepted: dict[str, list[int]] = {}
    knobs: dict[str, dict[str, Any]] = {}
    for r in collect(events).rounds.values():
        keep = r.length > 0
        lengths.setdefault(r.strategy, []).extend(int(x) for x in r.length[keep])
        accepted.setdefault(r.strategy, []).extend(int(x) for x in r.accepted[keep])
        knobs[r.strategy] = dict(r.knobs)
    drafted = {s: n for s, n in lengths.items() if n}
    if strategy is None and drafted:
        strategy = max(drafted, key=lambda s: len(drafted[s]))
    if strategy is None or strategy not in drafted:
        which = f" by {strategy}" if strategy else ""
        raise RecordingError(
            f"the recording holds no drafted token{which}: per-position acceptance needs rounds that drafted "
            f"(recorded strategies: {', '.join(sorted(lengths)) or 'none'}); record a session with a drafting "
            "strategy"
        )
    longest = max(drafted[strategy])
    depth = {int(d["depth"]): d for d in diagnose(events).by_depth(strategy)}
    reached = tuple(int(depth[i]["examined"]) if i in depth else 0 for i in range(longest))
    acc = tuple(int(depth[i]["accepted"]) if i in depth else 0 for i in range(longest))
    notes = _notes(strategy, longest, reached, len(drafted) > 1, sorted(drafted))
    return SynthRates(
        strategy,
        knobs[strategy],
        reached,
        acc,
        len(drafted[strategy]),
        sum(drafted[strategy]),
        sum(accepted[strategy]),
        tuple(sum(1 for n in accepted[strategy] if n > i) for i in range(longest)),
        notes,
    )


def _notes(strategy: str, longest: int, reached: tuple[int, ...], several: bool, names: list[str]) -> tuple[str, ...]:
    """What the reader of the rates should know: positions no draft reached, ngram-cache's fixed length,
    the other strategies the recording drafted with."""
    out = []
    unreached = [i for i, r in enumerate(reached) if r == 0]
    if unreached:
        out.append(
            f"no recorded draft reached position {unreached[0]} with the positions before it accepted: the rate "
            "there (and after) is 0"
        )
    if "ngram-cache" in strategy.split(",") and longest != 8:
        out.append(f"llama.cpp's ngram-cache drafts 8 tokens: the server asks 8 rates, the recording has {longest}")
    if several:
        out.append(f"the recording drafted with {', '.join(names)}: these rates are {strategy}'s")
    return tuple(out)
