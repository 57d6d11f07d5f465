"""faiss at geograph's boundary: its import, the IVF training sample, k-means cells, and the query index.

Queries that are not corpus passages (:class:`geograph.DenseRetriever` with ``index="ivf"``)
search a faiss ``IndexIVFFlat`` (:func:`build_ivf_index`); the corpus's own all-pairs lists use
the IVF self-join instead (:func:`~geograph.knn.ivf_join.ivf_self_topk`), whose cells are
faiss's spherical k-means (:func:`train_centroids`); both train on a uniform sample
(:func:`training_rows`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from geograph.knn.policy import JOIN_KMEANS_NITER, check_ivf, log

__all__ = ["import_faiss", "training_rows", "train_centroids", "build_ivf_index"]


def import_faiss() -> Any:
    """The ``faiss`` module, or an ``ImportError`` that says how to install it."""
    try:
        import faiss
    except ImportError as exc:
        raise ImportError(
            "index='ivf' needs faiss: pip install 'geograph-rag[faiss]' (faiss-cpu or faiss-gpu)"
        ) from exc
    return faiss


def training_rows(n: int, nlist: int, sample: int | None, seed: int) -> Tensor:
    """The sorted rows an IVF quantizer is trained on: a uniform sample of ``sample`` (checked) of ``n``.

    Example:
        >>> rows = training_rows(1000, 2, 100, seed=0)
        >>> rows.shape, bool((rows[1:] > rows[:-1]).all())
        (torch.Size([100]), True)
    """
    sample = check_ivf(n, nlist, 1, sample)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:sample].sort().values


def build_ivf_index(embeddings: Tensor, nlist: int, *, sample: int | None = None, seed: int = 0) -> Any:
    """A faiss ``IndexIVFFlat`` (inner product, uncompressed vectors) over the unit rows, its
    quantizer trained on a uniform ``sample``; on the GPU when the rows are on CUDA and faiss
    has GPU support (``faiss-gpu``), else on the CPU (logged)."""
    faiss = import_faiss()
    n, d = embeddings.shape
    x = embeddings.detach().float().cpu().contiguous().numpy()
    pick = training_rows(n, nlist, sample, seed).numpy()
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.train(x[pick])
    index.add(x)
    if embeddings.device.type == "cuda":
        if hasattr(faiss, "StandardGpuResources"):
            index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), embeddings.device.index or 0, index)
            log.info("IVF index on %s (faiss-gpu)", embeddings.device)
        else:
            log.info("IVF index on the CPU: this faiss has no GPU support (install faiss-gpu)")
    return index


def train_centroids(
    z: Tensor, nlist: int, *, sample: int | None = None, seed: int = 0, niter: int = JOIN_KMEANS_NITER
) -> Tensor:
    """Spherical k-means centroids ``(nlist, D)`` of unit rows ``z``, trained on a uniform sample by
    faiss in ``niter`` iterations (default :data:`~geograph.knn.policy.JOIN_KMEANS_NITER`)."""
    n, d = z.shape
    rows = training_rows(n, nlist, sample, seed)
    sample = len(rows)
    x = z[rows.to(z.device)].detach().float().cpu().contiguous().numpy()
    faiss = import_faiss()
    km = faiss.Kmeans(
        d,
        nlist,
        niter=niter,
        seed=seed,
        spherical=True,
        verbose=False,
        min_points_per_centroid=1,
        max_points_per_centroid=max(256, -(-sample // nlist)),
    )
    km.train(x)
    return torch.from_numpy(km.centroids.copy()).to(device=z.device, dtype=z.dtype)
