"""An advised setting as ``llama-server`` flags (of the llama.cpp that llama-cpp-python 0.3.36 vendors), with
notes on what does not carry over. A strategy llama.cpp lacks gets its nearest type
(:data:`NEAREST_SPEC_TYPE`); a chain is one ``--spec-type`` list and each member's flags. The ``grammar``
drafter has no counterpart: it is left out, with :data:`GRAMMAR_NOTE` on what to set there instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..strategies import resolve_strategy, spec_type
from .advise_rounds import knob_names
from .advise_search import Candidate

if TYPE_CHECKING:
    from .diagnosis import Diagnosis

#: llama.cpp's nearest ``--spec-type`` for a strategy it does not have (prompt lookup: ngram-simple).
NEAREST_SPEC_TYPE = {"prompt-lookup": "ngram-simple"}
#: What llama-server offers in place of specviz's ``grammar`` drafter, which it does not have.
GRAMMAR_NOTE = (
    "llama-server has no grammar drafter (no --spec-type drafts the text a grammar forces): the request's "
    "grammar or json_schema still constrains its verification, and the forced keys, quotes and brackets are "
    "left to the other types; there, keep drafts short (--spec-draft-n-max, or the n-gram type's size) or use "
    "ngram-mod, whose drafts a schema cuts less often than a copied prompt's prose "
    "(specviz diagnose shows the share of drafted tokens impossible under the grammar)"
)


def llama_flags(c: Candidate, knobs: dict[str, Any]) -> tuple[str, list[str]]:
    """The setting ``c`` (with the strategy's other ``knobs``) as ``llama-server`` flags of the llama.cpp
    that llama-cpp-python 0.3.36 vendors, and notes on what does not carry over. A chain is one
    ``--spec-type`` list and each member's flags (llama.cpp has one set of draft-model flags)."""
    s = resolve_strategy(c.strategy)
    if s == "none":
        return "--spec-type none", []
    members = [m for m in s.split(",") if m != "grammar"]
    if not members:  # the grammar drafter alone: llama-server verifies under the grammar without drafting
        return "--spec-type none", [GRAMMAR_NOTE]
    names = knob_names(s)
    types = [spec_type(m) or NEAREST_SPEC_TYPE.get(m, m) for m in members]
    parts, notes = [f"--spec-type {','.join(types)}"], []
    for m in members:
        own = {mine: knobs[chain] for mine, chain in names.get(m, {}).items() if chain in knobs}
        own.update({k: v for k, v in knobs.items() if k in ("draft_policy", "draft_model")})
        p, n = _member_flags(m, c, own)
        parts += [x for x in p if x not in parts]
        notes += [x for x in n if x not in notes]
    if "grammar" in s.split(","):
        notes.append(GRAMMAR_NOTE)
    return " ".join(parts), notes


def _member_flags(s: str, c: Candidate, knobs: dict[str, Any]) -> tuple[list[str], list[str]]:
    """One strategy's flags (without ``--spec-type``) for the setting ``c``, and notes."""
    t = spec_type(s) or NEAREST_SPEC_TYPE.get(s, s)
    notes: list[str] = []
    parts: list[str] = []
    if s in ("draft", "eagle3", "mtp", "dflash", "dspark"):
        if knobs.get("draft_model"):
            parts.append(f"-md {knobs['draft_model']}")
        parts.append(f"--spec-draft-n-max {c.draft_max}")
        parts.append(f"--spec-draft-n-min {c.draft_min}")
        if c.draft_p_min is not None:
            parts.append(f"--spec-draft-p-min {c.draft_p_min:g}")
    elif s in ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "prompt-lookup"):
        size_n = knobs.get("max_ngram", 3) if s == "prompt-lookup" else knobs.get("size_n", 12)
        parts.append(f"--spec-{t}-size-n {size_n}")
        parts.append(f"--spec-{t}-size-m {c.draft_max}")
        if s in ("ngram-map-k", "ngram-map-k4v") and knobs.get("min_hits") is not None:
            parts.append(f"--spec-{t}-min-hits {knobs['min_hits']}")
        notes.append(f"llama.cpp's {t} drafts size_m tokens: draft_max {c.draft_max} becomes --spec-{t}-size-m")
        if s == "prompt-lookup":
            notes.append(
                "llama.cpp has no prompt-lookup type; ngram-simple is the nearest (it matches one n-gram "
                f"size, {size_n}, where prompt lookup tries {knobs.get('max_ngram', 3)} down to "
                f"{knobs.get('min_ngram', 1)})"
            )
        if c.draft_min > 1:
            notes.append(f"llama.cpp's {t} has no minimum draft length (draft_min {c.draft_min} does not carry over)")
        if t == "ngram-simple" and c.draft_max < int(size_n):
            notes.append(
                f"llama.cpp's ngram-simple drafts nothing when its m-gram is shorter than its n-gram (size_m "
                f"{c.draft_max} < size_n {size_n}): in llama-server these flags do not speculate; advise for the "
                "server (--for-server) to search only what it drafts"
            )
    elif s == "ngram-mod":
        parts.append(f"--spec-ngram-mod-n-match {knobs.get('n_match', 24)}")
        parts.append(f"--spec-ngram-mod-n-min {max(c.draft_min, 1)}")
        parts.append(f"--spec-ngram-mod-n-max {c.draft_max}")
    elif s == "ngram-cache":
        if c.draft_max != 8:
            notes.append(
                f"llama.cpp's ngram-cache drafts up to 8 tokens (hard-coded); draft_max {c.draft_max} "
                "does not carry over"
            )
    if knobs.get("draft_policy", "fixed") != "fixed":
        notes.append(f"draft_policy {knobs['draft_policy']} has no llama.cpp counterpart")
    return parts, notes


def grammar_advice(dg: Diagnosis) -> str | None:
    """What the grammar drafter would add to a recording made under a grammar without it: the share of drafted
    tokens the grammar made impossible, and where the drafter runs; None without a grammar, or with it."""
    share = dg.grammar_impossible_share()
    if share is None or any("grammar" in s.split(",") for s in dg.strategies):
        return None
    return (
        f"under the grammar {share:.0%} of drafted tokens were impossible ({dg.grammar_impossible} of "
        f"{dg.drafted}); specviz's grammar drafter drafts the text the grammar forces, chained in front "
        f"(--spec-type grammar,{dg.strategies[0] if dg.strategies else 'ngram-mod'}), which llama-server lacks"
    )
