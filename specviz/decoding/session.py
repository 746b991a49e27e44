"""The stepping decoder's facade: :class:`Session` owns the history, the contexts and the drafter, and runs
one speculative round per :meth:`Session.step`, published as events.

The parts, each in its own module: the draft-length budget (:mod:`specviz.decoding.budget`), the round
(:mod:`specviz.decoding.round`: draft, one verify batch, accept, roll back), the acceptor
(:mod:`specviz.decoding.acceptor`), the events of a round (:mod:`specviz.decoding.round_events`), telemetry
counters (:mod:`specviz.decoding.telemetry`), the generation's state (:mod:`specviz.decoding.generation`),
rewinds (:mod:`specviz.decoding.rewind`), snapshots (:mod:`specviz.decoding.snapshot`) and the strategies
(:mod:`specviz.strategies`). Nothing here imports a UI library; front-ends subscribe to the events.

The session holds what lives as long as it does (the models, the contexts, the drafter, the generator, the
measured verify cost); everything of one generation is in :attr:`Session.generation`, whose fields the
session shows as read-only attributes (``history``, ``knobs``, ``events`` …). Rewinds and snapshots work
on the session through its public parts (:class:`~specviz.decoding.generation.SessionParts`).

Every public call validates first and changes nothing when it refuses: a refused call raises a typed
:class:`~specviz.errors.SpecvizError` and the session stays usable.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import numpy as np

from ..backends.context_settings import ContextSettings
from ..backends.llama import LlamaContext, LlamaModel
from ..backends.memory import rollback_refusal
from ..errors import (
    ContextSettingsError,
    KnobError,
    ModelError,
    RollbackUnavailableError,
    SessionStateError,
    StrategyError,
)
from ..models.draft_cache import DraftModelCache
from ..models.embedded import resolve_model
from ..strategies import make_drafter, resolve_strategy, strategy_class, strategy_names, strategy_schema
from ..strategies.base import Drafter, DraftResources, check_knob_rules
from ..strategies.chain import drafter_telemetry
from ..strategies.context_drafter import context_class, context_hooks
from .budget import Budget, Caps, plan
from .events import DraftProposed, Event, Finished, KnobsChanged, Rewound, Round, SessionStarted, TelemetryEvent
from .generation import Checkpoint, Generation
from .knob_schema import DRAFT_MAX_LIMIT, check_cross_knobs
from .machine import MachineSampler, memory_view
from .policy import DraftingPolicy, VerifyCostModel, make_policy, measure_verify_cost
from .request import Request, prepare_request
from .rewind import rewind as rewind_generation
from .round import RoundResult, run_round
from .round_events import round_events
from .sampling import SamplingParams
from .snapshot import read_header, restore_snapshot, take_snapshot, unpack
from .stops import StopScanner, cut_text
from .target_context import put_back, refill, replace_for
from .telemetry import Telemetry, TelemetryView
from .tiling import verify_tile

#: How :meth:`Session.start` evaluates a prompt (see :class:`Session`): as speculative-simple, as llama-server.
PREFILL_LAYOUTS = ("all-but-last", "whole")
#: Times each batch size is timed when :meth:`Session.verify_cost` measures for the advisor (the fastest
#: kept). The advice's speedups rest on the curve's shape: with 2 (the cost policy's, which must be quick
#: at a generation's start) the ratio of a 16-token verify to a 1-token one spread 17% over five
#: measurements of the embedded model here, with 5 it spread 5%.
ADVISOR_REPEATS = 5


def gpu_layers(n_gpu_layers: Any, model: object) -> int:
    """``n_gpu_layers`` checked (an integer >= 0; None: 0, or a loaded model's own), before any model loads;
    :class:`~specviz.errors.ContextSettingsError` naming it otherwise, or where it differs from the
    placement of the already loaded ``model``."""
    loaded = model.n_gpu_layers if isinstance(model, LlamaModel) else None
    if n_gpu_layers is None:
        return loaded if loaded is not None else 0
    if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int) or n_gpu_layers < 0:
        raise ContextSettingsError(
            f"n_gpu_layers (-ngl): {n_gpu_layers!r} is not allowed; expected an integer >= 0 (the layers to put "
            "on the GPU; more than the model has puts all of them and the output layer there)",
            knob="n_gpu_layers",
            value=n_gpu_layers,
        )
    if loaded is not None and loaded != n_gpu_layers:
        raise ContextSettingsError(
            f"n_gpu_layers (-ngl) {n_gpu_layers} differs from the {loaded} the model was loaded with; load it "
            f"with LlamaModel(path, n_gpu_layers={n_gpu_layers}) or pass the path and let the session load it",
            knob="n_gpu_layers",
            value=n_gpu_layers,
        )
    return n_gpu_layers


class Session:
    """Runs a target model (and optionally a draft model) one speculative round at a time.

    ``model`` is a GGUF path, an already loaded :class:`~specviz.backends.LlamaModel`, or ``None`` for
    the embedded Gemma 3 270M. The context is created once and reused by every :meth:`start`.

    ``swa_full`` (default True) gives sliding-window layers a full-size cache; False uses llama.cpp's
    ring-sized one, which holds only the last window of keys (drafts and rewinds are then limited to what
    the ring still holds, see :mod:`specviz.backends.memory`). ``n_rs_seq`` is how many recurrent-state
    snapshots llama.cpp keeps for partial rollback on the architectures that have them (None: the
    default of :mod:`specviz.backends.memory`).

    ``prefill`` is how a prompt is evaluated. ``"all-but-last"`` (the default), as llama.cpp's
    ``speculative-simple``: every prompt token but the last in the prefill, the last one the first row of
    the first round's batch (which may carry a draft). ``"whole"``, as ``llama-server``: the whole prompt in
    the prefill, the first token chosen from its last row without a draft, drafting from the second round.
    llama.cpp's CPU kernels are not batch-invariant, so the two layouts can part at a near-tie (measured on
    the embedded Gemma 3: 3 of 4 ``summarise`` prompts within 128 greedy tokens); a reproduction of a server
    uses ``"whole"`` (:func:`~specviz.analysis.server_args.session_from_server_args` sets it). With
    ``"whole"``, strategies that read the target's activations (``reads_target``: EAGLE-3, MTP, DFlash)
    are refused at :meth:`start`: their first round would find no verify batch to read.

    The context is made with the
    deployment's settings as llama.cpp spells them: ``n_ctx`` (``-c``), ``n_batch`` / ``n_ubatch``
    (``-b`` / ``-ub``), ``n_threads`` (``-t``), ``flash_attn`` (``-fa``: ``auto``, ``on`` or ``off``) and
    ``cache_type_k`` / ``cache_type_v`` (``-ctk`` / ``-ctv``: ``f16``, ``q8_0`` ...). Every one is checked
    before the model loads (:class:`~specviz.errors.ContextSettingsError`; a quantized V cache needs flash
    attention, a quantized type's blocks must divide the model's head sizes); :attr:`settings` holds them.

    ``n_gpu_layers`` (``-ngl``) is how many of the model's layers a GPU build of llama.cpp puts on its GPU
    devices when the session loads ``model`` from a path (default 0: none; more than the model has offloads
    the output layer too); draft models the session loads follow the target. With a loaded
    :class:`~specviz.backends.LlamaModel` the model's own placement holds, and another value is refused.
    """

    def __init__(
        self,
        model: str | os.PathLike | LlamaModel | None = None,
        *,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        swa_full: bool = True,
        n_rs_seq: int | None = None,
        flash_attn: str = "auto",
        cache_type_k: str = "f16",
        cache_type_v: str = "f16",
        prefill: str = "all-but-last",
        n_gpu_layers: int | None = None,
    ) -> None:
        if prefill not in PREFILL_LAYOUTS:
            raise ContextSettingsError(
                f"prefill {prefill!r} is not allowed; choose {' or '.join(map(repr, PREFILL_LAYOUTS))} "
                "(the prompt but its last token, as speculative-simple; or the whole prompt, as llama-server)",
                knob="prefill",
            )
        # Only what lives as long as the session is held here: everything of one generation is in
        # self.generation (a Generation), which start() replaces, rewind() takes back and snapshots carry.
        # every context setting is checked before the model loads (the model's head sizes after)
        settings = ContextSettings.make(
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=n_ubatch,
            n_threads=n_threads or None,
            flash_attn=flash_attn,
            cache_type_k=cache_type_k,
            cache_type_v=cache_type_v,
        )
        ngl = gpu_layers(n_gpu_layers, model)
        self.model = model if isinstance(model, LlamaModel) else LlamaModel(resolve_model(model), n_gpu_layers=ngl)
        ctx_args: dict[str, Any] = dict(
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=n_ubatch,
            n_threads=n_threads,
            swa_full=swa_full,
            n_rs_seq=n_rs_seq,
            flash_attn=settings.flash_attn,
            cache_type_k=settings.cache_type_k,
            cache_type_v=settings.cache_type_v,
        )
        self.ctx = LlamaContext(self.model, **ctx_args)
        self._ctx_args = ctx_args
        self._prefill = prefill
        self.machine = MachineSampler()
        self.draft_models = DraftModelCache(self.model)
        self._subscribers: list[Callable[[Event], None]] = []
        self._lock = threading.RLock()
        self._cancel = threading.Event()
        #: Record the target's top-two margin at each committed position (for the equivalence check).
        self.record_margins = False
        self.cost_model: VerifyCostModel | None = None  # measured once per session, on first use
        self._scratch = np.empty(self.model.n_vocab, dtype=np.float32)  # row-scan scratch buffer
        self.rng = np.random.default_rng(0)  # one generator for the session's life; reseeded by start()
        self.drafter: Drafter | None = None
        self._scanner: tuple[tuple[str, ...], StopScanner] | None = None  # the stop scanner of self.stop
        #: The current generation's state (see :mod:`specviz.decoding.generation`).
        self.generation = Generation()

    # -- the generation's state, read-only (it lives in self.generation) ------------------------------
    @property
    def history(self) -> list[int]:
        """The prompt's tokens, then every generated one."""
        return self.generation.history

    @property
    def n_prompt(self) -> int:
        """How many tokens of :attr:`history` are the prompt's."""
        return self.generation.n_prompt

    @property
    def max_tokens(self) -> int:
        """The generation's token budget."""
        return self.generation.max_tokens

    @property
    def sampling(self) -> SamplingParams:
        """The generation's sampling settings."""
        return self.generation.sampling

    @property
    def seed(self) -> int | None:
        """The generation's seed (drawn and recorded when ``start`` was given none)."""
        return self.generation.seed

    @property
    def strategy(self) -> str:
        """The strategy in force."""
        return self.generation.strategy

    @property
    def knobs(self) -> dict[str, Any]:
        """The knobs in force (the strategy's complete configuration)."""
        return self.generation.knobs

    @property
    def pending(self) -> tuple[str, dict[str, Any]] | None:
        """The configuration :meth:`configure` queued for the next round boundary, as (strategy, knobs)."""
        return self.generation.pending

    @property
    def round_index(self) -> int:
        """The number of the last round run (0 before the first)."""
        return self.generation.round_index

    @property
    def finished(self) -> str | None:
        """Why the generation ended (``eos``, ``stop``, ``max_tokens``, ``context``, ``cancelled`` …), or None."""
        return self.generation.finished

    @property
    def started(self) -> bool:
        """Whether a generation was started (or restored)."""
        return self.generation.started

    @property
    def telemetry(self) -> Telemetry:
        """The generation's telemetry counters."""
        return self.generation.telemetry

    @property
    def policy(self) -> DraftingPolicy:
        """The drafting policy in force."""
        return self.generation.policy

    @property
    def last_result(self) -> RoundResult | None:
        """The plain result of the last round run (None after a start, a rewind or a restore)."""
        return self.generation.last_result

    @property
    def checkpoints(self) -> list[Checkpoint]:
        """One checkpoint per round (and one for the start), for :meth:`rewind`."""
        return self.generation.checkpoints

    @property
    def stop(self) -> tuple[str, ...]:
        """The generation's stop strings."""
        return self.generation.stop

    @property
    def events(self) -> list[Event]:
        """Every event of the generation still standing (a rewind drops the later rounds' events)."""
        return self.generation.events

    @property
    def context_args(self) -> dict[str, Any]:
        """The context settings this session was created with (``n_ctx``, ``n_batch``, ``n_ubatch``,
        ``n_threads``, ``flash_attn``, ``cache_type_k``, ``cache_type_v``)."""
        return dict(self._ctx_args)

    @property
    def prefilled(self) -> bool:
        """Whether the cache holds the whole prompt and the next round reads its last row (from a start with
        ``prefill="whole"`` to its first round)."""
        return self.generation.prefilled

    @property
    def prefill(self) -> str:
        """How a prompt is evaluated: ``"all-but-last"`` (speculative-simple) or ``"whole"`` (llama-server)."""
        return self._prefill

    def _evaluate_prompt(self, g: Generation) -> None:
        """Fill the emptied cache with the prompt of ``g`` as :attr:`prefill` says (``g.history`` is the prompt)."""
        self.ctx.clear()
        ids = g.history
        if self._prefill == "whole":
            self.ctx.eval_prompt(ids, 0, keep_last=True)
            g.prefilled = True
        else:
            self.ctx.eval_prompt(ids[:-1], 0)

    @staticmethod
    def _snapshot_strategy(blob: Any) -> str:
        """The strategy a snapshot restores, or ``none`` where it cannot be read (restoring then says why)."""
        try:
            name = read_header(unpack(blob)[0]).strategy
            strategy_class(name)
        except Exception:
            return "none"
        return name

    def set_context_settings(self, **values: Any) -> ContextSettings:
        """Create the target's context anew with other settings (``flash_attn``, ``cache_type_k``,
        ``cache_type_v``, ``n_ctx``, ``n_batch``, ``n_ubatch``, ``n_threads``; the others stay), between
        generations: the current generation ends (:meth:`start` begins the next one) and the verify-cost
        curve is measured again. Everything is checked, and the new context created, before the old one is
        freed: a refused setting raises :class:`~specviz.errors.ContextSettingsError` and changes nothing."""
        with self._lock:
            new = ContextSettings.make(self.settings, **values)
            if new == self.settings:
                return new
            args = dict(self._ctx_args)
            args.update({k: getattr(new, k) for k in values})
            ctx = LlamaContext(self.model, **args)  # may refuse: nothing has changed yet
            if self.drafter is not None:
                self.drafter.close()  # it may hold the old context (tied drafters)
                self.drafter = None
            self.ctx.close()
            self.ctx, self._ctx_args = ctx, args
            self._scanner = None
            self.cost_model = None
            self.generation = Generation()
            return ctx.settings

    @property
    def settings(self) -> ContextSettings:
        """The target context's settings (flash attention, KV cache types, sizes, threads)."""
        return self.ctx.settings

    @property
    def temperature(self) -> float:
        """The sampling temperature of the current generation (0: greedy)."""
        return self.sampling.temperature

    @property
    def tokens(self) -> list[int]:
        """Generated token ids (prompt excluded)."""
        return self.history[self.n_prompt :]

    @property
    def prompt_tokens(self) -> list[int]:
        """Prompt token ids (BOS included when the model adds one)."""
        return self.history[: self.n_prompt]

    @property
    def text(self) -> str:
        """Generated text (ending before the stop string when a stop string ended it)."""
        if self.stop:
            return cut_text(self._stop_scanner(), self.tokens)
        return self.model.detokenize(self.tokens)

    def _stop_scanner(self) -> StopScanner:
        m = self.model
        sc = self._scanner
        if sc is None or sc[0] != self.stop:
            sc = (self.stop, StopScanner(self.stop, m.piece_bytes, lambda t: not (t == m.bos or m.is_eog(t))))
            self._scanner = sc
        return sc[1]

    @property
    def kv_length(self) -> int:
        """Positions the target's cache really holds (read from llama.cpp)."""
        return self.ctx.kv_len()

    @property
    def committed(self) -> int:
        """Positions committed to the cache: every token but the pending newest one."""
        return self.generation.committed

    def schema(self, strategy: str | None = None) -> list[dict[str, Any]]:
        """Knob descriptions of ``strategy`` (default: the current one), for forms and help."""
        return strategy_schema(strategy or self.strategy).to_list()

    @staticmethod
    def strategies() -> list[str]:
        """Every strategy name."""
        return strategy_names()

    # -- events --------------------------------------------------------------------------------------
    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every future event; returns a function that unsubscribes."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def _emit(self, ev: Event, out: list[Event] | None = None) -> None:
        self.generation.events.append(ev)
        if out is not None:
            out.append(ev)
        for cb in list(self._subscribers):
            cb(ev)

    # -- configuration -------------------------------------------------------------------------------
    def validate_config(
        self, strategy: str, knobs: dict[str, Any], base: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The complete configuration of ``strategy`` with ``knobs`` set on top of ``base`` (the knobs of
        ``base`` the strategy shares; None: the defaults), checked completely: each knob, the strategy's
        own rules, the rules between knobs, and a draft model (loaded and checked now). Changes nothing;
        a refusal raises :class:`~specviz.errors.KnobError` or :class:`~specviz.errors.ModelError`."""
        schema = strategy_schema(strategy)
        carried = {k: v for k, v in base.items() if k in set(schema.names())} if base is not None else None
        cfg = schema.validate(knobs, base=carried)
        cls = strategy_class(strategy)
        check_knob_rules(cls, cfg)
        check_cross_knobs(cfg)
        why = rollback_refusal(self.ctx.memory.info) if cls.drafts else None
        if why is not None:
            raise RollbackUnavailableError(f"strategy {strategy!r} cannot run: {why}")
        if cls.needs_model:  # load and check now, so nothing fails at the boundary
            path = cfg.get("draft_model") or ""
            model = self.draft_models.get(path) if path or not cls.draft_model_optional else None
            if (hooks := context_class(cls)) is not None:
                hooks.check_models(cfg, self.ctx, model)
        return cfg

    def configure(self, strategy: str | None = None, **knobs: Any) -> dict[str, Any]:
        """Change the strategy and/or knobs; validated now (a draft model is loaded and checked now),
        applied at the next round boundary. Returns the configuration that will apply.

        A refused value raises :class:`~specviz.errors.KnobError` (naming the knob, the value and the
        range) or a :class:`~specviz.errors.ModelError` for an unusable draft model; nothing changes.
        """
        with self._lock:
            g = self.generation
            cur_strategy, cur_knobs = g.pending if g.pending else (g.strategy, g.knobs)
            target = resolve_strategy(strategy) if strategy else cur_strategy
            try:
                cfg: dict[str, Any] | None = self.validate_config(target, knobs, cur_knobs)
            except (KnobError, ModelError):
                # a draft GGUF is the file of the strategy that loaded it (a draft model, an EAGLE-3 or DFlash
                # head, an MTP model): a switch carries it only where the new strategy takes it; otherwise the
                # new strategy is checked as if it had not been given one (MTP then drafts with the target's
                # own layers), and a refusal names what the new strategy lacks, not the old file
                if target == cur_strategy or "draft_model" in knobs or not cur_knobs.get("draft_model"):
                    raise
                cfg = None
            if cfg is None:  # outside the handler: a refusal here is the new strategy's own, unchained
                base = {k: v for k, v in cur_knobs.items() if k != "draft_model"}
                cfg = self.validate_config(target, knobs, base)
            g.pending = (target, cfg)
            return dict(cfg)

    def build_drafter(self, strategy: str, cfg: dict[str, Any], sampling: SamplingParams) -> Drafter:
        """A new drafter for a configuration :meth:`validate_config` returned, drafting under ``sampling``;
        a strategy that drafts with a model gets this session's models and target context. The caller
        owns it (and closes the one it replaces)."""
        resources = None
        if strategy_class(strategy).needs_model:
            a = self._ctx_args
            path = cfg.get("draft_model") or ""
            model = (
                self.model
                if not path and strategy_class(strategy).draft_model_optional
                else self.draft_models.get(path)
            )
            resources = DraftResources(
                model=model,
                target=self.model,
                target_ctx=self.ctx,
                n_ctx=self.ctx.capacity.n_ctx,
                n_batch=self.ctx.capacity.n_batch,
                n_ubatch=self.ctx.capacity.n_ubatch,
                n_threads=a["n_threads"],
                sampling=sampling,
                rng=self.rng,
                flash_attn=self.ctx.settings.flash_attn,
            )
        return make_drafter(strategy, cfg, resources)

    def _apply_pending(self, out: list[Event]) -> None:
        """Apply a queued configuration at this round boundary (a new drafter is built before the old
        one is closed, so a failure leaves the session as it was)."""
        g = self.generation
        if g.pending is None:
            return
        strategy, cfg = g.pending
        g.pending = None
        prev_s, prev_k = g.strategy, dict(g.knobs)
        own = {k.name for k in strategy_class(strategy).knobs}
        if strategy != g.strategy or any(g.knobs.get(k) != cfg.get(k) for k in own):
            # a drafter's knobs can change the meaning of its state: rebuild it from the history
            old_ctx, fresh = self.ctx, replace_for(self, strategy)
            try:
                drafter = self.build_drafter(strategy, cfg, g.sampling)
                try:
                    if fresh is not None:  # the new context holds what the old one held, then the drafter starts
                        refill(fresh, old_ctx, g.history if g.prefilled else g.history[:-1], keep_last=g.prefilled)
                    drafter.begin(g.history)
                except BaseException:
                    drafter.close()
                    raise
            except BaseException:
                put_back(self, old_ctx, fresh)
                raise
            if self.drafter is not None:
                self.drafter.close()
            self.drafter = drafter
            if fresh is not None:
                old_ctx.close()
        if cfg.get("draft_policy", "fixed") != g.knobs.get("draft_policy", "fixed"):
            g.policy = make_policy(cfg.get("draft_policy", "fixed"), self.cost_model)
        g.strategy, g.knobs = strategy, cfg
        if (prev_s, prev_k) != (strategy, cfg):
            self._emit(
                KnobsChanged(
                    self.round_index,
                    strategy=strategy,
                    knobs=dict(cfg),
                    previous_strategy=prev_s,
                    previous_knobs=prev_k,
                    schema=tuple(self.schema(strategy)),
                ),
                out,
            )

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(
        self,
        prompt: str | list[int] | None = None,
        max_tokens: int = 128,
        strategy: str = "prompt-lookup",
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        messages: list[dict[str, str]] | None = None,
        chat_template: str | None = None,
        stop: str | list[str] | None = None,
        **knobs: Any,
    ) -> SessionStarted:
        """Begin a new generation: validate everything, evaluate the prompt, publish ``SessionStarted``.

        ``prompt`` is text (tokenized with BOS) or a list of token ids. ``messages`` (instead of a prompt:
        ``[{"role": "user", "content": "..."}]``) is a chat request formatted with the model's own chat
        template, or the llama.cpp built-in one named by ``chat_template`` (:mod:`specviz.decoding.chat`; a model
        without one raises :class:`~specviz.errors.ChatTemplateError`). ``stop`` is a stop string or a list
        of them: the generation ends where plain decoding with them would (:mod:`specviz.decoding.stops`), and
        :attr:`text` ends before the stop string. ``temperature`` 0 (the default)
        is greedy and exact; above 0 every strategy samples losslessly (rejection sampling, the target's
        distribution after ``top_k``/``top_p``) from a generator seeded with ``seed`` (a random seed is
        drawn and recorded when ``seed`` is None). ``strategy`` is a strategy name, llama.cpp's
        ``--spec-type`` spelling of one (``draft-dflash``) or a comma list of them, a chain of drafters
        asked in llama.cpp's priority order (:mod:`specviz.strategies.chain`); :attr:`strategy` holds its
        canonical name. Every argument is validated before anything changes; a refused call leaves the
        previous generation intact.
        """
        with self._lock:
            request: dict[str, Any] = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop)
            request.update(messages=messages, chat_template=chat_template)
            strategy = resolve_strategy(strategy)  # llama.cpp's spellings and chains have one canonical name
            req, cfg = self._check_start(prompt, max_tokens, strategy, self.ctx.capacity.n_ctx, request, knobs)
            sampling, stops, ids, chat = req.sampling, req.stop, req.ids, req.messages
            old_ctx, fresh = self.ctx, replace_for(self, strategy)
            try:
                drafter = self.build_drafter(strategy, cfg, sampling)  # may fail: nothing has changed yet
            except BaseException:
                put_back(self, old_ctx, fresh)
                raise
            if self._prefill == "whole" and drafter.reads_target:
                drafter.close()
                put_back(self, old_ctx, fresh)
                raise StrategyError(
                    f"strategy {strategy!r} reads the target's activations of every verify batch, and a "
                    "whole-prompt prefill (prefill='whole') gives its first round none; start it on a session "
                    "with prefill='all-but-last', or start with 'none' and configure it after the first round",
                    knob="strategy",
                )
            if self.drafter is not None:
                self.drafter.close()
            self.drafter = drafter
            if fresh is not None:
                old_ctx.close()
            g = self.generation = Generation(
                history=list(ids),
                n_prompt=len(ids),
                max_tokens=req.max_tokens,
                sampling=sampling,
                seed=req.seed,
                strategy=strategy,
                knobs=cfg,
                stop=stops,
                policy=make_policy(cfg.get("draft_policy", "fixed"), self.cost_model),
            )
            self.rng.bit_generator.state = np.random.default_rng(g.seed).bit_generator.state
            self._cancel.clear()
            t0 = time.perf_counter()
            self._evaluate_prompt(g)
            g.telemetry.prompt_seconds = time.perf_counter() - t0
            g.telemetry.prompt_tokens = len(ids)
            # the state after the prompt, where memory that cannot drop a tail rewinds from at the latest
            g.telemetry.record_memory(self.ctx.memory.remember(), None, [])
            self.machine.reset()
            drafter.begin(g.history)
            g.started = True
            cap = self.ctx.capacity
            ev = SessionStarted(
                0,
                model=str(self.model.path),
                draft_model=self._draft_model_name(),
                strategy=strategy,
                knobs=dict(cfg),
                prompt_tokens=tuple(ids),
                prompt_pieces=tuple(self.model.pieces(ids)),
                max_tokens=self.max_tokens,
                temperature=sampling.temperature,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                seed=self.seed,
                n_ctx=cap.n_ctx,
                n_batch=cap.n_batch,
                n_ubatch=cap.n_ubatch,
                n_swa=cap.n_swa,
                n_vocab=self.model.n_vocab,
                stop=stops,
                messages=tuple(chat),
                chat_template=(chat_template or "model") if chat else None,
                prefill=self._prefill,
            )
            self._emit(ev)
            g.capture(drafter, self.rng)
            return ev

    def check_start(
        self,
        prompt: str | list[int] | None = None,
        max_tokens: int = 128,
        strategy: str = "prompt-lookup",
        *,
        n_ctx: int | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        messages: list[dict[str, str]] | None = None,
        chat_template: str | None = None,
        stop: str | list[str] | None = None,
        **knobs: Any,
    ) -> None:
        """Check the arguments of :meth:`start` as it checks them, without starting anything: a refusal
        raises what :meth:`start` would raise. ``n_ctx`` checks the prompt against a context of that size
        (one that :meth:`set_context_settings` is about to create) instead of this one's: the size asked for,
        where llama.cpp may make the context larger (it pads small ones to 256), so the check errs on the
        side of refusing."""
        with self._lock:
            request: dict[str, Any] = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop)
            request.update(messages=messages, chat_template=chat_template)
            self._check_start(prompt, max_tokens, strategy, n_ctx or self.ctx.capacity.n_ctx, request, knobs)

    def _check_start(
        self,
        prompt: str | list[int] | None,
        max_tokens: int,
        strategy: str,
        n_ctx: int,
        request: dict[str, Any],
        knobs: dict[str, Any],
    ) -> tuple[Request, dict[str, Any]]:
        # every check of start(), in one place (start and check_start)
        req = prepare_request(self.model, prompt, max_tokens, n_ctx=n_ctx, **request)
        return req, self.validate_config(resolve_strategy(strategy), knobs)

    def _draft_model_name(self) -> str | None:
        return str(self.knobs.get("draft_model")) if strategy_class(self.strategy).needs_model else None

    def cancel(self) -> None:
        """Stop the generation: the current round completes, then the session finishes ``cancelled``."""
        self._cancel.set()

    def run(self, max_rounds: int | None = None) -> list[Round]:
        """Step until the generation finishes (or ``max_rounds`` rounds); returns the rounds run."""
        rounds: list[Round] = []
        while self.finished is None and (max_rounds is None or len(rounds) < max_rounds):
            rounds.append(self.step())
        return rounds

    def generate(
        self, prompt: str | list[int], max_tokens: int = 128, strategy: str = "prompt-lookup", **kwargs: Any
    ) -> str:
        """Convenience: :meth:`start` then :meth:`run`; returns the generated text."""
        self.start(prompt, max_tokens, strategy, **kwargs)
        self.run()
        return self.text

    # -- the round -----------------------------------------------------------------------------------
    def step(self) -> Round:
        """Run exactly one round (draft → one verify batch → accept → roll back) and return it."""
        with self._lock:
            if not self.started:
                raise SessionStateError("the session has not started; call start(prompt, ...) first")
            if self.finished is not None:
                raise SessionStateError(
                    f"the generation has finished ({self.finished}); call start() to begin a new one"
                )
            out: list[Event] = []
            self._apply_pending(out)
            if self._cancel.is_set():
                return self._finish("cancelled", out)
            if len(self.history) >= self.ctx.capacity.n_ctx:
                return self._finish("context", out)
            assert self.drafter is not None
            g = self.generation
            prefilled = g.prefilled  # cleared once the round has read the prompt's row (a refusal keeps it)
            if (
                self.drafter.drafts
                and g.knobs.get("draft_policy") == "cost"
                and self.cost_model is None
                and not prefilled  # the measurement's batches would replace the prompt's last row
            ):
                self.cost_model = measure_verify_cost(self.ctx, g.history, g.knobs)  # once, outside rounds
                g.policy.use_cost(self.cost_model)
            cap = self.ctx.capacity
            caps = Caps(
                remaining=self.max_tokens - len(self.tokens),
                free_ctx=cap.n_ctx - len(self.history),
                n_batch=cap.n_batch,
                n_ubatch=cap.n_ubatch,
                memory=self.ctx.memory.draft_limit(self.committed, DRAFT_MAX_LIMIT),
            )
            budget = plan(
                g.knobs,
                g.policy,
                caps,
                drafts=self.drafter.drafts and not prefilled,
                promise=self.drafter.pause_when_plain,
            )
            if prefilled:
                budget = Budget(budget.requested, 0, "prompt", None)
            g.round_index += 1
            res = run_round(
                g.round_index,
                self.ctx,
                self.drafter,
                g.history,
                budget,
                params=self.sampling,
                rng=self.rng,
                is_eog=self.model.is_eog,
                draft_min=int(g.knobs.get("draft_min", 0)),
                tile=verify_tile(g.knobs),
                scratch=self._scratch,
                record_margins=self.record_margins,
                stop=self._stop_fn(),
                prefilled=prefilled,
            )
            g.prefilled = False
            g.last_result = res
            self.machine.sample()
            self._learn(res)
            for ev in round_events(res, self.model.pieces, policy=str(g.knobs.get("draft_policy", "fixed"))):
                self._emit(ev, out)
            # one copy a round of the counters and of the policy's state: the event's and the checkpoint's
            counters, policy_state = self.telemetry.state(), g.policy.state()
            self._emit(TelemetryEvent.deferred(res.index, self.telemetry_view(counters, policy_state)), out)
            finish = res.finish or ("max_tokens" if len(self.tokens) >= self.max_tokens else None)
            # only the sampled acceptor and drafters with a model of their own draw from the generator
            moved = not self.sampling.greedy or self.drafter.has_context
            if finish is not None:
                rnd = self._finish(finish, out, res.committed)
                g.capture(self.drafter, self.rng, counters, policy_state, rng_moved=moved)  # a rewind finds it finished
                return rnd
            # before a cancellation: a rewind here may continue
            g.capture(self.drafter, self.rng, counters, policy_state, rng_moved=moved)
            if self._cancel.is_set():
                return self._finish("cancelled", out, res.committed)
            return Round(res.index, tuple(out), tuple(res.committed), None)

    def _stop_fn(self) -> Callable[[list[int]], int | None] | None:
        """The round's stop check (None without stop strings): where a committed token completes one."""
        if not self.stop:
            return None
        scanner, history, start = self._stop_scanner(), self.history, self.n_prompt
        return lambda new: scanner.find(history, new, start)

    def _learn(self, res: RoundResult) -> None:
        """Feed one round to the drafting policy and the telemetry counters."""
        if not res.prefilled:  # a prefilled round's row came with the prompt: its seconds are no verify's
            self.policy.observe_verify(res.batch_size, res.verify_seconds)
        # the drafter's upkeep (feeding its own model) is learnt apart from its draft steps
        hooks = context_hooks(self.drafter)
        upkeep = hooks.take_upkeep() if hooks is not None else None
        draft_seconds = res.draft_seconds
        if upkeep is not None:
            self.policy.observe_upkeep(upkeep.seconds, upkeep.tokens, upkeep.in_draft)
            draft_seconds = max(0.0, draft_seconds - upkeep.in_draft)
        if res.draft:
            self.policy.observe(len(res.draft), res.n_accepted, draft_seconds)
        elif res.shadow is not None and res.committed:
            self.policy.observe_shadow(res.shadow == res.committed[0])
        elif res.budget.limit > 0:  # asked for a draft, got none: what asking cost, upkeep included
            self.policy.observe(0, 0, draft_seconds + (upkeep.seconds if upkeep is not None else 0.0))
        else:
            self.policy.observe_idle()
        self.telemetry.record_round(
            n_drafted=len(res.draft),
            n_accepted=res.n_accepted,
            n_committed=len(res.committed),
            draft_seconds=res.draft_seconds,
            verify_seconds=res.verify_seconds,
            round_seconds=res.round_seconds,
            draft_probs=res.draft_probs,
            expected_tokens=res.budget.expected,
            drafter=res.drafter,
        )
        self.telemetry.record_memory(res.checkpoint, res.rollback, res.draft_memory)

    def _finish(self, reason: str, out: list[Event], new_tokens: list[int] | tuple = ()) -> Round:
        self.generation.finished = reason
        message = None
        if reason == "stop":
            at = self._stop_scanner().cut(self.tokens)
            text = b"".join(
                self.model.piece_bytes(t) for t in self.tokens if not (t == self.model.bos or self.model.is_eog(t))
            )
            message = next(
                (f"stop string {s!r}" for s in self.stop if at is not None and text.startswith(s.encode(), at)), None
            )
        self._emit(Finished(self.round_index, reason=reason, n_generated=len(self.tokens), message=message), out)
        return Round(self.round_index, tuple(out), tuple(new_tokens), reason)

    def telemetry_dict(self) -> dict[str, Any]:
        """Telemetry as a dictionary: the counters and derived figures, the drafter's own counters and
        figures, the cache length and what the drafting policy works from (``policy``)."""
        return self.telemetry_view()()

    def telemetry_view(
        self, counters: dict[str, Any] | None = None, policy_state: dict[str, Any] | None = None
    ) -> TelemetryView:
        """:meth:`telemetry_dict` as of now, built when called (what a round's telemetry event holds):
        the counters are copied now (or ``counters``, a copy :meth:`Telemetry.state` took), and the
        policy's state (or ``policy_state``, its :meth:`~specviz.decoding.policy.DraftingPolicy.state`
        taken now); the small figures that change are taken now, the derived figures and the policy's
        description are computed when it is called."""
        d = self.drafter
        hooks = context_hooks(d)
        return TelemetryView(
            counters if counters is not None else self.telemetry.state(),
            self.strategy,
            d.stats.to_dict() if d is not None else {},
            drafter_telemetry(d),
            self.committed,
            type(self.policy),
            policy_state if policy_state is not None else self.policy.state(),
            self.policy.cost_points(),
            memory_view(self.ctx, hooks.memory_context() if hooks is not None else None),
            self.machine.view(),
        )

    # -- snapshots (specviz.decoding.snapshot) -------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """The whole session state (caches, history, strategy, knobs, telemetry) in one checksummed envelope."""
        with self._lock:
            if not self.started or self.drafter is None:
                raise SessionStateError("nothing to snapshot: call start() first")
            return take_snapshot(self)

    @classmethod
    def restore(cls, blob: bytes, model: str | os.PathLike | LlamaModel | None = None, **kwargs: Any) -> Session:
        """A new session continuing exactly where the snapshot was taken.

        ``model`` defaults to the path recorded in the snapshot; a model other than the one the snapshot
        was taken with is refused with :class:`~specviz.errors.SnapshotError`.
        """
        header, _ = unpack(blob)
        h = read_header(header)
        keys: tuple[str, ...] = ("n_ctx", "n_batch", "n_ubatch", "n_threads", "swa_full", "n_rs_seq")
        keys += ("flash_attn", "cache_type_k", "cache_type_v")
        ctx_args: dict[str, Any] = {k: h.ctx[k] for k in keys if k in h.ctx}
        sess = cls(model if model is not None else h.model, **{**ctx_args, **kwargs})
        try:
            sess.restore_into(blob)
        except Exception:
            sess.close()
            raise
        return sess

    def restore_into(self, blob: bytes) -> None:
        """Restore a snapshot into this session (same model and context sizes), replacing its current
        generation. Everything is checked before anything changes; a refused snapshot raises
        :class:`~specviz.errors.SnapshotError` (or the draft model's error) and leaves the session as it was."""
        with self._lock:
            old_ctx, fresh = self.ctx, replace_for(self, self._snapshot_strategy(blob))
            try:
                restore_snapshot(self, blob)
            except BaseException:
                put_back(self, old_ctx, fresh)  # the old context, untouched
                raise
            if fresh is not None:
                old_ctx.close()
            g = self.generation
            if self._prefill == "whole" and len(g.history) == g.n_prompt and g.finished is None:
                self._evaluate_prompt(g)  # at the start: the first round reads the prompt's last row

    # -- rewind and branch -----------------------------------------------------------------------------
    def rewind(self, round: int | None = None, *, position: int | None = None) -> Rewound:
        """Go back to the state right after round ``round`` (0: right after the prompt), or to ``position``
        tokens of history: caches cut, drafter rebuilt, telemetry and events of the later rounds dropped,
        a :class:`~specviz.decoding.events.Rewound` event published (see :mod:`specviz.decoding.rewind`).

        A round or position outside the committed range raises :class:`~specviz.errors.RewindError` and
        changes nothing. A configuration queued with :meth:`configure` is discarded.
        """
        with self._lock:
            ev = rewind_generation(self, round=round, position=position)
            g = self.generation
            if self._prefill == "whole" and len(g.history) == g.n_prompt:
                self._evaluate_prompt(g)  # back to the start: the first round reads the prompt's last row again
                g.telemetry.record_memory(self.ctx.memory.remember(), None, [])
            self._cancel.clear()
            self._emit(ev)
            return ev

    def fork(self) -> Session:
        """A second session at this point, sharing the loaded models, independent afterwards (its own
        contexts, drafter, history, events and checkpoints). Close it with :meth:`close` when done.

        The fork is this session's snapshot restored into a new session whose draft-model cache shares
        this one's models; it starts with a copy of the events and checkpoints, so it can be rewound too.
        """
        with self._lock:
            if not self.started or self.drafter is None:
                raise SessionStateError("nothing to fork: call start() first")
            blob = self.snapshot()
            other = type(self)(self.model, **self.context_args, prefill=self._prefill)
            try:
                other.draft_models.close()
                other.draft_models = self.draft_models.share()
                other.restore_into(blob)  # the snapshot carries the measured verify cost curve too
                other.ctx.memory.adopt(self.ctx.memory)  # the saved states serve the fork's rewinds too
                other.record_margins = self.record_margins
            except Exception:
                other.close()
                raise
            return other

    def verify_cost(self) -> VerifyCostModel | None:
        """The verify-cost curve of this session: the one the cost policy measured, or measured now (batch
        sizes up to the longest draft verified, plus one) with the cache left as it was; ``None`` when the
        context has no room for the measurement (the advisor then fits the recorded verify times)."""
        with self._lock:
            if self.cost_model is not None:
                return self.cost_model
            longest = max((len(e.tokens) for e in self.events if isinstance(e, DraftProposed)), default=0)
            knobs = {**self.knobs, "draft_max": max(longest, 1)}
            g = self.generation
            try:
                if not g.prefilled:
                    return measure_verify_cost(self.ctx, self.history, knobs, repeats=ADVISOR_REPEATS)
                # the cache holds the pending token too: measure after it, then evaluate the prompt again
                # (the measurement's batches replaced the row the first round reads)
                try:
                    after = [*self.history, self.history[-1]]
                    return measure_verify_cost(self.ctx, after, knobs, repeats=ADVISOR_REPEATS)
                finally:
                    self._evaluate_prompt(g)
            except Exception:  # a full context
                return None

    def close(self) -> None:
        """Free the contexts and the draft models this session loaded (after any call running on them)."""
        with self._lock:
            if self.drafter is not None:
                self.drafter.close()
                self.drafter = None
            self.draft_models.close()
            self.ctx.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
