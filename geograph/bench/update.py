"""``geograph bench update``: adding and removing a fraction of a corpus in place against a rebuild.

For each size N (positional arguments) and each fraction f (``--fractions``), on a synthetic
corpus of ``--dim``-d unit vectors drawn around ``--topics`` random topic centres (seeded): a
graph is built on N passages, then ``round(f N)`` new passages are added
(:meth:`~geograph.CorpusGraph.add`, :meth:`~geograph.G3Graph.add`) and as many random passages
removed (``remove``), each timed; the graph of the final corpus is then built from scratch
(timed; the k-NN rebuild without ``--reserve``) and, up to ``--check-max`` passages, compared
with the updated one in the same run
(k-NN: the same ``edge_index``; G3: the same edges, the largest difference of ``T``'s values
and of the density). Reported: the seconds of each step, each update's share of the rebuild's
time, the rows each update touched (changed, rescanned; G3: certified, redone) and the check.

Builds use ``--index`` (default ``exact``: the equality check needs it; with ``ivf`` the check
is skipped). A G3 graph without update state pays one all-pairs pass the first time it is
updated (reported apart as ``state_seconds``). JSON: ``bench-results/update.json`` (``--out``).
Run it at large N only on an idle machine: the exact builds are ``O(N^2 D)``.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Sequence

import torch

from geograph.bench.common import write_json
from geograph.console import format_table, make_parser


def corpus(n: int, dim: int, topics: int, seed: int) -> torch.Tensor:
    """``(n, dim)`` float32 unit rows around ``topics`` random centres (noise 0.7 of a centre's norm)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(topics, dim, generator=g), dim=1)
    out = torch.empty(n, dim)
    for r0 in range(0, n, 65536):
        m = min(65536, n - r0)
        pick = torch.randint(topics, (m,), generator=g)
        out[r0 : r0 + m] = centres[pick] + 0.7 * torch.randn(m, dim, generator=g) / dim**0.5
    return torch.nn.functional.normalize(out, dim=1)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run_one(build: str, n: int, fraction: float, args) -> dict:
    from geograph import CorpusGraph, G3Graph
    from geograph.graphs.g3_updates import g3_state

    m = max(1, round(fraction * n))
    x = corpus(n + m, args.dim, args.topics, args.seed)
    gone = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed + 1))[:m].sort().values
    keep = torch.ones(n + m, dtype=torch.bool)
    keep[gone] = False
    if build == "knn":
        make = lambda rows, r=0: CorpusGraph.from_knn(rows, args.k, index=args.index, reserve=r)  # noqa: E731
    else:
        make = lambda rows, r=0: G3Graph.build(rows, max_degree=args.max_degree, index=args.index)  # noqa: E731
    graph, build_s = _timed(lambda: make(x[:n], args.reserve))
    row: dict = {"build": build, "n": n, "fraction": fraction, "changed": m, "build_seconds": build_s}
    if build == "g3":
        _, row["state_seconds"] = _timed(lambda: g3_state(graph))
    added, row["add_seconds"] = _timed(lambda: graph.add(x[n:], list(range(n, n + m))))
    removed, row["remove_seconds"] = _timed(lambda: graph.remove(gone.tolist()))
    row["add"], row["remove"] = _report(added), _report(removed)
    ref, row["rebuild_seconds"] = _timed(lambda: make(x[keep]))
    row["add_share"] = row["add_seconds"] / row["rebuild_seconds"]
    row["remove_share"] = row["remove_seconds"] / row["rebuild_seconds"]
    if args.index == "exact" and n <= args.check_max:
        if build == "knn":
            row["equal"] = bool(torch.equal(graph.edge_index, ref.edge_index))
        else:
            same = torch.equal(graph.crow, ref.crow) and torch.equal(graph.col, ref.col)
            row["equal"] = bool(same)
            row["max_val_diff"] = float((graph.val - ref.val).abs().max()) if same else None
            row["max_density_diff"] = float((graph.density - ref.density).abs().max())
    else:
        row["equal"] = None
    return row


def _report(r) -> dict:
    return dataclasses.asdict(r)


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("geograph bench update", __doc__)
    p.add_argument("sizes", type=int, nargs="*", default=[200_000, 1_000_000], help="corpus sizes (default 200k 1M)")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.01], help="share added and removed (0.01)")
    p.add_argument("--builds", nargs="+", default=["knn", "g3"], choices=["knn", "g3"])
    p.add_argument("--index", default="exact", choices=["exact", "ivf"])
    p.add_argument("--k", type=int, default=10, help="k-NN neighbours (10)")
    p.add_argument("--reserve", type=int, default=10, help="k-NN list entries kept past k for removals (10)")
    p.add_argument("--max-degree", type=int, default=128, help="G3 edges a row (128)")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--topics", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-max", type=int, default=200_000, help="largest N checked against the rebuild")
    p.add_argument("--out", default="bench-results")
    args = p.parse_args(argv)
    for n in args.sizes:
        if n < 3:
            p.error(f"sizes must be at least 3, got {n}")
    for f in args.fractions:
        if not 0 < f < 1:
            p.error(f"--fractions must lie in (0, 1), got {f}")
    rows = [run_one(b, n, f, args) for n in args.sizes for f in args.fractions for b in args.builds]
    table = {
        f"{r['build']} N={r['n']} f={r['fraction']}": {
            "rebuild s": r["rebuild_seconds"],
            "add s": r["add_seconds"],
            "remove s": r["remove_seconds"],
            "add/rebuild": r["add_share"],
            "remove/rebuild": r["remove_share"],
            "equal": "-" if r["equal"] is None else str(r["equal"]),
        }
        for r in rows
    }
    print(format_table(table, list(next(iter(table.values()))), {"equal": ">12"}))
    payload = {
        "config": {k: v for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "rows": rows,
    }
    print(f"wrote {write_json('update', payload, args.out)}")
    return 0 if all(r["equal"] is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
