"""Knob declarations shared by several strategies, written once.

The n-gram look-up strategies (``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``) share the key and
m-gram sizes, the hit threshold and the check rate; the model-backed drafters share ``draft_model`` and
``draft_p_min``. Each declaration carries llama.cpp's own command-line spelling for that strategy
(``--spec-ngram-map-k-size-n`` …), which the CLI accepts next to ours.
"""

from __future__ import annotations

from ..decoding.knob_schema import Knob


def ngram_size_knobs(spec: str, *, min_hits: bool) -> tuple[Knob, ...]:
    """``size_n``, ``size_m`` (, ``min_hits``) and ``check_rate`` for the llama.cpp type ``spec``
    (``ngram-simple``, ``ngram-map-k`` …), with its ``--spec-<spec>-*`` spellings as aliases."""
    out = [
        Knob(
            "size_n",
            int,
            12,
            "key n-gram size (tokens matched against the history)",
            lo=1,
            hi=1024,
            aliases=(f"--spec-{spec}-size-n",),
        ),
        Knob(
            "size_m",
            int,
            48,
            "m-gram size: the most tokens one draft copies after the key",
            lo=1,
            hi=1024,
            aliases=(f"--spec-{spec}-size-m",),
        ),
    ]
    if min_hits:
        out.append(
            Knob(
                "min_hits",
                int,
                1,
                "look-ups of a key needed before it is used for a draft",
                lo=1,
                hi=1024,
                aliases=(f"--spec-{spec}-min-hits",),
            )
        )
    out.append(Knob("check_rate", int, 1, "search only every this many tokens of history", lo=1, hi=1024))
    return tuple(out)


#: The draft GGUF of a model-backed drafter (llama.cpp: ``-md`` / ``--spec-draft-model``).
DRAFT_MODEL_KNOB = Knob(
    "draft_model",
    str,
    "",
    "path of the draft GGUF (it must share the target's vocabulary)",
    aliases=("--model-draft", "--spec-draft-model", "-md"),
)

#: Stop drafting when the drafter's own top probability falls below this (llama.cpp: ``--spec-draft-p-min``).
DRAFT_P_MIN_KNOB = Knob(
    "draft_p_min",
    float,
    0.75,
    "stop drafting when the draft's own top probability falls below this",
    lo=0.0,
    hi=1.0,
    aliases=("--spec-draft-p-min", "--draft-p-min"),
)


#: The most branches of a draft tree (llama-speculative's ``-np``; 1: a chain). The target's context needs as many
#: sequences (``Session(n_seq_max=...)``; the CLI opens it with them).
TREE_WIDTH_KNOB = Knob(
    "tree_width",
    int,
    1,
    "the most branches of a draft tree, each verified as one sequence of the target (1: a chain)",
    lo=1,
    hi=16,
)

#: Split a draft branch where the draft's next-ranked candidate is more probable than this (llama.cpp:
#: ``--spec-draft-p-split``, its default 0.1).
P_SPLIT_KNOB = Knob(
    "p_split",
    float,
    0.1,
    "split a draft-tree branch where the draft's next-ranked token is more probable than this",
    lo=0.0,
    hi=1.0,
    aliases=("--spec-draft-p-split", "--draft-p-split"),
)


#: A hidden-state drafter's tree (``eagle3``, ``mtp``), SGLang's three settings: the children each expanded node
#: gets, its draft's best candidates or draws (``speculative_eagle_topk``; 1: a chain, the other two unused).
TREE_TOPK_KNOB = Knob(
    "tree_topk",
    int,
    1,
    "a hidden-state draft tree's children per expanded node, its best candidates (1: a chain)",
    lo=1,
    hi=8,
    aliases=("--speculative-eagle-topk",),
)

#: How many levels a hidden-state tree grows: one head step each (SGLang's ``speculative_num_steps``).
TREE_DEPTH_KNOB = Knob(
    "tree_depth",
    int,
    5,
    "a hidden-state draft tree's levels, one head step each (with tree_topk > 1)",
    lo=1,
    hi=64,
    aliases=("--speculative-num-steps",),
)

#: The most nodes a hidden-state tree verifies (SGLang's ``speculative_num_draft_tokens``, less its root: here the
#: pending token is no node), also capped by the round's limit.
TREE_NODES_KNOB = Knob(
    "tree_nodes",
    int,
    8,
    "the most nodes a hidden-state draft tree verifies, its most probable (with tree_topk > 1; the round's "
    "limit caps it too)",
    lo=1,
    hi=256,
)

#: The knobs of a hidden-state drafter's tree, in the order they are declared.
HIDDEN_TREE_KNOBS = (TREE_TOPK_KNOB, TREE_DEPTH_KNOB, TREE_NODES_KNOB)


def hidden_tree_width(topk: int, depth: int, nodes: int) -> int:
    """The most branches (leaves) a hidden-state tree of these settings can have: each of its levels after the
    first holds the children of at most ``topk`` expanded nodes, ``topk * topk`` nodes, of which up to ``topk``
    have children; a subtree of ``nodes`` nodes has no more leaves than that, nor than its nodes."""
    if topk <= 1:
        return 1
    full = topk if depth <= 1 else topk * topk + (depth - 2) * (topk * topk - topk)
    return max(1, min(nodes, full))


def tree_width_of(cfg: dict) -> tuple[int, str]:
    """The most branches a configuration's draft trees can have, and the knob that sets it: ``tree_width`` (the
    draft model's) or ``tree_topk`` (a hidden-state drafter's, with ``tree_depth`` and ``tree_nodes``)."""
    if int(cfg.get("tree_topk", 1)) > 1:
        depth = int(cfg.get("tree_depth", TREE_DEPTH_KNOB.default))
        width = hidden_tree_width(int(cfg["tree_topk"]), depth, int(cfg.get("tree_nodes", TREE_NODES_KNOB.default)))
        return width, "tree_topk"
    return int(cfg.get("tree_width", 1)), "tree_width"
