"""``geograph bench update``: adding and removing a fraction of a corpus in place against a rebuild.

For each size N (positional arguments) and each fraction f (``--fractions``), on a synthetic
corpus of unit vectors of ``--dim`` dimensions drawn around ``--topics`` random topic centres
(seeded): a graph is built on N passages, then ``round(f N)`` new passages are added (``add``)
and as many random passages removed (``remove``), each timed; the graph of the final corpus
is then built from scratch with the same ``--index`` (timed) and compared with the updated one
in the same run.

Reported per row: the seconds of the build, of each update and of the rebuild (``rebuild s`` is
the plain build: the seconds a build spends keeping its IVF cells and lists for later updates,
``update_state_seconds``, are reported apart and not counted), each update's share of the
rebuild, what each update did (k-NN: rows changed, rescanned; G3: rows certified, recomputed
from their cells, redone against every passage, and the one bound ``R``), and:

- ``--index exact`` (up to ``--check-max`` passages): whether the updated graph equals the
  rebuild (k-NN: the same ``edge_index``; G3: the same edges, the largest difference of ``T``'s
  values and of the density). A G3 row whose edges differ is tested for a tie: the weights of the
  edges in only one graph, recomputed in float64 under the rebuild's density, must lie within
  the stated rounding (``tie_tolerance``: ``beta`` times the largest density difference plus
  ``1e-5``, relative) of the row's cut weight; ``rows_differ`` and ``ties`` count them, and the
  check passes when every differing row is such a tie.
- ``--index ivf``: the sampled recall of the updated graph and of the rebuild against exact rows
  of the final corpus (the rows the build's own report samples, ``--recall-rows`` of them; k-NN:
  each row's ``k`` neighbours; G3: each row's edges against its exact top-``max_degree`` weights
  under the graph's own density), which must agree within ``--recall-slack`` (0.005).

A G3 graph without update state (the exact build) makes it by two all-pairs passes before its
first update (``state_seconds``, apart). JSON under ``--out`` (``update.json``, or named after
``--markdown``'s file, with the commit and date) and a markdown table (``--markdown``). Run it
at large N only on an idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from geograph.bench.common import provenance, write_json
from geograph.console import format_table, make_parser

T = TypeVar("T")


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


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _state_seconds(graph: Any) -> float:
    info = getattr(graph, "build_info", {}) or {}
    return float(info.get("update_state_seconds", 0.0)) + float((info.get("seconds") or {}).get("update_cells", 0.0))


def check_rows(n: int, recall_rows: int, seed: int) -> torch.Tensor:
    """The rows a build's recall report measures on (:func:`~geograph.knn.ivf_join.ivf_self_topk`:
    the second half of ``2 recall_rows`` rows drawn with ``seed + 1``), sorted."""
    picks = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))[: 2 * recall_rows]
    return picks[len(picks) // 2 :].sort().values


def graph_recall(graph: Any, build: str, rows: torch.Tensor, args: argparse.Namespace) -> float:
    """The sampled recall of ``graph`` against the exact rows of its corpus: k-NN, each row's ``k``
    neighbours; G3, each row's edges against its exact top-``max_degree`` weights under the
    graph's own density."""
    from geograph.geometry.gain import _unit, gain_rank
    from geograph.knn.allpairs import tiled_pairs
    from geograph.knn.exact import exact_rows, pair_score
    from geograph.knn.ivf_recall import sample_recall

    z = _unit(graph.embeddings)
    n = z.shape[0]
    if build == "knn":
        k = min(args.k, n - 1)
        found = graph.knn_state.lists.indices[:, :k]
        exact = exact_rows(z, rows, k)
    else:
        k = min(args.max_degree, n - 1)
        counts = graph.degree()
        r = torch.repeat_interleave(torch.arange(n), counts)
        found = torch.full((n, k), -1, dtype=torch.long)
        found[r, torch.arange(r.numel()) - graph.crow[r]] = graph.col
        penalty = torch.exp(-graph.beta * graph.density.to(z))
        v, exact, _ = tiled_pairs(z[rows], z, k, exclude=rows, score=pair_score(gain_rank(graph.band), penalty))
        exact = exact.masked_fill(~(v > 0), -1)  # pairs of weight 0 are never edges
    return sample_recall(found, rows, exact)


