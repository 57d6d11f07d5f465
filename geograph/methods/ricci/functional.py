"""Ricci-Filtration: flow each query graph, keep the candidates whose query edge stays short."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypedDict

import torch
from torch import Tensor

from geograph._checks import (
    check_cert_tol,
    check_finite_float,
    check_percentile,
    check_positive_int,
    check_unit_interval,
)
from geograph.ops.adjacency import query_graph
from geograph.ops.similarity import cosine_similarity
from geograph.outputs import RerankOutput, order_by_score
from geograph.transport.curvature import check_solver, resolve_solver
from geograph.transport.flow import check_step, ricci_flow

__all__ = ["ricci_filtration", "ricci_surgery", "check_ricci_options"]


class RicciOptions(TypedDict):
    """Ricci-Filtration's hyperparameters as :func:`check_ricci_options` returns them."""

    percentile: float
    alpha: float
    exp_power: float
    iterations: int
    step: float
    delta: float
    eta: float
    solver: str
    reg: float
    cert_tol: float | None


def check_ricci_options(
    *,
    percentile: float,
    alpha: float,
    exp_power: float,
    iterations: int,
    step: float,
    delta: float,
    eta: float,
    solver: str,
    reg: float,
    cert_tol: float | None,
) -> RicciOptions:
    """Validate Ricci-Filtration's hyperparameters; returns them normalised (floats), or raises ``ValueError``.

    The one check of :func:`ricci_filtration` and :class:`~geograph.RicciFiltration`.
    """
    percentile = check_percentile(percentile)
    check_solver(solver)
    eta_f = check_finite_float(eta, "eta")
    if not eta_f >= 0:
        raise ValueError(f"eta must be non-negative, got {eta!r}")
    alpha = check_unit_interval(alpha, "alpha")
    exp_power = check_finite_float(exp_power, "exp_power")
    iterations = check_positive_int(iterations, "iterations")
    step = check_step(step)
    delta_f = check_finite_float(delta, "delta")
    if not delta_f >= 0:
        raise ValueError(f"delta must be non-negative, got {delta!r}")
    reg_f = check_finite_float(reg, "reg")
    if not reg_f > 0:
        raise ValueError(f"reg must be positive, got {reg!r}")
    return dict(
        percentile=percentile,
        alpha=alpha,
        exp_power=exp_power,
        iterations=iterations,
        step=step,
        delta=delta_f,
        eta=eta_f,
        solver=solver,
        reg=reg_f,
        cert_tol=check_cert_tol(cert_tol),
    )


def ricci_surgery(query_edge_length: Tensor, mask: Tensor, eta: float) -> Tensor:
    r"""Ricci-Filtration's surgery: keep candidate ``j`` iff it is real and its flowed query edge ``w_0j <= eta``.

    Args:
        query_edge_length: ``(B, N)`` flowed query-edge lengths (compare them at the flow's
            precision: :func:`ricci_filtration` passes the float64 lengths of the exact solver).
        mask: ``(B, N)`` bool, True = real candidate.
        eta: the surgery threshold.

    Returns:
        ``(B, N)`` bool: the kept candidates (False at padding).

    Example:
        >>> ricci_surgery(torch.tensor([[0.5, 1.0, 1.5]]), torch.tensor([[True, True, True]]), 1.0)
        tensor([[ True,  True, False]])
    """
    return mask & (query_edge_length <= eta)


