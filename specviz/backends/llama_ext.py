"""ctypes bindings of the llama.cpp staging header ``src/llama-ext.h`` that llama-cpp-python does not bind.

llama-cpp-python 0.3.36 binds the header's NextN functions by their C++ mangled names
(``llama_cpp/llama_cpp_ext.py``); EAGLE-3 also needs the layer-input taps and the draft model's target
layer list, which it does not bind. This module binds them the same way: the Itanium C++ mangled name
(checked with ``nm -D libllama.so`` on the installed wheel), then the plain C name, then the MSVC one.

A build of llama.cpp without these symbols makes :func:`ext` raise
:class:`~specviz.errors.CaptureUnavailableError` (typed, never an abort); callers check
:func:`available` first when they only want to know.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from ..errors import CaptureUnavailableError

# name -> (candidate symbol names, argtypes builder, restype builder); builders take llama_cpp.llama_cpp.
_SYMBOLS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "set_embeddings_layer_inp": (
        (
            "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
            "llama_set_embeddings_layer_inp",
            "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z",
        ),
        "ctx,u32,bool",
        "void",
    ),
    "get_embeddings_layer_inp": (
        (
            "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
            "llama_get_embeddings_layer_inp",
            "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z",
        ),
        "ctx,u32",
        "floatp",
    ),
    "model_target_layer_ids": (
        (
            "_Z28llama_model_target_layer_idsPK11llama_model",
            "llama_model_target_layer_ids",
            "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z",
        ),
        "model",
        "i32p",
    ),
    "model_target_layer_ids_n": (
        (
            "_Z30llama_model_target_layer_ids_nPK11llama_model",
            "llama_model_target_layer_ids_n",
            "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z",
        ),
        "model",
        "u32",
    ),
}


@dataclass(frozen=True)
class LlamaExt:
    """The bound staging-header functions (plus llama-cpp-python's own NextN bindings)."""

    set_embeddings_layer_inp: Any
    get_embeddings_layer_inp: Any
    model_target_layer_ids: Any
    model_target_layer_ids_n: Any
    set_embeddings_nextn: Any
    get_embeddings_nextn: Any
    get_embeddings_nextn_ith: Any


_cached: LlamaExt | None = None
_error: str | None = None


def _types(spec: str, lc: Any) -> list:
    table = {
        "ctx": lc.llama_context_p_ctypes,
        "model": lc.llama_model_p_ctypes,
        "u32": ctypes.c_uint32,
        "bool": ctypes.c_bool,
        "i32": ctypes.c_int32,
    }
    return [table[s] for s in spec.split(",")] if spec else []


def _restype(spec: str) -> Any:
    return {
        "void": None,
        "floatp": ctypes.POINTER(ctypes.c_float),
        "i32p": ctypes.POINTER(ctypes.c_int32),
        "u32": ctypes.c_uint32,
    }[spec]


def _unbound(*args: Any) -> None:
    """The Python stand-in a ctypes binding replaces (never called)."""


def _load() -> LlamaExt:
    import llama_cpp.llama_cpp as lc

    funcs: dict[str, Any] = {}
    for key, (names, args, res) in _SYMBOLS.items():
        for n in names:
            try:
                # llama-cpp-python's own binder for its functions: looks the symbol up in the library it
                # loaded and sets the types (AttributeError when the library does not export it)
                funcs[key] = lc.ctypes_function(n, _types(args, lc), _restype(res))(_unbound)
                break
            except AttributeError:
                continue
        else:
            raise CaptureUnavailableError(
                f"this llama.cpp build does not export {names[1]} (llama-ext.h); specviz needs llama-cpp-python "
                "0.3.36 as built by `make install`"
            )
    try:
        import llama_cpp.llama_cpp_ext as ext
    except (ImportError, AttributeError) as exc:
        raise CaptureUnavailableError(
            f"llama-cpp-python's llama_cpp_ext bindings are unavailable ({exc}); specviz needs llama-cpp-python 0.3.36"
        ) from None
    return LlamaExt(
        funcs["set_embeddings_layer_inp"],
        funcs["get_embeddings_layer_inp"],
        funcs["model_target_layer_ids"],
        funcs["model_target_layer_ids_n"],
        ext.llama_set_embeddings_nextn,
        ext.llama_get_embeddings_nextn,
        ext.llama_get_embeddings_nextn_ith,
    )


def ext() -> LlamaExt:
    """The bindings; :class:`~specviz.errors.CaptureUnavailableError` when the library lacks a symbol."""
    global _cached, _error
    if _cached is None:
        if _error is not None:
            raise CaptureUnavailableError(_error)
        try:
            _cached = _load()
        except CaptureUnavailableError as e:
            _error = str(e)
            raise
    return _cached


def available() -> bool:
    """True when every binding resolved."""
    try:
        ext()
    except CaptureUnavailableError:
        return False
    return True


def target_layer_ids(model_ptr: Any) -> list[int]:
    """The target layers an ``eagle3``/``dflash`` draft model reads (empty for other models)."""
    e = ext()
    n = int(e.model_target_layer_ids_n(model_ptr))
    if n == 0:
        return []
    p = e.model_target_layer_ids(model_ptr)
    return [int(p[i]) for i in range(n)]
