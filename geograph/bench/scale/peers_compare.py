"""``geograph bench scale --peers``: geograph's k-NN build against the k-NN builders a user would pick instead.

On the same vectors, each builder in a fresh process (:func:`~geograph.bench.scale.harness.build_in_child`:
peak resident memory of that process; its configurations that differ only in the search share one
build): the seconds of each configuration (build + all-vs-all search), its recall@10 against the
exact top-10 of sampled rows (computed here by numpy, one matrix product of the sampled rows
against the corpus), and each builder's recall-time frontier (its configurations that no other of
its configurations beats on both). Beside them the machine's float32 matrix-product rate
(GFLOP/s, measured in the same run with the threads the builds use) and the rate geograph's join
reaches (the flops of its cell pairs' scores over the join's seconds).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from geograph.bench.scale.harness import KNN_K, build_in_child
from geograph.bench.scale.peers import PEERS

__all__ = ["add_peer_args", "peer_tasks", "compare_peers", "exact_rows_numpy", "numpy_recall", "frontier"]


def add_peer_args(p: argparse.ArgumentParser) -> None:
    """The options of ``--peers`` (configurations of each builder)."""
    p.add_argument(
        "--peers", action="store_true", help="compare geograph's k-NN build with faiss, pynndescent and usearch"
    )
    p.add_argument("--peer-builders", nargs="+", default=list(PEERS), choices=PEERS, help="builders (default: all)")
    p.add_argument(
        "--peer-path", action="append", default=[], help="a folder added to the builders' import path (repeatable)"
    )
    p.add_argument("--geograph-targets", type=float, nargs="+", default=[0.98, 0.99], help="geograph recall targets")
    p.add_argument("--hnsw-m", type=int, default=32, help="faiss HNSW M (default: %(default)s)")
    p.add_argument("--hnsw-ef-construction", type=int, default=40, help="faiss HNSW efConstruction")
    p.add_argument("--hnsw-ef", type=int, nargs="+", default=[32, 64, 128, 256], help="faiss HNSW efSearch values")
    p.add_argument("--ivf-nprobe", type=int, nargs="+", default=[8, 16, 32, 64], help="faiss IVF-Flat nprobe values")
    p.add_argument("--ivf-nlist", type=int, default=None, help="faiss IVF-Flat lists (default: about 4 sqrt(N))")
    p.add_argument("--nndescent-neighbors", type=int, nargs="+", default=[11, 30], help="pynndescent n_neighbors")
    p.add_argument("--usearch-ef", type=int, nargs="+", default=[64, 128], help="usearch expansion_search values")


def peer_tasks(args: argparse.Namespace) -> list[tuple[str, dict, list[dict]]]:
    """``(builder, build settings, search settings)`` of each fresh process, in the order they run."""
    table = {
        "geograph": ({}, [{"recall_target": t} for t in args.geograph_targets]),
        "faiss-hnsw": (
            {"M": args.hnsw_m, "efConstruction": args.hnsw_ef_construction},
            [{"efSearch": e} for e in args.hnsw_ef],
        ),
        "faiss-ivf": ({"nlist": args.ivf_nlist}, [{"nprobe": p} for p in args.ivf_nprobe]),
        "pynndescent": ({}, [{"n_neighbors": m} for m in args.nndescent_neighbors]),
        "usearch": ({}, [{"expansion_search": e} for e in args.usearch_ef]),
    }
    out = []
    for name in args.peer_builders:
        build, searches = table[name]
        if name in ("geograph", "pynndescent"):  # a build per configuration: each its own process
            out += [(name, build, [s]) for s in searches]
        else:
            out.append((name, build, searches))
    return out


def exact_rows_numpy(x: np.ndarray, rows: np.ndarray, k: int, chunk: int = 256) -> np.ndarray:
    """The exact top-``k`` other rows (inner product) of ``rows``, by numpy: ``(R, k)``, best first."""
    out = np.empty((len(rows), k), dtype=np.int64)
    for s in range(0, len(rows), chunk):
        r = rows[s : s + chunk]
        sim = x[r] @ x.T
        sim[np.arange(len(r)), r] = -np.inf
        part = np.argpartition(-sim, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sim, part, 1), axis=1, kind="stable")
        out[s : s + chunk] = np.take_along_axis(part, order, 1)
    return out


def numpy_recall(ids: np.ndarray, rows: np.ndarray, exact: np.ndarray) -> float:
    """Share of the exact lists ``exact`` ``(R, k)`` of ``rows`` found in ``ids[rows]``.

    Example:
        >>> numpy_recall(np.array([[1, 2], [0, 2], [1, 0]]), np.array([0, 2]), np.array([[2, 1], [0, 1]]))
        1.0
    """
    got = ids[rows]
    return float((exact[:, :, None] == got[:, None, :]).any(2).sum()) / exact.size


def frontier(points: list[dict]) -> list[str]:
    """The configurations (``name``) no other beats on both ``seconds`` (lower) and ``recall`` (higher),
    fastest first.

    Example:
        >>> frontier([{"name": "a", "seconds": 1, "recall": 0.9}, {"name": "b", "seconds": 2, "recall": 0.8},
        ...           {"name": "c", "seconds": 3, "recall": 0.99}])
        ['a', 'c']
    """
    best, out = -1.0, []
    for p in sorted(points, key=lambda p: (p["seconds"], -p["recall"])):
        if p["recall"] > best:
            out.append(p["name"])
            best = p["recall"]
    return out


def matmul_rate(d: int, threads: int, repeat: int = 3) -> dict:
    """GFLOP/s of float32 matrix products with ``threads`` threads (best of ``repeat``): a square
    2048^3 product, and the join's shape (4096 rows against 4096, inner dimension ``d``)."""
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)

    def rate(a: torch.Tensor, b: torch.Tensor) -> float:
        a @ b  # warm
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / best / 1e9

    sq = torch.randn(2048, 2048, generator=gen)
    tall = torch.randn(4096, d, generator=gen)
    return {"square_2048": rate(sq, sq), f"4096x{d}x4096": rate(tall, tall.T.contiguous()), "threads": threads}


