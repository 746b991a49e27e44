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
from typing import Any

from .errors import SnapshotError

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
    (hlen,) = struct.unpack("<Q", body[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8
    try:
        header = json.loads(body[start:start + hlen])
    except ValueError:
        raise SnapshotError("the snapshot header is unreadable") from None
    if not isinstance(header, dict) or not isinstance(header.get("blobs"), dict):
        raise SnapshotError("the snapshot header is not a specviz header")
    out: dict[str, bytes] = {}
    pos = start + hlen
    for name, n in header["blobs"].items():
        if not isinstance(n, int) or n < 0 or pos + n > len(body):
            raise SnapshotError(f"the snapshot is truncated ({name} state missing)")
        out[name] = body[pos:pos + n]
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
        raise SnapshotError(f"the snapshot header is malformed: {what}; restore a snapshot written by "
                            "Session.snapshot()")


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
    _need(pending is None or (isinstance(pending, list) and len(pending) == 2 and isinstance(pending[0], str)
                              and isinstance(pending[1], dict)), "'pending' is not [strategy, knobs]")
    for key in ("drafter_state", "cost_model", "rng"):
        _need(h.get(key) is None or isinstance(h[key], dict), f"{key!r} is not an object")
    _need(isinstance(h.get("policy_state", {}), dict), "'policy_state' is not an object")
    fp = h.get("model_fingerprint")
    _need(fp is None or isinstance(fp, str), "'model_fingerprint' is not a string")
    return SnapshotHeader(
        model=h["model"], model_size=h["model_size"], model_fingerprint=fp, n_vocab=h["n_vocab"], ctx=h["ctx"],
        history=list(hist), n_prompt=h["n_prompt"], max_tokens=h["max_tokens"], sampling=h["sampling"],
        seed=h["seed"], rng=h.get("rng"), strategy=h["strategy"], knobs=h["knobs"],
        pending=(pending[0], pending[1]) if pending else None, round=h["round"], finished=h.get("finished"),
        telemetry=h["telemetry"], drafter_state=h.get("drafter_state"), policy_state=h.get("policy_state") or {},
        cost_model=h.get("cost_model"))
