"""The notebooks run top to bottom (nbclient) and are stored without outputs.

They run on the tiny fixture model here (``SPECVIZ_MODEL``); without it they use the embedded model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("anywidget")

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"quickstart.ipynb", "debugging_low_acceptance.ipynb", "comparing_strategies.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped_and_has_a_kernelspec(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: outputs are not stripped"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
@pytest.mark.slow
def test_notebook_runs(path, tiny_model_path, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_MODEL", str(tiny_model_path))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    widgets = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert widgets, f"{path.name} displayed no inspector"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert not errors