def tie_check(graph: Any, ref: Any) -> dict[str, Any]:
    """The G3 rows whose edges differ between ``graph`` and ``ref`` and whether each is a tie: every
    edge in only one of them weighs (float64, under ``ref``'s density) within ``tie_tolerance``
    (relative) of the row's smallest kept weight in ``ref``."""
    from geograph.geometry.gain import _unit

    z = _unit(ref.embeddings).double()
    tol = graph.beta * float((graph.density - ref.density).abs().max()) + 1e-5
    rho = ref.density.double()
    lo, hi = ref.band if ref.band is not None else (0.0, 1.0)
    differ = ties = 0
    worst = 0.0
    for i in range(ref.num_nodes):
        a = set(graph.col[graph.crow[i] : graph.crow[i + 1]].tolist())
        b = set(ref.col[ref.crow[i] : ref.crow[i + 1]].tolist())
        if a == b:
            continue
        differ += 1
        cols = torch.tensor(sorted(a | b))
        s = z[cols] @ z[i]
        w = torch.where((s >= lo) & (s <= hi), s * torch.sqrt((1 - s * s).clamp_min(0)), torch.zeros_like(s))
        w = w * torch.exp(-ref.beta * rho[cols])
        weight = dict(zip(cols.tolist(), w.tolist()))
        cut = min(weight[c] for c in b)
        gap = max(abs(weight[c] - cut) / max(cut, 1e-30) for c in a ^ b)
        worst = max(worst, gap)
        ties += gap <= tol
    return {"rows_differ": differ, "ties": ties, "tie_tolerance": tol, "largest_gap": worst}


def run_one(build: str, n: int, fraction: float, args: argparse.Namespace) -> dict[str, Any]:
    """One build, its addition and removal of ``fraction`` of ``n`` passages, the rebuild and the check."""
    from geograph.graphs import CorpusGraph, G3Graph
    from geograph.graphs.g3_updates import g3_state

    m = max(1, round(fraction * n))
    x = corpus(n + m, args.dim, args.topics, args.seed)
    gone = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed + 1))[:m].sort().values
    keep = torch.ones(n + m, dtype=torch.bool)
    keep[gone] = False
    make: Callable[..., Any]
    if build == "knn":

        def make(rows: torch.Tensor, reserve: int = 0) -> Any:
            return CorpusGraph.from_knn(rows, args.k, index=args.index, reserve=reserve)
    else:

        def make(rows: torch.Tensor, reserve: int = 0) -> Any:
            return G3Graph.build(rows, max_degree=args.max_degree, index=args.index)

    graph, build_s = _timed(lambda: make(x[:n], args.reserve))
    row: dict[str, Any] = {"build": build, "n": n, "fraction": fraction, "changed": m}
    row["build_seconds"] = build_s - _state_seconds(graph)
    row["update_state_seconds"] = _state_seconds(graph)
    if build == "g3":
        _, row["state_seconds"] = _timed(lambda: g3_state(graph))
    added, row["add_seconds"] = _timed(lambda: graph.add(x[n:], list(range(n, n + m))))
    removed, row["remove_seconds"] = _timed(lambda: graph.remove(gone.tolist()))
    row["add"], row["remove"] = dataclasses.asdict(added), dataclasses.asdict(removed)
    ref, rebuild_s = _timed(lambda: make(x[keep], args.reserve))
    row["rebuild_seconds"] = rebuild_s - _state_seconds(ref)
    row["add_share"] = row["add_seconds"] / row["rebuild_seconds"]
    row["remove_share"] = row["remove_seconds"] / row["rebuild_seconds"]
    row["equal"] = None
    if args.index == "exact" and n <= args.check_max:
        if build == "knn":
            row["equal"] = bool(torch.equal(graph.edge_index, ref.edge_index))
        else:
            same = torch.equal(graph.crow, ref.crow) and torch.equal(graph.col, ref.col)
            row["max_val_diff"] = float((graph.val - ref.val).abs().max()) if same else None
            row["max_density_diff"] = float((graph.density - ref.density).abs().max())
            row.update(tie_check(graph, ref))
            row["equal"] = bool(same) or row["rows_differ"] == row["ties"]
    elif args.index == "ivf":
        rows = check_rows(int(keep.sum()), args.recall_rows, 0)
        row["recall"] = graph_recall(graph, build, rows, args)
        row["rebuild_recall"] = graph_recall(ref, build, rows, args)
        row["recall_ok"] = row["recall"] >= row["rebuild_recall"] - args.recall_slack
    return row


