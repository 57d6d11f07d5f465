"""``geograph bench ricci``: batched Ricci-Filtration vs GraphRicciCurvature 0.6.1 per query.

On SciFact test and MuSiQue query graphs (query + dense top-20 MiniLM candidates, 21 nodes):

* (a) GraphRicciCurvature 0.6.1 per query, on a graph built independently in numpy
  (:func:`~geograph.methods.ricci.bench.ricci_graph_reference`: ``numpy.percentile`` threshold,
  forced query edges): ``OllivierRicci(G, alpha=0.5, exp_power=2, method="OTD", proc=1)``,
  curvature + ``compute_ricci_flow(iterations=20)``. Its kept set and flowed lengths come from
  every query; its time from ``--ref-queries`` of them (warmed up, ``--repeat`` repeats);
* (b) :class:`geograph.RicciFiltration` ``solver="exact"`` (the CPU default) at B = 1 and
  B = ``--batch``, with its simplex work on the same graphs (primal pivots and dual steps per
  transport problem, warm-started as shipped and cold);
* (c) ``solver="sinkhorn"`` (certified, the accelerator's path) at B = ``--batch``: kept sets
  on ``--sinkhorn-queries`` graphs (default: all), with the share of edges it re-solved
  exactly per flow step and its Sinkhorn work (iterations x problems) per step recorded from
  the same calls; its time from ``--sinkhorn-timed`` of them.

Every timing is warmed up and repeated (median and min-max over ``--repeat`` runs, in the
table and the JSON), with the thread counts (torch and numba). It reports ms/query with the
ratio to (a), the flowed query-edge length error and the kept-set agreement with (a), and for
SciFact the quality (nDCG@10, Recall@10) of dense top-20 vs the kept set ordered by cosine.
Needs GraphRicciCurvature for (a): the ``ref`` extra, or `make`, which installs it with
``--no-deps`` (its metadata pins an old scipy).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from geograph.bench.common import dense_candidate_set, resolve_data, time_calls, write_json
from geograph.console import format_table, make_parser
from geograph.evaluation import evaluate
from geograph.methods.ricci.bench import ricci_graph_reference, ricci_reference
from geograph.methods.ricci.module import RicciFiltration
from geograph.pipeline import rerank_all, run_ids


def _reference(q: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """GraphRicciCurvature's flowed query-edge lengths ``(N,)`` of one query."""
    n = docs.shape[0] + 1
    _, lengths = ricci_reference(ricci_graph_reference(q, docs), n, iterations=20)
    return np.array([lengths[(0, j)] for j in range(1, n)])


def _run(model: RicciFiltration, q: torch.Tensor, docs: torch.Tensor, batch: int, device: torch.device) -> list[Any]:
    outs = [model(q[s : s + batch].to(device), docs[s : s + batch].to(device)) for s in range(0, q.shape[0], batch)]
    return outs


def _timing(stats: dict[str, float], queries: int) -> dict[str, Any]:
    """Per-query milliseconds from :func:`time_calls` seconds over ``queries`` queries."""
    return {k: stats[k] / queries * 1e3 for k in ("median", "min", "max")} | {
        "repeat": stats["repeat"],
        "queries": queries,
    }


def _exact_solver_counts(model: RicciFiltration, q: torch.Tensor, docs: torch.Tensor) -> dict[str, Any]:
    """The exact flow's simplex work on these graphs, warm-started (as shipped) and cold."""
    from geograph.ops.adjacency import query_graph
    from geograph.transport.flow import exact_flow_stats

    adj, node_mask, _ = query_graph(q, docs, percentile=model.percentile)
    counts = {}
    for start, warm in (("warm", True), ("cold", False)):
        st = exact_flow_stats(
            adj,
            torch.ones(adj.shape, dtype=torch.float64),
            node_mask,
            **model.options.flow_keywords(),
            warm_start=warm,
        )
        counts[start] = {
            "problems": st.problems,
            "warm_started": st.warm_started / st.problems,
            "pivots_per_problem": st.pivots / st.problems,
            "dual_steps_per_problem": st.dual_steps / st.problems,
        }
    return counts


