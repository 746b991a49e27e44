"""``specviz train-eagle3 --resume`` reads its checkpoint with ``torch.load(weights_only=True)``: tensors and
plain data only, so a checkpoint file cannot run code when it is read (the resume tests in
``tests/test_train.py`` show the checkpoints specviz writes still load)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the training extra (pip install 'specviz[train]') is not installed")

from specviz.train.trainer import CHECKPOINT_FORMAT, load_checkpoint  # noqa: E402


class Payload:
    """An object whose unpickling would write a file (what a crafted checkpoint could do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "state": {}, "extra": Payload(str(marker))}, path)
    with pytest.raises(Exception, match="(?i)weights_only|unpickl|global"):
        load_checkpoint(path)
    assert not marker.exists(), "loading the checkpoint ran code"


def test_tensors_and_plain_data_load(tmp_path):
    path = tmp_path / "checkpoint.pt"
    ck = {"format": CHECKPOINT_FORMAT, "state": {"w": torch.ones(2)}, "train": {"step": 3, "history": [{"a": 1.5}]}}
    torch.save(ck, path)
    got = load_checkpoint(path)
    assert got["train"] == ck["train"] and torch.equal(got["state"]["w"], ck["state"]["w"])
