"""``geograph build-graph``: embed a BEIR folder (cached) and save a CorpusGraph for ISO-RAG."""
from __future__ import annotations

import argparse
from typing import Optional, Sequence

from geograph.corpus import CorpusGraph


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="geograph build-graph", description=__doc__)
    p.add_argument("--data", required=True, help="BEIR-format folder (corpus.jsonl, queries.jsonl, qrels/)")
    p.add_argument("--split", default="test", help="qrels split read by the loader")
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--knn", type=int, metavar="K", help="k-NN graph over the passage embeddings")
    kind.add_argument("--mentions", action="store_true", help="passage -> passage whose title it mentions")
    p.add_argument("--cache", help="embedding cache directory")
    p.add_argument("--out", required=True, help="directory to write the graph to")
    args = p.parse_args(argv)

    from geograph.bench.common import resolve_data
    from geograph.data import Encoder, load_beir

    dataset = load_beir(resolve_data(args.data, "scifact"), args.split)
    emb = Encoder(cache=args.cache, progress=True).encode(dataset.passages())
    if args.knn is not None:
        graph = CorpusGraph.from_knn(emb, args.knn)
    else:
        graph = CorpusGraph.from_mentions(emb, dataset.titles, dataset.texts)
    graph.save(args.out)
    print(f"{graph} -> {args.out}")
    return 0
