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


class LoadedDraftModels:
    """The loaded models one or more caches share (see :meth:`DraftModelCache.share`): by resolved path,
    and how many open caches hold them (the last to close frees them)."""

    def __init__(self) -> None:
        self.models: dict[str, LlamaModel] = {}
        self.holders = 0


class DraftModelCache:
    """Loaded draft models of one target, by resolved path.

    ``loaded`` is the store of another cache to share (:meth:`share` passes it); by default a new one.
    """

    def __init__(self, target: LlamaModel, *, loaded: LoadedDraftModels | None = None) -> None:
        self.target = target
        self._loaded = loaded if loaded is not None else LoadedDraftModels()
        self._loaded.holders += 1
        self._closed = False

    def share(self) -> DraftModelCache:
        """A cache over the same loaded models (for a forked session); the models are freed when the last
        of the sharing caches is closed."""
        return DraftModelCache(self.target, loaded=self._loaded)

    def get(self, path: str | os.PathLike) -> LlamaModel:
        """The draft model at ``path``, loaded on first use and checked against the target's vocabulary.

        Raises :class:`~specviz.errors.ModelNotFoundError`, :class:`~specviz.errors.ModelFormatError` or
        :class:`~specviz.errors.VocabularyMismatchError`; a refused model is not kept.
        """
        key = str(Path(path).resolve())
        m = self._loaded.models.get(key)
        if m is None:
            # on the target's devices: a draft left on the CPU beside an offloaded target would make
            # every drafting step a host round trip
            m = LlamaModel(path, n_gpu_layers=self.target.n_gpu_layers)
            try:
                check_vocab_compatible(self.target.ptr, m.ptr)
            except Exception:
                m.close()
                raise
            self._loaded.models[key] = m
        return m

    def close(self) -> None:
        """Free every loaded draft model, unless another cache still shares them (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._loaded.holders -= 1
        if self._loaded.holders > 0:
            return
        for m in self._loaded.models.values():
            m.close()
        self._loaded.models.clear()
