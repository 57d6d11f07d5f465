"""geograph build-graph: embed a BEIR folder (cached) and save a CorpusGraph for ISO-RAG and training."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from geograph.console import UsageError, make_parser

DESCRIPTION = """\
Embed the passages of a BEIR-format folder with all-MiniLM-L6-v2 (cached on disk) and save a
CorpusGraph over them: a k-NN graph (--knn K) or a title-mention graph (--mentions: passage u
links to v when u's text mentions v's title). Load it with CorpusGraph.load(OUT), use it in
ISORetriever, or train f_theta on it with python -m train fit --data.graph_dir OUT."""


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("geograph build-graph", DESCRIPTION)
    p.add_argument("--data", required=True, metavar="DIR", help="BEIR-format folder (corpus.jsonl, queries.jsonl, qrels/)")
    p.add_argument("--split", default="test", help="qrels split read by the loader (default: test)")
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--knn", type=int, metavar="K", help="k-NN graph over the passage embeddings, 1 <= K < passages")
    kind.add_argument("--mentions", action="store_true", help="passage -> passage whose title it mentions")
    p.add_argument("--cache", metavar="DIR", help="embedding cache folder (default: $GEOGRAPH_CACHE or ~/.cache/geograph)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the graph to")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from geograph.data import BEIRError, Encoder, load_beir

    try:
        try:
            dataset = load_beir(args.data, args.split)
        except BEIRError as e:
            raise UsageError(f"--{'split' if e.argument == 'split' else 'data'}: {e}") from None
        n = len(dataset.doc_ids)
        if args.knn is not None and not 1 <= args.knn < n:
            raise UsageError(f"--knn must be at least 1 and below the number of passages ({n}), got {args.knn}")
        if args.mentions:  # the links depend on the texts only: check them before embedding
            import torch

            from geograph.corpus import CorpusGraph

            if CorpusGraph.from_mentions(torch.zeros(n, 1), dataset.titles, dataset.texts).num_edges == 0:
                raise UsageError(f"--mentions: no passage of {args.data} mentions another passage's title; use --knn K")
        if Path(args.out).is_file():
            raise UsageError(f"--out: {args.out} is a file; give a folder to write the graph into")
    except UsageError as e:
        return e.exit(parser.prog)

    from geograph.corpus import CorpusGraph

    emb = Encoder(cache=args.cache, progress=True).encode(dataset.passages())
    if args.knn is not None:
        graph = CorpusGraph.from_knn(emb, args.knn)
    else:
        graph = CorpusGraph.from_mentions(emb, dataset.titles, dataset.texts)
    graph.save(args.out)
    print(f"{graph} -> {args.out}")
    return 0
