"""Forced tokens under a grammar: where llama.cpp's grammar allows exactly one token of the vocabulary, found
without applying the grammar to the whole vocabulary (tens of milliseconds on a 262k vocabulary).

llama.cpp's grammar judges a token by its text alone (``token_to_piece`` with special tokens spelled out):
an end-of-generation token is allowed exactly where the grammar may end; a token with no text, or whose text
starts with a NUL byte, never is; any other token is allowed when the grammar can consume its whole text
(a trailing partial UTF-8 character included). So the allowed texts are *prefix-closed*: when a token is
allowed, so is every token whose text is a proper prefix of its text.

:class:`VocabIndex` arranges a vocabulary's texts as a forest by that order: a text's *parent* is its longest
proper prefix that is itself a token's text, the *roots* are the texts with none (on a byte-fallback
vocabulary, the 255 single bytes). Then, exactly:

* every allowed token lies under an allowed root, so the grammar allows exactly one token when exactly one
  root text is allowed, held by one token, none of that text's children is allowed and no end-of-generation
  token is (:func:`forced_token`: one grammar pass over the roots, one over a root's children);
* every continuation the grammar allows, written in tokens, starts with byte ``b`` when every allowed root
  starts with ``b`` and no end-of-generation token is allowed (:func:`forced_bytes`: the text every
  continuation starts with, one pass over the roots per byte).

:func:`tokens_of` writes such a text in tokens, longest text first (the vocabulary's own token preferred over
a byte-fallback token of the same text).
"""

from __future__ import annotations

import bisect
import re
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.grammar import GrammarSampler

__all__ = ["VocabIndex", "forced_bytes", "forced_token", "tokens_of", "vocab_index"]

_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


@dataclass
class VocabIndex:
    """A vocabulary's token texts as a prefix forest (see the module docstring).

    ``tokens`` maps each text to the tokens that spell it (end-of-generation tokens, empty texts and texts
    starting with NUL left out: the grammar judges those apart); ``roots`` holds one token of each root text,
    ``root_text`` their texts in the same order; ``eog`` lists the end-of-generation tokens; ``preferred``
    maps a text to the token :func:`tokens_of` writes for it; ``longest`` is the longest text's length in
    bytes. A text's children (:meth:`children`) are found when first asked for."""

    tokens: dict[bytes, list[int]]
    roots: np.ndarray
    root_text: list[bytes]
    eog: np.ndarray
    preferred: dict[bytes, int]
    longest: int
    ordered: list[bytes]
    known_children: dict[bytes, tuple[np.ndarray, list[bytes]]]

    @classmethod
    def of(cls, model: Any) -> VocabIndex:
        """The index of ``model``'s vocabulary (``piece_bytes``, ``is_eog``, ``token_text``, ``n_vocab``)."""
        tokens: dict[bytes, list[int]] = {}
        eog: list[int] = []
        for t in range(int(model.n_vocab)):
            if model.is_eog(t):
                eog.append(t)
                continue
            text = model.piece_bytes(t)
            if text and text[0] != 0:
                tokens.setdefault(text, []).append(t)
        roots = [text for text in tokens if not _has_prefix(text, tokens, range(1, len(text)))]
        return cls(
            tokens=tokens,
            roots=np.array([tokens[r][0] for r in roots], np.int32),
            root_text=roots,
            eog=np.array(eog, np.int32),
            preferred={text: _preferred(model, ts) for text, ts in tokens.items()},
            longest=max((len(t) for t in tokens), default=0),
            ordered=sorted(tokens),
            known_children={},
        )

    def children(self, text: bytes) -> tuple[np.ndarray, list[bytes]]:
        """One token of each child text of ``text`` (whose longest proper prefix that is a token's text is
        ``text``), and those texts."""
        kids = self.known_children.get(text)
        if kids is None:
            lo = bisect.bisect_right(self.ordered, text)
            under = []
            for q in self.ordered[lo:]:
                if not q.startswith(text):
                    break
                if not _has_prefix(q, self.tokens, range(len(text) + 1, len(q))):
                    under.append(q)
            kids = self.known_children[text] = (np.array([self.tokens[q][0] for q in under], np.int32), under)
        return kids


def _has_prefix(text: bytes, tokens: dict[bytes, list[int]], lengths: range) -> bool:
    """Whether a prefix of ``text`` of one of ``lengths`` bytes is a token's text."""
    for k in lengths:
        if text[:k] in tokens:
            return True
    return False


def _preferred(model: Any, ts: list[int]) -> int:
    """Of the tokens spelling one text, the vocabulary's own token rather than a byte-fallback one."""
    if len(ts) == 1:
        return ts[0]
    own = [t for t in ts if not _BYTE_TOKEN.match(model.token_text(t))]
    return (own or ts)[0]


_INDEXES: weakref.WeakKeyDictionary[Any, VocabIndex] = weakref.WeakKeyDictionary()


def vocab_index(model: Any) -> VocabIndex:
    """``model``'s :class:`VocabIndex`, built once per model (a 262k vocabulary: about a second)."""
    index = _INDEXES.get(model)
    if index is None:
        index = _INDEXES[model] = VocabIndex.of(model)
    return index


def _allowed_roots(g: GrammarSampler, index: VocabIndex) -> tuple[list[bytes], int]:
    """The root texts ``g`` allows, and how many end-of-generation tokens it allows."""
    ok = g.allowed(index.roots) if len(index.roots) else np.zeros(0, bool)
    n_eog = int(g.allowed(index.eog).sum()) if len(index.eog) else 0
    return [index.root_text[i] for i in np.flatnonzero(ok)], n_eog


def forced_token(g: GrammarSampler, index: VocabIndex) -> int | None:
    """The one token the grammar in state ``g`` allows next, or None when it allows none or several."""
    roots, n_eog = _allowed_roots(g, index)
    if len(roots) + n_eog != 1:
        return None
    if n_eog:
        return int(next(t for t, ok in zip(index.eog, g.allowed(index.eog)) if ok))
    only = index.tokens[roots[0]]
    if len(only) != 1:
        return None
    kids = index.children(roots[0])[0]
    if len(kids) and g.allowed(kids).any():
        return None
    return only[0]


def forced_bytes(g: GrammarSampler, index: VocabIndex, limit: int) -> bytes:
    """The text (at most ``limit`` bytes) every continuation the grammar in state ``g`` allows starts with,
    written in tokens; ``g`` is left advanced past it (give a clone). Empty where the grammar may end here or
    the next byte is not forced."""
    out = bytearray()
    while len(out) < limit:
        roots, n_eog = _allowed_roots(g, index)
        if n_eog or not roots or any(r[0] != roots[0][0] for r in roots):
            break
        step = bytes(roots[0][:1])
        probe = index.tokens.get(step)
        if probe is None:  # no token spells the byte alone: the grammar cannot be walked one byte on
            break
        g.accept(probe[0])
        out += step
    return bytes(out)


def tokens_of(text: bytes, index: VocabIndex) -> list[int]:
    """``text`` written in the vocabulary's tokens, each the longest text that fits (see the module
    docstring); stops where no token's text fits."""
    out: list[int] = []
    i = 0
    while i < len(text):
        k = next((k for k in range(min(index.longest, len(text) - i), 0, -1) if text[i : i + k] in index.preferred), 0)
        if k == 0:
            break
        out.append(index.preferred[text[i : i + k]])
        i += k
    return out
