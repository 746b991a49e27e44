"""One generation's state, its rewind checkpoints, and what rewind and snapshots ask of a session.

:class:`Generation` holds everything one generation has that is not a cache: the history, the request's
settings, the strategy and knobs in force (and a change queued for the next round), the round counter,
the finish reason, telemetry, the drafting policy, the events and the rewind checkpoints. ``start()``
makes a fresh one; :mod:`specviz.decoding.rewind` takes it back to a :class:`Checkpoint`;
:mod:`specviz.decoding.snapshot` writes it out and builds a new one from a snapshot, which the session
swaps in whole once everything was checked. So new per-generation state belongs here, where rewind and
snapshots meet it (``tests/test_generation_state.py`` fails for a field either of them leaves behind).

Rewind and snapshots work on a session through :class:`SessionParts`: the session hands itself, and the
type checker checks at each call that it still has every part they use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

import numpy as np

from ..errors import SnapshotError
from ..strategies.chain import drafter_telemetry
from ..strategies.context_drafter import context_hooks
from .constrained import GrammarState
from .events import Event
from .machine import MachineView, memory_view
from .policy import DraftingPolicy, VerifyCostModel, make_policy
from .round import RoundResult
from .sampling import SamplingParams
from .telemetry import Telemetry, TelemetryView, state_from_json

if TYPE_CHECKING:
    from ..backends.llama import LlamaContext, LlamaModel
    from ..models.draft_cache import DraftModelCache
    from ..strategies.base import Drafter


@dataclass(frozen=True)
class Checkpoint:
    """The state right after round ``round`` that the history does not determine (see
    :mod:`specviz.decoding.rewind`). ``n_history`` is the history length then and ``n_events`` the
    session's event count."""

    round: int
    n_history: int
    n_events: int
    strategy: str
    knobs: dict
    finished: str | None
    telemetry: dict
    policy: dict
    rng: dict
    drafter_state: dict | None
    drafter_stats: dict

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (for snapshots)."""
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Any) -> Checkpoint:
        """Rebuild from :meth:`to_dict`; a malformed entry raises :class:`~specviz.errors.SnapshotError`."""
        try:
            ck = cls(
                round=int(d["round"]),
                n_history=int(d["n_history"]),
                n_events=int(d["n_events"]),
                strategy=str(d["strategy"]),
                knobs=dict(d["knobs"]),
                finished=d.get("finished"),
                telemetry=state_from_json(dict(d["telemetry"])),
                policy=dict(d["policy"]),
                rng=dict(d["rng"]),
                drafter_state=None if d.get("drafter_state") is None else dict(d["drafter_state"]),
                drafter_stats=dict(d.get("drafter_stats") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"a rewind checkpoint in the snapshot is malformed ({exc})") from None
        if ck.round < 0 or ck.n_history < 1 or ck.n_events < 0:
            raise SnapshotError("a rewind checkpoint in the snapshot is out of range")
        return ck


T = TypeVar("T")


class GenerationField(Generic[T]):
    """A read-only attribute of a session that is its current generation's field of the same name
    (``Session.history`` is ``Session.generation.history``): what users read of the generation, declared in
    one line each. ``doc`` is the attribute's docstring."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> GenerationField[T]: ...

    @overload
    def __get__(self, obj: object, objtype: type | None = None) -> T: ...

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.generation, self.name)  # type: ignore[attr-defined]

    def __set__(self, obj: object, value: Any) -> None:
        raise AttributeError(f"{self.name} is read-only: it is the generation's (generation.{self.name})")


def _fixed_policy() -> DraftingPolicy:
    return make_policy("fixed")


