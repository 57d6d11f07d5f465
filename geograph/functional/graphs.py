"""Batched k-nearest-neighbour graphs."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from geograph._checks import check_mask, check_positive_int, check_tensor
from geograph.functional.similarity import cosine_similarity
from geograph.outputs import topk_stable


def knn_graph(x: Tensor, k: int, mask: Optional[Tensor] = None) -> Tensor:
    r"""Symmetric k-nearest-neighbour adjacency by cosine similarity.

    Node ``i`` links to the ``k`` other real nodes of highest cosine similarity; the graph is
    the union of these directed links, ``A = K \lor K^T``, with no self loops.

    If a graph has fewer than ``k + 1`` real nodes, ``k`` clamps to the number of other real
    nodes (every real node links to every other one); a graph with a single real node has no
    edges; ``N = 0`` gives an empty ``(B, 0, 0)`` adjacency. Ties at the ``k``-th neighbour:
    the lowest index is linked (:func:`~geograph.outputs.topk_stable`).

    Args:
        x: node vectors ``(B, N, D)``.
        k: neighbours per node, ``k >= 1``.
        mask: ``(B, N)`` bool, True = real node; ``None`` = all real.

    Returns:
        ``(B, N, N)`` bool adjacency, symmetric, False on the diagonal and at padding.

    Example:
        >>> x = torch.tensor([[[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]])
        >>> knn_graph(x, k=1).int()
        tensor([[[0, 1, 0],
                 [1, 0, 1],
                 [0, 1, 0]]], dtype=torch.int32)
    """
    check_positive_int(k, "k")
    check_tensor(x, "x", 3, finite=False)
    sim = cosine_similarity(x, mask=mask)
    return knn_from_similarity(sim, k, mask)


def knn_from_similarity(sim: Tensor, k: int, mask: Optional[Tensor] = None) -> Tensor:
    """:func:`knn_graph` from a precomputed similarity matrix ``sim (B, N, N)`` (higher = nearer).

    Args:
        sim: ``(B, N, N)`` similarities; only the real block is read.
        k: neighbours per node, ``k >= 1``; clamps as in :func:`knn_graph`.
        mask: ``(B, N)`` bool, True = real node; ``None`` = all real.

    Returns:
        ``(B, N, N)`` bool symmetric adjacency.
    """
    check_positive_int(k, "k")
    check_tensor(sim, "sim", 3, finite=False)
    b, n, n2 = sim.shape
    if n != n2:
        raise ValueError(f"sim must be square (B, N, N), got {tuple(sim.shape)}")
    mask = check_mask(mask, (b, n), "mask")
    adj = torch.zeros(b, n, n, dtype=torch.bool, device=sim.device)
    if min(k, n - 1) <= 0:  # N <= 1: no pair of nodes
        return adj
    values, idx = knn_lists(sim, k, mask)
    # Rows with fewer than k real neighbours select -inf entries: drop them.
    adj.scatter_(-1, idx, values > float("-inf"))
    return adj | adj.transpose(1, 2)


def knn_lists(sim: Tensor, k: int, mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Each node's directed k-NN links: ``(values, idx)``, both ``(B, N, min(k, N - 1))``.

    ``values`` are the similarities of the selected neighbours, ``-inf`` where a node has
    fewer real neighbours than ``k`` (those ``idx`` entries point nowhere meaningful). No
    validation: callers (:func:`knn_from_similarity`, Maniscope) have checked the inputs.
    """
    b, n, _ = sim.shape
    invalid = torch.eye(n, dtype=torch.bool, device=sim.device).expand(b, n, n)
    if mask is not None:
        invalid = invalid | ~(mask.unsqueeze(2) & mask.unsqueeze(1))
    return topk_stable(sim.masked_fill(invalid, float("-inf")), min(k, n - 1))
