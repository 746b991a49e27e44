"""The common machinery of drafters that draft from the target's own hidden states (``eagle3``, ``mtp``).

Both keep a small llama.cpp context of their own whose positions hold *pairs*: a token and a state row
derived from the target's hidden state at the position before it. Writing ``s_p`` for the state the
target produced while evaluating position ``p`` (EAGLE-3: the head's encoder applied to three layer
inputs; MTP: the target's NextN output) and ``t_p`` for the token at ``p``:

* the pair of target position ``p`` is ``(t_{p+1}, s_p)``, stored at drafter position ``p + offset``
  (``offset`` 0 for EAGLE-3, 1 for MTP — llama.cpp's two conventions in ``common/speculative.cpp``);
  its output predicts ``t_{p+2}`` and its pre-norm output is the state of the next drafting step; MTP's
  position 0 holds ``(t_0, 0)`` (llama.cpp pairs the first token with its zero-initialised pending state);
* with the history ``t_0 … t_{L-1}`` (the target's cache holds ``0 … L-2``; ``t_{L-1}`` is pending),
  every pair up to ``p = L-3`` is written after each round, and ``s_{L-2}`` waits: its pair needs
  ``t_{L-1}``, and writing it is the first drafting step, whose output is the first draft token
  (upstream's "deferred boundary");
* drafting continues from the pre-norm output of each step (the drafter's own hidden state, not the
  target's); those pairs are removed after the round (a rollback of the drafter's context, reported);
* the verify batch gives the target's states of the committed positions, from which the pairs of the
  accepted tokens are written with the target's real states; after a draft tree (``tree_topk`` > 1,
  :mod:`specviz.strategies.hidden_state_tree`) those are its rows along the accepted path (row 0, then
  ``1 + node``), found by the committed tokens, and every branch's drafted pairs go as a chain's do.

Target states come from the verify batch the round has just evaluated. When the drafter cannot tell
that the target's last evaluation was that batch (a strategy switched in mid-generation, the cost
policy measuring the verify cost, a long prompt evaluated in several batches), it re-evaluates the
missing committed positions of the target with the states switched on (same tokens, same positions,
so the target's cache is unchanged up to the CPU kernels' batch-size rounding), which is exact but
costs one batch.

Feeding the drafter's model costs time every round (EAGLE-3: the encoder over the new positions' layer
inputs, then one decode of their pairs), whether or not the round drafts. A drafter whose
:attr:`HiddenStateDrafter.pause_when_plain` is set (``eagle3``) stops paying it in rounds drafted with a
limit of 0 (the ``cost`` policy kept them plain, or a cap left no room): from the second such round in a
row it *pauses*. (For one such round pausing would save nothing: the resume makes the two calls the
feeding would have made. And the last round of a generation, which the token budget leaves no draft,
stays fed.) A round whose draft came back empty (the head's confidence below ``draft_p_min``) pauses
after its first drafting step too: the pairs of its committed tokens would be written for nothing if the
next round is plain, and a resume after one round makes the same calls. While paused it writes no pairs
and encodes nothing; it keeps, from each verify batch, only the raw target rows of the committed
positions (:meth:`HiddenStateDrafter._features`: EAGLE-3's three layer inputs, a copy), at most
:attr:`HiddenStateDrafter.resume_window` positions. The target's layer capture stays on (recovering the
rows without it would take a re-evaluation of the target over the window) unless the policy has promised
more plain rounds than the window
(:meth:`~specviz.strategies.context_drafter.ContextDrafter.expect_plain`, the ``cost`` policy between its
probes): rows that far from the next draft would leave the window before it, so the capture is *held*
(:meth:`HiddenStateDrafter._hold_target`; EAGLE-3's capture shim then copies nothing,
which saves a plain decode about 1.4%, ``benchmarks/bench_eagle3.py``, and the round keeps no rows), and
it reads again for the last ``resume_window`` promised rounds. A resume after a promise kept is the same
as after any pause longer than the window (a restart from the window's rows); a round that asks for a
draft while the rows of the last position are missing (a promise broken by a change of policy or knobs)
resumes by re-evaluating the target, as below. The first round that asks for a draft again *resumes*: the
kept rows are encoded in one call and their pairs written in one batch, then drafting proceeds as usual.
A pause of at most ``resume_window`` positions leaves the drafter's context exactly as feeding every
round would have (same pairs at the same positions, from the same verify batches' rows; batched instead
of round by round, which on the CPU kernels can round differently in the last bits). After a longer pause
the drafter deliberately *restarts*: its context is cleared and holds, from then on, the pairs of the
window's positions and those after (at their true positions), not the earlier ones, which bounds the
resume to one window (llama.cpp appends to a sequence only at its next position, so a context cannot keep
its old pairs and skip the lost ones). ``restarts`` counts these, ``skipped_tokens`` the positions whose
pairs a restart left out. When the drafter cannot tell a paused round's target batch was the verify batch
(the cost policy measuring, a switch), it resumes by re-evaluating the target over the missing positions
(see below), at most a window of them, restarting in the same way when more are missing.

The time spent feeding (``feed_seconds`` / ``feed_tokens``) and resuming or catching up before a draft
(``resume_seconds``) is reported apart from drafting (:meth:`HiddenStateDrafter.take_upkeep`), so the
``cost`` policy can weigh what drafting costs beyond its draft steps.

Drafting draws from the drafter's distribution: greedy takes its first maximum; sampling draws from
``q`` (temperature, top-k and top-p applied as for the target), and ``q`` goes to the acceptor as the
draft distribution, so sampled decoding stays lossless. With a reduced draft vocabulary (EAGLE-3's
``d2t``) ``q`` is built over the ids the head can express, mapped to target ids — exactly the
distribution of llama.cpp's full-vocabulary row, whose other entries are ``-inf``.

Departure from llama.cpp: upstream drafts with a top-10 sampler and compares ``--spec-draft-p-min``
with the top candidate's probability among those ten; specviz uses the head's full softmax (as its
``draft`` strategy does), so the stop rule reads the head's real confidence.
"""

