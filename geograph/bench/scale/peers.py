"""The k-NN builders of ``geograph bench scale --peers``, each run inside a fresh process.

A builder gets the corpus ``x`` ``(N, D)`` (unit float32 rows), ``k``, its build settings and a
list of search settings; it builds once and, for each search setting, lists every row's ``k``
nearest other rows (inner product) and saves them as an ``(N, k)`` int64 array (``-1`` where a
row got fewer). Each configuration is timed as the build plus its own all-vs-all search. The
builders: geograph's IVF self-join (:func:`~geograph.knn.build.self_topk`, the call
:meth:`geograph.CorpusGraph.from_knn` makes; a build per recall target), faiss HNSW (``IndexHNSWFlat``,
``efSearch`` per search), faiss IVF-Flat (``nprobe`` per search), pynndescent (``NNDescent`` with
``metric="dot"``, a build per ``n_neighbors``) and usearch HNSW (``expansion_search`` per search).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from usearch.index import BatchMatches

#: a builder's way to save one configuration's ``(N, k)`` lists
Save = Callable[[np.ndarray], None]

#: the builders, in the order the comparison runs them
PEERS = ("geograph", "faiss-hnsw", "faiss-ivf", "pynndescent", "usearch")

#: the package each builder imports (a builder whose package is missing is reported as skipped)
PEER_PACKAGES = {
    "geograph": "faiss",
    "faiss-hnsw": "faiss",
    "faiss-ivf": "faiss",
    "pynndescent": "pynndescent",
    "usearch": "usearch",
}


def drop_self(ids: np.ndarray, k: int) -> np.ndarray:
    """Each row's first ``k`` ids other than the row itself, from a search of the corpus against itself
    that returned ``k + 1`` (the last is dropped where the row is not among them).

    Example:
        >>> drop_self(np.array([[0, 2, 1], [0, 2, 3]]), 2)
        array([[2, 1],
               [0, 2]])
    """
    ids = np.asarray(ids, dtype=np.int64)
    rows = np.arange(len(ids))[:, None]
    own = ids == rows
    own[~own.any(1), -1] = True
    keep = np.argsort(own, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(ids, keep, 1)


def matmul_gflops(m: int, n: int, d: int, threads: int, repeat: int = 5) -> float:
    """GFLOP/s of a float32 product ``(m, d) @ (d, n)`` with ``threads`` torch threads (best of
    ``repeat`` after one warm-up): the machine's rate for a tile of that shape."""
    import torch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(max(1, m), d, generator=gen), torch.randn(d, max(1, n), generator=gen)
    a @ b  # warm
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * a.shape[0] * d * b.shape[1] / best / 1e9


def join_tile(n: int, d: int, nlist: int, join_flops: float) -> tuple[int, int]:
    """The mean tile of the IVF join: ``(rows, columns)``, a cell's rows (``N / nlist``) against the rows
    of the cells it meets (the join's pairs over ``N``; a pair costs ``2 D`` flops).

    Example:
        >>> join_tile(1000, 8, 10, 2.0 * 8 * 1000 * 300)
        (100, 300)
    """
    return max(1, round(n / nlist)), max(1, round(join_flops / (2.0 * d) / n))


def _geograph(
    x: np.ndarray, k: int, build: dict[str, Any], searches: list[dict[str, Any]], threads: int, save: Save
) -> list[dict[str, Any]]:
    import torch

    from geograph.knn.allpairs import DEFAULT_BLOCK
    from geograph.knn.build import self_topk
    from geograph.knn.policy import IVFOptions, default_join_nlist
    from geograph.ops.similarity import unit_rows

    torch.set_num_threads(threads)
    z = unit_rows(torch.from_numpy(x))
    out = []
    for search in searches:
        t0 = time.perf_counter()
        opts = IVFOptions(nprobe=search.get("nprobe"), recall_target=search.get("recall_target"))
        lists = self_topk(z, k, index="ivf", ivf=opts, block=DEFAULT_BLOCK)
        seconds = time.perf_counter() - t0
        save(lists.indices.numpy())
        cfg = dict(
            build_seconds=seconds,
            search_seconds=0.0,
            stages=lists.seconds,
            flops=lists.flops,
            report=lists.ivf.as_dict() if lists.ivf is not None else {},
        )
        if lists.flops.get("join"):  # the matmul rate of the join's tile, same process and threads
            rows, cols = join_tile(len(x), x.shape[1], default_join_nlist(len(x)), lists.flops["join"])
            cfg.update(tile=[rows, cols, int(x.shape[1])], matmul_gflops=matmul_gflops(rows, cols, x.shape[1], threads))
        out.append(cfg)
        del lists
    return out


def _faiss_search(index: Any, x: np.ndarray, k: int, set_param: Callable[[], None], save: Save) -> float:
    set_param()
    t0 = time.perf_counter()
    _, ids = index.search(x, k + 1)
    seconds = time.perf_counter() - t0
    save(drop_self(ids, k))
    return seconds


