"""``dflash`` and ``dspark``: a block-diffusion draft drafts a whole block per round (llama.cpp's
``draft-dflash`` and ``draft-dspark``), through llama.cpp's own ``dflash`` graph.

The draft (a GGUF of llama.cpp's ``dflash`` architecture, ``draft_model`` / ``-md``) keeps a cache that
mirrors the target's: for every committed position the inputs of the target layers it lists
(``dflash.target_layers``), read through :mod:`specviz.backends.capture` while the target evaluates, are
injected there. Each round decodes one block ``[newest token, <mask> …]`` at the positions after the
cache, in one pass; its positions are drafted in parallel, and the block is removed again before the
target verifies (a rollback of the draft's context, reported). After the verify batch the committed
positions' features are injected, so the draft's cache holds exactly the target's committed positions
after every round. See :mod:`specviz.backends.dflash` for the graph and the variants, and
:mod:`specviz.strategies.block_read` for how tokens are read from a block (DSpark's confidence head,
DFlash-2's selector).

Each block's facts travel with the draft (``Draft.block``: its size, how many positions it drafts, the
layout and, for DSpark, each position's confidence), so the events show it as one block.

Departure from llama.cpp: upstream decodes ``--spec-draft-n-max`` masks (clamped to the trained block);
specviz always decodes the trained block — ``dflash.block_size`` tokens, the shape the draft was trained
on — and keeps the first tokens the round allows, so changing ``draft_max`` never changes the draft's
input. With ``draft_max`` at or above the block's capacity the two decode the same block.
``n_ubatch`` caps the block (llama.cpp decodes a block in one micro-batch; a longer one is refused here).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from ..backends.capture import LayerCapture, capture_unavailable_reason
from ..backends.dflash import (
    DFlashContext,
    DFlashHeadInfo,
    dflash_load_problems,
    dflash_problems,
    read_dflash_head,
)
from ..backends.gguf_check import check_gguf, read_small_tensor
from ..decoding.knob_schema import Knob
from ..errors import CaptureUnavailableError, KnobError, ModelError, SnapshotError, StrategyUnavailableError
from .base import Draft, DraftResources
from .block_read import BlockRead, read_positions, walk_lattice
from .context_drafter import ContextDrafter
from .knobs import DRAFT_MODEL_KNOB, DRAFT_P_MIN_KNOB, TREE_TOPK_KNOB
from .target_replay import reevaluate

#: DSpark's threshold: its confidence head, not the token probability (llama.cpp: ``--spec-draft-p-min``).
DSPARK_P_MIN_KNOB = Knob(
    "draft_p_min",
    float,
    0.0,
    "stop the block at the first position whose confidence-head value is below this (needs the draft's "
    "confidence head; 0: keep every position)",
    lo=0.0,
    hi=1.0,
    aliases=("--spec-draft-p-min", "--draft-p-min"),
)


def dflash_unusable_reasons(target: Any, config: dict[str, Any], *, dspark: bool, target_ctx: Any = None) -> list[str]:
    """Why the draft named by ``config`` cannot draft for the loaded ``target`` model (empty: it can), without
    touching llama.cpp; with ``target_ctx``, also whether that context can have its layer inputs read."""
    path = config.get("draft_model") or ""
    info = check_gguf(path)
    try:
        head = read_dflash_head(path, info)
    except StrategyUnavailableError as e:
        return [str(e)]
    arch = target.info.architecture
    why = dflash_problems(
        head,
        info,
        target_arch=arch,
        target_n_layer=target.n_layer,
        target_n_embd=target.n_embd,
        target_n_vocab=target.n_vocab,
        p_min=float(config.get("draft_p_min", 0.0)),
        dspark=dspark,
    )
    cap = capture_unavailable_reason(arch)
    if cap is not None:
        why.append(f"the target's hidden states cannot be read: {cap}")
    elif target_ctx is not None and arch == "gemma3" and getattr(target_ctx, "tap", None) is None:
        why.append(
            "the target context was created without the layer-capture callback (llama.cpp's gemma3 graph "
            "records no layer inputs); create it with capture enabled"
        )
    return why


def _no_tree(strategy: str, config: dict[str, Any]) -> None:
    """A block draft is no tree: its positions are drafted in parallel, in one decode of the block, so no
    position is drafted after a chosen parent and there is no node to expand with its top-k."""
    topk = config.get("tree_topk", 1)
    if topk > 1:
        raise KnobError(
            f"knob 'tree_topk': {strategy} drafts a block of positions in parallel (one decode, no position drafted "
            "after a chosen token), so it has no node to expand into a tree; set tree_topk 1, or draft trees with "
            "eagle3 or mtp",
            knob="tree_topk",
            value=topk,
        )


def _check_draft_file(strategy: str, config: dict[str, Any]) -> None:
    """The draft path of ``strategy`` (``dflash`` or ``dspark``) must name an existing DFlash file llama.cpp
    can load without aborting."""
    path = config.get("draft_model") or ""
    if not path:
        raise KnobError(
            f"knob 'draft_model': the {strategy} strategy needs a DFlash draft; pass draft_model=PATH (-md PATH)",
            knob="draft_model",
            value=path,
        )
    if not Path(path).is_file():
        raise KnobError(
            f"knob 'draft_model': {path!r} does not exist; pass the path of a DFlash .gguf file",
            knob="draft_model",
            value=path,
        )
    info = check_gguf(path)
    why = dflash_load_problems(info) if info.architecture == "dflash" else []
    if why:
        raise StrategyUnavailableError(
            f"{strategy} cannot load {path}: " + "; ".join(why), knob="draft_model", value=path
        )


class DFlashDrafter(ContextDrafter):
    """Draft one block per round with a DFlash (or DFlash-2) draft over the target's layer inputs."""

    name = "dflash"
    knob_rules = (partial(_no_tree, "dflash"), partial(_check_draft_file, "dflash"))
    knobs = (DRAFT_MODEL_KNOB, DRAFT_P_MIN_KNOB, TREE_TOPK_KNOB)
    state_format = "dflash-1"
    needs_model = True
    reads_target = True
    #: llama.cpp's type: DSpark drafts need the Markov head, DFlash drafts must not have it.
    DSPARK: ClassVar[bool] = False

    @classmethod
    def check_models(cls, config: dict[str, Any], target_ctx: Any, model: Any) -> None:
        """Refuse a draft that cannot serve this target, saying why (nothing reaches llama.cpp)."""
        path = config.get("draft_model") or ""
        why = dflash_unusable_reasons(target_ctx.model, config, dspark=cls.DSPARK, target_ctx=target_ctx)
        if why:
            err = (
                CaptureUnavailableError
                if all("hidden states" in w or "capture" in w for w in why)
                else StrategyUnavailableError
            )
            raise err(
                f"{cls.name} cannot use {path} with {target_ctx.model.path.name}: " + "; ".join(why),
                knob="draft_model",
                value=path,
            )

    def __init__(self, resources: DraftResources, **knobs: Any) -> None:
        super().__init__(**knobs)
        self.res = resources
        self.target_ctx = resources.target_ctx
        self.n_vocab = resources.target.n_vocab
        self.check_models(self.config, resources.target_ctx, resources.model)
        info = check_gguf(resources.model.path)
        self.head: DFlashHeadInfo = read_dflash_head(resources.model.path, info)
        self.vocab_ids: np.ndarray | None = None
        if self.head.has_d2t:
            self.vocab_ids = np.unique(read_small_tensor(resources.model.path, info, "d2t").astype(np.int64))
        self.dctx = DFlashContext(resources.model, resources.target_ctx, self.head, n_threads=resources.n_threads)
        try:
            self.capture = LayerCapture(resources.target_ctx, self.head.target_layers)
        except Exception:
            self.dctx.close()
            raise
        if self.head.block_tokens(1) > self.dctx.n_ubatch:  # pragma: no cover - n_ubatch >= 8 always
            raise ModelError(f"n_ubatch={self.dctx.n_ubatch} cannot hold a DFlash block")
        self._init_evals = self.target_ctx.eval_count
        self._injected: list[int] = []  # the tokens at the positions whose features are in the draft's cache
        self._hist_len = 0
        self._dirty = True
        self._eval_mark = -1
        self._rollbacks: list[tuple[int, int]] = []
        self.catch_up_tokens = 0
        self.blocks = 0
        self.block_positions = 0
        self._confidence: np.ndarray | None = None  # DSpark: the last block's confidence per draft position

    # -- the block ---------------------------------------------------------------------------------
    @property
    def block_drafts(self) -> int:
        """Draft tokens one block yields here: the trained block's, capped by the micro-batch."""
        h = self.head
        cap = self.dctx.n_ubatch - (0 if h.anchor_drafts else 1)
        return max(0, min(h.max_draft, cap))

    # -- the draft cache ---------------------------------------------------------------------------
    def _catch_up(self, history: Sequence[int]) -> None:
        """Inject the committed positions the draft's cache lacks (re-evaluating the target for them)."""
        start = len(self._injected)
        feats = reevaluate(self.target_ctx, history, start, self.capture.features, what=self.name)
        if feats.shape[0]:
            self.dctx.inject(feats, start)
            self._injected.extend(int(t) for t in history[start : len(history) - 1])
            self.catch_up_tokens += feats.shape[0]
        self._dirty = False
        self._hist_len = len(history)
        self._eval_mark = self.target_ctx.eval_count

    def _begin(self, history: Sequence[int]) -> None:
        n_committed = len(history) - 1
        tgt = self.target_ctx
        # keep the common prefix of what the cache holds (a rewind or a restore cuts the history)
        k = 0
        lim = min(len(self._injected), n_committed)
        while k < lim and self._injected[k] == history[k]:
            k += 1
        if k < len(self._injected):
            self.dctx.truncate(k)
            del self._injected[k:]
        self._rollbacks = []
        self._hist_len = len(history)
        # cheap path: the session has just evaluated the prompt in one batch with the taps switched on
        if (
            k == 0
            and 0 < n_committed <= tgt.capacity.n_batch
            and tgt.eval_count == self._init_evals + 1
            and tgt.kv_len() == n_committed
        ):
            self.dctx.clear()
            self.dctx.inject(self.capture.features(n_committed), 0)
            self._injected = [int(t) for t in history[:n_committed]]
            self._dirty = False
            self._eval_mark = tgt.eval_count
        else:
            self._dirty = k < n_committed
            self._eval_mark = tgt.eval_count

    def _draft(self, history: Sequence[int], n_max: int) -> Draft:
        L = len(history)
        if self._dirty or len(self._injected) != L - 1 or self._hist_len != L:
            self._catch_up(history)
        n_draft = min(self.block_drafts, self.dctx.n_ctx - (L - 1) - (0 if self.head.anchor_drafts else 1))
        if n_draft <= 0:
            return Draft(reason="context")
        n_tok = self.head.block_tokens(n_draft)
        pos0 = L - 1
        self.dctx.decode_block(int(history[-1]), n_tok, pos0)
        read = self._read(n_draft, min(n_max, n_draft))
        self.dctx.truncate(pos0)  # the block never stays: the next injection writes the verified positions
        self._rollbacks.append((pos0 + n_tok, pos0))
        self.blocks += 1
        self.block_positions += n_draft
        reason = read.reason or ("block" if len(read.tokens) < n_max and len(read.tokens) == n_draft else None)
        block = {
            "kind": self.head.kind,
            "size": n_tok,
            "positions": n_draft,
            "trained": self.head.block_size,
            "anchor_drafts": self.head.anchor_drafts,
            "position": pos0,
        }
        if self._confidence is not None:
            block["confidence"] = [float(c) for c in self._confidence[: len(read.tokens) + 1]]
        return Draft(
            tokens=read.tokens,
            probs=read.probs,
            reason=reason,
            dists=read.dists if not self.res.sampling.greedy else None,
            block=block,
            alternatives=read.alternatives or None,
        )

    def _read(self, n_draft: int, n_keep: int) -> BlockRead:
        """The first ``n_keep`` draft tokens of the decoded block of ``n_draft`` positions."""
        params, rng = self.res.sampling, self.res.rng
        p_min = float(self.config.get("draft_p_min", 0.0))
        h = self.head
        self._confidence = None
        if h.kind == "dflash2":
            cand, scores = self.dctx.lattice()
            return walk_lattice(cand, scores, n_keep, params, rng, p_min=p_min, n_vocab=self.n_vocab)
        first = 0 if h.anchor_drafts else 1
        conf = None
        if h.dspark and h.confidence_head:
            conf = self.dctx.confidence()
            self._confidence = conf[first:]
        return read_positions(
            self.dctx.logits,
            range(first, first + n_keep),
            params,
            rng,
            p_min=p_min,
            n_vocab=self.n_vocab,
            vocab_ids=self.vocab_ids,
            confidence=conf if h.dspark else None,
        )

    def sync(self, history: Sequence[int]) -> list[tuple[int, int]]:
        """After a round: inject the committed positions' features from the verify batch (or catch up);
        returns the draft context's rollbacks since the last call."""
        L_old, L = self._hist_len, len(history)
        tgt = self.target_ctx
        if not self._dirty and L > L_old >= 1 and tgt.eval_count == self._eval_mark + 1:
            # rows 0 … L-L_old-1 of the verify batch are target positions L_old-1 … L-2
            if len(self._injected) == L_old - 1:
                self.dctx.inject(self.capture.features(L - L_old), L_old - 1)
                self._injected.extend(int(t) for t in history[L_old - 1 : L - 1])
            else:
                self._dirty = True
        elif L != L_old or tgt.eval_count != self._eval_mark:
            self._dirty = True
        if len(self._injected) > L - 1:  # the history was cut below the cache
            self.dctx.truncate(L - 1)
            self._rollbacks.append((len(self._injected), L - 1))
            del self._injected[L - 1 :]
        self._hist_len = L
        self._eval_mark = tgt.eval_count
        if self._dirty and L >= 2 and tgt.kv_len() == L - 1:
            # the target evaluated more than the verify batch (its memory re-applied the accepted tokens
            # from a checkpoint, the cost policy measured a verify): catch up now, so the draft's cache
            # holds the committed positions after every round, as the other drafters' contexts do
            self._catch_up(history)
        out, self._rollbacks = self._rollbacks, []
        return out

    # -- reporting and state -----------------------------------------------------------------------
    def kv_length(self) -> int:
        """Positions the draft's context holds."""
        return int(self.dctx.kv_len())

    def extra_telemetry(self) -> dict[str, Any]:
        """The draft's block shape, its cache length, catch-up work and the time in its graphs."""
        return {
            "draft_model": str(self.res.model.path),
            "draft_kv": self.kv_length(),
            "catch_up_tokens": self.catch_up_tokens,
            "dflash": {
                "kind": self.head.kind,
                "target_layers": list(self.head.target_layers),
                "capture": self.capture.method,
                "block_size": self.head.block_size,
                "block_drafts": self.block_drafts,
                "mask_token": self.head.mask_token,
                "blocks": self.blocks,
                "block_positions": self.block_positions,
                "inject_seconds": self.dctx.inject_seconds,
                "decode_seconds": self.dctx.decode_seconds,
            },
        }

    def _export_state(self) -> dict[str, Any]:
        return {"catch_up_tokens": self.catch_up_tokens, "blocks": self.blocks, "block_positions": self.block_positions}

    def _import_state(self, d: dict[str, Any]) -> None:
        self.catch_up_tokens = int(d.get("catch_up_tokens", 0))
        self.blocks = int(d.get("blocks", 0))
        self.block_positions = int(d.get("block_positions", 0))

    def context_state(self) -> bytes:
        """The draft's cache and the tokens it was injected for (for snapshots)."""
        if self._dirty:  # nothing worth saving: the restored drafter catches up from the target
            return json.dumps({"dirty": True}).encode()
        head = json.dumps({"dirty": False, "injected": self._injected, "hist_len": self._hist_len}).encode()
        return len(head).to_bytes(8, "little") + head + self.dctx.state()

    def load_context_state(self, blob: bytes) -> None:
        """Restore :meth:`context_state` (a malformed blob raises SnapshotError and changes nothing)."""
        if blob.startswith(b"{"):
            self._dirty = True
            return
        try:
            n = int.from_bytes(blob[:8], "little")
            head = json.loads(blob[8 : 8 + n])
            injected = [int(t) for t in head["injected"]]
            hist_len = int(head["hist_len"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"the {self.name} drafter's state is malformed ({exc})") from None
        if len(injected) != hist_len - 1 or any(not 0 <= t < self.n_vocab for t in injected):
            raise SnapshotError(
                f"the {self.name} drafter's state is inconsistent ({len(injected)} positions, history {hist_len})"
            )
        self.dctx.load_state(blob[8 + n :])
        self._injected, self._hist_len = injected, hist_len
        self._dirty = False
        self._rollbacks = []
        self._eval_mark = self.target_ctx.eval_count

    def close(self) -> None:
        """Free the draft's context and switch the target's layer taps off."""
        try:
            self.capture.close()
        finally:
            self.dctx.close()


class DSparkDrafter(DFlashDrafter):
    """Draft one block per round with a DSpark draft: DFlash plus a Markov head and a confidence head."""

    name = "dspark"
    knob_rules = (partial(_no_tree, "dspark"), partial(_check_draft_file, "dspark"))
    knobs = (DRAFT_MODEL_KNOB, DSPARK_P_MIN_KNOB, TREE_TOPK_KNOB)
    state_format = "dspark-1"
    DSPARK = True
