"""``draft``: a second, smaller GGUF drafts tokens one at a time (llama.cpp's ``draft-simple``).

The draft model gets its own llama.cpp context, fed the committed tokens and rolled back with the
target, with the same invariant as the target: after every round it holds every committed token but
the newest (pending) one. A draft model of recurrent or hybrid kind cannot drop its drafted tokens:
its context saves a partial state before drafting and restores it afterwards, re-applying the accepted
tokens, as llama.cpp's server does with a draft context that cannot remove a tail (``use_ckpt_dft``);
its context keeps no recurrent-state snapshots (``n_rs_seq = 0``, as the server sets for drafts), since
one-token draft steps could not use them. Drafting evaluates the pending token, then each drafted token, and stops at
the round's limit or when the draft's own top probability falls below ``draft_p_min``.

Greedy sessions draft the draft model's argmax. Each drafted position also records the draft's own top
:data:`~specviz.strategies.base.DRAFT_ALTERNATIVES` candidates (``Draft.alternatives``: what a draft tree
could have branched to there), one top-k on the row already read. Sampling sessions draft by sampling the draft
distribution ``q`` (temperature, top-k and top-p applied exactly as for the target) from the
generation's seeded generator, and hand ``q`` to the acceptor for ``min(1, p/q)`` rejection sampling.

Departure from llama.cpp: upstream's default ``--spec-draft-p-min`` is 0 (draft the full length); ours
is 0.75, so that a draft model on a CPU stops where it is unsure instead of paying for tokens the target
will likely reject.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from ..backends.llama import LlamaContext
from ..backends.memory import Cut, Mark
from ..decoding.rowscan import ScoredRow, top_ids
from ..decoding.sampling import sample
from ..decoding.tempered import Dist, tempered_or_dist
from ..errors import KnobError, SnapshotError, StrategyUnavailableError
from .base import DRAFT_ALTERNATIVES, Draft, DraftResources
from .context_drafter import ContextDrafter
from .knobs import DRAFT_MODEL_KNOB, DRAFT_P_MIN_KNOB, P_SPLIT_KNOB, TREE_WIDTH_KNOB
from .tree_drafting import Branch, collapse, draft_tree


def _check_draft_model(config: dict[str, Any]) -> None:
    """The draft model path must name an existing file."""
    path = config.get("draft_model") or ""
    if not path:
        raise KnobError(
            "knob 'draft_model': the draft strategy needs a draft model; pass draft_model=PATH (--draft-model PATH)",
            knob="draft_model",
            value=path,
        )
    if not Path(path).is_file():
        raise KnobError(
            f"knob 'draft_model': {path!r} does not exist; pass the path of a .gguf file",
            knob="draft_model",
            value=path,
        )


class DraftModelDrafter(ContextDrafter):
    """Draft with a second model that shares the target's vocabulary."""

    name = "draft"
    knob_rules = (_check_draft_model,)
    needs_model = True
    knobs = (DRAFT_MODEL_KNOB, DRAFT_P_MIN_KNOB, TREE_WIDTH_KNOB, P_SPLIT_KNOB)

    #: Draft GGUFs that are not whole models: they draft for a target through a strategy of their own.
    HEADS = {
        "eagle3": "an EAGLE-3 head; use the eagle3 strategy (--spec-type draft-eagle3)",
        "dflash": "a DFlash draft; use the dflash or dspark strategy (--spec-type draft-dflash / draft-dspark)",
    }

    @classmethod
    def check_models(cls, config: dict[str, Any], target_ctx: Any, model: Any) -> None:
        """Refuse a draft head (EAGLE-3, DFlash): it cannot decode tokens alone (llama.cpp refuses its context,
        or asserts on its first batch without the target's)."""
        arch = model.info.architecture if model is not None else None
        if arch in cls.HEADS:
            raise StrategyUnavailableError(
                f"draft cannot use {model.path.name}: it is {cls.HEADS[arch]}",
                knob="draft_model",
                value=str(model.path),
            )

    def __init__(self, resources: DraftResources, **knobs: Any) -> None:
        super().__init__(**knobs)
        self.res = resources
        self.model = resources.model
        self.ctx = LlamaContext(
            self.model,
            n_ctx=resources.n_ctx,
            n_batch=resources.n_batch,
            n_ubatch=resources.n_ubatch,
            n_threads=resources.n_threads,
            n_rs_seq=0,
            flash_attn=resources.flash_attn,
            # a tree's branches are sequences sharing their prefix's cells (seq_cp adds ids, copies nothing)
            n_seq_max=self.config["tree_width"],
            kv_unified=self.config["tree_width"] > 1,
        )
        self._cached: list[int] = []
        # a tree's branches the draft context holds past _cached, until the round's tokens are known
        self._branches: list[Branch] = []
        self._rollbacks: list[tuple[int, int]] = []
        self._memory_log: list[Mark | Cut] = []
        self.model_seconds = 0.0  # time in the draft model's decodes while drafting
        self.model_tokens = 0

    # -- cache bookkeeping -------------------------------------------------------------------------
    def _truncate_to_common_prefix(self, history: Sequence[int]) -> None:
        if self._branches:  # a tree round: keep the branch that holds the committed tokens, as sequence 0
            self._cached.extend(collapse(self.ctx, self._branches, len(self._cached), history))
            self._branches = []
        n = 0
        lim = min(len(self._cached), len(history))
        while n < lim and self._cached[n] == history[n]:
            n += 1
        if n < len(self._cached):
            cut = self.ctx.memory.cut(n, self._cached)
            if cut.path != "truncate":
                self._memory_log.append(cut)
            self._rollbacks.append((len(self._cached), n))
            del self._cached[n:]

    def _feed(self, tokens: Sequence[int], rows: str) -> None:
        nb = self.ctx.capacity.n_batch
        start = len(self._cached)
        for i in range(0, len(tokens), nb):
            chunk = list(tokens[i : i + nb])
            last = i + nb >= len(tokens)
            self.ctx.eval(chunk, start + i, rows=rows if last else "none")
        self._cached.extend(int(t) for t in tokens)

    def kv_length(self) -> int:
        """Positions the draft context really holds."""
        return self.ctx.kv_len()

    # -- drafter interface -------------------------------------------------------------------------
    def _begin(self, history: Sequence[int]) -> None:
        # keep what the context already holds of history[:-1] (a rewind cuts the history: the cache is cut
        # to the common prefix, whose keys are the ones the earlier rounds computed), feed the rest
        self._truncate_to_common_prefix(history[:-1])
        self._rollbacks = []
        self._feed(history[len(self._cached) : -1], rows="none")

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        self._truncate_to_common_prefix(history)
        params, rng = self.res.sampling, self.res.rng
        p_min = self.config["draft_p_min"]
        t0 = time.perf_counter()
        self._feed(history[len(self._cached) :], rows="last")
        if self.config["tree_width"] > 1:
            return self._draft_tree(n_max, t0)
        row = self.ctx.last_row()
        if n_max > 1 and self.ctx.memory.info.removal != "part":
            # the drafted tokens will be evaluated one by one and cannot be removed: save the state first
            self._memory_log.append(self.ctx.memory.checkpoint("drafting on a draft model that cannot drop a tail"))
        toks: list[int] = []
        probs: list[float | None] = []
        dists: list[Dist] = []
        alternatives: list[list[int]] = []
        reason = None
        for i in range(n_max):
            sr = ScoredRow(row)
            if params.greedy:
                t, top = sr.best, sr.prob(sr.best)
                p = top
            else:
                # read in place from a copy: the next draft step's decode overwrites llama.cpp's logits
                q = tempered_or_dist(row.copy(), params)
                top = q.max_prob()
            if top < p_min:
                reason = "p-min"
                break
            if not params.greedy:
                t = sample(q, rng)
                p = q.prob(t)
                dists.append(q)
            toks.append(int(t))
            probs.append(float(p))
            # the draft's own ranking (its raw logits: temperature keeps the order), before the next step's decode
            alternatives.append(top_ids(sr.row, DRAFT_ALTERNATIVES, sr.max))
            if i + 1 < n_max:
                self.ctx.eval([t], len(self._cached), rows="all")
                self._cached.append(int(t))
                row = self.ctx.row(0)
        self.model_seconds += time.perf_counter() - t0
        self.model_tokens += len(toks)
        return Draft(
            tokens=toks,
            probs=probs,
            reason=reason,
            dists=None if params.greedy else dists,
            alternatives=alternatives,
        )

    def _draft_tree(self, n_max: int, t0: float) -> Draft:
        """Draft a tree (:mod:`~specviz.strategies.tree_drafting`) after the pending token, just evaluated. A tree
        that did not branch is returned as a chain."""
        got = draft_tree(
            self.ctx,
            len(self._cached),
            n_max,
            width=self.config["tree_width"],
            p_split=self.config["p_split"],
            p_min=self.config["draft_p_min"],
            params=self.res.sampling,
            rng=self.res.rng,
        )
        self._branches = got.branches
        tree = got.tree
        self.model_seconds += time.perf_counter() - t0
        self.model_tokens += len(tree)
        main = tree.branches[0] if len(tree) else []
        dists = None if tree.dists is None else [tree.dists[tree.parents[i]] for i in main]
        return Draft(
            tokens=[tree.tokens[i] for i in main],
            probs=[tree.probs[i] for i in main],
            reason=got.reason,
            dists=dists,
            tree=None if tree.is_chain else tree,
        )

    def sync(self, history: Sequence[int]) -> list[tuple[int, int]]:
        """Bring the draft cache to ``history[:-1]`` (drop the rejected tail, feed what is missing) and
        return the rollbacks of the draft cache since the last call."""
        self._truncate_to_common_prefix(history)
        missing = history[len(self._cached) : -1]
        if missing:
            self._feed(missing, rows="none")
        out, self._rollbacks = self._rollbacks, []
        return out

    def extra_telemetry(self) -> dict[str, Any]:
        """The draft model's own seconds and tokens/s while drafting, and its cache length."""
        return {
            "draft_model": str(self.model.path),
            "draft_model_seconds": self.model_seconds,
            "draft_model_tokens": self.model_tokens,
            "draft_model_tokens_per_second": self.model_tokens / self.model_seconds if self.model_seconds else 0.0,
            "draft_kv": self.kv_length(),
        }

    def memory_context(self) -> LlamaContext:
        """The draft model's context."""
        return self.ctx

    def memory_log(self) -> list[Mark | Cut]:
        """The draft context's checkpoints and restores since the last call."""
        out, self._memory_log = self._memory_log, []
        return out

    def context_state(self) -> bytes:
        """The draft context's state and the tokens it holds (for snapshots)."""
        head = json.dumps({"cached": self._cached}).encode()
        return len(head).to_bytes(8, "little") + head + self.ctx.state()

    def load_context_state(self, blob: bytes) -> None:
        """Restore :meth:`context_state`; a malformed blob raises SnapshotError and changes nothing."""
        try:
            n = int.from_bytes(blob[:8], "little")
            cached = [int(t) for t in json.loads(blob[8 : 8 + n])["cached"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"the draft context's state is malformed ({exc})") from None
        if any(not 0 <= t < self.model.n_vocab for t in cached):
            raise SnapshotError("the draft context's state holds token ids outside the draft vocabulary")
        self.ctx.load_state(blob[8 + n :], max_pos=len(cached))  # its cache holds exactly the cached tokens
        self._cached = cached
        self._rollbacks = []

    def close(self) -> None:
        """Free the draft context (the model stays cached by the session)."""
        self.ctx.close()
