"""The stepping decoder's facade: :class:`Session` owns the models, the contexts, the drafter and the
generation, and runs one speculative round per :meth:`Session.step`, published as events (a step's two halves,
:meth:`Session.begin_step` and :meth:`Session.finish_step`, let a batched run put several sessions' verify
batches in one decode: :mod:`specviz.decoding.batch`).

Each part has a module of its own (docs/architecture.md lists them): the round (:mod:`specviz.decoding.round`),
its budget, events and learning, the configuration, the generation's start and state, rewinds, snapshots and
branches. What one generation has is :attr:`Session.generation`; the session shows what users read of it as
read-only attributes (``history``, ``knobs``, ``events`` …). Nothing here imports a UI library.

Every public call validates first and changes nothing when it refuses: a refused call raises a typed
:class:`~specviz.errors.SpecvizError` and the session stays usable.
"""

from __future__ import annotations

import os
import threading
from functools import partial
from typing import Any, Callable

import numpy as np

from ..backends.context_settings import ContextSettings
from ..backends.llama import LlamaContext, LlamaModel
from ..errors import GrammarError, SessionStateError
from ..models.draft_cache import DraftModelCache
from ..strategies import resolve_strategy, strategy_names, strategy_schema
from ..strategies.base import Drafter
from ..strategies.context_drafter import context_hooks
from .branching import forked, restored, snapshot_strategy
from .budget import Budget, Caps, plan
from .configuration import apply_pending, build_drafter, check_config, next_config, use_drafter
from .events import DraftProposed, Event, Rewound, Round, SessionStarted, TelemetryEvent
from .generation import Generation, GenerationField
from .generation_start import evaluate_prompt, evaluate_start, new_generation, prompt_row_again
from .knob_schema import DRAFT_MAX_LIMIT
from .machine import MachineSampler
from .request import Request, prepare_request, split_request
from .rewind import rewind as rewind_generation
from .round import StepBegun, begin_round, finish_round, verify_alone
from .round_events import finished_event, round_events, started_event
from .round_learning import learn
from .rowscan import RowSource
from .sampling import SamplingParams
from .snapshot import restore_snapshot, take_snapshot
from .stops import StopScanner, cut_text
from .target_context import swap_target
from .target_setup import CONTEXT_KEYS, check_prefill, context_args, open_target
from .telemetry import TelemetryView
from .tiling import verify_tile
from .verify_cost import VerifyCostModel, measure_for_advice


