"""The compute devices llama.cpp can run on: ggml's backend registry, as the installed build sees it.

A llama-cpp-python wheel built with a GPU backend (``make install LLAMA_BACKEND=vulkan|cuda|metal``)
registers that backend's devices beside the CPU; :func:`devices` lists them in registry order, and
:func:`gpu_devices` the ones a model's layers go to when loaded with ``n_gpu_layers > 0``
(:class:`~specviz.backends.LlamaModel`). The registry is filled once per process, at the first call into
it: Vulkan then reads ``GGML_VK_VISIBLE_DEVICES`` (needed for a CPU-type Vulkan device such as Mesa's
lavapipe, which ggml otherwise skips), CUDA ``CUDA_VISIBLE_DEVICES``.

ggml's functions are bound here with ctypes from the libraries llama-cpp-python has loaded: its binding
exposes none of the device registry.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ContextSettingsError

#: ``-ngl all``: more layers than any model has, which llama.cpp reads as every layer and the output layer
ALL_GPU_LAYERS = 999
#: the most ``-ngl`` takes as a number
MAX_GPU_LAYERS = 1 << 16

#: ``enum ggml_backend_dev_type`` of the vendored ggml (ggml/include/ggml-backend.h), in order.
DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel", "meta")


@dataclass(frozen=True)
class Device:
    """One device of ggml's registry.

    ``name`` is ggml's (``CPU``, ``Vulkan0``, ``CUDA0``, ``MTL0``), ``backend`` the name of the backend that
    registered it (``CPU``, ``Vulkan``, ``CUDA``, ``Metal``), ``kind`` one of :data:`DEVICE_KINDS`, and the
    memory figures are what the backend reports, in bytes.
    """

    name: str
    description: str
    backend: str
    kind: str
    memory_free: int
    memory_total: int

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary form."""
        return dict(
            name=self.name,
            description=self.description,
            backend=self.backend,
            kind=self.kind,
            memory_free=self.memory_free,
            memory_total=self.memory_total,
        )


_lock = threading.Lock()
_bound: tuple[Any, Any] | None = None


def _libraries() -> tuple[Any, Any]:
    """``(libggml, libggml-base)`` of the installed llama-cpp-python, with the registry's signatures set."""
    global _bound
    with _lock:
        if _bound is not None:
            return _bound
        import llama_cpp

        libdir = Path(llama_cpp.__file__).parent / "lib"

        def load(stem: str) -> Any:
            for pattern in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll"):
                hits = sorted(libdir.glob(pattern))
                if hits:
                    return ctypes.CDLL(str(hits[0]))
            raise OSError(f"{stem} was not found next to llama-cpp-python ({libdir})")

        ggml, base = load("ggml"), load("ggml-base")
        vp, cp, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        ggml.ggml_backend_dev_count.restype = sz
        ggml.ggml_backend_dev_count.argtypes = []
        ggml.ggml_backend_dev_get.restype = vp
        ggml.ggml_backend_dev_get.argtypes = [sz]
        for fn, res in (("ggml_backend_dev_name", cp), ("ggml_backend_dev_description", cp)):
            getattr(base, fn).restype = res
            getattr(base, fn).argtypes = [vp]
        base.ggml_backend_dev_type.restype = ctypes.c_int
        base.ggml_backend_dev_type.argtypes = [vp]
        base.ggml_backend_dev_memory.restype = None
        base.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]
        base.ggml_backend_dev_backend_reg.restype = vp
        base.ggml_backend_dev_backend_reg.argtypes = [vp]
        base.ggml_backend_reg_name.restype = cp
        base.ggml_backend_reg_name.argtypes = [vp]
        _bound = (ggml, base)
        return _bound


def devices() -> list[Device]:
    """Every device in ggml's registry (the CPU included), in registry order."""
    ggml, base = _libraries()
    out: list[Device] = []
    for i in range(int(ggml.ggml_backend_dev_count())):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = int(base.ggml_backend_dev_type(dev))
        reg = base.ggml_backend_dev_backend_reg(dev)
        out.append(
            Device(
                name=(base.ggml_backend_dev_name(dev) or b"").decode("utf-8", "replace"),
                description=(base.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
                backend=(base.ggml_backend_reg_name(reg) or b"").decode("utf-8", "replace") if reg else "",
                kind=DEVICE_KINDS[kind] if 0 <= kind < len(DEVICE_KINDS) else f"type-{kind}",
                memory_free=int(free.value),
                memory_total=int(total.value),
            )
        )
    return out


def gpu_devices() -> list[Device]:
    """The devices llama.cpp offloads model layers to (discrete and integrated GPUs)."""
    return [d for d in devices() if d.kind in ("gpu", "igpu")]


def backend_names() -> list[str]:
    """The names of the registered backends that own at least one device (``["Vulkan", "CPU"]``, ...)."""
    seen: list[str] = []
    for d in devices():
        if d.backend and d.backend not in seen:
            seen.append(d.backend)
    return seen


def gpu_layers_value(text: object, *, label: str = "-ngl") -> int | None:
    """A model placement in llama.cpp's spellings of ``-ngl`` (``common/arg.cpp``): a number of layers
    (0 to :data:`MAX_GPU_LAYERS`), ``all`` (:data:`ALL_GPU_LAYERS`) or ``auto`` (None; see
    :func:`auto_gpu_layers`). :class:`~specviz.errors.ContextSettingsError` naming ``label`` otherwise."""
    word = str(text).strip().lower()
    if word == "auto":
        return None
    if word == "all":
        return ALL_GPU_LAYERS
    try:
        n = int(word)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_GPU_LAYERS:
        raise ContextSettingsError(
            f"{label}: {text!r} is not allowed; expected a number of layers from 0 to {MAX_GPU_LAYERS}, 'all' or "
            "'auto' (more layers than the model has puts all of them and the output layer on the GPU)",
            knob="n_gpu_layers",
            value=text,
        )
    return n


def auto_gpu_layers() -> int:
    """What specviz puts on a GPU for llama.cpp's ``-ngl auto`` (llama-server's default): every layer
    (:data:`ALL_GPU_LAYERS`) on a build with a GPU device, none on a CPU build.

    Departure: llama.cpp's ``auto`` fits the layers into the device's free memory (``--fit``, on by default) and
    keeps the rest on the CPU; specviz does not fit, so a model larger than the GPU's memory fails to load
    instead (give ``-ngl N``)."""
    return ALL_GPU_LAYERS if gpu_devices() else 0
