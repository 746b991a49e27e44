"""The stepping decoder: one speculative round per :meth:`Session.step`, published as events.

A round: the drafter proposes up to ``limit`` tokens → the target scores ``[last token] + draft`` in one
batch → the acceptor keeps the longest matching prefix plus the target's own next token → the rejected
tail is removed from the KV cache. The newest committed token is *pending*: it is not in the cache yet
and is the first row of the next batch, so after every round the cache holds exactly
``len(tokens) - 1`` positions (:attr:`Session.kv_length` reads it back from llama.cpp).

Nothing here imports a UI library; front-ends subscribe to the event stream.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import verify
from .backends.llama import LlamaContext, LlamaModel
from .config import Knob
from .errors import ContextError, KnobError, SessionStateError, SnapshotError
from .events import (Accepted, Alternative, DraftProposed, Event, Finished, KnobsChanged, KVRollback,
                     Rejected, Round, SessionStarted, Telemetry as TelemetryEvent, Verified)
from .models import resolve_model
from .policy import VerifyCostModel, make_policy, tile_aligned
from .sampling import SamplingParams, speculative_sample
from .strategies import make_drafter, strategy_class, strategy_names, strategy_schema
from .telemetry import Telemetry

_MAGIC = b"SPECVIZ-SNAPSHOT-1\n"
N_ALTERNATIVES = 5


class Session:
    """Runs a target model (and optionally a draft model) one speculative round at a time.

    ``model`` is a GGUF path, an already loaded :class:`~specviz.backends.LlamaModel`, or ``None`` for
    the embedded Gemma 3 270M. The context is created once and reused by every :meth:`start`.
    """

    def __init__(self, model: str | os.PathLike | LlamaModel | None = None, *, n_ctx: int = 4096,
                 n_batch: int = 512, n_ubatch: int = 512, n_threads: int | None = None) -> None:
        if isinstance(model, LlamaModel):
            self.model = model
        else:
            self.model = LlamaModel(resolve_model(model))
        self.ctx = LlamaContext(self.model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads)
        self._ctx_args = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=n_threads)
        self.ctx_threads = n_threads
        self._aux_models: dict[str, LlamaModel] = {}
        self._subscribers: list[Callable[[Event], None]] = []
        self._lock = threading.RLock()
        self._pending: tuple[str, dict[str, Any]] | None = None
        self._cancel = threading.Event()
        self.record_margins = False
        self.cost_model: VerifyCostModel | None = None  # measured once per session, on first use
        self._scratch = np.empty(self.model.n_vocab, dtype=np.float32)  # row-scan scratch buffer
        self._reset_state()

    # -- state ---------------------------------------------------------------------------------------
    def _reset_state(self) -> None:
        self.events: list[Event] = []
        self.history: list[int] = []
        self.n_prompt = 0
        self.max_tokens = 0
        self.temperature = 0.0
        self.sampling = SamplingParams()
        self.seed: int | None = None
        self.rng = np.random.default_rng(0)
        self.strategy = "none"
        self.knobs: dict[str, Any] = {}
        self.drafter = None
        self.round_index = 0
        self.finished: str | None = None
        self.started = False
        self.telemetry = Telemetry()
        self.margins: list = []
        self.policy = make_policy("fixed")

    @property
    def tokens(self) -> list[int]:
        """Generated token ids (prompt excluded)."""
        return self.history[self.n_prompt:]

    @property
    def prompt_tokens(self) -> list[int]:
        """Prompt token ids (BOS included when the model adds one)."""
        return self.history[: self.n_prompt]

    @property
    def text(self) -> str:
        """Generated text."""
        return self.model.detokenize(self.tokens)

    @property
    def kv_length(self) -> int:
        """Positions the target's cache really holds (read from llama.cpp)."""
        return self.ctx.kv_len()

    @property
    def committed(self) -> int:
        """Positions committed to the cache: every token but the pending newest one."""
        return max(len(self.history) - 1, 0)

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
        self.events.append(ev)
        if out is not None:
            out.append(ev)
        for cb in list(self._subscribers):
            cb(ev)

    # -- configuration -------------------------------------------------------------------------------
    def _validate(self, strategy: str, knobs: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
        schema = strategy_schema(strategy)
        carried = None
        if base is not None:
            names = set(schema.names())
            carried = {k: v for k, v in base.items() if k in names}
        cfg = schema.validate(knobs, base=carried)
        strategy_class(strategy).check(cfg)
        if cfg.get("draft_min", 0) > cfg.get("draft_max", 1):
            raise KnobError(f"knob 'draft_min': {cfg['draft_min']} is larger than draft_max={cfg['draft_max']}; "
                            "set draft_min <= draft_max", knob="draft_min", value=cfg["draft_min"])
        return cfg

    def configure(self, strategy: str | None = None, **knobs: Any) -> dict[str, Any]:
        """Change the strategy and/or knobs; validated now, applied at the next round boundary.

        Raises :class:`~specviz.errors.KnobError` (naming the knob, the value and the range) and changes
        nothing when a value is refused. Returns the configuration that will apply.
        """
        with self._lock:
            cur_strategy, cur_knobs = self._pending if self._pending else (self.strategy, self.knobs)
            target = strategy or cur_strategy
            cfg = self._validate(target, knobs, cur_knobs)
            self._pending = (target, cfg)
            return dict(cfg)

    def _apply_pending(self, out: list[Event]) -> None:
        if self._pending is None:
            return
        strategy, cfg = self._pending
        self._pending = None
        prev_s, prev_k = self.strategy, dict(self.knobs)
        if strategy != self.strategy:
            if self.drafter is not None:
                self.drafter.close()
            self.drafter = self._make_drafter(strategy, cfg)
            self.drafter.begin(self.history)
        else:
            own = {k.name for k in strategy_class(strategy).knobs}
            changed = {k: v for k, v in cfg.items() if k in own and self.knobs.get(k) != v}
            if changed:
                # a drafter's knobs can change the meaning of its state: rebuild it from the history
                self.drafter.close()
                self.drafter = self._make_drafter(strategy, cfg)
                self.drafter.begin(self.history)
        if cfg.get("draft_policy", "fixed") != self.knobs.get("draft_policy", "fixed"):
            self.policy = make_policy(cfg.get("draft_policy", "fixed"), self.cost_model)
        self.strategy, self.knobs = strategy, cfg
        if (prev_s, prev_k) != (strategy, cfg):
            self._emit(KnobsChanged(self.round_index, strategy=strategy, knobs=dict(cfg), previous_strategy=prev_s,
                                    previous_knobs=prev_k, schema=tuple(self.schema(strategy))), out)

    def _make_drafter(self, strategy: str, cfg: dict[str, Any]):
        if strategy_class(strategy).needs_model:
            return make_drafter(strategy, cfg, session=self)
        return make_drafter(strategy, cfg)

    def aux_model(self, path: str | os.PathLike) -> LlamaModel:
        """A second model (a draft), loaded once per session and checked against the target's vocabulary."""
        key = str(Path(path).resolve())
        m = self._aux_models.get(key)
        if m is None:
            from .vocab import check_vocab_compatible

            m = LlamaModel(path)
            try:
                check_vocab_compatible(self.model.ptr, m.ptr)
            except Exception:
                m.close()
                raise
            self._aux_models[key] = m
        return m

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self, prompt: str | list[int], max_tokens: int = 128, strategy: str = "prompt-lookup", *,
              temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
              **knobs: Any) -> SessionStarted:
        """Begin a new generation: validate everything, evaluate the prompt, publish ``SessionStarted``.

        ``prompt`` is text (tokenized with BOS) or a list of token ids. ``temperature`` 0 (the default)
        is greedy and exact; above 0 every strategy samples losslessly (rejection sampling, the target's
        distribution after ``top_k``/``top_p``) from a generator seeded with ``seed`` (a random seed is
        drawn and recorded when ``seed`` is None). Every argument is validated before anything changes;
        a refused call leaves the previous generation intact.
        """
        with self._lock:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1:
                raise KnobError(f"max_tokens: {max_tokens!r} is not allowed; expected an integer >= 1",
                                knob="max_tokens", value=max_tokens)
            if isinstance(temperature, str):
                temperature = Knob("temperature", float, 0.0, "", lo=0.0, hi=100.0).convert(temperature)
            sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
            temperature = sampling.temperature
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
                raise KnobError(f"seed: {seed!r} is not allowed; expected an integer >= 0 or None", knob="seed",
                                value=seed)
            cfg = self._validate(strategy, knobs, None)
            if isinstance(prompt, str):
                if not prompt:
                    raise KnobError("prompt: the prompt is empty; give at least one character of text",
                                    knob="prompt", value=prompt)
                ids = self.model.tokenize(prompt, add_special=True)
            else:
                ids = [int(t) for t in prompt]
                bad = [t for t in ids if not 0 <= t < self.model.n_vocab]
                if bad:
                    raise KnobError(f"prompt: token id {bad[0]} is outside the vocabulary [0, {self.model.n_vocab - 1}]",
                                    knob="prompt", value=bad[0])
            if not ids:
                raise KnobError("prompt: the prompt is empty; give at least one token of text", knob="prompt", value=prompt)
            n_ctx = self.ctx.capacity.n_ctx
            if len(ids) + 1 > n_ctx:
                raise ContextError(f"the prompt has {len(ids)} tokens but the context holds {n_ctx}; "
                                   "shorten the prompt or create the Session with a larger n_ctx")
            drafter = self._make_drafter(strategy, cfg)
            if self.drafter is not None:
                self.drafter.close()
            self._reset_state()
            self._pending = None
            self._cancel.clear()
            self.history = list(ids)
            self.n_prompt = len(ids)
            self.max_tokens = int(max_tokens)
            self.temperature = temperature
            self.sampling = sampling
            self.seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % (2**63))
            self.rng = np.random.default_rng(self.seed)
            self.strategy, self.knobs = strategy, cfg
            self.drafter = drafter
            self.policy = make_policy(cfg.get("draft_policy", "fixed"), self.cost_model)
            t0 = time.perf_counter()
            self.ctx.clear()
            self.ctx.eval_prompt(ids[:-1], 0)
            self.telemetry.prompt_seconds = time.perf_counter() - t0
            self.telemetry.prompt_tokens = len(ids)
            self.drafter.begin(self.history)
            self.started = True
            cap = self.ctx.capacity
            ev = SessionStarted(0, model=str(self.model.path), draft_model=self._draft_model_name(),
                                strategy=strategy, knobs=dict(cfg), prompt_tokens=tuple(ids),
                                prompt_pieces=tuple(self.model.pieces(ids)), max_tokens=self.max_tokens,
                                temperature=temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=self.seed, n_ctx=cap.n_ctx, n_batch=cap.n_batch,
                                n_ubatch=cap.n_ubatch, n_swa=cap.n_swa, n_vocab=self.model.n_vocab)
            self._emit(ev)
            return ev

    def _draft_model_name(self) -> str | None:
        return str(self.knobs.get("draft_model")) if self.strategy == "draft" else None

    def cancel(self) -> None:
        """Stop the generation: the current round completes, then the session finishes ``cancelled``."""
        self._cancel.set()

    def run(self, max_rounds: int | None = None) -> list[Round]:
        """Step until the generation finishes (or ``max_rounds`` rounds); returns the rounds run."""
        rounds = []
        while self.finished is None and (max_rounds is None or len(rounds) < max_rounds):
            rounds.append(self.step())
        return rounds

    def generate(self, prompt: str | list[int], max_tokens: int = 128, strategy: str = "prompt-lookup",
                 **kwargs: Any) -> str:
        """Convenience: :meth:`start` then :meth:`run`; returns the generated text."""
        self.start(prompt, max_tokens, strategy, **kwargs)
        self.run()
        return self.text

    # -- the round -----------------------------------------------------------------------------------
    def _limit(self) -> tuple[int, str | None, float | None]:
        """Draft length allowed this round, the cap that lowered it, and the policy's expected tokens."""
        if self.strategy == "none":
            return 0, None, None
        requested = int(self.knobs.get("draft_max", 0))
        align = bool(self.knobs.get("align", True))
        tile = self._verify_tile()
        draft_min = int(self.knobs.get("draft_min", 0))
        n, expected = self.policy.length(draft_min, requested, tile)
        limit, cap = n, ("policy" if n < requested else None)
        remaining = self.max_tokens - len(self.tokens)
        caps = [
            ("budget", remaining - 1),
            ("context", self.ctx.capacity.n_ctx - len(self.history)),
            ("batch", self.ctx.capacity.n_batch - 1),
        ]
        if align:
            caps.append(("ubatch", self.ctx.capacity.n_ubatch - 1))
        for name, v in caps:
            if v < limit:
                limit, cap = max(v, 0), name
        aligned = tile_aligned(limit, tile)
        if aligned < limit and aligned >= max(draft_min, 1):
            limit, cap = aligned, "tile"
        if expected is not None and limit < n:
            expected = self.policy.expected_tokens(limit)
        return limit, cap, expected

    def _verify_tile(self) -> int:
        """The verify tile in force: the ``verify_tile`` knob with alignment on, 1 (none) without."""
        return int(self.knobs.get("verify_tile", 1)) if self.knobs.get("align", True) else 1

    def _measure_cost(self) -> None:
        """Time verify batches of 1…k+1 tokens once per session (the cache is left unchanged)."""
        n_past = len(self.history) - 1
        cap = self.ctx.capacity
        max_b = min(cap.n_ubatch if self.knobs.get("align", True) else cap.n_batch,
                    int(self.knobs.get("draft_max", 16)) + 1, cap.n_ctx - n_past)
        max_b = max(max_b, 2)
        filler = self.history[-1]
        tile = self._verify_tile()

        def evaluate(b: int) -> None:
            self.ctx.eval([filler] * b, n_past, rows="all")
            self.ctx.truncate(n_past)

        self.cost_model = VerifyCostModel.measure(evaluate, max_b, tile=tile)

    def step(self) -> Round:
        """Run exactly one round (draft → one verify batch → accept → roll back) and return it."""
        with self._lock:
            if not self.started:
                raise SessionStateError("the session has not started; call start(prompt, ...) first")
            if self.finished is not None:
                raise SessionStateError(f"the generation has finished ({self.finished}); call start() to begin "
                                        "a new one")
            out: list[Event] = []
            self._apply_pending(out)
            if self._cancel.is_set():
                return self._finish("cancelled", out)
            if len(self.history) >= self.ctx.capacity.n_ctx:
                return self._finish("context", out)
            if self.strategy != "none" and self.knobs.get("draft_policy") == "cost" and self.cost_model is None:
                self._measure_cost()  # once per session, outside the round's timing
                self.policy.cost = self.cost_model
            self.round_index += 1
            r = self.round_index
            t_round = time.perf_counter()
            n_past = len(self.history) - 1
            requested = int(self.knobs.get("draft_max", 0)) if self.strategy != "none" else 0
            limit, cap, expected = self._limit()

            has_draft_ctx = hasattr(self.drafter, "kv_length")
            draft_kv_before = self.drafter.kv_length() if has_draft_ctx else None
            t0 = time.perf_counter()
            draft = self.drafter.draft(self.history, limit)
            draft_seconds = time.perf_counter() - t0
            draft_kv_peak = self.drafter.kv_length() if has_draft_ctx else None
            dtoks = [int(t) for t in draft.tokens]
            reason = draft.reason
            if dtoks and len(dtoks) < self.knobs.get("draft_min", 0):
                dtoks, reason = [], "below-min"
            dprobs = list(draft.probs[: len(dtoks)]) if draft.probs is not None else [None] * len(dtoks)
            # a round the policy kept plain: what would the drafter have proposed? (free evidence for it)
            shadow = self.drafter.peek(self.history) if limit == 0 and cap == "policy" else None
            self._emit(DraftProposed(r, tokens=tuple(dtoks), pieces=tuple(self.model.pieces(dtoks)),
                                     probs=tuple(dprobs), seconds=draft_seconds, requested=requested, limit=limit,
                                     cap=cap,
                                     reason=reason if len(dtoks) < limit else None, position=len(self.history),
                                     policy=str(self.knobs.get("draft_policy", "fixed")),
                                     expected_tokens=expected), out)

            # verify: one batch of the pending token plus the draft
            batch = [self.history[-1]] + dtoks
            t1 = time.perf_counter()
            try:
                self.ctx.eval(batch, n_past, rows="all")
            except ContextError:
                self.ctx.truncate(n_past)
                raise
            sampled = None
            if self.sampling.greedy:
                scan = verify.scan_greedy(self.ctx.row, dtoks, self._scratch)
                n_acc = scan.n_accepted
                targets = scan.target_tokens
            else:
                sampled = speculative_sample(dtoks, self.ctx.row, self.sampling, self.rng, draft.dists,
                                             top_n=N_ALTERNATIVES)
                n_acc = sampled.n_accepted
                targets = list(sampled.tokens)
            verify_seconds = time.perf_counter() - t1
            self.policy.observe_verify(len(batch), verify_seconds)
            kv_peak = n_past + len(batch)

            if sampled is None:
                tprobs = scan.probs()
            else:  # probabilities under the sampling distribution (temperature, top-k, top-p applied)
                tprobs = [v.p for v in sampled.positions[:n_acc]] + [sampled.final_prob]
            if self.record_margins:
                self.margins.extend(verify.top_two(self.ctx.row(i)) for i in range(len(targets)))
            self._emit(Verified(r, tokens=tuple(targets), pieces=tuple(self.model.pieces(targets)),
                                probs=tuple(tprobs), seconds=verify_seconds, batch_size=len(batch),
                                kv_before=n_past, kv_peak=kv_peak, draft_kv_before=draft_kv_before,
                                draft_kv_peak=draft_kv_peak), out)

            committed = dtoks[:n_acc] + [targets[n_acc]]
            bonus_kind = "plain" if not dtoks else ("bonus" if n_acc == len(dtoks) else "correction")
            finish = None
            for j, t in enumerate(committed):
                if self.model.is_eog(t):
                    committed = committed[:j]
                    finish = "eos"
                    break
            has_bonus = finish is None or len(committed) > n_acc
            n_acc_kept = min(n_acc, len(committed))
            position = len(self.history)
            alternatives = ()
            if n_acc < len(dtoks):
                if sampled is None:
                    sr = scan.rows[n_acc]
                    top = sr.top(N_ALTERNATIVES)
                    rejected_prob = sr.prob(dtoks[n_acc])
                else:
                    top = list(sampled.final_top)
                    rejected_prob = sampled.positions[n_acc].p
                alternatives = tuple(Alternative(int(t), self.model.piece(int(t)), float(p)).to_dict() for t, p in top)
            acc_ev = Accepted(r, tokens=tuple(committed), pieces=tuple(self.model.pieces(committed)),
                              n_accepted=n_acc_kept, draft_probs=tuple(dprobs[:n_acc_kept]),
                              target_probs=tuple(tprobs[:len(committed)]),
                              bonus_token=targets[n_acc] if has_bonus else None,
                              bonus_piece=self.model.piece(targets[n_acc]) if has_bonus else None,
                              bonus_prob=tprobs[n_acc] if has_bonus else None,
                              bonus_kind=bonus_kind if has_bonus else None, position=position)
            self._emit(acc_ev, out)
            if n_acc < len(dtoks):
                rej = dtoks[n_acc:]
                self._emit(Rejected(r, depth=n_acc, tokens=tuple(rej), pieces=tuple(self.model.pieces(rej)),
                                    draft_probs=tuple(dprobs[n_acc:]), target_token=targets[n_acc],
                                    target_piece=self.model.piece(targets[n_acc]), target_prob=tprobs[n_acc],
                                    draft_token_target_prob=rejected_prob, alternatives=alternatives,
                                    position=position + n_acc), out)

            # roll back: keep the pending token and the accepted prefix that was committed
            self.history.extend(committed)
            keep = len(self.history) - 1
            if kv_peak > keep:
                self.ctx.truncate(keep)
                self._emit(KVRollback(r, context="target", from_pos=kv_peak, to_pos=keep), out)
            self.drafter.after_round(self.history)
            for f, t in self.drafter.take_rollbacks():
                self._emit(KVRollback(r, context="draft", from_pos=f, to_pos=t), out)
            if dtoks:  # only verified drafts are reported back (a dropped draft was never tested)
                self.drafter.accept(n_acc_kept, self.history)
                self.policy.observe(len(dtoks), n_acc_kept, draft_seconds)
            elif shadow is not None and committed:
                self.policy.observe_shadow(shadow == committed[0])
            else:
                self.policy.observe_idle()
            if finish is None and len(self.tokens) >= self.max_tokens:
                finish = "max_tokens"
            round_seconds = time.perf_counter() - t_round
            self.telemetry.record_round(n_drafted=len(dtoks), n_accepted=n_acc_kept, n_committed=len(committed),
                                        draft_seconds=draft_seconds, verify_seconds=verify_seconds,
                                        round_seconds=round_seconds, draft_probs=dprobs,
                                        expected_tokens=expected)
            self._emit(TelemetryEvent(r, data=self.telemetry_dict()), out)
            if finish is not None:
                return self._finish(finish, out, new_tokens=committed)
            if self._cancel.is_set():
                return self._finish("cancelled", out, new_tokens=committed)
            return Round(r, tuple(out), tuple(committed), None)

    def _finish(self, reason: str, out: list[Event], new_tokens: list[int] | tuple = ()) -> Round:
        self.finished = reason
        self._emit(Finished(self.round_index, reason=reason, n_generated=len(self.tokens)), out)
        return Round(self.round_index, tuple(out), tuple(new_tokens), reason)

    def telemetry_dict(self) -> dict[str, Any]:
        """Telemetry as a dictionary, with the drafter's own statistics, the cache length and what the
        drafting policy is working from (``policy``: for ``cost``, acceptance by run position)."""
        d = self.telemetry.to_dict()
        d["strategy"] = self.strategy
        d["strategy_stats"] = self.drafter.stats.to_dict() if self.drafter is not None else {}
        if self.drafter is not None and hasattr(self.drafter, "stats_extra"):
            d.update(self.drafter.stats_extra())
        d["kv"] = self.committed
        d["policy"] = self.policy.describe()
        return d

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """The whole session state (cache, history, strategy, knobs, telemetry) in one checksummed envelope."""
        with self._lock:
            if not self.started:
                raise SessionStateError("nothing to snapshot: call start() first")
            state = self.ctx.state()
            header = {
                "version": 1,
                "model": str(self.model.path),
                "model_size": self.model.path.stat().st_size,
                "n_vocab": self.model.n_vocab,
                "ctx": dict(self._ctx_args),
                "history": self.history,
                "n_prompt": self.n_prompt,
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
                "sampling": self.sampling.to_dict(),
                "seed": self.seed,
                "rng": self.rng.bit_generator.state,
                "strategy": self.strategy,
                "knobs": self.knobs,
                "pending": list(self._pending) if self._pending else None,
                "round": self.round_index,
                "finished": self.finished,
                "telemetry": self.telemetry.state(),
                "drafter_state": self.drafter.state_dict() if hasattr(self.drafter, "state_dict") else None,
                "policy_state": self.policy.state(),
                "cost_model": self.cost_model.to_dict() if self.cost_model is not None else None,
                "blobs": {"target": len(state)},
            }
            dblob = self.drafter.state_blob() if hasattr(self.drafter, "state_blob") else b""
            header["blobs"]["drafter"] = len(dblob)
            hb = json.dumps(header, separators=(",", ":")).encode()
            body = _MAGIC + struct.pack("<Q", len(hb)) + hb + state + dblob
            return body + hashlib.sha256(body).digest()

    @staticmethod
    def _open_envelope(blob: bytes) -> tuple[dict[str, Any], bytes]:
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise SnapshotError("a snapshot must be the bytes returned by Session.snapshot()")
        blob = bytes(blob)
        if len(blob) < len(_MAGIC) + 8 + 32 or not blob.startswith(_MAGIC):
            raise SnapshotError("not a specviz snapshot (wrong header); pass the bytes returned by Session.snapshot()")
        body, digest = blob[:-32], blob[-32:]
        if hashlib.sha256(body).digest() != digest:
            raise SnapshotError("the snapshot is corrupted (checksum mismatch); it cannot be restored")
        (hlen,) = struct.unpack("<Q", body[len(_MAGIC):len(_MAGIC) + 8])
        start = len(_MAGIC) + 8
        try:
            header = json.loads(body[start:start + hlen])
        except ValueError:
            raise SnapshotError("the snapshot header is unreadable") from None
        return header, body[start + hlen:]

    @classmethod
    def restore(cls, blob: bytes, model: str | os.PathLike | LlamaModel | None = None, **kwargs: Any) -> "Session":
        """A new session continuing exactly where the snapshot was taken.

        ``model`` defaults to the path recorded in the snapshot; a model with another vocabulary size
        or file size is refused with :class:`~specviz.errors.SnapshotError`.
        """
        header, blobs = cls._open_envelope(blob)
        if model is None:
            model = header["model"]
        sess = cls(model, **{**header["ctx"], **kwargs})
        try:
            sess._load(header, blobs)
        except Exception:
            sess.close()
            raise
        return sess

    def restore_into(self, blob: bytes) -> None:
        """Restore a snapshot into this session (same model), replacing its current generation."""
        header, blobs = self._open_envelope(blob)
        self._load(header, blobs)

    def _load(self, header: dict[str, Any], blobs: bytes) -> None:
        if header.get("n_vocab") != self.model.n_vocab or header.get("model_size") != self.model.path.stat().st_size:
            raise SnapshotError(f"the snapshot was taken with model {header.get('model')} "
                                f"({header.get('n_vocab')} tokens); this session runs {self.model.path}")
        n = header["blobs"]["target"]
        nd = header["blobs"].get("drafter", 0)
        if len(blobs) < n + nd:
            raise SnapshotError("the snapshot is truncated (context state missing)")
        strategy, knobs = header["strategy"], header["knobs"]
        cfg = self._validate(strategy, knobs, None)
        drafter = self._make_drafter(strategy, cfg)
        with self._lock:
            self.ctx.load_state(blobs[:n])
            if self.drafter is not None:
                self.drafter.close()
            self._reset_state()
            self.history = [int(t) for t in header["history"]]
            self.n_prompt = int(header["n_prompt"])
            self.max_tokens = int(header["max_tokens"])
            self.temperature = float(header["temperature"])
            self.sampling = SamplingParams(**header.get("sampling", {"temperature": self.temperature}))
            self.seed = header["seed"]
            self.rng = np.random.default_rng(self.seed)
            if header.get("rng"):
                self.rng.bit_generator.state = header["rng"]
            self.strategy, self.knobs = strategy, cfg
            self._pending = tuple(header["pending"]) if header.get("pending") else None
            self.round_index = int(header["round"])
            self.finished = header["finished"]
            self.telemetry = Telemetry.from_state(header["telemetry"])
            self.drafter = drafter
            if header.get("cost_model"):
                cm = header["cost_model"]
                self.cost_model = VerifyCostModel(cm["sizes"], cm["seconds"])
            self.policy = make_policy(cfg.get("draft_policy", "fixed"), self.cost_model)
            self.policy.load(header.get("policy_state") or {})
            if nd and hasattr(self.drafter, "load_state_blob"):
                self.drafter.load_state_blob(blobs[n:n + nd])
            else:
                self.drafter.begin(self.history)
            if header.get("drafter_state") is not None and hasattr(self.drafter, "load_state_dict"):
                self.drafter.load_state_dict(header["drafter_state"])
            self.started = True
            if self.kv_length != self.committed:
                raise SnapshotError(f"the restored cache holds {self.kv_length} positions, expected {self.committed}")

    def close(self) -> None:
        """Free the contexts and the auxiliary (draft) models this session created."""
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
        for m in self._aux_models.values():
            m.close()
        self._aux_models.clear()
        self.ctx.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
