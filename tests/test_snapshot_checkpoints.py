"""Every field of a snapshot's rewind checkpoints is checked when the snapshot is restored.

A rewind applies a checkpoint after it has cut the cache, so a checkpoint it cannot apply must be refused
by the restore, not discovered by a rewind half-way. Each case breaks one field of one checkpoint of an
honest snapshot (re-checksummed: the checksum is no key), and the restore must raise SnapshotError and
leave the session as it was; an honest snapshot's checkpoints all rewind.
"""

from __future__ import annotations

import pytest

from specviz.decoding.snapshot import pack, unpack
from specviz.errors import SnapshotError

BREAKS = {
    "unknown strategy": lambda ck: ck.update(strategy="no-such-strategy"),
    "knob out of range": lambda ck: ck["knobs"].update(draft_max=-3),
    "unknown knob": lambda ck: ck["knobs"].update(no_such_knob=1),
    "finish reason not a string": lambda ck: ck.update(finished=7),
    "telemetry counter of the wrong type": lambda ck: ck["telemetry"].update(rounds="many"),
    "generator of another kind": lambda ck: ck.update(rng={"bit_generator": "MT19937", "state": {}}),
    "generator state malformed": lambda ck: ck["rng"].update(state="x"),
    "drafter state of another strategy": lambda ck: ck.update(drafter_state={"format": "other", "n_history": 1}),
    "drafter state beyond its history": lambda ck: ck.update(
        drafter_state={**(ck["drafter_state"] or {}), "n_history": 10**6}
    ),
    "drafter counter not a number": lambda ck: ck["drafter_stats"].update(proposed="lots"),
}


def crafted(blob: bytes, brk) -> bytes:
    header, blobs = unpack(blob)
    brk(header["workbench"]["checkpoints"][1])
    return pack({k: v for k, v in header.items() if k != "blobs"}, list(blobs.items()))


@pytest.fixture
def played(tiny_session):
    s = tiny_session
    s.start("the a the a the a b the a", 60, "ngram-mod", seed=4)
    s.run(max_rounds=4)
    return s


@pytest.mark.parametrize("what", list(BREAKS))
def test_a_crafted_checkpoint_is_refused_and_the_session_is_unchanged(played, what):
    s = played
    blob = s.snapshot()
    before = (list(s.history), s.round_index, s.ctx.kv_len(), len(s.events))
    with pytest.raises(SnapshotError, match="checkpoint"):
        s.restore_into(crafted(blob, BREAKS[what]))
    assert (list(s.history), s.round_index, s.ctx.kv_len(), len(s.events)) == before
    s.rewind(round=1)  # the session's own checkpoints still apply


def test_an_honest_snapshots_checkpoints_all_rewind(played):
    s = played
    blob = s.snapshot()
    rounds = s.round_index
    for r in range(rounds, -1, -1):
        s.restore_into(blob)
        s.rewind(round=r)
        assert s.round_index == r