def _faiss_hnsw(
    x: np.ndarray, k: int, build: dict[str, Any], searches: list[dict[str, Any]], threads: int, save: Save
) -> list[dict[str, Any]]:
    import faiss

    faiss.omp_set_num_threads(threads)
    t0 = time.perf_counter()
    index = faiss.IndexHNSWFlat(x.shape[1], build["M"], faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = build["efConstruction"]
    index.add(x)
    built = time.perf_counter() - t0
    out = []
    for s in searches:
        sec = _faiss_search(index, x, k, functools.partial(setattr, index.hnsw, "efSearch", s["efSearch"]), save)
        out.append(dict(build_seconds=built, search_seconds=sec))
    return out


def _faiss_ivf(
    x: np.ndarray, k: int, build: dict[str, Any], searches: list[dict[str, Any]], threads: int, save: Save
) -> list[dict[str, Any]]:
    import faiss

    faiss.omp_set_num_threads(threads)
    t0 = time.perf_counter()
    nlist = build.get("nlist") or default_peer_nlist(len(x))
    quantizer = faiss.IndexFlatIP(x.shape[1])
    index = faiss.IndexIVFFlat(quantizer, x.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    built = time.perf_counter() - t0
    out = []
    for s in searches:
        sec = _faiss_search(index, x, k, functools.partial(setattr, index, "nprobe", s["nprobe"]), save)
        out.append(dict(build_seconds=built, search_seconds=sec, nlist=nlist))
    return out


def _pynndescent(
    x: np.ndarray, k: int, build: dict[str, Any], searches: list[dict[str, Any]], threads: int, save: Save
) -> list[dict[str, Any]]:
    import pynndescent  # type: ignore[import-untyped]  # no stubs

    out = []
    for s in searches:
        t0 = time.perf_counter()
        nnd = pynndescent.NNDescent(x, metric="dot", n_neighbors=s["n_neighbors"], n_jobs=threads, random_state=0)
        ids, _ = nnd.neighbor_graph
        seconds = time.perf_counter() - t0
        save(drop_self(ids[:, : k + 1], k))
        out.append(dict(build_seconds=seconds, search_seconds=0.0))
        del nnd, ids
    return out


def _usearch(
    x: np.ndarray, k: int, build: dict[str, Any], searches: list[dict[str, Any]], threads: int, save: Save
) -> list[dict[str, Any]]:
    from usearch.index import Index

    t0 = time.perf_counter()
    index = Index(ndim=x.shape[1], metric="ip", dtype="f32")
    index.add(np.arange(len(x), dtype=np.uint64), x, threads=threads)
    built = time.perf_counter() - t0
    out = []
    for s in searches:
        setattr(index, "expansion_search", s["expansion_search"])  # noqa: B010  (a read-only property to the stubs)
        t0 = time.perf_counter()
        found = cast("BatchMatches", index.search(x, k + 1, threads=threads))  # a batch of queries: BatchMatches
        sec = time.perf_counter() - t0
        keys = np.where(np.arange(k + 1)[None, :] < found.counts[:, None], found.keys.astype(np.int64), -1)
        save(drop_self(keys, k))
        out.append(dict(build_seconds=built, search_seconds=sec))
    return out


BUILDERS = {
    "geograph": _geograph,
    "faiss-hnsw": _faiss_hnsw,
    "faiss-ivf": _faiss_ivf,
    "pynndescent": _pynndescent,
    "usearch": _usearch,
}


def default_peer_nlist(n: int) -> int:
    """faiss IVF-Flat's lists: about ``4 sqrt(N)`` (a power of two), at most ``N / 39``.

    Example:
        >>> default_peer_nlist(200_000), default_peer_nlist(1_000)
        (2048, 16)
    """
    nlist = 1 << int(round(math.log2(max(1.0, 4.0 * math.sqrt(n)))))
    while nlist > 1 and nlist * 39 > n:
        nlist //= 2
    return nlist


def run_peer(task: dict[str, Any], x: np.ndarray, out: dict[str, Any]) -> None:
    """Run ``task["builder"]`` on ``x`` (in the fresh process): its configurations in ``out["configs"]``,
    each one's lists saved to ``task["out"] + ".<i>.npy"``; ``out["missing"]`` if its package is not importable."""
    import importlib

    from geograph.transport._numba.runtime import torch_threads_kept

    name = task["builder"]
    try:
        importlib.import_module(PEER_PACKAGES[name])
    except ImportError as exc:
        out["missing"] = f"{PEER_PACKAGES[name]} is not installed ({exc})"
        return
    saved: list[str] = []

    def save(ids: np.ndarray) -> None:
        path = f"{task['out']}.{len(saved)}.npy"
        np.save(path, np.ascontiguousarray(ids, dtype=np.int64))
        saved.append(path)

    # a builder sets its package's OpenMP threads, a count the calling thread shares with torch:
    # restored, so that a builder run in the caller's process leaves its torch calls as they were
    with torch_threads_kept():
        configs = BUILDERS[name](x, task["k"], task["build"], task["search"], task["threads"], save)
    for c, path in zip(configs, saved):
        c["lists"] = path
    out["configs"] = configs