def _label(name: str, build: dict, search: dict) -> str:
    keys = {**{k: v for k, v in build.items() if v is not None}, **search}
    return f"{name} " + " ".join(f"{k}={v}" for k, v in keys.items())


def compare_peers(x: np.ndarray, args: argparse.Namespace, tmp: Path, label: str) -> dict:
    """Every builder of :func:`peer_tasks` on ``x`` (unit float32 ``(N, D)``), checked on
    ``args.check_rows`` sampled rows against :func:`exact_rows_numpy`."""
    n = len(x)
    path = tmp / f"{label}-peers.npy"
    np.save(path, x)
    threads = torch.get_num_threads()
    rows = np.sort(np.random.default_rng(1).choice(n, size=min(args.check_rows, n), replace=False))
    t0 = time.perf_counter()
    exact = exact_rows_numpy(x, rows, KNN_K)
    res: dict = {
        "N": n,
        "D": int(x.shape[1]),
        "k": KNN_K,
        "check_rows": len(rows),
        "exact_seconds": time.perf_counter() - t0,
        "matmul_gflops": matmul_rate(int(x.shape[1]), threads),
        "builders": {},
        "configs": {},
    }
    for i, (name, build, searches) in enumerate(peer_tasks(args)):
        print(f"[{label}] peer {name} {build} {searches} ...", flush=True)
        task = dict(
            kind="peer",
            builder=name,
            build=build,
            search=searches,
            k=KNN_K,
            path=str(path),
            threads=threads,
            pythonpath=list(args.peer_path),
            progress=False,
            out=str(tmp / f"{label}-peer{i}"),
        )
        try:
            run = build_in_child(task)
        except RuntimeError as exc:  # one builder failing (out of memory) does not end the comparison
            res["builders"][f"{name} #{i}"] = {"error": str(exc)}
            continue
        if "missing" in run:
            res["builders"][name] = {"skipped": run["missing"]}
            continue
        res["builders"][f"{name} #{i}"] = {"seconds": run["seconds"], "peak_rss_mb": run["peak_rss_mb"]}
        for search, cfg in zip(searches, run["configs"]):
            ids = np.load(cfg.pop("lists"))
            if ids.shape != (n, KNN_K) or ids.min() < -1 or ids.max() >= n:
                raise RuntimeError(f"{name}: lists of shape {ids.shape} with ids outside [-1, {n})")
            cfg.update(
                builder=name,
                seconds=cfg["build_seconds"] + cfg["search_seconds"],
                recall=numpy_recall(ids, rows, exact),
                peak_rss_mb=run["peak_rss_mb"],
            )
            if "flops" in cfg and cfg["stages"].get("join"):
                cfg["join_gflops"] = cfg["flops"]["join"] / cfg["stages"]["join"] / 1e9
            res["configs"][_label(name, build, search)] = cfg
    for name in PEERS:
        pts = [dict(c, name=key) for key, c in res["configs"].items() if c["builder"] == name]
        if pts:
            res["builders"].setdefault(f"{name} frontier", {})["frontier"] = frontier(pts)
    return res


