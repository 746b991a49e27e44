"""Telemetry of a session: raw counters, updated once per round, kept apart from the figures derived
from them (as vLLM's ``spec_decode/metrics.py`` keeps its counters apart from what prints them).

:class:`Telemetry` holds only counts and sums. Each derived figure is a small function of counters,
tested on hand-made numbers:

* :func:`acceptance_rate` = accepted / drafted;
* :func:`mean_accepted_length` as vLLM reports it: 1 + accepted / rounds with a draft (the bonus or
  correction token counts, so a round that accepts nothing has length 1);
* :func:`tokens_per_round` = generated / rounds;
* :func:`per_position_acceptance`: for draft depth i, accepted at i / drafts reaching depth i;
* :func:`tokens_per_second` = generated / decode seconds (prompt processing excluded);
* :func:`cpu_share` = the process's CPU seconds / (wall seconds x threads asked for): how much of the
  machine the run had (``cpu_busy`` applies :mod:`specviz.decoding.machine_load`'s rule to it);
* :func:`bucket_rates`: acceptance by the drafter's own probability (0.1-wide buckets);
* :func:`drafter_figures`: the drafting figures of each drafter that proposed drafts (a chain of
  drafters tries several per round, one proposes).

:func:`figures` returns all of them with the counters as one JSON-serialisable dictionary (what
``Session.telemetry_dict()`` extends with the strategy's counters, the cache length and the policy).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..backends.memory import Cut
from .machine_load import cpu_share, is_busy

if TYPE_CHECKING:
    from ..backends.memory import Mark
    from .policy import CostPoints, DraftingPolicy

#: Upper edges of the draft-probability buckets.
PROB_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def _zeros() -> list[int]:
    return [0] * len(PROB_BUCKETS)


@dataclass
class Telemetry:
    """Raw running counters of a session; :meth:`record_round` adds one round."""

    rounds: int = 0
    rounds_with_draft: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    seconds: float = 0.0
    #: the process's CPU seconds over the rounds' wall ``seconds`` (every thread's), and the threads the
    #: target's context was given in the latest round (0: not known)
    cpu_seconds: float = 0.0
    n_threads: int = 0
    prompt_seconds: float = 0.0
    prompt_tokens: int = 0
    position_tries: list[int] = field(default_factory=list)
    position_hits: list[int] = field(default_factory=list)
    length_hist: list[int] = field(default_factory=list)
    bucket_tries: list[int] = field(default_factory=_zeros)
    bucket_hits: list[int] = field(default_factory=_zeros)
    expected_tokens: float = 0.0  #: sum of the policy's expected tokens per round (cost policy)
    last_round: dict[str, Any] = field(default_factory=dict)
    #: memory work (:mod:`specviz.backends.memory`), target then draft context: partial-state checkpoints
    #: taken (reused ones not counted) and their bytes and seconds; rollbacks by path; restores' seconds,
    #: bytes and re-applied tokens
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    checkpoint_seconds: float = 0.0
    rollback_paths: dict[str, int] = field(default_factory=dict)
    restore_seconds: float = 0.0
    restore_bytes: int = 0
    reapplied_tokens: int = 0
    draft_checkpoints: int = 0
    draft_checkpoint_bytes: int = 0
    draft_checkpoint_seconds: float = 0.0
    draft_rollback_paths: dict[str, int] = field(default_factory=dict)
    draft_restore_seconds: float = 0.0
    #: per drafter that proposed: rounds_with_draft, drafted, accepted, position_tries, position_hits
    by_drafter: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: under a grammar: committed tokens it forced (the only token it allowed there), and drafted tokens it
    #: made impossible (a rejected draft token it forbade, and the draft after it)
    forced: int = 0
    grammar_impossible: int = 0
    #: draft trees: rounds that verified more than one branch, the most branches one round had, and the nodes
    #: those rounds verified (every branch's, the rows past the pending token's)
    tree_rounds: int = 0
    tree_max_branches: int = 0
    tree_nodes: int = 0

    def record_round(
        self,
        *,
        n_drafted: int,
        n_accepted: int,
        n_committed: int,
        draft_seconds: float,
        verify_seconds: float,
        round_seconds: float,
        draft_probs: Sequence[float | None] | None = None,
        expected_tokens: float | None = None,
        drafter: str | None = None,
        cpu_seconds: float = 0.0,
        n_threads: int | None = None,
    ) -> None:
        """Add one round: its draft length, accepted draft tokens, committed tokens and timings; ``drafter``
        names who proposed the draft (counted per drafter); ``cpu_seconds`` is the process's CPU time over the
        round and ``n_threads`` the threads the target's context was given."""
        self.rounds += 1
        self.generated += n_committed
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds
        self.seconds += round_seconds
        self.cpu_seconds += cpu_seconds
        if n_threads:
            self.n_threads = n_threads
        if n_drafted > 0:
            self.rounds_with_draft += 1
            self.drafted += n_drafted
            self.accepted += n_accepted
            _grow(self.position_tries, n_drafted)
            _grow(self.position_hits, n_drafted)
            for i in range(n_drafted):
                self.position_tries[i] += 1
                if i < n_accepted:
                    self.position_hits[i] += 1
            _grow(self.length_hist, n_accepted + 1)
            self.length_hist[n_accepted] += 1
            if drafter:
                c = self.by_drafter.setdefault(
                    drafter,
                    {"rounds_with_draft": 0, "drafted": 0, "accepted": 0, "position_tries": [], "position_hits": []},
                )
                c["rounds_with_draft"] += 1
                c["drafted"] += n_drafted
                c["accepted"] += n_accepted
                _grow(c["position_tries"], n_drafted)
                _grow(c["position_hits"], n_drafted)
                for i in range(n_drafted):
                    c["position_tries"][i] += 1
                    c["position_hits"][i] += int(i < n_accepted)
            for i, p in enumerate((draft_probs or [])[:n_drafted]):
                if p is None:
                    continue
                b = min(int(p * 10), len(PROB_BUCKETS) - 1)
                self.bucket_tries[b] += 1
                if i < n_accepted:
                    self.bucket_hits[b] += 1
        if expected_tokens is not None:
            self.expected_tokens += expected_tokens
        self.last_round = {
            "drafted": n_drafted,
            "accepted": n_accepted,
            "committed": n_committed,
            "draft_seconds": draft_seconds,
            "verify_seconds": verify_seconds,
            "seconds": round_seconds,
            "cpu_seconds": cpu_seconds,
            "expected_tokens": expected_tokens,
        }

    def record_grammar(self, forced: int, impossible: int) -> None:
        """Add one round's tokens the grammar forced and drafted tokens it made impossible."""
        self.forced += forced
        self.grammar_impossible += impossible

    def record_tree(self, branches: int, nodes: int) -> None:
        """Add one round that verified a draft tree of ``branches`` branches and ``nodes`` nodes."""
        self.tree_rounds += 1
        self.tree_max_branches = max(self.tree_max_branches, branches)
        self.tree_nodes += nodes

    def record_memory(self, checkpoint: Mark | None, rollback: Cut | None, draft: Sequence[Mark | Cut] = ()) -> None:
        """Add the target's checkpoint and rollback of one round (or the prompt) and the draft context's."""
        if checkpoint is not None and not checkpoint.reused:
            self.checkpoints += 1
            self.checkpoint_bytes += checkpoint.nbytes
            self.checkpoint_seconds += checkpoint.seconds
        if rollback is not None:
            self.rollback_paths[rollback.path] = self.rollback_paths.get(rollback.path, 0) + 1
            if rollback.path in ("checkpoint", "reprefill"):
                self.restore_seconds += rollback.seconds
                self.restore_bytes += rollback.nbytes
                self.reapplied_tokens += rollback.reapplied
        for x in draft:
            if isinstance(x, Cut):
                self.draft_rollback_paths[x.path] = self.draft_rollback_paths.get(x.path, 0) + 1
                self.draft_restore_seconds += x.seconds
            elif not x.reused:
                self.draft_checkpoints += 1
                self.draft_checkpoint_bytes += x.nbytes
                self.draft_checkpoint_seconds += x.seconds

    def to_dict(self) -> dict[str, Any]:
        """Every counter and derived figure (see :func:`figures`)."""
        return figures(self)

    def state(self) -> dict[str, Any]:
        """The raw counters, for snapshots and checkpoints: a copy (the counters go on changing), taken
        every round, so cheaper than ``copy.deepcopy``: every container counter is a flat list or
        dictionary of numbers except ``by_drafter``, one level deeper.

        The lists come back as tuples. The session keeps a round's copy for as long as it keeps the round
        (its checkpoint and its telemetry event), and CPython's garbage collector walks every list that
        lives that long on each full collection, while it stops tracking a tuple of numbers the first
        time it sees one. :meth:`from_state` turns them back into lists.
        """
        d = _recast(self.__dict__, tuple)
        for k in _FLAT_DICTS:
            d[k] = d[k].copy()
        return d

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> Telemetry:
        """Rebuild from :meth:`state` (unknown keys are ignored; a wrong type raises TypeError). The list
        counters may come as tuples (:meth:`state`) or lists (a snapshot's JSON); they become new lists."""
        t = cls()
        for k, v in _recast(d, list).items():
            if hasattr(t, k):
                want = type(getattr(t, k))
                if not isinstance(v, want) and not (isinstance(v, int) and want is float):
                    raise TypeError(f"telemetry counter {k!r} has type {type(v).__name__}")
                setattr(t, k, v)
        return t


