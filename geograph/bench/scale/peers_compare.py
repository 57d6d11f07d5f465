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
from typing import Any

import numpy as np
import torch

from geograph.bench.scale.harness import KNN_K, build_in_child
from geograph.bench.scale.peers import PEERS, matmul_gflops

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
    p.add_argument(
        "--geograph-targets",
        type=float,
        nargs="+",
        default=[0.95, 0.99],
        help="geograph recall targets (a verdict each)",
    )
    p.add_argument(
        "--geograph-threads",
        type=int,
        nargs="+",
        default=None,
        help="also build geograph at these thread counts (its rate report: join vs matmul, e.g. 1 2); "
        "the verdicts use the run's own threads",
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="fresh processes per builder; seconds are their median (default 3)"
    )
    p.add_argument("--peers-file", default="scale-peers", help="name of the JSON and markdown files written to --out")
    p.add_argument("--hnsw-m", type=int, default=32, help="faiss HNSW M (default: %(default)s)")
    p.add_argument("--hnsw-ef-construction", type=int, default=40, help="faiss HNSW efConstruction")
    p.add_argument("--hnsw-ef", type=int, nargs="+", default=[32, 64, 128, 256], help="faiss HNSW efSearch values")
    p.add_argument("--ivf-nprobe", type=int, nargs="+", default=[8, 16, 32, 64], help="faiss IVF-Flat nprobe values")
    p.add_argument("--ivf-nlist", type=int, default=None, help="faiss IVF-Flat lists (default: about 4 sqrt(N))")
    p.add_argument("--nndescent-neighbors", type=int, nargs="+", default=[11, 30], help="pynndescent n_neighbors")
    p.add_argument("--usearch-ef", type=int, nargs="+", default=[64, 128], help="usearch expansion_search values")


def peer_tasks(args: argparse.Namespace) -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """``(builder, build settings, search settings)`` of each fresh process, in the order they run
    (geograph: a build per recall target, and per ``--geograph-threads`` count with ``threads`` set)."""
    geo_threads = [None] + [t for t in (args.geograph_threads or []) if t != torch.get_num_threads()]
    table: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        "geograph": (
            [{} if t is None else {"threads": t} for t in geo_threads],
            [{"recall_target": t} for t in args.geograph_targets],
        ),
        "faiss-hnsw": (
            [{"M": args.hnsw_m, "efConstruction": args.hnsw_ef_construction}],
            [{"efSearch": e} for e in args.hnsw_ef],
        ),
        "faiss-ivf": ([{"nlist": args.ivf_nlist}], [{"nprobe": p} for p in args.ivf_nprobe]),
        "pynndescent": ([{}], [{"n_neighbors": m} for m in args.nndescent_neighbors]),
        "usearch": ([{}], [{"expansion_search": e} for e in args.usearch_ef]),
    }
    out = []
    for name in args.peer_builders:
        builds, searches = table[name]
        for build in builds:
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


def frontier(points: list[dict[str, Any]]) -> list[str]:
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


def matmul_rate(d: int, threads: int, repeat: int = 3) -> dict[str, Any]:
    """GFLOP/s of float32 matrix products with ``threads`` threads (best of ``repeat``): a square
    2048^3 product, and a 4096 x ``d`` x 4096 tile (:func:`~geograph.bench.scale.peers.matmul_gflops`)."""
    return {
        "square_2048": matmul_gflops(2048, 2048, 2048, threads, repeat),
        f"4096x{d}x4096": matmul_gflops(4096, 4096, d, threads, repeat),
        "threads": threads,
    }


def _label(name: str, build: dict[str, Any], search: dict[str, Any]) -> str:
    keys = {**{k: v for k, v in build.items() if v is not None}, **search}
    return f"{name} " + " ".join(f"{k}={v}" for k, v in keys.items())


#: the stages of a geograph build, in the order they run, as the rate report names them
STAGES = {
    "train": "k-means",
    "assign": "assign",
    "recall": "recall",
    "join": "join",
    "own_probes": "own probes",
    "merge": "merge",
    "refine": "refine",
    "exact": "exact",
}


