"""Draft GGUFs a session may draft with, loaded once each and checked against the target's vocabulary.

A draft model is loaded and checked when a strategy that needs one is *configured* (``start``,
``configure``, a restore), never when the change is applied at a round boundary: a model that cannot be
used is refused before anything of the running generation is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..backends.llama import LlamaModel
from .vocab import check_vocab_compatible


class DraftModelCache:
    """Loaded draft models of one target, by resolved path."""

    def __init__(self, target: LlamaModel) -> None:
        self.target = target
        self._models: dict[str, LlamaModel] = {}
        self._holders = [1]  # caches sharing these models (see share); the last close frees them
        self._closed = False

    def share(self) -> DraftModelCache:
        """A cache over the same loaded models (for a forked session); the models are freed when the last
        of the sharing caches is closed."""
        other = DraftModelCache.__new__(DraftModelCache)
        other.target, other._models, other._holders, other._closed = self.target, self._models, self._holders, False
        self._holders[0] += 1
        return other

    def get(self, path: str | os.PathLike) -> LlamaModel:
        """The draft model at ``path``, loaded on first use and checked against the target's vocabulary.

        Raises :class:`~specviz.errors.ModelNotFoundError`, :class:`~specviz.errors.ModelFormatError` or
        :class:`~specviz.errors.VocabularyMismatchError`; a refused model is not kept.
        """
        key = str(Path(path).resolve())
        m = self._models.get(key)
        if m is None:
            m = LlamaModel(path)
            try:
                check_vocab_compatible(self.target.ptr, m.ptr)
            except Exception:
                m.close()
                raise
            self._models[key] = m
        return m

    def close(self) -> None:
        """Free every loaded draft model, unless another cache still shares them (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._holders[0] -= 1
        if self._holders[0] > 0:
            return
        for m in self._models.values():
            m.close()
        self._models.clear()