from __future__ import annotations

import base64
import json
import time
from collections import deque
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

from ..decoding.draft_tree import ROOT, DraftTree
from ..decoding.tempered import Dist
from ..errors import ContextError, KnobError, SnapshotError
from .base import DRAFT_ALTERNATIVES, Draft, DraftResources, Upkeep
from .context_drafter import ContextDrafter
from .draft_choice import choose_token, top_candidates
from .hidden_state_tree import Expander, TreeSettings, grow_tree
from .target_replay import reevaluate


class HiddenStateDrafter(ContextDrafter):
    """Base of ``eagle3`` and ``mtp``: pair bookkeeping, drafting steps, rollbacks, catch-up, snapshots.

    Subclasses set :attr:`dctx` (an object with ``decode``/``logits``/``prenorm``/``truncate``/
    ``kv_len``/``clear``/``state``/``load_state``/``close``, e.g.
    :class:`~specviz.backends.eagle3.Eagle3Context`), :attr:`vocab_ids` (the target ids the drafter can
    propose, ascending, or None for all) and implement :meth:`_states` (or :meth:`_features` and
    :meth:`_encode`, whose composition it is) and :meth:`_release_target`.
    """

    needs_model = True
    reads_target = True
    #: Drafter position of the pair of target position p is p + PAIR_OFFSET.
    PAIR_OFFSET: ClassVar[int] = 0
    #: (``PAIR_OFFSET`` 1) Position 0 holds the first token paired with a zero state, as llama.cpp's MTP
    #: writes it (its pending state starts as zeros): every later step attends to it.
    LEADING_PAIR: ClassVar[bool] = False
    #: Pause feeding the drafter's model in rounds drafted with a limit of 0 (see the module docstring).
    PAUSES_WHEN_PLAIN: ClassVar[bool] = False
    #: Most positions whose target rows a paused drafter keeps to resume from. 16: a pause between the
    #: cost policy's probes lasts 16 to 64 rounds, and re-feeding 64 positions cost Gemma 3 270M's plain
    #: decoding several per cent here (about 0.1 s a resume with the trained head's shape, on a loaded
    #: 2-core machine, every 64 rounds of 22 ms of CPU), 16 a quarter of that; a longer pause restarts.
    RESUME_WINDOW: ClassVar[int] = 16

    def __init__(self, resources: DraftResources, **knobs: Any) -> None:
        super().__init__(**knobs)
        self.res = resources
        self.target_ctx = resources.target_ctx
        self.n_vocab = resources.target.n_vocab
        self.dctx: Any = None
        self.vocab_ids: np.ndarray | None = None
        self._vocab_set: frozenset[int] | None = None  # vocab_ids as a set, made on first use
        self._n_pairs = 0  # pairs written for target positions 0 .. _n_pairs - 1
        self._pending_start = 0  # target position of the first state row waiting for its pair
        self._pending = np.zeros((0, 0), dtype=np.float32)
        self._hist_len = 0  # history length at the last begin / sync
        self._dirty = True  # the pairs and states must be rebuilt from the target
        self._eval_mark = -1  # target eval_count when the next eval is the verify batch
        self._init_evals = self.target_ctx.eval_count
        self._rollbacks: list[tuple[int, int]] = []
        self._last_draft: list[int] = []
        self._tree: DraftTree | None = None  # the last draft's tree, until the round's sync reads its rows
        self._round_start = 0
        self.model_seconds = 0.0
        self.model_tokens = 0
        self.catch_up_tokens = 0  # target positions re-evaluated to recover states
        self._paused = False  # not feeding the model: the rows of positions since are kept in _kept
        self._plain_run = 0  # draft() calls in a row with a limit of 0
        self._declined = False  # the last _draft() proposed nothing: its sync pauses
        self._quiet: int | None = None  # the plain rounds the policy promised after this one (expect_plain)
        self._held = False  # this round's target batch is not read (see _hold_target)
        #: Whether a paused drafter holds the target's capture in rounds the policy's promise puts more than a
        #: window before the next draft (False reads every batch: the reference bench_eagle3 and the tests
        #: compare with).
        self.hold_when_promised = True
        self.held_rounds = 0  # rounds whose target batch was not read while paused
        #: Whether rounds drafted with a limit of 0 pause the feeding (``PAUSES_WHEN_PLAIN``; False feeds
        #: every round: the reference the tests compare a resume with).
        self.pause_when_plain = self.PAUSES_WHEN_PLAIN
        self._resume_window = self.RESUME_WINDOW
        self._kept: deque[np.ndarray] = deque(maxlen=self.resume_window)
        self._kept_end = 0  # target position after the newest kept row
        self.feed_seconds = 0.0  # sync's encoding and pair writing, paused rounds' row keeping included
        self.feed_tokens = 0  # pairs written by sync
        self.resume_seconds = 0.0  # bringing the model up to date inside draft() (resume, catch-up)
        self.pauses = 0
        self.resumes = 0
        self.restarts = 0  # resumes that cleared the context (a pause longer than the window)
        self.skipped_tokens = 0  # positions those restarts left without a pair
        self._upkeep_mark = (0.0, 0, 0.0)  # feed_seconds, feed_tokens, resume_seconds at the last take
        self.coverage = {"committed": 0, "expressible": 0, "rejections": 0, "rejections_expressible": 0}

    # -- to implement ------------------------------------------------------------------------------
    def _states(self, n_rows: int) -> np.ndarray:
        """State rows ``[n_rows, width]`` for the first ``n_rows`` rows of the target's last evaluation."""
        raise NotImplementedError

    def _release_target(self) -> None:
        """Switch the target context's extra outputs off again."""

    def _features(self, n_rows: int) -> np.ndarray:
        """The raw target rows behind :meth:`_states` (EAGLE-3: the layer inputs, before the encoder), a
        copy; what a paused drafter keeps. By default the states themselves."""
        return self._states(n_rows)

    def _encode(self, rows: np.ndarray) -> np.ndarray:
        """States from :meth:`_features` rows (by default the rows themselves)."""
        return rows

    def _hold_target(self, held: bool) -> bool:
        """Stop (``held``) or resume reading the target's rows from the next batch on; returns whether they
        are now not read. By default they always are (False)."""
        return False

    # -- helpers -----------------------------------------------------------------------------------
    def _drafter_kv(self) -> int:
        return int(self.dctx.kv_len())

    def _set_pending(self, start: int, rows: np.ndarray) -> None:
        self._pending_start, self._pending = start, np.ascontiguousarray(rows, dtype=np.float32)

    def _state_of(self, p: int) -> np.ndarray:
        i = p - self._pending_start
        if not 0 <= i < self._pending.shape[0]:
            raise ContextError(
                f"internal: no target state for position {p} (have {self._pending_start}.."
                f"{self._pending_start + self._pending.shape[0] - 1})"
            )
        return self._pending[i]

    def _write_pairs(self, history: Sequence[int], upto: int) -> None:
        """Write the pairs of target positions ``_n_pairs … upto`` (their states must be pending)."""
        if upto < self._n_pairs:
            return
        nb = self.res.n_batch
        p0 = self._n_pairs
        if self.LEADING_PAIR and p0 == 0 and len(history) > 0 and self._drafter_kv() == 0:
            self.dctx.decode([int(history[0])], np.zeros((1, self.dctx.n_embd), dtype=np.float32), 0)
        for a in range(p0, upto + 1, nb):
            b = min(upto, a + nb - 1)
            toks = [int(history[p + 1]) for p in range(a, b + 1)]
            g = np.stack([self._state_of(p) for p in range(a, b + 1)])
            self.dctx.decode(toks, g, a + self.PAIR_OFFSET)
        self._n_pairs = upto + 1
        keep = self._n_pairs - self._pending_start
        if keep > 0:
            self._set_pending(self._n_pairs, self._pending[keep:])

    def _catch_up(self, history: Sequence[int]) -> None:
        """Re-evaluate the target's committed positions whose states are missing (see the module docstring)."""
        start = self._n_pairs
        rows = reevaluate(self.target_ctx, history, start, self._states, what="hidden-state")
        if rows.shape[0]:
            self.catch_up_tokens += rows.shape[0]
            self._set_pending(start, rows)
        self._dirty = False

    def _complete(self, history: Sequence[int]) -> None:
        """Write every pair up to ``L - 3`` (``L = len(history)``), catching up first when needed."""
        if self._dirty:
            self._catch_up(history)
        self._write_pairs(history, len(history) - 3)
        self._hist_len = len(history)
        self._eval_mark = self.target_ctx.eval_count

    # -- the interface -----------------------------------------------------------------------------
    def _begin(self, history: Sequence[int]) -> None:
        self.dctx.clear()
        self._n_pairs = 0
        self._set_pending(0, np.zeros((0, 0), dtype=np.float32))
        self._rollbacks = []
        self._last_draft = []
        self._paused = False
        self._plain_run = 0
        self._kept.clear()
        n_committed = len(history) - 1
        tgt = self.target_ctx
        # cheap path: the session has just evaluated the prompt in one batch with our outputs switched on
        if (
            0 < n_committed <= tgt.capacity.n_batch
            and tgt.eval_count == self._init_evals + 1
            and tgt.kv_len() == n_committed
        ):
            self._set_pending(0, self._states(n_committed))
            self._dirty = False
            self._complete(history)
        else:
            self._dirty = True
            self._hist_len = len(history)

    @property
    def resume_window(self) -> int:
        """Most positions kept while paused (``RESUME_WINDOW`` unless set otherwise before a pause); at least
        1, the row of the last position, which the first draft step after a resume needs."""
        return self._resume_window

    @resume_window.setter
    def resume_window(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise KnobError(
                f"resume_window must be a whole number of positions, at least 1 (got {n!r})",
                knob="resume_window",
                value=n,
            )
        self._resume_window = n

    def expect_plain(self, rounds: int | None) -> None:
        """The policy's promise for this round (see
        :meth:`~specviz.strategies.context_drafter.ContextDrafter.expect_plain`): while paused, the target's
        rows are not read in rounds more than ``resume_window`` before its end."""
        self._quiet = rounds

    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        """Propose up to ``n_max`` tokens; a second limit of 0 in a row pauses the feeding (see
        :attr:`pause_when_plain` and the module docstring)."""
        self._tree = None
        self._plain_run = self._plain_run + 1 if n_max <= 0 else 0
        if self._plain_run >= 2 and self.pause_when_plain and not self._paused:
            self._pause()
        # this round's row (it commits one position) is among the window's last rows before the next draft
        # only when fewer than a window of promised plain rounds follow it
        quiet, self._quiet = self._quiet, None
        far = self.hold_when_promised and self._paused and n_max <= 0 and (quiet or 0) >= self.resume_window
        self._held = self._hold_target(far) if far or self._held else False
        if self._held:
            self.held_rounds += 1
        return super().draft(history, n_max)

    def _pause(self) -> None:
        """Stop feeding the model from this round on; the next draft with a limit resumes."""
        self._paused = True
        self._kept = deque(maxlen=self.resume_window)
        self._kept_end = self._pending_start + self._pending.shape[0]
        self.pauses += 1

    def _resume(self, history: Sequence[int]) -> None:
        """Bring a paused drafter's pending states up to date (the pairs are written by :meth:`_complete`)."""
        self._paused = False
        self.resumes += 1
        missing = not self._kept and self._kept_end > self._pending_start + self._pending.shape[0]
        if self._dirty or missing:
            # the rows of the paused rounds are unknown (or, after a held round, not read): re-evaluate at most
            # the window's positions
            self._dirty = True
            self._restart_at(max(self._n_pairs, len(history) - 1 - self.resume_window))
            return
        kept_start = self._kept_end - len(self._kept)
        if kept_start > self._pending_start + self._pending.shape[0]:  # the window lost the pause's start
            self._restart_at(kept_start)
        if self._kept:
            states = self._encode(np.stack(list(self._kept)))
            if self._pending.shape[0]:
                self._set_pending(self._pending_start, np.concatenate([self._pending, states]))
            else:
                self._set_pending(kept_start, states)
        self._kept.clear()

    def _restart_at(self, start: int) -> None:
        """(A pause longer than the window) Clear the model's context; its next pair is that of target
        position ``start``, and positions ``_n_pairs … start - 1`` get none."""
        if start > self._n_pairs:
            self.skipped_tokens += start - self._n_pairs
            self.restarts += 1
            self.dctx.clear()
            self._n_pairs = start
            self._set_pending(start, np.zeros((0, 0), dtype=np.float32))

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        L = len(history)
        if L < 2:
            return Draft(reason="no-state")
        if self._paused or self._dirty or self._hist_len != L or self._n_pairs != L - 2:
            t_up = time.perf_counter()
            self._rollbacks.extend(self._drop_speculative())
            if self._paused:
                self._resume(history)
            self._complete(history)
            self.resume_seconds += time.perf_counter() - t_up
        t0 = time.perf_counter()
        p_min = self.config.get("draft_p_min", 0.0)
        pos = L - 2 + self.PAIR_OFFSET
        self.dctx.decode([int(history[-1])], self._state_of(L - 2)[None, :], pos, outputs=[0])
        self._n_pairs = L - 1  # the pair of L-2 is true (target state, committed token): it stays
        self._set_pending(L - 1, self._pending[1:])
        if int(self.config.get("tree_topk", 1)) > 1:
            return self._draft_tree(pos, n_max, p_min, t0)
        toks: list[int] = []
        probs: list[float | None] = []
        dists: list[Dist] = []
        alternatives: list[list[int]] = []
        reason = None
        for i in range(n_max):
            tok, p, top, q = choose_token(
                self.dctx.logits(0), self.res.sampling, self.res.rng, self.vocab_ids, self.n_vocab
            )
            if top < p_min:
                reason = "p-min"
                break
            toks.append(tok)
            probs.append(p)
            # read before the next step's decode overwrites the row
            alternatives.append(top_candidates(self.dctx.logits(0), self.vocab_ids, DRAFT_ALTERNATIVES))
            if q is not None:
                dists.append(q)
            if i + 1 < n_max:
                h = self.dctx.prenorm(0)
                self.dctx.decode([tok], h[None, :], pos + 1 + i, outputs=[0])
        self.model_seconds += time.perf_counter() - t0
        self.model_tokens += len(toks)
        self._last_draft = toks
        self._declined = not toks
        return Draft(
            tokens=toks,
            probs=probs,
            reason=reason,
            dists=dists if not self.res.sampling.greedy else None,
            alternatives=alternatives,
        )

    def _draft_tree(self, pos: int, n_max: int, p_min: float, t0: float) -> Draft:
        """Draft a tree (:mod:`~specviz.strategies.hidden_state_tree`) after the root's pair, just decoded at
        ``pos``; the draft's chain is its branch 0."""
        settings = TreeSettings(
            int(self.config["tree_topk"]),
            int(self.config["tree_depth"]),
            min(int(self.config["tree_nodes"]), n_max),
            p_min,
        )
        expander = Expander(self.res.sampling, self.res.rng, self.vocab_ids, self.n_vocab)
        got = grow_tree(self.dctx, pos, settings, expander)
        tree = got.tree
        self.model_seconds += time.perf_counter() - t0
        self.model_tokens += len(tree) if tree is not None else 0  # tokens drafted, as a chain counts them
        main = tree.branches[0] if tree is not None else []
        self._tree = tree
        self._last_draft = [tree.tokens[i] for i in main] if tree is not None else []
        self._declined = tree is None
        dists = None if tree is None or tree.dists is None else [tree.dists[tree.parents[i]] for i in main]
        return Draft(
            tokens=list(self._last_draft),
            probs=[tree.probs[i] for i in main] if tree is not None else [],
            reason=got.reason,
            dists=dists,
            alternatives=got.alternatives,
            tree=tree if tree is not None and not tree.is_chain else None,
        )

    def _committed_rows(self, history: Sequence[int], L_old: int, L: int) -> list[int] | None:
        """The verify batch's rows of the committed positions ``L_old - 1 … L - 2`` where the last draft was a
        tree: row 0 (the pending token), then ``1 + node`` along the accepted path, found by the committed
        tokens (siblings differ). None: the rows are ``0 … L - L_old - 1``, as after a chain; ``[]``: the tree
        does not hold the committed path (never after a round that verified it). Sets the drafter's last draft to
        the branch that was kept."""
        tree, self._tree = self._tree, None
        if tree is None:
            return None
        rows, node = [0], ROOT
        for t in history[L_old : L - 1]:
            node = next((c for c in tree.children(node) if tree.tokens[c] == int(t)), -2)
            if node == -2:
                return []
            rows.append(1 + node)
        kept = tree.branches[tree.branch_through(node)]
        self._last_draft = [tree.tokens[i] for i in kept]
        return rows

    def _committed_features(self, history: Sequence[int], L_old: int, L: int) -> np.ndarray | None:
        """:meth:`_features` of the committed positions' rows of the verify batch (:meth:`_committed_rows`); None
        where they are unknown (the drafter then catches up from the target, exactly)."""
        rows = self._committed_rows(history, L_old, L)
        if rows is None:
            return self._features(L - L_old)
        return self._features(max(rows) + 1)[rows] if rows else None

    def _drop_speculative(self) -> list[tuple[int, int]]:
        """Remove the pairs drafting wrote past the true ones (a tree's other branches too); the rollback as
        ``(from, to)``."""
        drop = getattr(self.dctx, "drop_branches", None)
        if drop is not None:
            drop()
        kv = self._drafter_kv()
        keep = self._n_pairs + self.PAIR_OFFSET
        if kv > keep:
            self.dctx.truncate(keep)
            return [(kv, keep)]
        return []

    def sync(self, history: Sequence[int]) -> list[tuple[int, int]]:
        """After a round: drop the drafted pairs, take the committed positions' states from the verify
        batch (or catch up), write their pairs; returns the drafter context's rollbacks since the last call.
        A paused drafter only keeps the verify batch's rows of the committed positions (see the module
        docstring)."""
        t_feed = time.perf_counter()
        if self._declined and self.pause_when_plain and not self._paused:
            self._pause()
        self._declined = False
        self._rollbacks.extend(self._drop_speculative())
        L_old, L = self._hist_len, len(history)
        self._count_coverage(history, L_old)
        self._round_start = L_old
        if self._paused:
            self._keep_rows(history, L_old, L)
        else:
            self.feed_tokens += max(0, L - L_old)
            if not self._dirty:
                verified = self.target_ctx.eval_count == self._eval_mark + 1
                if L > L_old and verified and L_old >= 1:
                    # rows 0 … L-L_old-1 of the verify batch (a tree's along its accepted path) are target
                    # positions L_old-1 … L-2
                    feats = self._committed_features(history, L_old, L)
                    have = self._pending
                    if feats is None or (have.shape[0] and self._pending_start + have.shape[0] != L_old - 1):
                        self._dirty = True
                    else:
                        rows = self._encode(feats)
                        start = L_old - 1 if not have.shape[0] else self._pending_start
                        self._set_pending(start, np.concatenate([have, rows]) if have.shape[0] else rows)
                elif L != L_old or not verified:
                    self._dirty = True
            if self._dirty and self._n_pairs > len(history) - 2:
                self._n_pairs = max(0, len(history) - 2)
                self.dctx.truncate(self._n_pairs + self.PAIR_OFFSET)
            self._complete(history)
        self._tree = None
        self.feed_seconds += time.perf_counter() - t_feed
        out, self._rollbacks = self._rollbacks, []
        return out

    def _keep_rows(self, history: Sequence[int], L_old: int, L: int) -> None:
        """(Paused) Keep the verify batch's rows of the committed positions ``L_old - 1 … L - 2``; a held
        round read none, and the rows kept before it are too far from the next draft to be of use."""
        if not self._dirty:
            verified = self.target_ctx.eval_count == self._eval_mark + 1
            if L > L_old >= 1 and verified and self._held:
                self._kept.clear()
                self._kept_end = L - 1
            elif (
                L > L_old >= 1
                and verified
                and self._kept_end == L_old - 1
                and (feats := self._committed_features(history, L_old, L)) is not None
            ):
                for row in feats:
                    self._kept.append(row)
                self._kept_end = L - 1
            elif L != L_old or not verified:
                self._dirty = True
                self._kept.clear()
        if self._dirty and self._n_pairs > L - 2:
            self._n_pairs = max(0, L - 2)
            self.dctx.truncate(self._n_pairs + self.PAIR_OFFSET)
        self._hist_len = L
        self._eval_mark = self.target_ctx.eval_count

    def take_upkeep(self) -> Upkeep:
        """Feeding and resume time since the last call (see :class:`~specviz.strategies.base.Upkeep`)."""
        fs, ft, rs = self._upkeep_mark
        self._upkeep_mark = (self.feed_seconds, self.feed_tokens, self.resume_seconds)
        return Upkeep(
            seconds=self.feed_seconds - fs,
            tokens=self.feed_tokens - ft,
            in_draft=self.resume_seconds - rs,
            paused=self._paused,
        )

    @property
    def paused(self) -> bool:
        """Whether the drafter is not feeding its model now (see the module docstring)."""
        return self._paused

    def _count_coverage(self, history: Sequence[int], since: int) -> None:
        """How many committed tokens the drafter's vocabulary could express."""
        if self.vocab_ids is None or since < 1:
            return
        new = history[since:]
        if len(new):
            self.coverage["committed"] += len(new)
            self.coverage["expressible"] += self._n_expressible(new)

    def _n_expressible(self, tokens: Iterable[int]) -> int:
        """How many of ``tokens`` the drafter's vocabulary holds: a look-up each in a set of :attr:`vocab_ids`
        (made on first use). A round commits a few tokens, and numpy's per-call costs were most of the
        work: its ``isin`` sorted both arrays every round (about 1 ms with an 8k-token draft vocabulary), a
        binary search with ``searchsorted`` still took 80 µs a round right after a decode, paid even by rounds
        that feed nothing (a paused EAGLE-3 head)."""
        ids = self.vocab_ids
        if ids is None:
            return 0
        if self._vocab_set is None:
            self._vocab_set = frozenset(ids.tolist())
        held = self._vocab_set
        return sum(1 for t in tokens if int(t) in held)

    def _accept(self, n_accepted: int, history: Sequence[int]) -> None:
        # a rejection: could the drafter have expressed the token the target chose instead? (a draft the
        # round cut to suit the verify tile can end accepted, the target's next token then its own draft's)
        d, at = self._last_draft, self._round_start + n_accepted
        if self.vocab_ids is not None and n_accepted < len(d) and at < len(history) and history[at] != d[n_accepted]:
            self.coverage["rejections"] += 1
            self.coverage["rejections_expressible"] += self._n_expressible((history[at],))
        self._last_draft = []

    def kv_length(self) -> int:
        """Positions the drafter's context holds."""
        return self._drafter_kv()

    def extra_telemetry(self) -> dict[str, Any]:
        """The drafter's model time, its cache length, catch-up work and vocabulary coverage."""
        c = self.coverage
        d: dict[str, Any] = {
            "draft_model": str(self.res.model.path) if self.res.model is not None else None,
            "draft_model_seconds": self.model_seconds,
            "draft_model_tokens": self.model_tokens,
            "draft_model_tokens_per_second": self.model_tokens / self.model_seconds if self.model_seconds else 0.0,
            "draft_kv": self.kv_length(),
            "catch_up_tokens": self.catch_up_tokens,
            "upkeep": {
                "feed_seconds": self.feed_seconds,
                "feed_tokens": self.feed_tokens,
                "resume_seconds": self.resume_seconds,
                "paused": self._paused,
                "pauses": self.pauses,
                "resumes": self.resumes,
                "restarts": self.restarts,
                "skipped_tokens": self.skipped_tokens,
                "held_rounds": self.held_rounds,
            },
        }
        if self.vocab_ids is not None:
            d["vocab_coverage"] = {
                "draft_vocab": int(self.vocab_ids.shape[0]),
                "target_vocab": int(self.n_vocab),
                "vocab_share": float(self.vocab_ids.shape[0]) / self.n_vocab,
                "committed": c["committed"],
                "expressible": c["expressible"],
                "committed_share": c["expressible"] / c["committed"] if c["committed"] else None,
                "rejections": c["rejections"],
                "rejections_expressible": c["rejections_expressible"],
                "rejection_share": c["rejections_expressible"] / c["rejections"] if c["rejections"] else None,
            }
        return d

    def _export_state(self) -> dict[str, Any]:
        return {
            "coverage": dict(self.coverage),
            "catch_up_tokens": self.catch_up_tokens,
            "pauses": self.pauses,
            "resumes": self.resumes,
            "restarts": self.restarts,
            "skipped_tokens": self.skipped_tokens,
            "held_rounds": self.held_rounds,
        }

    def _import_state(self, d: dict[str, Any]) -> None:
        cov = d.get("coverage", {})
        self.coverage = {k: int(cov.get(k, 0)) for k in self.coverage}
        self.catch_up_tokens = int(d.get("catch_up_tokens", 0))
        self.pauses = int(d.get("pauses", 0))
        self.resumes = int(d.get("resumes", 0))
        self.restarts = int(d.get("restarts", 0))
        self.skipped_tokens = int(d.get("skipped_tokens", 0))
        self.held_rounds = int(d.get("held_rounds", 0))

    def context_state(self) -> bytes:
        """The drafter's context, its pair count, the states waiting for their pairs and, while paused, the
        rows kept to resume from (for snapshots)."""
        if self._dirty:  # nothing worth saving: the restored drafter catches up from the target
            return json.dumps({"dirty": True}).encode()
        head: dict[str, Any] = {
            "dirty": False,
            "n_pairs": self._n_pairs,
            "hist_len": self._hist_len,
            "pending_start": self._pending_start,
            "pending_shape": list(self._pending.shape),
            "pending": base64.b64encode(self._pending.astype("<f4").tobytes()).decode(),
        }
        if self._paused:
            kept = np.stack(list(self._kept)) if self._kept else np.zeros((0, 0), dtype=np.float32)
            head["paused"] = {
                "window": self.resume_window,
                "kept_end": self._kept_end,
                "kept_shape": list(kept.shape),
                "kept": base64.b64encode(kept.astype("<f4").tobytes()).decode(),
            }
        head["plain_run"] = self._plain_run
        hb = json.dumps(head).encode()
        return len(hb).to_bytes(8, "little") + hb + self.dctx.state()

    def load_context_state(self, blob: bytes) -> None:
        """Restore :meth:`context_state` (a malformed blob raises SnapshotError and changes nothing)."""
        if blob.startswith(b"{"):
            self._dirty = True
            return
        paused: dict[str, Any] | None = None
        kept_rows: np.ndarray = np.zeros((0, 0), dtype=np.float32)
        window, kept_end = self.RESUME_WINDOW, 0
        try:
            n = int.from_bytes(blob[:8], "little")
            head = json.loads(blob[8 : 8 + n])
            shape = tuple(int(x) for x in head["pending_shape"])
            rows = np.frombuffer(base64.b64decode(head["pending"]), dtype="<f4").reshape(shape).astype(np.float32)
            n_pairs, hist_len, start = int(head["n_pairs"]), int(head["hist_len"]), int(head["pending_start"])
            paused = head.get("paused")
            plain_run = int(head.get("plain_run", 0))
            if paused is not None:
                kshape = tuple(int(x) for x in paused["kept_shape"])
                kept_rows = np.frombuffer(base64.b64decode(paused["kept"]), dtype="<f4").reshape(kshape)
                window, kept_end = int(paused["window"]), int(paused["kept_end"])
                if len(kshape) != 2 or window < 1 or kshape[0] > window or kept_end > hist_len:
                    raise ValueError(f"kept rows {kshape}, window {window}, ending at {kept_end}")
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"the {self.name} drafter's state is malformed ({exc})") from None
        if not 0 <= n_pairs <= hist_len or start != n_pairs:
            raise SnapshotError(
                f"the {self.name} drafter's state is inconsistent (pairs {n_pairs}, history {hist_len})"
            )
        self.dctx.load_state(blob[8 + n :])
        self._n_pairs, self._hist_len = n_pairs, hist_len
        self._set_pending(start, rows)
        self._paused = paused is not None
        self._plain_run = plain_run
        if paused is not None:
            self.resume_window = window
            self._kept = deque((r.astype(np.float32) for r in kept_rows), maxlen=window)
            self._kept_end = kept_end
        self._dirty = False
        self._rollbacks = []
        self._eval_mark = self.target_ctx.eval_count

    def close(self) -> None:
        """Free the drafter's context and switch the target's extra outputs off."""
        try:
            self._release_target()
        finally:
            if self.dctx is not None:
                self.dctx.close()
