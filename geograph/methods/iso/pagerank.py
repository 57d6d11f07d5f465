"""Batched personalized PageRank by power iteration on padded weighted graphs."""

from __future__ import annotations

import torch
from torch import Tensor

from geograph._checks import (
    check_finite_float,
    check_mask,
    check_positive_int,
    check_same_device,
    check_tensor,
    tracing,
)

__all__ = ["personalized_pagerank"]


def personalized_pagerank(
    weights: Tensor,
    personalization: Tensor,
    mask: Tensor | None = None,
    *,
    alpha: float = 0.85,
    max_iter: int = 100,
    tol: float | None = None,
    check_every: int = 10,
) -> Tensor:
    r"""Personalized PageRank of every graph in a batch, as ``networkx.pagerank`` defines it.

    With ``P_ij = w_ij / \sum_k w_ik`` (the row-normalised, i.e. row-stochastic, walk along edges ``i -> j``;
    ``P^T`` is column-stochastic) and
    ``r`` the personalization normalised to sum 1,

    .. math:: \pi \leftarrow \alpha \left(P^\top \pi + r \sum_{i\ \mathrm{dangling}} \pi_i\right)
              + (1 - \alpha)\, r

    starting from the uniform vector: the mass of dangling nodes (no out-weight) is returned
    through ``r``, which is ``networkx.pagerank(G, alpha, personalization=r, dangling=r)``.
    Where ``r`` is all zero on the real nodes it falls back to uniform. A fixed ``max_iter``
    iterations run (no host read in the loop; the input checks before it read the host once
    each, and are skipped under ``torch.compile``) unless ``tol`` is given: then every
    ``check_every`` iterations the loop stops once every graph's L1 change is below
    ``n_real * tol`` (networkx's criterion).

    Args:
        weights: ``(B, n, n)`` non-negative; ``weights[b, i, j]`` is the weight of ``i -> j``
            (symmetric for an undirected graph). The diagonal counts as a self loop.
        personalization: ``(B, n)`` non-negative.
        mask: ``(B, n)`` bool, True = real node; ``None`` = all real.
        alpha: damping (probability of following an edge).
        max_iter: power iterations.
        tol: optional per-node L1 tolerance for an early stop.
        check_every: iterations between tolerance checks.

    Returns:
        ``(B, n)`` PageRank, non-negative, summing to 1 over the real nodes of each graph
        (0 at padding; all 0 for a graph with no real node).

    Example:
        >>> w = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
        >>> personalized_pagerank(w, torch.tensor([[1.0, 0.0]])).round(decimals=4)
        tensor([[0.5405, 0.4595]])
    """
    if isinstance(weights, Tensor):
        check_same_device(personalization, "personalization", weights.device, "weights")
        check_same_device(mask, "mask", weights.device, "weights")
    check_tensor(weights, "weights", 3)
    b, n, n2 = weights.shape
    if n != n2:
        raise ValueError(f"weights must be square (B, n, n), got {tuple(weights.shape)}")
    check_tensor(personalization, "personalization", 2)
    if tuple(personalization.shape) != (b, n):
        raise ValueError(f"personalization must have shape {(b, n)}, got {tuple(personalization.shape)}")
    node_mask = check_mask(mask, (b, n), "mask")
    if node_mask is None:
        node_mask = torch.ones(b, n, dtype=torch.bool, device=weights.device)
    if not tracing() and (bool((weights < 0).any()) or bool((personalization < 0).any())):
        raise ValueError("weights and personalization must be non-negative")
    alpha = check_finite_float(alpha, "alpha")
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"alpha must lie in [0, 1), got {alpha!r}")
    if tol is not None and not check_finite_float(tol, "tol") > 0:
        raise ValueError(f"tol must be positive, got {tol!r}")
    check_positive_int(max_iter, "max_iter")
    check_positive_int(check_every, "check_every")
    dtype = weights.dtype
    zero = torch.zeros((), dtype=dtype, device=weights.device)
    real = node_mask.to(dtype)
    w = weights * real.unsqueeze(2) * real.unsqueeze(1)
    out_w = w.sum(2)
    dangling = (out_w <= 0) & node_mask
    p = w / torch.where(out_w > 0, out_w, torch.ones_like(out_w)).unsqueeze(2)
    n_real = real.sum(1, keepdim=True)
    uniform = real / n_real.clamp_min(1)
    r = torch.where(node_mask, personalization.to(dtype), zero)
    r_sum = r.sum(1, keepdim=True)
    r = torch.where(r_sum > 0, r / torch.where(r_sum > 0, r_sum, torch.ones_like(r_sum)), uniform)
    # dangling rows jump along r: one (B, n, n) walk matrix, one fused baddbmm per iteration
    walk = p + dangling.to(dtype).unsqueeze(2) * r.unsqueeze(1)
    teleport = ((1.0 - alpha) * r).unsqueeze(1)
    x = uniform.unsqueeze(1)
    for it in range(max_iter):
        x_old = x
        x = torch.baddbmm(teleport, x, walk, alpha=alpha)
        if tol is not None and (it + 1) % check_every == 0:
            if bool(((x - x_old).abs().sum(2) < n_real * tol).all()):
                break
    x = x.squeeze(1)
    return x