def ricci_filtration(
    query: Tensor,
    docs: Tensor,
    mask: Tensor | None = None,
    *,
    percentile: float = 50.0,
    alpha: float = 0.5,
    exp_power: float = 2,
    iterations: int = 20,
    step: float = 1.0,
    delta: float = 1e-4,
    eta: float = 1.0,
    solver: str = "auto",
    reg: float = 0.01,
    cert_tol: float | None = 1e-3,
    scorer: Callable[..., Tensor] | None = None,
    query_texts: Sequence[str] | None = None,
    doc_texts: Sequence[Sequence[str]] | None = None,
) -> RerankOutput:
    r"""Ricci-Filtration of a padded batch of candidates: the function :class:`~geograph.RicciFiltration` calls.

    Per query: the graph of :func:`~geograph.functional.query_graph` (query + candidates,
    unit lengths) flows ``iterations`` steps of :func:`~geograph.functional.ricci_flow`
    (float64 for the ``"exact"`` solver, the input's dtype for ``"sinkhorn"``); candidate ``j``
    is kept by :func:`ricci_surgery` (``w_0j <= eta``, at the flow's precision). The kept
    candidates are scored by ``scorer(query_texts, padded_doc_texts, keep)`` when given (the
    texts are then required), else by cosine to the query; the others score ``-inf``. See
    :class:`~geograph.RicciFiltration` for the arguments, the solvers and precision.

    Shape:
        - query ``(B, D)``, docs ``(B, N, D)``, mask ``(B, N)`` bool (True = real).
        - returns :class:`~geograph.RerankOutput` with ``scores``, ``order``, ``keep``,
          ``query_edge_length`` and ``query_edge_curvature``, all ``(B, N)``.

    Example:
        >>> from geograph.rerankers import RicciFiltration
        >>> g = torch.Generator().manual_seed(0)
        >>> q, docs = torch.randn(2, 8, generator=g), torch.randn(2, 6, 8, generator=g)
        >>> out = ricci_filtration(q, docs, iterations=5)
        >>> ref = RicciFiltration(iterations=5)(q, docs)
        >>> torch.equal(out.scores, ref.scores), torch.equal(out.query_edge_length, ref.query_edge_length)
        (True, True)
    """
    opts = check_ricci_options(
        percentile=percentile,
        alpha=alpha,
        exp_power=exp_power,
        iterations=iterations,
        step=step,
        delta=delta,
        eta=eta,
        solver=solver,
        reg=reg,
        cert_tol=cert_tol,
    )
    adj, node_mask, _ = query_graph(query, docs, mask, percentile=opts["percentile"])
    cand_mask = node_mask[:, 1:]
    solver = resolve_solver(opts["solver"], docs.device)
    dtype = torch.float64 if solver == "exact" else docs.dtype
    flow = ricci_flow(
        adj,
        torch.ones(adj.shape, dtype=dtype, device=docs.device),
        node_mask,
        iterations=opts["iterations"],
        step=opts["step"],
        delta=opts["delta"],
        alpha=opts["alpha"],
        exp_power=opts["exp_power"],
        solver=solver,
        reg=opts["reg"],
        cert_tol=opts["cert_tol"],
    )
    full_length = flow.lengths[:, 0, 1:]
    length = full_length.to(docs.dtype)
    keep = ricci_surgery(full_length, cand_mask, opts["eta"])  # decided at the flow's precision
    if scorer is not None:
        if query_texts is None or doc_texts is None:
            raise ValueError("a scorer is set: pass query_texts and doc_texts to forward")
        if len(query_texts) != docs.shape[0] or len(doc_texts) != docs.shape[0]:
            raise ValueError(f"expected {docs.shape[0]} query_texts and doc_texts lists")
        n = docs.shape[1]
        padded = [list(t) + [""] * (n - len(t)) for t in doc_texts]
        scores = scorer(list(query_texts), padded, keep.cpu()).to(device=docs.device, dtype=docs.dtype)
    else:
        scores = cosine_similarity(query.unsqueeze(1), docs, y_mask=cand_mask).squeeze(1)
    scores = torch.where(keep, scores, torch.full_like(scores, float("-inf")))
    return RerankOutput(
        scores=scores,
        order=order_by_score(scores),
        keep=keep,
        query_edge_length=length,
        query_edge_curvature=flow.curvature[:, 0, 1:].to(docs.dtype),
    )