#: The counters that are flat lists, and those that are flat dictionaries (see :meth:`Telemetry.state`):
#: every container counter but ``by_drafter``, told apart by the type its factory makes.
_CONTAINERS = [
    (f.name, f.default_factory())
    for f in dataclasses.fields(Telemetry)
    if f.default_factory is not dataclasses.MISSING and f.name != "by_drafter"
]
_FLAT_LISTS = tuple(name for name, empty in _CONTAINERS if isinstance(empty, list))
_FLAT_DICTS = tuple(name for name, empty in _CONTAINERS if isinstance(empty, dict))
assert len(_FLAT_LISTS) + len(_FLAT_DICTS) == len(_CONTAINERS), "a container counter that is no list or dict"


def state_from_json(d: dict[str, Any]) -> dict[str, Any]:
    """A :meth:`Telemetry.state` dictionary read back from JSON (a snapshot's checkpoints), in the form
    ``state()`` gives it: the list counters as tuples, the drafters' too. Nothing is checked here
    (:meth:`Telemetry.from_state` checks)."""
    return _recast(d, tuple)


def _recast(d: dict[str, Any], seq: type[tuple] | type[list]) -> dict[str, Any]:
    """A copy of the counters ``d`` whose list counters, the flat ones and each drafter's, are new
    ``seq`` (tuples in a saved state, lists in live counters); every other value is left as it is, to be
    checked by whoever reads it."""
    out = dict(d)
    for k in _FLAT_LISTS:
        if isinstance(out.get(k), (list, tuple)):
            out[k] = seq(out[k])
    by_drafter = out.get("by_drafter")
    if isinstance(by_drafter, dict):
        out["by_drafter"] = {
            name: {k: seq(v) if isinstance(v, (list, tuple)) else v for k, v in c.items()} if isinstance(c, dict) else c
            for name, c in by_drafter.items()
        }
    return out


