"""A large snapshot restores from a page of a live ``specviz serve``, part by part at the gate's pace.

Before issue 22 the page's uploader sent every part at once, so the message gate refused any snapshot of
more than about 30-40 MiB and the accepted parts stayed in memory. Now the page sends one part, waits for
the ``upload`` answer naming the next one (after ``retry_ms`` when its gate asks it to wait), and a
snapshot up to :data:`~specviz.ui.uploads.MAX_UPLOAD_BYTES` restores. The test takes a snapshot through the
page (a download), pads its header to 48 MiB (a long generation's events; the checksum recomputed), sends
it as the front-end's uploader does, and checks that the session was restored (a new epoch holding the
snapshot's events), that the server stayed alive and that a snapshot larger than the stated size is
refused at its first part.
"""

from __future__ import annotations

import pytest
from browser_util import free_port, start, stop, wait_http

from specviz.decoding.snapshot import pack, unpack
from specviz.testing.hostile import download, upload
from specviz.testing.page_client import PageClient
from specviz.ui.uploads import MAX_UPLOAD_BYTES, PART_BYTES

PROMPT = "the cat sat on the mat and the cat sat on the mat"


def idle(m: dict) -> bool:
    return m.get("type") == "state" and not m.get("running") and not m.get("working")


@pytest.mark.slow
def test_a_48_mib_snapshot_restores_from_a_page_and_a_larger_one_is_refused_at_once(tiny_model_path, tmp_path):
    port = free_port()
    args = ["-m", "specviz.cli", "serve", "--model", str(tiny_model_path), "--port", str(port), "--prompt", PROMPT]
    proc = start(args, tmp_path / "serve.log")
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_http(url, proc)
        page = PageClient(url).connect()
        page.send({"type": "hello", "epoch": -1, "have": 0})
        page.wait_for(lambda m: m.get("type") == "state" and m.get("can_step"), 60)
        page.send({"type": "cmd", "cmd": "step"})
        ev = page.wait_for(
            lambda m: m.get("type") == "events" and any(e.get("kind") == "telemetry" for e in m["events"]), 60
        )
        page.wait_for(idle, 60, since=page.received.index(ev))  # the step's round is over
        mark = len(page.received)
        page.send({"type": "file", "cmd": "snapshot"})
        header, blobs = unpack(download(page, mark))
        header.pop("blobs")
        n_events = len(header["workbench"]["events"])
        header["padding"] = "x" * (48 << 20)  # fields a reader does not know are ignored
        big = pack(header, list(blobs.items()))
        assert 48 << 20 < len(big) < MAX_UPLOAD_BYTES

        mark = len(page.received)
        ack = upload(page, "big", big)
        assert not ack.get("error"), ack
        reloaded = page.wait_for(
            lambda m: m.get("type") in ("events", "notice") and (m.get("type") == "notice" or m.get("start") == 0),
            120,
            since=mark,
        )
        assert reloaded["type"] == "events", reloaded
        assert len(reloaded["events"]) == n_events

        too_big = -(-(MAX_UPLOAD_BYTES + 1) // PART_BYTES)
        mark = len(page.received)
        page.send({"type": "file", "cmd": "restore", "id": "huge", "index": 0, "count": too_big, "data": ""})
        ack = page.wait_for(lambda m: m.get("type") == "upload" and m.get("id") == "huge", 30, since=mark)
        assert "MiB" in ack["error"]
        assert proc.poll() is None
        page.close()
    finally:
        alive = proc.poll() is None
        stop(proc)
    assert alive, (tmp_path / "serve.log").read_text()[-3000:]
