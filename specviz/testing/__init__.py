"""Test support: tiny real llama.cpp models written with ``gguf`` (:mod:`.tiny_models`), a stand-alone page
that drives the inspector's front-end (:mod:`.page_harness`) and synthetic rounds for the UI benchmarks
(:mod:`.synthetic`). Not used by the runtime."""

from __future__ import annotations

from .tiny_models import tiny_vocab, tiny_weights, write_tiny_eagle3, write_tiny_llama, write_tiny_nextn

__all__ = ["tiny_vocab", "tiny_weights", "write_tiny_eagle3", "write_tiny_llama", "write_tiny_nextn"]
