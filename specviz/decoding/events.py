"""The event stream: one typed, JSON-serialisable event for everything a round does.

Every event is a frozen dataclass with a ``kind`` string and a ``to_dict()``; :func:`event_from_dict`
turns a dictionary back into the event (used by the replayer). A round publishes, in order:
``DraftProposed`` → ``MemoryCheckpoint`` (when a context saved a partial state before its tokens were
tested) → ``Verified`` → ``Accepted`` → ``Rejected`` (when a draft token was refused) → ``KVRollback``
(once per context whose tail was removed) → ``TelemetryEvent``. ``SessionStarted`` opens a
session, ``KnobsChanged`` marks a configuration applied at a round boundary and ``Finished`` closes it;
``Rewound`` says the session went back to an earlier round (the events after it no longer hold).

Token texts ("pieces") travel with the ids so that a front-end or a replay never needs the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar


@dataclass(frozen=True)
class Event:
    """Base class of all events. ``round`` is the 1-based round index (0 before the first round)."""

    kind: ClassVar[str] = "event"
    round: int

    def to_dict(self) -> dict[str, Any]:
        """A plain dictionary (JSON-serialisable) with the ``kind`` first."""
        d: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            d[f.name] = _plain(getattr(self, f.name))
        return d


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


@dataclass(frozen=True)
class Alternative:
    """One of the target's top choices at a position: token id, its text and its probability."""

    token: int
    piece: str
    prob: float

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary form."""
        return self.as_dict(self.token, self.piece, self.prob)

    @staticmethod
    def as_dict(token: int, piece: str, prob: float) -> dict[str, Any]:
        """:meth:`to_dict` of the alternative these make, without making it (a rejection's five, every
        rejected round)."""
        return {"token": token, "piece": piece, "prob": prob}


@dataclass(frozen=True)
class SessionStarted(Event):
    """A session began: the models, the prompt, the strategy and its knobs, and the capacities.

    A chat request also carries its ``messages`` (``{"role", "content"}`` each) and the ``chat_template``
    used (``"model"`` for the model's own); ``prompt_tokens`` are then what the template produced.
    ``stop`` lists the stop strings. ``prefill`` is how the prompt was evaluated (``all-but-last``, as
    speculative-simple, or ``whole``, as llama-server: see :class:`~specviz.Session`). ``load_average`` is the
    system's load average (1, 5, 15 minutes) when the session started (None where the system reports none,
    and in recordings made before it was recorded). ``grammar`` is the GBNF grammar every generated token
    obeys (a JSON schema's conversion; None: none, and in older recordings)."""

    kind: ClassVar[str] = "session_started"
    model: str = ""
    draft_model: str | None = None
    strategy: str = "none"
    knobs: dict = field(default_factory=dict)
    prompt_tokens: tuple = ()
    prompt_pieces: tuple = ()
    max_tokens: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    n_ctx: int = 0
    n_batch: int = 0
    n_ubatch: int = 0
    n_swa: int = 0
    n_vocab: int = 0
    stop: tuple = ()
    messages: tuple = ()
    chat_template: str | None = None
    prefill: str = "all-but-last"
    load_average: tuple[float, float, float] | None = None
    grammar: str | None = None


@dataclass(frozen=True)
class DraftProposed(Event):
    """The drafter proposed ``tokens`` (possibly none).

    ``probs`` holds the drafter's probability for each token where it has one (``None`` otherwise).
    ``requested`` is the configured draft length, ``limit`` the length allowed this round after the
    caps, and ``cap`` names the cap that lowered the limit below the request (``budget``, ``context``,
    ``batch``, ``ubatch``, ``ring``, ``tile``, ``policy``, ``prompt``) or ``None``. ``prompt``: the first round
    after a whole-prompt prefill (``Session(prefill="whole")``), whose token comes from the prompt's batch.
    ``ring``: the target's ring-sized
    sliding-window cache could lose keys a rejection needs if the verify spanned more than one micro-batch,
    so the draft was shortened to one (a checkpoint of the ring instead would copy every ring cell each
    round); ``reason`` says why the draft is shorter than the
    limit when the drafter itself stopped (``no-match``, ``p-min``, ``check-rate``, ``min-hits`` …), or
    ``tile`` when the drafter stopped early and the round cut its proposal to suit the verify tile.
    ``drafter`` names the strategy that proposed the draft (with a chain of drafters, the member that
    drafted, or the chain when none did; ``""`` in recordings made before it was recorded). ``block`` is
    set for a block draft — its positions drafted in parallel in one pass (``dflash``, ``dspark``), not
    a chain: ``kind``, ``size``
    (tokens decoded), ``positions`` (draft positions the block holds), ``trained`` (the trained block
    size), ``anchor_drafts``, ``position`` (the anchor's) and, for DSpark, ``confidence`` per position;
    ``None`` otherwise. ``alternatives`` holds, per drafted position, the drafter's own top candidates there
    (token ids, best first, :data:`~specviz.strategies.base.DRAFT_ALTERNATIVES` of them), for a drafter with a
    distribution (a draft model, an EAGLE-3 or MTP head, a DFlash or DSpark block's rows); empty for the n-gram
    strategies, DFlash-2's lattice walk and in recordings made before it was recorded. What a draft tree could
    have caught (:mod:`specviz.analysis.tree_advice`) is read from them. ``tree`` is set when the round verified a
    draft tree of more than one branch (:class:`~specviz.decoding.draft_tree.DraftTree`): its nodes as plain data
    (``tokens``, ``pieces``, ``parents`` (-1: the pending token), ``probs``, ``depths``, ``branches`` (leaf paths,
    branch 0 the drafter's main line)); ``tokens`` then holds the kept branch (:class:`Accepted`'s
    ``tree_path`` names the accepted nodes); ``None`` for a chain.
    """

    kind: ClassVar[str] = "draft_proposed"
    tokens: tuple = ()
    pieces: tuple = ()
    probs: tuple = ()
    seconds: float = 0.0
    requested: int = 0
    limit: int = 0
    cap: str | None = None
    reason: str | None = None
    position: int = 0
    policy: str = "fixed"
    expected_tokens: float | None = None
    drafter: str = ""
    block: dict | None = None
    alternatives: tuple = ()
    tree: dict | None = None


@dataclass(frozen=True)
class Verified(Event):
    """The target scored the batch ``[last token] + draft`` in one forward.

    ``tokens``/``probs`` are the target's choice and its probability at each of the ``len(draft)+1``
    positions. ``kv_before`` and ``kv_peak`` are the target context's cache length before the batch
    and right after it (before any rollback); ``draft_kv_before``/``draft_kv_peak`` the same for the
    draft model's context around drafting (``None`` without a draft model).
    ``round_seconds`` is the whole round's wall time, ``cpu_seconds`` the process's CPU time over it (every
    thread's, llama.cpp's included) and ``n_threads`` the threads the target's context was given: together
    they say how much of the machine the round had (:func:`~specviz.decoding.telemetry.cpu_share`). All three
    are None in recordings made before they were recorded. In a tree round ``tokens``/``probs`` describe the kept
    branch, and ``tree_choices`` holds, for each row read along the accepted path (the pending token's first),
    the target's choice as a dict: ``token``, ``piece``, ``prob``, ``alternatives`` (``[token, piece, prob]``
    each, best first); empty for a chain.
    """

    kind: ClassVar[str] = "verified"
    tokens: tuple = ()
    pieces: tuple = ()
    probs: tuple = ()
    seconds: float = 0.0
    batch_size: int = 0
    kv_before: int = 0
    kv_peak: int = 0
    draft_kv_before: int | None = None
    draft_kv_peak: int | None = None
    round_seconds: float | None = None
    cpu_seconds: float | None = None
    n_threads: int | None = None
    tree_choices: tuple = ()


@dataclass(frozen=True)
class Accepted(Event):
    """Tokens committed this round: the accepted draft prefix, then the target's own token.

    ``tokens`` = accepted draft tokens followed by ``bonus_token`` (omitted when generation stopped on
    an accepted token). ``n_accepted`` counts accepted draft tokens; ``position`` is the index in the
    full token history (prompt included) of the first committed token. ``bonus_kind`` is ``bonus``
    when the whole draft was accepted, ``correction`` when the target replaced a rejected draft token,
    ``plain`` when there was no draft, and ``None`` when no target token was committed. ``forced`` holds
    the indexes in ``tokens`` of the tokens the generation's grammar forced (the only token it allowed
    there); empty without a grammar. ``tree_path`` holds, in a tree round, the indexes of the accepted nodes
    (:attr:`DraftProposed.tree`), root first; empty for a chain.
    """

    kind: ClassVar[str] = "accepted"
    tokens: tuple = ()
    pieces: tuple = ()
    n_accepted: int = 0
    draft_probs: tuple = ()
    target_probs: tuple = ()
    bonus_token: int | None = None
    bonus_piece: str | None = None
    bonus_prob: float | None = None
    bonus_kind: str | None = None
    position: int = 0
    forced: tuple = ()
    tree_path: tuple = ()


@dataclass(frozen=True)
class Rejected(Event):
    """Draft tokens the target refused, starting at draft ``depth`` (0-based).

    ``target_token`` is the target's choice at that depth and ``alternatives`` its top choices there.
    ``draft_token_target_prob`` and ``draft_token_target_rank`` are the target's probability and rank
    (1 = its own choice) of the refused draft token, ``target_margin`` the target's top-two logit margin
    there; ``draft_probs[0]`` is the drafter's own probability of it (None when it has none).
    ``grammar_forbidden`` is True when the generation's grammar forbade the refused draft token (it could
    never have been accepted: every token drafted from there on was impossible under the grammar), False
    when it allowed it, None without a grammar.
    """

    kind: ClassVar[str] = "rejected"
    depth: int = 0
    tokens: tuple = ()
    pieces: tuple = ()
    draft_probs: tuple = ()
    target_token: int = 0
    target_piece: str = ""
    target_prob: float = 0.0
    draft_token_target_prob: float | None = None
    alternatives: tuple = ()
    position: int = 0
    draft_token_target_rank: int | None = None
    target_margin: float | None = None
    grammar_forbidden: bool | None = None


@dataclass(frozen=True)
class KVRollback(Event):
    """The tail ``[to_pos, from_pos)`` of ``context`` (``target`` or ``draft``) was removed.

    ``path`` says how (:mod:`specviz.backends.memory`): ``truncate`` (an attention tail removed),
    ``partial`` (within llama.cpp's recurrent-state snapshots), ``checkpoint`` (the partial state saved
    at ``mark_pos`` restored and ``reapplied`` tokens evaluated again) or ``reprefill`` (no saved state:
    the kept tokens all evaluated again). ``nbytes`` is the restored state's size and ``seconds`` what
    the rollback took.
    """

    kind: ClassVar[str] = "kv_rollback"
    context: str = "target"
    from_pos: int = 0
    to_pos: int = 0
    path: str = "truncate"
    seconds: float = 0.0
    nbytes: int = 0
    mark_pos: int | None = None
    reapplied: int = 0


@dataclass(frozen=True)
class MemoryCheckpoint(Event):
    """``context`` (``target`` or ``draft``) saved a partial state (llama.cpp's
    ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: recurrent state and sliding-window cells) at ``position``
    before tokens that might be rejected, because its memory cannot drop them otherwise (``reason``).
    ``nbytes`` and ``seconds`` are what saving it cost; ``reused`` when a state already saved at that
    position served (nothing was copied)."""

    kind: ClassVar[str] = "memory_checkpoint"
    context: str = "target"
    position: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    reused: bool = False
    reason: str = ""


@dataclass(frozen=True)
class KnobsChanged(Event):
    """A configuration change took effect at this round boundary."""

    kind: ClassVar[str] = "knobs_changed"
    strategy: str = ""
    knobs: dict = field(default_factory=dict)
    previous_strategy: str = ""
    previous_knobs: dict = field(default_factory=dict)
    schema: tuple = ()


class _Figures:
    """:attr:`TelemetryEvent.data`: the figures the event was made with, else those its ``view`` builds, built by
    the first read and kept. Two threads reading it at once may each build it: the same figures, one kept."""

    def __get__(self, ev: TelemetryEvent | None, owner: type | None = None) -> Any:
        if ev is None:
            return None  # the field's default: no figures given, the view builds them
        data = vars(ev)["_data"]  # the slot __set__ wrote when the event was made
        if data is None:
            data = ev.view() if ev.view is not None else {}
            object.__setattr__(ev, "_data", data)  # the one write after __init__: the figures, once built
        return data

    def __set__(self, ev: TelemetryEvent, value: dict | None) -> None:
        object.__setattr__(ev, "_data", value)  # by __init__ only: the event is frozen


@dataclass(frozen=True)
class TelemetryEvent(Event):
    """Cumulative telemetry after a round (see :mod:`specviz.decoding.telemetry` for the fields): ``data``.

    ``view`` is the one lazy part, and says so: a session makes its round's event with the figures of that
    round as a :class:`~specviz.decoding.telemetry.TelemetryView` (copies taken when the round ended) and no
    ``data``, which the first read of ``data`` builds from it and keeps. Building them costs more than the rest
    of a round's own work (60 us against about 300 on this project's host), and a notebook's ``run()`` reads
    few of them; the inspector reads each once, on its own thread. It reads the same either way; equality,
    copies and pickles go by ``data``.
    """

    kind: ClassVar[str] = "telemetry"
    data: dict = _Figures()  # type: ignore[assignment]
    view: Callable[[], dict] | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """A plain dictionary (JSON-serialisable): the round and the figures (``view`` is how they were built)."""
        return {"kind": self.kind, "round": self.round, "data": _plain(self.data)}

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.round, self.data))


