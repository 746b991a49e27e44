"""Snapshot uploads from a page: parts collected within bounds, acknowledged one by one, assembled once.

A page sends a snapshot file as ``file restore`` parts (base64, :data:`PART_BYTES` of raw bytes each) and
sends the next part only when the previous one was acknowledged (an ``upload`` message naming the part to
send next; a part the server's gate refused is asked for again after ``retry_ms``), so a large snapshot
travels at the pace the gate allows instead of being refused wholesale. :class:`Uploads` keeps what the
parts of one page hold, within bounds:

* at most :data:`MAX_OPEN` uploads at once (another one is refused until one completes or goes stale);
* at most :data:`MAX_UPLOAD_BYTES` per upload (the stated size up to which a snapshot restores from a page),
  checked from the declared part count before any part is kept;
* an upload without a new part for :data:`MAX_AGE` seconds is dropped;
* the first part must start a specviz snapshot whose header is no larger than
  :data:`~specviz.decoding.snapshot.MAX_HEADER_BYTES` (checked before anything else is kept).

Each part is decoded once when it arrives and the file is joined once when complete.

No UI library is imported here.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..decoding.snapshot import check_envelope_start
from ..errors import SnapshotError
from .protocol import MessageError

#: Raw bytes per part (the front-end's UPLOAD_PART).
PART_BYTES = 512 * 1024
#: The largest snapshot a page may upload (a full 4096-token context of the embedded model is about 75 MB).
MAX_UPLOAD_BYTES = 128 * 1024 * 1024
#: Uploads of one page open at once.
MAX_OPEN = 1
#: Seconds an upload waits for its next part before it is dropped.
MAX_AGE = 120.0


@dataclass
class _Upload:
    count: int
    parts: list[bytes | None]
    last: float
    received: int = 0
    size: int = 0
    first_missing: int = field(default=0)


class Uploads:
    """The uploads of one page (see the module docstring); thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._open: dict[str, _Upload] = {}
        self._lock = threading.Lock()

    @property
    def open_ids(self) -> list[str]:
        """The uploads waiting for parts."""
        with self._lock:
            return list(self._open)

    def held_bytes(self) -> int:
        """The bytes the open uploads hold."""
        with self._lock:
            return sum(u.size for u in self._open.values())

    def _forget_stale(self, now: float) -> None:
        for fid in [f for f, u in self._open.items() if now - u.last > MAX_AGE]:
            del self._open[fid]

    def add(self, fid: str, index: int, count: int, data: str) -> tuple[int, bytes | None]:
        """Keep part ``index`` of upload ``fid``: the index of the part to send next and, when this was the last
        one, the whole file. A part that breaks a bound is refused with :class:`MessageError` (the upload is
        dropped, except when only this part was out of order)."""
        max_count = -(-MAX_UPLOAD_BYTES // PART_BYTES)
        if count > max_count:
            raise MessageError(
                f"file restore: a snapshot of up to {MAX_UPLOAD_BYTES >> 20} MiB can be restored from a page "
                f"({max_count} parts); this one has {count} parts"
            )
        if index >= count:  # the declaration bounds each field; the index is bounded by this upload's count
            raise MessageError(f"file restore: 'index' must be an integer in [0, {count - 1}]; got {index}")
        now = self._clock()
        with self._lock:
            self._forget_stale(now)
            up = self._open.get(fid)
            if up is None:
                if len(self._open) >= MAX_OPEN:
                    raise MessageError(
                        "file restore: another upload of this page is still open; wait for it to finish "
                        f"(or {MAX_AGE:.0f} s after its last part)"
                    )
                up = _Upload(count, [None] * count, now)
                self._open[fid] = up
            elif up.count != count:
                del self._open[fid]
                raise MessageError("file restore: the parts of one upload disagree on their count")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as e:
            self.cancel(fid)
            raise MessageError(f"file restore: the upload is not base64 ({e})") from e
        if len(raw) > PART_BYTES:
            self.cancel(fid)
            raise MessageError(f"file restore: part {index} holds {len(raw)} bytes; a part holds at most {PART_BYTES}")
        if index == 0:
            try:
                check_envelope_start(raw, total=count * PART_BYTES)
            except SnapshotError as e:
                self.cancel(fid)
                raise MessageError(f"restore: {e}") from e
        with self._lock:
            up = self._open.get(fid)
            if up is None:  # cancelled meanwhile
                raise MessageError("file restore: this upload was dropped; start it again")
            if up.parts[index] is None:
                up.received += 1
                up.size += len(raw)
            if up.size > MAX_UPLOAD_BYTES:
                del self._open[fid]
                raise MessageError(f"file restore: the upload is larger than {MAX_UPLOAD_BYTES >> 20} MiB")
            up.parts[index] = raw
            up.last = now
            while up.first_missing < count and up.parts[up.first_missing] is not None:
                up.first_missing += 1
            if up.received < count:
                return up.first_missing, None
            del self._open[fid]
        blob = b"".join(p or b"" for p in up.parts)
        up.parts.clear()
        return count, blob

    def cancel(self, fid: str) -> None:
        """Drop an upload and what its parts hold."""
        with self._lock:
            self._open.pop(fid, None)
