"""Batched entropic optimal transport: log-domain Sinkhorn with epsilon-scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import torch
from torch import Tensor

from geograph._checks import check_cert_tol, check_tensor, tracing

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "sinkhorn",
    "SinkhornOutput",
    "SinkhornOptions",
    "SinkhornKeywords",
    "emd",
    "transport_bounds",
    "TransportBounds",
]

# Dantzig pivots per exact problem before the simplex switches to Bland's rule (which cannot
# cycle); a problem still open after a further 50 * cells + 1000 pivots (_numba/simplex.py's
# _BLAND_PIVOTS_PER_CELL, _BLAND_PIVOTS_BASE) counts as stuck and POT re-solves it (never seen on
# real or random problems; tested by forcing tiny caps)
_MAX_PIVOTS = 1000


@dataclass(frozen=True)
class SinkhornOptions:
    """The options of the certified Sinkhorn solves of the curvature and the flow, and their defaults.

    :func:`~geograph.functional.ollivier_ricci` and :func:`~geograph.functional.ricci_flow` take
    them as keywords (``reg=0.05``) and hand this one object down to their solves; the defaults
    written here are the defaults of both, and of :class:`~geograph.RicciFiltration`'s ``reg``
    and ``cert_tol``. Checked on construction (one line naming the bad value).

    Attributes:
        reg: final relative entropic regularisation (a fraction of ``d(x, y)``).
        max_iter: Sinkhorn iterations of a cold solve.
        reg_start: first epsilon of the annealing of a cold solve; ``None`` = 1.
        scaling_iter: iterations of a cold solve spent annealing; ``None`` = ``max_iter // 2``.
        tol: optional marginal tolerance for an early stop of a cold solve (one host read per check).
        relaxation: over-relaxation (see :func:`sinkhorn`); the graph costs have many ties, where
            plain Sinkhorn (1.0) needs about 5x the iterations.
        cert_tol: largest certified curvature error left without an exact re-solve; ``None`` = no
            re-solve (no host read).

    Example:
        >>> SinkhornOptions(reg=0.05).max_iter
        1000
    """

    reg: float = 0.01
    max_iter: int = 1000
    reg_start: float | None = None
    scaling_iter: int | None = None
    tol: float | None = None
    relaxation: float = 1.7
    cert_tol: float | None = 1e-3

    def __post_init__(self) -> None:
        reg, max_iter, relaxation = self.reg, self.max_iter, self.relaxation
        if not (isinstance(reg, (int, float)) and math.isfinite(reg) and reg > 0):
            raise ValueError(f"reg must be positive and finite, got {reg!r}")
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
        if isinstance(relaxation, bool) or not isinstance(relaxation, (int, float)) or not math.isfinite(relaxation):
            raise ValueError(f"relaxation must be a finite number, got {relaxation!r}")
        object.__setattr__(self, "cert_tol", check_cert_tol(self.cert_tol))


class SinkhornKeywords(TypedDict, total=False):
    """:class:`SinkhornOptions` as keyword arguments (``**sinkhorn: Unpack[SinkhornKeywords]``)."""

    reg: float
    max_iter: int
    reg_start: float | None
    scaling_iter: int | None
    tol: float | None
    relaxation: float
    cert_tol: float | None


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


def _check_problems(cost: Tensor, a: Tensor, b: Tensor) -> None:
    """Validate a batch of transport problems: ``cost (B, n, m)``, masses ``a (B, n)``, ``b (B, m)`` >= 0."""
    check_tensor(cost, "cost", 3)
    bsz, n, m = cost.shape
    for name, w, size in (("a", a, n), ("b", b, m)):
        check_tensor(w, name, 2)
        if tuple(w.shape) != (bsz, size):
            raise ValueError(
                f"{name} must have shape ({bsz}, {size}) to match cost {tuple(cost.shape)}, got {tuple(w.shape)}"
            )
        if bool((w < 0).any()):
            raise ValueError(f"{name} must be non-negative")


def sinkhorn(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    *,
    reg: float,
    max_iter: int = SinkhornOptions.max_iter,
    reg_start: float | None = None,
    scaling_iter: int | None = None,
    tol: float | None = None,
    check_every: int = 10,
    f_init: Tensor | None = None,
    g_init: Tensor | None = None,
    relaxation: float = 1.0,
) -> SinkhornOutput:
    r"""Entropic OT for a batch of problems by log-domain Sinkhorn iterations.

    Solves :math:`\min_P \langle P, C\rangle - \varepsilon H(P)` s.t. :math:`P 1 = a`,
    :math:`P^T 1 = b` through the dual potentials

    .. math::

        f_i \leftarrow \varepsilon \log a_i - \varepsilon \operatorname{LSE}_j \frac{g_j - C_{ij}}{\varepsilon},
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
    _check_problems(cost, a, b)
    if not (reg > 0 and math.isfinite(reg)):
        raise ValueError(f"reg must be positive, got {reg!r}")
    if not 1.0 <= relaxation < 2.0:
        raise ValueError(f"relaxation must lie in [1, 2), got {relaxation!r}")
    if max_iter < 1 or check_every < 1:
        raise ValueError(f"max_iter and check_every must be >= 1, got {max_iter} and {check_every}")
    if reg_start is None:
        reg_start = max(float(cost.detach().abs().max()) if cost.numel() else reg, reg)
    options = SinkhornOptions(
        reg=reg,
        max_iter=max_iter,
        reg_start=float(reg_start),
        scaling_iter=scaling_iter,
        tol=tol,
        relaxation=relaxation,
        cert_tol=None,
    )
    return sinkhorn_unchecked(cost, a, b, options, check_every=check_every, f_init=f_init, g_init=g_init)


