"""Corpus versions in saved graphs, the passages file, reordering a graph's rows, and the directory swap."""

import json

import pytest
import torch

from geograph import CorpusGraph, G3Graph
from geograph._io import replace_directory
from geograph.artefacts import corpus_fingerprint
from geograph.artefacts.saved_graphs import PASSAGES, read_passages
from geograph.graphs.updates import reorder


def rows(n, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1)


def manifest(path):
    return json.loads((path / "manifest.json").read_text())


@pytest.mark.parametrize("kind", ["knn", "g3"])
def test_version_counts_updates_and_survives_save_load_update_save(tmp_path, kind):
    pool = rows(40)
    ids = [f"d{i}" for i in range(40)]
    build = (lambda x: CorpusGraph.from_knn(x, 4)) if kind == "knn" else (lambda x: G3Graph.build(x, max_degree=6))
    cls = CorpusGraph if kind == "knn" else G3Graph
    graph = build(pool[:30])
    assert graph.corpus_version == 0
    graph.save_pretrained(tmp_path / "v0", ids=ids[:30])
    m0 = manifest(tmp_path / "v0")
    assert m0["corpus"]["version"] == 0 and "parent" not in m0["corpus"]

    loaded = cls.from_pretrained(tmp_path / "v0")
    assert loaded.corpus_version == 0
    loaded.set_ids(ids[:30])
    loaded.add(pool[30:35], ids[30:35])
    loaded.remove(["d3", "d7"])
    assert loaded.corpus_version == 2
    loaded.save_pretrained(tmp_path / "v2")  # its own ids, as updated
    m2 = manifest(tmp_path / "v2")
    final = [i for i in ids[:35] if i not in ("d3", "d7")]
    want = corpus_fingerprint(loaded.embeddings, final)
    assert m2["corpus"]["version"] == 2 and m2["corpus"]["ids_sha256"] == want.ids_sha256
    assert m2["corpus"]["parent"] == {
        "version": 0,
        "embeddings_sha256": m0["corpus"]["embeddings_sha256"],
        "ids_sha256": m0["corpus"]["ids_sha256"],
    }

    again = cls.from_pretrained(tmp_path / "v2")
    assert again.corpus_version == 2
    again.save_pretrained(tmp_path / "v2-copy")  # saved unchanged: the same version, parent and passages
    assert manifest(tmp_path / "v2-copy")["corpus"] == m2["corpus"]
    assert read_passages(tmp_path / "v2-copy") == read_passages(tmp_path / "v2") == (final, [None] * len(final))
    again.set_ids(final)
    again.add(pool[35:], ids[35:])
    again.save_pretrained(tmp_path / "v3")
    m3 = manifest(tmp_path / "v3")
    assert m3["corpus"]["version"] == 3 and m3["corpus"]["parent"]["version"] == 2
    assert m3["corpus"]["parent"]["embeddings_sha256"] == m2["corpus"]["embeddings_sha256"]


def test_a_manifest_without_a_version_loads_as_version_0(tmp_path):
    CorpusGraph.from_knn(rows(10), 3).save_pretrained(tmp_path / "g")
    m = manifest(tmp_path / "g")
    del m["corpus"]["version"]
    (tmp_path / "g" / "manifest.json").write_text(json.dumps(m))
    graph = CorpusGraph.from_pretrained(tmp_path / "g")
    assert graph.corpus_version == 0
    graph.remove([0])
    assert graph.corpus_version == 1


def test_passages_file_round_trips_and_is_checked(tmp_path):
    graph = CorpusGraph.from_knn(rows(5), 2)
    ids, keys = [f"p{i}" for i in range(5)], [f"{i:064x}" for i in range(5)]
    graph.save_pretrained(tmp_path / "g", ids=ids, text_keys=keys)
    assert read_passages(tmp_path / "g") == (ids, keys)
    assert manifest(tmp_path / "g")["files"][PASSAGES] == (tmp_path / "g" / PASSAGES).stat().st_size
    with pytest.raises(ValueError, match="text_keys: 4 keys for 5"):
        graph.save_pretrained(tmp_path / "h", ids=ids, text_keys=keys[:4])
    with pytest.raises(ValueError, match="text_keys need the passage ids"):
        graph.save_pretrained(tmp_path / "h", text_keys=keys)
    graph.save_pretrained(tmp_path / "g")  # saved again without keys: the old file is not the graph's any more
    with pytest.raises(ValueError, match=f"holds no {PASSAGES}"):
        read_passages(tmp_path / "g")


def test_reorder_equals_a_build_on_the_reordered_rows():
    x = rows(50, seed=1)
    order = torch.randperm(50, generator=torch.Generator().manual_seed(2))
    knn = CorpusGraph.from_knn(x, 5)
    knn.set_ids([f"d{i}" for i in range(50)])
    reorder(knn, order)
    ref = CorpusGraph.from_knn(x[order], 5)
    assert torch.equal(knn.edge_index, ref.edge_index) and torch.equal(knn.rowptr, ref.rowptr)
    assert torch.equal(knn.embeddings, ref.embeddings)
    assert knn.passage_ids.ids == [f"d{i}" for i in order.tolist()]

    g3 = G3Graph.build(x, max_degree=8)
    reorder(g3, order)
    ref3 = G3Graph.build(x[order], max_degree=8)
    assert torch.equal(g3.crow, ref3.crow) and torch.equal(g3.col, ref3.col)
    torch.testing.assert_close(g3.val, ref3.val, atol=1e-6, rtol=0)
    torch.testing.assert_close(g3.density, ref3.density, atol=1e-6, rtol=0)
    assert g3.corpus_version == 0
    with pytest.raises(ValueError, match="permutation of the 50 rows"):
        reorder(g3, torch.zeros(50, dtype=torch.long))


@pytest.mark.parametrize("atomic", [True, False])
def test_replace_directory_leaves_the_new_version_and_nothing_else(tmp_path, monkeypatch, atomic):
    import geograph._io as io

    if not atomic:  # the two-rename path of systems without an atomic exchange
        monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    target, new = tmp_path / "graph", tmp_path / ".graph.new"
    target.mkdir()
    (target / "f").write_text("old")
    new.mkdir()
    (new / "f").write_text("new")
    replace_directory(new, target)
    assert (target / "f").read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["graph"]
    new.mkdir()  # into a place that does not exist yet
    (new / "f").write_text("first")
    replace_directory(new, tmp_path / "other")
    assert (tmp_path / "other" / "f").read_text() == "first"


def test_a_loaded_graph_is_updated_by_the_ids_saved_with_it(tmp_path):
    x = rows(12, seed=3)
    ids = [f"p{i}" for i in range(12)]
    CorpusGraph.from_knn(x[:10], 3).save_pretrained(tmp_path / "g", ids=ids[:10])
    graph = CorpusGraph.from_pretrained(tmp_path / "g")
    graph.remove(["p4"])
    graph.add(x[10:], ids[10:])
    ref = CorpusGraph.from_knn(torch.cat([x[:4], x[5:]]), 3)
    assert torch.equal(graph.edge_index, ref.edge_index)
    assert graph.passage_ids.ids == [i for i in ids if i != "p4"]

    stale = CorpusGraph.from_pretrained(tmp_path / "g")
    CorpusGraph.from_knn(x[:10], 3).save_pretrained(tmp_path / "g", ids=[f"q{i}" for i in range(10)])
    with pytest.raises(ValueError, match="replaced since the graph was loaded"):
        stale.remove(["p1"])
