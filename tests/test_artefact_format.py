"""Artefacts written by an earlier geograph (tests/data/artefacts/) load, check and answer as before."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from geograph import CorpusGraph, G3Graph, PoincareProjection
from geograph.artefacts import ArtefactMismatch, EncoderIdentity
from geograph.retrievers import DenseRetriever

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import make_artefacts as made  # noqa: E402 - the objects the fixtures were saved from

SAVED = DATA / "artefacts"
ENCODER = EncoderIdentity.from_dict(made.ENCODER)
CORPUS = (made.IDS, made.embeddings())


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_corpus_graph_saved_by_an_earlier_writer():
    g = CorpusGraph.from_pretrained(SAVED / "corpus_graph", corpus=CORPUS, encoder=ENCODER)
    want = made.corpus_graph()
    assert all(equal(getattr(g, k), getattr(want, k)) for k in ("embeddings", "edge_index", "rowptr"))
    assert g.name == want.name and g.corpus_version == 0
    from geograph.artefacts.saved_graphs import read_passages

    assert read_passages(SAVED / "corpus_graph") == (made.IDS, [f"k{i}" for i in made.IDS])


def test_g3_graph_saved_by_an_earlier_writer():
    g = G3Graph.from_pretrained(SAVED / "g3_graph", corpus=CORPUS, encoder=ENCODER)
    want = made.g3_graph()
    assert all(equal(getattr(g, k), getattr(want, k)) for k in ("embeddings", "crow", "col"))
    # today's build sums the density exactly (float64 on a 2^-24 grid); the earlier writer summed
    # float32 tiles, so the saved density and weights are today's within float32 rounding
    for k in ("density", "val"):
        saved, built = getattr(g, k), getattr(want, k)
        assert saved.dtype == built.dtype and saved.shape == built.shape
        torch.testing.assert_close(saved, built, rtol=0, atol=2.5e-7)
    assert (g.band, g.beta, g.max_degree, g.row_width) == (want.band, want.beta, want.max_degree, want.row_width)


def test_dense_retriever_and_projection_saved_by_an_earlier_writer():
    r = DenseRetriever.from_pretrained(SAVED / "dense", corpus=CORPUS, encoder=ENCODER)
    q = made.embeddings()[:3]
    a, b = r(q, k=5), made.dense()(q, k=5)
    assert equal(a.indices, b.indices) and equal(a.scores, b.scores)
    p = PoincareProjection.from_pretrained(SAVED / "projection", encoder=ENCODER, corpus=made.embeddings())
    assert equal(p(q), made.projection().eval()(q))


def test_saved_checks_still_refuse_another_encoder_or_corpus(tmp_path):
    other = EncoderIdentity.from_dict({**made.ENCODER, "sha256": "1" * 64})
    with pytest.raises(ArtefactMismatch, match="built with encoder fixture-encoder"):
        CorpusGraph.from_pretrained(SAVED / "corpus_graph", encoder=other)
    with pytest.raises(ArtefactMismatch, match="built over corpus 12 x 4"):
        G3Graph.from_pretrained(SAVED / "g3_graph", corpus=(list(reversed(made.IDS)), made.embeddings()))
    # a loaded graph saved again writes what it read, and that loads too
    copy = shutil.copytree(SAVED / "corpus_graph", tmp_path / "g")
    CorpusGraph.from_pretrained(copy).save_pretrained(tmp_path / "again")
    again = CorpusGraph.from_pretrained(tmp_path / "again", corpus=CORPUS, encoder=ENCODER)
    assert equal(again.edge_index, made.corpus_graph().edge_index)