def sinkhorn_unchecked(
    cost: Tensor,
    a: Tensor,
    b: Tensor,
    options: SinkhornOptions,
    *,
    check_every: int,
    f_init: Tensor | None = None,
    g_init: Tensor | None = None,
) -> SinkhornOutput:
    """:func:`sinkhorn` on checked ``options`` (``reg_start`` ``None``: no annealing; ``cert_tol`` is
    not read), without validation of the problems: no host read at all unless ``tol`` is given."""
    reg, max_iter, tol, relaxation = options.reg, options.max_iter, options.tol, options.relaxation
    scaling_iter = options.scaling_iter
    dtype, device = cost.dtype, cost.device
    bsz, n, m = cost.shape
    a = a.to(dtype)
    b = b.to(dtype)
    # A problem without mass on one side is solved by the empty plan; give it dummy mass
    # so that the log-domain updates stay finite, then zero it at the end (no host read).
    empty = ~((a > 0).any(1) & (b > 0).any(1))
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

    reg_start = max(float(reg if options.reg_start is None else options.reg_start), float(reg))
    if scaling_iter is None:
        scaling_iter = max_iter // 2 if reg_start > reg else 0
    scaling_iter = min(int(scaling_iter), max_iter)
    decay = (reg / reg_start) ** (1.0 / scaling_iter) if scaling_iter > 0 else 1.0
    check = tol is not None and not tracing()

    # the scaled costs of each half-step, masked entries +inf (made again only while eps anneals):
    # the f-update reduces over the columns of cost / eps, the g-update over the rows, as the
    # contiguous last dimension of the transposed copy (a reduction over a strided dimension of
    # a few entries costs several times more on the CPU)
    cost_f = cost - col_pen
    cost_g = (cost - row_pen).transpose(1, 2).contiguous()
    scaled_eps = None
    eps = reg
    for it in range(max_iter):
        eps = max(reg, reg_start * decay ** (it + 1)) if it < scaling_iter else reg
        if eps != scaled_eps:
            scaled_f, scaled_g, scaled_eps = cost_f / eps, cost_g / eps, eps
        omega = relaxation if it > 0 else 1.0  # the first step makes f consistent with g
        f_new = eps * log_a - eps * _logsumexp(g.unsqueeze(1) / eps - scaled_f)
        f = torch.where(has_a, f_new if omega == 1.0 else f + omega * (f_new - f), zero)
        g_new = eps * log_b - eps * _logsumexp(f.unsqueeze(1) / eps - scaled_g)
        g = torch.where(has_b, g_new if omega == 1.0 else g + omega * (g_new - g), zero)
        if check and it >= scaling_iter and (it + 1) % check_every == 0:
            plan = _plan(f, g, cost, eps, row_pen, col_pen)
            violation = (plan.sum(2) - a).abs().amax(1).masked_fill(empty, 0.0)
            if (
                tol is not None and float(violation.max()) < tol
            ):  # rows only: with omega = 1 the columns are exact after the g-update
                break
    plan = _plan(f, g, cost, reg, row_pen, col_pen)
    plan = torch.where(empty.view(-1, 1, 1), zero, plan)
    total = (plan * cost).sum(dim=(1, 2))
    return SinkhornOutput(cost=total, plan=plan, f=f, g=g)


