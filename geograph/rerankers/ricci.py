"""Ricci-Filtration: drop the candidates whose query edge the Ricci flow stretches."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from geograph._checks import check_cert_tol, check_finite_float, check_percentile, check_positive_int, check_unit_interval
from geograph.functional.flow import check_step, ricci_flow
from geograph.functional.graphs import query_graph
from geograph.functional.similarity import cosine_similarity
from geograph.outputs import RerankOutput, order_by_score

__all__ = ["RicciFiltration"]

_SOLVERS = ("auto", "exact", "sinkhorn")


class RicciFiltration(nn.Module):
    r"""Keep the candidates whose query edge survives the normalized Ricci flow.

    Per query, the graph of :func:`~geograph.functional.graphs.query_graph` (query + candidates, edges between
    dissimilar pairs, every query edge forced, unit lengths) flows ``iterations`` steps of
    :func:`~geograph.functional.ricci_flow`; candidate ``j`` is kept iff its final query-edge
    length ``w_0j <= eta`` (the surgery). The kept candidates are then ordered by the
    ``scorer`` (a :class:`~geograph.CrossEncoderScorer` or any callable of that signature) or,
    by default, by cosine to the query; dropped candidates and padding score ``-inf``.

    Solver: ``"auto"`` (default) is ``"exact"`` for CPU inputs and ``"sinkhorn"`` otherwise.
    ``"exact"`` runs the whole flow of every graph in one compiled call (numba, float64, every
    edge of every graph in parallel over the cores: APSP, measures, Kantorovich-Rubinstein
    compaction and an exact transportation simplex warm-started from the edge's previous
    step), equal to GraphRicciCurvature within 1e-6; on the 2-core CPU it was also far faster
    than the batched Sinkhorn at every batch size measured (see ``geograph bench ricci`` and
    the README), hence the CPU default. ``"sinkhorn"`` is the accelerator's path: every edge
    of every graph in one batched log-domain Sinkhorn per step, with a certified per-edge error bound (c-transform
    dual and rounded plan); edges whose bound exceeds ``cert_tol`` are re-solved exactly on
    the CPU (one host transfer per step), so each curvature is within ``cert_tol`` of exact.

    Precision: the flow runs in float64 inside for ``"exact"`` and in the input's dtype for
    ``"sinkhorn"`` (its certificate in float64); lengths and curvatures come back in the
    input's floating dtype.

    Compilation: runs under ``torch.compile`` with graph breaks and the same output (tested).
    It cannot be captured whole or exported: the exact path calls compiled numba code on
    numpy arrays, the certified re-solve reads which edges to re-solve, and the query graph's
    edges are a data-dependent set.

    Args:
        percentile: percentile of the dissimilarities that sets the edge threshold ``tau``.
        alpha: lazy mass of the Ollivier-Ricci measures.
        exp_power: exponent of the measures.
        iterations: flow steps.
        step: flow step size.
        delta: per-graph early-stop threshold on the curvature spread.
        eta: surgery threshold on the flowed query-edge length.
        solver: ``"auto"``, ``"exact"`` or ``"sinkhorn"``.
        reg: relative entropic regularisation (Sinkhorn only).
        cert_tol: Sinkhorn only: certified curvature error above which an edge is re-solved
            exactly; ``None`` = purely entropic (no host transfer per step).
        scorer: orders the kept candidates; needs the texts in :meth:`forward`.

    Shape:
        - query ``(B, D)``, docs ``(B, N, D)``, mask ``(B, N)`` bool (True = real).
        - output :class:`~geograph.RerankOutput` with ``scores``, ``order``, ``keep``,
          ``query_edge_length`` and ``query_edge_curvature``, all ``(B, N)`` (lengths and
          curvatures are 0 at padding).

    A single candidate (``N = 1`` or one real one) has one edge of curvature 1, which the
    flow shrinks to length 0: it is always kept.

    References:
        T. Qin, W.-M. Huang, Ricci-Filtration: Boosting Retrieval-Augmented Generation Reranker to
        Query-Answer Tasks by Discrete Ricci Flow, arXiv:2606.15482; C.-C. Ni et al., Community detection on networks with Ricci flow, Sci. Rep.
        2019.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> q, docs = torch.randn(2, 8, generator=g), torch.randn(2, 6, 8, generator=g)
        >>> out = RicciFiltration(iterations=5)(q, docs)
        >>> out.keep.shape, out.query_edge_length.dtype
        (torch.Size([2, 6]), torch.float32)
    """

    def __init__(
        self,
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
        cert_tol: Optional[float] = 1e-3,
        scorer: Optional[Callable[..., Tensor]] = None,
    ) -> None:
        super().__init__()
        self.percentile = check_percentile(percentile)
        if solver not in _SOLVERS:
            raise ValueError(f"solver must be one of {_SOLVERS}, got {solver!r}")
        self.eta = check_finite_float(eta, "eta")
        if not self.eta >= 0:
            raise ValueError(f"eta must be non-negative, got {eta!r}")
        self.alpha = check_unit_interval(alpha, "alpha")
        self.exp_power = check_finite_float(exp_power, "exp_power")
        self.iterations = check_positive_int(iterations, "iterations")
        self.step = check_step(step)
        self.delta = check_finite_float(delta, "delta")
        if not self.delta >= 0:
            raise ValueError(f"delta must be non-negative, got {delta!r}")
        self.solver = solver
        self.reg = check_finite_float(reg, "reg")
        if not self.reg > 0:
            raise ValueError(f"reg must be positive, got {reg!r}")
        self.cert_tol = check_cert_tol(cert_tol)
        self.scorer = scorer

    def resolved_solver(self, device: torch.device) -> str:
        """The solver ``"auto"`` stands for on ``device``."""
        if self.solver != "auto":
            return self.solver
        return "exact" if torch.device(device).type == "cpu" else "sinkhorn"

    def forward(
        self,
        query: Tensor,
        docs: Tensor,
        mask: Optional[Tensor] = None,
        *,
        query_texts: Optional[Sequence[str]] = None,
        doc_texts: Optional[Sequence[Sequence[str]]] = None,
    ) -> RerankOutput:
        adj, node_mask, _ = query_graph(query, docs, mask, percentile=self.percentile)
        cand_mask = node_mask[:, 1:]
        solver = self.resolved_solver(docs.device)
        dtype = torch.float64 if solver == "exact" else docs.dtype
        flow = ricci_flow(
            adj, torch.ones(adj.shape, dtype=dtype, device=docs.device), node_mask, iterations=self.iterations,
            step=self.step, delta=self.delta, alpha=self.alpha, exp_power=self.exp_power, solver=solver, reg=self.reg,
            cert_tol=self.cert_tol,
        )
        full_length = flow.lengths[:, 0, 1:]
        length = full_length.to(docs.dtype)
        keep = cand_mask & (full_length <= self.eta)  # decided at the flow's precision
        if self.scorer is not None:
            if query_texts is None or doc_texts is None:
                raise ValueError("a scorer is set: pass query_texts and doc_texts to forward")
            if len(query_texts) != docs.shape[0] or len(doc_texts) != docs.shape[0]:
                raise ValueError(f"expected {docs.shape[0]} query_texts and doc_texts lists")
            n = docs.shape[1]
            padded = [list(t) + [""] * (n - len(t)) for t in doc_texts]
            scores = self.scorer(list(query_texts), padded, keep.cpu()).to(device=docs.device, dtype=docs.dtype)
        else:
            scores = cosine_similarity(query.unsqueeze(1), docs, y_mask=cand_mask).squeeze(1)
        scores = torch.where(keep, scores, torch.full_like(scores, float("-inf")))
        return RerankOutput(
            scores=scores, order=order_by_score(scores), keep=keep,
            query_edge_length=length, query_edge_curvature=flow.curvature[:, 0, 1:].to(docs.dtype),
        )

    def extra_repr(self) -> str:
        return (
            f"percentile={self.percentile}, alpha={self.alpha}, exp_power={self.exp_power}, "
            f"iterations={self.iterations}, eta={self.eta}, solver={self.solver!r}"
        )