@dataclass(frozen=True)
class Finished(Event):
    """Generation ended: ``reason`` is ``eos``, ``stop`` (a stop string; ``message`` names it),
    ``max_tokens``, ``context``, ``cancelled`` or ``error``. ``load_average`` is the system's load average
    (1, 5, 15 minutes) when it ended (None where the system reports none, and in older recordings)."""

    kind: ClassVar[str] = "finished"
    reason: str = ""
    n_generated: int = 0
    message: str | None = None
    load_average: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class Rewound(Event):
    """The session went back to the state right after round ``round``, with ``position`` tokens of history
    (see :mod:`specviz.decoding.rewind`).

    Events of the rounds after ``round`` no longer describe the session; a consumer drops them (a
    recording keeps them, followed by this event). ``n_events`` is how many events of the session's
    own list stand before this one, so replaying a recording and truncating to ``n_events`` at each
    ``rewound`` gives the session's list (:func:`specviz.decoding.rewind.effective_events`). A rewind to a
    position inside a round keeps that round's first tokens: ``kept_tokens`` / ``kept_pieces``.
    ``from_round`` / ``from_position`` say where the session was; ``strategy``, ``knobs``,
    ``finished`` and ``telemetry`` (the figures after round ``round``) are what holds now;
    ``kv_rollbacks`` lists each context's cut as ``{"context", "from_pos", "to_pos"}``.
    """

    kind: ClassVar[str] = "rewound"
    position: int = 0
    from_round: int = 0
    from_position: int = 0
    n_events: int = 0
    kept_tokens: tuple = ()
    kept_pieces: tuple = ()
    strategy: str = ""
    knobs: dict = field(default_factory=dict)
    finished: str | None = None
    telemetry: dict = field(default_factory=dict)
    kv_rollbacks: tuple = ()


