"""Model backends. Today one: llama.cpp through llama-cpp-python's low-level API."""

from .gguf_check import GGUFInfo, check_gguf
from .llama import Capacity, LlamaContext, LlamaModel

__all__ = ["Capacity", "GGUFInfo", "LlamaContext", "LlamaModel", "check_gguf"]
