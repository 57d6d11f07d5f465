"""``geograph bench gpu``: every kernel and module on a CUDA device against its CPU result, and timings.

On synthetic clustered embeddings (no model, no data files needed), for each kernel of
:mod:`geograph.functional` and each public module it runs the same inputs on the CPU and on
``--device`` (modules are built on the CPU and moved with ``.to(device)``, as users do) and records the
largest difference (ids: the share of identical top-k lists;
Ricci-Filtration: the kept-set agreement of the device's solver with CPU's exact one), then
times each module at B = ``--sizes`` (default 1, 64, 1024) with ``torch.cuda.synchronize``
around every call. Writes one JSON file (``--out``) and prints a table.

``--device cpu`` runs the same script on the CPU (the parity column is then CPU vs CPU); the
test suite does that with small sizes so the script cannot rot between GPU loans.
"""

from __future__ import annotations

import copy
import functools
import json
import platform
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from geograph.bench.common import time_calls
from geograph.console import make_parser


def clustered(n: int, dim: int, *, clusters: int = 50, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(clusters, dim, generator=g)
    x = centers[torch.randint(clusters, (n,), generator=g)] + 0.6 * torch.randn(n, dim, generator=g)
    return torch.nn.functional.normalize(x, dim=1)


def _diff(a: Tensor, b: Tensor) -> float:
    if isinstance(a, torch.Tensor) and a.is_sparse_csr:
        a, b = a.to_dense(), b.to_dense()
    a, b = torch.as_tensor(a).detach().cpu().double(), torch.as_tensor(b).detach().cpu().double()
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    d = torch.where(both_inf, torch.zeros_like(a), (a - b).abs())
    return float(d.nan_to_num(float("inf")).max()) if d.numel() else 0.0


def kernel_parity(dev: torch.device, *, b: int = 8, n: int = 21, corpus: int = 2000) -> dict[str, float]:
    """Max |device - cpu| of every functional kernel on the same inputs."""
    import geograph.functional as F
    from geograph.graphs.corpus_graph import CorpusGraph
    from geograph.ops.adjacency import query_graph

    torch.manual_seed(0)
    docs = clustered(b * n, 64).view(b, n, 64).double()
    query = clustered(b, 64, seed=1).double()
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[0, n - 3 :] = False
    adj, node_mask, _ = query_graph(query, docs, mask)
    lengths = torch.ones(adj.shape, dtype=torch.float64)
    x = clustered(corpus, 64, seed=2)
    edge_index = CorpusGraph.from_knn(x, 5).edge_index
    vol = torch.rand(corpus, dtype=torch.float64) + 0.5
    w = torch.rand(b, n, n, dtype=torch.float64) * (torch.rand(b, n, n) < 0.3)
    r = torch.softmax(torch.randn(b, n, dtype=torch.float64), 1)
    a = torch.rand(b, n, dtype=torch.float64) + 0.1
    a /= a.sum(1, keepdim=True)
    cost = torch.rand(b, n, n, dtype=torch.float64)

    cases: dict[str, Callable[[Callable[[Tensor], Tensor]], Tensor]] = {
        "cosine_similarity": lambda t: F.cosine_similarity(t(docs), t(docs)),
        "knn_graph": lambda t: F.knn_graph(t(docs), 5, t(mask)).double(),
        "shortest_paths": lambda t: F.shortest_paths(
            t(1 - F.cosine_similarity(docs, docs).clamp(-1, 1)), t(F.knn_graph(docs, 5, mask)), t(mask)
        ),
        "maniscope_scores": lambda t: F.maniscope_scores(t(query), t(docs), t(mask), k=5, alpha=0.3)[0],
        "sinkhorn": lambda t: F.sinkhorn(t(cost), t(a), t(a.flip(1)), reg=0.05, max_iter=500).plan,
        "ollivier_ricci (sinkhorn)": lambda t: F.ollivier_ricci(
            t(lengths), t(adj), t(node_mask), solver="sinkhorn", max_iter=300
        ),
        "ricci_flow (sinkhorn, 3 steps)": lambda t: (
            F.ricci_flow(t(adj), t(lengths), t(node_mask), iterations=3, solver="sinkhorn", max_iter=300).lengths
        ),
        "isoperimetric_ratio": lambda t: F.isoperimetric_ratio(t(edge_index), t(vol), corpus),
        "personalized_pagerank": lambda t: F.personalized_pagerank(t(w), t(r), t(mask)),
        "gain_density": lambda t: F.gain_density(t(x)),
        "gain_transition": lambda t: F.gain_transition(t(x), max_degree=16),
    }
    cpu: Callable[[Tensor], Tensor] = lambda v: v  # noqa: E731
    to_dev: Callable[[Tensor], Tensor] = lambda v: v.to(dev)  # noqa: E731
    out = {}
    for name, fn in cases.items():
        out[name] = _diff(fn(to_dev), fn(cpu))
    return out


def module_parity_and_timing(
    dev: torch.device, sizes: Sequence[int], *, corpus: int, repeat: int, parity_queries: int = 16
) -> dict[str, dict[str, Any]]:
    """Each module on CPU vs ``dev`` (ids / kept sets) and ms/query on ``dev`` at each B."""
    from geograph.graphs import G3Graph
    from geograph.graphs.corpus_graph import CorpusGraph
    from geograph.rerankers import Maniscope, RicciFiltration
    from geograph.retrievers import DenseRetriever, G3Retriever, ISORetriever

    big = max(sizes)
    x = clustered(corpus, 384, seed=3)
    q = clustered(big, 384, seed=4)
    dense_cpu = DenseRetriever(x)
    cand = dense_cpu(q, 100).indices
    graph = CorpusGraph.from_knn(x, 10)
    g3_cpu = G3Graph.build(x, max_degree=32)
    # every module is built on the CPU and moved with .to(device), the path users take (a fresh
    # copy of the shared graphs each time: .to moves a module's state in place)
    models: dict[str, tuple[Callable[[torch.device], nn.Module], Callable[[nn.Module, Tensor, Tensor], Tensor]]] = {
        "DenseRetriever (k=10)": (lambda d: DenseRetriever(x).to(d), lambda m, qq, cc: m(qq, 10).indices),
        "Maniscope (M=100)": (lambda d: Maniscope().to(d), lambda m, qq, cc: m(qq, x.to(qq.device)[cc]).order),
        "RicciFiltration (M=20)": (
            lambda d: RicciFiltration().to(d),
            lambda m, qq, cc: m(qq, x.to(qq.device)[cc[:, :20]]).keep,
        ),
        "ISORetriever (k=10)": (
            lambda d: ISORetriever(copy.deepcopy(graph)).to(d),
            lambda m, qq, cc: m(qq, 10).indices,
        ),
        "G3Retriever (k=5)": (lambda d: G3Retriever(copy.deepcopy(g3_cpu)).to(d), lambda m, qq, cc: m(qq, 5).indices),
    }
    parity_b = min(parity_queries, big)
    out = {}
    for name, (make, call) in models.items():
        ref_model, model = make(torch.device("cpu")), make(dev)
        got = call(model, q[:parity_b].to(dev), cand[:parity_b].to(dev)).cpu()
        ref = call(ref_model, q[:parity_b], cand[:parity_b])
        row: dict[str, Any] = {
            "parity_queries": parity_b,
            "identical_rows": float((got == ref).all(1).double().mean()),
            "identical_entries": float((got == ref).double().mean()),
            "ms_per_query": {},
        }
        for b in sizes:
            if name.startswith("RicciFiltration") and dev.type == "cpu" and b > 64:
                row["ms_per_query"][str(b)] = None  # the CPU exact path: ~90 ms per graph, see bench ricci
                continue
            qq, cc = q[:b].to(dev), cand[:b].to(dev)
            t = time_calls(functools.partial(call, model, qq, cc), repeat=repeat, device=dev)
            row["ms_per_query"][str(b)] = t["median"] / b * 1e3
        out[name] = row
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("geograph bench gpu", __doc__)
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 64, 1024])
    p.add_argument("--corpus", type=int, default=20000, help="synthetic corpus size for the retrievers")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--parity-queries", type=int, default=16, help="queries compared with the CPU per module")
    p.add_argument("--kernel-batch", type=int, default=8, help="graphs per kernel parity case")
    p.add_argument("--out", default="bench-results/gpu.json")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("geograph bench gpu: CUDA is not available on this machine (pass --device cpu to dry-run)")
        return 2
    env = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
    }
    kernels = kernel_parity(dev, b=args.kernel_batch)
    modules = module_parity_and_timing(
        dev, args.sizes, corpus=args.corpus, repeat=args.repeat, parity_queries=args.parity_queries
    )
    print(f"kernel parity, {dev} vs cpu (max |diff|):")
    for name, d in kernels.items():
        print(f"  {name:<34}{d:10.2e}")
    print(f"\nmodules on {dev}: identical rows vs cpu, ms/query at B = {args.sizes}")
    for name, row in modules.items():
        ms = "  ".join("--" if v is None else f"{v:.4f}" for v in row["ms_per_query"].values())
        print(f"  {name:<26}{row['identical_rows'] * 100:6.1f}%   {ms}")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "environment": env,
                "sizes": args.sizes,
                "corpus": args.corpus,
                "kernels_max_abs_diff": kernels,
                "modules": modules,
            },
            indent=2,
        )
    )
    print(f"\nwrote {path}")
    return 0
