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
  :data:`~specviz.decoding.snapshot.MAX_HEADER_BYTES`, and at most :data:`MAX_AHEAD` parts may arrive before
  it (so little is kept before the header was checked);
* the uploads of every page of the process hold at most :data:`MAX_HELD_BYTES` together
  (:class:`UploadBudget`); a part beyond it is refused until others complete.

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
#: Parts that may arrive before the first missing one (an upload's first part is checked first).
MAX_AHEAD = 8
#: Bytes the uploads of all pages of a process may hold at once.
MAX_HELD_BYTES = 256 * 1024 * 1024


class UploadBudget:
    """Bytes held by the uploads of many pages, within ``limit`` (thread-safe)."""

    def __init__(self, limit: int = MAX_HELD_BYTES) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes; False (nothing taken) beyond the limit."""
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        """Release ``n`` bytes."""
        with self._lock:
            self.held = max(0, self.held - n)


#: The budget every page's uploads share by default (one per process).
PROCESS_BUDGET = UploadBudget()


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

    def __init__(self, clock: Callable[[], float] = time.monotonic, budget: UploadBudget = PROCESS_BUDGET) -> None:
        self._clock = clock
        self._budget = budget
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
            self._drop(fid)

    def _drop(self, fid: str) -> _Upload | None:
        """Forget an upload and give its bytes back (called with the lock held)."""
        up = self._open.pop(fid, None)
        if up is not None:
            self._budget.give(up.size)
            up.size = 0
        return up

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
                self._drop(fid)
                raise MessageError("file restore: the parts of one upload disagree on their count")
            if index - up.first_missing > MAX_AHEAD:
                self._drop(fid)
                raise MessageError(
                    f"file restore: part {index} came more than {MAX_AHEAD} parts before part {up.first_missing}; "
                    "send the parts in order"
                )
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
            grow = len(raw) - len(up.parts[index] or b"")
            if up.size + grow > MAX_UPLOAD_BYTES:
                self._drop(fid)
                raise MessageError(f"file restore: the upload is larger than {MAX_UPLOAD_BYTES >> 20} MiB")
            if grow > 0 and not self._budget.take(grow):
                self._drop(fid)
                raise MessageError(
                    "file restore: the server holds as many uploads as it can; this one was dropped, try again later"
                )
            if grow < 0:
                self._budget.give(-grow)
            up.size += grow
            if up.parts[index] is None:
                up.received += 1
            up.parts[index] = raw
            up.last = now
            while up.first_missing < count and up.parts[up.first_missing] is not None:
                up.first_missing += 1
            if up.received < count:
                return up.first_missing, None
            del self._open[fid]
        blob = b"".join(p or b"" for p in up.parts)
        up.parts.clear()
        self._budget.give(up.size)
        return count, blob

    def cancel(self, fid: str) -> None:
        """Drop an upload and what its parts hold."""
        with self._lock:
            self._drop(fid)

    def close(self) -> None:
        """Drop every upload (the page went away)."""
        with self._lock:
            for fid in list(self._open):
                self._drop(fid)
