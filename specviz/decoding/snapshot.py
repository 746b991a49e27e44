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
nonsense. Every refusal is a :class:`~specviz.errors.SnapshotError`.

As the fllamer guide describes its envelope: target, draft, token-history, position and the strategy's
private state travel together; draftless strategy state is rebuilt from the history and completed
from the saved state.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ContextError, KnobError, SnapshotError
from .policy import VerifyCostModel, make_policy
from .rewind import extras_state, load_extras
from .sampling import SamplingParams
from .telemetry import Telemetry

if TYPE_CHECKING:
    from .session import Session

MAGIC = b"SPECVIZ-SNAPSHOT-1\n"
_DIGEST = 32


def pack(header: dict[str, Any], blobs: list[tuple[str, bytes]]) -> bytes:
    """The envelope of ``header`` (to which the blob lengths are added) and the named ``blobs``."""
    header = dict(header, blobs={name: len(b) for name, b in blobs})
    hb = json.dumps(header, separators=(",", ":")).encode()
    body = MAGIC + struct.pack("<Q", len(hb)) + hb + b"".join(b for _, b in blobs)
    return body + hashlib.sha256(body).digest()


def unpack(blob: Any) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The header and the named blobs of an envelope written by :func:`pack`."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise SnapshotError("a snapshot must be the bytes returned by Session.snapshot()")
    blob = bytes(blob)
    if len(blob) < len(MAGIC) + 8 + _DIGEST or not blob.startswith(MAGIC):
        raise SnapshotError("not a specviz snapshot (wrong header); pass the bytes returned by Session.snapshot()")
    body, digest = blob[:-_DIGEST], blob[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise SnapshotError("the snapshot is corrupted (checksum mismatch); it cannot be restored")
    (hlen,) = struct.unpack("<Q", body[len(MAGIC) : len(MAGIC) + 8])
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
    )


# -- a session's snapshot: taking it, and restoring it all-or-nothing ------------------------------------


def take_snapshot(s: Session) -> bytes:
    """The envelope of session ``s`` (started): header fields and the target's and drafter's states."""
    assert s.drafter is not None
    header = {
        "version": 1,
        "model": str(s.model.path),
        "model_size": s.model.path.stat().st_size,
        "model_fingerprint": s.model.fingerprint,
        "n_vocab": s.model.n_vocab,
        "ctx": dict(s._ctx_args),
        "history": s.history,
        "n_prompt": s.n_prompt,
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "sampling": s.sampling.to_dict(),
        "seed": s.seed,
        "rng": s.rng.bit_generator.state,
        "strategy": s.strategy,
        "knobs": s.knobs,
        "pending": list(s._pending) if s._pending else None,
        "round": s.round_index,
        "finished": s.finished,
        "telemetry": s.telemetry.state(),
        "drafter_state": s.drafter.state(),
        "policy_state": s.policy.state(),
        "cost_model": s.cost_model.to_dict() if s.cost_model is not None else None,
        "workbench": extras_state(s),
    }
    return pack(header, [("target", s.ctx.state()), ("drafter", s.drafter.context_state())])


def restore_snapshot(s: Session, blob: bytes) -> None:
    """Restore ``blob`` into session ``s`` (same model and context sizes), all or nothing: every field is
    checked first, and if installing fails half-way the session and its cache are put back as they were."""
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
    for k in ("n_ctx", "n_batch", "n_ubatch"):
        if h.ctx.get(k) != s._ctx_args[k]:
            raise SnapshotError(
                f"the snapshot's context has {k}={h.ctx.get(k)!r}, this session "
                f"{s._ctx_args[k]}; restore it with Session.restore(), which creates a "
                "matching session"
            )
    if len(h.history) > s.ctx.capacity.n_ctx:
        raise SnapshotError("the snapshot's history is longer than the context")
    try:
        cfg = s._validate(h.strategy, h.knobs, None)
        pending = (h.pending[0], s._validate(h.pending[0], h.pending[1], None)) if h.pending else None
        sampling = SamplingParams(**h.sampling)
        telemetry = Telemetry.from_state(h.telemetry)
    except (KnobError, TypeError) as exc:
        raise SnapshotError(f"the snapshot's settings are refused: {exc}") from exc
    backup = s.ctx.state() if s.started else None
    saved, rng_state = s.__dict__.copy(), s.rng.bit_generator.state
    try:
        _install(s, h, blobs, cfg, pending, sampling, telemetry, header.get("workbench"))
    except Exception as exc:
        new_drafter = s.drafter
        s.__dict__.update(saved)
        s.rng.bit_generator.state = rng_state
        if new_drafter is not None and new_drafter is not s.drafter:
            new_drafter.close()
        if backup is not None:
            s.ctx.load_state(backup)
        else:
            s.ctx.clear()
        if isinstance(exc, (SnapshotError, ContextError, ValueError, TypeError, KeyError, IndexError)):
            raise SnapshotError(f"the snapshot cannot be restored: {exc}") from exc
        raise


def _install(
    s: Session,
    h: SnapshotHeader,
    blobs: dict[str, bytes],
    cfg: dict[str, Any],
    pending: Any,
    sampling: SamplingParams,
    telemetry: Telemetry,
    extras: Any = None,
) -> None:
    """Install a checked snapshot into ``s`` (:func:`restore_snapshot` undoes it on failure)."""
    old = s.drafter
    s._reset_state()
    s.ctx.load_state(blobs.get("target", b""))
    s.history, s.n_prompt, s.max_tokens = list(h.history), h.n_prompt, h.max_tokens
    s.sampling, s.seed = sampling, h.seed
    s.rng.bit_generator.state = np.random.default_rng(h.seed).bit_generator.state
    if h.rng:
        try:
            s.rng.bit_generator.state = h.rng
        except (TypeError, ValueError, KeyError) as exc:
            raise SnapshotError(f"the generator state is malformed ({exc})") from None
    s.strategy, s.knobs, s._pending = h.strategy, cfg, pending
    s.round_index, s.finished, s.telemetry = h.round, h.finished, telemetry
    if h.cost_model:
        try:
            s.cost_model = VerifyCostModel(h.cost_model["sizes"], h.cost_model["seconds"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"the verify cost model is malformed ({exc})") from None
    s.policy = make_policy(cfg.get("draft_policy", "fixed"), s.cost_model)
    s.policy.load(h.policy_state)
    s.drafter = s._make_drafter(h.strategy, cfg)
    s.drafter.begin(s.history)
    if blobs.get("drafter"):
        s.drafter.load_context_state(blobs["drafter"])
    if h.drafter_state is not None and h.drafter_state.get("format"):
        s.drafter.load_state(h.drafter_state)
    s.started = True
    load_extras(s, extras)
    if s.kv_length != s.committed:
        raise SnapshotError(f"the restored cache holds {s.kv_length} positions, expected {s.committed}")
    if old is not None and old is not s.drafter:
        old.close()
