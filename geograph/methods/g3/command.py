"""``geograph bench g3``: blockwise G3RAG graph build at scale, and G3RAG vs dense quality.

Scale: for each ``--sizes`` N, synthetic clustered 384-d unit embeddings, ``max_degree=32``:
build time and peak memory (resident set of a fresh subprocess, above its baseline after
imports) of :meth:`geograph.G3Graph.build`, next to the authors' dense numpy construction
(:func:`geograph.methods.g3.bench.g3_dense_reference`) where its ``N x N`` float64 matrices fit
in ``--dense-limit-gb``; the ratio is from the same run, and the dense T is checked against ours.

Quality: MuSiQue and SciFact, dense top-5 vs G3RAG top-5 (10 candidates, 2 cosine seeds),
Recall@5 and HitAll@5; beta and band tuned by Recall@5 on a split that is not reported
(MuSiQue: the first half of the queries, reporting the second; SciFact: train, reporting test).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import resource
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from geograph.bench.common import DEFAULT_DATA, tuning_split, write_json
from geograph.console import format_table, make_parser
from geograph.data import Encoder
from geograph.evaluation import evaluate
from geograph.pipeline import run_ids as _run

METRICS = ("Recall@5", "HitAll@5")
BETAS = (0.0, 0.4, 0.7, 1.0)
BANDS = ((0.1, 0.7), (0.2, 0.8), (0.3, 0.9), None)


def synthetic(n: int, dim: int = 384, clusters: int = 200, seed: int = 0) -> torch.Tensor:
    """Clustered unit vectors (topic-like: in-cluster cosine ~0.5, across ~0)."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.nn.functional.normalize(torch.randn(clusters, dim, generator=g), dim=1)
    x = centers[torch.randint(clusters, (n,), generator=g)] + 0.07 * torch.randn(n, dim, generator=g)
    return torch.nn.functional.normalize(x, dim=1)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _child(kind: str, n: int, max_degree: int, queue: Any) -> None:
    from geograph.graphs import G3Graph
    from geograph.methods.g3.bench import g3_dense_reference

    x = synthetic(n)
    base = _rss_mb()
    t = time.perf_counter()
    if kind == "ours":
        g = G3Graph.build(x, max_degree=max_degree)
        out: dict[str, float] = {"nnz": int(g.transition.values().numel())}
        out.update(seconds=time.perf_counter() - t, peak_mb=_rss_mb() - base)
    else:
        ref, _ = g3_dense_reference(x.numpy(), max_degree=max_degree)
        out = {"seconds": time.perf_counter() - t, "peak_mb": _rss_mb() - base}
        # parity in float64: in float32 near-ties at the top-``max_degree`` cut can flip an edge
        ours = G3Graph.build(x.double(), max_degree=max_degree).transition.to_dense().numpy()
        out["max_abs_diff_vs_ours"] = float(np.abs(ref - ours).max())
    queue.put(out)


def measure(kind: str, n: int, max_degree: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(kind, n, max_degree, queue))
    proc.start()
    out: dict[str, Any] = queue.get()
    proc.join()
    return out


