"""Notebooks, run in a real Jupyter kernel (nbclient): the display of ``visualize_factors``
and ``examples/quickstart.ipynb``, which is stored without outputs and must run as shipped."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart.ipynb"
PNG = b"\x89PNG\r\n\x1a\n"


def run(notebook, cwd: Path):
    """Execute ``notebook`` in a python3 kernel started in ``cwd``; raises on a failed cell."""
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    return notebook


def pngs(cell) -> list[bytes]:
    return [base64.b64decode(out["data"]["image/png"]) for out in cell.get("outputs", [])
            if "image/png" in out.get("data", {})]


def test_visualize_factors_shows_its_figure_as_a_cells_last_expression(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(
            "import torch\n"
            "from dicosa import DiCoSA, load_config, visualize_factors\n"
            "from dicosa.config import find_config\n"
            "torch.manual_seed(0)\n"
            "model = DiCoSA.from_config(load_config(find_config('synthetic')).model).eval()\n"
            "frames = torch.randint(0, 256, (model.config.num_frames, 3, 32, 32),"
            " dtype=torch.uint8)"),
        nbformat.v4.new_code_cell("visualize_factors(model, frames, 'a red circle')"),
        nbformat.v4.new_code_cell("figure, report = visualize_factors(model, frames, 'a dog')\n"
                                  "len(report.pairs)"),
    ])
    cells = run(notebook, tmp_path).cells
    (image,) = pngs(cells[1])
    assert image.startswith(PNG) and len(image) > 10_000  # a drawn figure, not a blank one
    assert cells[1].outputs[0]["output_type"] == "execute_result"
    # it still unpacks as (figure, report)
    assert cells[2].outputs[0]["data"]["text/plain"] == "1"


def test_quickstart_is_stored_without_outputs():
    notebook = json.loads(QUICKSTART.read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code and all(cell["outputs"] == [] and cell["execution_count"] is None
                        for cell in code)


def test_quickstart_runs_and_shows_its_figures(tmp_path, monkeypatch):
    # the notebook keeps its work folder for the reader (tempfile.mkdtemp): here, in tmp_path
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    notebook = run(nbformat.read(QUICKSTART, as_version=4), tmp_path)
    assert list(tmp_path.glob("dicosa-quickstart-*"))
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    figures = [cell for cell in code if pngs(cell)]
    sources = [cell.source for cell in figures]
    assert any("visualize_factors(" in s for s in sources)  # the factor figure, inline
    assert any("load_video" in s for s in sources)  # the frame strip
    printed = "".join(out.get("text", "") for cell in code for out in cell.outputs)
    assert "'score':" in printed and "'path':" in printed  # each hit's as_dict()
