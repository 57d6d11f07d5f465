"""Exact references of ``geograph bench scale`` on sampled rows: k-NN rows, G3 rows and densities by the tiled
exact scan, and the recalls and errors of a build against them."""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
import torch

from geograph.bench.scale.harness import MAX_DEGREE


def exact_knn_rows(z: torch.Tensor, rows: torch.Tensor, k: int) -> torch.Tensor:
    from geograph.knn.allpairs import tiled_pairs

    return tiled_pairs(z[rows], z, k, exclude=rows)[1]


def knn_recall(edge_index: np.ndarray, rows: np.ndarray, ref: np.ndarray) -> float:
    """Share of each sampled row's exact top-k found among its graph neighbours."""
    order = np.argsort(edge_index[0], kind="stable")
    src, dst = edge_index[0][order], edge_index[1][order]
    hits = 0
    for r, want in zip(rows.tolist(), ref.tolist()):
        lo, hi = np.searchsorted(src, r), np.searchsorted(src, r, side="right")
        hits += len(set(dst[lo:hi].tolist()) & set(want))
    return hits / ref.size


def exact_g3_rows(
    z: torch.Tensor, rows: torch.Tensor, penalty: torch.Tensor, band: tuple[float, float] = (0.1, 0.7)
) -> list[dict[int, float]]:
    """Each sampled row's exact top-``MAX_DEGREE`` weights, normalised: ``[{col: weight}]``."""
    from geograph.knn.allpairs import tiled_pairs

    def score(s: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        ok = (s >= band[0]) & (s <= band[1])
        w = torch.where(ok, s * torch.sqrt((1 - s * s).clamp_min(0)), torch.zeros_like(s))
        return w * penalty[cols]

    val, col, _ = tiled_pairs(z[rows], z, MAX_DEGREE, exclude=rows, score=score)
    out = []
    for v, c in zip(val.tolist(), col.tolist()):
        d = {ci: vi for ci, vi in zip(c, v) if vi > 0}
        tot = sum(d.values())
        out.append({ci: vi / tot for ci, vi in d.items()} if tot > 0 else {})
    return out


def g3_row_errors(npz: Any, rows: np.ndarray, ref: list[dict[int, float]]) -> tuple[float, float]:
    """Edge recall and mean L1 of the normalised weights, built vs exact, on the sampled rows."""
    crow, col, val = npz["crow"], npz["col"], npz["val"]
    found = total = 0
    l1 = []
    for r, want in zip(rows.tolist(), ref):
        got = dict(zip(col[crow[r] : crow[r + 1]].tolist(), val[crow[r] : crow[r + 1]].tolist()))
        found += len(set(got) & set(want))
        total += len(want)
        keys = set(got) | set(want)
        l1.append(sum(abs(got.get(c, 0.0) - want.get(c, 0.0)) for c in keys))
    return (found / total if total else 1.0), float(np.mean(l1))


def raw_density(z: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    from geograph.knn.allpairs import tiled_pairs

    q = z if rows is None else z[rows]
    _, _, s = tiled_pairs(
        q,
        z,
        0,
        exclude=True if rows is None else rows,
        row_sum=lambda t: t.clamp_min(0),
        progress="exact density" if rows is None else False,
    )
    return cast(torch.Tensor, s) / z.shape[0]  # row_sum is given: the sums are there


def g3_check(z: torch.Tensor, rows: torch.Tensor, g3: Any, exact_limit: int) -> dict[str, Any]:
    """A G3 build's density error and, on ``rows``, its edge recall and weight L1 error against exact rows."""
    n = z.shape[0]
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    built_rho = torch.from_numpy(g3["density"])
    if n <= exact_limit:
        raw = raw_density(z).double()
        exact_rho = ((raw - raw.min()) / (raw.max() - raw.min())).float()
        out["rho_max_error"] = float((exact_rho - built_rho).abs().max())
        out["rho_error_over"] = "all rows"
        penalty = torch.exp(-0.4 * exact_rho)
        out["reference"] = "exact rows with the exact density of every passage"
    else:
        raw_rows = raw_density(z, rows).double()
        # the build's normalisation is set by exact extremes: recover it from two exact rows
        lo_row, hi_row = int(built_rho.argmin()), int(built_rho.argmax())
        ext = raw_density(z, torch.tensor([lo_row, hi_row])).double()
        exact_rows_rho = (raw_rows - ext[0]) / (ext[1] - ext[0])
        out["rho_max_error"] = float((exact_rows_rho - built_rho[rows].double()).abs().max())
        out["rho_error_over"] = f"{len(rows)} sampled rows"
        penalty = torch.exp(-0.4 * built_rho)
        out["reference"] = "exact rows with the build's density"
    rec, l1 = g3_row_errors(g3, rows.numpy(), exact_g3_rows(z, rows, penalty))
    out.update(edge_recall=rec, weight_l1=l1, check_rows=len(rows), check_seconds=time.perf_counter() - t0)
    return out


def csr_edge_recall(crow: torch.Tensor, col: torch.Tensor, crow2: torch.Tensor, col2: torch.Tensor) -> float:
    """Share of the first graph's edges (CSR) that the second has.

    Example:
        >>> t = torch.tensor
        >>> csr_edge_recall(t([0, 2, 3]), t([1, 0, 0]), t([0, 1, 2]), t([1, 0]))
        0.6666666666666666
    """
    n = crow.numel() - 1

    def key(c: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(torch.arange(n), c.diff()) * n + k

    a, b = key(crow, col), key(crow2, col2)
    return float(torch.isin(a, b).sum()) / a.numel() if a.numel() else 1.0
