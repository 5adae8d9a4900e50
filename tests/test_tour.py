"""The notebook tour (analyses/tour.ipynb) is committed without outputs and runs end to end on the toy."""

from __future__ import annotations

from pathlib import Path

import pytest

TOUR = Path(__file__).resolve().parents[1] / "analyses" / "tour.ipynb"


def test_tour_is_committed_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(TOUR, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)


def test_tour_runs_end_to_end(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel inherits it: tiny tensors, a shared CPU
    nb = nbformat.read(TOUR, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    text = "\n".join(
        out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
    )
    assert "top induction head: (1," in text and "top previous-token head: (0, 1)" in text
    assert "induction heads: ['1.0', '1.1', '1.2', '1.3']" in text and "previous-token heads: ['0.1']" in text
    assert "duplicate-token heads: []" in text
    figures = [
        o for c in nb.cells for o in c.get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})
    ]
    assert len(figures) == 3
    assert (tmp_path / "tour-out" / "atlas.html").is_file()
