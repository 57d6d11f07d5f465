"""Normalized discrete Ricci flow of a batch of graphs, as GraphRicciCurvature 0.6.1 runs it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from geograph._checks import check_positive_int
from geograph.functional.curvature import _check_options, _ollivier_ricci, _validate

__all__ = ["ricci_flow", "RicciFlowOutput"]


@dataclass(frozen=True)
class RicciFlowOutput:
    """Result of :func:`ricci_flow`.

    Attributes:
        lengths: ``(B, n, n)`` flowed edge lengths, 0 off the edges.
        curvature: ``(B, n, n)`` Ollivier-Ricci curvature of the flowed lengths.
        iterations: ``(B,)`` long, flow steps each graph took before it stopped.
        converged: ``(B,)`` bool, True where the curvature spread fell below ``delta``.
    """

    lengths: Tensor
    curvature: Tensor
    iterations: Tensor
    converged: Tensor


def ricci_flow(
    adj: Tensor,
    lengths: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    *,
    iterations: int = 20,
    step: float = 1.0,
    delta: float = 1e-4,
    alpha: float = 0.5,
    exp_power: float = 2,
    solver: str = "sinkhorn",
    reg: float = 0.01,
    max_iter: int = 1000,
    warm_iter: int = 300,
    relaxation: float = 1.7,
    early_exit: bool = True,
) -> RicciFlowOutput:
    r"""Normalized discrete Ricci flow, one batched curvature solve per step.

    Starting from ``lengths`` (default 1 on every edge), with ``kappa`` the Ollivier-Ricci
    curvature (:func:`~geograph.functional.ollivier_ricci`) of the current lengths:

    .. math:: w \leftarrow w - \mathrm{step}\,\kappa\, w, \qquad
              w \leftarrow w \cdot \frac{|E|}{\sum_E w}, \qquad \kappa \leftarrow \kappa(w)

    ``iterations`` times, exactly as ``OllivierRicci.compute_ricci_flow`` of
    GraphRicciCurvature 0.6.1 (update every edge, rescale to mean length 1, recompute the
    shortest paths and the curvature). A graph whose ``max kappa - min kappa < delta`` after a
    step stops there: in a batch it is frozen (its lengths and curvature no longer change)
    while the others go on. One difference: GraphRicciCurvature first cuts a disconnected graph
    down to its largest component; here every component flows and the rescaling runs over
    all edges (a query graph with forced query edges is always connected).

    With ``solver="sinkhorn"`` the first solve runs ``max_iter`` iterations with
    epsilon-scaling from 1 to ``reg``; every later step starts from the previous step's
    potentials (the lengths change gradually) and runs ``warm_iter`` iterations at ``reg``.
    Measured on real query graphs (21 nodes, float32, the defaults): the kept query edges
    (``w_0j <= 1``) agree with the exact flow, flowed lengths within ~0.06 and curvatures
    within ~0.1 of exact (the flow amplifies the entropic error on edges it shrinks towards
    0); the exact solver is the reference and the CPU default of
    :class:`~geograph.RicciFiltration`.

    Args:
        adj: ``(B, n, n)`` bool symmetric edge mask.
        lengths: ``(B, n, n)`` initial lengths; ``None`` = 1 on every edge (float32).
        mask: ``(B, n)`` bool, True = real node; ``None`` = all real.
        iterations: flow steps.
        step: step size of the update.
        delta: per-graph stopping threshold on the curvature spread.
        alpha: lazy mass of the measures.
        exp_power: exponent of the measures.
        solver: ``"sinkhorn"`` or ``"exact"`` (see :func:`~geograph.functional.ollivier_ricci`).
        reg: relative entropic regularisation of the Sinkhorn solves.
        max_iter: Sinkhorn iterations of the first (cold) solve.
        warm_iter: Sinkhorn iterations of each warm-started solve.
        relaxation: Sinkhorn over-relaxation.
        early_exit: stop the loop once every graph has stopped (one host read per step);
            ``False`` runs all ``iterations`` steps (frozen graphs stay frozen).

    Returns:
        :class:`RicciFlowOutput`.

    References:
        C.-C. Ni et al., Community detection on networks with Ricci flow, Sci. Rep. 2019;
        Ricci-Filtration (../shared/papers/ricci-filtration.txt).

    Example:
        >>> adj = torch.ones(1, 4, 4, dtype=torch.bool) & ~torch.eye(4, dtype=torch.bool)
        >>> adj[0, 0, 3] = adj[0, 3, 0] = False
        >>> out = ricci_flow(adj, torch.ones(1, 4, 4, dtype=torch.float64), solver="exact", iterations=5)
        >>> round(float(out.lengths[0][adj[0]].mean()), 6)
        1.0
    """
    iterations = check_positive_int(iterations, "iterations")
    _check_options(alpha, solver, reg, max_iter)
    check_positive_int(warm_iter, "warm_iter")
    if not delta >= 0:
        raise ValueError(f"delta must be non-negative, got {delta!r}")
    if lengths is None:
        if not isinstance(adj, Tensor) or adj.dim() != 3:
            raise ValueError(f"adj must be a (B, n, n) bool tensor, got {getattr(adj, 'shape', type(adj))}")
        lengths = torch.ones(adj.shape, device=adj.device)
    w, adj, node_mask = _validate(lengths, adj, mask)
    zero = torch.zeros((), dtype=w.dtype, device=w.device)
    opts = dict(alpha=alpha, exp_power=exp_power, solver=solver, reg=reg, tol=None, relaxation=relaxation, validated=True)
    kappa, state, info = _ollivier_ricci(w, adj, node_mask, max_iter=max_iter, reg_start=None, scaling_iter=None, state=None, **opts)
    n_edges = torch.triu(adj, 1).sum((1, 2)).to(w.dtype)  # (B,)
    has_edges = n_edges > 0
    active = has_edges.clone()
    steps = torch.zeros(w.shape[0], dtype=torch.long, device=w.device)
    converged = torch.zeros_like(active)
    big = torch.full((), float("inf"), dtype=w.dtype, device=w.device)
    for _ in range(iterations):
        w_new = torch.where(adj, w - step * kappa * w, zero)
        total = torch.triu(w_new, 1).sum((1, 2))
        w_new = w_new * (n_edges / total.clamp_min(torch.finfo(w.dtype).tiny)).view(-1, 1, 1)
        k_new, state, info = _ollivier_ricci(
            w_new, adj, node_mask, max_iter=warm_iter, reg_start=reg, scaling_iter=0, state=state, **opts
        )
        live = active.view(-1, 1, 1)
        w = torch.where(live, w_new, w)
        kappa = torch.where(live, k_new, kappa)
        steps = steps + active.long()
        spread = torch.where(adj, kappa, -big).amax((1, 2)) - torch.where(adj, kappa, big).amin((1, 2))
        done = active & (spread < delta)
        converged = converged | done
        active = active & ~done
        if early_exit and not bool(active.any()):
            break
    return RicciFlowOutput(lengths=w, curvature=kappa, iterations=steps, converged=converged)