def bench_dataset(name: str, args: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    data = args.data if (name == "scifact" and args.data) else str(resolve_data(None, name))
    dataset, cands = dense_candidate_set(data, args.split if name == "scifact" else "test", args.cache, args.candidates)
    nq = min(args.queries, cands.query.shape[0])
    q64 = cands.query[:nq].double()
    docs64 = cands.docs(slice(0, nq)).double()

    # (a) the reference: kept sets over every query, time over --ref-queries (warmed, repeated)
    q_np, d_np = q64.numpy(), docs64.numpy()
    ref_len = np.stack([_reference(q_np[i], d_np[i]) for i in tqdm(range(nq), desc=f"GraphRicciCurvature {name}")])
    ref_keep = torch.from_numpy(ref_len <= 1.0)
    n_ref = min(args.ref_queries, nq)
    t_ref = _timing(time_calls(lambda: [_reference(q_np[i], d_np[i]) for i in range(n_ref)], repeat=args.repeat), n_ref)
    rows: dict[str, dict[str, Any]] = {"(a) GraphRicciCurvature 0.6.1": t_ref}

    def record(
        label: str,
        model: RicciFiltration,
        q: torch.Tensor,
        docs: torch.Tensor,
        batch: int,
        count: int,
        timed: int | None = None,
        outs: list[Any] | None = None,
    ) -> dict[str, Any]:
        if outs is None:
            outs = _run(model, q[:count], docs[:count], batch, dev)
        keep = torch.cat([o.keep.cpu() for o in outs])
        length = torch.cat([o.query_edge_length.double().cpu() for o in outs])
        n_timed = count if timed is None else min(timed, count)
        t = time_calls(lambda: _run(model, q[:n_timed], docs[:n_timed], batch, dev), repeat=args.repeat, device=dev)
        row = _timing(t, n_timed)
        row["kept_queries"] = count
        row.update(
            kept_agreement=(keep == ref_keep[:count]).double().mean().item(),
            graphs_identical=(keep == ref_keep[:count]).all(1).double().mean().item(),
            max_length_error=(length - torch.from_numpy(ref_len[:count])).abs().max().item(),
        )
        rows[label] = row
        return row

    exact = RicciFiltration(solver="exact")
    record(f"(b) exact B={args.batch}", exact, q64, docs64, args.batch, nq)
    record("(b) exact B=1", exact, q64, docs64, 1, min(args.single, nq))
    solver_counts = _exact_solver_counts(exact, q64, docs64)
    ns = nq if args.sinkhorn_queries is None else min(args.sinkhorn_queries, nq)
    if ns:
        # the certificate statistics of the module's own flows, recorded during its kept-set pass
        import geograph.methods.ricci.functional as ricci_functional  # where ricci_filtration looks ricci_flow up

        ricci_module: Any = ricci_functional
        resolved: list[torch.Tensor] = []
        work: list[torch.Tensor] = []
        flow_fn = ricci_module.ricci_flow

        def recording_flow(*a: Any, **kw: Any) -> Any:
            fl = flow_fn(*a, **kw)
            resolved.append(fl.resolved.double().cpu())
            work.append(fl.work.double().cpu())
            return fl

        sk = RicciFiltration(solver="sinkhorn")
        q32, d32 = q64[:ns].float(), docs64[:ns].float()
        ricci_module.ricci_flow = recording_flow
        try:
            outs = _run(sk, q32, d32, args.batch, dev)
        finally:
            ricci_module.ricci_flow = flow_fn
        row = record(f"(c) sinkhorn B={args.batch}", sk, q32, d32, args.batch, ns, timed=args.sinkhorn_timed, outs=outs)
        row.update(
            resolved_share_per_step=[
                float(torch.stack([r[i] for r in resolved if len(r) > i]).mean())
                for i in range(max(len(r) for r in resolved))
            ],
            sinkhorn_work_per_step=float(torch.cat(work).mean()),
        )

    out: dict[str, Any] = {
        "dataset": dataset.name,
        "queries": nq,
        "nodes": docs64.shape[1] + 1,
        "paths": rows,
        "exact_solver": solver_counts,
    }
    if name == "scifact":
        rf_i, rf_s = rerank_all(
            cands, lambda q, d: exact(q.double(), d.double()), batch_size=args.batch, desc="Ricci-Filtration"
        )
        metrics = ("nDCG@10", "Recall@10")
        kept = torch.isfinite(rf_s).sum(1).double()
        out["quality"] = {
            f"dense top-{args.candidates}": evaluate(run_ids(dataset, cands.indices), dataset.qrels_list(), metrics),
            "Ricci-Filtration kept, by cosine": evaluate(run_ids(dataset, rf_i, rf_s), dataset.qrels_list(), metrics),
        }
        out["mean_kept"] = kept.mean().item()
    return out


def _print(name: str, res: dict[str, Any], threads: dict[str, Any]) -> None:
    rows = res["paths"]
    ref = rows["(a) GraphRicciCurvature 0.6.1"]["median"]
    print(
        f"\nRicci-Filtration speed on {res['dataset']} ({res['queries']} query graphs, {res['nodes']} nodes, "
        f"torch threads {threads['torch']}, numba threads {threads['numba']}):"
    )
    print(
        f"{'path':<34}{'queries':>8}{'ms/query (min-max)':>26}{'vs (a) (min-max)':>22}"
        f"{'kept agree (graphs)':>21}{'max |dw|':>10}"
    )
    for label, r in rows.items():
        spread = f"{r['median']:9.2f} ({r['min']:.2f}-{r['max']:.2f})"
        ratio = f"{ref / r['median']:7.1f}x ({ref / r['max']:.0f}-{ref / r['min']:.0f})"
        extra = (
            f"{r['kept_agreement'] * 100:11.2f}% of {r['kept_queries']}{r['max_length_error']:10.1e}"
            if "kept_agreement" in r
            else ""
        )
        print(f"{label:<34}{r['queries']:8d}{spread:>26}{ratio:>22}{extra}")
        if "resolved_share_per_step" in r:
            share = r["resolved_share_per_step"]
            print(
                f"{'':<34}re-solved exactly per step: mean {np.mean(share) * 100:.1f}%, max {max(share) * 100:.1f}%; "
                f"Sinkhorn work {r['sinkhorn_work_per_step']:.3g} iterations x problems per step"
            )
    warm, cold = res["exact_solver"]["warm"], res["exact_solver"]["cold"]
    print(
        f"exact solver, {warm['problems']} transport problems: warm-started {warm['warm_started'] * 100:.1f}%, "
        f"{warm['pivots_per_problem']:.2f} pivots + {warm['dual_steps_per_problem']:.2f} dual steps per problem "
        f"(cold start: {cold['pivots_per_problem']:.2f} pivots)"
    )
    if "quality" in res:
        print(f"\nQuality on {res['dataset']} (mean kept {res['mean_kept']:.2f}):")
        print(format_table(res["quality"], ("nDCG@10", "Recall@10")))


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("geograph bench ricci", __doc__)
    p.add_argument(
        "--data",
        help="SciFact BEIR folder (default: $GEOGRAPH_DATA/scifact); MuSiQue is always read "
        "from the data folder ($GEOGRAPH_DATA/musique)",
    )
    p.add_argument("--datasets", nargs="+", default=["scifact", "musique"], help="(default: %(default)s)")
    p.add_argument("--split", default="test", help="SciFact split (MuSiQue: test)")
    p.add_argument("--cache", help="embedding cache directory")
    p.add_argument("--candidates", type=int, default=20, help="dense candidates per query (default: %(default)s)")
    p.add_argument(
        "--queries",
        type=int,
        default=300,
        help="query graphs per data set for (a) kept sets and (b), at most the set's queries (default: %(default)s; "
        "SciFact test has 300, MuSiQue 100)",
    )
    p.add_argument("--ref-queries", type=int, default=8, help="queries of (a) timed per repeat (default: %(default)s)")
    p.add_argument("--sinkhorn-queries", type=int, help="query graphs for (c)'s kept sets (default: all --queries)")
    p.add_argument(
        "--sinkhorn-timed", type=int, default=16, help="queries of (c) timed per repeat (default: %(default)s)"
    )
    p.add_argument("--single", type=int, default=16, help="queries timed one at a time (B = 1) (default: %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="queries per batch of (b) and (c) (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=5, help="timing repeats, at least 5 (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="(default: %(default)s)")
    p.add_argument("--out", default="bench-results", help="output folder of ricci.json (default: %(default)s)")
    args = p.parse_args(argv)
    if args.repeat < 5:
        p.error("--repeat must be >= 5")
    import numba

    dev = torch.device(args.device)
    threads = {"torch": torch.get_num_threads(), "numba": numba.get_num_threads()}
    results = {}
    for name in args.datasets:
        results[name] = bench_dataset(name, args, dev)
        _print(name, results[name], threads)
    for res in results.values():
        ref = res["paths"]["(a) GraphRicciCurvature 0.6.1"]["median"]
        for r in res["paths"].values():
            r["speedup_vs_reference"] = {"median": ref / r["median"], "min": ref / r["max"], "max": ref / r["min"]}
    path = write_json(
        "ricci",
        {"device": str(dev), "threads": threads, "batch": args.batch, "repeat": args.repeat, "datasets": results},
        args.out,
    )
    print(f"\nwrote {path}")
    return 0
