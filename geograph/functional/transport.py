"""Batched entropic optimal transport: log-domain Sinkhorn with epsilon-scaling."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from geograph._checks import check_tensor

__all__ = ["sinkhorn", "SinkhornOutput"]


@dataclass(frozen=True)
class SinkhornOutput:
    """Result of :func:`sinkhorn`.

    Attributes:
        cost: ``(B,)`` transport cost ``<P, C>`` (entropy not included, like ``ot.sinkhorn2``);
            0 for a problem with no mass.
        plan: ``(B, n, m)`` the entropic plan ``P``; exactly 0 on zero-mass rows and columns.
        f: ``(B, n)`` dual potential of ``a`` (0 where ``a`` is 0), for warm starts.
        g: ``(B, m)`` dual potential of ``b`` (0 where ``b`` is 0).
    """

    cost: Tensor
    plan: Tensor
    f: Tensor
    g: Tensor


def sinkhorn(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    *,
    reg: float,
    max_iter: int = 1000,
    reg_start: Optional[float] = None,
    scaling_iter: Optional[int] = None,
    tol: Optional[float] = None,
    check_every: int = 10,
    f_init: Optional[Tensor] = None,
    g_init: Optional[Tensor] = None,
    relaxation: float = 1.0,
) -> SinkhornOutput:
    r"""Entropic OT for a batch of problems by log-domain Sinkhorn iterations.

    Solves :math:`\min_P \langle P, C\rangle - \varepsilon H(P)` s.t. :math:`P 1 = a`,
    :math:`P^T 1 = b` through the dual potentials

    .. math:: f_i \leftarrow \varepsilon \log a_i - \varepsilon \operatorname{LSE}_j \frac{g_j - C_{ij}}{\varepsilon},
              \quad g_j \leftarrow \varepsilon \log b_j - \varepsilon \operatorname{LSE}_i \frac{f_i - C_{ij}}{\varepsilon},
              \quad P_{ij} = \exp\frac{f_i + g_j - C_{ij}}{\varepsilon}.

    Zero-mass entries of ``a`` or ``b`` are masked out in log space (their rows and columns
    of ``P`` are exactly 0), so padded problems never give NaN. Epsilon-scaling: the first
    ``scaling_iter`` iterations anneal :math:`\varepsilon` geometrically from ``reg_start``
    (default: the largest cost of each batch, at least ``reg``) down to ``reg``; the rest run
    at ``reg``. The potentials carry over between values of :math:`\varepsilon`, so a warm
    start (``f_init``, ``g_init`` from a nearby problem) also works. Validation and the
    default ``reg_start`` read a few values on the host before the loop; pass ``reg_start``
    to skip the latter. The loop itself runs ``max_iter`` iterations with no host sync
    unless ``tol`` is given: then every
    ``check_every`` iterations at the final ``reg`` the largest marginal violation
    :math:`\max |P 1 - a|` is compared with ``tol`` (one sync per check).

    Args:
        cost: ``(B, n, m)`` ground costs.
        a: ``(B, n)`` non-negative source weights (rows sum to the same mass as ``b``).
        b: ``(B, m)`` non-negative target weights.
        reg: final entropic regularisation :math:`\varepsilon > 0`.
        max_iter: total iterations (each updates ``f`` then ``g``).
        reg_start: first :math:`\varepsilon` of the annealing.
        scaling_iter: iterations spent annealing; default ``max_iter // 2`` when
            ``reg_start > reg``, else 0.
        tol: optional stopping threshold on the marginal violation.
        check_every: iterations between tolerance checks.
        f_init: ``(B, n)`` initial potential; default 0.
        g_init: ``(B, m)`` initial potential; default 0.
        relaxation: over-relaxation factor ``omega`` in ``[1, 2)``: each update moves the
            potential ``omega`` times the plain Sinkhorn step (``f <- f + omega (f_new - f)``).
            1 is plain Sinkhorn; 1.5-1.8 converges many times faster on degenerate costs
            (graph distances with ties); close to 2 it can diverge.

    Returns:
        :class:`SinkhornOutput` with ``cost``, ``plan``, ``f``, ``g``.

    References:
        [1] M. Cuturi, Sinkhorn distances, NeurIPS 2013. [2] B. Schmitzer, Stabilized sparse
        scaling algorithms for entropy regularized transport problems, SIAM J. Sci. Comput. 2019.
        [3] A. Thibault et al., Overrelaxed Sinkhorn-Knopp algorithm for regularized optimal
        transport, Algorithms 2021.

    Example:
        >>> c = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]], dtype=torch.float64)
        >>> w = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
        >>> sinkhorn(c, w, torch.tensor([[1.0, 0.0]], dtype=torch.float64), reg=0.01).cost
        tensor([0.5000], dtype=torch.float64)
    """
    check_tensor(cost, "cost", 3)
    bsz, n, m = cost.shape
    for name, w, size in (("a", a, n), ("b", b, m)):
        check_tensor(w, name, 2)
        if tuple(w.shape) != (bsz, size):
            raise ValueError(f"{name} must have shape ({bsz}, {size}) to match cost {tuple(cost.shape)}, got {tuple(w.shape)}")
        if bool((w < 0).any()):
            raise ValueError(f"{name} must be non-negative")
    if not reg > 0:
        raise ValueError(f"reg must be positive, got {reg!r}")
    if not 1.0 <= relaxation < 2.0:
        raise ValueError(f"relaxation must lie in [1, 2), got {relaxation!r}")
    if max_iter < 1 or check_every < 1:
        raise ValueError(f"max_iter and check_every must be >= 1, got {max_iter} and {check_every}")
    dtype, device = cost.dtype, cost.device
    a = a.to(dtype)
    b = b.to(dtype)
    has_a, has_b = a > 0, b > 0
    # A problem without mass on one side is solved by the empty plan; give it dummy mass
    # so that the log-domain updates stay finite, then zero it at the end.
    empty = ~(has_a.any(1) & has_b.any(1))
    if bool(empty.any()):
        a = torch.where(empty.unsqueeze(1), torch.ones_like(a), a)
        b = torch.where(empty.unsqueeze(1), torch.ones_like(b), b)
        has_a, has_b = a > 0, b > 0
    neg_inf = torch.full((), float("-inf"), dtype=dtype, device=device)
    log_a = torch.where(has_a, a.clamp_min(torch.finfo(dtype).tiny).log(), neg_inf)
    log_b = torch.where(has_b, b.clamp_min(torch.finfo(dtype).tiny).log(), neg_inf)
    zero = torch.zeros((), dtype=dtype, device=device)
    f = torch.zeros(bsz, n, dtype=dtype, device=device) if f_init is None else f_init.to(dtype).clone()
    g = torch.zeros(bsz, m, dtype=dtype, device=device) if g_init is None else g_init.to(dtype).clone()
    f = torch.where(has_a, f, zero)
    g = torch.where(has_b, g, zero)
    # masked entries enter every log-sum-exp as -inf
    col_pen = torch.where(has_b, zero, neg_inf).unsqueeze(1)
    row_pen = torch.where(has_a, zero, neg_inf).unsqueeze(2)

    if reg_start is None:
        reg_start = max(float(cost.detach().abs().max()) if cost.numel() else reg, reg)
    reg_start = max(float(reg_start), float(reg))
    if scaling_iter is None:
        scaling_iter = max_iter // 2 if reg_start > reg else 0
    scaling_iter = min(int(scaling_iter), max_iter)
    decay = (reg / reg_start) ** (1.0 / scaling_iter) if scaling_iter > 0 else 1.0

    eps = reg
    for it in range(max_iter):
        eps = max(reg, reg_start * decay ** (it + 1)) if it < scaling_iter else reg
        omega = relaxation if it > 0 else 1.0  # the first step makes f consistent with g
        f_new = eps * log_a - eps * torch.logsumexp((g.unsqueeze(1) - cost) / eps + col_pen, dim=2)
        f = torch.where(has_a, f_new if omega == 1.0 else f + omega * (f_new - f), zero)
        g_new = eps * log_b - eps * torch.logsumexp((f.unsqueeze(2) - cost) / eps + row_pen, dim=1)
        g = torch.where(has_b, g_new if omega == 1.0 else g + omega * (g_new - g), zero)
        if tol is not None and it >= scaling_iter and (it + 1) % check_every == 0:
            plan = _plan(f, g, cost, eps, row_pen, col_pen)
            violation = (plan.sum(2) - a).abs().amax(1).masked_fill(empty, 0.0)
            if float(violation.max()) < tol:  # rows only: with omega = 1 the columns are exact after the g-update
                break
    plan = _plan(f, g, cost, reg, row_pen, col_pen)
    plan = torch.where(empty.view(-1, 1, 1), zero, plan)
    total = (plan * cost).sum(dim=(1, 2))
    return SinkhornOutput(cost=total, plan=plan, f=f, g=g)


def _plan(f: Tensor, g: Tensor, cost: Tensor, eps: float, row_pen: Tensor, col_pen: Tensor) -> Tensor:
    return torch.exp((f.unsqueeze(2) + g.unsqueeze(1) - cost) / eps + row_pen + col_pen)
