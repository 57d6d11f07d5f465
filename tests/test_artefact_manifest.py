"""Artefacts that describe themselves: exact round trips, the manifest checked against encoder and corpus,
the former format, memory-mapped tensors, and the embedding cache keyed by the model's files."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from geograph import CorpusGraph, G3Graph, G3Retriever, ISORetriever, PoincareProjection
from geograph.artefacts import MANIFEST, TENSORS, ArtefactMismatch, EncoderIdentity, corpus_fingerprint
from geograph.data import EmbeddingCache, Encoder
from geograph.data.encoder_id import encoder_identity
from geograph.retrievers import DenseRetriever
from geograph.testing import has_package


def unit(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


X = unit(300, 16, 0)
Q = unit(7, 16, 1)
IDS = [f"doc{i}" for i in range(300)]
MINILM = EncoderIdentity("sentence-transformers/all-MiniLM-L6-v2", sha256="a" * 64, dim=16)


def assert_one_line(exc: BaseException, *parts: str) -> None:
    msg = str(exc)
    assert "\n" not in msg, msg
    for p in parts:
        assert p in msg, f"{p!r} not in {msg!r}"


# -- exact round trips --------------------------------------------------------------------------
def test_corpus_graph_answers_as_in_memory(tmp_path):
    g = CorpusGraph.from_knn(X, 5)
    g.save_pretrained(tmp_path / "g", encoder=MINILM, ids=IDS)
    h = CorpusGraph.from_pretrained(tmp_path / "g", corpus=(IDS, X), encoder=MINILM)
    assert torch.equal(h.embeddings, X) and torch.equal(h.edge_index, g.edge_index) and torch.equal(h.rowptr, g.rowptr)
    assert h.name == g.name and h.build_info["index"] == "exact"
    a, b = ISORetriever(g, m=3, L=20)(Q, k=5), ISORetriever(h, m=3, L=20)(Q, k=5)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.scores, b.scores)


def test_g3_graph_answers_as_in_memory(tmp_path):
    g = G3Graph.build(X, max_degree=8, band=(0.0, 0.9), beta=0.3)
    g.save_pretrained(tmp_path / "g3")
    h = G3Graph.from_pretrained(tmp_path / "g3", corpus=X)
    assert (h.band, h.beta, h.max_degree, h.row_width) == (g.band, g.beta, g.max_degree, g.row_width)
    a, b = G3Retriever(g)(Q, k=6), G3Retriever(h)(Q, k=6)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.scores, b.scores)


def test_projection_answers_as_in_memory(tmp_path):
    torch.manual_seed(0)
    p = PoincareProjection(16, 4, hidden=8, c=0.7)
    p.save_pretrained(tmp_path / "p", encoder=MINILM)
    q = PoincareProjection.from_pretrained(tmp_path / "p", encoder=MINILM)
    assert q.c == 0.7 and torch.equal(p(X), q(X))


@pytest.mark.parametrize("index", ["exact", "ivf"])
def test_dense_retriever_answers_as_in_memory(tmp_path, index):
    if index == "ivf" and not has_package("faiss"):
        pytest.skip("faiss not installed")
    r = DenseRetriever(X, index=index, nlist=8)
    r.save_pretrained(tmp_path / "d", ids=IDS)
    s = DenseRetriever.from_pretrained(tmp_path / "d", corpus=(IDS, X))
    assert (s.index, s.nprobe) == (r.index, r.nprobe)
    a, b = r(Q, k=10), s(Q, k=10)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.scores, b.scores)
    if index == "ivf":
        assert (tmp_path / "d" / "ivf.faiss").is_file() and s._ivf is not None  # read back, not trained again


# -- the file format ----------------------------------------------------------------------------
def test_tensors_are_safetensors_and_memory_mapped(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    g = CorpusGraph.from_knn(X, 5)
    g.save_pretrained(tmp_path / "g")
    theirs = safetensors.load_file(tmp_path / "g" / TENSORS)  # the reference reader
    assert set(theirs) == {"embeddings", "edge_index", "rowptr"}
    assert all(torch.equal(theirs[k], getattr(g, k)) for k in theirs)
    h = CorpusGraph.from_pretrained(tmp_path / "g")
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps")
    spans = []
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].endswith(str(tmp_path / "g" / TENSORS)):
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            spans.append((lo, hi))
    for name in ("embeddings", "edge_index", "rowptr"):
        ptr = getattr(h, name).data_ptr()
        assert any(lo <= ptr < hi for lo, hi in spans), f"{name} is not a view of the mapped file"


def test_manifest_records_what_made_it(tmp_path):
    import geograph

    G3Graph.build(X, max_degree=8).save_pretrained(tmp_path / "g", encoder=MINILM, ids=IDS)
    m = json.loads((tmp_path / "g" / MANIFEST).read_text())
    assert m["format"] == 2 and m["kind"] == "G3Graph" and m["geograph_version"] == geograph.__version__
    assert m["encoder"]["name"] == MINILM.name and m["encoder"]["sha256"] == MINILM.sha256
    assert m["params"] == {"band": [0.1, 0.7], "beta": 0.4, "max_degree": 8, "num_nodes": 300, "dim": 16}
    ids = hashlib.sha256("".join(i + "\n" for i in IDS).encode()).hexdigest()
    emb = hashlib.sha256(X.numpy().astype("<f4").tobytes()).hexdigest()
    assert m["corpus"] == {"num_passages": 300, "dim": 16, "ids_sha256": ids, "embeddings_sha256": emb, "version": 0}
    assert "density" in m["build_info"] and m["files"][TENSORS] == (tmp_path / "g" / TENSORS).stat().st_size


# -- mismatches -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["CorpusGraph", "G3Graph", "PoincareProjection", "DenseRetriever"])
def test_another_encoder_is_refused(tmp_path, kind):
    build = {
        "CorpusGraph": lambda: CorpusGraph.from_knn(X, 3),
        "G3Graph": lambda: G3Graph.build(X, max_degree=4),
        "PoincareProjection": lambda: PoincareProjection(16, 4, hidden=8),
        "DenseRetriever": lambda: DenseRetriever(X),
    }[kind]
    cls = {"CorpusGraph": CorpusGraph, "G3Graph": G3Graph, "PoincareProjection": PoincareProjection}.get(
        kind, DenseRetriever
    )
    build().save_pretrained(tmp_path / "a", encoder=MINILM)
    e5 = EncoderIdentity("intfloat/e5-small-v2", sha256="b" * 64, dim=16)
    with pytest.raises(ArtefactMismatch) as e:
        cls.from_pretrained(tmp_path / "a", encoder=e5)
    assert_one_line(e.value, str(tmp_path / "a"), MINILM.name, e5.name)
    prefixed = EncoderIdentity(MINILM.name, sha256=MINILM.sha256, query_prefix="query: ")
    with pytest.raises(ArtefactMismatch, match="prefixes"):
        cls.from_pretrained(tmp_path / "a", encoder=prefixed)
    changed = EncoderIdentity(MINILM.name, sha256="c" * 64)  # the same name, other weights
    with pytest.raises(ArtefactMismatch, match="sha256:cccc"):
        cls.from_pretrained(tmp_path / "a", encoder=changed)
    cls.from_pretrained(tmp_path / "a", encoder=EncoderIdentity(MINILM.name, sha256=MINILM.sha256))


def test_another_corpus_is_refused(tmp_path):
    CorpusGraph.from_knn(X, 3).save_pretrained(tmp_path / "g", ids=IDS)
    other = unit(300, 16, 9)
    with pytest.raises(ArtefactMismatch) as e:
        CorpusGraph.from_pretrained(tmp_path / "g", corpus=other)
    saved, used = corpus_fingerprint(X, IDS), corpus_fingerprint(other)
    assert_one_line(e.value, saved.embeddings_sha256[:12], used.embeddings_sha256[:12], "the corpus in use")
    with pytest.raises(ArtefactMismatch, match="ids"):
        CorpusGraph.from_pretrained(tmp_path / "g", corpus=(IDS[::-1], X))
    with pytest.raises(ArtefactMismatch, match="299 x 16"):
        CorpusGraph.from_pretrained(tmp_path / "g", corpus=X[:299])
    # the same texts re-encoded elsewhere: float rounding, not another corpus
    CorpusGraph.from_pretrained(tmp_path / "g", corpus=(IDS, X + 1e-6))
    with pytest.raises(ArtefactMismatch):
        CorpusGraph.from_pretrained(tmp_path / "g", corpus=(IDS, X + 1e-3))


def test_another_format_version_is_refused(tmp_path):
    G3Graph.build(X, max_degree=4).save_pretrained(tmp_path / "g")
    meta = tmp_path / "g" / MANIFEST
    m = json.loads(meta.read_text())
    meta.write_text(json.dumps({**m, "format": 3}))
    with pytest.raises(ArtefactMismatch, match="artefact format 3, this geograph reads format 2") as e:
        G3Graph.from_pretrained(tmp_path / "g")
    assert_one_line(e.value, str(meta))


def test_a_hub_id_without_network_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="nobody-here/no-graph") as e:
        CorpusGraph.from_pretrained("nobody-here/no-graph")
    assert_one_line(e.value, "Hugging Face Hub")
    with pytest.raises(ValueError, match="no such directory"):
        CorpusGraph.from_pretrained("./no/such/dir")


# -- the former format ----------------------------------------------------------------------------
def write_v1_graph(path: Path, g: CorpusGraph) -> None:
    """The former layout, written from its description: two torch.save files and graph.json."""
    path.mkdir()
    torch.save(g.embeddings, path / "embeddings.pt")
    torch.save(g.edge_index, path / "edge_index.pt")
    meta = {"format": 1, "name": g.name, "num_nodes": g.num_nodes, "num_edges": g.num_edges, "dim": 16}
    meta["files"] = {n: (path / n).stat().st_size for n in ("embeddings.pt", "edge_index.pt")}
    meta["build"] = {}
    (path / "graph.json").write_text(json.dumps(meta))


def test_former_format_loads_with_one_deprecation_line(tmp_path):
    g = CorpusGraph.from_knn(X, 4)
    write_v1_graph(tmp_path / "old", g)
    with pytest.warns(DeprecationWarning, match="former torch.save format") as w:
        h = CorpusGraph.from_pretrained(tmp_path / "old", corpus=X)
    assert len(w) == 1 and "\n" not in str(w[0].message) and "save_pretrained" in str(w[0].message)
    assert torch.equal(h.edge_index, g.edge_index) and torch.equal(h.embeddings, g.embeddings)
    h.save_pretrained(tmp_path / "new")  # converted
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(CorpusGraph.from_pretrained(tmp_path / "new").edge_index, g.edge_index)

    t = G3Graph.build(X, max_degree=4)
    (tmp_path / "g3").mkdir()
    blob = {k: getattr(t, k) for k in ("embeddings", "density", "crow", "col", "val")}
    torch.save(blob, tmp_path / "g3" / "g3graph.pt")
    meta = {"format": 1, "band": [0.1, 0.7], "beta": 0.4, "max_degree": 4, "num_nodes": 300}
    meta.update(nnz=int(t.val.numel()), dim=16)
    (tmp_path / "g3" / "g3graph.json").write_text(json.dumps(meta))
    with pytest.warns(DeprecationWarning, match="G3Graph saved in the former"):
        u = G3Graph.from_pretrained(tmp_path / "g3")
    assert torch.equal(u.val, t.val) and torch.equal(u.col, t.col)

    p = PoincareProjection(16, 4, hidden=8)
    torch.save(
        {"kind": "PoincareProjection", "format": 1, "config": p.config(), "state_dict": p.state_dict()},
        f := tmp_path / "p.pt",
    )
    with pytest.warns(DeprecationWarning, match="PoincareProjection saved in the former"):
        assert torch.equal(PoincareProjection.from_pretrained(f)(X), p(X))


class NotATensor:
    def __reduce__(self):
        return (print, ("code ran while loading",))


def test_former_format_never_unpickles_code(tmp_path, capsys):
    g = CorpusGraph.from_knn(X, 4)
    write_v1_graph(tmp_path / "old", g)
    torch.save(NotATensor(), tmp_path / "old" / "embeddings.pt")
    meta = json.loads((tmp_path / "old" / "graph.json").read_text())
    meta["files"]["embeddings.pt"] = (tmp_path / "old" / "embeddings.pt").stat().st_size
    (tmp_path / "old" / "graph.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="cannot read") as e:
        CorpusGraph.from_pretrained(tmp_path / "old")
    assert_one_line(e.value, str(tmp_path / "old" / "embeddings.pt"))
    assert "code ran" not in capsys.readouterr().out


# -- where artefacts are used ---------------------------------------------------------------------
def test_serve_refuses_a_graph_of_another_corpus_or_encoder(tmp_path):
    from geograph.serve.models import build_model

    CorpusGraph.from_knn(X, 3).save_pretrained(tmp_path / "g", encoder=MINILM, ids=IDS)
    model = build_model("iso", X, {"m": 3}, graph=str(tmp_path / "g"), ids=IDS, encoder=MINILM)
    assert torch.equal(model.graph.edge_index, CorpusGraph.from_knn(X, 3).edge_index)
    with pytest.raises(ValueError, match="^graph: .*built over corpus .*the corpus in use") as e:
        build_model("iso", X, graph=str(tmp_path / "g"), ids=IDS[1:] + IDS[:1], encoder=MINILM)
    assert_one_line(e.value)
    e5 = EncoderIdentity("intfloat/e5-small-v2", sha256="b" * 64)
    with pytest.raises(ValueError, match="^graph: .*all-MiniLM-L6-v2.*e5-small-v2"):
        build_model("iso", X, graph=str(tmp_path / "g"), ids=IDS, encoder=e5)


def test_integrations_refuse_a_module_of_another_encoder_or_corpus(tmp_path):
    from geograph.text import check_artefacts

    G3Graph.build(X, max_degree=4).save_pretrained(tmp_path / "g", encoder=MINILM)
    module = G3Retriever(G3Graph.from_pretrained(tmp_path / "g"))

    class Enc:
        identity = EncoderIdentity("intfloat/e5-small-v2", sha256="b" * 64)

    check_artefacts(module, object(), 300)  # an encoder without an identity: nothing to compare
    with pytest.raises(ArtefactMismatch, match="e5-small-v2"):
        check_artefacts(module, Enc(), 300)
    with pytest.raises(ArtefactMismatch, match="built over 300 passages; the corpus given has 299"):
        check_artefacts(module, object(), 299)


# -- the embedding cache key ----------------------------------------------------------------------
def fake_model(path: Path) -> Path:
    (path / "1_Pooling").mkdir(parents=True)
    (path / "config.json").write_text('{"hidden_size": 4}')
    (path / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 4}')
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (path / "README.md").write_text("not part of the model")
    return path


def test_cache_misses_when_the_model_changes_in_place(tmp_path):
    model = fake_model(tmp_path / "model")
    enc = Encoder(model, cache=tmp_path / "cache")
    vectors = np.ones((2, 4), dtype=np.float32)
    enc.cache.put(["a", "b"], vectors)
    assert Encoder(model, cache=tmp_path / "cache").cache.get(["a", "b"])[1] == []
    (model / "README.md").write_text("edited")  # not a model file: same key
    assert Encoder(model, cache=tmp_path / "cache").cache.get(["a"])[1] == []
    weights = bytearray((model / "model.safetensors").read_bytes())
    weights[1000] ^= 1
    (model / "model.safetensors").write_bytes(bytes(weights))
    assert Encoder(model, cache=tmp_path / "cache").cache.get(["a", "b"])[1] == [0, 1]


def test_encoder_identity_hashes_config_and_weights(tmp_path):
    model = fake_model(tmp_path / "model")
    h = hashlib.sha256()
    for rel in ("1_Pooling/config.json", "config.json", "model.safetensors"):  # sorted paths, README left out
        h.update(rel.encode() + b"\0" + (model / rel).read_bytes() + b"\0")
    ident = encoder_identity(model, name="fake", passage_prefix="passage: ")
    assert ident.sha256 == h.hexdigest() and ident.name == "fake" and ident.passage_prefix == "passage: "
    copy = shutil.copytree(model, tmp_path / "copy")
    assert encoder_identity(copy).sha256 == ident.sha256  # the files, not the path
    snap = tmp_path / "models--o--n" / "snapshots" / ("1" * 40)
    shutil.copytree(model, snap)
    assert encoder_identity(snap).revision == "1" * 40
    assert EmbeddingCache("x", tmp_path, weights=ident.weights).path != EmbeddingCache("x", tmp_path).path


def test_safetensors_header_is_aligned(tmp_path):
    g = G3Graph.build(X, max_degree=4)
    g.save_pretrained(tmp_path / "g")
    raw = (tmp_path / "g" / TENSORS).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    sizes = {"F32": 4, "I64": 8}
    assert (8 + n) % 8 == 0
    for name, info in header.items():
        if name != "__metadata__":
            assert (8 + n + info["data_offsets"][0]) % sizes[info["dtype"]] == 0, name
