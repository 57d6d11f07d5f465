import pytest

from geograph.cli import main
from geograph.testing import has_package


def test_help(capsys):
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["nope"]) == 2


@pytest.mark.skipif(not has_package("sentence_transformers"), reason="text extra not installed")
def test_demo_prints_tables(tmp_path, capsys):
    assert main(["demo", "--cache", str(tmp_path), "--show", "2"]) == 0
    out = capsys.readouterr().out
    assert "Maniscope (k=5, alpha=0.3)" in out and "dense (cosine)" in out
    assert "nDCG@10" in out and out.count("Query q") == 2


@pytest.mark.skipif(not has_package("sentence_transformers"), reason="text extra not installed")
@pytest.mark.parametrize("kind", [["--knn", "3"], ["--mentions"]])
def test_build_graph_saves_a_loadable_graph(tmp_path, capsys, kind):
    from pathlib import Path

    from geograph import CorpusGraph

    demo = Path(__file__).resolve().parents[1] / "geograph" / "data" / "demo"
    out = tmp_path / "graph"
    assert main(["build-graph", "--data", str(demo), *kind, "--cache", str(tmp_path / "c"), "--out", str(out)]) == 0
    graph = CorpusGraph.load(out)
    assert graph.num_nodes > 0 and "CorpusGraph" in capsys.readouterr().out
    if kind[0] == "--knn":
        assert (graph.degree() >= 3).all()