@dataclass(frozen=True)
class BatchStepped(Event):
    """One step of a batched run (:class:`~specviz.decoding.batch.BatchRun`): one decode verified every busy
    sequence's batch. ``round`` is the step (1-based); ``n_parallel`` the slots; ``decode_seconds`` the shared
    decode's time (0 when no sequence needed one); ``queued`` the requests still waiting for a slot after it.
    ``lanes`` holds one ``{"slot", "request", "round", "position", "rows", "drafted", "accepted", "committed",
    "finished"}`` per request that ran a round this step, in slot order: its round's number, its history length
    before it, the rows it put in the decode (its pending token and draft), its drafted and accepted tokens, the
    tokens it committed and why it finished (None while it runs). The requests' own events are their sessions'."""

    kind: ClassVar[str] = "batch_step"
    n_parallel: int = 1
    decode_seconds: float = 0.0
    queued: int = 0
    lanes: tuple = ()

    @property
    def busy(self) -> int:
        """Sequences in the step's decode."""
        return sum(1 for lane in self.lanes if lane.get("rows", 0) > 0)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        SessionStarted,
        DraftProposed,
        Verified,
        Accepted,
        Rejected,
        KVRollback,
        MemoryCheckpoint,
        KnobsChanged,
        TelemetryEvent,
        Finished,
        Rewound,
        BatchStepped,
    )
}


def event_from_dict(d: dict[str, Any]) -> Event:
    """Rebuild an event from its ``to_dict()`` form (lists become tuples)."""
    kind = d.get("kind")
    cls = EVENT_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}; known kinds: {', '.join(EVENT_TYPES)}")
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in d.items():
        if k in names:
            kwargs[k] = _tuples(v) if isinstance(v, list) else v
    return cls(**kwargs)


def _tuples(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_tuples(x) for x in v)
    return v


@dataclass(frozen=True)
class Round:
    """Everything one ``Session.step()`` did: its index, its events in order, and the new tokens."""

    index: int
    events: tuple
    new_tokens: tuple = ()
    finished: str | None = None

    def of_kind(self, kind: str) -> list[Event]:
        """The events of this round with the given ``kind``."""
        return [e for e in self.events if e.kind == kind]

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary form: the events as dictionaries."""
        return {
            "index": self.index,
            "events": [e.to_dict() for e in self.events],
            "new_tokens": list(self.new_tokens),
            "finished": self.finished,
        }
