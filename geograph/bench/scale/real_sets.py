"""The real sets of ``geograph bench scale`` at their own size: IVF-built graphs against exact ones, and the
retrievers' top-k on both."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from geograph.bench.scale.harness import KNN_K, MAX_DEGREE
from geograph.bench.scale.references import csr_edge_recall, exact_knn_rows, knn_recall


def real_set(name: str, root: str, encoder: Any, args: argparse.Namespace) -> dict[str, Any]:
    from geograph.data import load_beir
    from geograph.graphs.corpus_graph import CorpusGraph
    from geograph.graphs.g3_graph import G3Graph
    from geograph.retrievers import G3Retriever, ISORetriever

    ds = load_beir(root, "test")
    x = encoder.encode(ds.passages())
    q = encoder.encode(ds.queries)
    n = len(x)
    out: dict[str, Any] = {"N": n, "queries": len(ds.queries)}
    z = torch.nn.functional.normalize(x, dim=1)
    exact_knn = CorpusGraph.from_knn(x, KNN_K)
    ivf_knn = CorpusGraph.from_knn(x, KNN_K, index="ivf", nprobe=args.nprobe)
    rows = torch.arange(n)
    ref = exact_knn_rows(z, rows, KNN_K).numpy()
    out["knn_recall@10"] = knn_recall(ivf_knn.edge_index.numpy(), rows.numpy(), ref)
    g_exact = G3Graph.build(x, max_degree=MAX_DEGREE)
    g_ivf = G3Graph.build(
        x,
        max_degree=MAX_DEGREE,
        index="ivf",
        nprobe=args.nprobe,
        candidates=args.candidates,
        density_sample=args.density_sample,
        ranking=args.ranking,
    )
    info = g_ivf.build_info
    out["g3_certified"] = info.get("certified", 0) / n
    out["g3_redone"] = info.get("redone", 0)
    out["rho_max_error"] = float((g_exact.density - g_ivf.density).abs().max())
    out["nprobe"] = info.get("nprobe")
    out["g3_edge_recall"] = csr_edge_recall(g_exact.crow, g_exact.col, g_ivf.crow, g_ivf.col)

    def same(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((torch.sort(a, 1).values == torch.sort(b, 1).values).all(1).float().mean())

    k = 10
    out["iso_same_topk"] = same(ISORetriever(exact_knn)(q, k=k).indices, ISORetriever(ivf_knn)(q, k=k).indices)
    out["g3_same_topk"] = same(G3Retriever(g_exact)(q, k=5).indices, G3Retriever(g_ivf)(q, k=5).indices)
    return out