class Session:
    """Runs a target model (and optionally a draft model) one speculative round at a time.

    ``model`` is a GGUF path, an already loaded :class:`~specviz.backends.LlamaModel`, or ``None`` for
    the embedded Gemma 3 270M. The context is created once and reused by every :meth:`start`, with the
    deployment's settings as llama.cpp spells them: ``n_ctx`` (``-c``), ``n_batch`` / ``n_ubatch`` (``-b`` /
    ``-ub``), ``n_threads`` (``-t``), ``flash_attn`` (``-fa``), ``cache_type_k`` / ``cache_type_v`` (``-ctk`` /
    ``-ctv``), ``n_gpu_layers`` (``-ngl``), ``swa_full`` and ``n_rs_seq``; ``prefill`` is how a prompt is
    evaluated (``"all-but-last"`` as speculative-simple, ``"whole"`` as llama-server). Each is described, and
    checked before the model loads, in :mod:`specviz.decoding.target_setup`; :attr:`settings` holds them.
    ``context``, instead of a context of the session's own, is one opened for it with those settings (``model``
    unused): one request's sequence of a batched run (:mod:`specviz.decoding.batch`). ``n_seq_max`` opens the
    target's context for that many sequences in one unified cache: a draft tree (a strategy's ``tree_width``)
    verifies each branch as one of them, so a tree needs ``n_seq_max >= tree_width``.
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
        context: LlamaContext | None = None,
        n_seq_max: int = 1,
    ) -> None:
        # only what lives as long as the session is held here: a generation's state is self.generation
        self._prefill = check_prefill(prefill)
        settings: dict[str, Any] = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads)
        settings.update(swa_full=swa_full, n_rs_seq=n_rs_seq, flash_attn=flash_attn, cache_type_k=cache_type_k)
        settings.update(cache_type_v=cache_type_v, n_seq_max=n_seq_max)
        if context is None:
            self.model, self.ctx, self._ctx_args = open_target(model, n_gpu_layers, settings)
        else:  # a context opened for it: one request's sequence of a batched run (specviz.decoding.batch)
            self.model, self.ctx, self._ctx_args = context.model, context, context_args(**settings)
        self.machine = MachineSampler()
        self.draft_models = DraftModelCache(self.model)
        self._subscribers: list[Callable[[Event], None]] = []
        self._lock = threading.RLock()
        self._cancel = threading.Event()
        #: Record the target's top-two margin at each committed position (for the equivalence check).
        self.record_margins = False
        self.cost_model: VerifyCostModel | None = None  # measured once per session, on first use
        self.rng = np.random.default_rng(0)  # one generator for the session's life; reseeded by start()
        self.drafter: Drafter | None = None
        self._scanner: tuple[tuple[str, ...], StopScanner] | None = None  # the stop scanner of the stop strings
        #: The current generation's state (see :mod:`specviz.decoding.generation`).
        self.generation = Generation()

    # -- the generation's state, read-only (it lives in self.generation, with the rest of it) ----------
    history: GenerationField[list[int]] = GenerationField("The prompt's tokens, then every generated one.")
    n_prompt: GenerationField[int] = GenerationField("How many tokens of :attr:`history` are the prompt's.")
    max_tokens: GenerationField[int] = GenerationField("The generation's token budget.")
    strategy: GenerationField[str] = GenerationField("The strategy in force.")
    knobs: GenerationField[dict[str, Any]] = GenerationField("The knobs in force (the complete configuration).")
    round_index: GenerationField[int] = GenerationField("The number of the last round run (0 before the first).")
    finished: GenerationField[str | None] = GenerationField("Why the generation ended (``eos``, ``stop`` …), or None.")
    started: GenerationField[bool] = GenerationField("Whether a generation was started (or restored).")
    events: GenerationField[list[Event]] = GenerationField("The generation's events (a rewind drops later rounds').")
    committed: GenerationField[int] = GenerationField("Positions in the cache: every token but the pending one.")

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
        if self.generation.stop:
            return cut_text(self._stop_scanner(), self.tokens)
        return self.model.detokenize(self.tokens)

    @property
    def context_args(self) -> dict[str, Any]:
        """The context settings this session was created with (every key of
        :data:`~specviz.decoding.target_setup.CONTEXT_KEYS`)."""
        return dict(self._ctx_args)

    @property
    def prefill(self) -> str:
        """How a prompt is evaluated: ``"all-but-last"`` (speculative-simple) or ``"whole"`` (llama-server)."""
        return self._prefill

    @property
    def settings(self) -> ContextSettings:
        """The target context's settings (flash attention, KV cache types, sizes, threads)."""
        return self.ctx.settings

    @property
    def kv_length(self) -> int:
        """Positions the target's cache really holds (read from llama.cpp)."""
        return self.ctx.kv_len()

    def _stop_scanner(self) -> StopScanner:
        m, stop, sc = self.model, self.generation.stop, self._scanner
        if sc is None or sc[0] != stop:
            sc = (stop, StopScanner(stop, m.piece_bytes, lambda t: not (t == m.bos or m.is_eog(t))))
            self._scanner = sc
        return sc[1]

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
            args = {**self._ctx_args, **{k: getattr(new, k) for k in values}}
            ctx = LlamaContext(self.model, **args)  # may refuse: nothing has changed yet
            use_drafter(self, None)  # it may hold the old context (tied drafters)
            self.ctx.close()
            self.ctx, self._ctx_args = ctx, args
            self._scanner, self.cost_model, self.generation = None, None, Generation()
            return ctx.settings

    def schema(self, strategy: str | None = None) -> list[dict[str, Any]]:
        """Knob descriptions of ``strategy`` (default: the current one), for forms and help."""
        return strategy_schema(strategy or self.strategy).to_list()

    @staticmethod
    def strategies() -> list[str]:
        """Every strategy name."""
        return strategy_names()

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

    # -- configuration (specviz.decoding.configuration) ------------------------------------------------------------
    def validate_config(
        self, strategy: str, knobs: dict[str, Any], base: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The complete configuration of ``strategy`` with ``knobs`` set on top of ``base`` (the knobs of
        ``base`` the strategy shares; None: the defaults), checked completely: each knob, the strategy's
        own rules, the rules between knobs, and a draft model (loaded and checked now). Changes nothing;
        a refusal raises :class:`~specviz.errors.KnobError` or :class:`~specviz.errors.ModelError`."""
        return check_config(self.ctx, self.draft_models, strategy, knobs, base)

    def configure(self, strategy: str | None = None, **knobs: Any) -> dict[str, Any]:
        """Change the strategy and/or knobs; validated now (a draft model is loaded and checked now),
        applied at the next round boundary. Returns the configuration that will apply.

        A refused value raises :class:`~specviz.errors.KnobError` (naming the knob, the value and the
        range) or a :class:`~specviz.errors.ModelError` for an unusable draft model; nothing changes.
        """
        with self._lock:
            g = self.generation
            current = g.pending if g.pending else (g.strategy, g.knobs)
            target = resolve_strategy(strategy) if strategy else current[0]
            g.pending = (target, next_config(self.validate_config, current, target, knobs))
            return dict(g.pending[1])

    def build_drafter(self, strategy: str, cfg: dict[str, Any], sampling: SamplingParams) -> Drafter:
        """A new drafter for a configuration :meth:`validate_config` returned, drafting under ``sampling``;
        a strategy that drafts with a model gets this session's models and target context. The caller
        owns it (and closes the one it replaces)."""
        return build_drafter(self, strategy, cfg, sampling)

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
        grammar: str | None = None,
        json_schema: str | dict[str, Any] | None = None,
        **knobs: Any,
    ) -> SessionStarted:
        """Begin a new generation: validate everything, evaluate the prompt, publish ``SessionStarted``.

        ``prompt`` is text (tokenized with BOS) or token ids, or ``messages`` a chat request; ``stop`` stop
        strings (:attr:`text` ends before one); ``grammar`` (GBNF) or ``json_schema`` constrain every token
        (as llama-server verifies under one); ``temperature`` 0 is greedy and exact, above it every strategy
        samples losslessly from a generator seeded with ``seed`` (:mod:`specviz.decoding.request` describes
        each). ``strategy`` is a strategy name, llama.cpp's ``--spec-type`` spelling of one or a comma list of
        them (a chain, :mod:`specviz.strategies.chain`); :attr:`strategy` holds its canonical name. Everything
        is validated before anything changes; a refused call leaves the previous generation intact.
        """
        with self._lock:
            strategy = resolve_strategy(strategy)  # llama.cpp's spellings and chains have one canonical name
            request: dict[str, Any] = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop)
            request.update(messages=messages, chat_template=chat_template, grammar=grammar, json_schema=json_schema)
            req, cfg = self._check_start(prompt, max_tokens, strategy, None, {**request, **knobs})
            g, drafter = new_generation(self, req, strategy, cfg, self._prefill)
            self._cancel.clear()
            evaluate_start(self.ctx, g, self._prefill)
            self.machine.reset()
            drafter.begin(g.history)
            g.started = True
            ev = started_event(g, self.model, self.ctx.capacity, req.messages, chat_template, self._prefill)
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
        **kwargs: Any,
    ) -> None:
        """Check the arguments of :meth:`start` (the same, keywords included) as it checks them, without
        starting anything: a refusal raises what :meth:`start` would raise. ``n_ctx`` checks the prompt
        against a context of that size (one that :meth:`set_context_settings` is about to create) instead of
        this one's: the size asked for, where llama.cpp may make the context larger (it pads small ones to
        256), so the check errs on the side of refusing."""
        with self._lock:
            self._check_start(prompt, max_tokens, strategy, n_ctx, kwargs)

    def _check_start(
        self, prompt: Any, max_tokens: int, strategy: str, n_ctx: int | None, kwargs: dict[str, Any]
    ) -> tuple[Request, dict[str, Any]]:
        request, knobs = split_request(kwargs)  # every check of start() and check_start(), in one place
        req = prepare_request(self.model, prompt, max_tokens, n_ctx=n_ctx or self.ctx.capacity.n_ctx, **request)
        return req, self.validate_config(resolve_strategy(strategy), knobs)

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
            begun = self.begin_step()
            if begun.pending is None:  # the generation finished before a round
                assert begun.done is not None
                return begun.done
            rows, row, verify_started = verify_alone(self.ctx, begun.pending, self.generation.history)
            return self.finish_step(begun, rows, row, verify_started)

    def begin_step(self, load_cap: int | None = None) -> StepBegun:
        """The first half of :meth:`step`, for a batched run that evaluates several sessions' verify batches in
        one decode (:mod:`specviz.decoding.batch`): pending configuration applied, the budget planned and the
        draft made (:func:`~specviz.decoding.round.begin_round`). Its ``pending`` batch is evaluated on this
        session's context next, and :meth:`finish_step` follows with nothing else called on the session between;
        without ``pending`` the step has already ended (``done``: the generation finished before a round).
        ``load_cap``: the longest draft the batched run's draft schedule allows now (the budget's ``load`` cap)."""
        with self._lock:
            if not self.started:
                raise SessionStateError("the session has not started; call start(prompt, ...) first")
            if self.finished is not None:
                raise SessionStateError(
                    f"the generation has finished ({self.finished}); call start() to begin a new one"
                )
            out: list[Event] = []
            changed = apply_pending(self)
            if changed is not None:
                self._emit(changed, out)
            if self._cancel.is_set():
                return StepBegun(out, None, self._finish("cancelled", out))
            if len(self.history) >= self.ctx.capacity.n_ctx:
                return StepBegun(out, None, self._finish("context", out))
            g, drafter = self.generation, self.drafter
            assert drafter is not None
            budget = self._budget(g, drafter, load_cap)
            g.round_index += 1
            tile, draft_min = verify_tile(g.knobs), int(g.knobs.get("draft_min", 0))
            pending = begin_round(
                g.round_index,
                self.ctx,
                drafter,
                g.history,
                budget,
                draft_min=draft_min,
                tile=tile,
                prefilled=g.prefilled,
                chains_only=g.grammar is not None,
            )
            return StepBegun(out, pending, None)

    def finish_step(
        self, begun: StepBegun, rows: RowSource, row: Callable[[int], np.ndarray], verify_started: float
    ) -> Round:
        """The second half of :meth:`step`, once ``begun``'s verify batch was evaluated (``rows`` / ``row``: its
        rows; ``verify_started``: when the verify began): accept, commit, roll back
        (:func:`~specviz.decoding.round.finish_round`), learn, publish the round's events."""
        with self._lock:
            g, drafter, out, pending = self.generation, self.drafter, begun.out, begun.pending
            assert drafter is not None and pending is not None
            try:
                res = finish_round(
                    pending,
                    self.ctx,
                    drafter,
                    g.history,
                    rows,
                    row,
                    verify_started,
                    params=g.sampling,
                    rng=self.rng,
                    is_eog=self.model.is_eog,
                    record_margins=self.record_margins,
                    stop=self._stop_fn(),
                    grammar=g.grammar,
                )
            except GrammarError:  # no token is allowed here: the generation ends, nothing committed
                g.round_index -= 1
                self._finish("error", out)
                raise
            g.prefilled = False
            g.last_result = res
            self.machine.sample()
            hooks = context_hooks(drafter)
            learn(res, g.policy, g.telemetry, hooks.take_upkeep() if hooks is not None else None)
            for ev in round_events(res, self.model.pieces, policy=str(g.knobs.get("draft_policy", "fixed"))):
                self._emit(ev, out)
            # one copy a round of the counters and of the policy's state: the event's and the checkpoint's
            counters, policy_state = g.telemetry.state(), g.policy.state()
            self._emit(TelemetryEvent(res.index, view=self.telemetry_view(counters, policy_state)), out)
            finish = res.finish or ("max_tokens" if len(self.tokens) >= self.max_tokens else None)
            # only the sampled acceptor and drafters with a model of their own draw from the generator
            moved = not g.sampling.greedy or drafter.has_context
            rnd = self._finish(finish, out, res.committed) if finish is not None else None
            # after a finish (a rewind finds it finished), before a cancellation (a rewind here may continue)
            g.capture(drafter, self.rng, counters, policy_state, rng_moved=moved)
            if rnd is None and self._cancel.is_set():
                rnd = self._finish("cancelled", out, res.committed)
            return rnd or Round(res.index, tuple(out), tuple(res.committed), None)

    def _budget(self, g: Generation, drafter: Drafter, load_cap: int | None = None) -> Budget:
        """The next round's budget (:func:`~specviz.decoding.budget.plan`), once the policy has what it needs
        measured; a drafter that pays to stay ready hears how many plain rounds the policy promises."""
        prefilled = g.prefilled  # cleared once the round has read the prompt's row (a refusal keeps it)
        if drafter.drafts and not prefilled:  # (a prefilled round: the measurement would replace the prompt's row)
            self.cost_model = g.policy.prepare(self.ctx, g.history, g.knobs) or self.cost_model
        cap, memory = self.ctx.capacity, self.ctx.memory.draft_limit(self.committed, DRAFT_MAX_LIMIT)
        caps = Caps(
            self.max_tokens - len(self.tokens), cap.n_ctx - len(g.history), cap.n_batch, cap.n_ubatch, memory, load_cap
        )
        budget = plan(g.knobs, g.policy, caps, drafts=drafter.drafts and not prefilled)
        if prefilled:  # the round reads the prompt's row: no draft
            budget = Budget(budget.requested, 0, "prompt", None)
        hooks = context_hooks(drafter)
        if hooks is not None and drafter.pause_when_plain:
            hooks.expect_plain(g.policy.promise_plain() if budget.policy_plain else None)
        return budget

    def _stop_fn(self) -> Callable[[list[int]], int | None] | None:
        """The round's stop check (None without stop strings): where a committed token completes one."""
        if not self.generation.stop:
            return None
        scanner, history, start = self._stop_scanner(), self.history, self.n_prompt
        return lambda new: scanner.find(history, new, start)

    def _finish(self, reason: str, out: list[Event], new_tokens: list[int] | tuple = ()) -> Round:
        self.generation.finished = reason
        scanner = self._stop_scanner() if reason == "stop" else None
        self._emit(finished_event(self.round_index, reason, self.tokens, scanner), out)
        return Round(self.round_index, tuple(out), tuple(new_tokens), reason)

    def telemetry_dict(self) -> dict[str, Any]:
        """Telemetry as a dictionary: the counters and derived figures, the drafter's own counters and
        figures, the cache length and what the drafting policy works from (``policy``)."""
        return self.telemetry_view()()

    def telemetry_view(
        self, counters: dict[str, Any] | None = None, policy_state: dict[str, Any] | None = None
    ) -> TelemetryView:
        """:meth:`telemetry_dict` as of now, built when called
        (:meth:`~specviz.decoding.generation.Generation.telemetry_view`)."""
        return self.generation.telemetry_view(self.drafter, self.ctx, self.machine.view(), counters, policy_state)

    # -- snapshots, rewinds and branches (specviz.decoding.snapshot, .rewind, .branching) ---------------------
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
        return restored(cls, blob, model, **kwargs)

    def restore_into(self, blob: bytes) -> None:
        """Restore a snapshot into this session (same model and context sizes), replacing its current
        generation. Everything is checked before anything changes; a refused snapshot raises
        :class:`~specviz.errors.SnapshotError` (or the draft model's error) and leaves the session as it was."""
        with self._lock:
            with swap_target(self, snapshot_strategy(blob)):
                restore_snapshot(self, blob)  # on a refusal the old context is the session's again, untouched
            if self.generation.finished is None:  # at the start: the first round reads the prompt's last row
                prompt_row_again(self.ctx, self.generation, self._prefill)

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
            if prompt_row_again(self.ctx, g, self._prefill):  # back to the start of a whole-prompt prefill
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
            settings = {k: v for k, v in self.context_args.items() if k in CONTEXT_KEYS}  # a Session's arguments
            make = partial(type(self), **settings, prefill=self._prefill)
            return forked(self, self.snapshot(), make)

    def verify_cost(self) -> VerifyCostModel | None:
        """The verify-cost curve of this session: the one the cost policy measured, or measured now (batch
        sizes up to the longest draft verified, plus one) with the cache left as it was; ``None`` when the
        context has no room for the measurement (the advisor then fits the recorded verify times)."""
        with self._lock:
            if self.cost_model is not None:
                return self.cost_model
            g = self.generation
            longest = max((len(e.tokens) for e in g.events if isinstance(e, DraftProposed)), default=0)
            try:
                return measure_for_advice(self.ctx, g.history, g.knobs, longest, pending_in_cache=g.prefilled)
            finally:
                if g.prefilled:  # the measurement's batches replaced the row the first round reads
                    evaluate_prompt(self.ctx, g, self._prefill)

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
