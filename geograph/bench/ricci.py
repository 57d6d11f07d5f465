"""``geograph bench ricci``: batched Ricci-Filtration vs GraphRicciCurvature 0.6.1 per query.

On SciFact test query graphs (query + dense top-20 MiniLM candidates, 21 nodes) it times

* (a) GraphRicciCurvature 0.6.1 per query: ``OllivierRicci(G, alpha=0.5, exp_power=2,
  method="OTD", proc=1)``, curvature + ``compute_ricci_flow(iterations=20)``;
* (b) :class:`geograph.RicciFiltration` with ``solver="exact"`` at B = 1 and B = ``--batch``;
* (c) ``solver="sinkhorn"`` at B = 1 and B = ``--batch`` (on ``--sinkhorn-queries`` graphs:
  on a CPU it is slow, see the README);

and reports ms/query with the ratio to (a) from the same run, the flowed query-edge length
error and the kept-set agreement with (a), and the quality (nDCG@10, Recall@10, mean kept
count) of dense top-20 vs the kept set ordered by cosine over every test query.
Needs the ``ref`` extra (GraphRicciCurvature) for (a).
"""
from __future__ import annotations

import argparse
import time
from typing import Optional, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from geograph.bench.common import dense_candidate_set, sync, write_json
from geograph.bench.reference import ricci_reference
from geograph.demo import format_table
from geograph.metrics import evaluate
from geograph.pipeline import rerank_all, run_ids
from geograph.rerankers import RicciFiltration, query_graph


def _timed(fn, device):
    t = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t


def _batched(model, q, docs, batch, device):
    outs = []
    for s in range(0, q.shape[0], batch):
        outs.append(model(q[s : s + batch].to(device), docs[s : s + batch].to(device)))
    return torch.cat([o.keep.cpu() for o in outs]), torch.cat([o.query_edge_length.double().cpu() for o in outs])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="geograph bench ricci", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="BEIR folder (default: ../shared/data/scifact)")
    p.add_argument("--split", default="test")
    p.add_argument("--cache", help="embedding cache directory")
    p.add_argument("--candidates", type=int, default=20)
    p.add_argument("--queries", type=int, default=256, help="query graphs timed for (a) and (b)")
    p.add_argument("--sinkhorn-queries", type=int, default=64, help="query graphs timed for (c)")
    p.add_argument("--single", type=int, default=16, help="queries timed one at a time (B = 1; a quarter for (c))")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)

    dataset, cands = dense_candidate_set(args.data, args.split, args.cache, args.candidates)
    query = cands.query
    dev = torch.device(args.device)
    nq = min(args.queries, query.shape[0])
    q64 = query[:nq].double()
    docs64 = cands.docs(slice(0, nq)).double()
    n_nodes = docs64.shape[1] + 1
    adj, _, _ = query_graph(q64, docs64)

    # (a) the reference, one query at a time
    ref_len = torch.zeros(nq, n_nodes - 1, dtype=torch.float64)
    t0 = time.perf_counter()
    for i in tqdm(range(nq), desc="GraphRicciCurvature", unit="query"):
        edges = [tuple(e) for e in torch.triu(adj[i], 1).nonzero().tolist()]
        _, lengths = ricci_reference(edges, n_nodes, iterations=20)
        ref_len[i] = torch.tensor([lengths[(0, j)] for j in range(1, n_nodes)])
    t_ref = (time.perf_counter() - t0) / nq
    ref_keep = ref_len <= 1.0

    rows: dict[str, dict] = {"(a) GraphRicciCurvature 0.6.1": {"ms": t_ref * 1e3, "queries": nq}}
    single = min(args.single, nq)
    for solver, count in (("exact", nq), ("sinkhorn", min(args.sinkhorn_queries, nq))):
        model = RicciFiltration(solver=solver)
        dtype = torch.float64 if solver == "exact" else torch.float32
        q_s, d_s = q64[:count].to(dtype), docs64[:count].to(dtype)
        _batched(model, q_s[:1], d_s[:1], 1, dev)  # warm-up
        n_one = single if solver == "exact" else max(1, single // 4)
        (_, _), t1 = _timed(lambda: _batched(model, q_s[:n_one], d_s[:n_one], 1, dev), dev)
        (keep, length), tb = _timed(lambda: _batched(model, q_s, d_s, args.batch, dev), dev)
        tag = "(b)" if solver == "exact" else "(c)"
        for name, secs, n in ((f"{tag} {solver} B=1", t1, n_one), (f"{tag} {solver} B={args.batch}", tb, count)):
            rows[name] = {"ms": secs / n * 1e3, "queries": n}
        agree = (keep == ref_keep[:count]).double().mean().item()
        graphs_same = (keep == ref_keep[:count]).all(1).double().mean().item()
        err = (length - ref_len[:count]).abs().max().item()
        rows[f"{tag} {solver} B={args.batch}"].update(kept_agreement=agree, graphs_identical=graphs_same,
                                                        max_length_error=err)

    # quality over every query of the split: exact RicciFiltration, kept set ordered by cosine
    model = RicciFiltration(solver="exact")
    rf_i, rf_s = rerank_all(cands, lambda q, d: model(q.double(), d.double()), batch_size=args.batch,
                            desc="Ricci-Filtration")
    qrels = dataset.qrels_list()
    metrics = ("nDCG@10", "Recall@10")
    kept = torch.isfinite(rf_s).sum(1).double()
    quality = {
        f"dense top-{args.candidates}": evaluate(run_ids(dataset, cands.indices), qrels, metrics),
        "Ricci-Filtration kept, by cosine": evaluate(run_ids(dataset, rf_i, rf_s), qrels, metrics),
    }

    print(f"\nRicci-Filtration speed on {dataset.name} {args.split} ({n_nodes}-node query graphs, "
          f"{torch.get_num_threads()} threads, device={dev}):")
    print(f"{'path':<38}{'queries':>8}{'ms/query':>11}{'vs (a)':>9}{'kept agree':>12}{'max |dw|':>10}")
    for name, r in rows.items():
        extra = ""
        if "kept_agreement" in r:
            extra = f"{r['kept_agreement'] * 100:11.2f}%{r['max_length_error']:10.1e}"
        print(f"{name:<38}{r['queries']:8d}{r['ms']:11.2f}{t_ref * 1e3 / r['ms']:8.1f}x{extra}")
    print(f"\nQuality on {dataset.name} {args.split} ({len(qrels)} queries); mean kept "
          f"{kept.mean():.2f} of {args.candidates} (min {int(kept.min())}, max {int(kept.max())}):")
    print(format_table(quality, metrics))
    path = write_json("ricci", {
        "dataset": dataset.name, "split": args.split, "nodes": n_nodes, "device": str(dev),
        "threads": torch.get_num_threads(), "batch": args.batch,
        "paths": {k: {**v, "speedup_vs_reference": t_ref * 1e3 / v["ms"]} for k, v in rows.items()},
        "quality": quality, "mean_kept": kept.mean().item(),
    }, args.out)
    print(f"\nwrote {path}")
    return 0
