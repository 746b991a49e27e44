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