@dataclass
class Generation:
    """The state of one generation (see the module docstring); the session's is ``Session.generation``."""

    #: The prompt's tokens, then every committed one (the newest is pending: not in the cache yet).
    history: list[int] = field(default_factory=list)
    n_prompt: int = 0
    max_tokens: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    strategy: str = "none"
    knobs: dict[str, Any] = field(default_factory=dict)
    #: A configuration queued by ``configure()`` for the next round boundary: (strategy, knobs).
    pending: tuple[str, dict[str, Any]] | None = None
    round_index: int = 0
    #: The cache holds the whole prompt and the last batch kept its last row: the next round is the first
    #: of a whole-prompt prefill (it reads that row, see :mod:`specviz.decoding.round`).
    prefilled: bool = False
    finished: str | None = None
    started: bool = False
    telemetry: Telemetry = field(default_factory=Telemetry)
    policy: DraftingPolicy = field(default_factory=_fixed_policy)
    last_result: RoundResult | None = None
    #: One checkpoint per round (and one for the start), for rewinds.
    checkpoints: list[Checkpoint] = field(default_factory=list)
    #: Stop strings of the generation (see :mod:`specviz.decoding.stops`).
    stop: tuple[str, ...] = ()
    #: The grammar every generated token obeys, in the state the generated tokens leave (None: none); a
    #: rewind and a snapshot rebuild it from the history (:mod:`specviz.decoding.constrained`).
    grammar: GrammarState | None = None
    events: list[Event] = field(default_factory=list)

    @property
    def committed(self) -> int:
        """Positions committed to the target's cache: every token but the pending newest one."""
        return max(len(self.history) - 1, 0)

    def capture(
        self,
        drafter: Drafter,
        rng: np.random.Generator,
        telemetry: dict[str, Any] | None = None,
        policy_state: dict[str, Any] | None = None,
        *,
        rng_moved: bool = True,
    ) -> None:
        """Record the checkpoint of the current round (replacing one of the same round, which a finish
        without a round leaves behind). The session calls it after ``start`` and after every step;
        ``telemetry`` is a copy of the counters taken this round (:meth:`Telemetry.state`), shared with the
        round's telemetry event, else one is taken (nobody changes either: a rewind copies it);
        ``policy_state`` likewise, the policy's :meth:`~specviz.decoding.policy.DraftingPolicy.state` taken
        this round and shared with that event's description of it.

        ``rng_moved=False`` says that nothing drew from ``rng`` since the last checkpoint (a greedy round
        of a drafter without a model of its own): that checkpoint's generator state is shared instead of
        read again (numpy builds the state's dictionary afresh on every read, and right after a decode
        that cost a tenth of a greedy round's bookkeeping)."""
        ck = Checkpoint(
            round=self.round_index,
            n_history=len(self.history),
            n_events=len(self.events),
            strategy=self.strategy,
            knobs=dict(self.knobs),
            finished=self.finished if self.finished != "cancelled" else None,
            telemetry=telemetry if telemetry is not None else self.telemetry.state(),
            policy=policy_state if policy_state is not None else self.policy.state(),
            rng=self.checkpoints[-1].rng if not rng_moved and self.checkpoints else dict(rng.bit_generator.state),
            drafter_state=drafter.state() if drafter.state_format else None,
            drafter_stats=drafter.stats.to_dict(),
        )
        cks = self.checkpoints
        while cks and cks[-1].round >= ck.round:
            cks.pop()
        cks.append(ck)

    def telemetry_view(
        self,
        drafter: Drafter | None,
        ctx: LlamaContext,
        machine: MachineView,
        counters: dict[str, Any] | None = None,
        policy_state: dict[str, Any] | None = None,
    ) -> TelemetryView:
        """The telemetry of this generation as of now (``Session.telemetry_dict()``), built when called: the
        counters are copied now (or ``counters``, a copy :meth:`Telemetry.state` took), the policy's state too
        (or ``policy_state``), with the drafter's counters and figures, the cache length, the memory of the
        target's ``ctx`` and the drafter's context, and ``machine`` (the machine sampler's view)."""
        hooks = context_hooks(drafter)
        return TelemetryView(
            counters if counters is not None else self.telemetry.state(),
            self.strategy,
            drafter.stats.to_dict() if drafter is not None else {},
            drafter_telemetry(drafter),
            self.committed,
            type(self.policy),
            policy_state if policy_state is not None else self.policy.state(),
            self.policy.cost_points(),
            memory_view(ctx, hooks.memory_context() if hooks is not None else None),
            machine,
        )


class SessionParts(Protocol):
    """What :mod:`specviz.decoding.rewind` and :mod:`specviz.decoding.snapshot` use of a session:
    :class:`~specviz.decoding.session.Session` hands itself (and the type checker checks it still fits)."""

    generation: Generation
    drafter: Drafter | None
    cost_model: VerifyCostModel | None
    #: The draft models the session loaded (by path), shared with its forks.
    draft_models: DraftModelCache

    @property
    def model(self) -> LlamaModel:
        """The target model."""
        ...

    #: The target's context (replaced where a strategy needs a new one, see :mod:`specviz.decoding.target_context`).
    ctx: LlamaContext

    @property
    def rng(self) -> np.random.Generator:
        """The session's one random generator (drafters hold it too: its state is set, never replaced)."""
        ...

    @property
    def context_args(self) -> dict[str, Any]:
        """The context sizes the session was created with."""
        ...

    def validate_config(
        self, strategy: str, knobs: dict[str, Any], base: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A complete, checked configuration (or a typed error)."""
        ...

    def build_drafter(self, strategy: str, cfg: dict[str, Any], sampling: SamplingParams) -> Drafter:
        """A drafter for a checked configuration, with the session's models and contexts."""
        ...

    def telemetry_dict(self) -> dict[str, Any]:
        """Telemetry as the events carry it."""
        ...