def _logsumexp(x: Tensor) -> Tensor:
    """``torch.logsumexp(x, -1)`` for the Sinkhorn updates, where every row holds a finite entry.

    On the CPU the exponentials of the shifted entries are taken of ``max(x - max, log(tiny) + 1)``:
    entries that far below the row's largest are subnormal after ``exp`` (``cost / eps`` spans
    hundreds at a small ``reg``), and the CPU computes subnormals about 20 times slower than
    normal floats, so they took most of a solve. The clamp adds at most ``n e tiny`` to a sum of
    at least 1, far below its last bit. Elsewhere ``torch.logsumexp`` itself."""
    if x.device.type != "cpu":
        return torch.logsumexp(x, dim=-1)
    m = x.detach().amax(-1, keepdim=True)
    floor = math.log(torch.finfo(x.dtype).tiny) + 1.0  # exp(floor) is normal after rounding too
    shifted = (x - m).clamp_min(floor)
    out = (shifted.exp_() if not shifted.requires_grad else shifted.exp()).sum(-1).log()
    return out + m.squeeze(-1)


def _plan(f: Tensor, g: Tensor, cost: Tensor, eps: float, row_pen: Tensor, col_pen: Tensor) -> Tensor:
    return torch.exp((f.unsqueeze(2) + g.unsqueeze(1) - cost) / eps + row_pen + col_pen)


def emd(cost: Tensor, a: Tensor, b: Tensor) -> Tensor:
    r"""Exact optimal transport cost of a batch of small problems (compiled network simplex).

    .. math:: \mathrm{OT}(a, b) = \min_{P \ge 0,\; P 1 = a,\; P^T 1 = b} \langle P, C \rangle

    Each problem is solved exactly by the transportation simplex in float64 (numba, all
    problems in parallel over the CPU cores, no Python per problem); zero-mass rows and
    columns are skipped, so padded problems are fine. Agrees with POT's ``ot.emd2`` within
    1e-9 (tested). ``a`` and ``b`` must carry the same mass per problem; a problem with no mass
    on a side costs 0. Tensors on another device make one round trip to the host (the
    solver is CPU-only); the result has the dtype and device of ``cost``.

    Args:
        cost: ``(B, n, m)`` finite ground costs.
        a: ``(B, n)`` non-negative source weights.
        b: ``(B, m)`` non-negative target weights, ``b.sum(1) == a.sum(1)``.

    Returns:
        ``(B,)`` optimal costs.

    References:
        G. Monge / L. Kantorovich; the transportation simplex (MODI) as in G. Dantzig, Linear
        Programming and Extensions, 1963; N. Bonneel et al., Displacement interpolation using
        Lagrangian mass transport, SIGGRAPH Asia 2011 (POT's solver, the test reference).

    Example:
        >>> c = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]], dtype=torch.float64)
        >>> emd(c, torch.tensor([[0.5, 0.5]], dtype=torch.float64), torch.tensor([[1.0, 0.0]], dtype=torch.float64))
        tensor([0.5000], dtype=torch.float64)
    """
    _check_problems(cost, a, b)
    out = emd_numpy(
        cost.detach().cpu().double().numpy(), a.detach().cpu().double().numpy(), b.detach().cpu().double().numpy()
    )
    return torch.from_numpy(out).to(device=cost.device, dtype=cost.dtype)


def emd_numpy(cost: np.ndarray, a: np.ndarray, b: np.ndarray, max_pivots: int = _MAX_PIVOTS) -> np.ndarray:
    """float64 numpy core of :func:`emd`: the numba kernel, POT for any problem it left stuck."""
    import numpy as np

    from geograph.transport._numba.simplex import emd_batch

    cost, a, b = (np.ascontiguousarray(x, dtype=np.float64) for x in (cost, a, b))
    out, status, _ = emd_batch(a, b, cost, max_pivots=max_pivots)
    for e in np.flatnonzero(status):  # pragma: no cover - exercised by the forced-cap test
        out[e] = pot_emd(a[e], b[e], cost[e])
    return out


