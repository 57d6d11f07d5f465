"""Regenerate artefacts/: small artefact directories as geograph saves them, read back by the suite.

The committed copies were written by geograph 0.1.0, whose safetensors files were laid out by
its own writer; tests/test_artefact_format.py loads them with the current code and compares them
with the same objects rebuilt here, so a change of reader that cannot read them fails. Run from
the repository root (it overwrites the committed copies):
    .venv/bin/python tests/data/make_artefacts.py
"""

import shutil
from pathlib import Path

import torch

from geograph import CorpusGraph, G3Graph, PoincareProjection
from geograph.retrievers import DenseRetriever

#: the encoder identity recorded in every fixture's manifest
ENCODER = {"name": "fixture-encoder", "sha256": "0" * 64, "dim": 4, "query_prefix": "q: ", "passage_prefix": ""}
IDS = [f"p{i}" for i in range(12)]


def embeddings() -> torch.Tensor:
    """``(12, 4)`` float32 embeddings of exact binary fractions (no rounding anywhere)."""
    return ((torch.arange(48) * 5 % 11) - 5).float().reshape(12, 4) / 8 + 0.125


def corpus_graph() -> CorpusGraph:
    return CorpusGraph.from_knn(embeddings(), 3)


def g3_graph() -> G3Graph:
    return G3Graph.build(embeddings(), band=(0.0, 0.9), beta=0.5, max_degree=4)


def dense() -> DenseRetriever:
    return DenseRetriever(embeddings())


def projection() -> PoincareProjection:
    torch.manual_seed(0)
    return PoincareProjection(4, 2, hidden=3, c=0.5)


def main() -> None:
    from geograph.artefacts import EncoderIdentity

    out = Path(__file__).with_name("artefacts")
    shutil.rmtree(out, ignore_errors=True)
    encoder = EncoderIdentity.from_dict(ENCODER)
    corpus_graph().save_pretrained(out / "corpus_graph", encoder=encoder, ids=IDS, text_keys=[f"k{i}" for i in IDS])
    g3_graph().save_pretrained(out / "g3_graph", encoder=encoder, ids=IDS)
    dense().save_pretrained(out / "dense", encoder=encoder, ids=IDS)
    projection().save_pretrained(out / "projection", encoder=encoder, corpus=embeddings())


if __name__ == "__main__":
    main()
