"""Ricci-Filtration: drop the candidates whose query edge the Ricci flow stretches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from geograph.methods.ricci.functional import RicciOptions, _filtration
from geograph.outputs import RerankOutput
from geograph.transport.curvature import resolve_solver

__all__ = ["RicciFiltration"]


class RicciFiltration(nn.Module):
    r"""Keep the candidates whose query edge survives the normalized Ricci flow.

    A thin holder of the hyperparameters: :meth:`forward` calls
    :func:`geograph.functional.ricci_filtration`'s body with :attr:`options` (the method's one home;
    bitwise the same result).
    Per query, the graph of :func:`~geograph.ops.adjacency.query_graph` (query + candidates, edges between
    dissimilar pairs, every query edge forced, unit lengths) flows ``iterations`` steps of
    :func:`~geograph.functional.ricci_flow`; candidate ``j`` is kept iff its final query-edge
    length ``w_0j <= eta`` (the surgery, :func:`~geograph.functional.ricci_surgery`). The kept candidates are then
    ordered by the
    ``scorer`` (a :class:`~geograph.CrossEncoderScorer` or any callable of that signature) or,
    by default, by cosine to the query; dropped candidates and padding score ``-inf``.

    Solver: ``"auto"`` (default) is ``"exact"`` for CPU inputs and ``"sinkhorn"`` otherwise.
    ``"exact"`` runs the whole flow of every graph in one compiled call (numba, float64, every
    edge of every graph in parallel over the cores: APSP, measures, Kantorovich-Rubinstein
    compaction and an exact transportation simplex warm-started from the edge's previous
    step), equal to GraphRicciCurvature within 1e-6; on the 2-core CPU it was also far faster
    than the batched Sinkhorn at every batch size measured (see ``geograph bench ricci`` and
    docs/methods/ricci.md), hence the CPU default. ``"sinkhorn"`` is the accelerator's path: every edge
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

    The defaults and the check of the hyperparameters are :class:`~geograph.methods.ricci.functional.RicciOptions`'
    (the Sinkhorn ones :class:`~geograph.functional.SinkhornOptions`'); they are the module's attributes.

    Shape:
        - query ``(B, D)``, docs ``(B, N, D)``, mask ``(B, N)`` bool (True = real).
        - output :class:`~geograph.RerankOutput` with ``scores``, ``order``, ``keep``,
          ``query_edge_length`` and ``query_edge_curvature``, all ``(B, N)`` (lengths and
          curvatures are 0 at padding).

    A single candidate (``N = 1`` or one real one) has one edge of curvature 1, which the
    flow shrinks to length 0: it is always kept.

    References:
        T. Qin, W.-M. Huang, Ricci-Filtration: Boosting Retrieval-Augmented Generation Reranker to
        Query-Answer Tasks by Discrete Ricci Flow, arXiv:2606.15482; C.-C. Ni et al., Community detection on
        networks with Ricci flow, Sci. Rep.
        2019.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> q, docs = torch.randn(2, 8, generator=g), torch.randn(2, 6, 8, generator=g)
        >>> out = RicciFiltration(iterations=5)(q, docs)
        >>> out.keep.shape, out.query_edge_length.dtype
        (torch.Size([2, 6]), torch.float32)
    """

    #: the hyperparameters, checked; each is also an attribute (``model.iterations``), and setting one
    #: checks it and replaces this object
    options: RicciOptions

    def __init__(
        self,
        *,
        percentile: float = RicciOptions.percentile,
        alpha: float = RicciOptions.alpha,
        exp_power: float = RicciOptions.exp_power,
        iterations: int = RicciOptions.iterations,
        step: float = RicciOptions.step,
        delta: float = RicciOptions.delta,
        eta: float = RicciOptions.eta,
        solver: str = RicciOptions.solver,
        reg: float = RicciOptions.reg,
        cert_tol: float | None = RicciOptions.cert_tol,
        scorer: Callable[..., Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.options = RicciOptions(
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
        self.scorer = scorer

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options")
        if options is not None and name in _OPTION_NAMES:
            return getattr(options, name)
        return super().__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OPTION_NAMES:
            object.__setattr__(self, "options", replace(self.options, **{name: value}))
        else:
            super().__setattr__(name, value)

    def resolved_solver(self, device: torch.device) -> str:
        """The solver ``"auto"`` stands for on ``device``."""
        return resolve_solver(self.options.solver, device)

    def forward(
        self,
        query: Tensor,
        docs: Tensor,
        mask: Tensor | None = None,
        *,
        query_texts: Sequence[str] | None = None,
        doc_texts: Sequence[Sequence[str]] | None = None,
    ) -> RerankOutput:
        return _filtration(
            query, docs, mask, self.options, scorer=self.scorer, query_texts=query_texts, doc_texts=doc_texts
        )

    def extra_repr(self) -> str:
        o = self.options
        return (
            f"percentile={o.percentile}, alpha={o.alpha}, exp_power={o.exp_power}, "
            f"iterations={o.iterations}, eta={o.eta}, solver={o.solver!r}"
        )


#: the hyperparameters a :class:`RicciFiltration` holds (:class:`RicciOptions`)
_OPTION_NAMES = frozenset(f.name for f in fields(RicciOptions))
