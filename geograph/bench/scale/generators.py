"""The synthetic corpora of ``geograph bench scale``: generators fitted to real unit embeddings, and the
geometry (pairwise-cosine histogram, neighbour cosines) that checks them against real corpora."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

GENERATORS = ("mixture", "gauss")


def fit_generators(real: np.ndarray, *, clusters: int = 512, seed: int = 0) -> dict[str, Any]:
    """Two Gaussian models of real unit embeddings ``(n, D)``.

    - ``mixture``: spherical k-means with ``clusters`` centres (512 on SciFact's 5,183: about 10
      passages a centre, so the local structure survives); a point is its cluster's mean
      plus a residual drawn from the pooled within-cluster covariance scaled by the cluster's
      own residual variance, then normalised (topics of various spread, as real corpora).
    - ``gauss``: one Gaussian with the corpus mean and covariance, normalised (no topic
      structure: the harder case for IVF, whose cells then cut through dense regions).
    """
    import faiss

    x = np.ascontiguousarray(real, dtype=np.float32)
    km = faiss.Kmeans(
        x.shape[1], clusters, niter=25, seed=seed, spherical=True, verbose=False, min_points_per_centroid=1
    )
    km.train(x)
    _, lab = km.index.search(x, 1)
    lab = lab[:, 0]
    means = np.stack(
        [x[lab == c].mean(0) if (lab == c).any() else cast(np.ndarray, km.centroids)[c] for c in range(clusters)]
    )
    resid = x - means[lab]
    scale = np.array([resid[lab == c].var() if (lab == c).sum() > 1 else resid.var() for c in range(clusters)])
    cov_w = np.cov(resid.T / np.sqrt(scale[lab] / resid.var()))
    weights = np.bincount(lab, minlength=clusters) / len(lab)
    return {
        "mixture": {
            "means": means,
            "scale": scale / resid.var(),
            "chol": np.linalg.cholesky(cov_w + 1e-9 * np.eye(x.shape[1])),
            "weights": weights,
        },
        "gauss": {"mean": x.mean(0), "chol": np.linalg.cholesky(np.cov(x.T) + 1e-9 * np.eye(x.shape[1]))},
    }


def generate(model: dict[str, Any], kind: str, n: int, *, seed: int = 0, chunk: int = 100_000) -> np.ndarray:
    """``n`` float32 unit vectors from a fitted generator (chunked: memory ``O(n D)``)."""
    rng = np.random.default_rng(seed)
    m = model[kind]
    d = m["chol"].shape[0]
    out = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, chunk):
        c = min(chunk, n - s)
        eps = rng.standard_normal((c, d)) @ m["chol"].T
        if kind == "mixture":
            lab = rng.choice(len(m["weights"]), size=c, p=m["weights"])
            x = m["means"][lab] + np.sqrt(m["scale"][lab])[:, None] * eps
        else:
            x = m["mean"] + eps
        out[s : s + c] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def geometry(x: np.ndarray, *, pairs: int = 200_000, seed: int = 0) -> dict[str, Any]:
    """Pairwise-cosine histogram (random pairs) and 1st / 10th-neighbour cosine quantiles."""
    from geograph.knn.allpairs import tiled_topk

    rng = np.random.default_rng(seed)
    i, j = rng.integers(len(x), size=pairs), rng.integers(len(x), size=pairs)
    keep = i != j
    cos = np.einsum("nd,nd->n", x[i[keep]], x[j[keep]])
    edges = np.array([-0.2, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 1.0])
    hist = np.histogram(cos, bins=edges)[0] / keep.sum()
    t = torch.from_numpy(x)
    v, _ = tiled_topk(t, t, 10, exclude_self=True)
    q = [0.1, 0.5, 0.9]
    return {
        "bins": edges.tolist(),
        "hist": hist.tolist(),
        "mean_cos": float(cos.mean()),
        "nn1": np.quantile(v[:, 0].numpy(), q).tolist(),
        "nn10": np.quantile(v[:, 9].numpy(), q).tolist(),
    }
