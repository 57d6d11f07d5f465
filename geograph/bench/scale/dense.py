"""``DenseRetriever``'s IVF index against its exact scan in ``geograph bench scale``: recall@20 and ms/query."""

from __future__ import annotations

import time
from typing import Any

import torch

from geograph.bench.common import time_calls


def dense_compare(
    x: torch.Tensor, queries: torch.Tensor, *, nprobe: int | str, k: int = 20, batch: int = 64
) -> dict[str, Any]:
    from geograph.retrievers import DenseRetriever

    exact = DenseRetriever(x)
    t0 = time.perf_counter()
    ivf = DenseRetriever(x, index="ivf", nprobe=nprobe)
    ivf(queries[:1], k)  # builds the faiss index
    build = time.perf_counter() - t0
    hits = 0
    for s in range(0, len(queries), batch):
        a, b = exact(queries[s : s + batch], k).indices, ivf(queries[s : s + batch], k).indices
        hits += int((b.unsqueeze(2) == a.unsqueeze(1)).any(2).sum())
    q = queries[:batch]
    te = time_calls(lambda: exact(q, k), repeat=5)
    ti = time_calls(lambda: ivf(q, k), repeat=5)

    def ms(t: dict[str, float]) -> dict[str, float]:
        return {key: t[key] * 1000 / batch for key in ("median", "min", "max")}

    return {
        "recall@20": hits / (len(queries) * k),
        "nlist": ivf.nlist,
        "nprobe": ivf.nprobe,
        "calibration": ivf.calibration,
        "index_build_s": build,
        "exact_ms_per_query": ms(te),
        "ivf_ms_per_query": ms(ti),
        "speedup": te["median"] / ti["median"],
    }
