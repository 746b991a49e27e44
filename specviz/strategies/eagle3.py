"""``eagle3``: an EAGLE-3 head drafts from the target's own hidden states (llama.cpp's ``draft-eagle3``).

The head (a GGUF of llama.cpp's ``eagle3`` architecture, given as ``draft_model`` / ``--draft-model``)
reads the inputs of three target layers for every token the target evaluates, encodes them into one
state row per position and drafts with a single decoder block, feeding each step's pre-norm output
back as the next state. Its output covers a reduced draft vocabulary, mapped to target ids through the
head's ``d2t``. See :mod:`specviz.strategies.hidden_state` for the pairing and rollback scheme, and
:mod:`specviz.backends.capture` for how the layer inputs are read (llama.cpp's own taps, or a C eval
callback on ``gemma3``, whose graph records none).

Everything that could make llama.cpp abort is checked before a context is made: the head's shape,
``d2t``, the target layers it reads, whether the target's layer inputs can be read at all. A head that
does not fit is refused by ``configure()`` / ``start()`` with :class:`~specviz.errors.StrategyUnavailableError`
saying why.

From the second round in a row drafted with a limit of 0 (the ``cost`` policy kept them plain) the head
is not fed: the drafter pauses, keeps the captured layer inputs of at most a window of positions, and
resumes from them when a round drafts again (:mod:`specviz.strategies.hidden_state`).

The telemetry adds the head's vocabulary coverage: the share of the target's vocabulary the draft
vocabulary holds, of the committed tokens it could express, and of the tokens the target chose at a
rejection (a rejected position whose token the head cannot even express is a vocabulary problem, not
a prediction problem).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..backends.capture import LayerCapture, capture_unavailable_reason
from ..backends.eagle3 import Eagle3Context, eagle3_problems, read_eagle3_head
from ..backends.gguf_check import check_gguf, read_small_tensor
from ..errors import CaptureUnavailableError, KnobError, StrategyUnavailableError
from .base import DraftResources
from .hidden_state import HiddenStateDrafter
from .knobs import DRAFT_MODEL_KNOB, DRAFT_P_MIN_KNOB, HIDDEN_TREE_KNOBS


def eagle3_unusable_reasons(target_ctx: Any, head_path: str | Path) -> list[str]:
    """Why this head cannot draft for this target context (empty: it can), without touching llama.cpp."""
    model = target_ctx.model
    arch = model.info.architecture
    why = eagle3_problems(
        head_path,
        target_arch=arch,
        target_n_layer=model.n_layer,
        target_n_embd=model.n_embd,
        target_n_vocab=model.n_vocab,
    )
    cap = capture_unavailable_reason(arch)
    if cap is not None:
        why.append(f"the target's hidden states cannot be read: {cap}")
    elif arch == "gemma3" and getattr(target_ctx, "tap", None) is None:
        why.append(
            "the target context was created without the layer-capture callback (llama.cpp's gemma3 graph "
            "records no layer inputs); create it with capture enabled"
        )
    return why


def _check_head(config: dict[str, Any]) -> None:
    """The head path must name an existing file."""
    path = config.get("draft_model") or ""
    if not path:
        raise KnobError(
            "knob 'draft_model': the eagle3 strategy needs an EAGLE-3 head; pass draft_model=PATH (--draft-model PATH)",
            knob="draft_model",
            value=path,
        )
    if not Path(path).is_file():
        raise KnobError(
            f"knob 'draft_model': {path!r} does not exist; pass the path of an EAGLE-3 .gguf file",
            knob="draft_model",
            value=path,
        )


class Eagle3Drafter(HiddenStateDrafter):
    """Draft with an EAGLE-3 head over the target's hidden states."""

    name = "eagle3"
    knob_rules = (_check_head,)
    knobs = (DRAFT_MODEL_KNOB, DRAFT_P_MIN_KNOB, *HIDDEN_TREE_KNOBS)
    state_format = "eagle3-1"
    PAIR_OFFSET = 0
    # rounds the cost policy keeps plain do not feed the head (see hidden_state's module docstring)
    PAUSES_WHEN_PLAIN = True

    @classmethod
    def check_models(cls, config: dict[str, Any], target_ctx: Any, model: Any) -> None:
        """Refuse a head that cannot draft for this target, saying why (nothing reaches llama.cpp)."""
        path = config.get("draft_model") or ""
        why = eagle3_unusable_reasons(target_ctx, path)
        if why:
            err = (
                CaptureUnavailableError
                if all("hidden states" in w or "capture" in w for w in why)
                else StrategyUnavailableError
            )
            raise err(
                f"eagle3 cannot use {path} with {target_ctx.model.path.name}: " + "; ".join(why),
                knob="draft_model",
                value=path,
            )

    def __init__(self, resources: DraftResources, **knobs: Any) -> None:
        super().__init__(resources, **knobs)
        head = resources.model
        self.check_models(self.config, resources.target_ctx, head)
        info = check_gguf(head.path)
        self.head_info = read_eagle3_head(head.path, info)
        # a tree's frontier (tree_topk nodes) drafts in as many sequences of the head's context
        self.dctx = Eagle3Context(
            head, resources.target_ctx, n_threads=resources.n_threads, n_seq=self.config["tree_topk"]
        )
        try:
            self.capture = LayerCapture(resources.target_ctx, self.dctx.target_layers)
        except Exception:
            self.dctx.close()
            raise
        self._init_evals = resources.target_ctx.eval_count
        if "d2t" in info.tensors:
            self.vocab_ids = np.unique(read_small_tensor(head.path, info, "d2t").astype(np.int64))

    def _features(self, n_rows: int) -> np.ndarray:
        return self.capture.features(n_rows)

    def _encode(self, rows: np.ndarray) -> np.ndarray:
        return self.dctx.encode(rows)

    def _states(self, n_rows: int) -> np.ndarray:
        return self._encode(self._features(n_rows))

    def _hold_target(self, held: bool) -> bool:
        return self.capture.hold(held)

    def _release_target(self) -> None:
        self.capture.close()

    def extra_telemetry(self) -> dict[str, Any]:
        """Adds the head's shape, how its features are read and its encoder/decoder time."""
        d = super().extra_telemetry()
        d["eagle3"] = {
            "target_layers": list(self.dctx.target_layers),
            "capture": self.capture.method,
            "draft_vocab": self.head_info.n_draft_vocab,
            "encode_seconds": self.dctx.encode_seconds,
            "decode_seconds": self.dctx.decode_seconds,
        }
        return d