def _grow(xs: list[int], n: int) -> None:
    while len(xs) < n:
        xs.append(0)


# -- derived figures: each a function of counters ----------------------------------------------------


def impossible_share(impossible: int, drafted: int) -> float:
    """Drafted tokens the grammar made impossible over drafted tokens (0 when nothing was drafted)."""
    return impossible / drafted if drafted else 0.0


def acceptance_rate(accepted: int, drafted: int) -> float:
    """Accepted draft tokens over drafted tokens (0 when nothing was drafted)."""
    return accepted / drafted if drafted else 0.0


def mean_accepted_length(accepted: int, rounds_with_draft: int) -> float:
    """Tokens committed per drafting round, as vLLM counts it: 1 (the target's own token) + accepted
    draft tokens per round with a draft; 1.0 before any draft."""
    return 1.0 + accepted / rounds_with_draft if rounds_with_draft else 1.0


def tokens_per_round(generated: int, rounds: int) -> float:
    """Committed tokens per round, drafting or not (0 before the first round)."""
    return generated / rounds if rounds else 0.0


def per_position_acceptance(hits: Sequence[int], tries: Sequence[int]) -> list[float]:
    """For each draft depth, accepted tokens there over drafts that reached it."""
    return [h / t if t else 0.0 for h, t in zip(hits, tries)]


def tokens_per_second(generated: int, seconds: float) -> float:
    """Committed tokens over decode seconds (prompt processing excluded); 0 before any time passed."""
    return generated / seconds if seconds > 0 else 0.0


def bucket_rates(tries: Sequence[int], hits: Sequence[int]) -> list[dict[str, Any]]:
    """Acceptance per draft-probability bucket ``[lo, hi)``; ``rate`` None for an empty bucket."""
    return [
        {"lo": round(hi - 0.1, 1), "hi": hi, "tries": t, "accepted": h, "rate": h / t if t else None}
        for hi, t, h in zip(PROB_BUCKETS, tries, hits)
    ]


