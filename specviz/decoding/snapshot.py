"""Snapshots: a whole session in one checksummed envelope, and its careful reading back.

Envelope layout: the magic line, an 8-byte little-endian header length, the JSON header, the binary
blobs named in ``header["blobs"]`` in order (the target context's state, then the drafter's context
state), and a SHA-256 of everything before it.

The header holds the models' identity (path, size, vocabulary size, a fingerprint of the file), the
context sizes, the token history, the generation's settings (budget, sampling, seed and the generator's
state), the strategy and its knobs (and a configuration change still pending), the round counter,
telemetry counters, the drafter's state and the drafting policy's state.

Reading is defensive: :func:`unpack` refuses a wrong magic, a bad checksum, an unreadable header or
blobs of the wrong length; :func:`read_header` checks every field's type and range, so a snapshot that
passed the checksum but was written by another version or by hand cannot reach llama.cpp with
nonsense; :func:`check_checkpoints` checks every field of every rewind checkpoint; and each llama.cpp
state is read and checked before llama.cpp sees it (:mod:`specviz.backends.saved_state`: the checksum is
no key, anyone can recompute it, so the contents are what is checked). Every refusal is a
:class:`~specviz.errors.SnapshotError`, and a refused restore changes nothing.

As the fllamer guide describes its envelope: target, draft, token-history, position and the strategy's
private state travel together; draftless strategy state is rebuilt from the history and completed
from the saved state.
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..backends.grammar import check_gbnf
from ..errors import ContextError, GrammarError, KnobError, ModelError, SnapshotError
from ..strategies import strategy_class
from ..strategies.context_drafter import context_hooks
from .constrained import GrammarState
from .events import event_from_dict
from .generation import Checkpoint, Generation, SessionParts
from .policy import VerifyCostModel, make_policy
from .sampling import SamplingParams
from .telemetry import Telemetry

if TYPE_CHECKING:
    from ..strategies.base import Drafter

MAGIC = b"SPECVIZ-SNAPSHOT-1\n"
_DIGEST = 32
#: The largest header a snapshot may have (JSON; a long generation's events and checkpoints fit with room):
#: checked from the declared length before the header is parsed.
MAX_HEADER_BYTES = 64 << 20


def pack(header: dict[str, Any], blobs: list[tuple[str, bytes]]) -> bytes:
    """The envelope of ``header`` (to which the blob lengths are added) and the named ``blobs``."""
    header = dict(header, blobs={name: len(b) for name, b in blobs})
    hb = json.dumps(header, separators=(",", ":")).encode()
    body = MAGIC + struct.pack("<Q", len(hb)) + hb + b"".join(b for _, b in blobs)
    return body + hashlib.sha256(body).digest()


def check_envelope_start(prefix: bytes, total: int | None = None) -> int:
    """The header length an envelope's first bytes declare, refused with :class:`SnapshotError` (before
    anything is parsed) when they do not start a specviz snapshot, or the header would be larger than
    :data:`MAX_HEADER_BYTES` or than the ``total`` bytes of the envelope."""
    if len(prefix) < len(MAGIC) + 8 or not prefix.startswith(MAGIC):
        raise SnapshotError("not a specviz snapshot (wrong header); pass the bytes returned by Session.snapshot()")
    (hlen,) = struct.unpack("<Q", prefix[len(MAGIC) : len(MAGIC) + 8])
    if hlen > MAX_HEADER_BYTES or (total is not None and len(MAGIC) + 8 + hlen + _DIGEST > total):
        raise SnapshotError(
            f"the snapshot header is {hlen} bytes long, more than the snapshot holds or than "
            f"{MAX_HEADER_BYTES >> 20} MiB; it was not written by specviz"
        )
    return hlen


def unpack(blob: Any) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The header and the named blobs of an envelope written by :func:`pack`."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise SnapshotError("a snapshot must be the bytes returned by Session.snapshot()")
    blob = bytes(blob)
    if len(blob) < len(MAGIC) + 8 + _DIGEST or not blob.startswith(MAGIC):
        raise SnapshotError("not a specviz snapshot (wrong header); pass the bytes returned by Session.snapshot()")
    hlen = check_envelope_start(blob[: len(MAGIC) + 8], len(blob))
    body, digest = blob[:-_DIGEST], blob[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise SnapshotError("the snapshot is corrupted (checksum mismatch); it cannot be restored")
    start = len(MAGIC) + 8
    try:
        header = json.loads(body[start : start + hlen])
    except ValueError:
        raise SnapshotError("the snapshot header is unreadable") from None
    if not isinstance(header, dict) or not isinstance(header.get("blobs"), dict):
        raise SnapshotError("the snapshot header is not a specviz header")
    out: dict[str, bytes] = {}
    pos = start + hlen
    for name, n in header["blobs"].items():
        if not isinstance(n, int) or n < 0 or pos + n > len(body):
            raise SnapshotError(f"the snapshot is truncated ({name} state missing)")
        out[name] = body[pos : pos + n]
        pos += n
    if pos != len(body):
        raise SnapshotError("the snapshot has trailing bytes after its states; it was not written by specviz")
    return header, out


def with_knobs_mapped(
    blob: Any,
    knobs: Callable[[dict[str, Any]], dict[str, Any]],
    event: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    **fields: Any,
) -> bytes:
    """``blob`` (an envelope) with every knob dictionary of its header passed through ``knobs`` (the session's,
    the pending reconfiguration's, each rewind checkpoint's), each recorded event through ``event``, and the
    header ``fields`` set; the states unchanged. An entry of another shape is left as it is (a restore
    refuses it). Refused as :func:`unpack` refuses; what ``knobs`` or ``event`` raise is raised."""
    header, blobs = unpack(blob)
    header = dict(header, **fields)
    if isinstance(header.get("knobs"), dict):
        header["knobs"] = knobs(header["knobs"])
    pending = header.get("pending")
    if isinstance(pending, list) and len(pending) == 2 and isinstance(pending[1], dict):
        header["pending"] = [pending[0], knobs(pending[1])]
    wb = header.get("workbench")
    if isinstance(wb, dict):
        wb = dict(wb)
        if event is not None and isinstance(wb.get("events"), list):
            wb["events"] = [event(e) for e in wb["events"]]
        if isinstance(wb.get("checkpoints"), list):
            wb["checkpoints"] = [
                dict(c, knobs=knobs(c["knobs"])) if isinstance(c, dict) and isinstance(c.get("knobs"), dict) else c
                for c in wb["checkpoints"]
            ]
        header["workbench"] = wb
    header.pop("blobs", None)
    return pack(header, list(blobs.items()))


@dataclass(frozen=True)
class SnapshotHeader:
    """The checked fields of a snapshot header (see the module docstring)."""

    model: str
    model_size: int
    model_fingerprint: str | None
    n_vocab: int
    ctx: dict[str, Any]
    history: list[int]
    n_prompt: int
    max_tokens: int
    sampling: dict[str, Any]
    seed: int
    rng: dict[str, Any] | None
    strategy: str
    knobs: dict[str, Any]
    pending: tuple[str, dict[str, Any]] | None
    round: int
    finished: str | None
    telemetry: dict[str, Any]
    drafter_state: dict[str, Any] | None
    policy_state: dict[str, Any]
    cost_model: dict[str, Any] | None
    #: the target's cache holds the pending token too (a whole-prompt prefill's start, see ``Session``)
    prefilled: bool = False


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise SnapshotError(
            f"the snapshot header is malformed: {what}; restore a snapshot written by Session.snapshot()"
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_header(h: dict[str, Any]) -> SnapshotHeader:
    """Check every field of a header returned by :func:`unpack` (types and ranges, not the models)."""
    _need(h.get("version") == 1, f"version {h.get('version')!r} (this specviz reads version 1)")
    for key in ("model", "strategy"):
        _need(isinstance(h.get(key), str), f"{key!r} is not a string")
    for key in ("model_size", "n_vocab", "n_prompt", "max_tokens", "round", "seed"):
        _need(_is_int(h.get(key)) and h[key] >= 0, f"{key!r} is not a non-negative integer")
    for key in ("ctx", "knobs", "telemetry", "sampling"):
        _need(isinstance(h.get(key), dict), f"{key!r} is not an object")
    hist = h.get("history")
    if not isinstance(hist, list):
        hist = []
    _need(len(hist) >= 1 and all(_is_int(t) for t in hist), "'history' is not a token list")
    _need(all(0 <= t < h["n_vocab"] for t in hist), "'history' holds token ids outside the vocabulary")
    _need(1 <= h["n_prompt"] <= len(hist), "'n_prompt' does not fit the history")
    _need(h.get("finished") is None or isinstance(h["finished"], str), "'finished' is not a string")
    pending = h.get("pending")
    _need(
        pending is None
        or (
            isinstance(pending, list)
            and len(pending) == 2
            and isinstance(pending[0], str)
            and isinstance(pending[1], dict)
        ),
        "'pending' is not [strategy, knobs]",
    )
    for key in ("drafter_state", "cost_model", "rng"):
        _need(h.get(key) is None or isinstance(h[key], dict), f"{key!r} is not an object")
    _need(isinstance(h.get("policy_state", {}), dict), "'policy_state' is not an object")
    fp = h.get("model_fingerprint")
    _need(fp is None or isinstance(fp, str), "'model_fingerprint' is not a string")
    _need(isinstance(h.get("prefilled", False), bool), "'prefilled' is not true or false")
    return SnapshotHeader(
        model=h["model"],
        model_size=h["model_size"],
        model_fingerprint=fp,
        n_vocab=h["n_vocab"],
        ctx=h["ctx"],
        history=list(hist),
        n_prompt=h["n_prompt"],
        max_tokens=h["max_tokens"],
        sampling=h["sampling"],
        seed=h["seed"],
        rng=h.get("rng"),
        strategy=h["strategy"],
        knobs=h["knobs"],
        pending=(pending[0], pending[1]) if pending else None,
        round=h["round"],
        finished=h.get("finished"),
        telemetry=h["telemetry"],
        drafter_state=h.get("drafter_state"),
        policy_state=h.get("policy_state") or {},
        cost_model=h.get("cost_model"),
        prefilled=h.get("prefilled", False),
    )


# -- a session's snapshot: taking it, and restoring it all-or-nothing ------------------------------------


def take_snapshot(s: SessionParts) -> bytes:
    """The envelope of session ``s`` (started): header fields and the target's and drafter's states."""
    assert s.drafter is not None
    g = s.generation
    header = {
        "version": 1,
        "model": str(s.model.path),
        "model_size": s.model.path.stat().st_size,
        "model_fingerprint": s.model.fingerprint,
        "n_vocab": s.model.n_vocab,
        "ctx": dict(s.context_args),
        "history": g.history,
        "n_prompt": g.n_prompt,
        "max_tokens": g.max_tokens,
        "temperature": g.sampling.temperature,
        "sampling": g.sampling.to_dict(),
        "seed": g.seed,
        "rng": s.rng.bit_generator.state,
        "strategy": g.strategy,
        "knobs": g.knobs,
        "pending": list(g.pending) if g.pending else None,
        "round": g.round_index,
        "finished": g.finished,
        "telemetry": g.telemetry.state(),
        "drafter_state": s.drafter.state(),
        "policy_state": g.policy.state(),
        "cost_model": s.cost_model.to_dict() if s.cost_model is not None else None,
        "workbench": extras_state(g),
        "prefilled": g.prefilled,
    }
    hooks = context_hooks(s.drafter)
    blob = hooks.context_state() if hooks is not None else b""
    return pack(header, [("target", s.ctx.state()), ("drafter", blob)])


def restore_snapshot(s: SessionParts, blob: bytes) -> None:
    """Restore ``blob`` into session ``s`` (same model and context sizes), all or nothing: every field is
    checked first; a new :class:`~specviz.decoding.generation.Generation` and drafter are built and swapped
    in only when everything succeeded, and if building fails half-way the cache and the generator are put
    back as they were."""
    header, blobs = unpack(blob)
    h = read_header(header)
    m = s.model
    if (
        h.n_vocab != m.n_vocab
        or h.model_size != m.path.stat().st_size
        or (h.model_fingerprint is not None and h.model_fingerprint != m.fingerprint)
    ):
        raise SnapshotError(
            f"the snapshot was taken with model {h.model} ({h.n_vocab} tokens); this session "
            f"runs {m.path}: restore it into a session of that model"
        )
    ctx_args = s.context_args
    # a snapshot written before the memory options carries neither: it was taken with their defaults; the
    # cache types and flash attention decide the layout of the saved KV cache (llama.cpp stores V transposed
    # without flash attention), and a snapshot from before they were recorded had the defaults
    defaults = {"swa_full": True, "n_rs_seq": None, "flash_attn": "auto", "cache_type_k": "f16", "cache_type_v": "f16"}
    keys = ("n_ctx", "n_batch", "n_ubatch", "swa_full", "n_rs_seq", "flash_attn", "cache_type_k", "cache_type_v")
    for k in keys:
        if h.ctx.get(k, defaults.get(k)) != ctx_args.get(k, defaults.get(k)):
            raise SnapshotError(
                f"the snapshot's context has {k}={h.ctx.get(k, defaults.get(k))!r}, this session "
                f"{ctx_args.get(k, defaults.get(k))!r}; restore it with Session.restore(), which creates a "
                "matching session"
            )
    if len(h.history) > s.ctx.capacity.n_ctx:
        raise SnapshotError("the snapshot's history is longer than the context")
    try:
        cfg = s.validate_config(h.strategy, h.knobs)
        pending = (h.pending[0], s.validate_config(h.pending[0], h.pending[1])) if h.pending else None
        sampling = SamplingParams(**h.sampling)
        telemetry = Telemetry.from_state(h.telemetry)
    except (KnobError, TypeError) as exc:
        raise SnapshotError(f"the snapshot's settings are refused: {exc}") from exc
    check_checkpoints(s, header.get("workbench"))
    backup = s.ctx.state() if s.generation.started else None
    rng_state = s.rng.bit_generator.state
    built: list[Drafter] = []  # the drafter _build makes, closed again if a later step fails
    try:
        gen, cost_model = _build(s, h, blobs, cfg, pending, sampling, telemetry, header.get("workbench"), built)
    except Exception as exc:
        for d in built:
            d.close()
        s.rng.bit_generator.state = rng_state
        if backup is not None:
            s.ctx.load_state(backup)
        else:
            s.ctx.clear()
        if isinstance(exc, (SnapshotError, ContextError, ValueError, TypeError, KeyError, IndexError)):
            raise SnapshotError(f"the snapshot cannot be restored: {exc}") from exc
        raise
    old = s.drafter
    s.generation, s.drafter, s.cost_model = gen, built[0], cost_model
    if old is not None and old is not s.drafter:
        old.close()


def _build(
    s: SessionParts,
    h: SnapshotHeader,
    blobs: dict[str, bytes],
    cfg: dict[str, Any],
    pending: Any,
    sampling: SamplingParams,
    telemetry: Telemetry,
    extras: Any,
    built: list[Drafter],
) -> tuple[Generation, VerifyCostModel | None]:
    """Load a checked snapshot's caches into ``s``'s contexts and build its generation, drafter (appended
    to ``built``) and verify cost model; :func:`restore_snapshot` swaps them in, or undoes this on failure."""
    g = Generation(
        history=list(h.history),
        n_prompt=h.n_prompt,
        max_tokens=h.max_tokens,
        sampling=sampling,
        seed=h.seed,
        strategy=h.strategy,
        knobs=cfg,
        pending=pending,
        round_index=h.round,
        finished=h.finished,
        telemetry=telemetry,
    )
    # the cache holds every committed position and no other: a state with a cell beyond them is refused
    # (a whole-prompt prefill's start holds the pending token too: it is dropped, the session that
    # restores decides how its first round reads it, see Session.restore_into)
    s.ctx.load_state(blobs.get("target", b""), max_pos=g.committed + int(h.prefilled))
    if h.prefilled:
        s.ctx.memory.cut(g.committed, g.history)
    s.rng.bit_generator.state = np.random.default_rng(h.seed).bit_generator.state
    if h.rng:
        try:
            s.rng.bit_generator.state = h.rng
        except (TypeError, ValueError, KeyError) as exc:
            raise SnapshotError(f"the generator state is malformed ({exc})") from None
    cost_model = s.cost_model
    if h.cost_model:
        try:
            cost_model = VerifyCostModel(h.cost_model["sizes"], h.cost_model["seconds"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"the verify cost model is malformed ({exc})") from None
    g.policy = make_policy(cfg.get("draft_policy", "fixed"), cost_model)
    g.policy.load(h.policy_state)
    drafter = s.build_drafter(h.strategy, cfg, sampling)
    built.append(drafter)
    drafter.begin(g.history)
    hooks = context_hooks(drafter)
    if blobs.get("drafter") and hooks is not None:
        hooks.load_context_state(blobs["drafter"])
    if h.drafter_state is not None and h.drafter_state.get("format"):
        drafter.load_state(h.drafter_state)
    g.started = True
    load_extras(g, extras, drafter, s.rng)
    g.grammar = restored_grammar(s.model, extras, g)
    if s.ctx.kv_len() != g.committed:
        raise SnapshotError(f"the restored cache holds {s.ctx.kv_len()} positions, expected {g.committed}")
    return g, cost_model


# -- the events, checkpoints and stop strings a snapshot carries ------------------------------------------


def extras_state(g: Generation) -> dict[str, Any]:
    """What a snapshot carries besides the caches and the generation's settings: the events and the
    checkpoints (so a restored session shows its rounds and can be rewound), and the stop strings."""
    return {
        "events": [e.to_dict() for e in g.events],
        "checkpoints": [c.to_dict() for c in g.checkpoints],
        "stop": list(g.stop),
        "grammar": g.grammar.gbnf if g.grammar is not None else None,
    }


def restored_grammar(model: Any, d: Any, g: Generation) -> GrammarState | None:
    """The grammar a snapshot's workbench section ``d`` carries, in the state ``g``'s generated tokens leave
    (replayed: llama.cpp's grammar state cannot be saved), or None; a grammar llama.cpp refuses, or one the
    history does not obey, raises :class:`~specviz.errors.SnapshotError`."""
    gbnf = d.get("grammar") if isinstance(d, dict) else None
    if gbnf is None:
        return None
    try:
        if not isinstance(gbnf, str):
            raise GrammarError("grammar: not text", reason="not text")
        check_gbnf(gbnf)
        return GrammarState(model, gbnf, g.history[g.n_prompt :])
    except GrammarError as exc:
        raise SnapshotError(f"the snapshot's grammar is refused: {exc}") from None


def check_checkpoints(s: SessionParts, d: Any) -> None:
    """Check every field of the rewind checkpoints a snapshot's workbench section ``d`` carries, before
    anything is restored: a rewind applies them after it has cut the cache, so a field it cannot apply
    there would leave a half-rewound session. Each checkpoint's strategy and knobs pass the session's own
    checks (and are replaced by the complete checked configuration), its finish reason is a string or
    None, its telemetry, drafting-policy state and generator state load into scratch objects of the
    session's kinds, its drafter state is one of its strategy's format for a history it fits, and its
    drafter counters are numbers. A fault raises :class:`~specviz.errors.SnapshotError`; nothing changed."""
    if not isinstance(d, dict) or not isinstance(d.get("checkpoints") or [], list):
        return  # load_extras refuses a malformed section; a missing one holds no checkpoints
    configs: dict[str, dict[str, Any]] = {}  # one check (a draft model's load) per distinct configuration
    for raw in d.get("checkpoints") or []:
        ck = Checkpoint.from_dict(raw)
        key = json.dumps([ck.strategy, ck.knobs], sort_keys=True, default=str)
        try:
            if key not in configs:
                configs[key] = s.validate_config(ck.strategy, ck.knobs)
            if ck.finished is not None and not isinstance(ck.finished, str):
                raise TypeError(f"its finish reason is a {type(ck.finished).__name__}")
            Telemetry.from_state(copy.deepcopy(ck.telemetry))
            make_policy(configs[key].get("draft_policy", "fixed"), s.cost_model).load(copy.deepcopy(ck.policy))
            np.random.Generator(type(s.rng.bit_generator)()).bit_generator.state = copy.deepcopy(ck.rng)
            if ck.drafter_state is not None:
                fmt, n = ck.drafter_state.get("format"), ck.drafter_state.get("n_history")
                fits = isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= ck.n_history
                if fmt != strategy_class(ck.strategy).state_format or not fits:
                    raise ValueError("its drafter state is not its strategy's for its history")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in ck.drafter_stats.values()):
                raise TypeError("its drafter counters are not numbers")
        except (KnobError, ModelError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise SnapshotError(f"the rewind checkpoint of round {ck.round} in the snapshot is refused: {exc}") from exc
        raw["knobs"] = configs[key]


def load_extras(g: Generation, d: Any, drafter: Drafter, rng: np.random.Generator) -> None:
    """Install :func:`extras_state` into a generation being restored (``d`` None: a snapshot without
    them; the current round becomes the only checkpoint). Malformed data raises SnapshotError."""
    if d is None:
        g.events = []
        g.checkpoints = []
        g.capture(drafter, rng)
        return
    if not isinstance(d, dict):
        raise SnapshotError("the snapshot's workbench section is not an object")
    try:
        events = [event_from_dict(e) for e in d.get("events") or []]
    except (ValueError, TypeError, AttributeError) as exc:
        raise SnapshotError(f"the snapshot's events are malformed ({exc})") from None
    cks = [Checkpoint.from_dict(c) for c in d.get("checkpoints") or []]
    if any(c.n_history > len(g.history) or c.n_events > len(events) for c in cks) or any(
        a.round >= b.round for a, b in zip(cks, cks[1:])
    ):
        raise SnapshotError("the snapshot's rewind checkpoints do not fit its history")
    stop = d.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop):
        raise SnapshotError("the snapshot's stop strings are malformed")
    g.events = events
    g.checkpoints = cks
    g.stop = tuple(stop)
    if not cks or cks[-1].round != g.round_index:
        g.capture(drafter, rng)
