"""Check that a draft model can speak to a target model: same vocabulary, token by token.

Speculative decoding hands token ids from the draft to the target and compares the two models'
distributions index by index, so the two vocabularies must agree on size, special tokens and the text
of each id. :func:`check_vocab_compatible` compares two loaded llama.cpp models (pointers from
``llama_model_load_from_file``) and raises :class:`specviz.errors.VocabularyMismatchError` saying
exactly what differs. The text comparison covers a deterministic spread of ids (the start, the end,
an even sweep and every special token), which finds a different tokenizer without reading all of a
262144-entry vocabulary.

llama.cpp's own ``common_speculative`` check tolerates a draft vocabulary up to 128 entries larger;
specviz requires equal sizes because its acceptance rule compares whole distributions by index.
"""

from __future__ import annotations

from dataclasses import dataclass

from specviz.errors import VocabularyMismatchError

__all__ = [
    "VocabDifference",
    "VocabSummary",
    "vocab_summary",
    "vocab_differences",
    "check_vocab_compatible",
    "spread_ids",
    "SPECIAL_TOKENS",
]

#: Special tokens compared by id: name -> llama.cpp accessor name.
SPECIAL_TOKENS = {
    "bos": "llama_vocab_bos",
    "eos": "llama_vocab_eos",
    "eot": "llama_vocab_eot",
    "sep": "llama_vocab_sep",
    "nl": "llama_vocab_nl",
    "pad": "llama_vocab_pad",
    "fim_pre": "llama_vocab_fim_pre",
    "fim_suf": "llama_vocab_fim_suf",
    "fim_mid": "llama_vocab_fim_mid",
    "fim_pad": "llama_vocab_fim_pad",
    "fim_rep": "llama_vocab_fim_rep",
    "fim_sep": "llama_vocab_fim_sep",
}
_FLAGS = {"add_bos": "llama_vocab_get_add_bos", "add_eos": "llama_vocab_get_add_eos"}
_HOW_TO_FIX = (
    "Use a draft model with the target's tokenizer (the same model family and "
    "conversion), or derive one from the target with `specviz derive-draft TARGET.gguf "
    "--keep-layers 0-5 -o DRAFT.gguf`, which keeps the vocabulary by construction."
)


@dataclass(frozen=True)
class VocabDifference:
    """One way the two vocabularies differ."""

    kind: str  #: "size", "type", "special", "flag" or "text"
    what: str  #: e.g. "n_tokens", "eos", "add_bos", "token 300"
    target: object
    draft: object

    def describe(self) -> str:
        """One human-readable line."""
        if self.kind == "text":
            return f"{self.what}: target {self.target!r}, draft {self.draft!r}"
        if self.kind == "special":
            return f"special token {self.what}: target id {self.target}, draft id {self.draft}"
        return f"{self.what}: target {self.target}, draft {self.draft}"

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return {"kind": self.kind, "what": self.what, "target": self.target, "draft": self.draft}


@dataclass(frozen=True)
class VocabSummary:
    """What :func:`vocab_summary` reads from one model's vocabulary."""

    n_tokens: int
    vocab_type: int
    special: dict
    flags: dict


def _model_ptr(model):
    """Accept a ``llama_model_p``, a ``llama_cpp._internals.LlamaModel`` or a ``llama_cpp.Llama``."""
    inner = getattr(model, "_model", None)
    if inner is not None and hasattr(inner, "model"):
        return inner.model
    if hasattr(model, "model") and not hasattr(model, "contents"):
        return model.model
    return model


def _vocab(model):
    import llama_cpp

    v = llama_cpp.llama_model_get_vocab(_model_ptr(model))
    if not v:
        raise VocabularyMismatchError(
            "the model has no vocabulary (llama_model_get_vocab returned NULL); load the model with its vocabulary"
        )
    return v


