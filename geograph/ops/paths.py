"""Batched shortest paths by min-plus relaxation.

Both functions take a dense batch of edge lengths ``lengths (B, N, N)`` (``lengths[b, i, j]``
is the length of the edge ``i -> j``; pass a symmetric matrix for an undirected graph) and an
edge mask ``adj (B, N, N)``. Unreachable pairs, and every pair touching a padded node, are
``+inf`` (a distance has no neutral 0: 0 would claim a free path).
"""

from __future__ import annotations

import torch
from torch import Tensor

from geograph._checks import check_mask, check_tensor

__all__ = ["shortest_paths", "single_source_shortest_paths"]


def _edge_lengths(lengths: Tensor, adj: Tensor | None, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Validate and return lengths with ``+inf`` on every non-edge, plus the bool mask."""
    check_tensor(lengths, "lengths", 3, finite=False)
    b, n, n2 = lengths.shape
    if n != n2:
        raise ValueError(f"lengths must be square (B, N, N), got {tuple(lengths.shape)}")
    if adj is None:
        adj = torch.isfinite(lengths)
    else:
        adj = check_mask(adj, lengths.shape, "adj")
    mask = check_mask(mask, (b, n), "mask")
    if mask is not None:
        adj = adj & mask.unsqueeze(2) & mask.unsqueeze(1)
    on_edges = lengths[adj]
    if bool(torch.isnan(on_edges).any()) or bool((on_edges < 0).any()):
        raise ValueError("lengths must be non-negative and not NaN on every edge of adj")
    inf = torch.full((), float("inf"), dtype=lengths.dtype, device=lengths.device)
    return torch.where(adj, lengths, inf), mask


def shortest_paths(lengths: Tensor, adj: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
    r"""All-pairs shortest path distances by Floyd-Warshall over min-plus updates.

    .. math:: D^{(k)}_{ij} = \min\bigl(D^{(k-1)}_{ij},\; D^{(k-1)}_{ik} + D^{(k-1)}_{kj}\bigr)

    ``N`` iterations, each an ``O(B N^2)`` tensor op, so cost is ``O(B N^3)`` with no Python
    loop over graphs or edges.

    Args:
        lengths: ``(B, N, N)`` non-negative edge lengths, ``lengths[b, i, j]`` for ``i -> j``.
        adj: ``(B, N, N)`` bool, True = edge; ``None`` = every finite entry is an edge.
        mask: ``(B, N)`` bool, True = real node; ``None`` = all real.

    Returns:
        ``(B, N, N)`` distances: 0 on the diagonal of real nodes, ``+inf`` where unreachable
        and on every row and column of a padded node.

    Example:
        >>> w = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 2.0], [0.0, 2.0, 0.0]]])
        >>> shortest_paths(w, w > 0)
        tensor([[[0., 1., 3.],
                 [1., 0., 2.],
                 [3., 2., 0.]]])
    """
    dist, mask = _edge_lengths(lengths, adj, mask)
    return floyd_warshall_unchecked(dist, mask)


def floyd_warshall_unchecked(dist: Tensor, mask: Tensor | None) -> Tensor:
    """Floyd-Warshall on ``dist`` (``+inf`` off the edges), no validation and no host read."""
    b, n, _ = dist.shape
    diag = torch.eye(n, dtype=torch.bool, device=dist.device).expand(b, n, n)
    if mask is not None:
        diag = diag & mask.unsqueeze(2)
    dist = dist.masked_fill(diag, 0.0)
    for k in range(n):
        dist = torch.minimum(dist, dist[:, :, k : k + 1] + dist[:, k : k + 1, :])
    return dist


def single_source_shortest_paths(
    lengths: Tensor,
    adj: Tensor | None,
    source: Tensor,
    mask: Tensor | None = None,
    *,
    max_iter: int | None = None,
    early_stop: bool = False,
    check_every: int = 4,
) -> Tensor:
    r"""Shortest path distances from one source per graph by batched Bellman-Ford relaxation.

    .. math:: d^{(t+1)}_i = \min\bigl(d^{(t)}_i,\; \min_j d^{(t)}_j + \ell_{ji}\bigr),
              \qquad d^{(0)} = \mathbb{1}[i \ne s] \cdot \infty

    After ``N - 1`` relaxations the distances are exact (lengths are non-negative). The
    default runs exactly that many, with no host sync, so the op can be captured by
    ``torch.compile`` or CUDA graphs. ``early_stop=True`` checks every ``check_every``
    iterations whether anything changed and stops when nothing did (one sync per check);
    the result is the same, it only saves work on graphs of small hop diameter.

    Args:
        lengths: ``(B, N, N)`` non-negative edge lengths, ``lengths[b, i, j]`` for ``i -> j``.
        adj: ``(B, N, N)`` bool, True = edge; ``None`` = every finite entry is an edge.
        source: ``(B,)`` long, the source node of each graph.
        mask: ``(B, N)`` bool, True = real node; ``None`` = all real.
        max_iter: relaxations to run; ``None`` = ``N - 1`` (exact). Fewer gives upper bounds
            (paths of at most ``max_iter`` edges).
        early_stop: stop as soon as a check finds no change.
        check_every: iterations between checks when ``early_stop`` is set.

    Returns:
        ``(B, N)`` distances; 0 at the source, ``+inf`` where unreachable and at padding. A
        padded source gives ``+inf`` everywhere.

    Example:
        >>> w = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 2.0], [0.0, 2.0, 0.0]]])
        >>> single_source_shortest_paths(w, w > 0, torch.tensor([2]))
        tensor([[3., 2., 0.]])
    """
    length, mask = _edge_lengths(lengths, adj, mask)
    b, n, _ = length.shape
    if not isinstance(source, Tensor) or source.shape != (b,) or source.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"source must be an integer tensor of shape ({b},), got {getattr(source, 'shape', source)!r}")
    if b and (bool((source < 0).any()) or bool((source >= n).any())):
        raise ValueError(f"source must index nodes 0..{n - 1}, got {source.tolist()}")
    if check_every <= 0:
        raise ValueError(f"check_every must be positive, got {check_every}")
    steps = n - 1 if max_iter is None else int(max_iter)
    if steps < 0:
        raise ValueError(f"max_iter must be >= 0, got {max_iter}")
    node = torch.arange(n, device=length.device)
    at_source = node.unsqueeze(0) == source.to(length.device).long().unsqueeze(1)
    if mask is not None:
        at_source = at_source & mask
    inf = torch.full((), float("inf"), dtype=length.dtype, device=length.device)
    dist = torch.where(at_source, torch.zeros((), dtype=length.dtype, device=length.device), inf)
    prev = dist
    for t in range(steps):
        dist = torch.minimum(dist, (dist.unsqueeze(2) + length).amin(dim=1))
        if early_stop and (t + 1) % check_every == 0:
            if torch.equal(dist, prev):
                break
            prev = dist
    return dist