def pot_emd(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> float:
    """POT's network simplex on the positive entries of one problem (the fallback)."""
    import numpy as np
    import ot

    ra, cb = a > 0, b > 0
    if not ra.any() or not cb.any():
        return 0.0
    return float(ot.emd2(a[ra], b[cb], np.ascontiguousarray(cost[np.ix_(ra, cb)]), numItermax=10_000_000))


@dataclass(frozen=True)
class TransportBounds:
    """Certified bounds of :func:`transport_bounds`: ``lower <= OT(a, b) <= upper``.

    Attributes:
        lower: ``(B,)`` dual value of the c-transformed potentials (a feasible dual).
        upper: ``(B,)`` cost of the rounded plan (a feasible plan).
        plan: ``(B, n, m)`` the rounded plan, with marginals exactly ``a`` and ``b`` up to rounding.
    """

    lower: Tensor
    upper: Tensor
    plan: Tensor


def transport_bounds(cost: Tensor, a: Tensor, b: Tensor, f: Tensor, plan: Tensor) -> TransportBounds:
    r"""Certified lower and upper bounds on the exact OT cost from an approximate solution.

    Lower bound (weak duality): the c-transforms

    .. math:: g'_j = \min_i (C_{ij} - f_i), \qquad f'_i = \min_j (C_{ij} - g'_j)

    satisfy :math:`f'_i + g'_j \le C_{ij}`, so :math:`\langle a, f'\rangle + \langle b, g'\rangle
    \le \mathrm{OT}`. Upper bound: the rounding of Altschuler, Weed and Rigollet (2017) turns
    ``plan`` into a feasible plan :math:`\hat P` (scale rows down to ``a``, columns down to
    ``b``, then add the rank-one correction :math:`e_a e_b^T / \|e_a\|_1`), so
    :math:`\langle \hat P, C\rangle \ge \mathrm{OT}`. Both hold for any ``f`` and any
    non-negative ``plan``; they are tight when ``f`` and ``plan`` are near optimal (after
    Sinkhorn). Only entries with mass enter (zero-mass rows and columns are ignored), all in
    float64; the result has ``cost``'s dtype. No host read.

    Args:
        cost: ``(B, n, m)`` ground costs.
        a: ``(B, n)`` source weights; ``b``: ``(B, m)`` target weights of the same mass.
        f: ``(B, n)`` row potentials (e.g. :attr:`SinkhornOutput.f`).
        plan: ``(B, n, m)`` non-negative approximate plan (e.g. :attr:`SinkhornOutput.plan`).

    Returns:
        :class:`TransportBounds`.

    References:
        J. Altschuler, J. Weed, P. Rigollet, Near-linear time approximation algorithms for
        optimal transport via Sinkhorn iteration, NeurIPS 2017 (Algorithm 2); G. Peyre and
        M. Cuturi, Computational Optimal Transport, 2019 (c-transforms, Sec. 5.1).

    Example:
        >>> c = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]], dtype=torch.float64)
        >>> w = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
        >>> out = sinkhorn(c, w, torch.tensor([[1.0, 0.0]], dtype=torch.float64), reg=0.01)
        >>> bd = transport_bounds(c, w, torch.tensor([[1.0, 0.0]], dtype=torch.float64), out.f, out.plan)
        >>> round(float(bd.lower[0]), 6), round(float(bd.upper[0]), 6)
        (0.5, 0.5)
    """
    dtype = cost.dtype
    c, a, b, f, p = (x.double() for x in (cost, a, b, f, plan))
    has_a, has_b = a > 0, b > 0
    inf = torch.full((), float("inf"), dtype=torch.float64, device=c.device)
    zero = torch.zeros((), dtype=torch.float64, device=c.device)
    valid = has_a.unsqueeze(2) & has_b.unsqueeze(1)
    # c-transforms over the entries with mass (others do not constrain the dual)
    g1 = torch.where(valid, c - f.unsqueeze(2), inf).amin(1)
    g1 = torch.where(has_b, g1, zero)
    f1 = torch.where(valid, c - g1.unsqueeze(1), inf).amin(2)
    f1 = torch.where(has_a, f1, zero)
    lower = (a * f1).sum(1) + (b * g1).sum(1)
    # Altschuler et al. rounding
    p = torch.where(valid, p.clamp_min(0), zero)
    r = p.sum(2)
    x = torch.where(r > a, a / r.clamp_min(torch.finfo(torch.float64).tiny), torch.ones_like(r))
    p = p * x.unsqueeze(2)
    col = p.sum(1)
    y = torch.where(col > b, b / col.clamp_min(torch.finfo(torch.float64).tiny), torch.ones_like(col))
    p = p * y.unsqueeze(1)
    err_a = (a - p.sum(2)).clamp_min(0)
    err_b = (b - p.sum(1)).clamp_min(0)
    p = p + err_a.unsqueeze(2) * err_b.unsqueeze(1) / err_a.sum(1).clamp_min(torch.finfo(torch.float64).tiny).view(
        -1, 1, 1
    )
    upper = (p * torch.where(valid, c, zero)).sum((1, 2))
    empty = ~(has_a.any(1) & has_b.any(1))
    lower = torch.where(empty, zero, lower)
    upper = torch.where(empty, zero, upper)
    return TransportBounds(lower=lower.to(dtype), upper=upper.to(dtype), plan=p.to(dtype))
