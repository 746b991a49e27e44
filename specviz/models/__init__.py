"""Model files: the embedded default (:mod:`.embedded`), draft GGUFs loaded once per session
(:mod:`.draft_cache`), the vocabulary check (:mod:`.vocab`), derived drafts (:mod:`.derive`) and the EAGLE-3
head writer (:mod:`.eagle3_gguf`)."""

from __future__ import annotations

from .embedded import default_model_path, resolve_model

__all__ = ["default_model_path", "resolve_model"]