def vocab_summary(model) -> VocabSummary:
    """Size, type, special token ids and add-BOS/EOS flags of a loaded model's vocabulary."""
    import llama_cpp

    v = _vocab(model)
    special = {}
    for name, fn in SPECIAL_TOKENS.items():
        f = getattr(llama_cpp, fn, None)
        if f is not None:
            special[name] = int(f(v))
    flags = {name: bool(getattr(llama_cpp, fn)(v)) for name, fn in _FLAGS.items() if hasattr(llama_cpp, fn)}
    return VocabSummary(int(llama_cpp.llama_vocab_n_tokens(v)), int(llama_cpp.llama_vocab_type(v)), special, flags)


def spread_ids(n_tokens: int, n_samples: int = 512, edge: int = 64) -> list[int]:
    """A deterministic spread of ids in ``[0, n_tokens)``: the first and last ``edge`` ids plus
    ``n_samples`` evenly spaced ones, ascending and without repeats."""
    if n_tokens <= 0:
        return []
    ids = set(range(min(edge, n_tokens)))
    ids.update(range(max(0, n_tokens - edge), n_tokens))
    if n_samples > 0:
        step = max(1, n_tokens // n_samples)
        ids.update(range(0, n_tokens, step))
    return sorted(ids)


def _text(v, token: int) -> bytes:
    import llama_cpp

    t = llama_cpp.llama_vocab_get_text(v, token)
    return b"" if t is None else bytes(t)


def vocab_differences(target_model, draft_model, *, n_samples: int = 512) -> list[VocabDifference]:
    """Every difference found between the two vocabularies (empty when compatible).

    Compares size, vocabulary type, special token ids, the add-BOS/EOS flags and the text of the ids
    from :func:`spread_ids` plus every special token id (within the shared range).
    """
    tv, dv = _vocab(target_model), _vocab(draft_model)
    ts, ds = vocab_summary(target_model), vocab_summary(draft_model)
    diffs: list[VocabDifference] = []
    if ts.n_tokens != ds.n_tokens:
        diffs.append(VocabDifference("size", "n_tokens", ts.n_tokens, ds.n_tokens))
    if ts.vocab_type != ds.vocab_type:
        diffs.append(VocabDifference("type", "vocab_type", ts.vocab_type, ds.vocab_type))
    for name in ts.special:
        if ts.special[name] != ds.special.get(name):
            diffs.append(VocabDifference("special", name, ts.special[name], ds.special.get(name)))
    for name in ts.flags:
        if ts.flags[name] != ds.flags.get(name):
            diffs.append(VocabDifference("flag", name, ts.flags[name], ds.flags.get(name)))
    shared = min(ts.n_tokens, ds.n_tokens)
    ids = set(spread_ids(shared, n_samples))
    ids.update(t for t in list(ts.special.values()) + list(ds.special.values()) if 0 <= t < shared)
    for tok in sorted(ids):
        a, b = _text(tv, tok), _text(dv, tok)
        if a != b:
            diffs.append(
                VocabDifference("text", f"token {tok}", a.decode("utf-8", "replace"), b.decode("utf-8", "replace"))
            )
    return diffs


def check_vocab_compatible(target_model, draft_model, *, n_samples: int = 512, max_listed: int = 8) -> None:
    """Raise :class:`VocabularyMismatchError` unless the draft's vocabulary matches the target's.

    The message lists what differs (size, vocabulary type, which special tokens, which ids' text —
    at most ``max_listed`` text differences, with the total) and what to do. The error carries the
    full list as ``.differences`` (:class:`VocabDifference` items).
    """
    diffs = vocab_differences(target_model, draft_model, n_samples=n_samples)
    if not diffs:
        return
    lines = [d.describe() for d in diffs if d.kind != "text"]
    text = [d for d in diffs if d.kind == "text"]
    if text:
        shown = "; ".join(d.describe() for d in text[:max_listed])
        more = f" (and {len(text) - max_listed} more)" if len(text) > max_listed else ""
        lines.append(f"text differs for {len(text)} of the compared ids: {shown}{more}")
    err = VocabularyMismatchError(
        "the draft model's vocabulary does not match the target's: " + "; ".join(lines) + ". " + _HOW_TO_FIX
    )
    err.differences = diffs  # type: ignore[attr-defined]
    raise err
