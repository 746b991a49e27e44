"""The drafter interface every strategy implements.

In the spirit of llama.cpp's ``common_speculative`` implementations (``begin`` / ``draft`` / ``accept``)
and Hugging Face's ``CandidateGenerator`` (a proposer plus a feedback call), :class:`Drafter` has six
public methods:

* :meth:`Drafter.begin` receives the whole token history when a session starts, when the strategy is
  switched in, and on a restore. Request-local state is rebuilt from that history.
* :meth:`Drafter.draft` proposes up to ``n_max`` tokens to follow ``history`` (the full history, prompt
  included, whose last token is the newest committed one — upstream's ``id_last``).
* :meth:`Drafter.accept` reports how many tokens of the last proposal the target accepted; ``history``
  already holds the tokens committed in that round. It is called only after a verified draft.
* :meth:`Drafter.state` / :meth:`Drafter.load_state` save and restore what ``begin`` cannot rebuild from
  the history alone (JSON-serialisable; empty for stateless drafters).
* :meth:`Drafter.close` releases what the drafter holds (a model-backed drafter's context).

The base class owns the token mirror (:attr:`Drafter.mirror`, a numpy copy of the history that only
appends what is new) and the llama.cpp-style counters (:attr:`Drafter.stats`). Subclasses override the
underscore hooks.

Optional abilities are declared by the class, never probed:

* ``drafts`` — False only for ``none`` (no round ever drafts);
* ``can_peek`` — the class is a :class:`PeekingDrafter`: :meth:`PeekingDrafter.peek` tells, without side
  effects, the first token :meth:`~Drafter.draft` would propose (the ``cost`` policy learns from it in
  rounds it keeps plain); callers reach it through :func:`peeker`;
* ``needs_model`` — the drafter is built with a :class:`DraftResources` holding the draft GGUF named by
  its ``draft_model`` knob, already loaded and checked (``draft_model_optional``: an empty one drafts with
  the target itself);
* ``has_context`` — the class is a :class:`~specviz.strategies.context_drafter.ContextDrafter`: it owns a
  llama.cpp context, and its hooks (``kv_length``, ``sync``, ``context_state`` / ``load_context_state``,
  ``memory_context``, ``memory_log``, ``take_upkeep``, ``extra_telemetry``, ``expect_plain`` and the
  class-level ``check_models``) are reached through
  :func:`~specviz.strategies.context_drafter.context_hooks`;
* ``reads_target`` — the drafter reads the target's activations of each verify batch;
* ``pause_when_plain`` — the drafter stops feeding its model in rounds a policy keeps plain;
* ``state_format`` — the tag of :meth:`~Drafter.state`;
* ``knob_rules`` — the rules between the strategy's knobs, run by :func:`check_knob_rules`.

A drafter never imports a UI library and never sees the session.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np

from ..decoding.knob_schema import Knob
from ..errors import SnapshotError
from .history import TokenMirror

if TYPE_CHECKING:
    from ..backends.llama import LlamaContext, LlamaModel
    from ..decoding.draft_tree import DraftTree
    from ..decoding.sampling import SamplingParams
    from ..decoding.tempered import Dist


#: How many of its top candidates a drafter with a distribution records at each drafted position
#: (:attr:`Draft.alternatives`): SGLang's default EAGLE tree takes the top 4 at each node
#: (``speculative_eagle_topk``), the widest node a tree verifier uses by default, so 4 ranks tell what any
#: such tree could have caught; each is one top-k on a logits row the drafter already holds.
DRAFT_ALTERNATIVES = 4


@dataclass
class Draft:
    """A proposal: ``tokens``, the drafter's probability of each (or ``None``), and why it is short.

    ``reason`` is a short code (``no-match``, ``check-rate``, ``p-min`` …) when the drafter proposed fewer
    tokens than it was allowed, else ``None``. ``dists`` holds the full draft distribution of each token
    when the tokens were sampled from it (a model drafting under sampling), for the acceptor's
    ``min(1, p/q)`` rule; ``None`` for deterministic drafts. ``block`` describes a block draft (positions
    drafted in parallel in one pass: ``dflash``, ``dspark``) as plain data — its ``kind``, ``size`` (tokens
    decoded), ``positions`` (draft positions it holds), ``trained`` block size and, for DSpark, each
    position's ``confidence``; ``None`` for a chain drafted token by token. ``drafter`` names the strategy
    that proposed it when that is not the drafter itself (a member of a chained drafter). ``alternatives``
    holds, per drafted position, the drafter's own top :data:`DRAFT_ALTERNATIVES` token ids there, best
    first (its logits' order, ties to the lower id), for a drafter with a logits row per position (``draft``,
    ``eagle3``, ``mtp``, ``dflash``, ``dspark``), and for the n-gram strategies drafting trees (``tree_width`` > 1:
    the continuations they hold there, their best first); ``None`` otherwise (n-gram chains, DFlash-2's lattice).
    ``tree`` is set when the drafter branched (:class:`~specviz.decoding.draft_tree.DraftTree` of more than one
    branch, verified in one batch); ``tokens`` and ``probs`` then hold its branch 0, the drafter's main line.
    """

    tokens: list[int] = field(default_factory=list)
    probs: list[float | None] | None = None
    reason: str | None = None
    dists: list[Dist] | None = None
    block: dict[str, Any] | None = None
    drafter: str | None = None
    alternatives: list[list[int]] | None = None
    tree: DraftTree | None = None


@dataclass
class DrafterStats:
    """Per-strategy counters, as llama.cpp's ``common_speculative_print_stats`` prints them."""

    calls: int = 0  #: draft() calls
    drafts_generated: int = 0  #: calls that produced a non-empty draft
    drafts_accepted: int = 0  #: verified drafts with at least one token accepted
    tokens_generated: int = 0  #: draft tokens proposed
    tokens_accepted: int = 0  #: draft tokens accepted
    begin_seconds: float = 0.0
    draft_seconds: float = 0.0
    accept_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary form."""
        return dict(self.__dict__)


@dataclass
class Upkeep:
    """What keeping a drafter's own model in step with the committed tokens cost since the last
    :meth:`~specviz.strategies.context_drafter.ContextDrafter.take_upkeep`, apart from drafting.

    ``seconds`` is the time spent feeding the committed positions after the rounds (``sync``), ``tokens``
    the positions so fed; ``in_draft`` the part of ``draft()`` spent bringing the model up to date before
    its first drafting step (a resume after a pause, a catch-up), which the round's draft time includes;
    ``paused`` whether the drafter is not feeding its model now (see
    :class:`~specviz.strategies.hidden_state.HiddenStateDrafter`).
    """

    seconds: float = 0.0
    tokens: int = 0
    in_draft: float = 0.0
    paused: bool = False


@dataclass
class DraftResources:
    """What a model-backed drafter is given, explicitly (it never sees the session).

    ``model`` is the draft GGUF, loaded and checked against the target's vocabulary; ``target`` and
    ``target_ctx`` are the target model and its context (for drafters that read the target's hidden
    state); the context sizes are those the drafter's own context should use; ``sampling`` and ``rng``
    are the generation's sampling parameters and its seeded generator (a sampled draft draws from it, so
    a seed reproduces the whole run). ``flash_attn`` is the target's: a draft model's own context uses it,
    with f16 caches, as llama-server's draft context does (its ``-ctkd`` / ``-ctvd`` default to f16).
    """

    model: LlamaModel
    target: LlamaModel
    target_ctx: LlamaContext
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_threads: int | None
    sampling: SamplingParams
    rng: np.random.Generator
    flash_attn: str = "auto"


class Drafter:
    """Base class of every strategy. Subclasses override :meth:`_begin`, :meth:`_draft`, :meth:`_accept`
    (and, with state, :meth:`_export_state` / :meth:`_import_state`).

    ``name`` and ``knobs`` (a tuple of :class:`~specviz.decoding.knob_schema.Knob`) are declared per class; the shared
    draft-length knobs are added by the registry. ``config`` holds this instance's validated knob values.
    """

    name: ClassVar[str] = ""
    knobs: ClassVar[tuple[Knob, ...]] = ()
    drafts: ClassVar[bool] = True
    can_peek: ClassVar[bool] = False
    needs_model: ClassVar[bool] = False
    has_context: ClassVar[bool] = False
    #: Format tag of :meth:`state`; a state of another format is refused by :meth:`load_state`.
    state_format: ClassVar[str] = ""
    #: (``needs_model``) An empty ``draft_model`` is allowed: the drafter then drafts with the target model
    #: itself (``mtp``: the target's own NextN layers), which :class:`DraftResources` carries as ``model``.
    draft_model_optional: ClassVar[bool] = False
    #: The drafter reads the target's own activations of each verify batch (layer inputs, hidden states),
    #: so it needs the target to evaluate every committed token in a round: a whole-prompt prefill, whose
    #: first round evaluates nothing, is refused for it (see :class:`~specviz.Session`).
    reads_target: ClassVar[bool] = False
    #: The drafter stops paying to stay ready (feeding a model of its own, reading the target's layers) in
    #: rounds a policy keeps plain, and would like to hear how long they will last: the session then asks
    #: the policy for a promise each plain round and passes it on
    #: (:meth:`~specviz.strategies.context_drafter.ContextDrafter.expect_plain`).
    pause_when_plain: bool = False
    #: Rules between this strategy's knobs that no single knob's range can state, each run on a complete,
    #: type-checked config and raising :class:`~specviz.errors.KnobError` to refuse it (see
    #: :func:`check_knob_rules`).
    knob_rules: ClassVar[tuple[Callable[[dict[str, Any]], None], ...]] = ()

    def __init__(self, **knobs: Any) -> None:
        self.config: dict[str, Any] = {k.name: knobs.get(k.name, k.default) for k in self.knobs}
        self.stats = DrafterStats()
        self.mirror = TokenMirror()

    @property
    def tokens(self) -> np.ndarray:
        """The mirrored history (int32), as of the last begin / draft / accept."""
        return self.mirror.array

    # -- the interface ---------------------------------------------------------------------------
    def begin(self, history: Sequence[int]) -> None:
        """(Re)build request-local state from the full token history."""
        t = time.perf_counter()
        self.mirror.reset(history)
        self._begin(history)
        self.stats.begin_seconds += time.perf_counter() - t

    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        """Propose up to ``n_max`` tokens following ``history``."""
        t = time.perf_counter()
        self.mirror.sync(history)
        d = self._draft(history, n_max) if n_max > 0 else Draft(reason="limit")
        if len(d.tokens) > n_max:
            d.tokens = d.tokens[:n_max]
            if d.probs is not None:
                d.probs = d.probs[:n_max]
            if d.dists is not None:
                d.dists = d.dists[:n_max]
            if d.alternatives is not None:
                d.alternatives = d.alternatives[:n_max]
        self.stats.draft_seconds += time.perf_counter() - t
        self.stats.calls += 1
        if d.tokens:
            self.stats.drafts_generated += 1
            self.stats.tokens_generated += len(d.tokens)
        return d

    def accept(self, n_accepted: int, history: Sequence[int]) -> None:
        """Report that ``n_accepted`` tokens of the last draft were accepted (``history`` is committed)."""
        t = time.perf_counter()
        self.mirror.sync(history)
        self._accept(n_accepted, history)
        self.stats.accept_seconds += time.perf_counter() - t
        if n_accepted > 0:
            self.stats.drafts_accepted += 1
            self.stats.tokens_accepted += n_accepted

    def state(self) -> dict[str, Any]:
        """What :meth:`begin` cannot rebuild from the history, as JSON-serialisable data.

        ``n_history`` records how much history the state belongs to; it applies to that history or any
        extension of it (a drafter's state changes only in begin / draft / accept).
        """
        d = self._export_state()
        d["format"] = self.state_format
        d["n_history"] = int(self.mirror.array.shape[0])
        return d

    def load_state(self, d: Any) -> None:
        """Restore :meth:`state` after :meth:`begin` on the history it belongs to (or an extension).

        Raises :class:`~specviz.errors.SnapshotError` for a state of another strategy, another history
        or a malformed one; the drafter is then unchanged.
        """
        if not isinstance(d, dict) or d.get("format") != self.state_format or "n_history" not in d:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise SnapshotError(
                f"drafter state is not a {self.state_format!r} state (got {got!r}); restore it "
                "into the strategy that saved it"
            )
        n = d["n_history"]
        if not isinstance(n, int) or not 0 <= n <= self.mirror.array.shape[0]:
            raise SnapshotError(
                f"drafter state belongs to a history of {n!r} tokens, but the drafter holds "
                f"{self.mirror.array.shape[0]}; call begin() with that history first"
            )
        saved = self._export_state()
        try:
            self._import_state(copy.deepcopy(d))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            self._import_state(saved)
            raise SnapshotError(
                f"drafter state for {self.name!r} is malformed ({exc}); restore a snapshot written by this version"
            ) from exc

    def close(self) -> None:
        """Release resources (model-backed drafters free their context)."""

    # -- to override -------------------------------------------------------------------------------
    def _begin(self, history: Sequence[int]) -> None:
        pass

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        return Draft(reason="none")

    def _accept(self, n_accepted: int, history: Sequence[int]) -> None:
        pass

    def _export_state(self) -> dict[str, Any]:
        return {}

    def _import_state(self, d: dict[str, Any]) -> None:
        pass


class PeekingDrafter(Drafter):
    """A drafter that can tell, without side effects, the first token :meth:`draft` would propose (the
    n-gram drafters): the ``cost`` policy learns from it in rounds it keeps plain. Declares ``can_peek``."""

    can_peek: ClassVar[bool] = True

    def peek(self, history: Sequence[int]) -> int | None:
        """The first token :meth:`draft` would propose after ``history``, leaving every state and counter
        unchanged; ``None`` when there is none."""
        raise NotImplementedError(f"{type(self).__name__} declares can_peek but does not implement peek()")


def peeker(drafter: Drafter | None) -> PeekingDrafter | None:
    """``drafter`` when it declares ``can_peek``, else None. A drafter that declares ``can_peek`` without
    deriving from :class:`PeekingDrafter` is refused with a :class:`TypeError`."""
    if drafter is None or not drafter.can_peek:
        return None
    if not isinstance(drafter, PeekingDrafter):
        raise TypeError(
            f"drafter {type(drafter).__name__} declares can_peek but is not a PeekingDrafter; derive it "
            "from specviz.strategies.base.PeekingDrafter"
        )
    return drafter


def check_knob_rules(cls: type[Drafter], config: dict[str, Any]) -> None:
    """Run the cross-knob rules strategy class ``cls`` declares (:attr:`Drafter.knob_rules`) on a complete,
    type-checked ``config``; the first that refuses it raises :class:`~specviz.errors.KnobError`."""
    for rule in cls.knob_rules:
        rule(config)
