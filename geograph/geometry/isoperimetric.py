"""ISO-RAG's isoperimetric (Cheeger-type) node ratio and the edge filter built on it."""

from __future__ import annotations

import torch
from torch import Tensor

from geograph._checks import check_tensor, check_unit_interval
from geograph.ops.adjacency import clean_edge_index, csr_rowptr

__all__ = ["isoperimetric_ratio", "compatible_edges", "two_hop_shell", "conformal_volume"]


def two_hop_shell(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Pairs ``(u, w)`` with ``w`` at exactly 2 hops from ``u``, as a ``(2, F)`` index, sorted.

    Walks every length-2 path ``u - v - w`` by CSR expansion (memory ``O(sum_v deg(v)^2)``),
    deduplicates, and removes the closed 1-hop neighbourhood of each node. ``edge_index`` must
    be clean (:func:`~geograph.ops.adjacency.clean_edge_index`: both directions, sorted by source).
    """
    device = edge_index.device
    src, dst = edge_index
    rowptr = csr_rowptr(src, num_nodes)
    deg = rowptr[1:] - rowptr[:-1]
    count = deg[dst]  # paths through edge (u, v): one per neighbour w of v
    total = int(count.sum())
    first = torch.repeat_interleave(src, count, output_size=total)
    start = torch.repeat_interleave(rowptr[dst], count, output_size=total)
    offset = torch.arange(total, device=device) - torch.repeat_interleave(
        count.cumsum(0) - count, count, output_size=total
    )
    key = torch.unique(first * num_nodes + dst[start + offset])
    nodes = torch.arange(num_nodes, device=device)
    closed = torch.cat([src * num_nodes + dst, nodes * num_nodes + nodes])
    key = key[~torch.isin(key, closed)]
    pairs = torch.stack([key // num_nodes, key % num_nodes])
    return pairs


def isoperimetric_ratio(edge_index: Tensor, volume: Tensor, num_nodes: int, *, eps: float | None = None) -> Tensor:
    r"""Per-node ratio of shell volume to ball volume on an undirected graph.

    .. math:: \phi_u = \frac{V(\partial S_u)}{V(S_u) + \varepsilon}, \qquad
              S_u = \{u\} \cup N(u), \quad \partial S_u = \{w : d(u, w) = 2\},
              \quad V(A) = \sum_{a \in A} v(a)

    with ``v`` the node volume (ISO-RAG: the conformal factor of the Poincare embedding to the
    power ``p``). Sparse throughout: a CSR walk of the length-2 paths for the shells and
    ``torch_geometric.utils.scatter`` sums; never a dense ``V x V``. An isolated node has
    ``S_u = {u}``, an empty shell and ``phi = 0``.

    Args:
        edge_index: ``(2, E)`` long; either or both directions; self loops and duplicates are
            ignored.
        volume: ``(V,)`` non-negative node volumes.
        num_nodes: ``V``.
        eps: added to the ball volume; ``None`` = the machine epsilon of ``volume``'s dtype
            (``torch.finfo(volume.dtype).eps``: 1.2e-7 in float32, 2.2e-16 in float64).

    Returns:
        ``(V,)`` ``phi`` in the dtype and on the device of ``volume``.

    References:
        ISO-RAG: Isoperimetric Noise Control for Retrieval-Augmented Generation (no arXiv id or
        venue known to us).

    Example:
        >>> path = torch.tensor([[0, 1, 2], [1, 2, 3]])  # 0 - 1 - 2 - 3
        >>> isoperimetric_ratio(path, torch.ones(4), 4, eps=0.0)
        tensor([0.5000, 0.3333, 0.3333, 0.5000])
    """
    edge_index = clean_edge_index(edge_index, num_nodes)
    if not isinstance(volume, Tensor) or tuple(volume.shape) != (num_nodes,) or not volume.is_floating_point():
        raise ValueError(f"volume must be a floating ({num_nodes},) tensor, got {getattr(volume, 'shape', volume)}")
    if not bool(torch.isfinite(volume).all()) or bool((volume < 0).any()):
        raise ValueError("volume must be finite and non-negative")
    if eps is None:
        eps = torch.finfo(volume.dtype).eps
    if not 0 <= float(eps) < float("inf"):
        raise ValueError(f"eps must be finite and non-negative, got {eps!r}")
    edge_index = edge_index.to(volume.device)
    from torch_geometric.utils import scatter  # here: its import costs seconds (see clean_edge_index)

    ball = volume + scatter(volume[edge_index[1]], edge_index[0], dim=0, dim_size=num_nodes, reduce="sum")
    shell_idx = two_hop_shell(edge_index, num_nodes)
    shell = scatter(volume[shell_idx[1]], shell_idx[0], dim=0, dim_size=num_nodes, reduce="sum")
    out: Tensor = shell / (ball + eps)
    return out


def compatible_edges(edge_index: Tensor, phi: Tensor, *, beta: float = 0.4) -> Tensor:
    r"""Mask of the edges whose endpoints have comparable ratios.

    .. math:: \mathrm{keep}(u, v) = \frac{\min(\phi_u, \phi_v)}{\max(\phi_u, \phi_v)} \ge \beta

    Two endpoints with ``phi = 0`` count as equal (ratio 1, kept).

    Args:
        edge_index: ``(2, E)`` long.
        phi: ``(V,)`` non-negative ratios (:func:`isoperimetric_ratio`).
        beta: in ``[0, 1]``; 0 keeps every edge.

    Returns:
        ``(E,)`` bool.

    Example:
        >>> compatible_edges(torch.tensor([[0, 1], [1, 2]]), torch.tensor([1.0, 0.5, 0.1]), beta=0.4)
        tensor([ True, False])
    """
    beta = check_unit_interval(beta, "beta")
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must be a (2, E) tensor, got {getattr(edge_index, 'shape', type(edge_index))}")
    if not isinstance(phi, Tensor) or phi.dim() != 1:
        raise ValueError(f"phi must be a (V,) tensor, got {getattr(phi, 'shape', type(phi))}")
    if bool((phi < 0).any()) or not bool(torch.isfinite(phi).all()):
        raise ValueError("phi must be finite and non-negative")
    pu, pv = phi[edge_index[0]], phi[edge_index[1]]
    lo, hi = torch.minimum(pu, pv), torch.maximum(pu, pv)
    ratio = torch.where(hi > 0, lo / torch.where(hi > 0, hi, torch.ones_like(hi)), torch.ones_like(hi))
    return ratio >= beta


def conformal_volume(z: Tensor, *, p: float = 2.0, c: float = 1.0) -> Tensor:
    r"""``v(z) = lambda_c(z) ** p`` with the conformal factor ``lambda_c(z) = 2 / (1 - c |z|^2)``.

    Args:
        z: ``(..., d)`` points strictly inside the ball.
        p: power.
        c: curvature magnitude.

    Returns:
        ``(...)`` volumes, float (finite: raises if a point is on or outside the boundary).

    Example:
        >>> conformal_volume(torch.tensor([[0.0, 0.0], [0.5, 0.0]]), p=1.0)
        tensor([2.0000, 2.6667])
    """
    check_tensor(z, "z", z.dim() if isinstance(z, Tensor) and z.dim() > 0 else 1)
    sq = c * (z.double() ** 2).sum(-1)
    if bool((sq >= 1).any()):
        raise ValueError("points must lie strictly inside the Poincare ball (|z| < 1/sqrt(c))")
    import geoopt

    lam: Tensor = geoopt.PoincareBall(c=c).lambda_x(z.double())
    return (lam**p).to(z.dtype)
