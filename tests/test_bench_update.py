"""geograph bench update end to end on small corpora: the exact check and the IVF recall, JSON and markdown."""

import json

import pytest

from geograph.bench.update import main


def test_bench_update_exact_and_ivf(tmp_path):
    pytest.importorskip("faiss")
    small = ["--dim", "16", "--topics", "8", "--k", "5", "--max-degree", "8", "--out", str(tmp_path)]
    assert main(["400", "--fractions", "0.01", "--index", "exact", *small, "--markdown", str(tmp_path / "ex.md")]) == 0
    rows = json.loads((tmp_path / "ex.json").read_text())["rows"]
    assert {r["build"] for r in rows} == {"knn", "g3"} and all(r["equal"] for r in rows)
    g3 = next(r for r in rows if r["build"] == "g3")
    assert g3["rows_differ"] == g3["ties"] and g3["add"]["certified"] > 0
    assert main(["3000", "--fractions", "0.01", "--index", "ivf", *small, "--markdown", str(tmp_path / "ivf.md")]) == 0
    data = json.loads((tmp_path / "ivf.json").read_text())
    assert data["commit"] and data["date"]
    for r in data["rows"]:
        assert r["recall_ok"] and r["recall"] >= r["rebuild_recall"] - 0.005, r
        assert 0 < r["add_share"] and r["rebuild_seconds"] > 0
    g3 = next(r for r in data["rows"] if r["build"] == "g3")
    assert g3["add"]["redone"] == 0  # an IVF graph recomputes rows from its cells, never against the corpus
    table = (tmp_path / "ivf.md").read_text()
    assert "| knn | 3,000 | 1.0% |" in table and "recall" in table
