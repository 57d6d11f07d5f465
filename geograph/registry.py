"""The method registry: one declaration per method, read by everything that offers the methods.

Each :class:`MethodSpec` says what a method is (its :class:`~torch.nn.Module` and functional twin,
reranker or retriever, its paper), what a configuration may set (the constructor parameters with
their bounds; defaults come from the constructor's signature, the one place they are written),
how to build it over a corpus, the range of its scores and how they map onto a relevance in
[0, 1], what a server worker warms up before it reports ready, and the slow reference the
benchmark times it against. The server (``geograph serve --method``), the benchmark
(``geograph bench run``), the text-first API, the framework integrations and the tests'
parametrisation all iterate over :data:`METHODS`; adding a method is one entry here next to its
functional file, its module and its tests.

Example:
    >>> from geograph.registry import METHODS, get
    >>> sorted(METHODS)
    ['dense', 'g3', 'iso', 'maniscope', 'ricci']
    >>> spec = get("maniscope")
    >>> spec.kind, spec.module.__name__, spec.defaults()
    ('reranker', 'Maniscope', {'k': 5, 'alpha': 0.3, 'early_stop': True})
    >>> spec.param("alpha").describe()
    'a float in [0, 1]'
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, cast

import torch
from torch import Tensor, nn

from geograph.functional.g3 import g3_retrieve
from geograph.functional.iso import iso_retrieve
from geograph.functional.maniscope import maniscope_scores
from geograph.functional.ricci import ricci_filtration
from geograph.graphs import CorpusGraph, G3Graph
from geograph.rerankers import Maniscope, RicciFiltration
from geograph.retrievers import DenseRetriever, G3Retriever, ISORetriever

__all__ = ["Param", "MethodSpec", "METHODS", "RERANKERS", "RETRIEVERS", "get", "names", "linear_relevance"]

Kind = Literal["reranker", "retriever"]
_NO_DEFAULT = inspect.Parameter.empty


@dataclass(frozen=True)
class Param:
    """One parameter a configuration may set, with the values it accepts.

    Attributes:
        name: the keyword (a constructor argument, or a build parameter of the corpus structure).
        type: ``int``, ``float``, ``bool``, ``str`` or ``tuple`` (a ``(lo, hi)`` pair of floats).
        low, high: bounds of a number (``None``: unbounded on that side).
        low_open, high_open: whether ``low`` / ``high`` themselves are excluded.
        choices: the accepted strings (of a ``str`` parameter, or besides the numbers of an ``int``
            parameter, e.g. ``nprobe``: an integer or ``"auto"``).
        optional: ``None`` is accepted as well.
        default: the default of a parameter that is not a constructor argument (a build parameter);
            constructor arguments take theirs from the signature (:meth:`MethodSpec.defaults`).
        doc: one line on what it does.
    """

    name: str
    type: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    optional: bool = False
    default: Any = _NO_DEFAULT
    doc: str = ""

    def describe(self) -> str:
        """The accepted values in words, as error messages and docs print them.

        Example:
            >>> Param("k", int, low=1).describe(), Param("step", float, low=0, high=1, low_open=True).describe()
            ('an integer >= 1', 'a float in (0, 1]')
        """
        if self.type is str:
            text = f"one of {', '.join(self.choices or ())}"
        elif self.type is bool:
            text = "true or false"
        elif self.type is tuple:
            text = "a pair [lo, hi] with -1 <= lo < hi <= 1"
        else:
            noun = "an integer" if self.type is int else "a float"
            lo, hi = _num(self.low), _num(self.high)
            if self.low is not None and self.high is not None:
                text = f"{noun} in {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"
            elif self.low is not None:
                text = f"{noun} {'>' if self.low_open else '>='} {lo}"
            elif self.high is not None:
                text = f"{noun} {'<' if self.high_open else '<='} {hi}"
            else:
                text = f"a finite {noun[2:] if noun.startswith('a ') else noun[3:]}"
        if self.choices is not None and self.type is not str:
            text = f"{text} or one of {', '.join(self.choices)}"
        return f"{text} or null" if self.optional else text

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is one of the accepted values (type and bounds).

        Example:
            >>> p = Param("alpha", float, low=0, high=1)
            >>> p.accepts(0.5), p.accepts(1.5), p.accepts(float("nan")), p.accepts(True)
            (True, False, False, False)
        """
        if value is None:
            return self.optional
        if isinstance(value, str) or self.type is str:
            return isinstance(value, str) and value in (self.choices or ())
        if self.type is bool:
            return isinstance(value, bool)
        if self.type is tuple:
            try:
                lo, hi = (float(x) for x in value)
            except (TypeError, ValueError):
                return False
            return -1.0 <= lo < hi <= 1.0
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.type is int and not isinstance(value, int):
            return False
        x = float(value)
        if not math.isfinite(x):
            return False
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return not (self.high is not None and (x >= self.high if self.high_open else x > self.high))

    def check(self, value: Any, where: str = "params") -> Any:
        """``value`` if accepted, else a one-line ``ValueError`` naming the parameter and its range.

        Example:
            >>> try:
            ...     Param("k", int, low=1).check(0)
            ... except ValueError as e:
            ...     print(e)
            params: k must be an integer >= 1, got 0
        """
        if not self.accepts(value):
            raise ValueError(f"{where}: {self.name} must be {self.describe()}, got {value!r}")
        return value