def rate_report(cfg: dict[str, Any]) -> dict[str, float]:
    """Where a geograph build's time went and how fast its join ran against the machine.

    ``cfg`` holds the build's ``build_seconds``, its ``stages`` (seconds), its ``flops`` (``join``:
    ``2 D`` per pair its cell pairs score; ``own_probes``: the same for the rows' own probes) and
    ``matmul_gflops``, the float32 rate of a product of the join's mean tile shape measured in the
    same process with the same threads. Returns the seconds of each stage (``other``: the rest of
    the build), the join's rate (useful flops over its seconds), the own probes' rate, and the join's
    share of the matmul rate (``join % matmul``).

    Example:
        >>> r = rate_report({"build_seconds": 10.0, "stages": {"train": 2.0, "join": 4.0},
        ...                  "flops": {"join": 2e11}, "matmul_gflops": 100.0})
        >>> r["join GF/s"], r["join % matmul"], r["other"]
        (50.0, 50.0, 4.0)
    """
    stages = cfg.get("stages", {})
    flops = cfg.get("flops", {})
    nan = float("nan")
    out = {label: float(stages.get(key, 0.0)) for key, label in STAGES.items()}
    out["other"] = float(cfg["build_seconds"]) - sum(float(v) for v in stages.values())

    def rate(key: str) -> float:
        return flops[key] / stages[key] / 1e9 if flops.get(key) and stages.get(key) else nan

    out["join GF/s"] = rate("join")
    out["own GF/s"] = rate("own_probes")
    out["matmul GF/s"] = float(cfg.get("matmul_gflops", nan))
    out["join % matmul"] = 100.0 * out["join GF/s"] / out["matmul GF/s"]
    return out


def _median(xs: list[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=np.float64)))


