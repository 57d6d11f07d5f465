"""``geograph bench maniscope``: batched Maniscope vs the per-query scipy reference.

On SciFact test (dense top-M MiniLM candidates per query) it times

* the reference (:func:`geograph.methods.maniscope.bench.maniscope_reference`: scikit-learn k-NN,
  CSR graph, scipy Dijkstra), one query at a time;
* :class:`geograph.Maniscope` at B = 1 and at B = ``--batch`` on the same candidate sets,

checks that both give the same order, and reports nDCG@10 of dense vs Maniscope.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from geograph.bench.common import dense_candidate_set, time_calls, write_json
from geograph.console import format_table, make_parser
from geograph.evaluation import evaluate
from geograph.methods.maniscope.bench import maniscope_reference
from geograph.methods.maniscope.module import Maniscope
from geograph.outputs import RerankOutput
from geograph.pipeline import rerank_all, run_ids


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("geograph bench maniscope", __doc__)
    p.add_argument("--data", help="BEIR folder (default: $GEOGRAPH_DATA/scifact)")
    p.add_argument("--split", default="test")
    p.add_argument("--cache", help="embedding cache directory")
    p.add_argument("--candidates", type=int, default=100, help="M, the dense top-M reranked")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--alpha", type=float, default=0.3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)

    dataset, cands = dense_candidate_set(args.data, args.split, args.cache, args.candidates)
    query = cands.query
    model = Maniscope(k=args.k, alpha=args.alpha)
    dev = torch.device(args.device)

    b = min(args.batch, query.shape[0])
    q_b = query[:b].to(dev)
    docs_b = cands.docs(slice(0, b)).to(dev)
    q_np, docs_np = query[:b].double().numpy(), cands.docs(slice(0, b)).double().numpy()

    def reference() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return [maniscope_reference(q_np[i], docs_np[i], k=args.k, alpha=args.alpha) for i in range(b)]

    def batched() -> RerankOutput:
        out: RerankOutput = model(q_b, docs_b)
        return out

    def single() -> None:
        for i in range(b):
            model(q_b[i : i + 1], docs_b[i : i + 1])

    print(f"timing on {b} queries x {docs_b.shape[1]} candidates ...", flush=True)
    # each warmed up, then --repeat times (or >= 3 times once 1 s of work is done)
    t_ref = time_calls(reference, repeat=args.repeat, min_time=1.0)
    t_one = time_calls(single, repeat=args.repeat, min_time=1.0, device=dev)
    t_bat = time_calls(batched, repeat=args.repeat, min_time=1.0, device=dev)
    ms = {name: t["median"] / b * 1e3 for name, t in (("reference", t_ref), ("B=1", t_one), (f"B={b}", t_bat))}

    # parity on every query of the split, float64
    max_err, same = 0.0, 0
    out64 = []
    for start in range(0, query.shape[0], args.batch):
        rows = slice(start, start + args.batch)
        out64.append(model(query[rows].double(), cands.docs(rows).double()))
    scores64 = torch.cat([o.scores for o in out64]).numpy()
    order64 = torch.cat([o.order for o in out64]).numpy()
    for i in tqdm(range(query.shape[0]), desc="reference parity", unit="query"):
        s, _, o = maniscope_reference(
            query[i].double().numpy(), cands.docs(slice(i, i + 1))[0].double().numpy(), k=args.k, alpha=args.alpha
        )
        max_err = max(max_err, float(np.abs(s - scores64[i]).max()))
        same += int(np.array_equal(o, order64[i]))

    man_i, man_s = rerank_all(cands, model, batch_size=args.batch, desc="Maniscope")
    qrels = dataset.qrels_list()
    metrics = ("nDCG@10", "Recall@10", "MRR@10")
    quality = {
        "dense": evaluate(run_ids(dataset, cands.indices), qrels, metrics),
        f"Maniscope (dense top-{cands.indices.shape[1]})": evaluate(run_ids(dataset, man_i, man_s), qrels, metrics),
    }

    print(
        f"\nManiscope speed on {dataset.name} {args.split} (M={docs_b.shape[1]}, k={args.k}, "
        f"{torch.get_num_threads()} threads, device={dev}), median of repeats:"
    )
    print(f"{'path':<34}{'ms/query':>10}{'speed-up':>10}")
    print(f"{'reference (sklearn + scipy)':<34}{ms['reference']:10.3f}{1.0:10.1f}x")
    print(f"{'geograph.Maniscope B=1':<34}{ms['B=1']:10.3f}{ms['reference'] / ms['B=1']:10.1f}x")
    print(f"{'geograph.Maniscope B=' + str(b):<34}{ms[f'B={b}']:10.3f}{ms['reference'] / ms[f'B={b}']:10.1f}x")
    print(
        f"\nparity (float64, {query.shape[0]} queries): identical order on {same}/{query.shape[0]}, "
        f"max |score diff| = {max_err:.2e}"
    )
    print(f"\nQuality on {dataset.name} {args.split} ({len(qrels)} queries):")
    print(format_table(quality, metrics))
    path = write_json(
        "maniscope",
        {
            "dataset": dataset.name,
            "split": args.split,
            "candidates": docs_b.shape[1],
            "k": args.k,
            "alpha": args.alpha,
            "batch": b,
            "device": str(dev),
            "threads": torch.get_num_threads(),
            "ms_per_query": ms,
            "timings_s": {"reference": t_ref, "B=1": t_one, f"B={b}": t_bat},
            "speedup_vs_reference": {k: ms["reference"] / v for k, v in ms.items()},
            "parity": {"queries": int(query.shape[0]), "identical_order": same, "max_abs_score_diff": max_err},
            "quality": quality,
        },
        args.out,
    )
    print(f"\nwrote {path}")
    return 0