def _done(report: dict[str, Any], build: str) -> str:
    if build == "knn":
        return f"{report['rows_changed']} changed / {report['rows_rescanned']} scanned"
    return f"{report['certified']} certified / {report['from_cells']} cells / {report['redone']} redone"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The rows as a markdown table with the run's commit, date and machine."""
    head = (
        f"`geograph bench update` at commit {meta['commit']}, {meta['date']}, {meta['machine']['platform']}, "
        f"torch {meta['machine']['torch']}, {meta['machine']['threads']} threads, index {meta['config']['index']}.\n\n"
        "| graph | N | change | rebuild s | add s (share) | remove s (share) | add: rows | remove: rows | check |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    out = []
    for r in rows:
        if r.get("recall") is not None:
            check = f"recall {r['recall']:.4f} vs {r['rebuild_recall']:.4f}"
        elif r["equal"] is None:
            check = "-"
        elif r["build"] == "g3":
            check = f"equal {r['equal']} ({r['rows_differ']} rows differ, {r['ties']} ties)"
        else:
            check = f"equal {r['equal']}"
        out.append(
            f"| {r['build']} | {r['n']:,} | {r['fraction']:.1%} | {r['rebuild_seconds']:.1f} | "
            f"{r['add_seconds']:.2f} ({r['add_share']:.1%}) | {r['remove_seconds']:.2f} ({r['remove_share']:.1%}) | "
            f"{_done(r['add'], r['build'])} | {_done(r['remove'], r['build'])} | {check} |"
        )
    return head + "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench with ``argv``; 0 when every check passed (equal, or recall within the slack)."""
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
    p.add_argument("--recall-rows", type=int, default=1000, help="rows sampled for the recall (IVF, 1000)")
    p.add_argument("--recall-slack", type=float, default=0.005, help="recall the update may lose (0.005)")
    p.add_argument("--out", default="bench-results")
    p.add_argument("--markdown", metavar="FILE", help="also write the table as markdown to FILE")
    args = p.parse_args(argv)
    for n in args.sizes:
        if n < 3:
            p.error(f"sizes must be at least 3, got {n}")
    for f in args.fractions:
        if not 0 < f < 1:
            p.error(f"--fractions must lie in (0, 1), got {f}")
    rows = []
    for n in args.sizes:
        for f in args.fractions:
            for b in args.builds:
                rows.append(run_one(b, n, f, args))
                print(rows[-1], flush=True)
    table = {
        f"{r['build']} N={r['n']} f={r['fraction']}": {
            "rebuild s": r["rebuild_seconds"],
            "add s": r["add_seconds"],
            "remove s": r["remove_seconds"],
            "add/rebuild": r["add_share"],
            "remove/rebuild": r["remove_share"],
        }
        for r in rows
    }
    print(format_table(table, list(next(iter(table.values())))))
    meta: dict[str, Any] = {
        **provenance(),
        "config": dict(vars(args)),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
    }
    name = Path(args.markdown).stem if args.markdown else "update"  # the JSON beside its table's name
    print(f"wrote {write_json(name, {**meta, 'rows': rows}, args.out)}")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown(rows, meta))
        print(f"wrote {args.markdown}")
    ok = all(r["equal"] is not False and r.get("recall_ok", True) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