def drafter_figures(by_drafter: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For each drafter that proposed drafts: its counts, acceptance rate, mean accepted length and
    acceptance by depth."""
    return {
        name: {
            "rounds_with_draft": c["rounds_with_draft"],
            "drafted": c["drafted"],
            "accepted": c["accepted"],
            "acceptance_rate": acceptance_rate(c["accepted"], c["drafted"]),
            "mean_accepted_length": mean_accepted_length(c["accepted"], c["rounds_with_draft"]),
            "per_position_acceptance": per_position_acceptance(c["position_hits"], c["position_tries"]),
            "per_position_tries": list(c["position_tries"]),
        }
        for name, c in by_drafter.items()
    }


def figures(t: Telemetry) -> dict[str, Any]:
    """The counters and every derived figure, as one JSON-serialisable dictionary."""
    share = cpu_share(t.cpu_seconds, t.seconds, t.n_threads)
    return {
        "rounds": t.rounds,
        "drafted": t.drafted,
        "accepted": t.accepted,
        "acceptance_rate": acceptance_rate(t.accepted, t.drafted),
        "forced": t.forced,
        "grammar_impossible": t.grammar_impossible,
        "grammar_impossible_share": impossible_share(t.grammar_impossible, t.drafted),
        "tree": {
            "rounds_with_branches": t.tree_rounds,
            "max_branches": t.tree_max_branches,
            "nodes_verified": t.tree_nodes,
        },
        "mean_accepted_length": mean_accepted_length(t.accepted, t.rounds_with_draft),
        "tokens_per_round": tokens_per_round(t.generated, t.rounds),
        "per_position_acceptance": per_position_acceptance(t.position_hits, t.position_tries),
        "per_position_tries": list(t.position_tries),
        "accepted_length_histogram": list(t.length_hist),
        "draft_seconds": t.draft_seconds,
        "verify_seconds": t.verify_seconds,
        "seconds": t.seconds,
        "prompt_seconds": t.prompt_seconds,
        "prompt_tokens": t.prompt_tokens,
        "n_generated": t.generated,
        "tokens_per_second": tokens_per_second(t.generated, t.seconds),
        "cpu_seconds": t.cpu_seconds,
        "n_threads": t.n_threads or None,
        "cpu_share": share,
        "cpu_busy": is_busy(share),
        "expected_tokens_per_round": t.expected_tokens / t.rounds if t.rounds and t.expected_tokens else None,
        "draft_buckets": bucket_rates(t.bucket_tries, t.bucket_hits),
        "by_drafter": drafter_figures(t.by_drafter),
        "last_round": dict(t.last_round),
        "checkpoints": t.checkpoints,
        "checkpoint_bytes": t.checkpoint_bytes,
        "checkpoint_seconds": t.checkpoint_seconds,
        "rollback_paths": dict(t.rollback_paths),
        "restore_seconds": t.restore_seconds,
        "restore_bytes": t.restore_bytes,
        "reapplied_tokens": t.reapplied_tokens,
        "draft_checkpoints": t.draft_checkpoints,
        "draft_checkpoint_bytes": t.draft_checkpoint_bytes,
        "draft_checkpoint_seconds": t.draft_checkpoint_seconds,
        "draft_rollback_paths": dict(t.draft_rollback_paths),
        "draft_restore_seconds": t.draft_restore_seconds,
    }


class TelemetryView:
    """``Session.telemetry_dict()`` of one moment, built when called: what a round's telemetry event
    holds until something reads it.

    ``counters`` is a :meth:`Telemetry.state` copy taken then; ``strategy_stats``, ``extra`` (the
    drafter's own figures), ``kv``, the drafting policy's state and its verify cost's points were taken then
    too, and ``policy`` (the policy's class) describes them when it is called
    (:meth:`~specviz.decoding.policy.DraftingPolicy.describe_state`); ``memory`` and ``machine`` are views
    (:class:`~specviz.decoding.machine.MemoryView`, :class:`~specviz.decoding.machine.MachineView`) read
    then and built with the rest. The derived figures are computed only when it is called.

    One object with slots, not a closure: the session keeps every round's event, so whatever a round's
    view holds lives in the garbage collector's oldest generation, and CPython walks all of it on every
    full collection (the next one comes once a quarter as much again has survived). A closure over these
    eight values was a function, eight cells and their tuple, and the memory and machine views two more
    of each: 21 objects a round where this is 3.
    """

    __slots__ = (
        "counters",
        "strategy",
        "strategy_stats",
        "extra",
        "kv",
        "policy",
        "policy_state",
        "cost_points",
        "memory",
        "machine",
    )

    def __init__(
        self,
        counters: dict[str, Any],
        strategy: str,
        strategy_stats: dict[str, Any],
        extra: dict[str, Any],
        kv: int,
        policy: type[DraftingPolicy],
        policy_state: dict[str, Any],
        cost_points: CostPoints | None,
        memory: Callable[[], dict[str, Any]],
        machine: Callable[[], dict[str, Any]],
    ) -> None:
        self.counters = counters
        self.strategy = strategy
        self.strategy_stats = strategy_stats
        self.extra = extra
        self.kv = kv
        self.policy = policy
        self.policy_state = policy_state
        self.cost_points = cost_points
        self.memory = memory
        self.machine = machine

    def __call__(self) -> dict[str, Any]:
        out = figures(Telemetry.from_state(self.counters))
        out["strategy"] = self.strategy
        out["strategy_stats"] = self.strategy_stats
        out.update(self.extra)
        out["kv"] = self.kv
        out["policy"] = self.policy.describe_state(self.policy_state, self.cost_points)
        out["memory"] = self.memory()
        out["machine"] = self.machine()
        return out