def peers_rows(res: dict) -> dict[str, dict]:
    """The printed table of one size: a row per configuration."""
    rate = res["matmul_gflops"]
    shape = next(k for k in rate if k.startswith("4096x"))
    fronts = {c for b in res["builders"].values() for c in b.get("frontier", [])}
    nan = float("nan")
    return {
        key: {
            "seconds": c["seconds"],
            "build s": c["build_seconds"],
            "RSS GB": c["peak_rss_mb"] / 1024,
            "rec@10": c["recall"],
            "frontier": "*" if key in fronts else "",
            "nprobe": str(c.get("report", {}).get("nprobe", "")),
            "join GF/s": c.get("join_gflops", nan),
            "% matmul": 100 * c.get("join_gflops", nan) / rate[shape],
        }
        for key, c in res["configs"].items()
    }


PEER_COLS = ["seconds", "build s", "RSS GB", "rec@10", "frontier", "nprobe", "join GF/s", "% matmul"]
PEER_FORMATS = {"seconds": "12.1f", "build s": "12.1f", "rec@10": "12.5f", "frontier": "s", "nprobe": "s"}


def peers_report(args: argparse.Namespace, model: dict, results: dict) -> int:
    """``--peers``: :func:`compare_peers` at each size and generator, printed and written to
    ``scale-peers.json`` and ``scale-peers.md`` in ``args.out``."""
    import tempfile

    from geograph.bench.common import write_json
    from geograph.bench.scale.generators import generate
    from geograph.console import format_table

    results = dict(results, peers={})
    text = []
    with tempfile.TemporaryDirectory(prefix="geograph-peers-") as tmp:
        for n in args.sizes:
            for g in args.generators:
                if g == "gauss" and n > args.gauss_max:
                    print(f"[gauss-{n}] skipped: above --gauss-max {args.gauss_max}", flush=True)
                    continue
                label = f"{g}-{n}"
                res = compare_peers(generate(model, g, n, seed=11), args, Path(tmp), label)
                results["peers"][label] = res
                rate = res["matmul_gflops"]
                head = (
                    f"{label}: k = {res['k']}, recall on {res['check_rows']} sampled rows; float32 matmul "
                    + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in rate.items() if k != "threads")
                )
                table = format_table(peers_rows(res), PEER_COLS, PEER_FORMATS) if res["configs"] else "(no builds)"
                skipped = [f"{b}: {v['skipped']}" for b, v in res["builders"].items() if "skipped" in v]
                failed = [f"{b}: {v['error']}" for b, v in res["builders"].items() if "error" in v]
                block = "\n".join([head, table, *skipped, *failed])
                print("\n" + block, flush=True)
                text.append(block)
    path = write_json("scale-peers", results, args.out)
    md = Path(args.out) / "scale-peers.md"
    md.write_text("# geograph bench scale --peers\n\n```\n" + "\n\n".join(text) + "\n```\n")
    print(f"\nwrote {path} and {md}")
    return 0