def _num(x: float | None) -> str:
    return "inf" if x is not None and math.isinf(x) else f"{x:g}" if x is not None else ""


@dataclass(frozen=True)
class MethodSpec:
    """Everything the applications need to know about one method.

    Attributes:
        name: the key (``geograph serve --method NAME``, ``Ranker(NAME)``, bench configs).
        label: the name tables print.
        kind: ``"reranker"`` (``module(query (B, D), docs (B, N, D), mask)`` -> ``RerankOutput``) or
            ``"retriever"`` (``module(query (B, D), k)`` -> ``RetrievalOutput`` over a corpus).
        module: the :class:`~torch.nn.Module` class.
        functional: its functional twin (returns what the module returns), ``None`` for a baseline.
        paper: the paper by title and arXiv id or venue (``None`` for a baseline).
        params: the constructor parameters a configuration may set, with their bounds.
        build_params: parameters of the corpus structure a retriever builds at start (fixed by a
            saved graph: a configuration that names a graph may not set them).
        not_params: keyword-only constructor arguments a configuration cannot hold (a callable, an
            artefact given by its own key).
        graph: the saved artefact type a retriever may load instead of building (``None``: none).
        projection: whether a trained :class:`~geograph.PoincareProjection` may be given.
        warmup: what a server worker prepares before it reports ready (``"numba"``: the compiled
            exact transport kernels, :func:`geograph.functional.warmup`).
        score_range: ``module -> (lo, hi)``, the range of a reranker's scores.
        k_range: ``(module, corpus size) -> (k_min, k_max or None, why)`` of a retriever's ``k``.
        build: ``(corpus (V, D), params, graph, projection) -> module`` on the corpus's device.
        reference: ``"module:function"`` of the slow reference the benchmark times (``None``: none).
        reference_name: the reference's name in the benchmark's table.
        baseline: a comparison row (dense), not one of the geometric methods.
        about: what the method does and its formula, in a few lines of Markdown (its page under
            ``docs/methods/`` is generated from the entry: ``python -m geograph.commands.method_pages``).
        example: one line of Python with the method, as its page shows it.
    """

    name: str
    label: str
    kind: Kind
    module: type[nn.Module]
    functional: Callable[..., Any] | None
    paper: str | None
    params: tuple[Param, ...]
    build: Callable[..., nn.Module]
    build_params: tuple[Param, ...] = ()
    not_params: tuple[str, ...] = ()
    graph: type[nn.Module] | None = None
    projection: bool = False
    warmup: tuple[str, ...] = ()
    score_range: Callable[[nn.Module], tuple[float, float]] | None = None
    k_range: Callable[[nn.Module, int], tuple[int, int | None, str]] | None = None
    reference: str | None = None
    reference_name: str | None = None
    baseline: bool = False
    about: str = ""
    example: str = ""
    _by_name: dict[str, Param] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.params + self.build_params})

    @property
    def is_reranker(self) -> bool:
        return self.kind == "reranker"

    def param(self, name: str) -> Param:
        """The declaration of parameter ``name`` (``KeyError`` if the method has none)."""
        return self._by_name[name]

    def param_names(self) -> tuple[str, ...]:
        """Every key a configuration's ``params`` may hold: build parameters first, then the constructor's."""
        return tuple(p.name for p in self.build_params + self.params)

    def defaults(self) -> dict[str, Any]:
        """The default of every parameter: the constructor's signature, and the build parameters' own.

        Example:
            >>> get("iso").defaults()["knn"], get("iso").defaults()["beta"]
            (10, 0.4)
        """
        sig = inspect.signature(self.module.__init__).parameters
        out = {}
        for p in self.build_params + self.params:
            out[p.name] = sig[p.name].default if p.name in sig else p.default
        return out

    def check_params(self, params: Mapping[str, Any], *, graph: object | None = None, where: str = "params") -> None:
        """Raise a one-line ``ValueError`` on an unknown key, a value out of bounds, or a build
        parameter next to a saved ``graph`` (whose build fixed it). Relations between parameters
        (e.g. ``max_nodes >= m``) are the module's own check.

        Example:
            >>> try:
            ...     get("maniscope").check_params({"beta": 0.4})
            ... except ValueError as e:
            ...     print(e)
            params: unknown key 'beta' for method maniscope (allowed: k, alpha, early_stop)
        """
        allowed = self.param_names()
        for key, value in params.items():
            if key not in allowed:
                raise ValueError(f"{where}: unknown key {key!r} for method {self.name} (allowed: {', '.join(allowed)})")
            if graph is not None and any(p.name == key for p in self.build_params):
                raise ValueError(f"{where}: {key} is fixed by the saved graph ({graph}); remove it")
            self._by_name[key].check(value, where)

    def create(
        self,
        corpus: Tensor | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        graph: nn.Module | None = None,
        projection: nn.Module | None = None,
    ) -> nn.Module:
        """The module with ``params`` (checked first); a retriever over ``corpus (V, D)`` or a loaded ``graph``.

        Example:
            >>> get("maniscope").create(params={"k": 3})
            Maniscope(k=3, alpha=0.3)
        """
        params = dict(params or {})
        self.check_params(params, graph=graph)
        if graph is not None and self.graph is None:
            raise ValueError(f"graph applies to {', '.join(names(with_graph=True))}, not {self.name}")
        # (self.graph is not None here: a method without one raised above)
        if graph is not None and not isinstance(graph, self.graph):  # type: ignore[arg-type]
            raise ValueError(
                f"graph: method {self.name} takes a {self.graph.__name__}, got {type(graph).__name__}"  # type: ignore[union-attr]
            )
        if projection is not None and not self.projection:
            raise ValueError(
                f"projection applies to {', '.join(s.name for s in METHODS.values() if s.projection)}, not {self.name}"
            )
        if self.kind == "retriever" and corpus is None and graph is None:
            raise ValueError(f"method {self.name} retrieves from a corpus: give corpus (V, D) embeddings or a graph")
        return self.build(corpus, params, graph, projection)

    def relevance(self, scores: Tensor, module: nn.Module) -> Tensor:
        """A reranker's ``scores`` mapped linearly from :attr:`score_range` onto [0, 1] (clamped
        against rounding); ``-inf`` (dropped or padded) maps to 0.

        Example:
            >>> spec = get("maniscope")
            >>> spec.relevance(torch.tensor([-0.3, 0.35, 1.0]), spec.create(params={"alpha": 0.3})).tolist()
            [0.0, 0.5, 1.0]
        """
        if self.score_range is None:
            raise ValueError(f"method {self.name} is a {self.kind}: it has no score range")
        return linear_relevance(scores, *self.score_range(module))


