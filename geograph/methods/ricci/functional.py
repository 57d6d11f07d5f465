"""Ricci-Filtration: flow each query graph, keep the candidates whose query edge stays short."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TypedDict, Unpack

import torch
from torch import Tensor

from geograph.ops.adjacency import query_graph
from geograph.ops.similarity import cosine_similarity
from geograph.outputs import RerankOutput, order_by_score
from geograph.spec import POS_INT, UNIT, Param, check_values
from geograph.transport.curvature import resolve_solver
from geograph.transport.flow import ricci_flow
from geograph.transport.solvers import SinkhornOptions

__all__ = ["ricci_filtration", "ricci_surgery", "RicciOptions", "RICCI_PARAMS"]

#: Ricci-Filtration's hyperparameters and their bounds: the registry's (``spec.SPEC.params``) and
#: :class:`RicciOptions`' one check
RICCI_PARAMS = (
    Param("percentile", float, low=0.0, high=100.0, doc="percentile of 1 - cos above which pairs are edges"),
    Param("alpha", float, **UNIT, doc="the lazy measures' mass kept at the node"),
    Param("exp_power", float, doc="p in exp(-w^p) of the neighbours' mass"),
    Param("iterations", int, **POS_INT, doc="steps of the normalised Ricci flow"),
    Param("step", float, low=0.0, high=1.0, low_open=True, doc="step size of the flow"),
    Param("delta", float, low=0.0, doc="a graph stops once max kappa - min kappa < delta"),
    Param("eta", float, low=0.0, doc="the surgery keeps a candidate iff its query edge <= eta"),
    Param("solver", str, choices=("auto", "exact", "sinkhorn"), doc="W1 solver"),
    Param("reg", float, low=0.0, low_open=True, doc="Sinkhorn's entropic regularisation"),
    Param("cert_tol", float, low=0.0, optional=True, doc="Sinkhorn edges above this bound are re-solved"),
)


@dataclass(frozen=True)
class RicciOptions:
    """Ricci-Filtration's hyperparameters: their defaults (those of :func:`ricci_filtration` and
    :class:`~geograph.RicciFiltration`) and their check (:data:`RICCI_PARAMS`, in the registry's
    wording), normalised on construction (floats as ``float``)."""

    percentile: float = 50.0
    alpha: float = 0.5
    exp_power: float = 2
    iterations: int = 20
    step: float = 1.0
    delta: float = 1e-4
    eta: float = 1.0
    solver: str = "auto"
    reg: float = SinkhornOptions.reg
    cert_tol: float | None = SinkhornOptions.cert_tol

    def __post_init__(self) -> None:
        for name, value in check_values(RICCI_PARAMS, asdict(self)).items():
            object.__setattr__(self, name, value)

    def flow_keywords(self) -> FlowKeywords:
        """The discrete Ricci flow's own hyperparameters, as the flow functions take them."""
        return FlowKeywords(
            iterations=self.iterations, step=self.step, delta=self.delta, alpha=self.alpha, exp_power=self.exp_power
        )


class FlowKeywords(TypedDict):
    """The flow's hyperparameters of :class:`RicciOptions` (:meth:`RicciOptions.flow_keywords`)."""

    iterations: int
    step: float
    delta: float
    alpha: float
    exp_power: float


class RicciKeywords(TypedDict, total=False):
    """:class:`RicciOptions` as keyword arguments (``**options: Unpack[RicciKeywords]``)."""

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
    scorer: Callable[..., Tensor] | None = None,
    query_texts: Sequence[str] | None = None,
    doc_texts: Sequence[Sequence[str]] | None = None,
    **options: Unpack[RicciKeywords],
) -> RerankOutput:
    r"""Ricci-Filtration of a padded batch of candidates: the function :class:`~geograph.RicciFiltration` calls.

    Per query: the graph of :func:`~geograph.functional.query_graph` (query + candidates,
    unit lengths) flows ``iterations`` steps of :func:`~geograph.functional.ricci_flow`
    (float64 for the ``"exact"`` solver, the input's dtype for ``"sinkhorn"``); candidate ``j``
    is kept by :func:`ricci_surgery` (``w_0j <= eta``, at the flow's precision). The kept
    candidates are scored by ``scorer(query_texts, padded_doc_texts, keep)`` when given (the
    texts are then required), else by cosine to the query; the others score ``-inf``. See
    :class:`~geograph.RicciFiltration` for the arguments (``**options``: :class:`RicciOptions`,
    the defaults there), the solvers and precision.

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
    return _filtration(
        query, docs, mask, RicciOptions(**options), scorer=scorer, query_texts=query_texts, doc_texts=doc_texts
    )


def _filtration(
    query: Tensor,
    docs: Tensor,
    mask: Tensor | None,
    opts: RicciOptions,
    *,
    scorer: Callable[..., Tensor] | None = None,
    query_texts: Sequence[str] | None = None,
    doc_texts: Sequence[Sequence[str]] | None = None,
) -> RerankOutput:
    """:func:`ricci_filtration` with its hyperparameters as one checked :class:`RicciOptions` (what
    :class:`~geograph.RicciFiltration` holds)."""
    adj, node_mask, _ = query_graph(query, docs, mask, percentile=opts.percentile)
    cand_mask = node_mask[:, 1:]
    solver = resolve_solver(opts.solver, docs.device)
    dtype = torch.float64 if solver == "exact" else docs.dtype
    flow = ricci_flow(
        adj,
        torch.ones(adj.shape, dtype=dtype, device=docs.device),
        node_mask,
        **opts.flow_keywords(),
        solver=solver,
        reg=opts.reg,
        cert_tol=opts.cert_tol,
    )
    full_length = flow.lengths[:, 0, 1:]
    length = full_length.to(docs.dtype)
    keep = ricci_surgery(full_length, cand_mask, opts.eta)  # decided at the flow's precision
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
