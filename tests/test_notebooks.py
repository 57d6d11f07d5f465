from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("sentence_transformers")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_every_method_has_a_notebook():
    names = {p.name for p in NOTEBOOKS}
    assert {"quickstart.ipynb", "ricci_filtration.ipynb", "iso_rag.ipynb", "maniscope.ipynb", "g3rag.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
@pytest.mark.slow
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") == "stream" for o in outputs)
    # the figure is shown inline (an image output), not saved to the working directory
    assert any("image/png" in o.get("data", {}) for o in outputs if o.get("output_type") == "display_data")
    assert list(tmp_path.iterdir()) == []


def test_notebook_sources_use_no_file_backend():
    for path in NOTEBOOKS:
        source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert "savefig" not in source and "Agg" not in source, path.name