def linear_relevance(scores: Tensor, lo: float, hi: float) -> Tensor:
    """``scores`` mapped linearly from ``[lo, hi]`` onto [0, 1], clamped against rounding (``-inf``: 0):
    the one relevance mapping of :class:`geograph.Ranker` and of the server's rerank endpoints."""
    return ((scores - lo) / (hi - lo)).clamp(0.0, 1.0)


# --- the entries -----------------------------------------------------------------------------


class _Bounds(TypedDict, total=False):
    """Bounds shared by several :class:`Param` declarations."""

    low: float
    high: float


_UNIT: _Bounds = dict(low=0.0, high=1.0)
_POS_INT: _Bounds = dict(low=1)


def _build_maniscope(
    corpus: Tensor | None, params: Mapping[str, Any], graph: nn.Module | None, projection: nn.Module | None
) -> nn.Module:
    return Maniscope(**params)


def _build_ricci(
    corpus: Tensor | None, params: Mapping[str, Any], graph: nn.Module | None, projection: nn.Module | None
) -> nn.Module:
    return RicciFiltration(**params)


def _build_iso(
    corpus: Tensor | None, params: Mapping[str, Any], graph: CorpusGraph | None, projection: nn.Module | None
) -> nn.Module:
    params = dict(params)
    knn = params.pop("knn", 10)
    if graph is None:
        corpus = cast(Tensor, corpus)  # create() checked: a corpus or a graph is given
        graph = CorpusGraph.from_knn(corpus, min(knn, corpus.shape[0] - 1))
    if projection is not None and projection.in_dim != graph.embeddings.shape[1]:
        raise ValueError(
            f"projection: takes {projection.in_dim}-dimensional inputs, the corpus has {graph.embeddings.shape[1]}"
        )
    model = ISORetriever(graph, projection=projection, **params)
    return model if corpus is None else model.to(corpus.device)


