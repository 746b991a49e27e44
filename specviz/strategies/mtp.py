"""``mtp``: the target's own multi-token-prediction (NextN) layers draft (llama.cpp's ``draft-mtp``).

Models trained with multi-token prediction carry NextN blocks after their trunk; each reads the trunk's
final hidden state and the next token and predicts one token further. llama.cpp runs them in an MTP
context tied to the target context. By default the NextN layers are the target's own (the same GGUF);
``draft_model`` may name another GGUF holding them (as llama.cpp's ``-md`` with ``--spec-type
draft-mtp``). Drafting, rollbacks and snapshots work as for ``eagle3`` (see
:mod:`specviz.strategies.hidden_state`); the state of a position is the target's NextN-input hidden
state, read for every row of each batch.

A model without NextN layers, or whose MTP graph specviz cannot check (see
:mod:`specviz.backends.mtp`: ``glm4moe`` and Qwen3.5's ``qwen35`` run), or NextN layers whose width or
vocabulary differ from the target's, are refused by ``configure()`` / ``start()`` with
:class:`~specviz.errors.StrategyUnavailableError` saying why. Gemma 3 has none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..backends.mtp import NextNContext, TargetNextNTap, mtp_pair_problems, mtp_problems
from ..decoding.knob_schema import Knob
from ..errors import KnobError, StrategyUnavailableError
from .base import DraftResources
from .hidden_state import HiddenStateDrafter
from .knobs import DRAFT_P_MIN_KNOB, HIDDEN_TREE_KNOBS

MTP_MODEL_KNOB = Knob(
    "draft_model",
    str,
    "",
    "GGUF holding the NextN layers (empty: the target's own)",
    aliases=("--model-draft", "--spec-draft-model", "-md"),
)


def _check_nextn_file(config: dict[str, Any]) -> None:
    """A given NextN GGUF must exist."""
    path = config.get("draft_model") or ""
    if path and not Path(path).is_file():
        raise KnobError(
            f"knob 'draft_model': {path!r} does not exist; pass a .gguf file with NextN layers, or "
            "nothing to use the target's own",
            knob="draft_model",
            value=path,
        )


class MtpDrafter(HiddenStateDrafter):
    """Draft with the NextN (multi-token prediction) layers of the target."""

    name = "mtp"
    knob_rules = (_check_nextn_file,)
    knobs = (MTP_MODEL_KNOB, DRAFT_P_MIN_KNOB, *HIDDEN_TREE_KNOBS)
    state_format = "mtp-1"
    PAIR_OFFSET = 1
    LEADING_PAIR = True
    #: The draft model is optional: without one the target's own NextN layers draft.
    draft_model_optional = True

    @classmethod
    def check_models(cls, config: dict[str, Any], target_ctx: Any, model: Any) -> None:
        """Refuse a model without usable NextN layers, saying why."""
        m = model if model is not None else target_ctx.model
        why = mtp_problems(m.info) or mtp_pair_problems(m, target_ctx.model)
        if why:
            raise StrategyUnavailableError(
                f"mtp cannot draft with {m.path.name}: " + "; ".join(why), knob="strategy", value="mtp"
            )

    def __init__(self, resources: DraftResources, **knobs: Any) -> None:
        super().__init__(resources, **knobs)
        model = resources.model if resources.model is not None else resources.target
        self.check_models(self.config, resources.target_ctx, model)
        self.nextn_model = model
        # a tree's frontier (tree_topk nodes) drafts in as many sequences of the MTP context
        self.dctx = NextNContext(
            model, resources.target_ctx, n_threads=resources.n_threads, n_seq=self.config["tree_topk"]
        )
        self.tap = TargetNextNTap(resources.target_ctx)
        self._init_evals = resources.target_ctx.eval_count

    def _states(self, n_rows: int) -> np.ndarray:
        return self.tap.rows(n_rows)

    def _release_target(self) -> None:
        self.tap.close()
