"""snapshot.with_knobs_mapped: every knob dictionary of a snapshot header mapped, the states untouched."""

from __future__ import annotations

import pytest

from specviz.decoding.snapshot import pack, unpack, with_knobs_mapped
from specviz.errors import SnapshotError


def upper(knobs: dict) -> dict:
    return {**knobs, "draft_model": str(knobs["draft_model"]).upper()} if "draft_model" in knobs else knobs


def test_every_knob_dictionary_and_event_is_mapped_and_the_states_kept():
    header = {
        "model": "/srv/models/target.gguf",
        "knobs": {"draft_model": "a", "draft_max": 4},
        "pending": ["draft", {"draft_model": "b"}],
        "workbench": {
            "events": [{"type": "x", "n": 1}],
            "checkpoints": [{"round": 1, "knobs": {"draft_model": "c"}}, {"round": 2, "knobs": {}}],
            "stop": ["\n"],
        },
    }
    blob = pack(header, [("target", b"\x01\x02"), ("drafter", b"")])
    out, blobs = unpack(with_knobs_mapped(blob, upper, lambda e: {**e, "n": e["n"] + 1}, model="target.gguf"))
    assert out["model"] == "target.gguf"
    assert out["knobs"] == {"draft_model": "A", "draft_max": 4}
    assert out["pending"] == ["draft", {"draft_model": "B"}]
    assert out["workbench"]["events"] == [{"type": "x", "n": 2}]
    assert out["workbench"]["checkpoints"] == [{"round": 1, "knobs": {"draft_model": "C"}}, {"round": 2, "knobs": {}}]
    assert out["workbench"]["stop"] == ["\n"]
    assert blobs == {"target": b"\x01\x02", "drafter": b""}
    assert list(out) == list(unpack(blob)[0])  # the header's fields in their order


def test_entries_of_another_shape_are_left_for_the_restore_to_refuse():
    header = {"knobs": ["not", "a", "dict"], "pending": ["draft"], "workbench": {"checkpoints": [3, {"knobs": 1}]}}
    out, _ = unpack(with_knobs_mapped(pack(header, []), upper))
    assert {k: out[k] for k in header} == header


def test_a_damaged_envelope_is_refused_as_unpack_refuses_it():
    blob = bytearray(pack({"knobs": {}}, [("target", b"abc")]))
    blob[-40] ^= 1
    with pytest.raises(SnapshotError, match="corrupted"):
        with_knobs_mapped(bytes(blob), upper)