def _build_g3(
    corpus: Tensor | None, params: Mapping[str, Any], graph: G3Graph | None, projection: nn.Module | None
) -> nn.Module:
    params = dict(params)
    if "candidates" not in params:  # the default pool, not a configured one, shrinks to a small corpus
        size = graph.num_nodes if graph is not None else cast(Tensor, corpus).shape[0]
        params["candidates"] = min(inspect.signature(G3Retriever.__init__).parameters["candidates"].default, size)
    if graph is not None:
        model = G3Retriever(graph, **params)
        return model if corpus is None else model.to(corpus.device)
    if params.get("band") is not None:
        params["band"] = tuple(params["band"])
    with torch.no_grad():
        return G3Retriever(cast(Tensor, corpus), **params)  # create() checked: a corpus or a graph is given


def _build_dense(
    corpus: Tensor, params: Mapping[str, Any], graph: nn.Module | None, projection: nn.Module | None
) -> nn.Module:
    return DenseRetriever(corpus, **params)


def _maniscope_range(model: nn.Module) -> tuple[float, float]:
    # alpha * cos + (1 - alpha) / (1 + d_geo): cos in [-1, 1], the geodesic term in [0, 1]
    return -float(cast(Maniscope, model).alpha), 1.0


def _cosine_range(model: nn.Module) -> tuple[float, float]:
    return -1.0, 1.0


def _iso_k(model: nn.Module, num_docs: int) -> tuple[int, int | None, str]:
    return 1, int(cast(ISORetriever, model).max_k), "the guaranteed ISO local set size min(max(L, m), max_nodes, V)"


def _g3_k(model: nn.Module, num_docs: int) -> tuple[int, int | None, str]:
    return int(cast(G3Retriever, model).seeds), num_docs, "the corpus size"


def _dense_k(model: nn.Module, num_docs: int) -> tuple[int, int | None, str]:
    return 1, num_docs, "the corpus size"