def quality(name: str, root: str, encoder: Encoder) -> dict[str, Any]:
    from geograph.graphs import G3Graph
    from geograph.methods.dense.module import DenseRetriever
    from geograph.methods.g3.module import G3Retriever

    sp = tuning_split(name, root, encoder)
    corpus, protocol = sp.corpus, sp.protocol
    tune_set, tune_q, report_set, report_q = sp.tune, sp.tune_q, sp.report, sp.report_q
    max_degree = None if corpus.shape[0] <= 2000 else 128
    best: tuple[float, tuple[float, float] | None] = (0.0, None)
    best_key: tuple[float, ...] = ()
    graphs: dict[tuple[float, tuple[float, float] | None], G3Graph] = {}
    for beta, band in itertools.product(BETAS, BANDS):
        graph = G3Graph.build(corpus, band=band, beta=beta, max_degree=max_degree)
        graphs[(beta, band)] = graph
        got = evaluate(_run(tune_set, G3Retriever(graph)(tune_q, k=5).indices), tune_set.qrels_list(), METRICS)
        key = (got["Recall@5"], got["HitAll@5"])
        if not best_key or key > best_key:
            best_key, best = key, (beta, band)
    graph = graphs[best]
    table = {
        "dense": evaluate(
            _run(report_set, DenseRetriever(corpus)(report_q, 5).indices), report_set.qrels_list(), METRICS
        ),
        f"G3RAG (beta={best[0]}, band={best[1]})": evaluate(
            _run(report_set, G3Retriever(graph)(report_q, k=5).indices), report_set.qrels_list(), METRICS
        ),
        "G3RAG paper defaults (beta=0.4, band=(0.1, 0.7))": evaluate(
            _run(report_set, G3Retriever(graphs[(0.4, (0.1, 0.7))])(report_q, k=5).indices),
            report_set.qrels_list(),
            METRICS,
        ),
    }
    return {
        "protocol": protocol,
        "queries_reported": len(report_set.queries),
        "max_degree": max_degree,
        "tuned": {"beta": best[0], "band": best[1], "tuning_score": best_key},
        "quality": table,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("geograph bench g3", __doc__)
    p.add_argument("--sizes", type=int, nargs="*", default=[10_000, 50_000, 200_000])
    p.add_argument("--max-degree", type=int, default=32)
    p.add_argument("--dense-limit-gb", type=float, default=6.0, help="run the dense reference while 3 N^2 float64 fit")
    p.add_argument("--datasets", nargs="*", default=["musique", "scifact"])
    p.add_argument("--data-root", default=str(DEFAULT_DATA))
    p.add_argument("--cache", help="embedding cache directory")
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)

    scale: dict[int, dict[str, Any]] = {}
    for n in args.sizes:
        print(f"building the G3 graph for N={n} ...", flush=True)
        row = {"ours": measure("ours", n, args.max_degree)}
        if 3 * n * n * 8 / 2**30 <= args.dense_limit_gb:
            row["dense"] = measure("dense", n, args.max_degree)
        else:
            row["dense"] = {"skipped": f"needs ~{3 * n * n * 8 / 2**30:.0f} GB"}
        scale[n] = row
    print(f"\nG3 graph build, synthetic 384-d, max_degree={args.max_degree}, {torch.get_num_threads()} threads:")
    print(f"{'N':>9}{'ours s':>10}{'ours MB':>10}{'dense s':>10}{'dense MB':>10}{'speed-up':>10}{'max |dT|':>10}")
    for n, row in scale.items():
        o, d = row["ours"], row["dense"]
        if "seconds" in d:
            print(
                f"{n:9d}{o['seconds']:10.1f}{o['peak_mb']:10.0f}{d['seconds']:10.1f}{d['peak_mb']:10.0f}"
                f"{d['seconds'] / o['seconds']:9.1f}x{d['max_abs_diff_vs_ours']:10.1e}"
            )
        else:
            print(f"{n:9d}{o['seconds']:10.1f}{o['peak_mb']:10.0f}{'--':>10}{'--':>10}{'--':>10}   {d['skipped']}")

    results: dict[str, Any] = {}
    encoder = Encoder(cache=args.cache) if args.datasets else None
    for name in args.datasets:
        assert encoder is not None
        print(f"\n[{name}] tuning beta x band ({len(BETAS) * len(BANDS)} graphs) ...", flush=True)
        results[name] = quality(name, f"{args.data_root}/{name}", encoder)
        r = results[name]
        print(f"G3RAG on {name} ({r['protocol']}; {r['queries_reported']} queries reported):")
        print(format_table(r["quality"], METRICS))
    path = write_json(
        "g3",
        {
            "max_degree": args.max_degree,
            "threads": torch.get_num_threads(),
            "scale": {str(k): v for k, v in scale.items()},
            "quality": results,
        },
        args.out,
    )
    print(f"\nwrote {path}")
    return 0
