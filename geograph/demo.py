"""``geograph demo``: dense top-5 next to Maniscope's, and a quality table."""
from __future__ import annotations

import argparse
import textwrap
import time
from typing import Optional, Sequence

from geograph.data import Encoder, load_beir, load_demo
from geograph.metrics import evaluate
from geograph.pipeline import dense_candidates, embed, rerank_all, run_ids
from geograph.rerankers import Maniscope

METRICS = ("nDCG@10", "Recall@5", "Recall@10", "MRR@10", "HitAll@5")


def format_table(rows: dict[str, dict[str, float]], metrics: Sequence[str]) -> str:
    """A plain-text table, one row per method, one column per metric."""
    width = max(len(r) for r in rows) + 2
    head = "method".ljust(width) + "".join(m.rjust(11) for m in metrics)
    lines = [head, "-" * len(head)]
    for name, vals in rows.items():
        lines.append(name.ljust(width) + "".join(f"{vals[m]:11.4f}" for m in metrics))
    return "\n".join(lines)


def side_by_side(left: list[str], right: list[str], width: int = 58) -> str:
    lines = []
    for a, b in zip(left, right):
        lines.append(a[:width].ljust(width) + " | " + b[:width])
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="geograph demo", description=__doc__)
    parser.add_argument("--data", help="a BEIR-format folder (default: the shipped demo corpus)")
    parser.add_argument("--split", default="test", help="qrels split to evaluate")
    parser.add_argument("--cache", help="embedding cache directory (default: $GEOGRAPH_CACHE or ~/.cache/geograph)")
    parser.add_argument("--candidates", type=int, default=100, help="dense top-M that Maniscope reranks")
    parser.add_argument("--k", type=int, default=5, help="Maniscope k-NN degree")
    parser.add_argument("--alpha", type=float, default=0.3, help="Maniscope cosine weight")
    parser.add_argument("--show", type=int, default=3, help="queries to print side by side")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    dataset = load_beir(args.data, args.split) if args.data else load_demo()
    print(f"{dataset}: encoding with all-MiniLM-L6-v2 (cached)", flush=True)
    encoder = Encoder(cache=args.cache, progress=True)
    corpus, query = embed(dataset, encoder)
    cands = dense_candidates(corpus, query, args.candidates)
    reranker = Maniscope(k=args.k, alpha=args.alpha)
    man_i, man_s = rerank_all(cands, reranker, desc="Maniscope")

    for qi in range(min(args.show, len(dataset.queries))):
        print(f"\nQuery {dataset.query_ids[qi]}: {dataset.queries[qi]}")
        gold = dataset.qrels[dataset.query_ids[qi]]

        def fmt(idx, score):
            did = dataset.doc_ids[idx]
            mark = "*" if gold.get(did, 0) > 0 else " "
            return f"{mark}{score:6.3f} {did}: {dataset.texts[idx]}"

        left = ["dense (cosine)"] + [fmt(i, s) for i, s in zip(cands.indices[qi, :5].tolist(), cands.scores[qi, :5].tolist())]
        right = [f"Maniscope (k={args.k}, alpha={args.alpha})"] + [
            fmt(i, s) for i, s in zip(man_i[qi, :5].tolist(), man_s[qi, :5].tolist())
        ]
        print(side_by_side(left, right))
    print("\n(* = judged relevant)")

    qrels = dataset.qrels_list()
    rows = {
        "dense": evaluate(run_ids(dataset, cands.indices), qrels, METRICS),
        "Maniscope": evaluate(run_ids(dataset, man_i, man_s), qrels, METRICS),
    }
    print(f"\nQuality on {dataset.name} ({args.split}, {len(dataset.queries)} queries, "
          f"Maniscope reranks dense top-{cands.indices.shape[1]}):")
    print(format_table(rows, METRICS))
    print(f"\ndone in {time.perf_counter() - t0:.1f} s")
    return 0