_SPECS = (
    MethodSpec(
        name="maniscope",
        label="Maniscope",
        kind="reranker",
        module=Maniscope,
        functional=maniscope_scores,
        paper="W. G. Gong, Reranker Optimization via Geodesic Distances on k-NN Manifolds, arXiv:2602.15860, TMLR 2026",
        params=(
            Param("k", int, **_POS_INT, doc="neighbours per candidate in the k-NN graph"),
            Param("alpha", float, **_UNIT, doc="weight of the cosine against the geodesic similarity"),
            Param("early_stop", bool, doc="stop the relaxation once no distance changes (one check every 4 steps)"),
        ),
        build=_build_maniscope,
        score_range=_maniscope_range,
        reference="geograph.bench.reference:maniscope_ranker_reference",
        reference_name="sklearn + scipy Dijkstra",
        about="""Reranks the top-M dense candidates of a query by geodesic distance on their k-NN graph, mixed
with cosine. Each candidate links to its `k` nearest other candidates (undirected, length `1 - cos`);
the anchor is the candidate closest to the query; `d_geo` is the shortest-path distance from it.

    score_j = alpha * cos(q, c_j) + (1 - alpha) / (1 + d_geo(anchor, c_j))      (0 when unreachable)

Scores lie in `[-alpha, 1]`; the relevance in [0, 1] is `(score + alpha) / (1 + alpha)`.""",
        example='ranked = geograph.Ranker("maniscope", k=5, alpha=0.3).rank(query, documents, top_k=5)',
    ),
    MethodSpec(
        name="ricci",
        label="Ricci-Filtration",
        kind="reranker",
        module=RicciFiltration,
        functional=ricci_filtration,
        paper="Ricci-Filtration: Boosting Retrieval-Augmented Generation Reranker to Query-Answer Tasks by "
        "Discrete Ricci Flow, arXiv:2606.15482",
        params=(
            Param("percentile", float, low=0.0, high=100.0, doc="percentile of 1 - cos above which pairs are edges"),
            Param("alpha", float, **_UNIT, doc="the lazy measures' mass kept at the node"),
            Param("exp_power", float, doc="p in exp(-w^p) of the neighbours' mass"),
            Param("iterations", int, **_POS_INT, doc="steps of the normalised Ricci flow"),
            Param("step", float, low=0.0, high=1.0, low_open=True, doc="step size of the flow"),
            Param("delta", float, low=0.0, doc="a graph stops once max kappa - min kappa < delta"),
            Param("eta", float, low=0.0, doc="the surgery keeps a candidate iff its query edge <= eta"),
            Param("solver", str, choices=("auto", "exact", "sinkhorn"), doc="W1 solver"),
            Param("reg", float, low=0.0, low_open=True, doc="Sinkhorn's entropic regularisation"),
            Param("cert_tol", float, low=0.0, optional=True, doc="Sinkhorn edges above this bound are re-solved"),
        ),
        not_params=("scorer",),
        build=_build_ricci,
        warmup=("numba",),
        score_range=_cosine_range,
        reference="geograph.bench.reference:ricci_ranker_reference",
        reference_name="GraphRicciCurvature 0.6.1",
        about="""Drops candidates whose query edge is stretched by the normalised discrete Ricci flow. Graph per
query: the query and its candidates, `r_ij = 1 - cos`, an edge where `r_ij` is at or above the
`percentile`-th percentile (query edges forced). Ollivier-Ricci curvature with lazy measures
(`alpha`, `exp_power`), then `iterations` flow steps

    w <- w - step * kappa * w,   rescaled to mean length 1,

stopping once `max kappa - min kappa < delta`; a candidate is kept iff its final query-edge length
is at most `eta`. Kept candidates are ordered by cosine (scores in `[-1, 1]`, relevance
`(cos + 1) / 2`); the dropped ones are listed apart (`RankedResults.dropped`).""",
        example='ranked = geograph.Ranker("ricci").rank(query, documents)  # ranked.dropped: the positions it removed',
    ),
    MethodSpec(
        name="iso",
        label="ISO-RAG",
        kind="retriever",
        module=ISORetriever,
        functional=iso_retrieve,
        paper="ISO-RAG: Isoperimetric Noise Control for Retrieval-Augmented Generation",
        params=(
            Param("m", int, **_POS_INT, doc="seeds per query"),
            Param("L", int, **_POS_INT, doc="dense candidates in the local set"),
            Param("hops", int, low=0, doc="graph hops from the seeds into the local set"),
            Param("max_nodes", int, **_POS_INT, doc="cap on the local set (at least m)"),
            Param("beta", float, **_UNIT, doc="an edge is kept iff min(phi) / max(phi) >= beta"),
            Param("p", float, doc="the volume's power of the conformal factor"),
            Param("tau", float, doc="temperature of the personalisation softmax"),
            Param("alpha", float, low=0.0, high=1.0, high_open=True, doc="PageRank's continuation probability"),
            Param("lambda_g", float, doc="weight of the graph score"),
            Param("lambda_d", float, doc="weight of the dense score"),
            Param("max_iter", int, **_POS_INT, doc="PageRank power iterations"),
        ),
        build_params=(Param("knn", int, **_POS_INT, default=10, doc="k of the k-NN corpus graph built at start"),),
        not_params=("projection",),
        graph=CorpusGraph,
        projection=True,
        build=_build_iso,
        k_range=_iso_k,
        reference="geograph.bench.reference:iso_ranker_reference",
        reference_name="numpy + networkx PageRank",
        about="""Prunes corpus-graph edges by a hyperbolic Cheeger ratio, then runs personalised PageRank on a
query-local subgraph. `phi_u = V(dS_u) / V(S_u)` with volumes `lambda(z)^p` of the (optionally
projected) points in the Poincare ball; an edge is kept iff `min(phi_u, phi_v) / max(phi_u, phi_v) >= beta`.
Per query: `m` seeds, the top-`L` dense passages and the `hops`-hop neighbourhood (at most
`max_nodes`), `pi = (1 - alpha) r + alpha W pi` with `r = softmax(tau * s)` on the seeds, and

    score = lambda_g * minmax(pi) + lambda_d * minmax(s)

`knn` is the k of the k-NN corpus graph built when no saved graph is given.""",
        example='passages = geograph.Retriever("iso", corpus=texts, knn=10).retrieve(query, k=5)',
    ),
    MethodSpec(
        name="g3",
        label="G3RAG",
        kind="retriever",
        module=G3Retriever,
        functional=g3_retrieve,
        paper="G3RAG: Beyond Similarity through Zero-Token Geometric Graphs for Multi-Hop RAG",
        params=(
            Param("candidates", int, **_POS_INT, doc="dense candidates per query"),
            Param("seeds", int, **_POS_INT, doc="seeds kept per query (at most candidates)"),
        ),
        build_params=(
            Param("band", tuple, optional=True, doc="cosine band of the gain edges (null: every pair)"),
            Param("beta", float, doc="density penalty exp(-beta rho) on the edge's target"),
            Param("max_degree", int, **_POS_INT, optional=True, doc="strongest edges kept per row (null: all)"),
        ),
        graph=G3Graph,
        build=_build_g3,
        k_range=_g3_k,
        reference="geograph.bench.reference:g3_ranker_reference",
        reference_name="dense numpy T",
        about="""Builds a zero-token geometric gain graph over the corpus and diffuses one step from seed
passages. For `x = S_ij` inside `band`: `W_ij = x sqrt(1 - x^2) exp(-beta rho_j)` (`rho` the
normalised density), at most `max_degree` edges a row, `T` = row-normalised `W`. Per query: the
dense top-`candidates`, `seeds` of them as seeds, `y = p T` one step from the uniform seed vector,
the seeds first, then the best of `y`.""",
        example='passages = geograph.Retriever("g3", corpus=texts).retrieve(query, k=5)',
    ),
    MethodSpec(
        name="dense",
        label="dense",
        kind="retriever",
        module=DenseRetriever,
        functional=None,
        paper=None,
        params=(
            Param("chunk_size", int, **_POS_INT, doc="corpus rows scored at a time"),
            Param("index", str, choices=("exact", "ivf", "auto"), doc="exact scan or an IVF-Flat index"),
            Param("nlist", int, **_POS_INT, optional=True, doc="IVF lists (null: by corpus size)"),
            Param("nprobe", int, **_POS_INT, choices=("auto",), doc="IVF lists searched (auto: for recall_target)"),
            Param("sample", int, **_POS_INT, optional=True, doc="passages the IVF cells are trained on"),
            Param("seed", int, low=0, doc="seed of the IVF training sample"),
            Param("recall_target", float, low=0.0, high=1.0, low_open=True, doc="recall nprobe='auto' reaches"),
            Param("recall_k", int, **_POS_INT, doc="the k of that recall"),
        ),
        not_params=("persistent",),
        build=_build_dense,
        k_range=_dense_k,
        baseline=True,
        about="""The baseline every benchmark row is compared with: exact top-k cosine by a tiled matmul on the
device, or an IVF-Flat index (faiss, optional extra) re-scored exactly for corpora past memory.""",
        example='passages = geograph.Retriever("dense", corpus=texts).retrieve(query, k=5)',
    ),
)

#: every registered method by name
METHODS: dict[str, MethodSpec] = {s.name: s for s in _SPECS}
#: the rerankers' names, in registration order
RERANKERS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.kind == "reranker")
#: the retrievers' names, in registration order
RETRIEVERS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.kind == "retriever")


def names(*, kind: Kind | None = None, baseline: bool | None = None, with_graph: bool = False) -> tuple[str, ...]:
    """Registered names, optionally only one ``kind``, only (non-)baselines, or only those with a saved graph.

    Example:
        >>> names(kind="retriever", baseline=False)
        ('iso', 'g3')
    """
    return tuple(
        s.name
        for s in _SPECS
        if (kind is None or s.kind == kind)
        and (baseline is None or s.baseline == baseline)
        and (not with_graph or s.graph is not None)
    )


def get(name: str) -> MethodSpec:
    """The spec of method ``name``, or a one-line ``ValueError`` listing the registered ones."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {name!r}") from None
