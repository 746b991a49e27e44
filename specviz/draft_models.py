"""Draft GGUFs a session may draft with, loaded once each and checked against the target's vocabulary.

A draft model is loaded and checked when a strategy that needs one is *configured* (``start``,
``configure``, a restore), never when the change is applied at a round boundary: a model that cannot be
used is refused before anything of the running generation is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

from .backends.llama import LlamaModel
from .vocab import check_vocab_compatible


class DraftModelCache:
    """Loaded draft models of one target, by resolved path."""

    def __init__(self, target: LlamaModel) -> None:
        self.target = target
        self._models: dict[str, LlamaModel] = {}

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
        """Free every loaded draft model."""
        for m in self._models.values():
            m.close()
        self._models.clear()
