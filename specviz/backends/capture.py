"""Reading a target's layer inputs while it decodes: the features an EAGLE-3 head drafts from.

EAGLE-3 heads read the *inputs* of three target layers (equivalently the outputs of the layers before
them) for every token the target evaluates. Two ways exist, chosen per architecture by
:func:`capture_method`:

``api``
    llama.cpp's own taps (``llama_set_embeddings_layer_inp`` / ``llama_get_embeddings_layer_inp`` of
    the staging header ``src/llama-ext.h``). Only graphs that record their layer inputs
    (``res->t_layer_inp``) support it; :data:`API_ARCHS` lists those of the vendored llama.cpp. Asking
    any other graph aborts the process (``GGML_ASSERT`` "layer input tensor is null"), so it is never
    asked.

``callback``
    For graphs that do not record them (``gemma3``, the embedded model): a small C eval callback
    (``capture_shim.c``, compiled once per machine into ``~/.cache/specviz/native``) copies the named
    layer outputs (``l_out-N``; ``inp_scaled`` for layer 0) as the scheduler computes them. The
    callback must be set when the context is created, so :class:`~specviz.backends.LlamaContext`
    installs it (switched off) on every context of such an architecture; switched off it answers
    "not needed" for every node and the graph runs in one piece, as without it.

    Deliberate departure from upstream: llama.cpp reads these features only through the ``api`` taps
    (``common/speculative.cpp``); the callback path is specviz's own, and it reads the same tensors
    (a layer's input is the previous layer's ``l_out``), which the tests check on the llama fixture
    where both paths exist.

Both capture every row of a batch (not only rows whose logits are requested), in batch order.

Once a context whose model has layers on a Vulkan device has evaluated a batch, llama.cpp's taps are
never switched again (:func:`taps_fixed`): switching one rebuilds the context's scheduler, and on that
backend the next multi-token batch then corrupts the heap. A capture closed there leaves its taps on (a
later capture of the same layers reuses them); one that would switch a tap on is refused, saying why,
and the session gives such drafters a new context instead (:mod:`specviz.decoding.target_context`).
Deliberate departure from upstream, which switches the taps whenever a drafter starts or stops.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import CaptureUnavailableError
from . import cbuild

#: Architectures whose graph in the vendored llama.cpp sets ``res->t_layer_inp[il]`` for every layer
#: (checked by reading ``src/models/*.cpp`` of llama-cpp-python 0.3.36's llama.cpp).
API_ARCHS = frozenset(
    {
        "llama",
        "nanbeige",
        "qwen3",
        "qwen3moe",
        "qwen3next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "gemma4",
        "muse-glimmer",
        "deepseek4",
        "nemotron_h",
        "bailingmoe3",
        "hunyuan_vl",
        "gpt-oss",
        "lfm2",
        "minimax-01",
        "minimax-m2",
        "mimo2",
    }
)

#: Architectures read through the eval-callback shim: the name of the tensor holding layer 0's input
#: (later layers' inputs are ``l_out-{k-1}``). ``gemma3`` scales the token embeddings by sqrt(n_embd)
#: into ``inp_scaled`` before layer 0 (``src/models/gemma3.cpp``).
CALLBACK_ARCHS: dict[str, str] = {"gemma3": "inp_scaled", "llama": "embd"}

_MAX_TAPS = 8
_NAME_LEN = 64


def capture_method(arch: str | None) -> str | None:
    """``"api"``, ``"callback"`` or ``None`` (no way to read this architecture's layer inputs).

    ``llama`` is in both tables; llama.cpp's own taps are preferred.
    """
    if arch in API_ARCHS:
        return "api"
    if arch in CALLBACK_ARCHS:
        return "callback"
    return None


def capture_unavailable_reason(arch: str | None) -> str | None:
    """Why layer inputs of ``arch`` cannot be read here, or ``None`` when they can."""
    m = capture_method(arch)
    if m is None:
        return (
            f"llama.cpp's {arch!r} graph does not record its layer inputs and specviz has no capture "
            "shim mapping for it"
        )
    if m == "api":
        from . import llama_ext

        try:
            llama_ext.ext()
        except CaptureUnavailableError as e:
            return str(e)
        return None
    try:
        shim_library()
    except CaptureUnavailableError as e:
        return str(e)
    return None


def layer_input_tensor_name(arch: str, layer: int) -> str:
    """The graph tensor holding the input of target layer ``layer`` (callback path)."""
    return CALLBACK_ARCHS[arch] if layer == 0 else f"l_out-{layer - 1}"


# -- the C shim ---------------------------------------------------------------------------------------------


class _ShimState(ctypes.Structure):
    # mirrors struct specviz_capture in capture_shim.c, field by field
    _fields_ = [
        ("get_name", ctypes.c_void_p),
        ("nbytes", ctypes.c_void_p),
        ("tensor_get", ctypes.c_void_p),
        ("enabled", ctypes.c_int32),
        ("n_taps", ctypes.c_int32),
        ("row_bytes", ctypes.c_int64),
        ("capacity_rows", ctypes.c_int64),
        ("names", (ctypes.c_char * _NAME_LEN) * _MAX_TAPS),
        ("dst", ctypes.c_void_p * _MAX_TAPS),
        ("rows", ctypes.c_int64 * _MAX_TAPS),
        ("calls", ctypes.c_int64),
        ("error", ctypes.c_int32),
    ]


_SHIM_SOURCE = Path(__file__).with_name("capture_shim.c")
#: The shim through the one loader of C helpers; it has no switch (what needs it is refused without it).
_SHIM = cbuild.NativeLibrary(
    _SHIM_SOURCE,
    "specviz_capture",
    {"specviz_capture_cb": (ctypes.c_bool, [ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p])},
    None,
)


def shim_cache_dir() -> Path:
    """Where compiled shims are kept (``$SPECVIZ_NATIVE_CACHE``, else ``~/.cache/specviz/native``)."""
    return cbuild.cache_dir()


def shim_path() -> Path:
    """The compiled shim's path; its name carries a hash of the source and the platform (the cache key)."""
    return cbuild.library_path(_SHIM_SOURCE, "specviz_capture")


def _unavailable(why: str) -> CaptureUnavailableError:
    """The error that says why the shim cannot be had, with what to run where a C compiler was missing."""
    hint = "; then run `python -m specviz.backends.build_capture` (or `make install`)" if "C compiler" in why else ""
    return CaptureUnavailableError(f"layer-capture shim: {why}{hint}")


def build_shim(force: bool = False) -> Path:
    """Compile the shim with the system C compiler (``$CC``, else ``cc``/``gcc``) unless already cached."""
    try:
        return _SHIM.build(force)
    except cbuild.BuildError as e:
        raise _unavailable(str(e)) from None


def shim_library() -> Any:
    """The loaded shim's functions (compiled on first use; ``capture_cb``, the eval callback);
    :class:`CaptureUnavailableError` when it cannot be had."""
    fns = _SHIM.load()
    if fns is None:
        raise _unavailable(_SHIM.unavailable_reason() or "not loaded")
    return fns


def _ggml_functions() -> tuple[int, int, int]:
    """Addresses of ggml_get_name, ggml_nbytes and ggml_backend_tensor_get in llama-cpp-python's libggml-base."""
    import llama_cpp

    libdir = Path(llama_cpp.__file__).parent / "lib"
    cands = (
        sorted(libdir.glob("libggml-base.so*"))
        + sorted(libdir.glob("libggml-base.dylib"))
        + sorted(libdir.glob("ggml-base.dll"))
    )
    if not cands:
        raise CaptureUnavailableError(f"libggml-base was not found next to llama-cpp-python ({libdir})")
    lib = ctypes.CDLL(str(cands[0]))
    return tuple(
        ctypes.cast(getattr(lib, n), ctypes.c_void_p).value  # type: ignore[return-value]
        for n in ("ggml_get_name", "ggml_nbytes", "ggml_backend_tensor_get")
    )


class CallbackTap:
    """The shim's state for one context: installed at context creation, armed by :class:`LayerCapture`."""

    def __init__(self) -> None:
        lib = shim_library()
        self.state = _ShimState()
        gn, nb, tg = _ggml_functions()
        self.state.get_name, self.state.nbytes, self.state.tensor_get = gn, nb, tg
        self.callback_address = ctypes.cast(lib.capture_cb, ctypes.c_void_p).value
        self._buffers: list[np.ndarray] = []
        self.owner: object | None = None  # the LayerCapture the shim currently serves

    @property
    def user_data(self) -> int:
        """Address of the state passed as ``cb_eval_user_data``."""
        return ctypes.addressof(self.state)

    def arm(self, names: Sequence[str], n_embd: int, capacity_rows: int, owner: object = None) -> list[np.ndarray]:
        """Capture ``names`` into fresh float32 buffers of ``capacity_rows`` x ``n_embd``; returns them.

        The shim serves one capture at a time: the newest ``owner`` wins, and :meth:`disarm` by an older
        owner (a drafter closed after its successor was built) leaves it alone."""
        if len(names) > _MAX_TAPS:
            raise CaptureUnavailableError(f"the capture shim holds at most {_MAX_TAPS} taps")
        s = self.state
        s.enabled = 0
        self._buffers = [np.zeros((capacity_rows, n_embd), dtype=np.float32) for _ in names]
        for i, n in enumerate(names):
            s.names[i].value = n.encode()
            s.dst[i] = self._buffers[i].ctypes.data
            s.rows[i] = 0
        s.n_taps = len(names)
        s.row_bytes = 4 * n_embd
        s.capacity_rows = capacity_rows
        s.error = 0
        s.enabled = 1
        self.owner = owner
        return self._buffers

    def disarm(self, owner: object = None) -> None:
        """Stop capturing (the callback then answers "not needed" for every node), unless another owner
        armed the shim since."""
        if owner is not None and owner is not self.owner:
            return
        self.state.enabled = 0
        self.state.n_taps = 0
        self.owner = None

    def reset_rows(self) -> None:
        """Start the next batch's rows at row 0."""
        for i in range(self.state.n_taps):
            self.state.rows[i] = 0
        self.state.error = 0

    def rows(self, i: int) -> int:
        """Rows written into tap ``i`` since the last reset."""
        return int(self.state.rows[i])


_API_USERS: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()
_API_ON: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()


def _api_users(ctx: Any) -> dict[int, int]:
    """How many live captures read each layer of ``ctx`` through llama.cpp's taps (a drafter may be closed
    after its successor switched the same taps on)."""
    return _API_USERS.setdefault(ctx, {})


def _api_on(ctx: Any) -> set[int]:
    """The layers of ``ctx`` whose llama.cpp tap is switched on (with or without a capture reading it)."""
    return _API_ON.setdefault(ctx, set())


#: ggml backends on which llama.cpp's layer taps must not be switched once a context has computed a graph.
#: Switching a tap marks the context's scheduler for a rebuild (``llama_context::sched_reserve``), and on
#: the Vulkan backend the next multi-token batch after that rebuild corrupts the heap: a segfault or glibc's
#: "double free or corruption", reproduced with llama.cpp's C API alone on Mesa's lavapipe.
#: CUDA is not listed: llama-server rebuilds its scheduler the same way whenever its LoRA adapters change,
#: and the GPU check runs ``tests/test_vulkan.py``'s switching tests on a CUDA build, which would show it.
TAPS_FIXED_BACKENDS = frozenset({"Vulkan"})


def fixed_tap_backend_present() -> bool:
    """Whether this llama.cpp build offloads layers to a device of :data:`TAPS_FIXED_BACKENDS`."""
    from .devices import gpu_devices

    return any(d.backend in TAPS_FIXED_BACKENDS for d in gpu_devices())


def taps_fixed(ctx: Any) -> bool:
    """Whether llama.cpp's layer taps of ``ctx`` can no longer be switched on or off: the context has
    evaluated a batch and its model has layers on a device of :data:`TAPS_FIXED_BACKENDS`."""
    return ctx.eval_count > 0 and ctx.model.n_gpu_layers > 0 and fixed_tap_backend_present()


@dataclass(frozen=True)
class CaptureInfo:
    """What a :class:`LayerCapture` reads: method, layers and their width."""

    method: str
    layers: tuple[int, ...]
    n_embd: int


class LayerCapture:
    """Reads the inputs of ``layers`` of a target context for every row of each batch it evaluates.

    Create it after the context; :meth:`features` returns ``[n_tokens, len(layers) * n_embd]`` for the
    context's last :meth:`~specviz.backends.LlamaContext.eval` call (rows in batch order, layers
    concatenated in the order given — the order the EAGLE-3 encoder ``fc`` expects). :meth:`close`
    switches the taps off again.
    """

    def __init__(self, ctx: Any, layers: Sequence[int], method: str | None = None) -> None:
        model = ctx.model
        arch = model.info.architecture
        self.layers = tuple(int(x) for x in layers)
        bad = [x for x in self.layers if not 0 <= x < model.n_layer]
        if bad:
            raise CaptureUnavailableError(
                f"layer {bad[0]} is not a layer of the target ({model.n_layer} layers, 0-{model.n_layer - 1}); "
                "specviz reads layer inputs, so EAGLE-3 target layers must lie in that range",
                knob="draft_model",
                value=bad[0],
            )
        self.ctx = ctx
        self.n_embd = int(model.n_embd)
        if method is None:  # llama.cpp's own taps win where both exist
            method = capture_method(arch)
        why: str | None
        if method not in ("api", "callback") or (method == "api" and arch not in API_ARCHS):
            why = capture_unavailable_reason(arch) or f"the {arch!r} graph does not record its layer inputs"
            raise CaptureUnavailableError(
                f"cannot read the hidden states of the target ({arch}): {why}", knob="strategy", value="eagle3"
            )
        if method == "api":
            why = capture_unavailable_reason(arch)
            if why is not None:
                raise CaptureUnavailableError(
                    f"cannot read the hidden states of the target ({arch}): {why}", knob="strategy", value="eagle3"
                )
        elif getattr(ctx, "tap", None) is None:
            why = capture_unavailable_reason(arch) or "the context was created without the capture callback"
            raise CaptureUnavailableError(
                f"cannot read the hidden states of the target ({arch}): {why}", knob="strategy", value="eagle3"
            )
        self.method = method
        self._n_cap = ctx.capacity.n_batch
        self._armed = False
        self._held = False
        self._tap_of: list[int] = []  # the callback path: each layer's tap (one a distinct layer)
        self._seen_eval = ctx.eval_count
        if method == "api":
            from . import llama_ext

            on = _api_on(ctx)
            off = [lid for lid in self.layers if lid not in on]
            if off and taps_fixed(ctx):
                raise CaptureUnavailableError(
                    f"cannot switch on llama.cpp's layer taps of the target ({arch}, layers "
                    f"{', '.join(map(str, sorted(set(off))))}) after it has evaluated a batch on a "
                    f"{'/'.join(sorted(TAPS_FIXED_BACKENDS))} device: that backend corrupts memory when the taps "
                    "change after the first batch; create the capture on a context that has evaluated nothing "
                    "yet (a Session does whenever it builds such a strategy: specviz.decoding.target_context), or "
                    "put the model on the CPU (n_gpu_layers=0)",
                    knob="strategy",
                    value="eagle3",
                )
            self._ext = llama_ext.ext()
            users = _api_users(ctx)
            for lid in self.layers:
                if lid not in on:
                    self._ext.set_embeddings_layer_inp(ctx.ptr, lid, True)
                    on.add(lid)
                users[lid] = users.get(lid, 0) + 1
        else:
            # one tap a distinct layer: the shim fills the first tap of a tensor's name, and a head may name a
            # layer twice (llama.cpp's own taps give such a layer's input at each place it is named)
            distinct = list(dict.fromkeys(self.layers))
            self._tap_of = [distinct.index(lid) for lid in self.layers]
            names = [layer_input_tensor_name(arch, lid) for lid in distinct]
            self._buffers = ctx.tap.arm(names, self.n_embd, self._n_cap, owner=self)
            ctx.before_eval = ctx.tap.reset_rows
        self._armed = True

    @property
    def info(self) -> CaptureInfo:
        """Method, layers and width."""
        return CaptureInfo(self.method, self.layers, self.n_embd)

    @property
    def can_hold(self) -> bool:
        """Whether :meth:`hold` can stop the copying: the callback path only. Switching llama.cpp's own taps
        rebuilds the context's scheduler (and is refused for good on some backends, :func:`taps_fixed`), too
        dear to do between two rounds, so those stay on."""
        return self.method == "callback"

    @property
    def held(self) -> bool:
        """Whether the capture is held: the batches evaluated meanwhile are not read (see :meth:`hold`)."""
        return self._held

    def hold(self, held: bool) -> bool:
        """Hold (``True``) or release the capture: while held, the shim answers "not needed" for every node,
        so the target's graph runs in one piece and copies nothing, as if no capture were armed, and
        :meth:`features` of a batch evaluated meanwhile is refused (the shim saw none of its rows). For a
        drafter that knows it will read no rows for a while (a paused EAGLE-3 head). Returns whether the
        capture is now held: always ``False`` where it cannot be (:attr:`can_hold`) or once closed."""
        held = bool(held) and self._armed and self.can_hold
        if held != self._held and self._armed and self.can_hold:
            tap = self.ctx.tap
            if tap.owner is self:
                tap.state.enabled = 0 if held else 1
            self._held = held
        return self._held

    def features(self, n_tokens: int) -> np.ndarray:
        """Features of the last batch's ``n_tokens`` rows: ``[n_tokens, len(layers) * n_embd]`` float32 (a copy)."""
        if not self._armed:
            raise CaptureUnavailableError("the layer capture was closed")
        if self._held:
            raise CaptureUnavailableError("the layer capture is held (hold(False) before the batch to read)")
        if self.ctx.eval_count == self._seen_eval:
            # llama.cpp's getter asserts (aborts) when no batch was evaluated with the taps on
            raise CaptureUnavailableError("no batch was evaluated since the layer capture was switched on")
        if n_tokens > self._n_cap:
            raise CaptureUnavailableError(f"{n_tokens} rows asked but a batch holds at most {self._n_cap}")
        out = np.empty((n_tokens, len(self.layers) * self.n_embd), dtype=np.float32)
        e = self.n_embd
        if self.method == "api":
            for k, lid in enumerate(self.layers):
                p = self._ext.get_embeddings_layer_inp(self.ctx.ptr, lid)
                if not p:
                    raise CaptureUnavailableError(f"llama.cpp returned no input for layer {lid}")
                src = np.ctypeslib.as_array(p, shape=(n_tokens, e))
                out[:, k * e : (k + 1) * e] = src
        else:
            tap = self.ctx.tap
            if tap.state.error:
                raise CaptureUnavailableError(
                    f"the capture shim reported error {tap.state.error} "
                    "(a tensor larger than the batch or of an unexpected width)"
                )
            for k, i in enumerate(self._tap_of):
                if tap.rows(i) < n_tokens:
                    name = layer_input_tensor_name(self.ctx.model.info.architecture, self.layers[k])
                    raise CaptureUnavailableError(
                        f"the capture shim saw {tap.rows(i)} rows of {name!r}, {n_tokens} expected"
                    )
                out[:, k * e : (k + 1) * e] = self._buffers[i][:n_tokens]
        return out

    def close(self) -> None:
        """Switch the taps off (idempotent)."""
        if not self._armed:
            return
        self._armed = False
        self._held = False
        if getattr(self.ctx, "_ctx", None) is None:
            return
        if self.method == "api":
            users, on = _api_users(self.ctx), _api_on(self.ctx)
            fixed = taps_fixed(self.ctx)  # then the taps stay on: a copy of each layer's input per batch
            for lid in self.layers:
                users[lid] = users.get(lid, 1) - 1
                if users[lid] <= 0 and not fixed:  # the last capture reading this layer switches its tap off
                    self._ext.set_embeddings_layer_inp(self.ctx.ptr, lid, False)
                    on.discard(lid)
        else:
            if self.ctx.tap.owner is self:
                self.ctx.before_eval = None
            self.ctx.tap.disarm(owner=self)