def compare_peers(x: np.ndarray, args: argparse.Namespace, tmp: Path, label: str) -> dict[str, Any]:
    """Every builder of :func:`peer_tasks` on ``x`` (unit float32 ``(N, D)``), each ``args.repeats``
    times in fresh processes, checked on ``args.check_rows`` sampled rows against
    :func:`exact_rows_numpy`. A configuration's ``seconds`` is the median over the repeats
    (``seconds_all``: each), its ``recall`` the median recall."""
    n = len(x)
    path = tmp / f"{label}-peers.npy"
    np.save(path, x)
    threads = torch.get_num_threads()
    repeats = max(1, int(getattr(args, "repeats", 1)))
    rows = np.sort(np.random.default_rng(1).choice(n, size=min(args.check_rows, n), replace=False))
    t0 = time.perf_counter()
    exact = exact_rows_numpy(x, rows, KNN_K)
    res: dict[str, Any] = {
        "N": n,
        "D": int(x.shape[1]),
        "k": KNN_K,
        "check_rows": len(rows),
        "threads": threads,
        "repeats": repeats,
        "exact_seconds": time.perf_counter() - t0,
        "matmul_gflops": matmul_rate(int(x.shape[1]), threads),
        "builders": {},
        "configs": {},
    }
    for i, (name, build, searches) in enumerate(peer_tasks(args)):
        print(f"[{label}] peer {name} {build} {searches} x{repeats} ...", flush=True)
        runs = []
        task = dict(
            kind="peer",
            builder=name,
            build={k: v for k, v in build.items() if k != "threads"},
            search=searches,
            k=KNN_K,
            path=str(path),
            threads=build.get("threads", threads),
            pythonpath=list(args.peer_path),
            progress=False,
        )
        try:
            for rep in range(repeats):
                runs.append(build_in_child(dict(task, out=str(tmp / f"{label}-peer{i}-r{rep}"))))
                if "missing" in runs[-1]:
                    break
        except RuntimeError as exc:  # one builder failing (out of memory) does not end the comparison
            res["builders"][f"{name} #{i}"] = {"error": str(exc)}
            continue
        if "missing" in runs[0]:
            res["builders"][name] = {"skipped": runs[0]["missing"]}
            continue
        res["builders"][f"{name} #{i}"] = {
            "seconds": [r["seconds"] for r in runs],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        }
        for j, search in enumerate(searches):
            per_run = [r["configs"][j] for r in runs]
            recalls = []
            for c in per_run:
                ids = np.load(c.pop("lists"))
                if ids.shape != (n, KNN_K) or ids.min() < -1 or ids.max() >= n:
                    raise RuntimeError(f"{name}: lists of shape {ids.shape} with ids outside [-1, {n})")
                recalls.append(numpy_recall(ids, rows, exact))
            totals = [c["build_seconds"] + c["search_seconds"] for c in per_run]
            mid = int(np.argsort(totals)[len(totals) // 2])  # the median run's own details
            cfg = dict(per_run[mid])
            cfg.update(
                builder=name,
                threads=task["threads"],
                seconds=_median(totals),
                seconds_all=totals,
                recall=_median(recalls),
                recall_all=recalls,
                peak_rss_mb=max(r["peak_rss_mb"] for r in runs),
            )
            if name == "geograph":
                cfg["rates"] = rate_report(cfg)
                cfg["join_gflops"] = cfg["rates"]["join GF/s"]
            res["configs"][_label(name, build, search)] = cfg
    for name in PEERS:
        pts = [
            dict(c, name=key) for key, c in res["configs"].items() if c["builder"] == name and c["threads"] == threads
        ]
        if pts:
            res["builders"].setdefault(f"{name} frontier", {})["frontier"] = frontier(pts)
    res["verdicts"] = verdicts(res, args.geograph_targets)
    return res


def verdicts(res: dict[str, Any], targets: list[float]) -> list[dict[str, Any]]:
    """For each recall target: geograph's build asked for it (at the run's threads) against every peer
    configuration whose recall reaches it; ``ahead`` when geograph reached the target and is faster
    than each of them (``None`` when geograph did not run).

    Example:
        >>> res = {"threads": 2, "configs": {
        ...     "geograph recall_target=0.99": {"builder": "geograph", "threads": 2, "seconds": 5.0, "recall": 0.991},
        ...     "faiss-ivf nprobe=16": {"builder": "faiss-ivf", "threads": 2, "seconds": 6.0, "recall": 0.998},
        ...     "faiss-ivf nprobe=8": {"builder": "faiss-ivf", "threads": 2, "seconds": 3.0, "recall": 0.97}}}
        >>> v = verdicts(res, [0.99])[0]
        >>> v["ahead"], v["fastest_peer"], v["peers_reaching"]
        (True, 'faiss-ivf nprobe=16', 1)
    """
    out = []
    configs = {k: c for k, c in res["configs"].items() if c.get("threads", res["threads"]) == res["threads"]}
    for t in targets:
        asked = [k for k, c in configs.items() if c["builder"] == "geograph" and k.endswith(f"recall_target={t}")]
        geo = asked[0] if asked else None
        reach = {k: c for k, c in configs.items() if c["builder"] != "geograph" and c["recall"] >= t}
        fastest = min(reach, key=lambda k: reach[k]["seconds"]) if reach else None
        v: dict[str, Any] = {"target": t, "geograph": geo, "fastest_peer": fastest, "peers_reaching": len(reach)}
        if geo is not None:
            g = configs[geo]
            v.update(seconds=g["seconds"], recall=g["recall"], reached=g["recall"] >= t)
            v["ahead"] = bool(v["reached"] and all(g["seconds"] < c["seconds"] for c in reach.values()))
            if fastest is not None:
                v.update(peer_seconds=reach[fastest]["seconds"], peer_recall=reach[fastest]["recall"])
        else:
            v["ahead"] = None
        out.append(v)
    return out


def verdict_line(v: dict[str, Any]) -> str:
    """One line per recall target: geograph against the fastest peer configuration reaching it.

    Example:
        >>> verdict_line({"target": 0.99, "geograph": "geograph recall_target=0.99", "seconds": 5.0, "recall": 0.991,
        ...               "reached": True, "ahead": True, "fastest_peer": "faiss-ivf nprobe=16", "peer_seconds": 6.0,
        ...               "peer_recall": 0.998, "peers_reaching": 3})
        'target 0.99: geograph AHEAD: 5.0 s at recall 0.9910; fastest of 3 peer configurations reaching it: ...'
    """
    t = v["target"]
    if v.get("geograph") is None:
        return f"target {t}: geograph did not run"
    word = "AHEAD" if v["ahead"] else ("BEHIND" if v["reached"] else "MISSED THE TARGET")
    line = f"target {t}: geograph {word}: {v['seconds']:.1f} s at recall {v['recall']:.4f}"
    if v.get("fastest_peer") is None:
        return line + "; no peer configuration reaches it"
    return (
        line + f"; fastest of {v['peers_reaching']} peer configurations reaching it: {v['fastest_peer']} "
        f"{v['peer_seconds']:.1f} s at {v['peer_recall']:.4f} ({v['peer_seconds'] / v['seconds']:.2f}x)"
    )


def peers_rows(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The printed table of one size: a row per configuration."""
    rate = res["matmul_gflops"]
    shape = next(k for k in rate if k.startswith("4096x"))
    fronts = {c for b in res["builders"].values() for c in b.get("frontier", [])}
    nan = float("nan")
    rows = {}
    for key, c in res["configs"].items():
        spread = c.get("seconds_all", [c["seconds"]])
        rows[key] = {
            "seconds": c["seconds"],
            "spread s": max(spread) - min(spread),
            "build s": c["build_seconds"],
            "RSS GB": c["peak_rss_mb"] / 1024,
            "rec@10": c["recall"],
            "frontier": "*" if key in fronts else "",
            "nprobe": str(c.get("report", {}).get("nprobe", "")),
            "join GF/s": c.get("join_gflops", nan),
            "% matmul": c.get("rates", {}).get("join % matmul", 100 * c.get("join_gflops", nan) / rate[shape]),
        }
    return rows


PEER_COLS = ["seconds", "spread s", "build s", "RSS GB", "rec@10", "frontier", "nprobe", "join GF/s", "% matmul"]
PEER_FORMATS = {"seconds": "12.1f", "build s": "12.1f", "rec@10": "12.5f", "frontier": "s", "nprobe": "s"}
RATE_COLS = [*STAGES.values(), "other", "join GF/s", "own GF/s", "matmul GF/s", "join % matmul"]


def rate_rows(res: dict[str, Any]) -> dict[str, dict[str, float]]:
    """geograph's rate report of one size: a row per geograph configuration (with its threads)."""
    return {
        f"{key} ({c['threads']} thr)": c["rates"]
        for key, c in res["configs"].items()
        if c["builder"] == "geograph" and "rates" in c
    }


def peers_report(args: argparse.Namespace, model: dict[str, Any], results: dict[str, Any]) -> int:
    """``--peers``: :func:`compare_peers` at each size and generator, printed and written to
    ``<--peers-file>.json`` and ``.md`` in ``args.out`` (with the commit and the date), a verdict line per
    recall target."""
    import tempfile

    from geograph.bench.common import provenance, write_json
    from geograph.bench.scale.generators import generate
    from geograph.console import format_table

    results = dict(results, peers={}, **provenance())
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
                    f"{label}: k = {res['k']}, {res['threads']} threads, recall on {res['check_rows']} sampled rows, "
                    f"seconds the median of {res['repeats']} runs; float32 matmul "
                    + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in rate.items() if k != "threads")
                )
                table = format_table(peers_rows(res), PEER_COLS, PEER_FORMATS) if res["configs"] else "(no builds)"
                rates = rate_rows(res)
                where = (
                    "geograph: where the time went (seconds) and the join's rate against a float32 matmul of its "
                    "mean tile (same process, same threads)\n" + format_table(rates, RATE_COLS)
                    if rates
                    else ""
                )
                skipped = [f"{b}: {v['skipped']}" for b, v in res["builders"].items() if "skipped" in v]
                failed = [f"{b}: {v['error']}" for b, v in res["builders"].items() if "error" in v]
                lines = [verdict_line(v) for v in res["verdicts"]]
                block = "\n".join([head, table, *([where] if where else []), *skipped, *failed, *lines])
                print("\n" + block, flush=True)
                text.append(block)
    name = getattr(args, "peers_file", "scale-peers")
    path = write_json(name, results, args.out)
    md = Path(args.out) / f"{name}.md"
    md.write_text(
        f"# geograph bench scale --peers\n\ncommit {results['commit']}, {results['date']}, "
        f"{results.get('threads', '?')} threads\n\n```\n" + "\n\n".join(text) + "\n```\n"
    )
    print(f"\nwrote {path} and {md}")
    return 0
